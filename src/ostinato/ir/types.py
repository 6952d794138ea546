"""Value types of the IR: dtypes, symbolic dims, tensor and scalar metadata."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Union

import sympy
import torch

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

    __slots__ = ("expr", "_fn", "_names")  # _fn: cache of evaluations by binding

    def __init__(self, expr: Union[sympy.Expr, str, int]):
        if isinstance(expr, str):
            expr = sympy.sympify(expr, locals={n: sympy.Symbol(n, integer=True) for n in _names_in(expr)})
        self.expr = sympy.sympify(expr)
        self._fn = None
        self._names = tuple(sorted(str(s) for s in self.expr.free_symbols))

    @property
    def symbols(self) -> tuple[str, ...]:
        return self._names

    @property
    def is_symbol(self) -> bool:
        """True when the dim is a bare symbol (it can be bound from an input's size)."""
        return isinstance(self.expr, sympy.Symbol)

    def evaluate(self, bindings: Mapping[str, int]) -> int:
        key = tuple(bindings[n] for n in self._names)
        if self._fn is None:
            self._fn = {}
        hit = self._fn.get(key)
        if hit is None:
            subs = {s: sympy.Integer(bindings[str(s)]) for s in self.expr.free_symbols}
            hit = self._fn[key] = int(self.expr.xreplace(subs))
        return hit

    def __str__(self) -> str:
        return str(self.expr).replace(" ", "")

    __repr__ = __str__

    def __eq__(self, other) -> bool:
        return isinstance(other, SymDim) and sympy.simplify(self.expr - other.expr) == 0

    def __hash__(self) -> int:
        return hash(str(self))


def _names_in(expr: str) -> list[str]:
    import re
    return re.findall(r"[A-Za-z_][A-Za-z_0-9]*", expr)


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
