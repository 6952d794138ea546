"""A norm folded into the projections it feeds (passes/fold_norms.py): the folded constants
(``ost.fold_weights``, ``ost.fold_bias``, made once at compile), the fp32 product (``ost.linear_out``), the
row scale that applies the norm's statistic to it (``ost.row_scale``) and the residual add as the product's
in-place accumulation (``ost.linear_acc_``). Each a reference in plain torch, as fused_ops.py's: the CPU
runs it, other backends' kernels are checked against it."""
from __future__ import annotations

import torch

from .fused_ops import _into
from .ops import OpDef, register_op


def fold_weights(weights: list[torch.Tensor], norm_weight: torch.Tensor | None, offset: float = 0.0,
                 center: bool = False) -> torch.Tensor:
    """The projections' weights [N_i, K], one after another, each column k times ``norm_weight[k] + offset``
    (1 + offset without a weight), in fp32, rounded once to the weights' dtype: ``rms_norm(x) @ W^T`` is
    ``rstd(x) * (x @ fold^T)``. ``center`` (a LayerNorm's): each row then less its mean, so that the product
    subtracts the input row's mean itself (``(x - mean(x)) @ V^T = x @ (V - mean_k V)^T``): ``layer_norm(x)
    @ W^T`` is ``rstd(x) * (x @ fold^T)`` plus ``fold_bias``. Its inputs are constants: compile-time folding
    (runtime/folding.py) makes it once."""
    scale = (1.0 if norm_weight is None else norm_weight.float()) + offset
    folded = torch.cat([w.float() * scale for w in weights])
    if not center:
        return folded.to(weights[0].dtype)
    return _round_summing_to_zero(folded - folded.mean(-1, keepdim=True), weights[0].dtype)


_MANTISSA = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}


def _round_summing_to_zero(exact: torch.Tensor, dtype: torch.dtype, rounds: int = 6, width: int = 128) -> torch.Tensor:
    """``exact`` (fp32 rows summing to 0) rounded to ``dtype`` with each row's sum kept near 0: a centered
    fold's product subtracts the row's mean only as well as its weights sum to 0, and plain rounding leaves
    each row a sum of about sqrt(K) half-ulps, which times the input's mean is an error growing with the
    mean against the spread (bench/fold_numerics.py --layer). Each round moves up to ``width`` elements of a
    row to their other neighbour -- those nearest halfway between the two, on the side that shrinks the
    row's sum, by at most twice the sum -- taking the prefix of them that leaves the sum smallest. Every
    element stays within one ulp of ``exact``."""
    out = exact.to(dtype)
    if dtype not in _MANTISSA or exact.dim() != 2 or not exact.numel():
        return out
    width = min(width, exact.shape[-1])
    # the spacing of subnormals (fp16's below 6.1e-5): no step is finer
    finest = torch.finfo(dtype).smallest_normal * 2.0 ** (1 - _MANTISSA[dtype])
    for _ in range(rounds):     # (a fixed count: no host sync, were it ever run per step)
        cur = out.float()
        residual = (cur - exact).sum(-1, keepdim=True)                    # [N, 1]
        toward = -torch.sign(residual)                                    # the direction that shrinks it
        _, e = torch.frexp(cur)
        ulp = torch.ldexp(torch.ones_like(cur), e - _MANTISSA[dtype]).clamp_min(finest)
        err = cur - exact
        ok = (torch.sign(-err) == toward) & (ulp <= 2 * residual.abs()) & (cur != 0)
        cost = torch.where(ok, ulp - 2 * err.abs(), torch.inf)           # how much the element's error grows
        cost, idx = torch.topk(cost, width, dim=-1, largest=False)
        step = torch.where(torch.isfinite(cost), toward * ulp.gather(-1, idx), 0.0)
        left = (residual + torch.cumsum(step, -1)).abs()                  # the sum after each prefix
        left = torch.cat([residual.abs(), left], -1)
        take = left.argmin(-1, keepdim=True)                              # prefix length (0: none)
        moved = torch.arange(width, device=exact.device) < take
        cur = cur.scatter_add(-1, idx, torch.where(moved, step, 0.0))
        out = cur.to(dtype)
    return out


register_op(OpDef("ost.fold_weights", fold_weights, category="fused"))


def fold_bias(weight: torch.Tensor, norm_bias: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """``weight @ norm_bias + bias`` in fp32 (zeros where neither is given): the constant part of a
    LayerNorm's output (its shift ``norm_bias``) times a projection, plus the projection's own bias; the
    row scale adds it after its scale (passes/fold_norms.py). Kept in fp32: one rounding, the result's."""
    out = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device)
    if norm_bias is not None:
        out = out + weight.float() @ norm_bias.float()
    if bias is not None:
        out = out + bias.float()
    return out


register_op(OpDef("ost.fold_bias", fold_bias, category="fused"))


def linear_out(x: torch.Tensor, weight: torch.Tensor, splits: list[int], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """``x @ weight^T`` kept in ``dtype`` (fp32: the product of half operands before any rounding), split along
    the last dim into ``splits``. On CUDA one cuBLAS call with an fp32 output (``torch.mm``'s ``out_dtype``;
    not addmm's, which copies its bias into the result in a kernel of its own first); here the operands are
    cast up (the same exact products, summed in another order)."""
    if x.device.type == "cuda" and dtype == torch.float32 and x.dtype in (torch.float16, torch.bfloat16):
        y = torch.mm(x.reshape(-1, x.shape[-1]), weight.t(), out_dtype=dtype).view(*x.shape[:-1], weight.shape[0])
    else:
        y = torch.nn.functional.linear(x.to(dtype), weight.to(dtype))
    return y.split(list(splits), dim=-1)


linear_out.multi_output = True
register_op(OpDef("ost.linear_out", linear_out, category="fused"))


def row_scale(p: torch.Tensor, x: torch.Tensor, eps: float, dtype: torch.dtype, bias: torch.Tensor | None = None,
              center: bool = False, shift: torch.Tensor | None = None, pre: torch.Tensor | None = None, *,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """``p * rsqrt(mean(x ** 2, -1) + eps)`` in fp32, rounded to ``dtype``: RMSNorm's statistic applied to a
    product of its (unnormalized) input. ``center``: LayerNorm's instead, ``rsqrt(mean((x - mean(x)) ** 2) +
    eps)`` (the product's weights centered: fold_weights). ``x``'s rows are along its dim 0 (its other dims
    before the last are 1: a decode step's tokens); ``p``'s dim 0 indexes the same rows, its other dims
    broadcast. ``bias`` (the projection's, 1-d, one element per element of a row of ``p`` in its order; any
    float dtype) is added in fp32 after the scale, before the rounding: a biased projection's result (Qwen 2's
    q, k and v), a folded LayerNorm's shift (fold_bias). ``shift`` (1-d, as wide as ``x``'s rows): the
    statistic is ``x + shift``'s, in fp32 (a residual stream that lags its biases, passes/fold_norms.py), and
    ``pre`` (laid out as ``bias``: the shift through the projection's weights) is added to ``p`` before the
    scale: ``(p + pre) * rstd(x + shift) + bias``."""
    h = x.float() if shift is None else x.float() + shift.float()
    if center:
        h = h - h.mean(-1, keepdim=True)
    rstd = torch.rsqrt(h.pow(2).mean(-1) + eps).reshape(x.shape[0], *(1,) * (p.dim() - 1))
    pf = p.float() if pre is None else (p.float().reshape(p.shape[0], -1) + pre.float()).reshape(p.shape)
    scaled = pf * rstd
    if bias is not None:
        scaled = (scaled.reshape(p.shape[0], -1) + bias.float()).reshape(p.shape)
    return _into(out, scaled.to(dtype))


register_op(OpDef("ost.row_scale", row_scale, category="fused"))


def fold_offset(parts: list[torch.Tensor]) -> torch.Tensor:
    """The fp32 sum of 1-d constants: the biases a residual stream lags by (passes/fold_norms.py: each biased
    projection accumulated into it without its bias adds its bias here). Made once at compile."""
    out = parts[0].float()
    for t in parts[1:]:
        out = out + t.float()
    return out


register_op(OpDef("ost.fold_offset", fold_offset, category="fused"))


def linear_acc_(acc: torch.Tensor, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``acc += h @ weight^T`` in place (a residual add as the product's beta=1 accumulation: one cuBLAS call,
    no add kernel); returns ``acc``. Made only where nothing reads ``acc``'s old value afterwards."""
    acc.view(-1, acc.shape[-1]).addmm_(h.reshape(-1, h.shape[-1]), weight.t())
    return acc


register_op(OpDef("ost.linear_acc_", linear_acc_, pure=False, category="inplace", writes=(0,)))
