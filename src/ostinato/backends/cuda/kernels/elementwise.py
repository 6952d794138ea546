"""Gated MLP activations (swiglu, geglu and their packed forms) and rotary embeddings."""
from __future__ import annotations

import torch

from ..runtime import KernelLibrary
from .common import block_for, cdiv

_BLOCK = 1024
_ROPE_TILE = 2048    # elements of x a rope program rotates (whole rows)


def _act(name: str, approximate: str = "none") -> int:
    return 0 if name == "silu" else (2 if approximate == "tanh" else 1)


def _rows(t: torch.Tensor, cols: int) -> tuple[torch.Tensor, int]:
    """``t`` as rows of ``cols`` dense elements at one row stride, and that stride: a slice of a packed
    projection's output is read where it lies; anything else is copied dense first."""
    if t.stride(-1) == 1 or t.shape[-1] == 1:
        try:
            r = t.view(-1, t.shape[-1])
            if r.shape[0] <= 1 or r.stride(0) >= cols:
                return t, (r.stride(0) if r.shape[0] > 1 else cols)
        except RuntimeError:
            pass
    return t.contiguous(), t.shape[-1]


def _gated(gate: torch.Tensor, up: torch.Tensor, act: int, out: torch.Tensor | None, packed: bool) -> torch.Tensor:
    cols = gate.shape[-1] // 2 if packed else gate.shape[-1]
    shape = (*gate.shape[:-1], cols)
    out = torch.empty(shape, dtype=gate.dtype, device=gate.device) if out is None else out
    n = out.numel()
    if n:
        if packed:
            gs = us = 2 * cols
        else:
            (gate, gs), (up, us) = _rows(gate, cols), _rows(up, cols)
        LIBRARY.kernel("gated", ACT=act, BLOCK=_BLOCK)(gate, up, out, n, cols, gs, us, grid=(cdiv(n, _BLOCK),))
    return out


def swiglu(gate, up, *, out=None):
    return _gated(gate, up, 0, out, False)


def geglu(gate, up, approximate: str = "none", *, out=None):
    return _gated(gate, up, _act("gelu", approximate), out, False)


def swiglu_packed(x, *, out=None):
    x = x.contiguous()
    return _gated(x, x[..., x.shape[-1] // 2:], 0, out, True)


def geglu_packed(x, approximate: str = "none", *, out=None):
    x = x.contiguous()
    return _gated(x, x[..., x.shape[-1] // 2:], _act("gelu", approximate), out, True)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False, *,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """ost.rope on CUDA for x of rank <= 4; cos and sin broadcast against x (stride 0 on broadcast dims)."""
    if x.dim() > 4:
        from ....ir.fused_ops import rope as reference
        return reference(x, cos, sin, interleaved, out=out)
    if x.stride(-1) != 1 and x.shape[-1] > 1:
        x = x.contiguous()
    shape = (1,) * (4 - x.dim()) + tuple(x.shape)
    xs = (0,) * (4 - x.dim()) + tuple(x.stride())
    out_dtype = torch.promote_types(torch.promote_types(x.dtype, cos.dtype), sin.dtype)
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device) if out is None else out
    c = cos.contiguous().expand(x.shape)   # broadcast dims get stride 0; the last dim stays dense
    s = sin.contiguous().expand(x.shape)
    cs = (0,) * (4 - x.dim()) + tuple(c.stride())
    ss = (0,) * (4 - x.dim()) + tuple(s.stride())
    rows = shape[0] * shape[1] * shape[2]
    if rows and shape[3]:
        block = block_for(shape[3])
        # several rows a program: one 128-element head row per program left most threads idle (a
        # 512-token prefill's q took 10 us where its bytes need 3). The tile does not shrink with the
        # rows (the row mask covers a short tensor): one binary per head size, not one per row count.
        per = max(1, _ROPE_TILE // block)
        LIBRARY.kernel("rope", INTERLEAVED=bool(interleaved), ROWS=per, BLOCK=block)(
            x, c, s, out, rows, shape[3], shape[1], shape[2], xs[0], xs[1], xs[2], cs[0], cs[1], cs[2], ss[0], ss[1],
            ss[2], grid=(cdiv(rows, per),))
    return out


# gelu_new (GPT-2's written-out tanh GELU) as the tanh GELU, rounded once (the reference rounds at each op)
_ACTS = {None: 0, "relu": 1, "silu": 2, "gelu": 3, "gelu_tanh": 4, "gelu_new": 4}


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
            h, h if bias is None else bias, out, n, h.shape[-1], grid=(cdiv(n, _BLOCK),))
    return out


LIBRARY = KernelLibrary("elementwise", {"gated": "gated_kernel", "rope": "rope_kernel", "bias_act": "bias_act_kernel"})
