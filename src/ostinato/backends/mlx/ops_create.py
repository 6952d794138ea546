"""MLX handlers of tensor creation, dtype conversions and size arithmetic."""
from __future__ import annotations

import mlx.core as mx

from ...ir.ops import registered_ops
from .ops import handles, mxd


# -- creation -----------------------------------------------------------------------------------------
def _dtype_or(dtype, default):
    return mxd(dtype) if dtype is not None else default


@handles("aten.arange")
def arange(end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return mx.arange(0, end, 1, dtype=_dtype_or(dtype, mx.float32 if isinstance(end, float) else mx.int64))


@handles("aten.arange.start")
def arange_start(start, end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return arange_step(start, end, 1, dtype=dtype)


@handles("aten.arange.start_step")
def arange_step(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    floating = any(isinstance(v, float) for v in (start, end, step))
    return mx.arange(start, end, step, dtype=_dtype_or(dtype, mx.float32 if floating else mx.int64))


def _default_dtype(value):
    return mx.bool_ if isinstance(value, bool) else mx.int64 if isinstance(value, int) else mx.float32


@handles("aten.full")
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return mx.full(tuple(size), fill_value, dtype=_dtype_or(dtype, _default_dtype(fill_value)))


@handles("aten.full_like")
def full_like(x, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return mx.full(x.shape, fill_value, dtype=_dtype_or(dtype, x.dtype))


@handles("aten.zeros", "aten.empty.memory_format")
def zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return mx.zeros(tuple(size), dtype=_dtype_or(dtype, mx.float32))


@handles("aten.ones")
def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return mx.ones(tuple(size), dtype=_dtype_or(dtype, mx.float32))


@handles("aten.ones_like")
def ones_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return mx.ones(x.shape, dtype=_dtype_or(dtype, x.dtype))


@handles("aten.empty_strided")
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return zeros(size, dtype=dtype)


@handles("aten.empty_permuted")
def empty_permuted(size, physical_layout, *, dtype=None, layout=None, device=None, pin_memory=None):
    return zeros(size, dtype=dtype)


@handles("aten.new_zeros", "aten.new_empty")
def new_zeros(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return mx.zeros(tuple(size), dtype=_dtype_or(dtype, x.dtype))


@handles("aten.new_ones")
def new_ones(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return mx.ones(tuple(size), dtype=_dtype_or(dtype, x.dtype))


@handles("aten.new_full")
def new_full(x, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return mx.full(tuple(size), fill_value, dtype=_dtype_or(dtype, x.dtype))


@handles("aten.scalar_tensor")
def scalar_tensor(value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return mx.array(value, dtype=_dtype_or(dtype, mx.float32))


@handles("aten.linspace")
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    return mx.linspace(start, end, steps, dtype=_dtype_or(dtype, mx.float32))


@handles("aten.eye")
def eye(n, m=None, *, dtype=None, layout=None, device=None, pin_memory=None):
    return mx.eye(n, m, dtype=_dtype_or(dtype, mx.float32))


@handles("aten._to_copy")
def to_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    return x if dtype is None else x.astype(mxd(dtype))


@handles("aten.to.dtype")
def to_dtype(x, dtype, non_blocking=False, copy=False, memory_format=None):
    return x.astype(mxd(dtype))


@handles("prims.convert_element_type")
def convert_element_type(x, dtype):
    return x.astype(mxd(dtype))


@handles("aten.fill.Scalar", "aten.fill.Tensor")
def fill(x, value):
    return mx.full(x.shape, value.astype(x.dtype) if type(value) is mx.array else value, dtype=x.dtype)


# -- sizes ----------------------------------------------------------------------------------------------
@handles("aten.sym_size.int")
def sym_size(x, dim):
    return x.shape[dim]


@handles("aten.sym_numel")
def sym_numel(x):
    return x.size


@handles("aten.sym_stride.int")
def sym_stride(x, dim):
    s = 1
    for n in x.shape[dim % x.ndim + 1:]:
        s *= n
    return s


@handles("aten.sym_storage_offset")
def sym_storage_offset(x):
    return 0


for _name, _op in registered_ops().items():
    if _op.category == "sym":
        handles(_name)(_op.target)
