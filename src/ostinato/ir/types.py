"""Value types of the IR: dtypes, symbolic dims, tensor and scalar metadata."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Union

import torch

# sympy (~0.3 s to import) is imported where a symbolic dim is made or used: a process running a
# program with static shapes never needs it.

# Short names used by the printer (and later the program file); one entry per dtype the IR supports.
DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float64: "f64",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.uint8: "u8",
    torch.bool: "bool",
    torch.complex64: "c64",
}
DTYPES_BY_NAME = {v: k for k, v in DTYPE_NAMES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


class SymDim:
    """A symbolic dimension: a sympy expression over named size symbols (``s0``, ``2*s0 + 1``)."""

    __slots__ = ("expr", "_values", "_names")  # _values: evaluations cached by the symbols' sizes

    def __init__(self, expr: Union[sympy.Expr, str, int]):
        import sympy
        if not isinstance(expr, str):
            # Canonical form: what the program file's parser makes of the printed expression, so that
            # save → load → save gives the same bytes. torch's own sympy functions print as //, %, ...
            text = str(expr)
            try:
                expr = parse_expr(text)
            except ValueError:
                expr = sympy.sympify(expr)
        else:
            expr = parse_expr(expr)
        self.expr = expr
        self._values: dict[tuple[int, ...], int] = {}
        self._names = tuple(sorted(str(s) for s in self.expr.free_symbols))

    @property
    def symbols(self) -> tuple[str, ...]:
        return self._names

    @property
    def is_symbol(self) -> bool:
        """True when the dim is a bare symbol (it can be bound from an input's size)."""
        return self.expr.is_Symbol

    def evaluate(self, bindings: Mapping[str, int]) -> int:
        key = tuple(bindings[n] for n in self._names)
        hit = self._values.get(key)
        if hit is None:
            import sympy
            subs = {s: sympy.Integer(bindings[str(s)]) for s in self.expr.free_symbols}
            hit = self._values[key] = int(self.expr.xreplace(subs))
        return hit

    def __str__(self) -> str:
        return str(self.expr).replace(" ", "")

    __repr__ = __str__

    def __eq__(self, other) -> bool:
        import sympy
        return isinstance(other, SymDim) and sympy.simplify(self.expr - other.expr) == 0

    def __hash__(self) -> int:
        return hash(str(self))


_MAX_EXPR_CHARS = 1024
_MAX_EXPR_NODES = 256


def _sym_functions() -> dict:
    import sympy
    from torch.utils._sympy import functions as F
    names = ("FloorDiv", "ModularIndexing", "CleanDiv", "CeilDiv", "Mod", "PythonMod", "Max", "Min",
             "CeilToInt", "FloorToInt", "TruncToInt", "IntTrueDiv", "ToFloat")
    table = {n: getattr(F, n) for n in names if hasattr(F, n)}
    table.update(Max=sympy.Max, Min=sympy.Min, floor=sympy.floor, ceiling=sympy.ceiling)
    return table


def parse_expr(text: str) -> sympy.Expr:
    """Parse a size expression (``2*s0 + 1``, ``Max(1, s0//2)``) without evaluating any code.

    Program files are untrusted input, so this accepts only integers, size symbols, + - * // % **
    with small integer exponents, and a fixed set of integer functions. Raises ValueError otherwise.
    """
    import ast

    import sympy

    if not isinstance(text, str) or not text or len(text) > _MAX_EXPR_CHARS:
        raise ValueError("size expression is empty or too long")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"size expression {text!r} is not valid: {e.msg}") from None
    if sum(1 for _ in ast.walk(tree)) > _MAX_EXPR_NODES:
        raise ValueError("size expression is too large")
    funcs = _sym_functions()
    ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.FloorDiv: lambda a, b: sympy.floor(a / b), ast.Mod: lambda a, b: sympy.Mod(a, b),
           ast.Div: lambda a, b: a / b}

    def build(node):
        if isinstance(node, ast.Expression):
            return build(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return sympy.Integer(node.value)
        if isinstance(node, ast.Name):
            return sympy.Symbol(node.id, integer=True)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = build(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Pow):
                exp = node.right
                if not (isinstance(exp, ast.Constant) and type(exp.value) is int and 0 <= exp.value <= 8):
                    raise ValueError("only small integer exponents are allowed in size expressions")
                return build(node.left) ** exp.value
            fn = ops.get(type(node.op))
            if fn is not None:
                return fn(build(node.left), build(node.right))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in funcs \
                and not node.keywords:
            return funcs[node.func.id](*[build(a) for a in node.args])
        raise ValueError(f"size expression {text!r} has a disallowed element ({type(node).__name__})")

    try:
        return build(tree)
    except (TypeError, ZeroDivisionError, RecursionError, ValueError) as e:
        raise ValueError(f"size expression {text!r} is not valid: {e}") from None


Dim = Union[int, SymDim]


@dataclass(frozen=True)
class SymbolRange:
    """A size symbol's inclusive range; ``max`` is None when unbounded."""

    name: str
    min: int
    max: int | None
    label: str = ""  # the user's Dim name, when known

    def __str__(self) -> str:
        hi = "inf" if self.max is None else str(self.max)
        label = f" ({self.label})" if self.label and self.label != self.name else ""
        return f"{self.name}{label} in [{self.min}, {hi}]"


@dataclass(frozen=True)
class TensorMeta:
    dtype: torch.dtype
    shape: tuple[Dim, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def concrete_shape(self, bindings: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(d if isinstance(d, int) else d.evaluate(bindings) for d in self.shape)

    def __str__(self) -> str:
        return f"{dtype_name(self.dtype)}[{','.join(str(d) for d in self.shape)}]"


@dataclass(frozen=True)
class ScalarMeta:
    """A host scalar (int, float or bool); ``expr`` is its symbolic value when known."""

    kind: type
    expr: SymDim | None = field(default=None)

    def __str__(self) -> str:
        s = self.kind.__name__
        return f"{s}={self.expr}" if self.expr is not None else s


Meta = Union[TensorMeta, ScalarMeta]
