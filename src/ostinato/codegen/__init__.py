"""Fusion groups → kernel source: the scheduler (schedule.py) groups a graph's pointwise ops and
reductions, expand.py writes each group as primitives (spec.py, data), triton_source.py renders the
Triton kernel, reference.py computes the same with torch (the ``ost.fused`` op)."""
from __future__ import annotations

import functools
import hashlib
import os

from . import reference  # noqa: F401  (registers ost.fused)
from .schedule import FusionGroup, fusion_enabled, schedule
from .spec import GroupSpec

__all__ = ["FusionGroup", "GroupSpec", "codegen_digest", "fusion_enabled", "schedule"]


@functools.lru_cache(maxsize=1)
def codegen_digest() -> str:
    """sha256 of this package's source: part of the plan cache's key, so a changed scheduler or
    generator never reuses a plan (or its kernels) made by another."""
    h = hashlib.sha256()
    here = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()
