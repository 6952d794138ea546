"""Gated MLP activations (swiglu, geglu and their packed forms) and rotary embeddings."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..runtime import KernelLibrary
from .common import block_for

_BLOCK = 1024


@triton.jit
def _gelu(g, TANH: tl.constexpr):
    if TANH:
        inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        t = 2.0 * tl.sigmoid(2.0 * inner) - 1.0
        return 0.5 * g * (1.0 + t)
    return 0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476))


@triton.jit
def gated_kernel(gate_ptr, up_ptr, out_ptr, n, cols, gate_stride, ACT: tl.constexpr, BLOCK: tl.constexpr):
    """out[r, c] = act(gate[r, c]) * up[r, c]; ``gate_stride`` is the row stride of gate and up (cols
    for separate tensors, 2 * cols for one packed projection, up then starting at gate + cols)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    r = offs // cols
    c = offs % cols
    g = tl.load(gate_ptr + r * gate_stride + c, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + r * gate_stride + c, mask=mask, other=0.0).to(tl.float32)
    if ACT == 0:
        a = g * tl.sigmoid(g)
    elif ACT == 1:
        a = _gelu(g, False)
    else:
        a = _gelu(g, True)
    # The reference rounds the activation to the tensor's dtype before the product.
    a = a.to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + offs, (a * u).to(out_ptr.dtype.element_ty), mask=mask)


def _act(name: str, approximate: str = "none") -> int:
    return 0 if name == "silu" else (2 if approximate == "tanh" else 1)


def _gated(gate: torch.Tensor, up: torch.Tensor, act: int, out: torch.Tensor | None, packed: bool) -> torch.Tensor:
    cols = gate.shape[-1] // 2 if packed else gate.shape[-1]
    shape = (*gate.shape[:-1], cols)
    out = torch.empty(shape, dtype=gate.dtype, device=gate.device) if out is None else out
    n = out.numel()
    if n:
        stride = 2 * cols if packed else cols
        LIBRARY.kernel("gated", ACT=act, BLOCK=_BLOCK)(gate, up, out, n, cols, stride, grid=(triton.cdiv(n, _BLOCK),))
    return out


def swiglu(gate, up, *, out=None):
    gate, up = gate.contiguous(), up.contiguous()
    return _gated(gate, up, 0, out, False)


def geglu(gate, up, approximate: str = "none", *, out=None):
    gate, up = gate.contiguous(), up.contiguous()
    return _gated(gate, up, _act("gelu", approximate), out, False)


def swiglu_packed(x, *, out=None):
    x = x.contiguous()
    return _gated(x, x[..., x.shape[-1] // 2:], 0, out, True)


def geglu_packed(x, approximate: str = "none", *, out=None):
    x = x.contiguous()
    return _gated(x, x[..., x.shape[-1] // 2:], _act("gelu", approximate), out, True)


@triton.jit
def rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, n_cols, d1, d2, c0, c1, c2, s0, s1, s2,
                INTERLEAVED: tl.constexpr, BLOCK: tl.constexpr):
    """One row of x ([d0, d1, d2, n_cols] contiguous); cos/sin read through broadcast strides."""
    row = tl.program_id(0).to(tl.int64)
    i2 = row % d2
    i1 = (row // d2) % d1
    i0 = row // (d1 * d2)
    cos_row = cos_ptr + i0 * c0 + i1 * c1 + i2 * c2
    sin_row = sin_ptr + i0 * s0 + i1 * s1 + i2 * s2
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    half = n_cols // 2
    if INTERLEAVED:   # pairs (2i, 2i+1): rotate = (-x[2i+1], x[2i])
        partner = cols ^ 1
        sign = tl.where(cols % 2 == 0, -1.0, 1.0)
    else:             # pairs (i, i + d/2): rotate = cat(-x2, x1)
        partner = tl.where(cols < half, cols + half, cols - half)
        sign = tl.where(cols < half, -1.0, 1.0)
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    xr = tl.load(x_ptr + row * n_cols + partner, mask=mask, other=0.0).to(tl.float32)
    c = tl.load(cos_row + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(sin_row + cols, mask=mask, other=0.0).to(tl.float32)
    dt = out_ptr.dtype.element_ty
    # Rounded as the reference's products are (each in the tensors' dtype), then summed.
    a = (x * c).to(dt).to(tl.float32)
    b = (sign * xr * s).to(dt).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (a + b).to(dt), mask=mask)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False, *,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """ost.rope on CUDA for x of rank <= 4; cos and sin broadcast against x (stride 0 on broadcast dims)."""
    if x.dim() > 4:
        from ....ir.fused_ops import rope as reference
        return reference(x, cos, sin, interleaved, out=out)
    x = x.contiguous()
    shape = (1,) * (4 - x.dim()) + tuple(x.shape)
    out_dtype = torch.promote_types(torch.promote_types(x.dtype, cos.dtype), sin.dtype)
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device) if out is None else out
    c = cos.contiguous().expand(x.shape)   # broadcast dims get stride 0; the last dim stays dense
    s = sin.contiguous().expand(x.shape)
    cs = (0,) * (4 - x.dim()) + tuple(c.stride())
    ss = (0,) * (4 - x.dim()) + tuple(s.stride())
    rows = shape[0] * shape[1] * shape[2]
    if rows and shape[3]:
        LIBRARY.kernel("rope", INTERLEAVED=bool(interleaved), BLOCK=block_for(shape[3]))(
            x, c, s, out, shape[3], shape[1], shape[2], cs[0], cs[1], cs[2], ss[0], ss[1], ss[2], grid=(rows,))
    return out


_ACTS = {None: 0, "relu": 1, "silu": 2, "gelu": 3, "gelu_tanh": 4}


@triton.jit
def bias_act_kernel(h_ptr, b_ptr, out_ptr, n, cols, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
                    BLOCK: tl.constexpr):
    """out = act(h + bias) over rows of ``cols``: the epilogue a GEMM without one leaves to do."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    h = tl.load(h_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        h = h + tl.load(b_ptr + offs % cols, mask=mask, other=0.0).to(tl.float32)
    if ACT == 1:
        h = tl.maximum(h, 0.0)
    elif ACT == 2:
        h = h * tl.sigmoid(h)
    elif ACT == 3:
        h = _gelu(h, False)
    elif ACT == 4:
        h = _gelu(h, True)
    tl.store(out_ptr + offs, h.to(out_ptr.dtype.element_ty), mask=mask)


def linear(x, weight, bias=None, activation=None, weight_t: bool = False, *, out=None):
    """ost.linear on CUDA: the matmul through cuBLAS, then bias and activation in one Triton epilogue
    (torch would run them as two more kernels). Without an activation cuBLAS fuses the bias itself."""
    from ....ir.fused_ops import linear as reference
    if activation is None or activation not in _ACTS:
        return reference(x, weight, bias, activation, weight_t, out=out)
    h = torch.matmul(x, weight) if weight_t else torch.matmul(x, weight.t())
    out = h if out is None else out
    n = h.numel()
    if n:
        LIBRARY.kernel("bias_act", HAS_BIAS=bias is not None, ACT=_ACTS[activation], BLOCK=_BLOCK)(
            h, h if bias is None else bias, out, n, h.shape[-1], grid=(triton.cdiv(n, _BLOCK),))
    return out


LIBRARY = KernelLibrary({"gated": gated_kernel, "rope": rope_kernel, "bias_act": bias_act_kernel})
