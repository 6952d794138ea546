"""Portable bundles of cache entries (torch.compile's "Mega-Cache"), self-describing and pickle-free.

    magic "OSTBUNDL" | u32 format | u64 header_len | header (JSON) | values back to back

header = {"format", "created_by": versions, "entries": [{"manifest", "sha256", "size", "offset"}]},
offsets relative to the first value. Loading checks every value's sha256 and skips, with the reason,
entries built for another target or other versions: they could never be hit here, and a bundle from
elsewhere must not fill the cache with dead weight.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..errors import CacheError
from .entry import Entry
from .keys import Key, Manifest, canonical_json, cpu_arch, current_versions, sha256_hex
from .service import Cache, get_cache
from .tier import log

MAGIC = b"OSTBUNDL"
FORMAT = 1
_HEAD = struct.Struct("<8sIQ")


class BundleError(CacheError):
    """The blob is not a readable bundle at all (entries that are merely unusable are skipped instead)."""


@dataclass
class LoadReport:
    loaded: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (digest, reason)

    def as_dict(self) -> dict[str, Any]:
        return {"loaded": len(self.loaded), "skipped": [{"digest": d, "reason": r} for d, r in self.skipped]}


def save_artifacts(cache: Cache | None = None) -> bytes:
    """Every valid entry of the memory and disk tiers (``Cache.local_entries``: not the records true of this
    machine only), with its manifest, as one blob."""
    cache = cache or get_cache()
    index, values, offset = [], [], 0
    for e in cache.local_entries():
        index.append({"manifest": e.manifest, "sha256": sha256_hex(e.value), "size": len(e.value),
                      "offset": offset})
        values.append(e.value)
        offset += len(e.value)
    header = canonical_json({"format": FORMAT, "created_by": current_versions(), "entries": index})
    return b"".join([_HEAD.pack(MAGIC, FORMAT, len(header)), header, *values])


def _unfit(manifest: Mapping[str, Any]) -> str | None:
    """Why an entry cannot be used on this machine, or None if it can."""
    try:
        key = Key.from_manifest(manifest)
    except (ValueError, TypeError) as e:
        return f"unreadable manifest: {e}"
    target = dict(key.target)
    backend, arch = target.get("backend"), target.get("arch")
    if backend == "cpu":
        if arch != cpu_arch():
            return f"target.arch {arch!r} is not this machine's {cpu_arch()!r}"
    elif backend == "cuda":
        import torch

        if not torch.cuda.is_available():
            return f"target.backend 'cuda' ({arch}) but this machine has no CUDA device"
        here = {f"sm_{a}{b}" for a, b in (torch.cuda.get_device_capability(i)
                                           for i in range(torch.cuda.device_count()))}
        if arch not in here:
            return f"target.arch {arch!r} is not among this machine's {sorted(here)}"
    elif backend != "any":   # "any": machine-independent entries (a decoded program)
        return f"target.backend {backend!r} is unknown here"
    versions = dict(key.versions)
    for name, mine in current_versions().items():
        if versions.get(name) != mine:
            return f"versions.{name} {versions.get(name)!r} is not this process's {mine!r}"
    return None


def load_artifacts(blob: bytes, cache: Cache | None = None) -> LoadReport:
    """Verify and put the usable entries of a bundle into the cache; report the others with reasons."""
    cache = cache or get_cache()
    mv = memoryview(blob)
    if len(blob) < _HEAD.size:
        raise BundleError("not an ostinato cache bundle: too short")
    magic, fmt, header_len = _HEAD.unpack_from(blob)
    if magic != MAGIC:
        raise BundleError(f"not an ostinato cache bundle: magic {magic!r}")
    if fmt != FORMAT:
        raise BundleError(f"cache bundle format {fmt} is not {FORMAT}: re-pack it with this ostinato version")
    start = _HEAD.size + header_len
    if start > len(blob):
        raise BundleError("cache bundle header runs past the end of the blob (truncated file?)")
    try:
        header = json.loads(bytes(mv[_HEAD.size:start]))
        entries: list[dict[str, Any]] = list(header["entries"])
    except (ValueError, KeyError, TypeError) as e:
        raise BundleError(f"cache bundle header is not valid JSON: {e}") from None
    report = LoadReport()
    for item in entries:
        manifest: Manifest = item.get("manifest") if isinstance(item, dict) else None
        digest = sha256_hex(canonical_json(manifest)) if isinstance(manifest, dict) else "?"
        try:
            off, size = int(item["offset"]), int(item["size"])
        except (KeyError, TypeError, ValueError):
            report.skipped.append((digest, "entry lacks offset/size"))
            continue
        if not isinstance(manifest, dict):
            report.skipped.append((digest, "entry lacks a manifest"))
            continue
        if off < 0 or size < 0 or start + off + size > len(blob):
            report.skipped.append((digest, "value lies outside the bundle (truncated file?)"))
            continue
        value = bytes(mv[start + off:start + off + size])
        if sha256_hex(value) != item.get("sha256"):
            report.skipped.append((digest, "value does not match its sha256 (damaged bundle)"))
            continue
        reason = _unfit(manifest)
        if reason is not None:
            report.skipped.append((digest, reason))
            continue
        cache.put_entry(Entry(manifest, value))
        report.loaded.append(digest)
    log.info("ostinato cache: bundle loaded %d entries, skipped %d", len(report.loaded), len(report.skipped))
    return report
