"""The op registry: every op a Node may name, with what passes and backends need to know of it.

ATen ops are named by their overload, ``aten.<op>`` for the default overload and ``aten.<op>.<overload>``
otherwise; their implementation is torch's. Host scalar arithmetic on sizes is ``sym.<op>``. Fused ops
(``ost.*``) carry a reference implementation in plain torch, the oracle for every backend. Ops ostinato
lacks run through eager torch as ``fallback.*`` ops (``fallback.py``), registered on first use.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class OpDef:
    name: str
    target: Callable
    pure: bool = True          # no side effects: may be merged (CSE) or removed when unused (DCE)
    random: bool = False       # draws random numbers: never merged, cannot be replayed bit-exactly
    host_sync: bool = False    # reads tensor data on the host (.item(), data-dependent output shapes)
    category: str = ""
    reason: str = ""           # why a "fallback" op runs through eager torch (shown by inspect)
    writes: tuple[int, ...] | None = None   # an impure op's positional arguments it writes; None: any it reads


_REGISTRY: dict[str, OpDef] = {}


def register_op(opdef: OpDef) -> OpDef:
    if opdef.name in _REGISTRY:
        raise ValueError(f"op {opdef.name} registered twice")
    _REGISTRY[opdef.name] = opdef
    return opdef


def get_op(name: str) -> OpDef | None:
    op = _REGISTRY.get(name)
    if op is None and name.startswith("fallback."):
        # Ops ostinato lacks are registered on first use, in the exporting and the loading process.
        from .fallback import resolve_fallback
        op = resolve_fallback(name)
    return op


# Ops of the view and creation categories that still write memory (copies, fills, scatters).
_WRITING = frozenset("""aten.clone aten.cat aten.copy aten.stack aten.constant_pad_nd aten.repeat aten.flip aten.roll
    aten.full aten.zeros aten.ones aten.arange aten.arange.start aten.arange.start_step aten._to_copy aten.full_like
    aten.zeros_like aten.ones_like aten.fill.Scalar aten.slice_scatter aten.select_scatter""".split())


# Ops that may return their input itself besides the view category (``to`` without a change, ``contiguous``
# of a dense tensor): a write into their result may be a write into their input.
MAY_ALIAS = frozenset({"aten.to.dtype", "aten.to.dtype_layout", "aten.to.device", "aten.type_as", "aten.view_as",
                       "aten.reshape_as", "aten.expand_as", "aten.contiguous", "aten.reshape", "aten.alias"})


def may_alias(name: str) -> bool:
    """Whether the op's result may share its input's memory: a view, or one of MAY_ALIAS."""
    op = get_op(name)
    return name in MAY_ALIAS or (op is not None and op.category == "view")


def does_device_work(name: str) -> bool:
    """Whether an op, once lowered, launches device work: views and size arithmetic do not (a count of
    launches per step skips them)."""
    op = get_op(name)
    if op is None:
        return False
    return op.category not in ("view", "sym", "creation") or name in _WRITING


def registered_ops() -> dict[str, OpDef]:
    return dict(_REGISTRY)


def aten_name(overload: torch._ops.OpOverload) -> str:
    """``torch.ops.aten.mm.default`` → ``aten.mm``; ``torch.ops.aten.add.Tensor`` → ``aten.add.Tensor``."""
    ns = overload.namespace
    base = overload._schema.name.split("::", 1)[1]
    ov = overload._overloadname
    return f"{ns}.{base}" if ov == "default" else f"{ns}.{base}.{ov}"


def resolve_aten(name: str) -> torch._ops.OpOverload:
    parts = name.split(".")
    ns, base = parts[0], parts[1]
    ov = parts[2] if len(parts) > 2 else "default"
    return getattr(getattr(getattr(torch.ops, ns), base), ov)


def register_aten(names: str, category: str, **flags) -> None:
    for name in names.split():
        register_op(OpDef(name, resolve_aten(name), category=category, **flags))


# Host arithmetic on sizes (from dynamic shapes); FX names them by Python operator.
SYM_OPS: dict[Callable, str] = {
    operator.add: "sym.add", operator.sub: "sym.sub", operator.mul: "sym.mul",
    operator.floordiv: "sym.floordiv", operator.truediv: "sym.truediv", operator.mod: "sym.mod",
    operator.neg: "sym.neg", operator.pow: "sym.pow",
    operator.eq: "sym.eq", operator.ne: "sym.ne", operator.lt: "sym.lt", operator.le: "sym.le",
    operator.gt: "sym.gt", operator.ge: "sym.ge",
    operator.and_: "sym.and", operator.or_: "sym.or",
    math.ceil: "sym.ceil", math.floor: "sym.floor",
    torch.sym_max: "sym.max", torch.sym_min: "sym.min", torch.sym_float: "sym.float",
    torch.sym_int: "sym.int", torch.sym_not: "sym.not", torch.sym_sqrt: "sym.sqrt",
}
_SYM_IMPL = {
    "sym.max": max, "sym.min": min, "sym.float": float, "sym.int": int,
    "sym.not": operator.not_, "sym.sqrt": math.sqrt,
}
for _fn, _name in SYM_OPS.items():
    register_op(OpDef(_name, _SYM_IMPL.get(_name, _fn), category="sym"))

from . import aten_ops  # noqa: E402,F401  (registers the ATen op set)
from . import fused_ops  # noqa: E402,F401  (registers the ost.* ops, fold_ops.py's through it)
