"""RMSNorm and LayerNorm over the last dim: one program per row, statistics in fp32."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..runtime import KernelLibrary
from .common import block_for, rows_of


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, out_ptr, n_cols, eps, HAS_WEIGHT: tl.constexpr, UPCAST: tl.constexpr,
                    BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    xdt = x_ptr.dtype.element_ty
    if not UPCAST:   # the reference works in x's dtype: round where it rounds
        rstd = rstd.to(xdt).to(tl.float32)
    # HF's upcast form normalizes in fp32 and casts back to x's dtype before the weight; the plain
    # form's product is in x's dtype too.
    h = (x * rstd).to(xdt).to(tl.float32)
    if HAS_WEIGHT:
        h = h * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, h.to(out_ptr.dtype.element_ty), mask=mask)


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


@triton.jit
def layer_norm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, n_cols, eps, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                      BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    d = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / n_cols + eps)
    h = d * rstd
    if HAS_WEIGHT:
        h = h * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        h = h + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, h.to(out_ptr.dtype.element_ty), mask=mask)


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


LIBRARY = KernelLibrary({"rms_norm": rms_norm_kernel, "layer_norm": layer_norm_kernel})
