"""CUDA runtime primitives: a stream, a library of Triton kernels created lazily by name and
specialization, a kernel that binds its arguments and launches, and bounds-checked copies.

Device memory always comes from torch's caching allocator; compiled kernels are cubins kept in
ostinato's cache tiers and launched without Triton's runtime (binaries.py).
"""
from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any

import torch

from ...errors import BackendError, first_line

log = logging.getLogger("ostinato")
from .binaries import (LoadedBinary, cached_binary, compile_binary, jit_function, put_binary, static_launcher,
                       submit_binary)
from .compile_workers import WorkerDied


class Stream:
    """A CUDA stream (torch's): launches are ordered on it; events mark points in it."""

    def __init__(self, device: torch.device, stream: torch.cuda.Stream | None = None):
        self.device = device
        self.stream = stream if stream is not None else torch.cuda.current_stream(device)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def record(self) -> torch.cuda.Event:
        """An event at the current end of the stream."""
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def wait(self, event: torch.cuda.Event) -> None:
        """Later launches on this stream wait for ``event``."""
        self.stream.wait_event(event)

    def __enter__(self):
        self._ctx = torch.cuda.stream(self.stream)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


# OSTINATO_TRITON_JIT=1 launches every kernel through Triton's JIT instead of the cached cubins: the A/B
# switch for comparing the two paths' kernels (it imports Triton and compiles through its own cache).
_FORCE_JIT = os.environ.get("OSTINATO_TRITON_JIT") == "1"

_TRITON_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
                  torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
                  torch.uint8: "u8", torch.bool: "i1"}


def arg_type(a: Any) -> str:
    """The Triton type of one launch argument, with ``:D`` where Triton's JIT would assume 16-divisibility
    (an aligned pointer, an int multiple of 16) and ``:1`` for an int equal to 1 (compiled in as a
    constant, not passed): the part of a binary's key that depends on values."""
    if isinstance(a, torch.Tensor):
        return f"*{_TRITON_DTYPES[a.dtype]}" + (":D" if a.data_ptr() % 16 == 0 else "")
    if isinstance(a, bool):
        return "i1"
    if isinstance(a, int):
        if a == 1:      # Triton's JIT compiles a 1 in as a constant (strides, counts): so do we
            return "i32:1"
        base = "i32" if -2**31 <= a < 2**31 else "i64"
        return base + (":D" if a % 16 == 0 else "")
    if isinstance(a, float):
        return "fp32"
    raise BackendError(f"a Triton kernel argument of type {type(a).__name__} ({a!r}) has no launch type")


class CompilePending(Exception):
    """A kernel's binary is still compiling in a worker process: the op runs its torch reference this time."""


# Per thread: whether the op being run may still fall back to its reference (deferring() sets it; a launch
# clears it, so an op never runs half on kernels and half on its reference).
_op_scope = threading.local()


def deferring(launcher, reference):
    """``launcher`` (an op's Triton launcher) that runs ``reference`` (the op's torch reference) instead
    while one of its kernels is compiling in a worker (a cold cache): the first calls give their outputs
    without waiting for the compiles, the later ones launch the compiled kernels."""
    def run(*args, **kwargs):
        _op_scope.deferrable = not getattr(_op_scope, "block", False)
        try:
            return launcher(*args, **kwargs)
        except CompilePending:
            return reference(*args, **kwargs)
        finally:
            _op_scope.deferrable = False
    run.multi_output = getattr(launcher, "multi_output", False)
    run.__name__ = getattr(launcher, "__name__", "launcher")
    run.__wrapped__ = launcher
    return run


@contextlib.contextmanager
def awaiting_compiles():
    """Within: ops wait for their kernels' compiles instead of running their references (the warm-up
    before a CUDA graph's capture, which must load every kernel it will capture)."""
    before = getattr(_op_scope, "block", False)
    _op_scope.block = True
    try:
        yield
    finally:
        _op_scope.block = before


class Kernel:
    """One Triton kernel with its constexprs fixed: ``kernel(*args, grid=...)`` launches it on the current
    stream. Each set of argument types gets a binary, compiled once for the device's arch and kept in
    ostinato's cache tiers (binaries.py), and launched without Triton's runtime. Tensors on the CPU (Triton's
    interpreter, ``TRITON_INTERPRET=1``) and builds of torch without the static launcher go through Triton's
    JIT. A failure to compile or launch names the kernel and its specialization."""

    def __init__(self, library: "KernelLibrary", name: str, specialization: dict[str, Any]):
        self.library, self.name, self.specialization = library, name, dict(specialization)
        self.launches = 0
        # (device index, types) -> the binary loaded on that device (a loaded function belongs to one
        # device's context: launched on another GPU it fails or runs another module)
        self._binaries: dict[tuple, LoadedBinary] = {}
        self._pending: dict[tuple, Any] = {}    # (arch, types) -> Future of a worker's compile
        self._lock = threading.Lock()

    def _fail(self, e: Exception, what: str) -> BackendError:
        spec = ", ".join(f"{k}={v}" for k, v in self.specialization.items())
        return BackendError(f"Triton kernel {self.name} [{spec}] failed to {what}: {type(e).__name__}: "
                            f"{first_line(e)}. Fix: report it with this message; "
                            "the op's reference runs on torch (set OSTINATO_CUDA_REFERENCE=1)")

    def _binary(self, types: tuple, device: torch.device) -> LoadedBinary:
        """The loaded binary for ``types``: from this kernel, a cache tier, a worker's compile (submitted
        on a miss) or an in-process compile. While a worker compiles it, raises CompilePending where the
        current op may run its reference instead (deferring(): nothing launched yet in this op, no CUDA
        graph being captured); otherwise waits for it."""
        with self._lock:
            index = device.index if device.index is not None else torch.cuda.current_device()
            b = self._binaries.get((index, types))
            if b is not None:
                return b
            major, minor = torch.cuda.get_device_capability(index)
            module, fn, arch = self.library.module, self.library.function_name(self.name), major * 10 + minor
            key, pending = (index, types), (arch, types)
            job = self._pending.get(pending)
            if job is None:
                t0 = time.perf_counter()
                found = cached_binary(module, fn, types, self.specialization, arch)
                if found is not None:
                    b = self._binaries[key] = LoadedBinary(*found, index, types)
                    self.library.count("cache", time.perf_counter() - t0)
                    return b
                job = self._pending[pending] = submit_binary(module, fn, types, self.specialization, arch)
                if job is None:     # compiles run in-process (the cache was just asked: no second lookup)
                    del self._pending[pending]
                    meta, cubin = compile_binary(module, fn, types, self.specialization, arch)
                    put_binary(module, fn, types, self.specialization, arch, meta, cubin)
                    b = self._binaries[key] = LoadedBinary(meta, cubin, index, types)
                    self.library.count("compiled", time.perf_counter() - t0)
                    return b
            if not job.done() and getattr(_op_scope, "deferrable", False) \
                    and not torch.cuda.is_current_stream_capturing():
                KernelLibrary.counts["deferred"] += 1
                raise CompilePending(self.name)
            try:
                meta, cubin, seconds = job.result()
            except WorkerDied as e:
                log.warning("ostinato: %s; compiling %s in this process", e, self.name)
                t0 = time.perf_counter()
                meta, cubin = compile_binary(module, fn, types, self.specialization, arch)
                put_binary(module, fn, types, self.specialization, arch, meta, cubin)
                seconds = time.perf_counter() - t0
            finally:
                del self._pending[pending]
            b = self._binaries[key] = LoadedBinary(meta, cubin, index, types)
            self.library.count("compiled", seconds)
            return b

    def __call__(self, *args, grid: tuple[int, ...]) -> None:
        first = args[0]
        if not first.is_cuda or _FORCE_JIT or static_launcher() is None:
            self._run_jit(args, grid)
            return
        types = tuple(map(arg_type, args))
        b = self._binaries.get((first.device.index, types))
        try:
            if b is None:
                b = self._binary(types, first.device)
            b.launch(grid, args, torch.cuda.current_stream(first.device).cuda_stream)
            _op_scope.deferrable = False
        except (BackendError, CompilePending):
            raise
        except Exception as e:  # noqa: BLE001 - re-raised with the kernel named; the cause is chained
            raise self._fail(e, "compile or launch") from e
        self.launches += 1

    def _run_jit(self, args: tuple, grid: tuple[int, ...]) -> None:
        try:
            jit_function(self.library.module, self.library.function_name(self.name))[grid](
                *args, **self.specialization)
        except Exception as e:  # noqa: BLE001 - re-raised with the kernel named; the cause is chained
            raise self._fail(e, "compile or launch") from e
        self.launches += 1


class KernelLibrary:
    """The kernels of one Triton source module (``kernels/source/<module>.py``) by name and
    specialization, created on first use (thread-safe). The module itself is imported only when a
    binary must be compiled, or a kernel runs through Triton's JIT."""

    # Binaries obtained in this process over all libraries: compiled, or read from a cache tier, and the
    # seconds spent getting and loading them (the cold-start report's "kernel compilation").
    # "deferred": op calls that ran their reference while a kernel compiled in a worker.
    counts = {"compiled": 0, "cache": 0, "seconds": 0.0, "deferred": 0}

    def __init__(self, module: str, functions: dict[str, str]):
        self.module = module
        self._functions = dict(functions)
        self._kernels: dict[tuple, Kernel] = {}
        self._lock = threading.Lock()

    def function_name(self, name: str) -> str:
        return self._functions[name]

    def count(self, origin: str, seconds: float) -> None:
        KernelLibrary.counts[origin] = KernelLibrary.counts.get(origin, 0) + 1
        KernelLibrary.counts["seconds"] += seconds

    def kernel(self, name: str, **specialization) -> Kernel:
        key = (name, tuple(sorted(specialization.items())))
        k = self._kernels.get(key)
        if k is None:
            if name not in self._functions:
                raise BackendError(f"no Triton kernel named {name!r} in {self.module}; known: "
                                   f"{', '.join(sorted(self._functions))}")
            with self._lock:
                k = self._kernels.setdefault(key, Kernel(self, name, specialization))
        return k

    def __len__(self) -> int:
        return len(self._kernels)


def checked_copy(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst.copy_(src)`` when both hold the same number of elements of the same dtype; BackendError
    naming both otherwise (no silent broadcast, truncation or cast)."""
    if dst.numel() != src.numel() or dst.dtype != src.dtype:
        raise BackendError(f"copy of {src.dtype}{list(src.shape)} into {dst.dtype}{list(dst.shape)}: sizes or "
                           "dtypes differ")
    if dst.shape != src.shape:
        src = src.reshape(dst.shape)
    return dst.copy_(src)
