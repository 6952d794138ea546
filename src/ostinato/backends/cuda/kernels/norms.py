"""RMSNorm and LayerNorm over the last dim: one program per row, statistics in fp32."""
from __future__ import annotations

import torch

from ....ir import fold_ops, fused_ops
from ..runtime import KernelLibrary
from .common import block_for, cdiv, pow2, rows_of


def _norm_flags(x: torch.Tensor, weight: torch.Tensor | None, compute_dtype, weight_first: bool) -> tuple | None:
    """(result dtype, the kernels' constexprs) of an rms_norm of x (see ir/fused_ops.rms_norm), or None
    where the kernels would compute something else than the reference: Gemma's weight-first form
    runs in fp32 only (the pattern makes it from an fp32 upcast)."""
    if weight_first and (compute_dtype or x.dtype) != torch.float32:
        return None
    upcast = compute_dtype is not None and compute_dtype != x.dtype
    dtype = x.dtype if weight is None or weight_first else torch.promote_types(x.dtype, weight.dtype)
    return dtype, {"HAS_WEIGHT": weight is not None, "UPCAST": upcast or weight_first, "W_FIRST": weight_first}


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, compute_dtype: torch.dtype | None = None,
             weight_offset: float = 0.0, weight_first: bool = False, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """ost.rms_norm (see ir/fused_ops.py) on CUDA."""
    plan = _norm_flags(x, weight, compute_dtype, weight_first)
    if plan is None:
        return fused_ops.rms_norm(x, weight, eps, compute_dtype, weight_offset, weight_first, out=out)
    dtype, flags = plan
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=dtype, device=x.device) if out is None else out
    rows, n = rows_of(x)
    if rows:
        LIBRARY.kernel("rms_norm", **flags, BLOCK=block_for(n))(
            x, x if weight is None else weight, out, n, float(eps), float(weight_offset), grid=(rows,))
    return out


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float,
                 compute_dtype: torch.dtype | None = None, weight_offset: float = 0.0, weight_first: bool = False,
                 *, out_sum: torch.Tensor | None = None,
                 out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """ost.add_rms_norm on CUDA: the residual sum and its norm in one pass over each row."""
    plan = _norm_flags(x, weight, compute_dtype, weight_first)
    if plan is None:
        return fused_ops.add_rms_norm(x, residual, weight, eps, compute_dtype, weight_offset, weight_first,
                                      out_sum=out_sum, out=out)
    dtype, flags = plan
    x, residual = x.contiguous(), residual.contiguous()
    out_sum = torch.empty_like(x) if out_sum is None else out_sum
    out = torch.empty(x.shape, dtype=dtype, device=x.device) if out is None else out
    rows, n = rows_of(x)
    if rows:
        LIBRARY.kernel("add_rms_norm", **flags, BLOCK=block_for(n))(
            x, residual, x if weight is None else weight, out_sum, out, n, float(eps), float(weight_offset),
            grid=(rows,))
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


def row_scale(p: torch.Tensor, x: torch.Tensor, eps: float, dtype: torch.dtype, bias: torch.Tensor | None = None,
              center: bool = False, shift: torch.Tensor | None = None, pre: torch.Tensor | None = None, *,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """ost.row_scale on CUDA where neither the decode attention nor a generated group takes it (passes/
    fold_norms.py): one kernel rather than the reference's chain of torch ops."""
    rows = x.shape[0] if x.dim() else 0
    if x.dim() < 1 or p.dim() < 1 or p.shape[0] != rows or any(d != 1 for d in x.shape[1:-1]) or not rows \
            or p.numel() == 0 or x.shape[-1] == 0 \
            or bias is not None and (bias.dim() != 1 or bias.numel() * rows != p.numel()) \
            or shift is not None and (shift.dim() != 1 or shift.shape[0] != x.shape[-1]) \
            or (shift is None) != (pre is None) or pre is not None and (pre.dim() != 1
                                                                          or pre.numel() * rows != p.numel()):
        return fold_ops.row_scale(p, x, eps, dtype, bias, center, shift, pre, out=out)
    p = p.contiguous()
    x = x if x.stride(-1) == 1 else x.contiguous()
    n_per_row, n_x = p.numel() // rows, x.shape[-1]
    if out is None or not out.is_contiguous():
        res = torch.empty(p.shape, dtype=dtype, device=p.device)
    else:
        res = out
    block = min(pow2(n_per_row), 1024)
    LIBRARY.kernel("row_scale", HAS_BIAS=bias is not None, CENTER=bool(center), HAS_SHIFT=shift is not None,
                   BLOCK=block, BLOCK_X=min(pow2(n_x), 4096))(
        p, x, x if bias is None else bias.contiguous(), p if shift is None else shift.float().contiguous(),
        p if pre is None else pre.float().contiguous(), res, n_per_row, n_x, x.stride(0), float(eps),
        grid=(rows, cdiv(n_per_row, block)))
    return res if out is None or out is res else out.copy_(res)


LIBRARY = KernelLibrary("norms", {"rms_norm": "rms_norm_kernel", "add_rms_norm": "add_rms_norm_kernel",
                                  "layer_norm": "layer_norm_kernel", "row_scale": "row_scale_kernel"})
