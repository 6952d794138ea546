"""Checking a call's inputs against the exported spec, and binding size symbols from them."""
from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..errors import InputError
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
        return bindings

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


def _same_constant(x: Any, v: Any) -> bool:
    try:
        return type(x) is type(v) and bool(x == v)
    except Exception:  # noqa: BLE001 - an uncomparable value is simply not the same
        return False
