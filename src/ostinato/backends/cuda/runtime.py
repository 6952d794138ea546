"""CUDA runtime primitives: a stream, a library of Triton kernels created lazily by name and
specialization, a kernel that binds its arguments and launches, and bounds-checked copies.

Device memory always comes from torch's caching allocator; compiled kernels come from Triton's
cache, which ``kernel_cache`` routes through ostinato's tiers.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import torch

from ...errors import BackendError


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


class Kernel:
    """A Triton kernel with a fixed grid rule: ``kernel(*args, grid=..., **constexprs)`` launches it on
    the current stream. A failure to compile or launch names the kernel and its specialization."""

    def __init__(self, name: str, fn, specialization: dict[str, Any]):
        self.name, self.fn, self.specialization = name, fn, dict(specialization)
        self.launches = 0

    def __call__(self, *args, grid: tuple[int, ...]) -> None:
        try:
            self.fn[grid](*args, **self.specialization)
        except Exception as e:  # noqa: BLE001 - re-raised with the kernel named; the cause is chained
            spec = ", ".join(f"{k}={v}" for k, v in self.specialization.items())
            raise BackendError(f"Triton kernel {self.name} [{spec}] failed to compile or launch: "
                               f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}. "
                               "Fix: report it with this message; the op's reference runs on torch "
                               "(set OSTINATO_CUDA_REFERENCE=1)") from e
        self.launches += 1


class KernelLibrary:
    """Kernels by name and specialization, created on first use (thread-safe); Triton compiles each
    specialization once per process and caches the binary (through ostinato's tiers)."""

    def __init__(self, sources: dict[str, Callable]):
        self._sources = dict(sources)
        self._kernels: dict[tuple, Kernel] = {}
        self._lock = threading.Lock()

    def kernel(self, name: str, **specialization) -> Kernel:
        key = (name, tuple(sorted(specialization.items())))
        k = self._kernels.get(key)
        if k is None:
            fn = self._sources.get(name)
            if fn is None:
                raise BackendError(f"no Triton kernel named {name!r}; known: {', '.join(sorted(self._sources))}")
            with self._lock:
                k = self._kernels.setdefault(key, Kernel(name, fn, specialization))
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
