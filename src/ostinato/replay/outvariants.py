"""What a captured tape needs to know of an op: does it write one of its arguments, and which callable
writes its result into a given buffer (``out=``) instead of allocating one.

For an ATen overload the out form is the overload of the same packet whose schema has the same
arguments plus keyword-only written ``out`` tensors. torch's public bindings (``torch.add(..., out=)``)
call it about a third faster than the overload object, so those are used when they exist and accept
the arguments (checked once, at capture, by calling them).
"""
from __future__ import annotations

import functools
import inspect
from typing import Callable

import torch

from ..ir import get_op
from ..ir.fallback import is_fallback


def _schema(op: str):
    target = get_op(op).target
    return getattr(target, "_schema", None)


@functools.lru_cache(maxsize=None)
def writes_argument(op: str) -> bool:
    """Whether the op mutates an argument (``index_put_``, ``ost.kv_update_``)."""
    opdef = get_op(op)
    if opdef.category == "inplace":
        return True
    schema = _schema(op)
    if schema is None:
        return not opdef.pure and not opdef.random
    return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


@functools.lru_cache(maxsize=None)
def out_overload(op: str) -> tuple[Callable, tuple[str, ...]] | None:
    """The out= form of an ATen op and the names of its out arguments, or None. None for ops run
    through eager torch (``fallback.*``): a user's ``.out`` overload of a custom op promises nothing
    about matching the op, so the tape runs them as they are and copies their results in."""
    if is_fallback(op):
        return None
    target = get_op(op).target
    schema = getattr(target, "_schema", None)
    if schema is None or not isinstance(target, torch._ops.OpOverload):
        # Fused ops' references take keyword-only ``out`` arguments, one per result in result order
        # (``out`` alone for one result; ``out_sum, out`` for add_rms_norm's two).
        try:
            params = inspect.signature(target).parameters
        except (TypeError, ValueError):
            return None
        names = tuple(n for n, p in params.items()
                      if p.kind is inspect.Parameter.KEYWORD_ONLY and (n == "out" or n.startswith("out_")))
        return (target, names) if "out" in names else None
    want = [(a.name, str(a.type)) for a in schema.arguments]
    packet = target.overloadpacket
    for name in packet.overloads():
        ov = getattr(packet, name)
        s = ov._schema
        outs = [a for a in s.arguments if a.alias_info is not None and a.alias_info.is_write and a.kwarg_only]
        if not outs or len(outs) != len(schema.returns):
            continue
        rest = [(a.name, str(a.type)) for a in s.arguments if a not in outs]
        if rest == want and all(str(a.type) == "Tensor(a!)" or str(a.type).startswith("Tensor") for a in outs):
            return getattr(ov, "_op", ov), tuple(a.name for a in outs)
    return None


def public_binding(op: str) -> Callable | None:
    """torch's Python binding of the op's name (``torch.add``, ``torch._C._nn.gelu``), or None."""
    target = get_op(op).target
    if not isinstance(target, torch._ops.OpOverload) or is_fallback(op):
        return None
    base = target._schema.name.split("::", 1)[1]
    for module in (torch._C._VariableFunctions, torch._C._nn, torch._C._special, torch._C._linalg):
        fn = getattr(module, base, None)
        if fn is not None:
            return fn
    return None


def special_forms(op: str, args: tuple, kwargs: dict, bufs: list) -> list[tuple[Callable, tuple, dict]]:
    """Faster or truer forms for this launch's concrete shapes, tried before the generic out= form: a
    linear of one row (a decode step) is a matrix-vector product, about 8% faster than linear's matmul
    path on the CPU when the weights stream from memory; a linear over rows in several dims is the
    folded matmul linear itself runs (its out= form rounds twice). Each is checked against the plan's
    result."""
    if op not in ("aten.linear", "ost.linear") or len(bufs) != 1:
        return []
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    if op == "ost.linear" and (len(args) > 3 or kwargs.get("activation") or kwargs.get("weight_t")):
        return []
    out = bufs[0]
    if not (isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor) and w.dim() == 2 and x.dim() >= 1
            and x.shape[-1] == w.shape[1] and x.is_contiguous() and out.is_contiguous()
            and out.numel() == x.numel() // max(1, w.shape[1]) * w.shape[0] and x.device.type == "cpu"):
        return []
    if x.numel() == w.shape[1]:     # one row: a matrix-vector product
        if bias is None:
            return [(torch.mv, (w, x.view(-1)), {"out": out.view(-1)})]
        return [(torch.addmv, (bias.view(-1), w, x.view(-1)), {"out": out.view(-1)})]
    if x.dim() <= 2 or (bias is not None and bias.dim() != 1):
        return []
    # Rows in more than one dim: linear folds them into one matmul with the bias in it (one rounding),
    # where linear.out multiplies, rounds, then adds the bias (bf16 on the CPU: 1 ulp apart on a quarter
    # of the elements, a difference replay would carry from layer to layer). The same folded matmul:
    rows = x.view(-1, w.shape[1])
    flat = out.view(-1, w.shape[0])
    if bias is None:
        return [(torch.mm, (rows, w.t()), {"out": flat})]
    return [(torch.addmm, (bias, rows, w.t()), {"out": flat})]
