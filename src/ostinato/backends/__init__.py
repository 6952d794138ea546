"""Backends by name. A backend module registers a factory; ``get_backend`` builds one for a device."""
from __future__ import annotations

from typing import Callable

import torch

from ..errors import BackendError
from .base import Backend, Launch

_FACTORIES: dict[str, Callable[[torch.device], Backend]] = {}


def register_backend(device_type: str, factory: Callable[[torch.device], Backend]) -> None:
    _FACTORIES[device_type] = factory


def get_backend(device: str | torch.device) -> Backend:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise BackendError(f"device {device!r} is not a device name ({e}); use 'cpu' or 'cuda'") from None
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


register_backend("cpu", _cpu)
register_backend("cuda", _cuda)

__all__ = ["Backend", "Launch", "get_backend", "register_backend"]
