"""Compiled kernels as plain data: a cubin and what launching it needs, cached in ostinato's tiers.

A kernel is compiled once per (Triton source file, kernel, argument types, constexprs, arch) with
``triton.compile`` and an explicit signature, so its parameters are exactly the launcher's arguments
and no Triton runtime is needed to launch it: a warm process reads the cubin from a cache tier and
launches it through torch's static CUDA launcher, without importing Triton (whose import and source
hashing cost ~0.8 s per process). Where that launcher is missing the kernel runs through Triton's JIT.
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import json
import logging
import os
import struct
import tempfile
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Sequence

from ...cache import get_cache, make_key
from ...errors import BackendError, first_line

log = logging.getLogger("ostinato")

KIND = "cubin"
SOURCE_PACKAGE = "ostinato.backends.cuda.kernels.source"
_SOURCE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels", "source")


# Generated kernel modules (codegen): module name -> source text, registered before any compile.
_GENERATED: dict[str, str] = {}


def register_source(module: str, text: str) -> None:
    """Make a generated Triton module known by name (no file is written until it must compile)."""
    _GENERATED[module] = text


def source_digest(module: str) -> str:
    """sha256 of a kernel source: the content half of its binaries' cache keys (read, not imported)."""
    text = _GENERATED.get(module)
    if text is not None:
        return hashlib.sha256(text.encode()).hexdigest()
    return _file_digest(module)


@functools.lru_cache(maxsize=None)
def _file_digest(module: str) -> str:
    with open(os.path.join(_SOURCE_DIR, f"{module}.py"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@dataclass(frozen=True)
class BinaryMeta:
    """What a launch of a cubin needs besides its arguments."""

    name: str                 # the kernel's symbol in the cubin
    num_warps: int
    shared: int               # dynamic shared memory, bytes
    arg_types: str            # one launch-type letter per parameter (scratch pointers included)

    def to_json(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "BinaryMeta":
        d = json.loads(data)
        return cls(str(d["name"]), int(d["num_warps"]), int(d["shared"]), str(d["arg_types"]))


def pack(meta: BinaryMeta, cubin: bytes) -> bytes:
    head = meta.to_json()
    return struct.pack("<I", len(head)) + head + cubin


def unpack(blob: bytes) -> tuple[BinaryMeta, bytes]:
    (n,) = struct.unpack_from("<I", blob)
    return BinaryMeta.from_json(blob[4:4 + n]), blob[4 + n:]


def binary_key(module: str, kernel: str, arg_types: Sequence[str], constexprs: dict[str, Any], arch: int):
    spec = json.dumps({"kernel": kernel, "args": list(arg_types),
                       "constexprs": {k: repr(v) for k, v in sorted(constexprs.items())}}, sort_keys=True)
    content = hashlib.sha256(f"{source_digest(module)}:{spec}".encode()).hexdigest()
    return make_key(KIND, content, {"backend": "cuda", "arch": f"sm_{arch}"})


@functools.lru_cache(maxsize=None)
def _generated_module(module: str, digest: str):
    """Import a generated module from its file (Triton's JIT reads a kernel's source back from it)."""
    import importlib.util
    import sys
    name = f"ostinato_generated_{module}_{digest[:16]}"
    spec = importlib.util.spec_from_file_location(name, source_path(module))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def jit_function(module: str, kernel: str):
    """The ``@triton.jit`` function (imports Triton)."""
    if module in _GENERATED:
        return getattr(_generated_module(module, source_digest(module)), kernel)
    return getattr(importlib.import_module(f"{SOURCE_PACKAGE}.{module}"), kernel)


def compile_binary(module: str, kernel: str, arg_types: Sequence[str], constexprs: dict[str, Any],
                   arch: int) -> tuple[BinaryMeta, bytes]:
    """Compile one specialization with Triton for ``sm_<arch>``, in this process (triton_compile.py says
    what ``arg_types`` holds: one Triton type per runtime parameter, ``:D`` and ``:1`` hints)."""
    from .triton_compile import CompileError, compile_function
    try:
        meta, cubin = compile_function(jit_function(module, kernel), kernel, arg_types, constexprs, arch)
    except CompileError as e:
        raise BackendError(str(e)) from e.__cause__
    return BinaryMeta(**meta), cubin


def source_path(module: str) -> str:
    """The file a kernel module's source is in (a generated one written first, atomically)."""
    if module not in _GENERATED:
        return os.path.join(_SOURCE_DIR, f"{module}.py")
    folder = os.path.join(tempfile.gettempdir(), f"ostinato-gen-{os.getuid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = os.path.join(folder, f"{module}_{source_digest(module)[:16]}.py")
    text = _GENERATED[module]
    try:
        with open(path, encoding="utf-8") as f:
            current = f.read()
    except OSError:
        current = None
    if current != text:     # absent, or not what was registered (never import another's file as ours)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".py")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    return path


def cached_binary(module: str, kernel: str, arg_types: Sequence[str], constexprs: dict[str, Any],
                  arch: int) -> tuple[BinaryMeta, bytes] | None:
    """The binary from ostinato's cache tiers, or None (a malformed entry is a miss)."""
    key = binary_key(module, kernel, arg_types, constexprs, arch)
    blob = get_cache().get(key)
    if blob is not None:
        try:
            return unpack(blob)
        except Exception as e:  # noqa: BLE001 - a malformed entry is a miss
            log.warning("ostinato cache: discarding cubin entry %s: %s", key.digest[:12], e)
    return None


# Compiles in flight in worker processes, by binary key: one per key however many kernels ask.
_IN_FLIGHT: dict[str, Future] = {}
_IN_FLIGHT_LOCK = threading.Lock()


def submit_binary(module: str, kernel: str, arg_types: Sequence[str], constexprs: dict[str, Any],
                  arch: int) -> Future | None:
    """A Future of (meta, cubin, worker seconds) compiled in a worker process (compile_workers.py) and put
    in the cache tiers as it arrives; its exception is a BackendError (the kernel does not compile) or
    WorkerDied (compile it in-process). None where compiles run in-process (no workers, or constexprs
    a request cannot carry)."""
    from .compile_workers import pool
    workers = pool()
    if workers is None:
        return None
    request = {"path": source_path(module), "kernel": kernel, "arg_types": list(arg_types),
               "constexprs": constexprs, "arch": arch}
    try:
        json.dumps(request)
    except (TypeError, ValueError):
        return None
    key = binary_key(module, kernel, arg_types, constexprs, arch)
    with _IN_FLIGHT_LOCK:
        fut = _IN_FLIGHT.get(key.digest)
        if fut is not None:
            return fut
        fut = _IN_FLIGHT[key.digest] = Future()
    fut.set_running_or_notify_cancel()

    def arrived(answer: Future) -> None:
        with _IN_FLIGHT_LOCK:
            _IN_FLIGHT.pop(key.digest, None)
        e = answer.exception()
        if e is not None:
            fut.set_exception(e)
            return
        head, cubin = answer.result()
        if not head["ok"]:
            fut.set_exception(BackendError(head["error"]))
            return
        meta = BinaryMeta(**head["meta"])
        try:
            put_binary(module, kernel, arg_types, constexprs, arch, meta, cubin)
        except Exception as e:  # noqa: BLE001 - the binary still runs; the next process compiles it again
            log.warning("ostinato cache: could not store cubin %s: %s", key.digest[:12], e)
        fut.set_result((meta, cubin, float(head["seconds"])))

    workers.submit(request).add_done_callback(arrived)
    return fut


def get_binary(module: str, kernel: str, arg_types: Sequence[str], constexprs: dict[str, Any],
               arch: int) -> tuple[BinaryMeta, bytes, str]:
    """(meta, cubin, where from: "cache" | "compiled") through ostinato's cache tiers, compiled in-process
    on a miss."""
    found = cached_binary(module, kernel, arg_types, constexprs, arch)
    if found is not None:
        return (*found, "cache")
    meta, cubin = compile_binary(module, kernel, arg_types, constexprs, arch)
    put_binary(module, kernel, arg_types, constexprs, arch, meta, cubin)
    return meta, cubin, "compiled"


def put_binary(module: str, kernel: str, arg_types: Sequence[str], constexprs: dict[str, Any], arch: int,
               meta: BinaryMeta, cubin: bytes) -> None:
    get_cache().put(binary_key(module, kernel, arg_types, constexprs, arch), pack(meta, cubin))


@functools.lru_cache(maxsize=1)
def static_launcher():
    """torch's C++ launcher of cubins (``torch._C._StaticCudaLauncher``), or None where this build
    lacks it (then kernels launch through Triton's JIT)."""
    return getattr(__import__("torch")._C, "_StaticCudaLauncher", None)


def _cubin_file(digest: str, cubin: bytes) -> str:
    """The launcher loads modules from files: one per binary, written once (atomically)."""
    folder = os.path.join(tempfile.gettempdir(), f"ostinato-cubin-{os.getuid()}")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{digest}.cubin")
    if not os.path.exists(path) or os.path.getsize(path) != len(cubin):
        fd, tmp = tempfile.mkstemp(dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        os.replace(tmp, path)
    return path


class LoadedBinary:
    """A cubin loaded on one device: ``launch(grid, args, stream)``."""

    __slots__ = ("meta", "function", "module", "pad", "passed", "_launch")

    def __init__(self, meta: BinaryMeta, cubin: bytes, device_index: int, arg_types: Sequence[str]):
        launcher = static_launcher()
        digest = hashlib.sha256(cubin).hexdigest()
        loaded = launcher._load_kernel(_cubin_file(digest, cubin), meta.name, meta.shared, device_index)
        # torch >= 2.10 returns (module, function, n_regs, n_spills); earlier builds (function, n_regs, n_spills)
        self.module, self.function = (loaded[0], loaded[1]) if len(loaded) == 4 else (None, loaded[0])
        self.meta = meta
        self._launch = launcher._launch_kernel
        # The arguments the kernel takes: those compiled in as constants (``:1``) are left out.
        passed = [i for i, t in enumerate(arg_types) if not t.endswith(":1")]
        self.passed = None if len(passed) == len(arg_types) else tuple(passed)
        self.pad = (None,) * (len(meta.arg_types) - len(passed))   # null scratch pointers

    def launch(self, grid: tuple[int, ...], args: tuple, stream: int) -> None:
        m = self.meta
        gx = grid[0]
        gy = grid[1] if len(grid) > 1 else 1
        gz = grid[2] if len(grid) > 2 else 1
        if self.passed is not None:
            args = tuple([args[i] for i in self.passed])
        self._launch(self.function, gx, gy, gz, m.num_warps, m.shared, m.arg_types, args + self.pad, stream)
