"""Random pointwise/reduction programs for the fusion property tests (test_property.py).

A *recipe* is a small program over inputs broadcastable to a base shape [B, T, N]: unary, binary and
scalar ops on earlier values, and reductions over the last dim whose results later ops read.
``build_recipe`` draws one from a ``Chooser``: hypothesis's ``draw`` (test_property.py's strategy) or a
seeded ``random.Random`` (this file's interpreter run), so both make recipes of the same structure.
``RecipeModule`` interprets a recipe with torch ops in its ``forward`` (torch.export traces it) and
``check`` exports it with the generic pipeline, runs it through a fusion backend and compares with eager.

Run with TRITON_INTERPRET=1 (test_property.py does): ``python property_cases.py COUNT [FIRST_SEED]``
checks COUNT seeded recipes through the generated Triton kernels in Triton's interpreter and prints one
JSON object, case -> "ok" or the failure (with the recipe); then "gelu_erf" (a known interpreter bug,
see GELU_ERF) and "canary_wrong_expansion", which must be "caught".
"""
from __future__ import annotations

import json
import math
import os
import random
import sys
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
for p in (HERE, os.path.dirname(HERE), os.path.join(os.path.dirname(os.path.dirname(HERE)), "src")):
    if p not in sys.path:
        sys.path.insert(0, p)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

TOL = 1e-4
# Values are kept within about CAP in magnitude (a worst-case bound tracked per value): ops whose
# result could exceed it are not drawn, so no input of randn scale makes inf or nan, and fp32
# rounding differences stay far below the tolerance.
CAP = 1000.0
INPUT_BOUND = 4.0
EXP_MAX_ARG = 4.5
CONSTS = (0.5, -1.5, 2.0, 3.0, -0.75, 0.25)      # never 0 or 1: canonicalize folds x + 0, x * 1

# name -> (source template, torch function, bound of the result given the operand's bound)
UNARY = {
    "exp": ("torch.exp({0})", torch.exp, lambda b: math.exp(b)),
    "sigmoid": ("torch.sigmoid({0})", torch.sigmoid, lambda b: 1.0),
    "tanh": ("torch.tanh({0})", torch.tanh, lambda b: 1.0),
    "relu": ("torch.relu({0})", torch.relu, lambda b: b),
    "neg": ("-{0}", torch.neg, lambda b: b),
    "abs": ("{0}.abs()", torch.abs, lambda b: b),
    "sqrt_abs1": ("torch.sqrt({0}.abs() + 1)", lambda x: torch.sqrt(x.abs() + 1), lambda b: math.sqrt(b + 1)),
    "rsqrt_sq1": ("torch.rsqrt({0} * {0} + 1)", lambda x: torch.rsqrt(x * x + 1), lambda b: 1.0),
    "log_abs1": ("torch.log({0}.abs() + 1)", lambda x: torch.log(x.abs() + 1), lambda b: math.log(b + 1)),
    "silu": ("F.silu({0})", F.silu, lambda b: b),
    "gelu": ("F.gelu({0})", F.gelu, lambda b: b),
    "gelu_tanh": ("F.gelu({0}, approximate='tanh')", lambda x: F.gelu(x, approximate="tanh"), lambda b: b),
}
BINARY = {
    "add": ("{0} + {1}", torch.add, lambda a, b: a + b),
    "sub": ("{0} - {1}", torch.sub, lambda a, b: a + b),
    "mul": ("{0} * {1}", torch.mul, lambda a, b: a * b),
    "div_abs1": ("{0} / ({1}.abs() + 1)", lambda x, y: x / (y.abs() + 1), lambda a, b: a),
    "maximum": ("torch.maximum({0}, {1})", torch.maximum, max),
    "minimum": ("torch.minimum({0}, {1})", torch.minimum, max),
    "where_gt": ("torch.where({0} > {1}, {0}, {1})", lambda x, y: torch.where(x > y, x, y), max),
}
# name -> (template with {0} the value and {c} the constant, function(x, c), bound(b, c))
SCALAR = {
    "add": ("{0} + {c}", lambda x, c: x + c, lambda b, c: b + abs(c)),
    "sub": ("{0} - {c}", lambda x, c: x - c, lambda b, c: b + abs(c)),
    "rsub": ("{c} - {0}", lambda x, c: c - x, lambda b, c: b + abs(c)),
    "mul": ("{c} * {0}", lambda x, c: c * x, lambda b, c: b * abs(c)),
    "div": ("{0} / {c}", lambda x, c: x / c, lambda b, c: b / abs(c)),
    "square": ("{0} ** 2", lambda x, c: x ** 2, lambda b, c: b * b),
    "clamp": ("{0}.clamp(-{a}, {a})", lambda x, c: x.clamp(-abs(c), abs(c)), lambda b, c: min(b, abs(c))),
}
# keepdim reductions over the last dim, and softmax over it
REDUCE = {
    "sum": ("{0}.sum(-1, keepdim=True)", lambda x: x.sum(-1, keepdim=True), lambda b, n: b * n),
    "mean": ("{0}.mean(-1, keepdim=True)", lambda x: x.mean(-1, keepdim=True), lambda b, n: b),
    "amax": ("{0}.amax(-1, keepdim=True)", lambda x: x.amax(-1, keepdim=True), lambda b, n: b),
    "var": ("{0}.var(-1, keepdim=True)", lambda x: x.var(-1, keepdim=True), lambda b, n: b * b),
    "var0": ("{0}.var(-1, keepdim=True, correction=0)", lambda x: x.var(-1, keepdim=True, correction=0),
             lambda b, n: b * b),
    "softmax": ("torch.softmax({0}, -1)", lambda x: torch.softmax(x, -1), lambda b, n: 1.0),
}
INPUT_KINDS = ("full", "vec", "row", "col")     # [B, T, N], [N], [B, T, 1], [T, 1]
FAMILIES = ("unary", "binary", "unary", "scalar", "binary", "reduce")


def input_shape(kind: str, B: int, T: int, N: int) -> tuple[int, ...]:
    return {"full": (B, T, N), "vec": (N,), "row": (B, T, 1), "col": (T, 1)}[kind]


class Chooser:
    """Where a recipe's choices come from; subclasses draw from hypothesis or a seeded generator."""

    def integer(self, lo: int, hi: int) -> int:
        raise NotImplementedError

    def choice(self, seq):
        raise NotImplementedError


class RandomChooser(Chooser):
    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, seq):
        return self.rng.choice(list(seq))


@dataclass(frozen=True)
class Recipe:
    B: int
    T: int
    N: int
    inputs: tuple          # (kind, is_parameter) per input; input 0 is a full-shaped argument
    steps: tuple           # ("unary", name, a) | ("binary", name, a, b) | ("scalar", name, a, c) | ("reduce", name, a)
    outputs: tuple         # value indices (inputs first, then one value per step)
    seed: int              # of the input data and parameters

    @property
    def n_in(self) -> int:
        return len(self.inputs)

    def shapes(self) -> list[tuple[int, ...]]:
        shapes = [input_shape(k, self.B, self.T, self.N) for k, _ in self.inputs]
        for step in self.steps:
            shapes.append(step_shape(step, shapes))
        return shapes

    def live(self) -> set[int]:
        """Steps (as value indices) the outputs depend on."""
        live, todo = set(), list(self.outputs)
        while todo:
            v = todo.pop()
            if v in live:
                continue
            live.add(v)
            if v >= self.n_in:
                todo.extend(operands(self.steps[v - self.n_in]))
        return live

    def expects_fusion(self) -> bool:
        """Whether the scheduler must make a fusion group: a live step reads another step's full-shaped
        value (with N > 1 no reduction is over a size-1 dim, so nothing unfusible closes that value's
        group before its reader, and every space holding full-shaped values combines with another)."""
        if self.N < 2:
            return False
        shapes, full, live = self.shapes(), (self.B, self.T, self.N), self.live()
        return any(self.n_in + j in live and any(a >= self.n_in and shapes[a] == full for a in operands(s))
                   for j, s in enumerate(self.steps))

    def __str__(self) -> str:
        """The recipe as the forward it runs."""
        name = [("p" if param else "x") + str(i) for i, (_, param) in enumerate(self.inputs)]
        lines = [f"Recipe B={self.B} T={self.T} N={self.N} seed={self.seed}:"]
        for i, (kind, param) in enumerate(self.inputs):
            shape = list(input_shape(kind, self.B, self.T, self.N))
            lines.append(f"  {name[i]}: {'parameter' if param else 'input'} {shape}")
        for j, s in enumerate(self.steps):
            name.append(f"v{self.n_in + j}")
            lines.append(f"  {name[-1]} = {step_source(s, name)}")
        lines.append("  return " + ", ".join(name[o] for o in self.outputs))
        return "\n".join(lines)

    __repr__ = __str__


def operands(step) -> tuple[int, ...]:
    return (step[2], step[3]) if step[0] == "binary" else (step[2],)


def step_shape(step, shapes) -> tuple[int, ...]:
    if step[0] == "binary":
        return tuple(torch.broadcast_shapes(shapes[step[2]], shapes[step[3]]))
    s = shapes[step[2]]
    return s[:-1] + (1,) if step[0] == "reduce" and step[1] != "softmax" else s


def step_source(step, name) -> str:
    fam, op = step[0], step[1]
    if fam == "unary":
        return UNARY[op][0].format(name[step[2]])
    if fam == "binary":
        return BINARY[op][0].format(name[step[2]], name[step[3]])
    if fam == "scalar":
        return SCALAR[op][0].format(name[step[2]], c=step[3], a=abs(step[3]))
    return REDUCE[op][0].format(name[step[2]])


def apply_step(step, vals):
    fam, op = step[0], step[1]
    if fam == "unary":
        return UNARY[op][1](vals[step[2]])
    if fam == "binary":
        return BINARY[op][1](vals[step[2]], vals[step[3]])
    if fam == "scalar":
        return SCALAR[op][1](vals[step[2]], step[3])
    return REDUCE[op][1](vals[step[2]])


def build_recipe(c: Chooser, exclude: frozenset = frozenset()) -> Recipe:
    """A random recipe of 3 to 10 steps, at most two of them reductions, each read by the next step
    (softmax by any later one); no op whose name (in any of UNARY, BINARY, SCALAR, REDUCE) is in
    ``exclude``. Every value no step reads is returned."""
    B, T, N = c.integer(1, 4), c.integer(1, 4), c.integer(1, 70)
    inputs = [("full", False)]
    for _ in range(c.integer(0, 3)):
        inputs.append((c.choice(INPUT_KINDS), c.choice((False, True))))
    shapes = [input_shape(k, B, T, N) for k, _ in inputs]
    bounds = [INPUT_BOUND] * len(inputs)
    n_steps = c.integer(3, 10)
    n_reduce = 0
    steps: list[tuple] = []
    pending: int | None = None      # a reduction's result the next step must read
    recent_first = lambda: list(range(len(shapes) - 1, -1, -1))  # noqa: E731 - shrinks toward chains

    while len(steps) < n_steps or pending is not None:
        if pending is not None:
            family = "binary"
        else:
            family = c.choice(FAMILIES)
            if family == "reduce" and (n_reduce >= 2 or len(steps) >= n_steps - 1):
                family = "unary"
        if family == "unary":
            a = c.choice(recent_first())
            ok = [k for k in UNARY if k not in exclude and (k != "exp" or bounds[a] <= EXP_MAX_ARG)]
            op = c.choice(ok)
            step, bound = ("unary", op, a), UNARY[op][2](bounds[a])
        elif family == "binary":
            a = c.choice(recent_first())
            if pending is not None:
                a, b = (pending, a) if c.choice((True, False)) else (a, pending)
                pending = None
            else:
                b = c.choice(recent_first())
            ok = [k for k, (_, _, f) in BINARY.items() if k not in exclude and f(bounds[a], bounds[b]) <= CAP]
            op = c.choice(ok)
            step, bound = ("binary", op, a, b), BINARY[op][2](bounds[a], bounds[b])
        elif family == "scalar":
            a = c.choice(recent_first())
            k = c.choice(CONSTS)
            ok = [n for n, (_, _, f) in SCALAR.items() if n not in exclude and f(bounds[a], k) <= CAP]
            op = c.choice(ok)
            step, bound = ("scalar", op, a, k), SCALAR[op][2](bounds[a], k)
        else:
            # reduce a value spanning the last dim, so no reduction is over a size-1 dim unless N is 1
            a = c.choice([v for v in recent_first() if shapes[v][-1] == N])
            ok = [n for n, (_, _, f) in REDUCE.items() if n not in exclude and f(bounds[a], N) <= CAP]
            op = c.choice(ok)
            if op == "var" and N == 1:
                op = "var0"          # var with correction 1 of one element is nan
            step, bound = ("reduce", op, a), REDUCE[op][2](bounds[a], N)
            n_reduce += 1
            pending = len(shapes) if op != "softmax" else None
        steps.append(step)
        shapes.append(step_shape(step, shapes))
        bounds.append(bound)

    # every value no later step reads is returned (no dead steps), and maybe one read value too
    n_in = len(inputs)
    read = {a for s in steps for a in operands(s)}
    outputs = [v for v in range(n_in, len(shapes)) if v not in read]
    extra = c.choice((None, *range(n_in, len(shapes))))
    if extra is not None and extra not in outputs:
        outputs.append(extra)
    return Recipe(B, T, N, tuple(inputs), tuple(steps), tuple(outputs), c.integer(0, 2 ** 16))


class RecipeModule(torch.nn.Module):
    """A recipe's program: inputs marked as parameters are the module's parameters, the others its
    arguments (``make_args``)."""

    def __init__(self, recipe: Recipe):
        super().__init__()
        self.recipe = recipe
        g = torch.Generator().manual_seed(recipe.seed + 1)
        for i, (kind, param) in enumerate(recipe.inputs):
            if param:
                shape = input_shape(kind, recipe.B, recipe.T, recipe.N)
                self.register_parameter(f"p{i}", torch.nn.Parameter(torch.randn(shape, generator=g)))

    def forward(self, *args):
        r = self.recipe
        it = iter(args)
        vals = [getattr(self, f"p{i}") if param else next(it) for i, (_, param) in enumerate(r.inputs)]
        for step in r.steps:
            vals.append(apply_step(step, vals))
        return tuple(vals[o] for o in r.outputs)


def make_args(recipe: Recipe) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(recipe.seed)
    return tuple(torch.randn(input_shape(kind, recipe.B, recipe.T, recipe.N), generator=g)
                 for kind, param in recipe.inputs if not param)


def check(recipe: Recipe, backend, tol: float = TOL) -> int:
    """Export the recipe with the generic pipeline, run it through ``backend``: at least one fusion
    group where the recipe must make one, outputs equal to eager. Returns the ost.fused launches."""
    import ostinato
    from ostinato.passes import GENERIC_PIPELINE
    from fusion_backend import fused_executable, fused_ops
    from helpers import assert_same

    try:
        model = RecipeModule(recipe).eval()
        args = make_args(recipe)
        prog = ostinato.export(model, args, passes=GENERIC_PIPELINE)
        exe = fused_executable(prog, backend)
        counts = fused_ops(exe)
        n = counts.get("ost.fused", 0)
        if recipe.expects_fusion() and n == 0:
            raise AssertionError(f"no fusion group; launches {counts}")
        with torch.no_grad():
            ref = model(*args)
        out = exe(*args)
        assert_same(out, ref, tol=tol)
        return n
    except Exception as e:
        e.add_note(str(recipe))       # the failing program, as the forward it runs
        raise


# A fixed recipe whose chain fuses (sigmoid into a mean reduction and its epilogue): the canary that a
# wrong expansion makes the comparison fail.
CANARY = Recipe(2, 3, 17, (("full", False), ("vec", True)),
                (("unary", "sigmoid", 0), ("binary", "mul", 2, 1), ("reduce", "mean", 3), ("binary", "sub", 3, 4)),
                (5, 2), 7)

# Ops left out of the interpreter's random recipes (none now: gelu's erf failed there until
# codegen/prims.py's INTERPRETED gave it tl.erf; the minimal recipe below stays as its regression test).
INTERPRETER_EXCLUDE: frozenset = frozenset()
GELU_ERF = Recipe(2, 3, 5, (("full", False),), (("unary", "gelu", 0), ("scalar", "mul", 1, 2.0)), (2,), 0)


def wrong_sigmoid():
    """A context in which aten.sigmoid expands to tanh (a wrong expansion)."""
    import contextlib

    from ostinato.codegen import expand

    @contextlib.contextmanager
    def ctx():
        old = expand._UNARY_ATEN["aten.sigmoid"]
        expand._UNARY_ATEN["aten.sigmoid"] = "tanh"
        try:
            yield
        finally:
            expand._UNARY_ATEN["aten.sigmoid"] = old
    return ctx()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    lines = [l for l in text.splitlines() if l.strip()]
    return f"{type(e).__name__}: " + " | ".join(lines[:4])[:600]


def _outcome(recipe: Recipe, backend) -> str:
    try:
        check(recipe, backend)
        return "ok"
    except Exception as e:  # noqa: BLE001 - reported per case
        return f"{_first_line(e)}\n{recipe}"


def main(count: int, first: int = 0) -> None:
    """Recipes of seeds first..first+count-1 (without INTERPRETER_EXCLUDE's ops), then "gelu_erf"
    (GELU_ERF) and "canary_wrong_expansion" ("caught" when CANARY fails with sigmoid expanded wrong)."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    import warnings

    from fusion_backend import InterpretedFusionBackend
    warnings.filterwarnings("ignore")     # the interpreter's numpy overflows in exp of large negatives
    results: dict[str, str] = {}
    for seed in range(first, first + count):
        torch.manual_seed(0)
        results[f"seed{seed}"] = _outcome(build_recipe(RandomChooser(seed), INTERPRETER_EXCLUDE),
                                          InterpretedFusionBackend())
    results["gelu_erf"] = _outcome(GELU_ERF, InterpretedFusionBackend())
    with wrong_sigmoid():
        outcome = _outcome(CANARY, InterpretedFusionBackend())
    results["canary_wrong_expansion"] = "caught" if outcome.startswith("AssertionError") else outcome
    print(json.dumps(results))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 0)
