"""RMSNorm and LayerNorm over the last dim: one program per row, statistics in fp32."""
from __future__ import annotations

import torch

from ..runtime import KernelLibrary
from .common import block_for, rows_of


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, compute_dtype: torch.dtype | None = None,
             *, out: torch.Tensor | None = None) -> torch.Tensor:
    """ost.rms_norm (see ir/fused_ops.py) on CUDA."""
    x = x.contiguous()
    dtype = x.dtype if weight is None else torch.promote_types(x.dtype, weight.dtype)
    out = torch.empty(x.shape, dtype=dtype, device=x.device) if out is None else out
    rows, n = rows_of(x)
    if rows:
        LIBRARY.kernel("rms_norm", HAS_WEIGHT=weight is not None,
                       UPCAST=compute_dtype is not None and compute_dtype != x.dtype, BLOCK=block_for(n))(
            x, x if weight is None else weight, out, n, float(eps), grid=(rows,))
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float,
                 compute_dtype: torch.dtype | None = None, *, out_sum: torch.Tensor | None = None,
                 out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """ost.add_rms_norm on CUDA: the residual sum and its norm in one pass over each row."""
    x, residual = x.contiguous(), residual.contiguous()
    dtype = x.dtype if weight is None else torch.promote_types(x.dtype, weight.dtype)
    out_sum = torch.empty_like(x) if out_sum is None else out_sum
    out = torch.empty(x.shape, dtype=dtype, device=x.device) if out is None else out
    rows, n = rows_of(x)
    if rows:
        LIBRARY.kernel("add_rms_norm", HAS_WEIGHT=weight is not None,
                       UPCAST=compute_dtype is not None and compute_dtype != x.dtype, BLOCK=block_for(n))(
            x, residual, x if weight is None else weight, out_sum, out, n, float(eps), grid=(rows,))
    return out_sum, out


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
               compute_dtype: torch.dtype | None = None, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """ost.layer_norm on CUDA (statistics, weight and bias in fp32, then x's dtype)."""
    x = x.contiguous()
    out = torch.empty_like(x) if out is None else out
    rows, n = rows_of(x)
    if rows:
        LIBRARY.kernel("layer_norm", HAS_WEIGHT=weight is not None, HAS_BIAS=bias is not None,
                       BLOCK=block_for(n))(x, x if weight is None else weight, x if bias is None else bias, out, n,
                                           float(eps), grid=(rows,))
    return out


LIBRARY = KernelLibrary("norms", {"rms_norm": "rms_norm_kernel", "add_rms_norm": "add_rms_norm_kernel",
                                  "layer_norm": "layer_norm_kernel"})
