"""The op table for tests/ops/test_op_table.py: one row per (op, dtype, shape, static/dynamic) case.

Each row names the core ATen op it tests (as ostinato names it in ``Program.op_counts()``), a function
calling one torch function or method with its constant arguments baked in, and specs of its tensor
inputs. Input shapes may use the size symbols ``"N"`` and ``"M"``: static rows export at the first
sizes in ``SIZES``; dynamic rows (``dyn=True``) mark those dims with ``torch.export.Dim`` ("d0" for N,
"d1" for M) and run again at the second sizes.

Where a torch function decomposes (``torch.index_copy`` → ``aten.index_put``), the row's ``name`` is the
torch function and ``op`` the core ATen op it lowers to, and the id reads ``index_copy>index_put``.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
I32, I64, BOOL = torch.int32, torch.int64, torch.bool

DTYPE_TAG = {F32: "f32", F16: "f16", BF16: "bf16", I32: "i32", I64: "i64", BOOL: "bool",
             torch.float64: "f64"}

# Example sizes of the symbols: static rows use SIZES[0]; dynamic rows export at SIZES[0] and also run
# at SIZES[1]. Distinct, and never 0 or 1 (torch.export specializes those).
SIZES = ({"N": 6, "M": 5}, {"N": 9, "M": 7})
DIM_NAMES = {"N": "d0", "M": "d1"}


@dataclass(frozen=True)
class In:
    """How to make one tensor input.

    kind: randn (ints: -20..20, bool: coin flips) | pos (0.1..2.1) | unit (-0.9..0.9) | gt1 (1.1..3.1)
    | near1 (0.5..1.5, for products) | special (randn with nan/inf/-inf sprinkled in) | perm (distinct
    values, for sort/topk/argmax so indices compare exactly) | idx (ints in [0, hi)) | uidx (distinct
    ints in [0, hi)) | rowperm (each row of the last dim distinct ints in [0, hi)) | nz (ints ±1..9, no
    zeros) | small (ints 0..3) | tiny (ints 0..2, so equality happens) | mask (bools, first column True)
    | sorted (ascending along the last dim) | var (0.5..1.5, variances).
    nc: a non-contiguous tensor that is not a view (column-major strides; stride 2 at rank 1).
    view: a view into a larger tensor (a slice of the last dim).
    """

    shape: tuple
    dtype: torch.dtype = F32
    kind: str = "randn"
    hi: int | str | None = None
    nc: bool = False
    view: bool = False

    def concrete(self, sizes: dict) -> tuple:
        return tuple(sizes[d] if isinstance(d, str) else d for d in self.shape)

    def make(self, sizes: dict, g: torch.Generator) -> torch.Tensor:
        shape = self.concrete(sizes)
        if self.view:
            base = _values(self, shape[:-1] + (shape[-1] + 2,), sizes, g)
            return base[..., 1:-1]
        t = _values(self, shape, sizes, g)
        if self.nc:
            if len(shape) >= 2:
                strides, acc = [], 1
                for s in shape:
                    strides.append(acc)
                    acc *= s
            else:
                strides = [2]
            out = torch.empty_strided(shape, tuple(strides), dtype=t.dtype)
            out.copy_(t)
            assert not out.is_contiguous() and out._base is None
            return out
        assert t._base is None
        return t


def _values(spec: In, shape: tuple, sizes: dict, g: torch.Generator) -> torch.Tensor:
    dt, k = spec.dtype, spec.kind
    hi = sizes[spec.hi] if isinstance(spec.hi, str) else spec.hi
    n = 1
    for s in shape:
        n *= s

    def rand():
        return torch.rand(shape, generator=g)

    if k == "randn":
        if dt.is_floating_point:
            t = torch.randn(shape, generator=g)
        elif dt == BOOL:
            t = rand() > 0.5
        else:
            t = torch.randint(-20, 21, shape, generator=g)
    elif k == "pos":
        t = rand() * 2 + 0.1 if dt.is_floating_point else torch.randint(1, 20, shape, generator=g)
    elif k == "unit":
        t = rand() * 1.8 - 0.9
    elif k == "gt1":
        t = rand() * 2 + 1.1
    elif k == "near1":
        t = rand() + 0.5
    elif k == "var":
        t = rand() + 0.5
    elif k == "special":
        t = torch.randn(shape, generator=g).flatten()
        t[::4] = float("nan")
        t[1::5] = float("inf")
        t[2::7] = float("-inf")
        t = t.view(shape)
    elif k == "perm":
        t = (torch.randperm(n, generator=g) - n // 2).view(shape)
        if dt.is_floating_point:
            t = t.float() * 0.25  # exact in f16/bf16 for these small counts
    elif k == "idx":
        t = torch.randint(0, hi, shape, generator=g)
    elif k == "uidx":
        assert n <= hi, (shape, hi)
        t = torch.randperm(hi, generator=g)[:n].view(shape)
    elif k == "rowperm":
        lead = shape[:-1]
        t = torch.rand(lead + (hi,), generator=g).argsort(-1)[..., :shape[-1]]
    elif k == "nz":
        mag = torch.randint(1, 10, shape, generator=g)
        t = torch.where(rand() > 0.5, mag, -mag)
    elif k == "small":
        t = torch.randint(0, 4, shape, generator=g)
    elif k == "tiny":
        t = torch.randint(0, 3, shape, generator=g)
    elif k == "mask":
        t = rand() > 0.4
        t[..., 0] = True
    elif k == "sorted":
        t = torch.randn(shape, generator=g).sort(-1).values
    else:
        raise ValueError(f"unknown input kind {k!r}")
    t = t.to(dt)
    # A fresh tensor, never a view of a temporary (the ``view`` flag asks for views explicitly).
    return t.clone() if t._base is not None else t


@dataclass
class Case:
    op: str                     # core ATen op that must appear in the exported program
    fn: Callable                # the one-op forward
    ins: tuple                  # In specs
    name: str = ""              # torch function when it lowers to another op (for the id)
    tag: str = ""               # what distinguishes this row (shape, options)
    dyn: bool = False
    tol: float | None = None    # override of helpers.TOL (justified where used)
    dmin: int = 2               # lower bound of the Dims (ops whose output would reach size 1 need more)
    dtag: str = ""              # dtype shown in the id (default: first input's)
    dyn_torch: tuple = (2, 0)   # dynamic export needs this torch; older ones export the row statically
    id: str = field(default="", init=False)

    def args(self, run: int, seed: int) -> tuple:
        g = torch.Generator().manual_seed(seed * 7919 + run)
        return tuple(s.make(SIZES[run], g) for s in self.ins)

    def dynamic_shapes(self):
        if not self.dyn:
            return None
        dims = {s: torch.export.Dim(DIM_NAMES[s], min=self.dmin, max=64) for s in DIM_NAMES}
        specs = []
        for s in self.ins:
            spec = {i: dims[d] for i, d in enumerate(s.shape) if isinstance(d, str)}
            specs.append(spec or None)
        return tuple(specs)

    @property
    def seed(self) -> int:
        return zlib.crc32(self.id.encode())


CASES: list[Case] = []


def add(op: str, fn: Callable, *ins: In, **kw) -> None:
    CASES.append(Case("aten." + op, fn, tuple(ins), **kw))


def T(*shape, dt=None, k="randn", hi=None, nc=False, view=False) -> In:
    """An input spec; index kinds default to int64, everything else to float32."""
    if dt is None:
        dt = I64 if k in ("idx", "uidx", "rowperm") else F32
    return In(tuple(shape), dt, k, hi, nc, view)


NM = ("N", "M")
# torch 2.11's export adds guards on a pooled dim's parity (and on repeat_interleave's min(n, 3n)) that
# violate a plain Dim range ("Constraints violated"); 2.13 proves them. Those rows export with dynamic
# dims from 2.13 on and statically before.
PARITY_GUARDS_FIXED = (2, 13)

# ------------------------------------------------------------------------------------------------
# Elementwise unary
# ------------------------------------------------------------------------------------------------
UNARY = [
    ("abs", torch.abs, "randn"), ("neg", torch.neg, "randn"), ("exp", torch.exp, "randn"),
    ("exp2", torch.exp2, "randn"), ("expm1", torch.expm1, "randn"), ("log", torch.log, "pos"),
    ("log2", torch.log2, "pos"), ("log10", torch.log10, "pos"), ("log1p", torch.log1p, "pos"),
    ("sqrt", torch.sqrt, "pos"), ("rsqrt", torch.rsqrt, "pos"), ("reciprocal", torch.reciprocal, "pos"),
    ("sin", torch.sin, "randn"), ("cos", torch.cos, "randn"), ("tan", torch.tan, "unit"),
    ("asin", torch.asin, "unit"), ("acos", torch.acos, "unit"), ("atan", torch.atan, "randn"),
    ("sinh", torch.sinh, "randn"), ("cosh", torch.cosh, "randn"), ("tanh", torch.tanh, "randn"),
    ("asinh", torch.asinh, "randn"), ("acosh", torch.acosh, "gt1"), ("atanh", torch.atanh, "unit"),
    ("sigmoid", torch.sigmoid, "randn"), ("erf", torch.erf, "randn"), ("erfc", torch.erfc, "randn"),
    ("erfinv", torch.erfinv, "unit"), ("sign", torch.sign, "randn"), ("floor", torch.floor, "randn"),
    ("ceil", torch.ceil, "randn"), ("round", torch.round, "randn"), ("trunc", torch.trunc, "randn"),
    ("relu", torch.relu, "randn"), ("gelu", F.gelu, "randn"), ("silu", F.silu, "randn"),
    ("hardswish", F.hardswish, "randn"), ("isnan", torch.isnan, "special"),
    ("isinf", torch.isinf, "special"),
]
for i, (op, fn, k) in enumerate(UNARY):
    add(op, fn, T(*NM, k=k))                                          # every op: f32, static
    if i % 3 == 0:
        add(op, fn, T(*NM, dt=F16, k=k), dyn=True)                    # a third: f16, both dims dynamic
    elif i % 3 == 1:
        add(op, fn, T("N", 3, 4, dt=BF16, k=k, nc=(i % 2 == 1)),      # a third: bf16 rank 3 (some
            tag="r3" + ("-nc" if i % 2 == 1 else ""))                 # non-contiguous)
    if i % 8 == 0:
        add(op, fn, T(k=k), tag="r0")                                 # rank 0
    if i % 8 == 3:
        add(op, fn, T("N", k=k), tag="r1", dyn=True)                  # rank 1, dynamic

# Unary ops with parameters, and on integer / bool inputs.
add("round.decimals", lambda x: torch.round(x, decimals=2), T(*NM))
add("round.decimals", lambda x: torch.round(x, decimals=1), T(*NM, dt=F16), dyn=True)
add("hardtanh", lambda x: F.hardtanh(x, -0.5, 0.5), T(*NM))
add("hardtanh", lambda x: F.hardtanh(x, -0.5, 0.5), T(*NM, dt=BF16), dyn=True)
add("leaky_relu", lambda x: F.leaky_relu(x, 0.2), T(*NM))
add("leaky_relu", lambda x: F.leaky_relu(x, 0.01), T(*NM, dt=F16), dyn=True)
add("elu", F.elu, T(*NM))
add("elu", lambda x: F.elu(x, alpha=0.5), T(*NM, dt=BF16), dyn=True)
add("gelu", lambda x: F.gelu(x, approximate="tanh"), T(*NM), tag="tanh")
add("abs", torch.abs, T(*NM, dt=I32), tag="int")
add("relu", F.relu, T(*NM, nc=True), tag="nc")
# Inputs that are views into a larger tensor (a slice, as users pass them), not just strided copies.
add("sin", torch.sin, T(*NM, view=True), tag="view")
add("add.Tensor", torch.add, T("N", 5, view=True), T("N", 5), tag="view", dyn=True)
add("sigmoid", torch.sigmoid, T(*NM, nc=True), tag="nc", dyn=True)
add("logical_not", torch.logical_not, T(*NM, dt=BOOL))
add("logical_and", torch.logical_and, T(*NM, dt=F32), T(*NM, dt=I32, k="tiny"), tag="mixed")
add("logical_not", torch.logical_not, T(*NM, dt=I32, k="tiny"), tag="int", dyn=True)
add("bitwise_not", torch.bitwise_not, T(*NM, dt=I32))
add("bitwise_not", torch.bitwise_not, T(*NM, dt=I64), dyn=True)
add("isinf", torch.isinf, T(*NM, dt=F32, k="special", nc=True), tag="nc")
add("isnan", torch.isnan, T(dt=F16, k="special"), tag="r0")
add("clamp", lambda x: torch.clamp(x, -0.5, 0.5), T(*NM))
add("clamp", lambda x: torch.clamp(x, min=0.1), T(*NM, dt=F16), tag="min", dyn=True)
add("clamp", lambda x: torch.clamp(x, -5, 7), T(*NM, dt=I32), tag="int")
add("clamp", lambda x: x.clamp(min=-3), T(*NM, dt=I64), tag="int-min", dyn=True)
add("pow.Tensor_Scalar", lambda x: x ** 2, T(*NM), tag="sq")
add("pow.Tensor_Scalar", lambda x: x ** 0.5, T(*NM, dt=F16, k="pos"), tag="sqrt", dyn=True)
add("pow.Tensor_Scalar", lambda x: x ** 3, T(*NM, dt=I64, k="tiny"), tag="int")
add("pow.Tensor_Scalar", torch.square, T("N", 3, nc=True), name="square", tag="nc", dyn=True)
add("pow.Scalar", lambda x: 2.0 ** x, T(*NM))

# ------------------------------------------------------------------------------------------------
# Elementwise binary
# ------------------------------------------------------------------------------------------------
# Shape patterns: same shape, trailing broadcast, outer broadcast, 0-d tensor operand.
SAME = (NM, NM)
BCAST = (NM, ("M",))
OUTER = (("N", 1), (1, "M"))
R0 = (NM, ())


def binary(op, fn, variants, k1="randn", k2="randn", name=""):
    """variants: (dtype, shapes, dyn[, tag]) tuples."""
    for v in variants:
        dt, (s1, s2), dyn = v[:3]
        tag = v[3] if len(v) > 3 else {SAME: "", BCAST: "bcast", OUTER: "outer", R0: "r0"}[(s1, s2)]
        add(op, fn, T(*s1, dt=dt, k=k1), T(*s2, dt=dt, k=k2), tag=tag, dyn=dyn, name=name)


binary("add.Tensor", torch.add, [(F32, SAME, False), (F16, BCAST, True), (BF16, OUTER, False),
                                 (I64, BCAST, True), (F32, R0, False)])
add("add.Tensor", lambda a, b: torch.add(a, b, alpha=2.5), T(*NM), T(*NM), tag="alpha")
add("add.Tensor", lambda a: a + 3, T(*NM, dt=I32), tag="scalar", dyn=True)
add("add.Tensor", lambda a, b: a + b, T(*NM, dt=I32), T(*NM), tag="promote")
add("add.Tensor", lambda a, b: a + b, T(*NM, nc=True), T(*NM), tag="nc", dyn=True)
binary("sub.Tensor", torch.sub, [(F32, SAME, False), (F16, SAME, True), (BF16, BCAST, False),
                                 (I32, OUTER, True)])
add("sub.Tensor", lambda a: 2.0 - a, T(*NM), name="rsub", tag="scalar")
binary("mul.Tensor", torch.mul, [(F32, SAME, False), (BF16, SAME, True),
                                 (I32, BCAST, False), (BOOL, SAME, False)])
binary("div.Tensor", torch.div, [(F32, SAME, False), (F16, BCAST, True), (BF16, OUTER, False)], k2="pos")
add("div.Tensor", torch.div, T(*NM, dt=I32), T(*NM, dt=I32, k="nz"), tag="int-true")
add("div.Tensor_mode", lambda a, b: torch.div(a, b, rounding_mode="floor"), T(*NM), T(*NM, k="pos"), tag="floor")
add("div.Tensor_mode", lambda a, b: torch.div(a, b, rounding_mode="trunc"), T(*NM, dt=F16), T(*NM, dt=F16, k="pos"),
    tag="trunc", dyn=True)
add("div.Tensor_mode", lambda a, b: torch.div(a, b, rounding_mode="trunc"), T(*NM, dt=I32), T("M", dt=I32, k="nz"),
    tag="trunc-bcast", dyn=True)
add("div.Tensor_mode", torch.floor_divide, T(*NM, dt=I32), T(*NM, dt=I32, k="nz"), name="floor_divide")
binary("pow.Tensor_Tensor", torch.pow, [(F32, SAME, False), (F16, BCAST, True)],
       k1="pos", k2="randn")
add("pow.Tensor_Tensor", torch.pow, T(*NM, dt=I64, k="tiny"), T(*NM, dt=I64, k="small"), tag="int", dyn=True)
binary("remainder.Tensor", torch.remainder, [(F16, SAME, True)], k2="pos")
add("remainder.Tensor", torch.remainder, T(*NM, dt=I32), T(*NM, dt=I32, k="nz"), tag="int")
add("remainder.Scalar", lambda a: a % 3, T(*NM, dt=I64))
add("remainder.Scalar", lambda a: torch.remainder(a, 0.75), T(*NM), dyn=True)
binary("fmod.Tensor", torch.fmod, [(F32, SAME, False), (BF16, BCAST, True)], k2="pos")
add("fmod.Scalar", lambda a: torch.fmod(a, 0.7), T(*NM))
for op, fn in (("maximum", torch.maximum), ("minimum", torch.minimum)):
    binary(op, fn, [(F32, SAME, False), (F16, BCAST, True), (I64, SAME, True)])
    add(op, fn, T(*NM, k="special"), T(*NM), tag="nan")
for op, fn in (("fmax", torch.fmax), ("fmin", torch.fmin)):
    binary(op, fn, [(F16, SAME, True)], k1="special")
binary("atan2", torch.atan2, [(F32, SAME, False), (F16, BCAST, True)])
binary("hypot", torch.hypot, [(BF16, SAME, True)])
binary("copysign.Tensor", torch.copysign, [(F32, SAME, False), (F16, OUTER, True)])

# Comparisons: ints drawn from 0..2 so that equality occurs.
for j, (cmp, fn) in enumerate((("eq", torch.eq), ("ne", torch.ne), ("lt", torch.lt), ("le", torch.le),
                               ("gt", torch.gt), ("ge", torch.ge))):
    add(f"{cmp}.Tensor", fn, T(*NM), T(*NM))
    if j % 2 == 0:
        add(f"{cmp}.Tensor", fn, T(*NM, dt=I32, k="tiny"), T(*NM, dt=I32, k="tiny"), dyn=True)
        add(f"{cmp}.Tensor", fn, T(*NM, dt=F16, k="tiny"), T("M", dt=F16, k="tiny"), tag="bcast")
    else:
        add(f"{cmp}.Tensor", fn, T(*NM, dt=BF16, k="tiny", nc=True), T(*NM, dt=BF16, k="tiny"), tag="nc")
    add(f"{cmp}.Scalar", lambda a, fn=fn: fn(a, 1), T(*NM, dt=I64, k="tiny"), dyn=True)
add("eq.Tensor", torch.eq, T(*NM, dt=BOOL), T(*NM, dt=BOOL), tag="bool")

for op, fn in (("logical_and", torch.logical_and), ("logical_or", torch.logical_or),
               ("logical_xor", torch.logical_xor)):
    add(op, fn, T(*NM, dt=BOOL), T(*NM, dt=BOOL))
    add(op, fn, T(*NM, dt=BOOL), T("M", dt=BOOL), tag="bcast", dyn=True)
for op, fn in (("bitwise_and", torch.bitwise_and), ("bitwise_or", torch.bitwise_or),
               ("bitwise_xor", torch.bitwise_xor)):
    add(f"{op}.Tensor", fn, T(*NM, dt=I32), T(*NM, dt=I32))
    add(f"{op}.Tensor", fn, T(*NM, dt=I64), T("M", dt=I64), tag="bcast", dyn=True)
    if op == "bitwise_and":
        add(f"{op}.Tensor", fn, T(*NM, dt=BOOL), T(*NM, dt=BOOL))
    add(f"{op}.Scalar", lambda a, fn=fn: fn(a, 3), T(*NM, dt=I64), dyn=True)
for op, fn in (("bitwise_left_shift", torch.bitwise_left_shift), ("bitwise_right_shift", torch.bitwise_right_shift)):
    add(f"{op}.Tensor", fn, T(*NM, dt=I32), T(*NM, dt=I32, k="small"))
    add(f"{op}.Tensor", fn, T(*NM, dt=I64), T(*NM, dt=I64, k="small"), dyn=True)

# ------------------------------------------------------------------------------------------------
# Ternary: where / masked_fill / clamp with tensor bounds
# ------------------------------------------------------------------------------------------------
add("where.self", torch.where, T(*NM, dt=BOOL), T(*NM), T(*NM))
add("where.self", torch.where, T(*NM, dt=BOOL), T(*NM, dt=F16), T("M", dt=F16), tag="bcast", dyn=True)
add("where.self", lambda c, a: torch.where(c, a, 0.0), T(*NM, dt=BOOL), T(*NM), tag="scalar-other")
add("where.self", lambda c, b: torch.where(c, -1.0, b), T(*NM, dt=BOOL), T(*NM, dt=F16), tag="scalar-self",
    dyn=True)
add("where.self", torch.where, T(*NM, dt=BOOL, nc=True), T(*NM, nc=True), T(*NM), tag="nc", dyn=True)
add("where.self", lambda m, a: a.masked_fill(m, 1.5), T(*NM, dt=BOOL), T(*NM), name="masked_fill")
add("where.self", lambda m, a: a.masked_fill(m, -1.0), T("M", dt=BOOL), T(*NM, dt=F16), name="masked_fill",
    tag="bcast", dyn=True)
add("where.self", lambda m, a, v: a.masked_fill(m, v), T(*NM, dt=BOOL), T(*NM, dt=BF16), T(dt=BF16),
    name="masked_fill", tag="tensor-value", dtag="bf16")
add("where.self", lambda m, a: a.masked_fill(m, float("-inf")), T(*NM, dt=BOOL), T(*NM), name="masked_fill",
    tag="neginf", dyn=True)
add("clamp.Tensor", lambda a, lo, hi: torch.clamp(a, lo, hi), T(*NM), T(*NM, k="unit"), T(*NM, k="gt1"))
add("clamp.Tensor", lambda a, lo, hi: torch.clamp(a, lo, hi), T(*NM, dt=F16), T("M", dt=F16, k="unit"),
    T("M", dt=F16, k="gt1"), tag="bcast", dyn=True)
add("clamp.Tensor", lambda a, lo: torch.clamp(a, min=lo), T(*NM, dt=I32), T(*NM, dt=I32), tag="min")
add("clamp.Tensor", lambda a, hi: torch.clamp(a, max=hi), T(*NM, dt=BF16), T(*NM, dt=BF16), tag="max", dyn=True)

# ------------------------------------------------------------------------------------------------
# Reductions
# ------------------------------------------------------------------------------------------------
NMK = ("N", "M", 4)
add("sum.dim_IntList", torch.sum, T(*NM), tag="all")
add("sum.dim_IntList", lambda x: x.sum(1), T(*NM), tag="d1", dyn=True)
add("sum.dim_IntList", lambda x: x.sum(-1, keepdim=True), T(*NM, dt=F16), tag="keepdim")
add("sum.dim_IntList", lambda x: x.sum((0, 2)), T(*NMK, dt=BF16), tag="d02", dyn=True)
add("sum.dim_IntList", lambda x: x.sum(0), T(*NM, dt=I32), tag="d0")
add("sum.dim_IntList", lambda x: x.sum(), T(*NM, dt=BOOL), tag="all")
add("sum.dim_IntList", lambda x: x.sum(1), T(*NMK, nc=True), tag="nc")
add("sum.dim_IntList", lambda x: x.sum(), T("N"), tag="r1", dyn=True)
add("mean", torch.mean, T(*NM))
add("mean", torch.mean, T(*NMK, dt=F16), dyn=True)
add("mean.dim", lambda x: x.mean(-1), T(*NM), dyn=True)
add("mean.dim", lambda x: x.mean((1, 2)), T(*NMK, nc=True), tag="d12-nc")
for op in ("amax", "amin"):
    fn = getattr(torch, op)
    add(op, lambda x, fn=fn: fn(x, 1), T(*NM))
    if op == "amax":
        add(op, lambda x, fn=fn: fn(x, (0, 2)), T(*NMK, dt=BF16), tag="d02")
    else:
        add(op, lambda x, fn=fn: fn(x, 0), T(*NM, dt=I32), dyn=True)
    add(op, lambda x, fn=fn: fn(x, -1, keepdim=True), T(*NM, dt=F16), tag="keepdim", dyn=True)
add("max", torch.max, T(*NM), tag="all")
add("min", torch.min, T(*NM), tag="all")
add("min", torch.min, T(*NM, dt=BF16), tag="all", dyn=True)
for op in ("max.dim", "min.dim"):
    fn = getattr(torch, op.split(".")[0])
    add(op, lambda x, fn=fn: fn(x, 1), T(*NM, k="perm"))
    add(op, lambda x, fn=fn: fn(x, 0), T(*NM, k="perm"), dyn=True)
    if op == "max.dim":
        add(op, lambda x, fn=fn: fn(x, -1, keepdim=True), T(*NMK, dt=F16, k="perm"), tag="keepdim")
    add(op, lambda x, fn=fn: fn(x, 1), T(*NM, dt=I64, k="perm"), dyn=True)
for op in ("argmax", "argmin"):
    fn = getattr(torch, op)
    add(op, lambda x, fn=fn: fn(x, 1), T(*NM, k="perm"))
    add(op, lambda x, fn=fn: fn(x, 0), T(*NM, k="perm"), dyn=True)
    if op == "argmax":
        add(op, lambda x, fn=fn: fn(x), T(*NMK, dt=BF16, k="perm"), tag="flat")
    add(op, lambda x, fn=fn: fn(x, -1, keepdim=True), T(*NM, dt=I32, k="perm"), tag="keepdim", dyn=True)
add("prod", torch.prod, T(*NM, k="near1"))
add("prod", torch.prod, T(*NM, dt=I64, k="tiny"), dyn=True)
add("prod.dim_int", lambda x: x.prod(1), T(*NM, k="near1"))
add("prod.dim_int", lambda x: x.prod(0, keepdim=True), T(*NM, dt=F16, k="near1"), tag="keepdim", dyn=True)
add("var.correction", lambda x: x.var(1), T(*NM))
add("var.correction", lambda x: torch.var(x, (0, 2), correction=2, keepdim=True), T(*NMK), tag="corr2",
    dyn=True)
add("var.correction", lambda x: x.var(-1), T(*NM, dt=BF16), dyn=True)
add("var.correction", lambda x: torch.std(x, 1), T(*NM), name="std")
add("var.correction", lambda x: torch.std(x, 0, correction=0), T(*NM), name="std", tag="corr0", dyn=True)
add("var_mean.correction", lambda x: torch.var_mean(x, 1), T(*NM))
add("var_mean.correction", lambda x: torch.var_mean(x, -1, correction=0), T(*NMK), dyn=True)
add("var_mean.correction", lambda x: torch.std_mean(x, 0), T(*NM), name="std_mean")
# torch.logsumexp lowers to amax/sub/exp/sum/log/add; the row claims its max-subtraction.
add("amax", lambda x: torch.logsumexp(x, 1), T(*NM), name="logsumexp")
add("amax", lambda x: torch.logsumexp(x, -1, keepdim=True), T(*NM, dt=F16), name="logsumexp", dyn=True)
add("any", torch.any, T(*NM, dt=BOOL))
add("any", torch.any, T(*NM, dt=F32), tag="float", dyn=True)
add("any.dim", lambda x: x.any(1), T(*NM, dt=BOOL))
add("any.dim", lambda x: x.any(0), T(*NM, dt=I32, k="tiny"), dyn=True)
add("any.dims", lambda x: x.any((0, 2)), T(*NMK, dt=BOOL))
add("any.dims", lambda x: torch.all(x), T(*NM, dt=BOOL), name="all")
add("any.dim", lambda x: torch.all(x, 1), T(*NM, dt=BOOL), name="all", dyn=True)
add("linalg_vector_norm", lambda x: x.norm(dim=1), T(*NM), name="norm")
add("linalg_vector_norm", lambda x: torch.linalg.vector_norm(x, ord=1, dim=0), T(*NM), tag="l1", dyn=True)
add("linalg_vector_norm", lambda x: torch.linalg.vector_norm(x, ord=float("inf"), dim=-1), T(*NM), tag="inf")
add("linalg_vector_norm", lambda x: x.norm(dim=-1, keepdim=True), T(*NM, dt=F16), name="norm", dyn=True)
add("cumsum", lambda x: x.cumsum(1), T(*NM))
add("cumsum", lambda x: x.cumsum(-1), T(*NM, dt=I32))
add("cumsum", lambda x: x.cumsum(1), T(*NM, dt=F16), dyn=True)
add("cumsum", lambda x: x.cumsum(1, dtype=torch.float32), T(*NM, dt=BF16), tag="dtype")
add("cumprod", lambda x: x.cumprod(1), T(*NM, k="near1"))
add("cumprod", lambda x: x.cumprod(0), T(*NM, k="near1"), dyn=True)
add("cummax", lambda x: x.cummax(1), T(*NM, k="perm"))
add("cummax", lambda x: x.cummax(0), T(*NM, dt=I32, k="perm"), dyn=True)
add("cummin", lambda x: x.cummin(1), T(*NM, k="perm"))
add("cummin", lambda x: x.cummin(0), T(*NM, dt=F16, k="perm"), dyn=True)
add("logcumsumexp", lambda x: x.logcumsumexp(1), T(*NM))

# ------------------------------------------------------------------------------------------------
# Views and layout
# ------------------------------------------------------------------------------------------------
add("view", lambda x: x.view(-1), T(*NM), dyn=True)
add("view", lambda x: x.view(x.shape[0], 2, 2), T("N", 4, dt=I64), dyn=True)
add("view", lambda x: x.view(1), T(dt=BOOL), tag="r0-r1")
add("view", lambda x: x.reshape(-1, 4), T("N", 2, 2, dt=F16), name="reshape", dyn=True)
add("view", lambda x: x.reshape(x.shape[0], -1), T("N", 3, 4, nc=True), name="reshape", tag="nc", dyn=True)
add("view", lambda x: x.flatten(), T(*NMK), name="flatten")
add("view", lambda x: x.flatten(1), T(*NMK, dt=I32), name="flatten", tag="start1", dyn=True)
add("view", lambda x: x.unflatten(1, (2, 2)), T("N", 4), name="unflatten")
add("permute", lambda x: x.permute(2, 0, 1), T(*NMK))
add("permute", lambda x: x.permute(1, 0), T(*NM, dt=I64), dyn=True)
add("permute", lambda x: x.permute(0, 2, 1), T(*NMK, dt=BF16, nc=True), tag="nc")
add("permute", lambda x: x.transpose(0, 1), T(*NM, dt=F16), name="transpose", dyn=True)
add("permute", lambda x: x.t(), T(*NM, dt=BOOL), name="t")
add("expand", lambda x: x.expand(-1, 4), T("N", 1))
add("expand", lambda x: x.expand(3, -1, -1), T(1, *NM, dt=BOOL), tag="lead", dyn=True)
add("expand", lambda x: x.expand(2, 3), T(dt=I64), tag="r0")
add("expand", lambda x, y: x.expand_as(y), T(1, "M"), T(*NM), name="expand_as", dyn=True)
add("squeeze.dims", lambda x: x.squeeze(1), T("N", 1))
add("squeeze.dims", lambda x: x.squeeze(1), T("N", 1, "M", dt=F16), dyn=True)
add("squeeze.dims", lambda x: x.squeeze(), T(1, "N", 1, dt=I32), tag="all")
add("unsqueeze", lambda x: x.unsqueeze(0), T(*NM))
add("unsqueeze", lambda x: x.unsqueeze(-1), T(*NM, dt=BF16), dyn=True)
add("unsqueeze", lambda x: x.unsqueeze(0), T(), tag="r0")
add("clone", torch.clone, T(*NM))
add("clone", lambda x: x.contiguous(), T(*NM, nc=True), name="contiguous", tag="nc")
add("clone", lambda x: x.contiguous(), T("N", 3, 4, dt=F16, nc=True), name="contiguous", tag="nc", dyn=True)
add("slice.Tensor", lambda x: x[:, 1:4], T(*NM))
add("slice.Tensor", lambda x: x[:, 1:4], T("N", 5, dt=F16), dyn=True)
add("slice.Tensor", lambda x: x[::2], T(*NM), tag="step2")
add("slice.Tensor", lambda x: x[1:-1], T(*NM, dt=I64), tag="neg", dyn=True, dmin=4)
add("slice.Tensor", lambda x: x[..., 1::2], T(*NMK, nc=True), tag="nc")
add("slice.Tensor", lambda x: x.narrow(1, 1, 3), T(*NM), name="narrow")
add("select.int", lambda x: x[:, 2], T(*NM))
add("select.int", lambda x: x[-1], T(*NM, dt=F16), tag="neg", dyn=True)
add("select.int", lambda x: x.select(2, 3), T(*NMK, nc=True), tag="nc", dyn=True)
add("cat", lambda a, b: torch.cat([a, b]), T(*NM), T(3, "M"))
add("cat", lambda a, b: torch.cat([a, b], 0), T(*NM), T(3, "M"), dyn=True)
add("cat", lambda a, b, c: torch.cat([a, b, c], 1), T(*NM, dt=F16), T("N", 2, dt=F16), T("N", 1, dt=F16),
    tag="3in-d1", dyn=True)
add("cat", lambda a, b: torch.cat([a, b], 1), T(*NM, dt=BF16, nc=True), T(*NM, dt=BF16), tag="nc")
add("cat", lambda a, b: torch.cat([a, b]), T("N"), T("M"), tag="r1", dyn=True)
add("cat", lambda a, b: torch.stack([a, b]), T(*NM), T(*NM), name="stack")
add("cat", lambda a, b, c: torch.stack([a, b, c], -1), T(*NM, dt=F16), T(*NM, dt=F16), T(*NM, dt=F16),
    name="stack", tag="last", dyn=True)
add("split_with_sizes", lambda x: x.split(2, 1), T("N", 5))
add("split_with_sizes", lambda x: x.split([2, 3], 1), T("N", 5, dt=F16), dyn=True)
add("split_with_sizes", lambda x: x.split(3), T(7, "M", dt=I32), tag="d0", dyn=True)
add("split_with_sizes", lambda x: torch.split(x, [1, 3, 2], -1), T(3, 6, nc=True), tag="nc")
add("split_with_sizes", lambda x: x.chunk(3, 0), T(7, "M"), name="chunk", dyn=True)
add("squeeze.dims", lambda x: x.unbind(0), T(3, "M"), name="unbind")
# export decomposes repeat as torch does (frontend/export.py): the copy of an expanded view
add("expand", lambda x: x.repeat(2, 3), T(*NM), name="repeat")
add("expand", lambda x: x.repeat(2, 1), T(*NM, dt=I64), name="repeat", dyn=True)
add("repeat_interleave.self_int", lambda x: x.repeat_interleave(2, dim=1), T(*NM))
add("repeat_interleave.self_int", lambda x: x.repeat_interleave(3, dim=0), T(*NM, dt=F16), dyn=True,
    dyn_torch=PARITY_GUARDS_FIXED)
add("flip", lambda x: x.flip(1), T(*NM))
add("flip", lambda x: x.flip(0, 1), T(*NM, dt=F16), tag="d01", dyn=True)
add("flip", lambda x: x.flip(0), T("N", dt=BOOL), tag="r1", dyn=True)
add("index_select", lambda x: x.roll(2, 1), T(*NM), name="roll")
add("index_select", lambda x: x.roll(-1, 0), T(*NM, dt=I32), name="roll", dyn=True)
add("where.self", torch.tril, T(*NM), name="tril")
add("where.self", lambda x: torch.tril(x, -1), T(*NM, dt=F16), name="tril", tag="k-1", dyn=True)
add("where.self", lambda x: torch.triu(x, 1), T(*NM, dt=I64), name="triu", tag="k1", dyn=True)
add("constant_pad_nd", lambda x: F.pad(x, (1, 2)), T(*NM), name="pad")
add("constant_pad_nd", lambda x: F.pad(x, (1, 1, 2, 0), value=0.5), T(*NM, dt=F16), name="pad", tag="2d",
    dyn=True)
add("constant_pad_nd", lambda x: F.pad(x, (-1, 1)), T(*NM), name="pad", tag="crop")
add("constant_pad_nd", lambda x: F.pad(x, (2, 2)), T(2, 3, "N", dt=BF16, nc=True), name="pad", tag="nc")
# reflect / replicate padding lower to index arithmetic and aten.index.Tensor
add("index.Tensor", lambda x: F.pad(x, (1, 2), mode="reflect"), T(2, 3, "N"), name="pad-reflect", dmin=3)
add("index.Tensor", lambda x: F.pad(x, (1, 1, 2, 0), mode="reflect"), T(1, 2, "N", "M"), name="pad-reflect",
    tag="2d", dyn=True, dmin=3)
add("index.Tensor", lambda x: F.pad(x, (1, 2), mode="replicate"), T(2, 3, "N", dt=F16), name="pad-replicate",
    dyn=True)
add("slice_scatter", lambda x: F.pad(x, (1, 2), mode="circular"), T(2, 3, "N"), name="pad-circular")
add("diagonal", lambda x: x.diagonal(), T(*NM))
add("diagonal", lambda x: x.diagonal(0, 1, 2), T(3, "N", "N"), tag="batched", dyn=True)
add("unfold", lambda x: x.unfold(1, 2, 1), T(*NM))
add("unfold", lambda x: x.unfold(0, 3, 2), T("N", 4, dt=BF16), dyn=True, dmin=5)
add("as_strided", lambda x: x.as_strided((2, 3), (1, 2)), T(6, 5))
add("slice_scatter", lambda x, s: torch.slice_scatter(x, s, 1, 0, 2), T(*NM), T("N", 2))
add("slice_scatter", lambda x, s: torch.slice_scatter(x, s, 0, 1, 5, 2), T(*NM, dt=F16), T(2, "M", dt=F16),
    dyn=True, dmin=5)

# ------------------------------------------------------------------------------------------------
# Indexing, gather / scatter
# ------------------------------------------------------------------------------------------------
add("index.Tensor", lambda x, i: x[i], T(*NM), T(4, k="idx", hi="N"))
add("index.Tensor", lambda x, i: x[i], T(*NM, dt=F16), T("M", k="idx", hi="N"), dyn=True)
add("index.Tensor", lambda x, i: x[:, i], T(*NM, dt=I64), T(3, k="idx", hi="M"), tag="d1")
add("index.Tensor", lambda x, i, j: x[i, j], T(*NM), T(3, k="idx", hi="N"), T(3, k="idx", hi="M"), tag="2idx")
add("index.Tensor", lambda x, i, j: x[i, :, j], T(*NMK, dt=BF16), T(2, 3, k="idx", hi="N"),
    T(2, 3, k="idx", hi=4), tag="2idx-bcast", dyn=True)
# Boolean-mask indexing has a data-dependent output size (aten.nonzero, registered as host_sync).
add("index.Tensor", lambda x, m: x[m], T(*NM), T(*NM, dt=BOOL), tag="boolmask")
add("index_select", lambda x, i: x.index_select(0, i), T(*NM), T(4, k="idx", hi="N"))
add("index_select", lambda x, i: x.index_select(1, i), T(*NM, dt=F16), T(3, k="idx", hi="M"), dyn=True)
add("index_select", lambda x, i: x.index_select(2, i), T(*NMK, nc=True), T(3, k="idx", hi=4), tag="nc")
add("gather", lambda x, i: x.gather(1, i), T(*NM), T("N", 3, k="idx", hi="M"))
add("gather", lambda x, i: x.gather(1, i), T(*NM, dt=F16), T("N", 3, k="idx", hi="M"), dyn=True)
add("gather", lambda x, i: torch.gather(x, -1, i), T(*NMK, dt=BF16), T("N", "M", 2, k="idx", hi=4),
    tag="r3", dyn=True)
add("gather", lambda x, i: torch.take_along_dim(x, i, 1), T(*NM), T("N", 2, k="idx", hi="M"),
    name="take_along_dim")
# (take_along_dim with dynamic dims: torch.export itself specializes them while broadcasting, so static)
add("gather", lambda x, i: torch.take_along_dim(x, i, 0), T(*NM, dt=F16), T(3, "M", k="idx", hi="N"),
    name="take_along_dim")
# scatter with src: indices distinct within each row, so the result does not depend on write order.
add("scatter.src", lambda x, i, s: x.scatter(1, i, s), T(*NM), T("N", 3, k="rowperm", hi="M"), T("N", 3))
add("scatter.src", lambda x, i, s: x.scatter(1, i, s), T(*NM, dt=F16), T("N", 2, k="rowperm", hi="M"),
    T("N", 2, dt=F16), dyn=True)
add("scatter.value", lambda x, i: x.scatter(1, i, 2.5), T(*NM), T("N", 3, k="idx", hi="M"))
add("scatter.value", lambda x, i: x.scatter(1, i, -1.0), T(*NM, dt=BF16), T("N", 2, k="idx", hi="M"), dyn=True)
add("scatter_add", lambda x, i, s: x.scatter_add(1, i, s), T(*NM), T("N", 4, k="idx", hi="M"), T("N", 4))
add("scatter_add", lambda x, i, s: x.scatter_add(0, i, s), T(*NM), T(3, "M", k="idx", hi="N"), T(3, "M"),
    tag="d0", dyn=True)
for red in ("prod", "amax", "mean"):
    add("scatter_reduce.two", lambda x, i, s, red=red: x.scatter_reduce(1, i, s, red), T(*NM),
        T("N", 4, k="idx", hi="M"), T("N", 4), tag=red)
add("scatter_reduce.two", lambda x, i, s: x.scatter_reduce(1, i, s, "amax", include_self=False), T(*NM),
    T("N", 4, k="idx", hi="M"), T("N", 4), tag="amax-noself", dyn=True)
add("scatter_reduce.two", lambda x, i, s: x.scatter_reduce(0, i, s, "sum"), T(*NM, dt=I64),
    T(3, "M", k="idx", hi="N"), T(3, "M", dt=I64), tag="sum", dyn=True)
# index_put without accumulate: distinct indices (duplicates would race).
add("index_put", lambda x, i, v: x.index_put((i,), v), T(*NM), T(3, k="uidx", hi="N"), T("M"))
add("index_put", lambda x, i, v: x.index_put((i,), v), T(*NM, dt=F16), T(2, k="uidx", hi="N"), T(2, "M", dt=F16),
    dyn=True)
add("index_put", lambda x, i, v: x.index_put((i,), v, accumulate=True), T(*NM), T(5, k="idx", hi="N"),
    T(5, "M"), tag="acc")
add("index_put", lambda x, i, v: x.index_put((i,), v, accumulate=True), T(*NM, dt=I64), T("M", k="idx", hi="N"),
    T("M", "M", dt=I64), tag="acc", dyn=True)
add("index_put", lambda x, i, j, v: x.index_put((i, j), v), T(*NM), T(3, k="uidx", hi="N"),
    T(3, k="idx", hi="M"), T(3), tag="2idx")
add("index_put", lambda x, i, v: torch.index_put(x, (i,), v), T(*NM, dt=BOOL), T(2, k="uidx", hi="N"),
    T(dt=BOOL), tag="bcast-value")
add("index_put", lambda x, i, s: x.index_copy(1, i, s), T(*NM), T(2, k="uidx", hi="M"), T("N", 2),
    name="index_copy")
add("index_put", lambda x, i, s: x.index_copy(0, i, s), T(*NM, dt=BF16), T(3, k="uidx", hi="N"),
    T(3, "M", dt=BF16), name="index_copy", dyn=True)
add("index_put", lambda x, i, s: x.index_add(1, i, s), T(*NM), T(4, k="idx", hi="M"), T("N", 4),
    name="index_add")
add("index_put", lambda x, i, s: x.index_add(0, i, s, alpha=2), T(*NM, dt=I32), T(3, k="idx", hi="N"),
    T(3, "M", dt=I32), name="index_add", tag="alpha", dyn=True)
add("index_put", lambda x, i: x.index_fill(1, i, -2.0), T(*NM), T(2, k="idx", hi="M"), name="index_fill")
add("embedding", F.embedding, T("N", k="idx", hi=10), T(10, 4))
add("embedding", F.embedding, T(2, "N", k="idx", hi=10), T(10, 8, dt=F16), tag="2d", dyn=True)
add("embedding", lambda i, w: F.embedding(i, w, padding_idx=0), T("N", 3, k="idx", hi=5), T(5, 4),
    tag="padidx", dyn=True)
add("embedding", F.embedding, T("N", k="idx", hi=7), T(7, 3, nc=True), tag="nc-weight")
add("masked_scatter", lambda x, m, s: x.masked_scatter(m, s), T(*NM), T(*NM, dt=BOOL), T(*NM))

# ------------------------------------------------------------------------------------------------
# Sorting / selection (distinct values so that indices compare exactly)
# ------------------------------------------------------------------------------------------------
add("topk", lambda x: x.topk(3), T(*NM, k="perm"))
add("topk", lambda x: x.topk(2, largest=False), T(*NM, k="perm"), tag="smallest", dyn=True, dmin=3)
add("topk", lambda x: x.topk(2, dim=0), T(*NM, dt=F16, k="perm"), tag="d0", dyn=True, dmin=3)
add("topk", lambda x: x.topk(4), T("N", dt=BF16, k="perm"), tag="r1", dyn=True, dmin=5)
add("topk", lambda x: x.topk(2), T(*NM, k="perm", nc=True), tag="nc")
add("sort", lambda x: x.sort(), T(*NM, k="perm"))
add("sort", lambda x: x.sort(descending=True), T(*NM, k="perm"), tag="desc", dyn=True)
add("sort", lambda x: x.sort(0), T(*NM, dt=F16, k="perm"), tag="d0", dyn=True)
add("sort", lambda x: x.argsort(1), T(*NM, k="perm"), name="argsort")
add("sort", lambda x: torch.argsort(x, 0, descending=True), T(*NM, dt=I32, k="perm"), name="argsort",
    tag="desc", dyn=True)
# stable sort on inputs with ties: the stable order makes the indices deterministic.
add("sort.stable", lambda x: x.sort(dim=1, stable=True), T(*NM, dt=I64, k="tiny"))
add("sort.stable", lambda x: torch.sort(x, stable=True, descending=True), T(*NM, k="tiny"), tag="desc", dyn=True)
add("sort.stable", lambda x: x.argsort(dim=-1, stable=True), T(*NM, dt=BOOL), name="argsort")
add("kthvalue", lambda x: x.kthvalue(2, 1), T(*NM, k="perm"))
add("kthvalue", lambda x: x.kthvalue(3, 0, keepdim=True), T(*NM, k="perm"), dyn=True, dmin=3)
add("bucketize.Tensor", lambda x, b: torch.bucketize(x, b), T(*NM), T(7, k="sorted"))
add("bucketize.Tensor", lambda x, b: torch.bucketize(x, b, right=True), T(*NM, dt=I64), T(5, dt=I64, k="sorted"),
    tag="right", dyn=True)
add("searchsorted.Tensor", lambda b, x: torch.searchsorted(b, x), T("N", 8, k="sorted"), T("N", 3))
add("searchsorted.Tensor", lambda b, x: torch.searchsorted(b, x, side="right"), T(8, k="sorted"), T(*NM),
    tag="right", dyn=True)

# ------------------------------------------------------------------------------------------------
# Matmul family
# ------------------------------------------------------------------------------------------------
add("mm", torch.mm, T(*NM), T("M", 4))
add("mm", torch.mm, T(*NM), T("M", 3), dyn=True)
add("mm", torch.mm, T(*NM, dt=BF16), T("M", 4, dt=BF16), dyn=True)
add("mm", torch.mm, T(*NM, nc=True), T("M", 4, nc=True), tag="nc")
add("mm", torch.mm, T(*NM), T("M", 4, view=True), tag="view")
add("mm", lambda a, b: a @ b, T(2, *NM), T("M", 3), name="matmul", tag="3d@2d", dyn=True)
add("bmm", torch.bmm, T(2, *NM), T(2, "M", 4))
add("bmm", torch.bmm, T("N", 3, "M", dt=F16), T("N", "M", 2, dt=F16), dyn=True)
add("bmm", torch.matmul, T(2, 2, *NM), T(2, 2, "M", 3), name="matmul", tag="4d")
add("bmm", lambda a, b: a @ b, T(2, "N", "M", dt=F16), T(2, "M", 3, dt=F16), name="matmul", tag="3d@3d",
    dyn=True)
add("bmm", torch.baddbmm, T(2, "N", 4), T(2, *NM), T(2, "M", 4), name="baddbmm")
add("bmm", lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2.0), T(2, "N", 4), T(2, *NM), T(2, "M", 4),
    name="baddbmm", tag="alpha-beta", dyn=True)
add("bmm", lambda q, k: torch.einsum("bhqd,bhkd->bhqk", q, k), T(1, 2, "N", 8, dt=F16), T(1, 2, "M", 8, dt=F16),
    name="einsum", tag="attn", dyn=True)
add("addmm", torch.addmm, T(4), T(*NM), T("M", 4))
add("addmm", torch.addmm, T("N", 4), T(*NM), T("M", 4), tag="2d-bias", dyn=True)
add("addmm", lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0), T(4), T(*NM), T("M", 4), tag="alpha-beta")
add("addmm", torch.addmm, T(4, dt=F16), T(*NM, dt=F16), T("M", 4, dt=F16), dyn=True)
add("linear", F.linear, T(*NM), T(3, "M"), T(3))
add("linear", F.linear, T(*NM), T(3, "M"), tag="nobias", dyn=True)
add("linear", F.linear, T(2, *NM, dt=F16), T(4, "M", dt=F16), T(4, dt=F16), tag="3d", dyn=True)
add("linear", F.linear, T("N", 8, nc=True), T(3, 8), T(3), tag="nc")
add("linear", F.linear, T("M"), T(3, "M"), T(3), tag="r1", dyn=True)

# ------------------------------------------------------------------------------------------------
# Convolution
# ------------------------------------------------------------------------------------------------
add("convolution", F.conv1d, T(2, 4, "N"), T(6, 4, 3), T(6), name="conv1d", dmin=4)
add("convolution", lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1), T(2, 4, "N"), T(6, 4, 3), T(6),
    name="conv1d", tag="s2p1", dyn=True, dmin=4)
add("convolution", lambda x, w: F.conv1d(x, w, groups=2, padding="same"), T(2, 4, "N"), T(6, 2, 3),
    name="conv1d", tag="g2-same", dyn=True)
add("convolution", F.conv2d, T(1, 3, "N", "M"), T(4, 3, 3, 3), T(4), name="conv2d", dmin=4)
add("convolution", lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1), T(2, 3, "N", "M"), T(4, 3, 3, 3),
    T(4), name="conv2d", tag="s2p1", dyn=True, dmin=4)
add("convolution", lambda x, w: F.conv2d(x, w, dilation=2, padding=2), T(1, 2, 7, 7), T(3, 2, 3, 3),
    name="conv2d", tag="dil2")
add("convolution", lambda x, w, b: F.conv2d(x, w, b, groups=2), T(2, 4, 6, 6), T(6, 2, 3, 3), T(6),
    name="conv2d", tag="g2")
add("convolution", lambda x, w: F.conv2d(x, w, groups=4, padding=1), T(1, 4, "N", "M", dt=F16),
    T(4, 1, 3, 3, dt=F16), name="conv2d", tag="depthwise", dyn=True)
add("convolution", lambda x, w: F.conv2d(x, w, padding="same"), T(1, 3, 6, 5, dt=BF16), T(2, 3, 3, 3, dt=BF16),
    name="conv2d", tag="same")
add("convolution", lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=(0, 1), dilation=(1, 2)),
    T(1, 2, 7, 6), T(3, 2, 2, 3), T(3), name="conv2d", tag="asym")
add("convolution", F.conv2d, T(1, 3, 5, 5, nc=True), T(2, 3, 1, 1), name="conv2d", tag="1x1-nc")
add("convolution", lambda x, w: F.conv_transpose2d(x, w, stride=2), T(1, 4, 3, 3), T(4, 2, 3, 3),
    name="conv_transpose2d")
add("convolution", lambda x, w: F.conv_transpose1d(x, w, padding=1), T(1, 3, "N"), T(3, 2, 3),
    name="conv_transpose1d", dyn=True)

# ------------------------------------------------------------------------------------------------
# Pooling
# ------------------------------------------------------------------------------------------------
add("max_pool2d_with_indices", lambda x: F.max_pool2d(x, 2), T(2, 3, 6, 6), name="max_pool2d")
add("max_pool2d_with_indices", lambda x: F.max_pool2d(x, 2), T(2, 3, "N", "M"), name="max_pool2d", dyn=True,
    dmin=4, dyn_torch=PARITY_GUARDS_FIXED)
add("max_pool2d_with_indices", lambda x: F.max_pool2d(x, 3, stride=2, padding=1), T(1, 2, 7, 7, dt=F16),
    name="max_pool2d", tag="k3s2p1")
add("max_pool2d_with_indices", lambda x: F.max_pool2d(x, 2, dilation=2), T(1, 2, 7, 7, dt=BF16),
    name="max_pool2d", tag="dil2")
add("max_pool2d_with_indices", lambda x: F.max_pool2d(x, 2, return_indices=True), T(1, 2, 6, 6, k="perm"),
    name="max_pool2d", tag="indices")
add("max_pool2d_with_indices", lambda x: F.max_pool1d(x, 2), T(2, 3, 8), name="max_pool1d")
# (max_pool1d with a dynamic length: torch.export itself specializes the length, so static only)
add("max_pool2d_with_indices", lambda x: F.max_pool1d(x, 3, stride=1, padding=1), T(2, 3, 7),
    name="max_pool1d", tag="k3s1p1")
add("avg_pool2d", lambda x: F.avg_pool2d(x, 2), T(2, 3, 6, 6))
add("avg_pool2d", lambda x: F.avg_pool2d(x, 2), T(2, 3, "N", "M", dt=F16), dyn=True, dmin=4,
    dyn_torch=PARITY_GUARDS_FIXED)
add("avg_pool2d", lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False), T(1, 2, 7, 7),
    tag="nopad")
add("avg_pool2d", lambda x: F.avg_pool2d(x, 3, stride=2, ceil_mode=True), T(1, 2, 8, 8, dt=BF16), tag="ceil")
add("avg_pool2d", lambda x: F.avg_pool1d(x, 2), T(2, 3, 8), name="avg_pool1d")
add("avg_pool2d", lambda x: F.avg_pool1d(x, 3, stride=2, padding=1), T(2, 3, "N"), name="avg_pool1d",
    dyn=True, dmin=4, dyn_torch=PARITY_GUARDS_FIXED)
add("_adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, 2), T(2, 3, 6, 6), name="adaptive_avg_pool2d")
add("_adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, (3, 3)), T(1, 2, 8, 7), name="adaptive_avg_pool2d",
    tag="uneven")
add("_adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, 2), T(1, 3, "N", "M", dt=F16),
    name="adaptive_avg_pool2d", dyn=True)
add("_adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool1d(x, 3), T(2, 3, 8), name="adaptive_avg_pool1d")
add("mean.dim", lambda x: F.adaptive_avg_pool2d(x, 1), T(2, 3, "N", "M"), name="adaptive_avg_pool2d",
    tag="global", dyn=True)
add("adaptive_max_pool2d", lambda x: F.adaptive_max_pool2d(x, 2), T(1, 2, 6, 6, k="perm"))

# ------------------------------------------------------------------------------------------------
# Normalization, softmax
# ------------------------------------------------------------------------------------------------
add("layer_norm", lambda x, w, b: F.layer_norm(x, (5,), w, b), T("N", 5), T(5), T(5))
add("layer_norm", lambda x: F.layer_norm(x, (8,)), T(2, "N", 8), tag="noaffine", dyn=True)
add("layer_norm", lambda x, w, b: F.layer_norm(x, (3, 4), w, b), T("N", 3, 4), T(3, 4), T(3, 4), tag="2d")
add("layer_norm", lambda x, w, b: F.layer_norm(x, (8,), w, b), T("N", 8, dt=F16), T(8, dt=F16), T(8, dt=F16),
    dyn=True)
add("layer_norm", lambda x, w, b: F.layer_norm(x, (8,), w, b, eps=1e-3), T(2, "N", 8, dt=BF16), T(8, dt=BF16),
    T(8, dt=BF16), tag="eps")
add("layer_norm", lambda x: F.layer_norm(x, (6,)), T("N", 6, nc=True), tag="nc")
add("layer_norm", lambda x: F.layer_norm(x, (6,)), T("N", 6, view=True), tag="view", dyn=True)
add("native_group_norm", lambda x: F.group_norm(x, 2), T(2, 4, 3, 3), name="group_norm")
add("native_group_norm", lambda x, w, b: F.group_norm(x, 2, w, b), T(2, 4, "N", "M"), T(4), T(4),
    name="group_norm", tag="affine", dyn=True)
add("native_group_norm", lambda x: F.group_norm(x, 1), T(1, 4, "N", dt=F16), name="group_norm", tag="g1",
    dyn=True)
add("_native_batch_norm_legit_no_training", lambda x, m, v: F.batch_norm(x, m, v), T("N", 4), T(4), T(4, k="var"),
    name="batch_norm")
add("_native_batch_norm_legit_no_training", lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, eps=1e-3),
    T(2, 4, "N", "M"), T(4), T(4, k="var"), T(4), T(4), name="batch_norm", tag="affine", dyn=True)
add("_native_batch_norm_legit_no_training", lambda x, m, v: F.batch_norm(x, m, v), T(2, 3, 5), T(3),
    T(3, k="var"), name="batch_norm", tag="3d")
add("rms_norm", lambda x, w: F.rms_norm(x, (8,), w), T("N", 8), T(8))
add("rms_norm", lambda x: F.rms_norm(x, (8,)), T(2, "N", 8), tag="noweight", dyn=True)
add("rms_norm", lambda x, w: F.rms_norm(x, (8,), w, eps=1e-5), T("N", 8, dt=F16), T(8, dt=F16), dyn=True)
add("rms_norm", lambda x, w: F.rms_norm(x, (3, 4), w), T("N", 3, 4, dt=BF16), T(3, 4, dt=BF16), tag="2d")
for op, fn in (("_softmax", torch.softmax), ("_log_softmax", torch.log_softmax)):
    nm = fn.__name__
    add(op, lambda x, fn=fn: fn(x, -1), T(*NM), name=nm)
    add(op, lambda x, fn=fn: fn(x, 0), T(*NM), name=nm, tag="d0", dyn=True)
    add(op, lambda x, fn=fn: fn(x, -1), T(*NM, dt=F16), name=nm, dyn=True)
    if op == "_softmax":
        add(op, lambda x, fn=fn: fn(x, 1), T(2, "N", "M", dt=BF16), name=nm, tag="d1")
        add(op, lambda x, fn=fn: fn(x, -1, dtype=torch.float32), T(*NM, dt=F16), name=nm, tag="dtype")
    add(op, lambda x, fn=fn: fn(x, -1), T(1, 2, "N", "M", nc=True), name=nm, tag="nc")
add("_softmax", lambda x: F.softmax(x, -1), T(*NM, k="special"), name="softmax", tag="inf")

# ------------------------------------------------------------------------------------------------
# Scaled dot-product attention
# ------------------------------------------------------------------------------------------------
SDPA = "scaled_dot_product_attention"
sdpa = F.scaled_dot_product_attention
add(SDPA, sdpa, T(1, 2, "N", 8), T(1, 2, "M", 8), T(1, 2, "M", 8))
add(SDPA, sdpa, T(2, 2, "N", 8), T(2, 2, "M", 8), T(2, 2, "M", 8), dyn=True)
add(SDPA, lambda q, k, v: sdpa(q, k, v, is_causal=True), T(1, 2, "N", 8), T(1, 2, "N", 8), T(1, 2, "N", 8),
    tag="causal")
add(SDPA, lambda q, k, v: sdpa(q, k, v, is_causal=True), T(1, 2, "N", 8), T(1, 2, "N", 8), T(1, 2, "N", 8),
    tag="causal", dyn=True)
add(SDPA, lambda q, k, v, m: sdpa(q, k, v, attn_mask=m), T(1, 2, "N", 8), T(1, 2, "M", 8), T(1, 2, "M", 8),
    T("N", "M"), tag="float-mask")
add(SDPA, lambda q, k, v, m: sdpa(q, k, v, attn_mask=m), T(1, 2, "N", 8), T(1, 2, "M", 8), T(1, 2, "M", 8),
    T(1, 1, "N", "M", dt=BOOL, k="mask"), tag="bool-mask", dyn=True)
add(SDPA, sdpa, T(1, 2, "N", 8, dt=F16), T(1, 2, "M", 8, dt=F16), T(1, 2, "M", 8, dt=F16))
add(SDPA, lambda q, k, v: sdpa(q, k, v, is_causal=True), T(1, 2, "N", 8, dt=F16), T(1, 2, "N", 8, dt=F16),
    T(1, 2, "N", 8, dt=F16), tag="causal", dyn=True)
add(SDPA, sdpa, T(1, 2, "N", 8, dt=BF16), T(1, 2, "M", 8, dt=BF16), T(1, 2, "M", 8, dt=BF16), dyn=True)
add(SDPA, lambda q, k, v: sdpa(q, k, v, enable_gqa=True), T(1, 4, "N", 8), T(1, 2, "M", 8), T(1, 2, "M", 8),
    tag="gqa")
add(SDPA, sdpa, T(1, 2, "N", 8, nc=True), T(1, 2, "M", 8), T(1, 2, "M", 8), tag="nc")

# ------------------------------------------------------------------------------------------------
# Creation ops
# ------------------------------------------------------------------------------------------------
add("arange.start_step", lambda x: torch.arange(x.shape[0]), T(*NM), name="arange")
add("arange.start_step", lambda x: torch.arange(x.shape[0]), T(*NM), name="arange", dyn=True)
add("arange.start_step", lambda x: torch.arange(1, x.shape[0], 2), T(*NM), name="arange", tag="step2", dyn=True,
    dmin=4)
add("arange.start_step", lambda x: torch.arange(0, 3, 0.5), T(2), name="arange", tag="float")
add("full", lambda x: torch.full((x.shape[0], 3), 1.5), T(*NM))
add("full", lambda x: torch.full((x.shape[0], x.shape[1]), 7, dtype=torch.int32), T(*NM), dyn=True)
add("full", lambda x: torch.zeros(x.shape[0], 2, dtype=torch.float16), T(*NM), name="zeros", dyn=True)
add("full", lambda x: torch.ones(3, x.shape[1], dtype=torch.bfloat16), T(*NM), name="ones", dyn=True)
add("full", lambda x: x.new_ones(x.shape), T(*NM, dt=F16), name="new_ones", dyn=True)
add("full_like", torch.zeros_like, T(*NM), name="zeros_like")
add("full_like", torch.zeros_like, T(*NM, dt=I32), name="zeros_like", dyn=True)
add("full_like", torch.ones_like, T(*NM, dt=F16), name="ones_like")
add("full_like", lambda x: torch.ones_like(x, dtype=torch.bool), T(*NM), name="ones_like", tag="to-bool")
add("full_like", lambda x: torch.full_like(x, 3), T(*NM, dt=I64), dyn=True)
add("full_like", lambda x: torch.full_like(x, 0.25), T(*NM, nc=True), tag="nc")
# torch.empty_like has undefined contents; the row fills it so that the output is comparable. It lowers
# to aten.empty_permuted + aten.full_like.
add("full_like", lambda x: torch.empty_like(x).fill_(2.0), T(*NM), name="empty_like+fill_")
add("tril_indices", lambda x: torch.tril_indices(4, 3), T(2))
add("triu_indices", lambda x: torch.triu_indices(3, 4, 1), T(2))

# ------------------------------------------------------------------------------------------------
# Type conversion (all lower to aten._to_copy)
# ------------------------------------------------------------------------------------------------
TO = "_to_copy"
add(TO, lambda x: x.to(torch.float16), T(*NM), name="to", tag="f16")
add(TO, lambda x: x.to(torch.bfloat16), T(*NM), name="to", tag="bf16", dyn=True)
add(TO, lambda x: x.float(), T(*NM, dt=F16), name="float", dyn=True)
add(TO, lambda x: x.float(), T(*NM, dt=BF16), name="float")
add(TO, lambda x: x.float(), T(*NM, dt=I64), name="float", dyn=True)
add(TO, lambda x: x.half(), T(*NM), name="half")
add(TO, lambda x: x.to(torch.int32), T(*NM), name="to", tag="i32")
add(TO, lambda x: x.long(), T(*NM, dt=I32), name="long", dyn=True)
add(TO, lambda x: x.bool(), T(*NM), name="bool")
add(TO, lambda x: x.to(torch.float16), T(*NM, nc=True), name="to", tag="f16-nc")
add(TO, lambda x: x.to(torch.float32), T(dt=BF16), name="to", tag="r0")
add(TO, lambda x, y: x.type_as(y), T(*NM, dt=I64), T(2, dt=F16), name="type_as")

# ------------------------------------------------------------------------------------------------
# Upsampling / interpolation
# ------------------------------------------------------------------------------------------------
add("upsample_nearest2d.vec", lambda x: F.interpolate(x, scale_factor=2), T(1, 3, 4, 5), name="interpolate")
add("upsample_nearest2d.vec", lambda x: F.interpolate(x, scale_factor=2), T(2, 3, "N", "M"),
    name="interpolate", dyn=True)
add("upsample_nearest2d.vec", lambda x: F.interpolate(x, size=(7, 9)), T(1, 2, 4, 5, dt=F16), name="interpolate",
    tag="size")
add("upsample_nearest2d.vec", lambda x: F.interpolate(x, scale_factor=2), T(1, 2, 4, 5, nc=True),
    name="interpolate", tag="nc")
add("upsample_bilinear2d.vec", lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), T(1, 3, 4, 5),
    name="interpolate")
add("upsample_bilinear2d.vec", lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"), T(1, 3, "N", "M"),
    name="interpolate", dyn=True)
add("upsample_bilinear2d.vec", lambda x: F.interpolate(x, size=(7, 9), mode="bilinear", align_corners=True),
    T(1, 2, 4, 5), name="interpolate", tag="align")
add("upsample_bilinear2d.vec", lambda x: F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True),
    T(1, 2, "N", "M", dt=F16), name="interpolate", tag="align", dyn=True)
add("upsample_bilinear2d.vec", lambda x: F.interpolate(x, size=(3, 3), mode="bilinear"), T(1, 2, 6, 5, dt=BF16),
    name="interpolate", tag="down")
# 1-d nearest / linear interpolation lowers to index arithmetic and aten.index.Tensor
add("index.Tensor", lambda x: F.interpolate(x, scale_factor=2), T(1, 3, 5), name="interpolate-nearest1d")
add("index.Tensor", lambda x: F.interpolate(x, scale_factor=2, mode="linear"), T(1, 3, "N"),
    name="interpolate-linear1d", dyn=True)
add("grid_sampler_2d", lambda x, g: F.grid_sample(x, g, align_corners=False), T(1, 2, 5, 6), T(1, 3, 4, 2, k="unit"),
    name="grid_sample")


# ------------------------------------------------------------------------------------------------
def _dtype_tag(c: Case) -> str:
    """The dtype shown in the id: the first data input's (not a bool condition or an index)."""
    if c.dtag:
        return c.dtag
    data = [s for s in c.ins if s.dtype != BOOL and s.kind not in ("idx", "uidx", "rowperm", "mask")]
    return DTYPE_TAG[(data or list(c.ins))[0].dtype] if c.ins else "none"


def _finish() -> None:
    seen: dict[str, int] = {}
    for c in CASES:
        short = c.op[len("aten."):]
        head = f"{c.name}>{short}" if c.name and c.name != short else short
        parts = [head, _dtype_tag(c)]
        if c.tag:
            parts.append(c.tag)
        if c.dyn:
            parts.append("dyn")
        base = "-".join(parts)
        n = seen.get(base, 0)
        seen[base] = n + 1
        c.id = base if n == 0 else f"{base}-{n + 1}"


_finish()
