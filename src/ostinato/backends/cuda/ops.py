"""Which fused op runs which Triton kernel on CUDA: one entry per op, each launcher taking the
reference's arguments (ir/fused_ops.py). Ops without an entry run their reference through torch."""
from __future__ import annotations

import functools
import importlib.util
import os
import logging
from typing import Callable

log = logging.getLogger("ostinato")


@functools.lru_cache(maxsize=None)
def triton_kernels() -> dict[str, Callable]:
    """op name -> launcher; empty (references everywhere) when Triton is not installed or
    OSTINATO_CUDA_REFERENCE=1 asks for the references. Triton itself is not imported here: kernels
    found in the cache tiers launch without it."""
    if os.environ.get("OSTINATO_CUDA_REFERENCE") == "1":
        return {}
    if importlib.util.find_spec("triton") is None:
        log.warning("ostinato: Triton is not installed; fused ops run their torch references on CUDA")
        return {}
    from ...ir import get_op
    from .kernels import attention, elementwise, fused, moe, norms
    from .runtime import deferring
    launchers = {
        "ost.fused": fused.run_fused,
        "ost.rms_norm": norms.rms_norm,
        "ost.add_rms_norm": norms.add_rms_norm,
        "ost.layer_norm": norms.layer_norm,
        "ost.row_scale": norms.row_scale,
        "ost.rope": elementwise.rope,
        "ost.swiglu": elementwise.swiglu,
        "ost.geglu": elementwise.geglu,
        "ost.swiglu_packed": elementwise.swiglu_packed,
        "ost.geglu_packed": elementwise.geglu_packed,
        "ost.kv_update": attention.kv_update,
        "ost.kv_update_": attention.kv_update_,
        "ost.sdpa": attention.sdpa,
        "ost.decode_attention_": attention.decode_attention_,
        "ost.linear": elementwise.linear,
        "ost.moe_up": moe.moe_up,
        "ost.moe_down": moe.moe_down,
        "ost.moe_down_shared": moe.moe_down_shared,
    }
    # While a cold kernel compiles in a worker process, its op runs its torch reference (runtime.py).
    return {op: deferring(fn, get_op(op).target) for op, fn in launchers.items()}
