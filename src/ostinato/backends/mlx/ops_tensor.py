"""MLX handlers of views and copies and of indexing (creation and sizes: ops_create.py; reductions:
ops_reduce.py)."""
from __future__ import annotations

import mlx.core as mx

from .ops import handles, is_float, mxd


# -- views and copies ------------------------------------------------------------------------------
@handles("aten.view", "aten.reshape", "aten._unsafe_view")
def view(x, shape):
    return mx.reshape(x, tuple(shape))


@handles("aten.permute")
def permute(x, dims):
    return mx.transpose(x, [d % x.ndim for d in dims]) if x.ndim else x


@handles("aten.transpose.int")
def transpose(x, a, b):
    return mx.swapaxes(x, a, b) if x.ndim else x


@handles("aten.t")
def t(x):
    return mx.transpose(x) if x.ndim == 2 else x


@handles("aten.expand")
def expand(x, size, implicit=False):
    lead = len(size) - x.ndim
    shape = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(size))
    return mx.broadcast_to(x, shape)


@handles("aten.squeeze", "aten.squeeze.dim", "aten.squeeze.dims")
def squeeze(x, dim=None):
    if x.ndim == 0:
        return x
    dims = range(x.ndim) if dim is None else [dim] if isinstance(dim, int) else dim
    keep = [d % x.ndim for d in dims if x.shape[d % x.ndim] == 1]
    return mx.squeeze(x, keep) if keep else x


@handles("aten.unsqueeze")
def unsqueeze(x, dim):
    return mx.expand_dims(x, dim % (x.ndim + 1))


@handles("aten.flatten.using_ints")
def flatten(x, start_dim=0, end_dim=-1):
    return mx.flatten(x, start_dim, end_dim) if x.ndim else mx.reshape(x, (1,))


@handles("aten.unflatten.int")
def unflatten(x, dim, sizes):
    return mx.unflatten(x, dim, tuple(sizes))


@handles("aten.clone", "aten.contiguous", "aten.alias", "aten.lift_fresh_copy", "aten.detach")
def identity(x, memory_format=None):
    return x


def _index(ndim: int, dim: int, item) -> tuple:
    return (slice(None),) * (dim % ndim) + (item,)


def _bounds(start, end, n):
    start = 0 if start is None else start
    end = n if end is None else end
    start = max(start + n, 0) if start < 0 else min(start, n)
    end = max(end + n, 0) if end < 0 else min(end, n)
    return start, max(end, start)


@handles("aten.slice.Tensor")
def slice_(x, dim=0, start=None, end=None, step=1):
    d = dim % x.ndim
    s, e = _bounds(start, end, x.shape[d])
    return x[_index(x.ndim, d, slice(s, e, step))]


@handles("aten.slice_scatter")
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    d = dim % x.ndim
    s, e = _bounds(start, end, x.shape[d])
    out = mx.array(x)
    out[_index(x.ndim, d, slice(s, e, step))] = src.astype(x.dtype)
    return out


@handles("aten.select.int")
def select(x, dim, index):
    return x[_index(x.ndim, dim, index)]


@handles("aten.select_scatter")
def select_scatter(x, src, dim, index):
    out = mx.array(x)
    out[_index(x.ndim, dim, index)] = src.astype(x.dtype)
    return out


@handles("aten.narrow")
def narrow(x, dim, start, length):
    d = dim % x.ndim
    start = start % x.shape[d] if start < 0 else start
    return x[_index(x.ndim, d, slice(start, start + length))]


@handles("aten.cat")
def cat(tensors, dim=0):
    ts = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or list(tensors[:1])
    return mx.concatenate(ts, axis=dim % ts[0].ndim) if len(ts) > 1 else ts[0]


@handles("aten.stack")
def stack(tensors, dim=0):
    return mx.stack(tensors, axis=dim % (tensors[0].ndim + 1))


def _split_points(sizes):
    points, acc = [], 0
    for s in sizes[:-1]:
        acc += s
        points.append(acc)
    return points


@handles("aten.split.Tensor", multi=True)
def split(x, split_size, dim=0):
    n = x.shape[dim % x.ndim]
    sizes = [min(split_size, n - i) for i in range(0, n, split_size)] if n else [0]
    return tuple(mx.split(x, _split_points(sizes), axis=dim % x.ndim))


@handles("aten.split_with_sizes", multi=True)
def split_with_sizes(x, split_sizes, dim=0):
    return tuple(mx.split(x, _split_points(list(split_sizes)), axis=dim % x.ndim))


@handles("aten.unbind.int", multi=True)
def unbind(x, dim=0):
    d = dim % x.ndim
    return tuple(x[_index(x.ndim, d, i)] for i in range(x.shape[d]))


@handles("aten.chunk", multi=True)
def chunk(x, chunks, dim=0):
    n = x.shape[dim % x.ndim]
    size = -(-n // chunks)
    return split(x, size, dim)


@handles("aten.repeat")
def repeat(x, repeats):
    lead = len(repeats) - x.ndim
    x = mx.reshape(x, (1,) * lead + tuple(x.shape))
    return mx.tile(x, tuple(repeats))


@handles("aten.repeat_interleave.self_int")
def repeat_interleave(x, repeats, dim=None, output_size=None):
    if dim is None:
        return mx.repeat(mx.reshape(x, (-1,)), repeats, axis=0)
    return mx.repeat(x, repeats, axis=dim % x.ndim)


@handles("aten.flip")
def flip(x, dims):
    idx = [slice(None)] * x.ndim
    for d in dims:
        idx[d % x.ndim] = slice(None, None, -1)
    return x[tuple(idx)]


@handles("aten.roll")
def roll(x, shifts, dims=()):
    if not dims:
        return mx.reshape(mx.roll(mx.reshape(x, (-1,)), shifts[0]), x.shape)
    return mx.roll(x, tuple(shifts), axis=tuple(dims))


@handles("aten.diagonal")
def diagonal(x, offset=0, dim1=0, dim2=1):
    return mx.diagonal(x, offset, dim1 % x.ndim, dim2 % x.ndim)


@handles("aten.constant_pad_nd")
def constant_pad_nd(x, pad, value=0):
    widths = [(0, 0)] * x.ndim
    crop = [slice(None)] * x.ndim
    for i in range(len(pad) // 2):
        d = x.ndim - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        widths[d] = (max(lo, 0), max(hi, 0))
        crop[d] = slice(-lo if lo < 0 else None, hi if hi < 0 else None)
    x = x[tuple(crop)]
    return mx.pad(x, widths, constant_values=value) if any(w != (0, 0) for w in widths) else x


def _edge_pad(x, pad):
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return mx.pad(x, widths, mode="edge")


handles("aten.replication_pad1d", "aten.replication_pad2d")(_edge_pad)


@handles("aten.reflection_pad1d", "aten.reflection_pad2d")
def reflection_pad(x, pad):
    for i in range(len(pad) // 2):
        d = x.ndim - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        n = x.shape[d]
        parts = []
        if lo:
            parts.append(x[_index(x.ndim, d, slice(lo, 0, -1))])
        parts.append(x)
        if hi:
            parts.append(x[_index(x.ndim, d, slice(n - 2, n - 2 - hi, -1))])
        x = mx.concatenate(parts, axis=d) if len(parts) > 1 else x
    return x


@handles("aten.as_strided")
def as_strided(x, size, stride, storage_offset=0):
    return mx.as_strided(x, tuple(size), tuple(stride), storage_offset or 0)


@handles("aten.unfold")
def unfold(x, dim, size, step):
    if x.ndim == 0:
        return mx.reshape(x, (1,))
    d = dim % x.ndim
    strides = [1] * x.ndim
    for i in range(x.ndim - 2, -1, -1):
        strides[i] = strides[i + 1] * x.shape[i + 1]
    n = (x.shape[d] - size) // step + 1
    shape = list(x.shape)
    shape[d] = n
    st = list(strides)
    st[d] = strides[d] * step
    return mx.as_strided(x, tuple(shape) + (size,), tuple(st) + (strides[d],))


@handles("aten.tril")
def tril(x, diagonal=0):
    return mx.tril(x, diagonal)


@handles("aten.triu")
def triu(x, diagonal=0):
    return mx.triu(x, diagonal)


@handles("aten.pixel_shuffle")
def pixel_shuffle(x, r):
    *lead, c, h, w = x.shape
    oc = c // (r * r)
    y = mx.reshape(x, (*lead, oc, r, r, h, w))
    n = len(lead)
    y = mx.transpose(y, (*range(n), n, n + 3, n + 1, n + 4, n + 2))
    return mx.reshape(y, (*lead, oc, h * r, w * r))


@handles("aten.pixel_unshuffle")
def pixel_unshuffle(x, r):
    *lead, c, h, w = x.shape
    n = len(lead)
    y = mx.reshape(x, (*lead, c, h // r, r, w // r, r))
    y = mx.transpose(y, (*range(n), n, n + 2, n + 4, n + 1, n + 3))
    return mx.reshape(y, (*lead, c * r * r, h // r, w // r))


@handles("aten.movedim.int")
def movedim(x, src, dst):
    return mx.moveaxis(x, src, dst)


@handles("aten.empty_like", "aten.zeros_like")
def zeros_like(x, **_):
    return mx.zeros(x.shape, x.dtype)


@handles("aten.copy")
def copy(x, src, non_blocking=False):
    return mx.broadcast_to(src.astype(x.dtype), x.shape)


@handles("aten.copy_", multi=False)
def copy_(x, src, non_blocking=False):
    return copy(x, src)


# -- indexing ----------------------------------------------------------------------------------------
def _index_tuple(indices):
    return tuple(slice(None) if i is None else i for i in indices)


@handles("aten.index.Tensor")
def index(x, indices):
    return x[_index_tuple(indices)]


@handles("aten.index_put", "aten.index_put_")
def index_put(x, indices, values, accumulate=False):
    idx = _index_tuple(indices)
    values = values.astype(x.dtype)
    if accumulate:
        return x.at[idx].add(values)
    out = mx.array(x)
    out[idx] = values
    return out


@handles("aten.index_select")
def index_select(x, dim, index):
    if x.ndim == 0:
        return x
    return mx.take(x, mx.reshape(index, (-1,)), axis=dim % x.ndim)


@handles("aten.index_copy", "aten.index_copy_")
def index_copy(x, dim, index, src):
    out = mx.array(x)
    out[_index(x.ndim, dim, index)] = src.astype(x.dtype)
    return out


@handles("aten.index_add")
def index_add(x, dim, index, src, alpha=1):
    return x.at[_index(x.ndim, dim, index)].add((src if alpha == 1 else src * alpha).astype(x.dtype))


@handles("aten.index_fill.int_Scalar")
def index_fill(x, dim, index, value):
    out = mx.array(x)
    out[_index(x.ndim, dim, index)] = value
    return out


@handles("aten.gather")
def gather(x, dim, index, sparse_grad=False):
    if x.ndim == 0:
        return x
    return mx.take_along_axis(x, index, axis=dim % x.ndim)


@handles("aten.take_along_dim")
def take_along_dim(x, index, dim=None):
    if dim is None:
        return mx.take(mx.reshape(x, (-1,)), mx.reshape(index, (-1,)))
    return mx.take_along_axis(x, mx.broadcast_to(index, index.shape), axis=dim % x.ndim)


def _along(index, dim):
    """The full index tuple addressing ``x[i0, .., index[i], ..]`` along ``dim`` (scatter's addressing)."""
    grids = []
    for d in range(index.ndim):
        if d == dim:
            grids.append(index)
        else:
            shape = [1] * index.ndim
            shape[d] = index.shape[d]
            grids.append(mx.reshape(mx.arange(index.shape[d]), shape))
    return tuple(grids)


def _src_cut(src, index):
    return src[tuple(slice(0, n) for n in index.shape)]


@handles("aten.scatter.src", "aten.scatter.value")
def scatter(x, dim, index, src):
    out = mx.array(x)
    value = _src_cut(src, index).astype(x.dtype) if type(src) is mx.array else src
    out[_along(index, dim % x.ndim)] = value
    return out


@handles("aten.scatter_add")
def scatter_add(x, dim, index, src):
    return x.at[_along(index, dim % x.ndim)].add(_src_cut(src, index).astype(x.dtype))


_SCATTER_AT = {"sum": "add", "prod": "multiply", "amax": "maximum", "amin": "minimum", "mean": "add"}


@handles("aten.scatter_reduce.two")
def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    where = _along(index, dim % x.ndim)
    src = _src_cut(src, index).astype(x.dtype)
    base = x
    if not include_self:    # the positions written start from the reduction's identity
        identity = {"sum": 0, "mean": 0, "prod": 1,
                    "amax": -mx.inf if is_float(x) else int(mx.iinfo(x.dtype).min),
                    "amin": mx.inf if is_float(x) else int(mx.iinfo(x.dtype).max)}[reduce]
        base = mx.array(x)
        base[where] = identity
    out = getattr(base.at[where], _SCATTER_AT[reduce])(src)
    if reduce == "mean":
        count = mx.zeros(x.shape, mx.float32).at[where].add(mx.ones(src.shape, mx.float32))
        if include_self:
            count = count + 1
        out = mx.where(count > 0, out / mx.maximum(count, 1), x)
        if not is_float(x):
            out = mx.floor_divide(out, 1)
    return out


@handles("aten.searchsorted.Tensor")
def searchsorted(sorted_seq, values, *, out_int32=False, right=False, side=None, sorter=None):
    right = right or side == "right"
    seq = sorted_seq if sorter is None else mx.take_along_axis(sorted_seq, sorter, axis=-1)
    if seq.ndim == 1:
        hits = (seq <= values[..., None]) if right else (seq < values[..., None])
    else:
        hits = (seq[..., None, :] <= values[..., None]) if right else (seq[..., None, :] < values[..., None])
    return mx.sum(hits, axis=-1)


@handles("aten.bucketize.Tensor")
def bucketize(x, boundaries, *, out_int32=False, right=False):
    hits = (boundaries <= x[..., None]) if right else (boundaries < x[..., None])
    return mx.sum(hits, axis=-1)


def _triangle_indices(row, col, offset, lower):
    import numpy as np
    r, c = (np.tril_indices if lower else np.triu_indices)(row, offset, col)
    return mx.array(np.stack([r, c]).astype(np.int64))


@handles("aten.tril_indices")
def tril_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _triangle_indices(row, col, offset, True)


@handles("aten.triu_indices")
def triu_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _triangle_indices(row, col, offset, False)


@handles("aten.embedding")
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return mx.take(weight, indices, axis=0)


def _sort(x, dim, descending):
    d = dim % max(x.ndim, 1)
    if x.ndim == 0:
        return x, mx.zeros((), mx.int64)
    key = x
    if descending:
        key = -x.astype(mx.float32) if x.dtype == mx.bool_ else -x
    idx = mx.argsort(key, axis=d)
    return mx.take_along_axis(x, idx, axis=d), idx.astype(mx.int64)


@handles("aten.sort", multi=True)
def sort(x, dim=-1, descending=False):
    return _sort(x, dim, descending)


@handles("aten.sort.stable", multi=True)
def sort_stable(x, *, stable=None, dim=-1, descending=False):
    return _sort(x, dim, descending)


@handles("aten.argsort")
def argsort(x, dim=-1, descending=False):
    return _sort(x, dim, descending)[1]


@handles("aten.argsort.stable")
def argsort_stable(x, *, stable=False, dim=-1, descending=False):
    return _sort(x, dim, descending)[1]


@handles("aten.topk", multi=True)
def topk(x, k, dim=-1, largest=True, sorted=True):
    v, i = _sort(x, dim, largest)
    d = dim % max(x.ndim, 1)
    cut = _index(max(x.ndim, 1), d, slice(0, k))
    return v[cut], i[cut]


@handles("aten.kthvalue", multi=True)
def kthvalue(x, k, dim=-1, keepdim=False):
    v, i = _sort(x, dim, False)
    d = dim % max(x.ndim, 1)
    cut = _index(max(x.ndim, 1), d, slice(k - 1, k))
    v, i = v[cut], i[cut]
    return (v, i) if keepdim else (mx.squeeze(v, d), mx.squeeze(i, d))
