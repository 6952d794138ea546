"""Cache keys: sha256 over the canonical JSON of named components (kind, content, target, versions).

The components are the manifest stored beside every value, so a miss can say which component differs
from the entry that is there. Nothing here depends on pickle, ``hash()``, dict order or file paths:
two processes (or two machines) compute the same digest for the same components.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import platform
from dataclasses import dataclass
from typing import Any, Mapping

from .. import __version__

# Bumped whenever the meaning of a component changes, so old entries stop matching instead of lying.
KEY_FORMAT = 1

Manifest = dict[str, Any]


def canonical_json(obj: Any) -> bytes:
    """The one byte form hashed and stored: sorted keys, fixed separators, ASCII only."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _str_map(name: str, m: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    # Only strings: floats and ints have more than one JSON spelling across producers.
    out = []
    for k, v in m.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"cache key {name} components must map str to str, got {k!r}: {v!r}")
        out.append((k, v))
    return tuple(sorted(out))


# Kinds of record true of this machine only (a program file's data checked, named by its inode: another
# machine's inode numbers name other files): Cache keeps them on the memory and disk tiers, out of Redis
# and bundles.
MACHINE_LOCAL_KINDS = frozenset({"data-verified"})


@dataclass(frozen=True)
class Key:
    """A cache key; ``digest`` names the entry in every tier and ``manifest()`` describes it."""

    kind: str
    content: str
    target: tuple[tuple[str, str], ...]
    versions: tuple[tuple[str, str], ...]

    def manifest(self) -> Manifest:
        return {"format": KEY_FORMAT, "kind": self.kind, "content": self.content,
                "target": dict(self.target), "versions": dict(self.versions)}

    @functools.cached_property
    def digest(self) -> str:
        return sha256_hex(canonical_json(self.manifest()))

    @classmethod
    def from_manifest(cls, m: Mapping[str, Any]) -> "Key":
        if m.get("format") != KEY_FORMAT:
            raise ValueError(f"cache manifest format {m.get('format')!r}, expected {KEY_FORMAT}")
        if not isinstance(m.get("kind"), str) or not isinstance(m.get("content"), str):
            raise ValueError("cache manifest needs string 'kind' and 'content'")
        return cls(m["kind"], m["content"], _str_map("target", m.get("target", {})),
                   _str_map("versions", m.get("versions", {})))


def content_group(kind: str, content: str) -> str:
    """Names all entries of one kind and content (whatever the target and versions): the why-miss index."""
    return sha256_hex(canonical_json([kind, content]))


@functools.lru_cache(maxsize=None)
def cpu_arch() -> str:
    """The CPU ISA torch dispatches to (e.g. ``x86_64-AVX512``): kernels differ between ISAs."""
    import torch

    return f"{platform.machine()}-{torch.backends.cpu.get_cpu_capability()}"


def current_target(backend: str = "cpu", device_index: int = 0) -> dict[str, str]:
    """The target of this machine for ``backend``: ``{"backend", "arch"}``."""
    if backend == "cpu":
        return {"backend": "cpu", "arch": cpu_arch()}
    if backend == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("no CUDA device here: pass target={'backend': 'cuda', 'arch': 'sm_90'} explicitly")
        major, minor = torch.cuda.get_device_capability(device_index)
        return {"backend": "cuda", "arch": f"sm_{major}{minor}"}
    raise ValueError(f"unknown backend {backend!r}: pass target={{'backend': ..., 'arch': ...}} explicitly")


def _triton_version() -> str:
    if importlib.util.find_spec("triton") is None:
        return ""
    for dist in ("triton", "pytorch-triton", "pytorch-triton-rocm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    import triton  # a source build without metadata still carries __version__

    return str(getattr(triton, "__version__", ""))


@functools.lru_cache(maxsize=None)
def current_versions() -> dict[str, str]:
    """Versions every compiled artifact depends on; a change in any of them must change the key."""
    import torch

    return {"ostinato": __version__, "torch": torch.__version__, "triton": _triton_version(),
            "cuda": torch.version.cuda or ""}


def make_key(kind: str, content: str | bytes, target: Mapping[str, str] | None = None,
             versions: Mapping[str, str] | None = None) -> Key:
    """Key for ``content`` (a hash string, or bytes that are hashed here) of ``kind`` on ``target``.

    ``target`` defaults to this machine's CPU; ``versions`` to this process's ostinato/torch/triton/CUDA.
    """
    if not kind or not isinstance(kind, str):
        raise ValueError(f"cache key kind must be a non-empty string, got {kind!r}")
    if isinstance(content, (bytes, bytearray, memoryview)):
        content = sha256_hex(bytes(content))
    if not isinstance(content, str) or not content:
        raise TypeError(f"cache key content must be a hash string or bytes, got {type(content).__name__}")
    t = current_target() if target is None else target
    v = current_versions() if versions is None else versions
    return Key(kind, content, _str_map("target", t), _str_map("versions", v))


def flatten(m: Mapping[str, Any]) -> dict[str, Any]:
    """``{"target": {"arch": x}}`` → ``{"target.arch": x}``: the component names why-miss reports."""
    out: dict[str, Any] = {}
    for k, v in m.items():
        if isinstance(v, Mapping):
            for sk, sv in flatten(v).items():
                out[f"{k}.{sk}"] = sv
        else:
            out[k] = v
    return out


def diff_manifests(have: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Components whose values differ: ``{"versions.torch": (stored, wanted)}``; absent reads as None."""
    a, b = flatten(have), flatten(want)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
