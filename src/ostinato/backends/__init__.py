"""Backends by name. A backend module registers a factory; ``get_backend`` builds one for a device."""
from __future__ import annotations

from typing import Callable

import torch

from ..errors import BackendError
from .base import Backend, Launch

_FACTORIES: dict[str, Callable[[torch.device], Backend]] = {}


def register_backend(device_type: str, factory: Callable[[torch.device], Backend]) -> None:
    _FACTORIES[device_type] = factory


def parse_mlx(device) -> str | None:
    """``"mlx"`` -> "", ``"mlx:cpu"`` / ``"mlx:gpu"`` -> the MLX device kind; None for other devices.
    MLX is not a torch device type, so its names are read here, before torch.device parses the rest."""
    if not isinstance(device, str):
        return None
    name = device.strip().lower()
    if name == "mlx":
        return ""
    if name.startswith("mlx:"):
        return name[4:]
    return None


def get_backend(device: str | torch.device, strict: bool = False) -> Backend:
    """The backend for ``device`` ("cpu", "cuda[:N]", "mlx", "mlx:cpu", "mlx:gpu"). ``strict``: refuse
    ops the backend would run through torch instead of its own kernels (MLX)."""
    kind = parse_mlx(device)
    if kind is not None:
        return _mlx(kind or None, strict)
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise BackendError(f"device {device!r} is not a device name ({e}); use 'cpu', 'cuda' or 'mlx'") from None
    factory = _FACTORIES.get(dev.type)
    if factory is None:
        raise BackendError(f"no ostinato backend for device type {dev.type!r}; "
                           f"available: {', '.join(sorted(_FACTORIES))}")
    return factory(dev)


def _cpu(dev: torch.device) -> Backend:
    from .cpu import CPUBackend
    return CPUBackend(dev)


def _cuda(dev: torch.device) -> Backend:
    from .cuda import CUDABackend
    return CUDABackend(dev)


def _mlx(kind: str | None, strict: bool) -> Backend:
    try:
        import mlx.core  # noqa: F401
    except ImportError as e:
        raise BackendError(f"device 'mlx' needs MLX, which is not installed here ({e}). Fix: pip install "
                           "mlx (on a Mac: the Metal build) or pip install 'mlx[cpu]' (Linux: MLX's CPU "
                           "build)") from None
    from .mlx import MLXBackend
    return MLXBackend(kind, strict)


register_backend("cpu", _cpu)
register_backend("cuda", _cuda)

__all__ = ["Backend", "Launch", "get_backend", "parse_mlx", "register_backend"]
