"""Checking a call's inputs against the exported spec, and binding size symbols from them."""
from __future__ import annotations

import operator
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..errors import InputError, ProgramFormatError
from ..ir import ScalarMeta, SymDim, TensorMeta, dtype_name
from ..program import Program, spec_structure


def _spec_text(meta: TensorMeta, symbols) -> str:
    text = f"{dtype_name(meta.dtype)} tensor of shape [{', '.join(str(d) for d in meta.shape)}]"
    used = sorted({s for d in meta.shape if isinstance(d, SymDim) for s in d.symbols})
    if used:
        text += " with " + ", ".join(str(symbols[s]) for s in used)
    return text


def _got_text(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return f"{dtype_name(x.dtype)} tensor of shape {list(x.shape)} on {x.device}"
    return f"{type(x).__name__} {x!r}"


class InputChecker:
    """Validates flattened inputs and returns the size-symbol bindings they imply."""

    def __init__(self, program: Program, device: torch.device):
        self.program = program
        self.device = device
        self.graph = program.graph
        self.symbols = self.graph.symbols
        self.in_spec = program.in_spec
        self.slots = program.inputs
        self.static = not self.symbols
        # Per tensor slot: (flat position, graph input, static shape or None)
        self.tensor_checks = []
        for pos, slot in enumerate(self.slots):
            if slot.kind == "tensor":
                v = self.graph.inputs[slot.index]
                static = tuple(v.meta.shape) if v.meta.is_static else None
                self.tensor_checks.append((pos, slot, v.meta, static))
        # Dims that are a multiple of one symbol plus a constant (8*k, 2*s0 + 1): (name, a, b). A size
        # there must be of that form in the symbol's range; it binds the symbol when nothing did before.
        self.linear = {(pos, i): lin for pos, slot, meta, static in self.tensor_checks if static is None
                       for i, d in enumerate(meta.shape) if isinstance(d, SymDim) and not d.is_symbol
                       for lin in [_linear(d)] if lin is not None}
        self.guards = _parse_guards(program.info.get("guards", []), self.symbols)
        self._guards_held: set[tuple] = set()     # the bindings every guard held for
        # Inputs the model writes in place (x.add_(1)): the caller's tensor receives the new value.
        pos_by_input = {slot.index: pos for pos, slot in enumerate(self.slots) if slot.kind == "tensor"}
        self.mutated = {pos_by_input[self.graph.inputs.index(t)] for t, _ in self.graph.mutations
                        if t.role == "input" and t in self.graph.inputs}

    def _fail(self, pos: int, what: str, expected: str, got: str, fix: str = "") -> InputError:
        slot = self.slots[pos]
        msg = f"input {pos} ({slot.name}): {what}; expected {expected}, got {got}"
        return InputError(msg + (f". {fix}" if fix else ""))

    def flatten(self, args: tuple, kwargs: dict) -> list:
        leaves, spec = pytree.tree_flatten((args, kwargs))
        if spec != self.in_spec:
            self._name_the_odd_argument(args, kwargs)
            n_expected = len(self.slots)
            names = ", ".join(s.name for s in self.slots) or "none"
            raise InputError(
                f"inputs do not match the exported call: expected {n_expected} input(s) structured as "
                f"{spec_structure(self.in_spec)}, got {len(leaves)} structured as {spec_structure(spec)}. "
                f"Pass the inputs as at export ({names}), with the same positional and keyword structure")
        return leaves

    def _name_the_odd_argument(self, args: tuple, kwargs: dict) -> None:
        """When the call has the exported arguments but one of them is structured differently (a list
        where a tensor was), raise naming that input rather than the whole call."""
        want_args, want_kwargs = self.in_spec.children()
        if want_args.num_children != len(args) or want_kwargs.context != list(kwargs):
            return
        pos = 0
        for want, given in zip([*want_args.children(), *want_kwargs.children()], [*args, *kwargs.values()]):
            got_spec = pytree.tree_flatten(given)[1]
            if got_spec != want:
                if want.num_leaves == 1 and pos < len(self.slots) and self.slots[pos].kind == "tensor":
                    meta = self.graph.inputs[self.slots[pos].index].meta
                    raise self._fail(pos, "not a tensor", _spec_text(meta, self.symbols), _got_text(given),
                                     f"Pass a tensor (torch.as_tensor(x, dtype={meta.dtype}))")
                return
            pos += want.num_leaves

    def check(self, leaves: list) -> dict[str, int]:
        """Raise InputError naming the first bad input; return symbol bindings."""
        bindings: dict[str, int] = {}
        bound_by: dict[str, str] = {}
        for pos, slot, meta, static in self.tensor_checks:
            x = leaves[pos]
            if not isinstance(x, torch.Tensor):
                raise self._fail(pos, "not a tensor", _spec_text(meta, self.symbols), _got_text(x),
                                 f"Pass a tensor (torch.as_tensor(x, dtype={meta.dtype}))")
            if x.dtype != meta.dtype:
                raise self._fail(pos, "wrong dtype", _spec_text(meta, self.symbols), _got_text(x),
                                 f"Convert it with .to({meta.dtype})")
            if x.device != self.device and not (x.device.type == self.device.type and self.device.index is None):
                raise self._fail(pos, "wrong device", f"a tensor on {self.device}", _got_text(x),
                                 f"Move it with .to('{self.device}')")
            if x.dim() != meta.rank:
                raise self._fail(pos, "wrong rank", _spec_text(meta, self.symbols), _got_text(x),
                                 f"Pass a {meta.rank}-dimensional tensor (reshape, or unsqueeze a batch dim)")
            if pos in self.mutated and torch._debug_has_internal_overlap(x) == 1:
                raise self._fail(pos, "written in place by the model, but its elements share memory",
                                 "a tensor whose elements are distinct", _got_text(x) + f" with strides "
                                 f"{list(x.stride())}", "Pass x.clone() (an expanded tensor cannot be written)")
            if static is not None:
                if tuple(x.shape) != static:
                    raise self._fail(pos, "wrong shape", _spec_text(meta, self.symbols), _got_text(x),
                                     "Re-export with dynamic_shapes (torch.export.Dim) for sizes that vary")
                continue
            for i, d in enumerate(meta.shape):
                size = x.shape[i]
                if isinstance(d, int):
                    if size != d:
                        raise self._fail(pos, f"dim {i} is {size}, not {d}", _spec_text(meta, self.symbols),
                                         _got_text(x), "Re-export with dynamic_shapes for sizes that vary")
                elif d.is_symbol:
                    name = d.symbols[0]
                    if name in bindings and bindings[name] != size:
                        raise self._fail(pos, f"dim {i} is {size} but {name} = {bindings[name]} from "
                                              f"{bound_by[name]}", _spec_text(meta, self.symbols), _got_text(x),
                                         "These sizes must be equal, as they were at export")
                    r = self.symbols[name]
                    if size < r.min or (r.max is not None and size > r.max):
                        raise self._fail(pos, f"dim {i} = {size} is outside the range of {name}",
                                         _spec_text(meta, self.symbols), _got_text(x),
                                         "Re-export with a wider torch.export.Dim range")
                    bindings[name] = size
                    bound_by[name] = f"input {pos} dim {i}"
                elif (pos, i) in self.linear:
                    name, a, b = self.linear[pos, i]
                    value, rest = divmod(size - b, a)
                    r = self.symbols[name]
                    if rest or value < r.min or (r.max is not None and value > r.max):
                        raise self._fail(pos, f"dim {i} = {size} is not {d} for {r}", _spec_text(meta, self.symbols),
                                         _got_text(x), "Pass a size of that form, or re-export with another Dim")
                    if name not in bindings:
                        bindings[name] = value
                        bound_by[name] = f"input {pos} dim {i}"
        for pos, slot in enumerate(self.slots):
            x = leaves[pos]
            if slot.kind == "scalar":
                meta: ScalarMeta = self.graph.inputs[slot.index].meta
                if not isinstance(x, (int, float, bool)) or isinstance(x, bool) != (meta.kind is bool) \
                        or (meta.kind is int and not isinstance(x, int)):
                    raise self._fail(pos, "wrong type", f"a Python {meta.kind.__name__}", _got_text(x),
                                     f"Pass a value of type {meta.kind.__name__}, as at export")
                if meta.kind is int and meta.expr is not None and meta.expr.is_symbol:
                    name = meta.expr.symbols[0]
                    r = self.symbols.get(name)
                    if r is not None and (x < r.min or (r.max is not None and x > r.max)):
                        raise self._fail(pos, f"{x} is outside the range of {name}", f"an int with {r}",
                                         _got_text(x), "Pass a value in that range, or re-export with a "
                                                       "wider range")
                    if name in bindings and bindings[name] != x:
                        raise self._fail(pos, f"{x} but {name} = {bindings[name]} from {bound_by[name]}",
                                         f"an int equal to {name}", _got_text(x),
                                         "These sizes must be equal, as they were at export")
                    bindings[name] = int(x)
                    bound_by[name] = f"input {pos}"
            elif slot.kind == "constant":
                if not _same_constant(x, slot.value):
                    raise self._fail(pos, "differs from the value baked in at export", repr(slot.value),
                                     _got_text(x), "Pass the exported value, or re-export with this one")
        if not self.static:
            self._check_derived(leaves, bindings)
            if self.guards:
                self._check_guards(bindings)
        return bindings

    def _check_guards(self, bindings: dict[str, int]) -> None:
        """The conditions torch.export assumed of the sizes (frontend/export.size_guards), checked once
        per set of sizes."""
        key = tuple(sorted(bindings.items()))
        if key in self._guards_held:
            return
        for rel, lhs, rhs in self.guards:
            if not all(s in bindings for s in (*lhs.symbols, *rhs.symbols)):
                continue
            a, b = lhs.evaluate(bindings), rhs.evaluate(bindings)
            if not _RELATIONS[rel](a, b):
                labels = {k: self.symbols[k].label for k, _ in key}
                sizes = ", ".join(f"{k} ({labels[k]}) = {v}" if labels[k] and labels[k] != k else f"{k} = {v}"
                                  for k, v in key)
                raise InputError(
                    f"input sizes {sizes} break {lhs} {rel} {rhs}, which the model's export assumed "
                    f"(torch.export took one side of a branch on the sizes; here {lhs} = {a}, {rhs} = {b}). "
                    "Pass sizes that keep it, or re-export with an example of these sizes")
        if len(self._guards_held) < 4096:
            self._guards_held.add(key)

    def _check_derived(self, leaves: list, bindings: dict[str, int]) -> None:
        for pos, slot, meta, static in self.tensor_checks:
            if static is not None:
                continue
            for i, d in enumerate(meta.shape):
                if isinstance(d, SymDim) and not d.is_symbol:
                    if not all(s in bindings for s in d.symbols):
                        continue
                    want = d.evaluate(bindings)
                    if leaves[pos].shape[i] != want:
                        raise self._fail(pos, f"dim {i} must equal {d} = {want}",
                                         _spec_text(meta, self.symbols), _got_text(leaves[pos]),
                                         "Sizes derived from other inputs' sizes must keep the relation "
                                         "they had at export")


def _linear(d: SymDim) -> tuple[str, int, int] | None:
    """(symbol, a, b) when ``d`` is ``a*symbol + b`` with integers a > 0 and b, else None."""
    if len(d.symbols) != 1:
        return None
    import sympy
    sym = next(iter(d.expr.free_symbols))
    try:
        poly = sympy.Poly(d.expr, sym)
    except sympy.PolynomialError:
        return None
    coeffs = poly.all_coeffs()
    if poly.degree() != 1 or not all(c.is_Integer for c in coeffs) or coeffs[0] <= 0:
        return None
    return str(sym), int(coeffs[0]), int(coeffs[1])


_RELATIONS = {"==": operator.eq, "!=": operator.ne, "<=": operator.le, "<": operator.lt, ">=": operator.ge,
              ">": operator.gt}


def _parse_guards(raw, symbols) -> list[tuple[str, SymDim, SymDim]]:
    """The program's size guards as (relation, lhs, rhs); a malformed list (the file is untrusted input)
    raises ProgramFormatError rather than being skipped, which would run unchecked sizes."""
    out = []
    try:
        for rel, lhs, rhs in raw:
            if rel not in _RELATIONS:
                raise ValueError(f"unknown relation {rel!r}")
            guard = (rel, SymDim(lhs), SymDim(rhs))
            if not set(guard[1].symbols + guard[2].symbols) <= set(symbols):
                raise ValueError(f"{lhs} {rel} {rhs} names a size symbol the program does not have")
            out.append(guard)
    except (TypeError, ValueError) as e:
        raise ProgramFormatError(f"the program's size guards are malformed: {e}. Fix: re-export the "
                                 "model (the file was damaged or edited)") from None
    return out


def _same_constant(x: Any, v: Any) -> bool:
    try:
        return type(x) is type(v) and bool(x == v)
    except Exception:  # noqa: BLE001 - an uncomparable value is simply not the same
        return False
