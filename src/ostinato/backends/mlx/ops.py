"""The MLX op registry: one handler per IR op, written with ``@handles("aten.name", ...)``.

A handler takes the op's arguments as the IR records them (MLX arrays where the op takes tensors,
Python ints where sizes are symbolic, torch dtypes where the op names one) and returns MLX arrays.
Single-result handlers are wrapped to cast their result to the dtype the IR recorded for it
(``_dt``, bound at lowering): torch's promotion rules (int sums to int64, indices as int64, Python
scalars that do not promote) differ from MLX's in places, and the IR already knows the answer.

Ops with no handler here run through torch (``bridge``): their inputs are converted, the torch op
runs on the CPU, its results come back as MLX arrays. That costs two copies and a sync, is counted
(``exe.stats()["torch_bridged"]``) and listed by ``ostinato inspect --launches --device mlx``; a
program compiled with ``strict=True`` refuses such ops instead.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

import mlx.core as mx

from .convert import TORCH_TO_MX, host, to_mx

HANDLERS: dict[str, Callable] = {}
MULTI: set[str] = set()


def handles(*names: str, multi: bool = False):
    """Register the decorated function as the MLX handler of ``names``. ``multi``: it returns a tuple
    (no result cast)."""
    def wrap(fn: Callable) -> Callable:
        if multi:
            impl = fn
        else:
            @functools.wraps(fn)
            def impl(*args, _dt=None, **kwargs):
                r = fn(*args, **kwargs)
                if _dt is not None and type(r) is mx.array:
                    want = TORCH_TO_MX.get(_dt)
                    if want is not None and r.dtype != want:
                        r = r.astype(want)
                return r
        for name in names:
            if name in HANDLERS:
                raise ValueError(f"MLX handler for {name} registered twice")
            HANDLERS[name] = impl
            if multi:
                MULTI.add(name)
        return fn
    return wrap


def mxd(dtype: torch.dtype | None):
    return None if dtype is None else TORCH_TO_MX[dtype]


def is_float(x: mx.array) -> bool:
    return mx.issubdtype(x.dtype, mx.floating)


def as_float(x):
    """Float ops on integer or bool input compute in float32, as torch promotes them."""
    if type(x) is mx.array and not mx.issubdtype(x.dtype, mx.inexact):
        return x.astype(mx.float32)
    return x


def axes(dims, ndim: int) -> list[int] | None:
    """A torch dim argument (int, list, empty list or None = all) as MLX axes."""
    if dims is None:
        return None
    if isinstance(dims, int):
        dims = [dims]
    dims = list(dims)
    if not dims:
        return None
    return [d % ndim if ndim else 0 for d in dims]


def bridge(target: Callable, name: str) -> Callable:
    """Run a torch op on MLX values: inputs to CPU tensors, the op, results back to MLX arrays."""
    def to_torch_arg(a):
        if type(a) is mx.array:
            return host(a).clone()       # a tensor over MLX's memory would alias it if the op writes
        if isinstance(a, (list, tuple)):
            return type(a)(to_torch_arg(x) for x in a)
        return a

    def back(r):
        if isinstance(r, torch.Tensor):
            return to_mx(r)
        if isinstance(r, (list, tuple)):
            return type(r)(back(x) for x in r)
        return r

    def run(*args, **kwargs):
        kwargs.pop("_dt", None)
        args = [to_torch_arg(a) for a in args]
        kwargs = {k: to_torch_arg(v) for k, v in kwargs.items()}
        if "device" in kwargs:
            kwargs["device"] = torch.device("cpu")
        with torch.no_grad():
            return back(target(*args, **kwargs))
    run.bridged = True
    run.__name__ = "torch_" + name.replace(".", "_")
    return run


from . import ops_elementwise, ops_reduce, ops_tensor, ops_create, ops_nn, ops_fused  # noqa: E402,F401  (register the handlers)
