"""Fused ops (``ost.*``): one op where exported graphs have a chain, each with a reference
implementation in plain torch. The CPU backend runs the reference; it is the oracle for other
backends' kernels. A reference reproduces the chain it replaces operation by operation, so fusing
does not change results on the CPU."""
from __future__ import annotations

import torch

from .ops import OpDef, register_op


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float,
             compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``x * rsqrt(mean(x**2, -1) + eps)``, computed in ``compute_dtype`` (HF's upcast) when given,
    then cast back to x's dtype, then times ``weight`` when given."""
    h = x if compute_dtype is None else x.to(compute_dtype)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if compute_dtype is not None:
        h = h.to(x.dtype)
    return h if weight is None else h * weight


register_op(OpDef("ost.rms_norm", rms_norm, category="fused"))


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``: the gated MLP of Llama-family models."""
    return torch.nn.functional.silu(gate) * up


def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``gelu(gate) * up``: the gated MLP of Gemma-family models."""
    return torch.nn.functional.gelu(gate, approximate=approximate) * up


register_op(OpDef("ost.swiglu", swiglu, category="fused"))
register_op(OpDef("ost.geglu", geglu, category="fused"))
