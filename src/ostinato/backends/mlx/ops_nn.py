"""MLX handlers of matmuls, convolutions, pooling, resampling, softmax and norms."""
from __future__ import annotations

import math

import mlx.core as mx

from .ops import handles, mxd


# -- matmul -----------------------------------------------------------------------------------------
@handles("aten.mm", "aten.bmm", "aten.matmul", "aten.mv", "aten.dot")
def matmul(a, b):
    return mx.matmul(a, b)


@handles("aten.addmm", "aten.baddbmm", "aten.addmv")
def addmm(bias, a, b, beta=1, alpha=1):
    p = mx.matmul(a, b)
    if alpha != 1:
        p = p * alpha
    return p + (bias if beta == 1 else bias * beta) if beta != 0 else p


@handles("aten.addbmm")
def addbmm(bias, a, b, beta=1, alpha=1):
    p = mx.sum(mx.matmul(a, b), axis=0)
    return p * alpha + (bias * beta if beta != 0 else 0)


def linear_of(x, w, b=None):
    y = mx.matmul(x, mx.swapaxes(w, -1, -2))
    return y if b is None else y + b


@handles("aten.linear")
def linear(x, w, b=None):
    return linear_of(x, w, b)


@handles("aten.outer")
def outer(a, b):
    return mx.outer(a, b)


# -- convolution ------------------------------------------------------------------------------------
def _channels_last(x):
    return mx.moveaxis(x, 1, -1)


def _channels_first(x):
    return mx.moveaxis(x, -1, 1)


_CONV_TRANSPOSE = {1: mx.conv_transpose1d, 2: mx.conv_transpose2d, 3: mx.conv_transpose3d}


def conv_supported(node) -> bool:
    """Grouped transposed convolutions run through torch (MLX's transposed forms take groups=1 only)."""
    args = node.args
    transposed = args[6] if len(args) > 6 else node.kwargs.get("transposed", False)
    groups = args[8] if len(args) > 8 else node.kwargs.get("groups", 1)
    return not transposed or groups == 1


@handles("aten.convolution")
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    nd = x.ndim - 2
    pad = list(padding) if len(padding) == nd else list(padding) * nd
    if transposed:
        # torch's weight is [C_in, C_out, k...]; MLX's [C_out, k..., C_in]
        one = (lambda v: v[0]) if nd == 1 else tuple     # conv_transpose1d takes ints
        y = _CONV_TRANSPOSE[nd](_channels_last(x), mx.moveaxis(w, 0, -1), stride=one(list(stride)),
                                padding=one(pad), dilation=one(list(dilation)),
                                output_padding=one(list(output_padding)))
    else:
        y = mx.conv_general(_channels_last(x), mx.moveaxis(w, 1, -1), stride=list(stride), padding=pad,
                            kernel_dilation=list(dilation), groups=groups)
    y = _channels_first(y)
    if bias is not None:
        y = y + mx.reshape(bias, (1, -1) + (1,) * nd)
    return y


# -- pooling ----------------------------------------------------------------------------------------
def _tuple(v, n):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * n if len(v) == 1 else v


def _windows(x, kernel, stride, dilation):
    """[..., o1.., k1..] windows of the last len(kernel) dims of a contiguous x (no padding)."""
    n = len(kernel)
    shape, strides = list(x.shape), [1] * x.ndim
    for i in range(x.ndim - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    lead = x.ndim - n
    out = [(shape[lead + i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1 for i in range(n)]
    view_shape = shape[:lead] + out + list(kernel)
    view_strides = strides[:lead] + [strides[lead + i] * stride[i] for i in range(n)] + \
        [strides[lead + i] * dilation[i] for i in range(n)]
    return mx.as_strided(x, view_shape, view_strides), out


def _ceil_extra(size, k, s, p, d, ceil_mode):
    """Elements past the padded end that ceil_mode's last window covers (torch's output-size rule: the
    last window must start inside the input or its left padding)."""
    span = d * (k - 1) + 1
    if not ceil_mode:
        return 0
    out = -(-(size + 2 * p - span) // s) + 1
    if (out - 1) * s >= size + p:
        out -= 1
    return max((out - 1) * s + span - (size + 2 * p), 0)


def _pad_ends(x, lo, hi, value):
    n = len(lo)
    if not any(lo) and not any(hi):
        return x
    return mx.pad(x, [(0, 0)] * (x.ndim - n) + list(zip(lo, hi)), constant_values=value)


def adaptive_max_supported(node) -> bool:
    """Adaptive max pooling with uneven bins runs through torch."""
    x, size = node.args[0], node.args[1]
    shape = x.meta.shape if hasattr(x, "meta") else x.shape
    return all(isinstance(n, int) and n % o == 0 for n, o in zip(shape[-2:], size))


def grid_sample_supported(node) -> bool:
    """Bilinear sampling with zero padding is mapped; other modes run through torch."""
    args = node.args
    return len(args) > 3 and args[2] == 0 and args[3] == 0


def _max_pool(x, kernel_size, stride, padding, dilation, n, ceil_mode=False):
    k = _tuple(kernel_size, n)
    s = _tuple(stride, n) if stride else k
    p, d = _tuple(padding, n), _tuple(dilation, n)
    low = -math.inf if mx.issubdtype(x.dtype, mx.floating) else int(mx.iinfo(x.dtype).min)
    extra = [_ceil_extra(x.shape[x.ndim - n + i], k[i], s[i], p[i], d[i], ceil_mode) for i in range(n)]
    xp = _pad_ends(x, p, [p[i] + extra[i] for i in range(n)], low)
    win, out = _windows(xp, k, s, d)
    flat = mx.reshape(win, win.shape[:x.ndim] + (-1,))
    values = mx.max(flat, axis=-1)
    arg = mx.argmax(flat, axis=-1)
    # The flat index into the unpadded input, as torch returns it.
    lead = x.ndim - n
    index = mx.zeros(values.shape, mx.int64)
    rem = arg
    for i in range(n - 1, -1, -1):
        ki = rem % k[i]
        rem = rem // k[i]
        shape = [1] * values.ndim
        shape[lead + i] = out[i]
        pos = mx.reshape(mx.arange(out[i]) * s[i], shape) - p[i] + ki * d[i]
        size = 1
        for j in range(i + 1, n):
            size *= x.shape[lead + j]
        index = index + pos.astype(mx.int64) * size
    return values, index


@handles("aten.max_pool2d_with_indices", multi=True)
def max_pool2d(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, kernel_size, stride, padding, dilation, 2, ceil_mode)


@handles("aten.max_pool3d_with_indices", multi=True)
def max_pool3d(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(x, kernel_size, stride, padding, dilation, 3, ceil_mode)


def _avg_pool(x, kernel_size, stride, padding, count_include_pad, divisor_override, n, ceil_mode=False):
    k = _tuple(kernel_size, n)
    s = _tuple(stride, n) if stride else k
    p = _tuple(padding, n)
    one = [1] * n
    extra = [_ceil_extra(x.shape[x.ndim - n + i], k[i], s[i], p[i], 1, ceil_mode) for i in range(n)]
    hi = [p[i] + extra[i] for i in range(n)]
    win, _ = _windows(_pad_ends(x, p, hi, 0), k, s, one)
    total = mx.sum(win, axis=tuple(range(-n, 0)))
    if divisor_override:
        return total / divisor_override
    if not any(extra) and (count_include_pad or not any(p)):
        return total / math.prod(k)
    # torch divides by the window's size within the padded input (count_include_pad) or within the
    # input itself; never counting what ceil_mode's last window hangs past the padding.
    if count_include_pad:
        ones = _pad_ends(mx.ones(tuple(x.shape[-n + i] + 2 * p[i] for i in range(n)), x.dtype), [0] * n, extra, 0)
    else:
        ones = _pad_ends(mx.ones(x.shape[-n:], x.dtype), p, hi, 0)
    cwin, _ = _windows(ones, k, s, one)
    return total / mx.sum(cwin, axis=tuple(range(-n, 0)))


@handles("aten.avg_pool1d")
def avg_pool1d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True):
    return _avg_pool(x, kernel_size, stride, padding, count_include_pad, None, 1, ceil_mode)


@handles("aten.avg_pool2d")
def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(x, kernel_size, stride, padding, count_include_pad, divisor_override, 2, ceil_mode)


@handles("aten.avg_pool3d")
def avg_pool3d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(x, kernel_size, stride, padding, count_include_pad, divisor_override, 3, ceil_mode)


def _adaptive_bins(n_in, n_out):
    return [((i * n_in) // n_out, -(-((i + 1) * n_in) // n_out)) for i in range(n_out)]


def _adaptive(x, output_size, reduce, n):
    for i, size in enumerate(output_size[-n:]):
        d = x.ndim - n + i
        n_in = x.shape[d]
        if n_in % size == 0:
            shape = list(x.shape)
            shape[d:d + 1] = [size, n_in // size]
            x = reduce(mx.reshape(x, shape), d + 1)
        else:
            idx = [slice(None)] * x.ndim
            parts = []
            for lo, hi in _adaptive_bins(n_in, size):
                idx[d] = slice(lo, hi)
                parts.append(mx.expand_dims(reduce(x[tuple(idx)], d), d))
            x = mx.concatenate(parts, axis=d)
    return x


@handles("aten._adaptive_avg_pool2d")
def adaptive_avg_pool2d(x, output_size):
    return _adaptive(x, output_size, lambda t, d: mx.mean(t, axis=d), 2)


@handles("aten.adaptive_max_pool2d", multi=True)
def adaptive_max_pool2d(x, output_size):
    k = [n // o for n, o in zip(x.shape[-2:], output_size)]
    return _max_pool(x, k, k, 0, 1, 2)


@handles("aten.grid_sampler_2d")
def grid_sampler_2d(x, grid, interpolation_mode=0, padding_mode=0, align_corners=False):
    """Bilinear sampling, zeros outside (modes 0 and 0); x [N, C, H, W], grid [N, Ho, Wo, 2] in [-1, 1]."""
    n, c, h, w = x.shape
    gx, gy = grid[..., 0].astype(mx.float32), grid[..., 1].astype(mx.float32)
    if align_corners:
        ix, iy = (gx + 1) / 2 * (w - 1), (gy + 1) / 2 * (h - 1)
    else:
        ix, iy = ((gx + 1) * w - 1) / 2, ((gy + 1) * h - 1) / 2
    x0, y0 = mx.floor(ix), mx.floor(iy)
    flat = mx.reshape(x, (n, c, h * w))
    out = None
    for dx, dy in ((0, 0), (1, 0), (0, 1), (1, 1)):
        cx, cy = x0 + dx, y0 + dy
        weight = (1 - mx.abs(ix - cx)) * (1 - mx.abs(iy - cy))
        inside = (cx >= 0) & (cx <= w - 1) & (cy >= 0) & (cy <= h - 1)
        index = (mx.clip(cy, 0, h - 1) * w + mx.clip(cx, 0, w - 1)).astype(mx.int32)
        ho, wo = index.shape[1], index.shape[2]
        picked = mx.take_along_axis(flat, mx.broadcast_to(mx.reshape(index, (n, 1, ho * wo)), (n, c, ho * wo)), axis=2)
        term = mx.reshape(picked, (n, c, ho, wo)) * mx.expand_dims(mx.where(inside, weight, 0.0), 1)
        out = term if out is None else out + term
    return out.astype(x.dtype)


@handles("aten._adaptive_avg_pool3d")
def adaptive_avg_pool3d(x, output_size):
    return _adaptive(x, output_size, lambda t, d: mx.mean(t, axis=d), 3)


# -- resampling -------------------------------------------------------------------------------------
def _scales(x, output_size, scale_factors, n):
    ins = x.shape[-n:]
    outs = list(output_size) if output_size else [int(math.floor(i * s)) for i, s in zip(ins, scale_factors)]
    return ins, outs


def _nearest(x, output_size, scale_factors, n):
    ins, outs = _scales(x, output_size, scale_factors, n)
    for i in range(n):
        d = x.ndim - n + i
        scale = (1.0 / scale_factors[i]) if scale_factors else ins[i] / outs[i]
        src = mx.minimum(mx.floor(mx.arange(outs[i], dtype=mx.float32) * scale).astype(mx.int32), ins[i] - 1)
        x = mx.take(x, src, axis=d)
    return x


@handles("aten.upsample_nearest1d.vec")
def upsample_nearest1d(x, output_size, scale_factors):
    return _nearest(x, output_size, scale_factors, 1)


@handles("aten.upsample_nearest2d.vec")
def upsample_nearest2d(x, output_size, scale_factors):
    return _nearest(x, output_size, scale_factors, 2)


@handles("aten.upsample_nearest2d")
def upsample_nearest2d_sizes(x, output_size, scales_h=None, scales_w=None):
    return _nearest(x, output_size, [scales_h, scales_w] if scales_h and scales_w else None, 2)


def _linear_resample(x, output_size, align_corners, scale_factors, n):
    ins, outs = _scales(x, output_size, scale_factors, n)
    for i in range(n):
        d = x.ndim - n + i
        n_in, n_out = ins[i], outs[i]
        pos = mx.arange(n_out, dtype=mx.float32)
        if align_corners:
            src = pos * ((n_in - 1) / (n_out - 1)) if n_out > 1 else pos * 0
        else:
            scale = (1.0 / scale_factors[i]) if scale_factors else n_in / n_out
            src = mx.maximum((pos + 0.5) * scale - 0.5, 0.0)
        i0 = mx.minimum(mx.floor(src).astype(mx.int32), n_in - 1)
        i1 = mx.minimum(i0 + 1, n_in - 1)
        lam = (src - i0.astype(mx.float32)).astype(x.dtype)
        shape = [1] * x.ndim
        shape[d] = n_out
        lam = mx.reshape(lam, shape)
        x = mx.take(x, i0, axis=d) * (1 - lam) + mx.take(x, i1, axis=d) * lam
    return x


@handles("aten.upsample_bilinear2d.vec")
def upsample_bilinear2d(x, output_size, align_corners, scale_factors):
    return _linear_resample(x, output_size, align_corners, scale_factors, 2)


@handles("aten.upsample_linear1d.vec")
def upsample_linear1d(x, output_size, align_corners, scale_factors):
    return _linear_resample(x, output_size, align_corners, scale_factors, 1)


@handles("aten.upsample_bilinear2d")
def upsample_bilinear2d_sizes(x, output_size, align_corners, scales_h=None, scales_w=None):
    return _linear_resample(x, output_size, align_corners, [scales_h, scales_w] if scales_h and scales_w else None, 2)


# -- softmax and norms ------------------------------------------------------------------------------
@handles("aten._softmax")
def softmax(x, dim, half_to_float=False):
    return mx.softmax(x, axis=dim, precise=True)


@handles("aten.softmax.int")
def softmax_int(x, dim, dtype=None):
    return mx.softmax(x if dtype is None else x.astype(mxd(dtype)), axis=dim, precise=True)


@handles("aten._log_softmax")
def log_softmax(x, dim, half_to_float=False):
    h = x.astype(mx.float32) if x.dtype in (mx.float16, mx.bfloat16) else x
    return (h - mx.logsumexp(h, axis=dim, keepdims=True)).astype(x.dtype)


@handles("aten.log_softmax.int")
def log_softmax_int(x, dim, dtype=None):
    return log_softmax(x if dtype is None else x.astype(mxd(dtype)), dim)


def _norm_axes(x, normalized_shape):
    return tuple(range(x.ndim - len(normalized_shape), x.ndim))


def layer_norm_of(x, normalized_shape, weight, bias, eps):
    if len(normalized_shape) == 1:
        return mx.fast.layer_norm(x, weight, bias, eps)
    ax = _norm_axes(x, normalized_shape)
    h = x.astype(mx.float32)
    m = mx.mean(h, axis=ax, keepdims=True)
    v = mx.mean(mx.square(h - m), axis=ax, keepdims=True)
    y = ((h - m) * mx.rsqrt(v + eps)).astype(x.dtype)
    if weight is not None:
        y = y * weight
    return y if bias is None else y + bias


@handles("aten.layer_norm")
def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return layer_norm_of(x, normalized_shape, weight, bias, eps)


@handles("aten.native_layer_norm", multi=True)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    ax = _norm_axes(x, normalized_shape)
    h = x.astype(mx.float32)
    m = mx.mean(h, axis=ax, keepdims=True)
    rstd = mx.rsqrt(mx.mean(mx.square(h - m), axis=ax, keepdims=True) + eps)
    out = layer_norm_of(x, normalized_shape, weight, bias, eps)
    return out, m, rstd


@handles("aten.rms_norm")
def rms_norm(x, normalized_shape, weight=None, eps=None):
    if eps is None:     # torch: the epsilon of the type it computes in (float32 for half types)
        eps = float(mx.finfo(mx.float32 if x.dtype in (mx.float16, mx.bfloat16) else x.dtype).eps)
    if len(normalized_shape) == 1:
        return mx.fast.rms_norm(x, weight, eps)
    ax = _norm_axes(x, normalized_shape)
    h = x.astype(mx.float32)     # torch's CPU kernel: statistics, scaling and weight in float32
    y = h * mx.rsqrt(mx.mean(mx.square(h), axis=ax, keepdims=True) + eps)
    return (y if weight is None else y * weight.astype(mx.float32)).astype(x.dtype)


@handles("aten._weight_norm_interface", multi=True)
def weight_norm_interface(v, g, dim=0):
    """(v * (g / |v|), |v|): the norm over every dim but ``dim``, in float32 (returned so, as torch's
    kernel does), one rounding of the product to v's dtype."""
    dim %= v.ndim
    h = v.astype(mx.float32)
    norm = mx.sqrt(mx.sum(mx.square(h), axis=[a for a in range(v.ndim) if a != dim], keepdims=True))
    return (h * (g.astype(mx.float32) / norm)).astype(v.dtype), norm


@handles("aten.native_group_norm", multi=True)
def native_group_norm(x, weight, bias, n, c, hw, group, eps):
    h = mx.reshape(x.astype(mx.float32), (n, group, -1))
    m = mx.mean(h, axis=-1, keepdims=True)
    rstd = mx.rsqrt(mx.mean(mx.square(h - m), axis=-1, keepdims=True) + eps)
    y = mx.reshape(((h - m) * rstd), x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    if weight is not None:
        y = y * mx.reshape(weight, shape)
    if bias is not None:
        y = y + mx.reshape(bias, shape)
    return y.astype(x.dtype), mx.reshape(m, (n, group)).astype(x.dtype), mx.reshape(rstd, (n, group)).astype(x.dtype)


def _batch_norm(x, weight, bias, mean, var, eps):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    scale = mx.rsqrt(var + eps)
    if weight is not None:
        scale = scale * weight
    y = (x - mx.reshape(mean, shape)) * mx.reshape(scale, shape)
    if bias is not None:
        y = y + mx.reshape(bias, shape)
    empty = mx.zeros((0,), x.dtype)
    return y.astype(x.dtype), empty, empty


@handles("aten._native_batch_norm_legit_no_training", multi=True)
def batch_norm_eval(x, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(x, weight, bias, running_mean, running_var, eps)


def batch_norm_supported(node) -> bool:
    """Training-mode batch norm (batch statistics, running stats updated) runs through torch."""
    training = node.args[5] if len(node.args) > 5 else node.kwargs.get("training", False)
    return node.op != "aten._native_batch_norm_legit.no_stats" and not training


@handles("aten.native_batch_norm", multi=True)
def native_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm(x, weight, bias, running_mean, running_var, eps)


# -- attention --------------------------------------------------------------------------------------
def attention(q, k, v, mask=None, scale=None, is_causal=False):
    """Attention through mx.fast.scaled_dot_product_attention ([B, H, T, D]; KV heads may be fewer)."""
    squeeze = q.ndim == 3
    if squeeze:
        q, k, v = q[None], k[None], v[None]
        if mask is not None and mask.ndim == 3:
            mask = mask[None]
    t, s = q.shape[-2], k.shape[-2]
    if is_causal:
        causal = mx.tril(mx.ones((t, s), mx.bool_))     # torch aligns the causal mask top-left
        mask = causal if mask is None else (mask & causal if mask.dtype == mx.bool_ else
                                            mx.where(causal, mask, -math.inf))
    if mask is not None and mask.dtype != mx.bool_ and mask.dtype != q.dtype:
        mask = mask.astype(q.dtype)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    o = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)
    return o[0] if squeeze else o


@handles("aten.scaled_dot_product_attention")
def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    return attention(q, k, v, attn_mask, scale, is_causal)

