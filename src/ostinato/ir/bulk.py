"""Building many objects at once (a decoded graph, a cached plan) without paying for the collector."""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic collector: tens of thousands of fresh objects would trigger full collections
    over everything torch's import made (~0.15 s per decode), though none of them is garbage yet."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
