"""Which fused op runs which Triton kernel on CUDA: one entry per op, each launcher taking the
reference's arguments (ir/fused_ops.py). Ops without an entry run their reference through torch."""
from __future__ import annotations

import functools
import os
import logging
from typing import Callable

log = logging.getLogger("ostinato")


@functools.lru_cache(maxsize=None)
def triton_kernels() -> dict[str, Callable]:
    """op name -> launcher; empty (references everywhere) when Triton is not installed or
    OSTINATO_CUDA_REFERENCE=1 asks for the references."""
    if os.environ.get("OSTINATO_CUDA_REFERENCE") == "1":
        return {}
    try:
        from .kernels import attention, elementwise, norms
        from .kernel_cache import install
        install()   # compiled kernels go through ostinato's cache tiers
    except ImportError as e:
        log.warning("ostinato: Triton is not importable (%s); fused ops run their torch references on CUDA", e)
        return {}
    return {
        "ost.rms_norm": norms.rms_norm,
        "ost.layer_norm": norms.layer_norm,
        "ost.rope": elementwise.rope,
        "ost.swiglu": elementwise.swiglu,
        "ost.geglu": elementwise.geglu,
        "ost.swiglu_packed": elementwise.swiglu_packed,
        "ost.geglu_packed": elementwise.geglu_packed,
        "ost.kv_update": attention.kv_update,
        "ost.kv_update_": attention.kv_update_,
        "ost.sdpa": attention.sdpa,
        "ost.linear": elementwise.linear,
    }
