"""MLX handlers of ostinato's fused ops (``ost.*``): norms and attention through ``mx.fast``; KV
updates as slice updates of the state arrays.

RoPE goes through ``mx.fast.rope`` where lowering proved that the model's cos/sin tables are the ones
mx.fast.rope computes (rope.py: ``inv_freq`` times contiguous positions); otherwise it is computed
elementwise (``x * cos + rotate(x) * sin``, fused by ``mx.compile`` under replay).
"""
from __future__ import annotations

import math

import mlx.core as mx

from ...ir.fused_ops import sequence_major
from .ops import handles, mxd
from .ops_elementwise import gelu_of, silu_of
from .ops_nn import attention, linear_of
from .rope import exact_freqs, fast_rope


def rms_norm_of(x, weight, eps, compute_dtype=None, weight_offset=0.0, weight_first=False):
    """The reference's arithmetic (ir/fused_ops.rms_norm) with the statistics and scaling done by
    mx.fast.rms_norm in the compute dtype."""
    cd = mxd(compute_dtype) if compute_dtype is not None else x.dtype
    h = x.astype(cd) if cd != x.dtype else x
    if weight_first:
        w = None
        if weight is not None:
            w = weight.astype(cd) + weight_offset if weight_offset else weight.astype(cd)
        return mx.fast.rms_norm(h, w, eps).astype(x.dtype)
    if weight is not None and weight_offset:
        weight = weight + weight_offset
    if cd != x.dtype:
        y = mx.fast.rms_norm(h, None, eps).astype(x.dtype)
        return y if weight is None else y * weight
    if weight is not None and weight.dtype == x.dtype:
        return mx.fast.rms_norm(x, weight, eps)
    y = mx.fast.rms_norm(x, None, eps)
    return y if weight is None else y * weight


@handles("ost.rms_norm")
def rms_norm(x, weight, eps, compute_dtype=None, weight_offset=0.0, weight_first=False):
    return rms_norm_of(x, weight, eps, compute_dtype, weight_offset, weight_first)


@handles("ost.add_rms_norm", multi=True)
def add_rms_norm(x, residual, weight, eps, compute_dtype=None, weight_offset=0.0, weight_first=False):
    s = x + residual
    return s, rms_norm_of(s, weight, eps, compute_dtype, weight_offset, weight_first)


@handles("ost.layer_norm")
def layer_norm(x, weight, bias, eps, compute_dtype=None):
    cd = mxd(compute_dtype) if compute_dtype is not None else x.dtype
    if cd == x.dtype:
        return mx.fast.layer_norm(x, weight, bias, eps)
    w = None if weight is None else weight.astype(cd)
    b = None if bias is None else bias.astype(cd)
    return mx.fast.layer_norm(x.astype(cd), w, b, eps).astype(x.dtype)


@handles("ost.swiglu")
def swiglu(gate, up):
    return silu_of(gate) * up


@handles("ost.geglu")
def geglu(gate, up, approximate="none"):
    return gelu_of(gate, approximate) * up


def _halves(x):
    return mx.split(x, 2, axis=-1)


@handles("ost.swiglu_packed")
def swiglu_packed(x):
    gate, up = _halves(x)
    return silu_of(gate) * up


@handles("ost.geglu_packed")
def geglu_packed(x, approximate="none"):
    gate, up = _halves(x)
    return gelu_of(gate, approximate) * up


def _gelu_new(h):
    """GPT-2's gelu_new op by op, each step in h's dtype (ir/fused_ops.py's gelu_new)."""
    inner = mx.power(h, 3) * 0.044715 + h
    return (h * 0.5) * (mx.tanh(inner * math.sqrt(2.0 / math.pi)) + 1.0)


_ACT = {"relu": lambda h: mx.maximum(h, 0), "silu": silu_of, "gelu": gelu_of,
        "gelu_tanh": lambda h: gelu_of(h, "tanh"), "gelu_new": _gelu_new}


@handles("ost.linear")
def linear(x, weight, bias, activation=None, weight_t=False):
    if weight_t:
        h = mx.matmul(x, weight)
        h = h if bias is None else h + bias
    else:
        h = linear_of(x, weight, bias)
    return h if activation is None else _ACT[activation](h)


@handles("ost.multi_linear", multi=True)
def multi_linear(x, weights, biases=None):
    # One matmul over the weights concatenated would copy them on every call (MLX has no view of
    # several arrays as one); the projections run one by one and mx.compile schedules them.
    return tuple(linear_of(x, w, None if biases is None else biases[i]) for i, w in enumerate(weights))


def rope_of(x, cos, sin, interleaved=False):
    if interleaved:
        even, odd = x[..., 0::2], x[..., 1::2]
        rotated = mx.reshape(mx.stack([-odd, even], axis=-1), x.shape)
        return x * cos + rotated * sin
    half = x.shape[-1] // 2
    rotated = mx.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


@handles("ost.rope")
def rope(x, cos, sin, interleaved=False, inv_freq=None, offset=0, seq_axis=-2, scaling=1.0):
    """``inv_freq`` and the rest are set by lowering when the tables are proven (rope.fast_rope_kwargs);
    cos and sin are then not read (MLX never computes them unless something else does)."""
    if inv_freq is not None:
        freqs = exact_freqs(inv_freq)
        if freqs is not None:
            y = fast_rope(x, cos, freqs, offset, seq_axis, interleaved, scaling)
            if y is not None:
                return y
    return rope_of(x, cos, sin, interleaved)


def kv_update_of(cache, new, index, dim, ring=None):
    """``cache`` with ``new`` written at rows ``index`` of ``dim``: a slice update when the rows are
    one run (a decode step's position), a scatter otherwise."""
    d = dim % cache.ndim
    slots = index if ring is None else mx.remainder(index, ring)
    slots = mx.where(slots < 0, slots + cache.shape[d], slots)
    new = new.astype(cache.dtype)
    if slots.size == 1 and ring is None:
        start = mx.reshape(slots, (1,)).astype(mx.int32)
        return mx.slice_update(cache, new, start, (d,))
    out = mx.array(cache)
    out[(slice(None),) * d + (slots,)] = new
    return out


@handles("ost.kv_update", "ost.kv_update_")
def kv_update(cache, new, index, dim, ring=None):
    return kv_update_of(cache, new, index, dim, ring)


def positional_mask(s, q_pos):
    return mx.arange(s) <= q_pos


def sdpa_of(q, k, v, mask=None, q_pos=None, scale=None, n_rep=1, is_causal=False, softcap=None):
    if softcap is not None:
        return softcap_attention_of(q, k, v, mask, q_pos, scale, n_rep, is_causal, softcap)
    if q_pos is not None:
        visible = positional_mask(k.shape[-2], q_pos)
        if mask is None:
            mask = visible
        elif mask.dtype == mx.bool_:
            mask = mask & visible
        else:
            mask = mx.where(visible, mask, -float("inf"))
    return attention(q, k, v, mask, scale, is_causal)


def softcap_attention_of(q, k, v, mask=None, q_pos=None, scale=None, n_rep=1, is_causal=False, softcap=None):
    """ir/fused_ops.softcap_attention: the eager form, the scores soft-capped, the softmax in fp32."""
    if n_rep > 1:
        k, v = mx.repeat(k, n_rep, axis=-3), mx.repeat(v, n_rep, axis=-3)
    s = (q @ mx.swapaxes(k, -1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if softcap is not None:
        s = mx.tanh(s / softcap) * softcap
    t, n = q.shape[-2], k.shape[-2]
    hidden = mx.array(-float("inf"), dtype=s.dtype)
    if q_pos is not None:
        s = mx.where(positional_mask(n, q_pos), s, hidden)
    if is_causal:
        s = mx.where(mx.tril(mx.ones((t, n), mx.bool_)), s, hidden)
    if mask is not None:
        s = mx.where(mask, s, hidden) if mask.dtype == mx.bool_ else s + mask
    p = mx.softmax(s.astype(mx.float32), axis=-1).astype(q.dtype)
    return p @ v


@handles("ost.softcap_attention")
def softcap_attention(q, k, v, mask=None, q_pos=None, scale=None, n_rep=1, is_causal=False, softcap=None):
    return softcap_attention_of(q, k, v, mask, q_pos, scale, n_rep, is_causal, softcap)


@handles("ost.sdpa")
def sdpa(q, k, v, mask=None, q_pos=None, scale=None, n_rep=1, is_causal=False, softcap=None):
    return sdpa_of(q, k, v, mask, q_pos, scale, n_rep, is_causal, softcap)


@handles("ost.decode_attention_", multi=True)
def decode_attention(k_cache, v_cache, q, k, v, index, dim, ring=None, cos=None, sin=None, interleaved=False,
                     q_pos=None, scale=None, n_rep=1, mask=None, softcap=None, q_norm=None, k_norm=None, norm_eps=0.0,
                     norm_dtype=None, norm_offset=0.0, norm_first=False, rotary=None, wide=False, row_x=None,
                     row_eps=0.0, row_bias=None, row_center=False, row_shift=None, row_pre=None):
    if row_x is not None:      # q, k and v as fp32 products of a folded norm's input (passes/fold_norms.py)
        q, k, v = (row_scale_of(t, row_x, row_eps, k_cache.dtype, b, row_center, row_shift, c)
                   for t, b, c in zip((q, k, v), row_bias or (None, None, None), row_pre or (None, None, None)))
    if q_norm is not None:     # ir/fused_ops.decode_attention_: the heads' norms, then [B, H, 1, D] rows
        q = rms_norm_of(q, q_norm, norm_eps, norm_dtype, norm_offset, norm_first)
        k = rms_norm_of(k, k_norm, norm_eps, norm_dtype, norm_offset, norm_first)
        # [B, 1, H * D] rows normed whole (OLMo 2's): viewed as [B, 1, H, D]
        q, k = (mx.reshape(t, (*t.shape[:-1], -1, k_cache.shape[-1])) if t.ndim == 3 else t for t in (q, k))
    if not sequence_major(dim, k_cache):     # [B, 1, H, D] rows over head-major caches: as [B, H, 1, D]
        q, k, v = (mx.swapaxes(t, 1, 2) if t.shape[1] == 1 else t for t in (q, k, v))
    if cos is not None and rotary:      # the first ``rotary`` dims turned, the rest passed through
        q, k = (mx.concatenate([rope_of(t[..., :rotary].astype(mx.float32) if wide else t[..., :rotary], cos, sin,
                                        interleaved).astype(k_cache.dtype), t[..., rotary:].astype(k_cache.dtype)],
                               axis=-1) for t in (q, k))
    elif cos is not None:     # a promoted (wide) rope cast back to the rows' dtype
        q, k = (rope_of(t.astype(mx.float32) if wide else t, cos, sin, interleaved).astype(k_cache.dtype)
                for t in (q, k))
    k_cache = kv_update_of(k_cache, k, index, dim, ring)
    v_cache = kv_update_of(v_cache, v, index, dim, ring)
    keys, values = k_cache, v_cache
    if sequence_major(dim, k_cache):     # [B, S, H, D] caches; q, k and v in that layout too
        q, keys, values = mx.swapaxes(q, 1, 2), mx.swapaxes(keys, 1, 2), mx.swapaxes(values, 1, 2)
    return sdpa_of(q, keys, values, mask, q_pos, scale, n_rep, False, softcap), k_cache, v_cache


# -- a norm folded into the projections it feeds (passes/fold_norms.py; ir/fold_ops.py's references) ------
def row_scale_of(p, x, eps, dtype, bias=None, center=False, shift=None, pre=None):
    """``dtype``: torch's (the op's argument) or MLX's (the caches' in the merged attention)."""
    h = x.astype(mx.float32)
    if shift is not None:       # (a residual stream lagging its biases)
        h = h + shift.astype(mx.float32)
    if center:      # LayerNorm's statistic
        h = h - mx.mean(h, axis=-1, keepdims=True)
    rstd = mx.rsqrt(mx.mean(h * h, axis=-1) + eps)
    pf = p.astype(mx.float32)
    if pre is not None:        # (laid out as the bias: before the scale)
        pf = mx.reshape(mx.reshape(pf, (p.shape[0], -1)) + pre.astype(mx.float32), p.shape)
    scaled = pf * mx.reshape(rstd, (x.shape[0],) + (1,) * (p.ndim - 1))
    if bias is not None:       # one element per element of a row, in its order
        scaled = mx.reshape(mx.reshape(scaled, (p.shape[0], -1)) + bias.astype(mx.float32), p.shape)
    return scaled.astype(dtype if isinstance(dtype, mx.Dtype) else mxd(dtype))


@handles("ost.row_scale")
def row_scale(p, x, eps, dtype, bias=None, center=False, shift=None, pre=None):
    return row_scale_of(p, x, eps, dtype, bias, center, shift, pre)


@handles("ost.fold_weights")
def fold_weights(weights, norm_weight, offset=0.0, center=False):
    if center:      # (its rounding keeps each row's sum near 0: torch's reference, once at compile)
        from ...ir.fold_ops import fold_weights as reference
        from .convert import to_mx, to_torch
        mx.eval(weights if norm_weight is None else [*weights, norm_weight])
        return to_mx(reference([to_torch(w) for w in weights], None if norm_weight is None else to_torch(norm_weight),
                               offset, True))
    scale = (1.0 if norm_weight is None else norm_weight.astype(mx.float32)) + offset
    return mx.concatenate([w.astype(mx.float32) * scale for w in weights], axis=0).astype(weights[0].dtype)


@handles("ost.fold_bias")
def fold_bias(weight, norm_bias, bias):
    out = mx.zeros((weight.shape[0],), dtype=mx.float32)
    if norm_bias is not None:
        out = out + mx.matmul(weight.astype(mx.float32), norm_bias.astype(mx.float32))
    if bias is not None:
        out = out + bias.astype(mx.float32)
    return out


@handles("ost.fold_offset")
def fold_offset(parts):
    out = parts[0].astype(mx.float32)
    for t in parts[1:]:
        out = out + t.astype(mx.float32)
    return out


@handles("ost.linear_out", multi=True)
def linear_out(x, weight, splits, dtype):
    y = mx.matmul(x.astype(mxd(dtype)), mx.transpose(weight.astype(mxd(dtype))))
    ends = [sum(splits[:i + 1]) for i in range(len(splits) - 1)]
    return tuple(mx.split(y, ends, axis=-1))


@handles("ost.linear_acc_")
def linear_acc(acc, h, weight):
    # MLX arrays are values: the accumulation is a new one (the in-place write is the CUDA plan's)
    return acc + mx.reshape(linear_of(h, weight, None), acc.shape)     # (h's rows may be a reshape of acc's)
