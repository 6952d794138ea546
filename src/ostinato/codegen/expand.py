"""IR nodes as expressions of primitives (prims.py): one handler per ATen or fused op the scheduler
may put in a fusion group. A handler says what kind of node it is (``kind``: pointwise, or a
reduction over which dims) and emits the node's primitives into a Builder, rounding where eager torch
rounds: the fused kernel computes what the ATen ops computed, without the round trips to memory.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from ..ir import Node, Value
from ..ir.types import ScalarMeta, TensorMeta
from .prims import DTYPE_CODES, FLOATS, INT_OK_BINARY, INT_OK_UNARY, compute_code
from .spec import MAX_RANK, GroupSpec


@dataclass(frozen=True)
class Kind:
    """What a node is to the scheduler: ``red`` is empty for a pointwise node, else the dims it reduces
    (of ``reduced``, its input's shape); ``keepdim`` whether the reduced result keeps them as 1."""

    red: tuple[int, ...] = ()
    reduced: Value | None = None
    keepdim: bool = True
    split: tuple | None = None      # (dim, groups): see schedule.Space


@dataclass
class Handler:
    kind: Callable[[Node], Kind | None]
    emit: Callable[["Builder", Node], list]


HANDLERS: dict[str, Handler] = {}


def _pointwise(node: Node) -> Kind:
    return Kind()


def handles(*ops: str, kind: Callable[[Node], Kind | None] = _pointwise):
    def deco(fn):
        for op in ops:
            HANDLERS[op] = Handler(kind, fn)
        return fn
    return deco


def code_of(v) -> str | None:
    """The dtype code of a tensor Value (None when the codegen has no such dtype)."""
    return DTYPE_CODES.get(v.meta.dtype) if isinstance(v, Value) and isinstance(v.meta, TensorMeta) else None


class Builder:
    """Collects one group's spec: inputs loaded on first use, ops appended in order."""

    def __init__(self, rank: int, red: list[int], shape: tuple, split: tuple | None = None):
        if rank > MAX_RANK:
            raise NotFusible(f"a space of rank {rank} (the kernels take {MAX_RANK})")
        self.rank, self.red, self.shape, self.split = rank, red, shape, split
        self.inputs: list[list] = []
        self.input_values: list[Value] = []
        self.scalars: list[str] = []
        self.scalar_values: list[Value] = []
        self.ops: list[list] = []
        self.refs: dict[int, int] = {}          # Value id -> op index (values the group computes)
        self._loads: dict[tuple, int] = {}
        self._consts: dict[tuple, int] = {}
        self.biased: set[int] = set()           # values whose loads add a convolution's bias (conv.py)

    # -- leaves ---------------------------------------------------------------------------------
    def level_of(self, v: Value, unsq: int = 0) -> str:
        """"r" when ``v`` (right-aligned to the iteration space, ``unsq`` 1-dims appended) has size 1 in
        every reduced dim, else "x"."""
        if not self.red:
            return "x"
        shape = tuple(v.meta.shape) + (1,) * unsq
        if self.split:
            d, groups = self.split
            pad = len(self.shape) - len(shape)
            if d >= pad:   # the split dim: [groups, size / groups], or [1, 1] where it broadcasts
                size = shape[d - pad]
                shape = shape[:d - pad] + ((1, 1) if size == 1 else (groups, 0)) + shape[d - pad + 1:]
        pad = self.rank - len(shape)
        return "r" if all(d < pad or shape[d - pad] == 1 for d in self.red) else "x"

    def value(self, v, unsq: int = 0) -> int:
        if not isinstance(v, Value):
            return self.const(v)
        if v.id in self.refs and not unsq:
            return self.refs[v.id]
        if v.id in self.biased:
            raise NotFusible(f"{v.name} read unsqueezed after its bias was added")
        key = (v.id, unsq)
        if key in self._loads:
            return self._loads[key]
        if isinstance(v.meta, ScalarMeta):
            if v.meta.kind not in (int, float):
                raise NotFusible(f"scalar {v.name} of type {v.meta.kind.__name__}")
            self.scalars.append("i" if v.meta.kind is int else "f")
            self.scalar_values.append(v)
            idx = self._push(["scalar", "i64" if v.meta.kind is int else "f32", "r", len(self.scalars) - 1])
        else:
            code = code_of(v)
            if code is None:
                raise NotFusible(f"input {v.name} of dtype {v.meta.dtype}")
            level = self.level_of(v, unsq)
            self.inputs.append([code, level, unsq])
            self.input_values.append(v)
            idx = self._push(["in", code, level, len(self.inputs) - 1])
        self._loads[key] = idx
        return idx

    def gathered(self, v: Value, dim: int) -> int:
        """The input index of ``v`` read by gather ops along its dim ``dim`` (level "g": never loaded
        where the space's coordinates are). It must come from memory: a value the group computes is not
        there yet. Not in a split group (group norm's space); a matmul group refuses one in its prologue
        or epilogue (spec.LinearSpec.check)."""
        if self.split:
            raise NotFusible("gather in a split group")
        if not isinstance(v, Value) or not isinstance(v.meta, TensorMeta) or v.id in self.refs:
            raise NotFusible("gather from a value the group computes")
        code = code_of(v)
        if code is None or code == "bool":
            raise NotFusible(f"gather from {v.meta.dtype}")
        space_dim = self.rank - v.meta.rank + dim % v.meta.rank
        if space_dim < 0:
            raise NotFusible("gather input of a higher rank than the group's space")
        key = ("g", v.id, space_dim)
        if key not in self._loads:
            self.inputs.append([code, "g", 0, space_dim])
            self.input_values.append(v)
            self._loads[key] = len(self.inputs) - 1
        return self._loads[key]

    def const(self, x, code: str | None = None) -> int:
        if isinstance(x, bool):
            code = code or "bool"
        elif isinstance(x, int):
            code = code or "i64"
        elif isinstance(x, float):
            code = code or "f32"
        else:
            raise NotFusible(f"constant argument {x!r}")
        from .prims import encode_const
        key = (code, repr(x))
        if key not in self._consts:
            self._consts[key] = self._push(["const", code, "r", encode_const(x)])
        return self._consts[key]

    def _push(self, op: list) -> int:
        self.ops.append(op)
        return len(self.ops) - 1

    # -- ops ------------------------------------------------------------------------------------
    def level(self, i: int) -> str:
        return self.ops[i][2]

    def code(self, i: int) -> str:
        return self.ops[i][1]

    def emit(self, name: str, code: str, *args: int) -> int:
        from .prims import REDUCTIONS
        level = "r" if name in REDUCTIONS or name == "rnumel" or all(self.level(a) == "r" for a in args) else "x"
        return self._push([name, code, level, *args])

    def cast(self, i: int, code: str) -> int:
        return i if self.code(i) == code else self.emit("cast", code, i)

    def rnumel(self) -> int:
        return self.emit("rnumel", "f32")

    def rindex(self) -> int:
        """The coordinate along the group's one reduced dim (its last), per element."""
        if self.red != [self.rank - 1] or self.split:
            raise NotFusible("a row index outside a reduction over the last dim")
        return self._push(["rindex", "i64", "x"])

    def spec(self, outputs: list[list]) -> GroupSpec:
        return GroupSpec(self.rank, list(self.red), self.inputs, self.scalars, self.ops, outputs,
                         list(self.split) if self.split else [])


class NotFusible(Exception):
    """A node (or an argument of it) the code generator does not take; the scheduler leaves it out."""


def _out(node: Node, i: int = 0) -> str:
    code = code_of(node.outputs[i])
    if code is None:
        raise NotFusible(f"{node.op} result dtype")
    return code


def _arith(b: Builder, name: str, code: str, *args: int) -> int:
    """An arithmetic primitive whose result has dtype ``code``: integer arithmetic only where it is exact."""
    if code not in FLOATS and name not in INT_OK_BINARY and name not in INT_OK_UNARY:
        raise NotFusible(f"{name} on {code}")
    return b.emit(name, code, *args)


def _f(b: Builder, i: int, code: str) -> int:
    """``i`` as a value of the float compute type of ``code`` (no rounding)."""
    return b.cast(i, compute_code(code) if code in FLOATS else "f32")


# -- pointwise ATen ops -----------------------------------------------------------------------------
_UNARY_ATEN = {"aten.neg": "neg", "aten.abs": "abs", "aten.exp": "exp", "aten.exp2": "exp2", "aten.expm1": "expm1",
               "aten.log": "log", "aten.log2": "log2", "aten.log1p": "log1p", "aten.sqrt": "sqrt",
               "aten.rsqrt": "rsqrt", "aten.reciprocal": "recip", "aten.sin": "sin", "aten.cos": "cos",
               "aten.tan": "tan", "aten.tanh": "tanh", "aten.sigmoid": "sigmoid", "aten.erf": "erf",
               "aten.floor": "floor", "aten.ceil": "ceil", "aten.trunc": "trunc", "aten.round": "round",
               "aten.sign": "sign", "aten.sgn": "sign", "aten.logical_not": "not", "aten.isnan": "isnan"}


@handles(*_UNARY_ATEN)
def _unary(b: Builder, node: Node):
    name = _UNARY_ATEN[node.op]
    code = _out(node)
    x = b.value(node.args[0])
    if name in ("not", "isnan"):
        return [b.emit(name, "bool", x)]
    if code not in FLOATS:
        if name not in INT_OK_UNARY:
            raise NotFusible(f"{node.op} on {code}")
        return [b.emit(name, code, x)]
    return [b.emit(name, code, _f(b, x, code))]


_BINARY_ATEN = {"aten.add": "add", "aten.sub": "sub", "aten.mul": "mul", "aten.div": "div",
                "aten.maximum": "max", "aten.minimum": "min", "aten.pow": "pow", "aten.atan2": "atan2",
                "aten.eq": "eq", "aten.ne": "ne", "aten.lt": "lt", "aten.le": "le", "aten.gt": "gt", "aten.ge": "ge",
                "aten.logical_and": "and", "aten.logical_or": "or", "aten.logical_xor": "xor",
                "aten.bitwise_and": "and", "aten.bitwise_or": "or", "aten.bitwise_xor": "xor"}


def _binary_name(op: str) -> str:
    base = ".".join(op.split(".")[:2])
    return _BINARY_ATEN[base]


@handles("aten.add.Tensor", "aten.add.Scalar", "aten.sub.Tensor", "aten.sub.Scalar", "aten.mul.Tensor",
         "aten.mul.Scalar", "aten.div.Tensor", "aten.div.Scalar", "aten.maximum", "aten.minimum",
         "aten.eq.Tensor", "aten.eq.Scalar", "aten.ne.Tensor", "aten.ne.Scalar", "aten.lt.Tensor", "aten.lt.Scalar",
         "aten.le.Tensor", "aten.le.Scalar", "aten.gt.Tensor", "aten.gt.Scalar", "aten.ge.Tensor", "aten.ge.Scalar",
         "aten.logical_and", "aten.logical_or", "aten.logical_xor", "aten.atan2",
         "aten.bitwise_and.Tensor", "aten.bitwise_or.Tensor", "aten.bitwise_xor.Tensor")
def _binary(b: Builder, node: Node):
    name = _binary_name(node.op)
    code = _out(node)
    if node.op.startswith("aten.bitwise_") and code != "bool":
        raise NotFusible(f"{node.op} on {code} (only boolean masks: the logical form)")
    x, y = b.value(node.args[0]), b.value(node.args[1])
    alpha = node.kwargs.get("alpha", node.args[2] if len(node.args) > 2 else 1)
    if alpha != 1:
        y = _arith(b, "mul", b.code(y) if b.code(y) not in FLOATS else compute_code(code), y, b.const(alpha))
    if name in ("and", "or", "xor"):
        return [b.emit(name, "bool", b.cast(x, "bool"), b.cast(y, "bool"))]
    if name in ("eq", "ne", "lt", "le", "gt", "ge"):
        common = _compare_dtype(node.args[0], node.args[1])
        if common is None:
            raise NotFusible(f"{node.op} operand dtypes")
        if common in FLOATS:      # torch compares in the common dtype: the operands round to it first
            x, y = b.cast(x, common), b.cast(y, common)
        return [b.emit(name, "bool", x, y)]
    if code in FLOATS:
        x, y = _f(b, x, code), _f(b, y, code)
    return [_arith(b, name, code, x, y)]


def _compare_dtype(a, c) -> str | None:
    """The dtype torch compares ``a`` and ``c`` in (a Python number or a 0-dim tensor takes the other's
    dtype within its category, as in torch.result_type)."""
    def proxy(v):
        if isinstance(v, Value):
            return torch.empty((0,) * v.meta.rank if v.meta.rank else (), dtype=v.meta.dtype)
        return v
    try:
        return DTYPE_CODES.get(torch.result_type(proxy(a), proxy(c)))
    except (TypeError, RuntimeError):
        return None


@handles("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div_mode(b: Builder, node: Node):
    code = _out(node)
    mode = node.kwargs.get("rounding_mode", node.args[2] if len(node.args) > 2 else None)
    if code not in FLOATS:
        raise NotFusible("integer division")
    x, y = _f(b, b.value(node.args[0]), code), _f(b, b.value(node.args[1]), code)
    if mode is not None:     # torch's floor/trunc division corrects floor(a / b) near integers
        raise NotFusible(f"rounding_mode {mode!r}")
    name = "div"
    return [b.emit(name, code, x, y)]


@handles("aten.rsub.Scalar")
def _rsub(b: Builder, node: Node):
    code = _out(node)
    x, other = b.value(node.args[0]), b.value(node.args[1])
    alpha = node.kwargs.get("alpha", 1)
    if alpha != 1:
        x = _arith(b, "mul", compute_code(code), _f(b, x, code) if code in FLOATS else x, b.const(alpha))
    if code in FLOATS:
        x, other = _f(b, x, code), _f(b, other, code)
    return [_arith(b, "sub", code, other, x)]


@handles("aten.pow.Tensor_Scalar")
def _pow_scalar(b: Builder, node: Node):
    code = _out(node)
    if code not in FLOATS:
        raise NotFusible("integer pow")
    x, e = _f(b, b.value(node.args[0]), code), node.args[1]
    ct = compute_code(code)
    if e == 2:
        return [b.emit("mul", code, x, x)]
    if e == 1:
        return [b.cast(x, code)]
    if e == 0.5:
        return [b.emit("sqrt", code, x)]
    if e == -0.5:
        return [b.emit("rsqrt", code, x)]
    if e == -1:
        return [b.emit("recip", code, x)]
    if e == 3:
        return [b.emit("mul", code, b.emit("mul", ct, x, x), x)]
    return [b.emit("pow", code, x, b.const(float(e), ct))]


@handles("aten.pow.Tensor_Tensor")
def _pow_tensor(b: Builder, node: Node):
    code = _out(node)
    if code not in FLOATS:
        raise NotFusible("integer pow")
    return [b.emit("pow", code, _f(b, b.value(node.args[0]), code), _f(b, b.value(node.args[1]), code))]


def _where(b: Builder, code: str, c: int, x: int, y: int) -> int:
    if code in FLOATS:
        x, y = _f(b, x, code), _f(b, y, code)
    return b.emit("where", code, b.cast(c, "bool"), x, y)


@handles("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther")
def _where_op(b: Builder, node: Node):
    c, x, y = (b.value(a) for a in node.args[:3])
    return [_where(b, _out(node), c, x, y)]


@handles("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(b: Builder, node: Node):
    x, mask, v = (b.value(a) for a in node.args[:3])
    return [_where(b, _out(node), mask, v, x)]


def _clamp_value(b: Builder, code: str, x: int, lo, hi) -> int:
    ct = compute_code(code) if code in FLOATS else code
    if lo is not None:
        x = b.emit("max", ct, x, b.value(lo) if isinstance(lo, Value) else b.const(lo, ct))
    if hi is not None:
        x = b.emit("min", ct, x, b.value(hi) if isinstance(hi, Value) else b.const(hi, ct))
    return b.cast(x, code)


@handles("aten.clamp", "aten.clamp.Tensor")
def _clamp(b: Builder, node: Node):
    code = _out(node)
    lo = node.kwargs.get("min", node.args[1] if len(node.args) > 1 else None)
    hi = node.kwargs.get("max", node.args[2] if len(node.args) > 2 else None)
    x = b.value(node.args[0])
    return [_clamp_value(b, code, _f(b, x, code) if code in FLOATS else x, lo, hi)]


@handles("aten.hardtanh")
def _hardtanh(b: Builder, node: Node):
    code = _out(node)
    lo = node.args[1] if len(node.args) > 1 else node.kwargs.get("min_val", -1.0)
    hi = node.args[2] if len(node.args) > 2 else node.kwargs.get("max_val", 1.0)
    return [_clamp_value(b, code, _float_in(b, node), lo, hi)]


def _float_in(b: Builder, node: Node, i: int = 0) -> int:
    code = _out(node)
    if code not in FLOATS:
        raise NotFusible(f"{node.op} on {code}")
    return _f(b, b.value(node.args[i]), code)


def _c(b: Builder, x: float, code: str) -> int:
    return b.const(float(x), compute_code(code))


@handles("aten.relu")
def _relu(b: Builder, node: Node):
    code = _out(node)
    x = b.value(node.args[0])
    if code in FLOATS:
        x = _f(b, x, code)
        return [b.emit("max", code, x, _c(b, 0.0, code))]
    return [b.emit("max", code, x, b.const(0, code))]


def _silu(b: Builder, x: int, ct: str) -> int:
    return b.emit("mul", ct, x, b.emit("sigmoid", ct, x))


def _gelu(b: Builder, x: int, ct: str, approximate: str) -> int:
    half = b.emit("mul", ct, x, b.const(0.5, ct))
    if approximate == "tanh":
        cube = b.emit("mul", ct, b.emit("mul", ct, x, x), x)
        inner = b.emit("mul", ct, b.const(math.sqrt(2.0 / math.pi), ct),
                       b.emit("add", ct, x, b.emit("mul", ct, cube, b.const(0.044715, ct))))
        t = b.emit("tanh", ct, inner)
    elif approximate == "none":
        t = b.emit("erf", ct, b.emit("mul", ct, x, b.const(1.0 / math.sqrt(2.0), ct)))
    else:
        raise NotFusible(f"gelu approximate={approximate!r}")
    return b.emit("mul", ct, half, b.emit("add", ct, t, b.const(1.0, ct)))


@handles("aten.silu")
def _silu_op(b: Builder, node: Node):
    code = _out(node)
    return [b.cast(_silu(b, _float_in(b, node), compute_code(code)), code)]


@handles("aten.gelu")
def _gelu_op(b: Builder, node: Node):
    code = _out(node)
    approx = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
    return [b.cast(_gelu(b, _float_in(b, node), compute_code(code), approx), code)]


@handles("aten.leaky_relu")
def _leaky_relu(b: Builder, node: Node):
    code, ct = _out(node), compute_code(_out(node))
    x = _float_in(b, node)
    slope = node.args[1] if len(node.args) > 1 else node.kwargs.get("negative_slope", 0.01)
    pos = b.emit("gt", "bool", x, _c(b, 0.0, code))
    return [_where(b, code, pos, x, b.emit("mul", ct, x, _c(b, slope, code)))]


@handles("aten.hardsigmoid")
def _hardsigmoid(b: Builder, node: Node):
    code, ct = _out(node), compute_code(_out(node))
    x = _float_in(b, node)
    y = b.emit("div", ct, b.emit("add", ct, x, _c(b, 3.0, code)), _c(b, 6.0, code))
    return [_clamp_value(b, code, y, 0.0, 1.0)]


@handles("aten.hardswish")
def _hardswish(b: Builder, node: Node):
    code, ct = _out(node), compute_code(_out(node))
    x = _float_in(b, node)
    r6 = b.emit("min", ct, b.emit("max", ct, b.emit("add", ct, x, _c(b, 3.0, code)), _c(b, 0.0, code)),
                _c(b, 6.0, code))
    return [b.cast(b.emit("div", ct, b.emit("mul", ct, x, r6), _c(b, 6.0, code)), code)]


@handles("aten.softplus")
def _softplus(b: Builder, node: Node):
    code, ct = _out(node), compute_code(_out(node))
    x = _float_in(b, node)
    beta = node.args[1] if len(node.args) > 1 else node.kwargs.get("beta", 1)
    threshold = node.args[2] if len(node.args) > 2 else node.kwargs.get("threshold", 20)
    bx = b.emit("mul", ct, x, _c(b, beta, code))
    soft = b.emit("div", ct, b.emit("log1p", ct, b.emit("exp", ct, bx)), _c(b, beta, code))
    return [_where(b, code, b.emit("gt", "bool", bx, _c(b, threshold, code)), x, soft)]


@handles("aten.lerp.Scalar", "aten.lerp.Tensor")
def _lerp(b: Builder, node: Node):
    code, ct = _out(node), compute_code(_out(node))
    x, y, w = _float_in(b, node, 0), _float_in(b, node, 1), _f(b, b.value(node.args[2]), code)
    return [b.cast(b.emit("add", ct, x, b.emit("mul", ct, w, b.emit("sub", ct, y, x))), code)]


@handles("aten.addcmul")
def _addcmul(b: Builder, node: Node):
    code, ct = _out(node), compute_code(_out(node))
    x, t1, t2 = (_float_in(b, node, i) for i in range(3))
    value = node.kwargs.get("value", 1)
    prod = b.emit("mul", ct, b.emit("mul", ct, t1, t2), _c(b, value, code))
    return [b.cast(b.emit("add", ct, x, prod), code)]


def _plain_dtype_copy(node: Node) -> Kind | None:
    allowed = {"dtype", "memory_format", "layout", "device", "pin_memory", "non_blocking", "copy"}
    if set(node.kwargs) - allowed:
        return None
    mf = node.kwargs.get("memory_format")
    if mf is not None and mf not in (torch.contiguous_format, torch.preserve_format):
        return None
    return Kind()


@handles("prims.convert_element_type", "aten._to_copy", "aten.to.dtype", "aten.clone", "aten.alias",
         "aten.detach", "aten.lift_fresh_copy", kind=_plain_dtype_copy)
def _convert(b: Builder, node: Node):
    return [b.cast(b.value(node.args[0]), _out(node))]


def _copy_kind(node: Node) -> Kind | None:
    dst, src = node.args[0], node.args[1] if len(node.args) > 1 else None
    if not isinstance(dst, Value) or not isinstance(src, Value) or not isinstance(src.meta, TensorMeta) \
            or str(dst.meta.shape) != str(src.meta.shape) or node.kwargs.get("non_blocking"):
        return None      # a broadcasting copy has a larger space than its input's
    return Kind()


@handles("aten.copy", kind=_copy_kind)
def _copy(b: Builder, node: Node):
    """The functional copy: ``src`` in ``dst``'s dtype (``dst``'s values are not read)."""
    return [b.cast(b.value(node.args[1]), _out(node))]


def _gather_kind(node: Node) -> Kind | None:
    """torch.gather(x, dim, index) with a dense-enough index: pointwise in the index's (the result's) space."""
    x, dim, index = (list(node.args) + [None] * 3)[:3]
    if set(node.kwargs) - {"sparse_grad"} or node.kwargs.get("sparse_grad") or len(node.args) > 3:
        return None
    if not (isinstance(x, Value) and isinstance(index, Value) and isinstance(dim, int)
            and isinstance(x.meta, TensorMeta) and isinstance(index.meta, TensorMeta)):
        return None
    if x.meta.rank != index.meta.rank or x.meta.rank == 0 or index.meta.dtype not in (torch.int64, torch.int32):
        return None
    return Kind()


@handles("aten.gather", kind=_gather_kind)
def _gather(b: Builder, node: Node):
    """Each element reads ``x`` where the space's coordinates are, its dim ``dim`` replaced by the index
    (an index outside ``x`` reads 0 where eager raises)."""
    x, dim, index = node.args[:3]
    out = tuple(node.outputs[0].meta.shape)
    pad = len(b.shape) - len(out)
    gdim = dim % len(out)
    for d, (n, xn) in enumerate(zip(out, x.meta.shape)):
        # the kernel reads x along the space's dims: where the result broadcasts into a larger space,
        # eager reads x's first row there, which only a size-1 dim of x gives (stride 0)
        if d != gdim and not (n == b.shape[pad + d] or xn == 1):
            raise NotFusible("gather result broadcast over a dim its input is longer in")
    k = b.gathered(x, dim)
    idx = b.value(index)
    if b.red and b.level(idx) == "r":
        raise NotFusible("gather at a per-row index in a reduction's group")
    return [b._push(["gather", code_of(x), "x", k, idx])]


# -- fused ops with a pointwise meaning ---------------------------------------------------------------
@handles("ost.swiglu", "ost.geglu")
def _gated(b: Builder, node: Node):
    code = _out(node)
    ct = compute_code(code)
    gate = _float_in(b, node, 0)
    act = _silu(b, gate, ct) if node.op == "ost.swiglu" else \
        _gelu(b, gate, ct, node.args[2] if len(node.args) > 2 else node.kwargs.get("approximate", "none"))
    act = b.cast(act, code_of(node.args[0]))      # the activation's result is rounded before the product
    return [b.emit("mul", code, _f(b, act, code), _float_in(b, node, 1))]


@handles("aten._native_batch_norm_legit_no_training")
def _batch_norm(b: Builder, node: Node):
    x, w, bias, mean, var = node.args[:5]
    eps = node.args[6] if len(node.args) > 6 else node.kwargs.get("eps", 1e-5)
    code = _out(node)
    if code not in FLOATS or not isinstance(x, Value) or x.meta.rank < 2:
        raise NotFusible("batch norm input")
    unsq = x.meta.rank - 2        # per-channel vectors against [N, C, ...]
    ct = compute_code(code)

    def vec(v):
        return None if v is None else _f(b, b.value(v, unsq), code)

    h = _f(b, b.value(x), code)
    inv = b.emit("rsqrt", ct, b.emit("add", ct, vec(var), _c(b, eps, code)))
    h = b.emit("mul", ct, b.emit("sub", ct, h, vec(mean)), inv)
    if w is not None:
        h = b.emit("mul", ct, h, vec(w))
    if bias is not None:
        h = b.emit("add", ct, h, vec(bias))
    return [b.cast(h, code), None, None]


from . import expand_rows  # noqa: E402,F401  (registers the reduction and norm handlers)
