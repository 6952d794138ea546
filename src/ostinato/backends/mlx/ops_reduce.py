"""MLX handlers of reductions and scans (sum, mean, var, norms, cumulative ops)."""
from __future__ import annotations

import mlx.core as mx

from .ops import as_float, axes, handles, is_float, mxd


# -- reductions ------------------------------------------------------------------------------------
def _sum_input(x, dtype):
    if dtype is not None:
        return x.astype(mxd(dtype))
    return x.astype(mx.int64) if not mx.issubdtype(x.dtype, mx.inexact) else x


@handles("aten.sum", "aten.sum.dim_IntList")
def sum_(x, dim=None, keepdim=False, dtype=None):
    return mx.sum(_sum_input(x, dtype), axis=axes(dim, x.ndim), keepdims=keepdim)


@handles("aten.mean", "aten.mean.dim")
def mean(x, dim=None, keepdim=False, dtype=None):
    if dtype is not None:
        x = x.astype(mxd(dtype))
    return mx.mean(x, axis=axes(dim, x.ndim), keepdims=keepdim)


@handles("aten.prod", "aten.prod.dim_int")
def prod(x, dim=None, keepdim=False, dtype=None):
    return mx.prod(_sum_input(x, dtype), axis=axes(dim, x.ndim), keepdims=keepdim)


@handles("aten.amax", "aten.max")
def amax(x, dim=None, keepdim=False):
    return mx.max(x, axis=axes(dim, x.ndim), keepdims=keepdim)


@handles("aten.amin", "aten.min")
def amin(x, dim=None, keepdim=False):
    return mx.min(x, axis=axes(dim, x.ndim), keepdims=keepdim)


def _nan_first(x, dim, keepdim, pick):
    """(value, index) along ``dim``; a NaN wins, as in torch."""
    idx = pick(x, axis=dim, keepdims=True)
    if is_float(x):
        nan = mx.isnan(x)
        idx = mx.where(mx.any(nan, axis=dim, keepdims=True), mx.argmax(nan, axis=dim, keepdims=True), idx)
    val = mx.take_along_axis(x, idx, axis=dim)
    if not keepdim:
        val, idx = mx.squeeze(val, dim), mx.squeeze(idx, dim)
    return val, idx.astype(mx.int64)


@handles("aten.max.dim", multi=True)
def max_dim(x, dim, keepdim=False):
    return _nan_first(x, dim % max(x.ndim, 1), keepdim, mx.argmax)


@handles("aten.min.dim", multi=True)
def min_dim(x, dim, keepdim=False):
    return _nan_first(x, dim % max(x.ndim, 1), keepdim, mx.argmin)


def _arg(pick):
    def arg(x, dim=None, keepdim=False):
        if dim is None:
            r = pick(mx.reshape(x, (-1,)))
            return mx.reshape(r, (1,) * x.ndim) if keepdim else r
        return _nan_first(x, dim % max(x.ndim, 1), keepdim, pick)[1]
    return arg


handles("aten.argmax")(_arg(mx.argmax))
handles("aten.argmin")(_arg(mx.argmin))


@handles("aten.any", "aten.any.dim", "aten.any.dims")
def any_(x, dim=None, keepdim=False):
    return mx.any(x, axis=axes(dim, x.ndim), keepdims=keepdim)


@handles("aten.all", "aten.all.dim", "aten.all.dims")
def all_(x, dim=None, keepdim=False):
    return mx.all(x, axis=axes(dim, x.ndim), keepdims=keepdim)


def _var(x, dim, correction, keepdim):
    ax = axes(dim, x.ndim)
    n = 1
    for a in (ax if ax is not None else range(x.ndim)):
        n *= x.shape[a]
    c = 1 if correction is None else correction
    m = mx.mean(x, axis=ax, keepdims=True)
    return mx.sum(mx.square(x - m), axis=ax, keepdims=keepdim) / max(n - c, 0), m if keepdim else \
        (mx.squeeze(m, ax) if ax is not None else mx.reshape(m, ()))


@handles("aten.var.correction")
def var(x, dim=None, *, correction=None, keepdim=False):
    return _var(as_float(x), dim, correction, keepdim)[0]


@handles("aten.std.correction")
def std(x, dim=None, *, correction=None, keepdim=False):
    return mx.sqrt(_var(as_float(x), dim, correction, keepdim)[0])


@handles("aten.var_mean.correction", multi=True)
def var_mean(x, dim=None, *, correction=None, keepdim=False):
    return _var(as_float(x), dim, correction, keepdim)


@handles("aten.logsumexp")
def logsumexp(x, dim, keepdim=False):
    return mx.logsumexp(as_float(x), axis=axes(dim, x.ndim), keepdims=keepdim)


@handles("aten.linalg_vector_norm")
def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        x = x.astype(mxd(dtype))
    ax = axes(dim, x.ndim)
    a = mx.abs(x)
    if ord == 2:
        return mx.sqrt(mx.sum(a * a, axis=ax, keepdims=keepdim))
    if ord == 1:
        return mx.sum(a, axis=ax, keepdims=keepdim)
    if ord == float("inf"):
        return mx.max(a, axis=ax, keepdims=keepdim)
    if ord == float("-inf"):
        return mx.min(a, axis=ax, keepdims=keepdim)
    if ord == 0:
        return mx.sum((a != 0).astype(x.dtype), axis=ax, keepdims=keepdim)
    return mx.power(mx.sum(mx.power(a, ord), axis=ax, keepdims=keepdim), 1.0 / ord)


@handles("aten.cumsum")
def cumsum(x, dim, dtype=None):
    return mx.cumsum(_sum_input(x, dtype), axis=dim % max(x.ndim, 1)) if x.ndim else _sum_input(x, dtype)


@handles("aten.cumprod")
def cumprod(x, dim, dtype=None):
    return mx.cumprod(_sum_input(x, dtype), axis=dim % max(x.ndim, 1)) if x.ndim else _sum_input(x, dtype)


def _cum_extreme(x, dim, scan):
    """(running max/min, the index where it was last reached), as torch's cummax/cummin."""
    if x.ndim == 0:
        return x, mx.zeros((), mx.int64)
    d = dim % x.ndim
    values = scan(x, axis=d)
    shape = [1] * x.ndim
    shape[d] = x.shape[d]
    positions = mx.broadcast_to(mx.reshape(mx.arange(x.shape[d]), shape), x.shape)
    # The running extreme only changes where x reaches it, so the latest such position is its index.
    return values, mx.cummax(mx.where(x == values, positions, 0), axis=d).astype(mx.int64)


@handles("aten.cummax", multi=True)
def cummax(x, dim):
    return _cum_extreme(x, dim, mx.cummax)


@handles("aten.cummin", multi=True)
def cummin(x, dim):
    return _cum_extreme(x, dim, mx.cummin)


@handles("aten.logcumsumexp")
def logcumsumexp(x, dim):
    return mx.logcumsumexp(x, axis=dim % max(x.ndim, 1)) if x.ndim else x
