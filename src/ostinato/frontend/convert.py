"""ExportedProgram (core ATen) → ostinato IR."""
from __future__ import annotations

import operator
import os
import re
from typing import Any

import sympy
import torch
import torch.fx
from torch.export import ExportedProgram
from torch.export.graph_signature import (ConstantArgument, InputKind, OutputKind, SymIntArgument,
                                          TensorArgument)

from ..errors import ExportError, UnsupportedOpError
from ..ir import Graph, ScalarMeta, SymbolRange, SymDim, TensorMeta, Value, get_op
from ..ir.fallback import register_fallback
from ..ir.ops import SYM_OPS, aten_name
from ..program import InputSlot

# Checks torch.export inserts for its own guards; the runtime validates inputs itself.
DROPPED_TARGETS = {
    "aten._assert_scalar", "aten._assert_tensor_metadata", "aten.sym_constrain_range_for_size",
    "aten.sym_constrain_range", "aten._assert_async.msg", "aten._assert_async",
    "aten._print",
}

_TORCH_DIR = os.path.dirname(torch.__file__)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)')


def _frames(trace: str) -> list[tuple[str, str, str]]:
    """(file, line, code) for each frame of a Python stack trace (code is "" when not shown)."""
    frames = []
    lines = trace.splitlines()
    for i, text in enumerate(lines):
        m = _FRAME.match(text)
        if m:
            nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
            code = "" if _FRAME.match(nxt) or not nxt else nxt
            frames.append((m.group("file"), m.group("line"), code))
    return frames


def source_line(fx_node: torch.fx.Node) -> str:
    """The innermost frame of the model's own code that produced ``fx_node``: ``file:line code``."""
    frames = _frames(fx_node.meta.get("stack_trace") or "")
    # Not torch's frames, nor code torch generated (``<eval_with_key>.5``: the graph of a torch.cond).
    own = [f for f in frames if not f[0].startswith(_TORCH_DIR) and not f[0].startswith("<")] \
        or [f for f in frames if not f[0].startswith(_TORCH_DIR)] or frames
    if not own:
        return ""
    file, line, code = own[-1]
    return f"{os.path.basename(file)}:{line} {code}".strip()


def _finite_int(x) -> int | None:
    """An int for a finite sympy bound, None for torch's int_oo / sympy's oo."""
    try:
        v = int(x)
    except Exception:  # noqa: BLE001 - int_oo and sympy's infinities raise various types
        return None
    return v if abs(v) < 2**62 else None


class _Converter:
    def __init__(self, ep: ExportedProgram, strict: bool, regions=None):
        self.ep = ep
        self.strict = strict
        self.g = Graph()
        self.env: dict[torch.fx.Node, Any] = {}
        self.unsupported: list[tuple[str, str]] = []
        self.higher_order = False
        # Regional export (inline.py): the blocks to instantiate at each opaque call, the constants and
        # state by name, each block-mutated buffer's newest value and the values block calls produced.
        self.regions = regions
        self.weights: dict[str, torch.Tensor] = {}
        self.literals: set[str] = set()      # the constants torch.export lifted (not parameters or buffers)
        self.state_init: dict[str, torch.Tensor] = {}
        self.named: dict[str, Value] = {}
        self.state_now: dict[str, Value] = {}
        self.block_values: set[int] = set()

    # -- metadata -------------------------------------------------------------------------------
    def _declare(self, sym: sympy.Symbol, vr=None) -> None:
        name = str(sym)
        if name in self.g.symbols:
            return
        lo = _finite_int(vr.lower) if vr is not None else None
        hi = _finite_int(vr.upper) if vr is not None else None
        self.g.symbols[name] = SymbolRange(name, 0 if lo is None else lo, hi)

    def _dim(self, d) -> int | SymDim:
        if isinstance(d, int):
            return d
        expr = d.node.expr
        if expr.is_number:
            return int(expr)
        for s in expr.free_symbols:
            self._declare(s, self.ep.range_constraints.get(s))
        return SymDim(expr)

    def meta_of(self, val: Any):
        if isinstance(val, torch.Tensor):
            return TensorMeta(val.dtype, tuple(self._dim(d) for d in val.shape))
        if isinstance(val, (torch.SymInt, int)) and not isinstance(val, bool):
            d = self._dim(val)
            return ScalarMeta(int, d if isinstance(d, SymDim) else None)
        if isinstance(val, (torch.SymBool, bool)):
            return ScalarMeta(bool)
        if isinstance(val, (torch.SymFloat, float)):
            return ScalarMeta(float)
        return None

    # -- graph ----------------------------------------------------------------------------------
    def arg(self, a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            v = self.env[a]
            if isinstance(v, list):
                raise ExportError(f"node {a.name} returns several values but is used as one")
            return v
        if isinstance(a, (list, tuple)):
            return [self.arg(x) for x in a]
        if isinstance(a, dict):
            return {k: self.arg(x) for k, x in a.items()}
        return a

    def convert_call(self, n: torch.fx.Node) -> None:
        t = n.target
        if self.regions is not None:
            if t is self.regions.op:
                self.env[n] = self.regions.instantiate(self, n)
                return
            if t is operator.getitem and n.args[0].target is self.regions.op:
                self.env[n] = self.env[n.args[0]][n.args[1]]
                return
            if t is torch.ops.aten.copy.default and isinstance(n.args[1], torch.fx.Node) \
                    and id(self.env.get(n.args[1])) in self.block_values:
                # The opaque call's stub copies a block's new buffer value into the buffer; a full export
                # has the value itself as the mutation.
                dst, src = self.arg(n.args[0]), self.arg(n.args[1])
                if dst.meta == src.meta:
                    self.env[n] = src
                    return
        if t is operator.getitem:
            src = self.env[n.args[0]]
            self.env[n] = src[n.args[1]] if isinstance(src, list) else None
            return
        if isinstance(t, torch._ops.OpOverload):
            name = aten_name(t)
        elif t in SYM_OPS:
            name = SYM_OPS[t]
        elif isinstance(t, torch._ops.HigherOrderOperator):
            name = f"higher_order.{t.name()}"
        else:
            name = getattr(t, "__qualname__", None) or repr(t)
        if name in DROPPED_TARGETS:
            return
        if get_op(name) is None:
            if self.strict or not isinstance(t, torch._ops.OpOverload):
                self.unsupported.append((name, source_line(n)))
                self.higher_order |= isinstance(t, torch._ops.HigherOrderOperator)
                self.env[n] = None
                return
            # An op ostinato lacks: the node runs it through eager torch (see ir/fallback.py).
            name = register_fallback(t).name
        val = n.meta.get("val")
        multi = isinstance(val, (tuple, list))
        metas = [self.meta_of(v) for v in val] if multi else [self.meta_of(val)]
        args = tuple(self.arg(a) for a in n.args)
        kwargs = {k: self.arg(a) for k, a in n.kwargs.items()}
        if name == "aten.index.Tensor":
            as_slice = self._index_as_slice(n)
            if as_slice is not None:
                name, args, kwargs = "aten.slice.Tensor", (args[0], *as_slice), {}
        node = self.g.add_node(name, args, kwargs, metas, n.name, source_line(n))
        self.env[n] = list(node.outputs) if multi else node.outputs[0]

    def _constant_tensor(self, a: Any) -> torch.Tensor | None:
        """The tensor of a lifted tensor constant (one the forward makes, or a plain tensor attribute),
        seen through copies of it. Not a parameter or buffer: a new checkpoint maps its own by name into
        a cached export (export_cache.py keys their shapes, not their values), so a graph must not hold
        their values."""
        copies = (torch.ops.aten.clone.default, torch.ops.aten.lift_fresh_copy.default)
        while isinstance(a, torch.fx.Node):
            if a.op == "placeholder":
                v = self.env.get(a)
                return self.weights.get(v.name) if isinstance(v, Value) and v.role == "constant" \
                    and v.name in self.literals else None
            if a.op != "call_function" or a.target not in copies or len(a.args) != 1:
                return None
            a = a.args[0]
        return None

    def _index_as_slice(self, n: torch.fx.Node) -> tuple | None:
        """``(dim, start, end, step)`` when ``x[..., idx, ...]`` with one constant 1-d integer index of
        consecutive positions (Falcon's ``fused_qkv[..., [-2], :]``) is a slice of x: a gather kernel and
        its index read become a view."""
        x, indices = n.args[0], n.args[1]
        where = [d for d, ix in enumerate(indices) if ix is not None]
        if len(where) != 1 or not isinstance(x, torch.fx.Node):
            return None
        d = where[0]
        idx = self._constant_tensor(indices[d])
        shape = getattr(x.meta.get("val"), "shape", None)
        if idx is None or idx.dim() != 1 or not 0 < idx.numel() <= 4096 \
                or idx.dtype not in (torch.int64, torch.int32) or shape is None or not isinstance(shape[d], int):
            return None
        size = shape[d]
        pos = [v + size if v < 0 else v for v in idx.tolist()]
        if not all(0 <= p < size for p in pos) or pos != list(range(pos[0], pos[0] + len(pos))):
            return None
        return d, pos[0], pos[0] + len(pos), 1

    def run(self):
        ep, g = self.ep, self.g
        sig = ep.graph_signature
        mutated_buffers = set(sig.buffers_to_mutate.values())
        placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
        weights, state_init = self.weights, self.state_init
        user_inputs: list[Value] = []
        slots: list[InputSlot] = []
        for spec, ph in zip(sig.input_specs, placeholders):
            val = ph.meta.get("val")
            if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                tensor = ep.state_dict.get(spec.target)
                if tensor is None:
                    tensor = ep.constants.get(spec.target)
                if not isinstance(tensor, torch.Tensor):
                    raise ExportError(f"{spec.kind.name.lower()} {spec.target!r} is not a tensor "
                                      f"({type(tensor).__name__}); ostinato supports tensor state only")
                tensor = tensor.detach()
                if spec.kind == InputKind.BUFFER and spec.target in mutated_buffers:
                    self.env[ph] = g.new_value(spec.target, self.meta_of(val), "state")
                    state_init[spec.target] = tensor
                else:
                    self.env[ph] = g.new_value(spec.target, self.meta_of(val), "constant")
                    weights[spec.target] = tensor
                    if spec.kind == InputKind.CONSTANT_TENSOR:
                        self.literals.add(spec.target)
                self.named[spec.target] = self.env[ph]
            elif spec.kind == InputKind.USER_INPUT:
                if isinstance(spec.arg, ConstantArgument):
                    slots.append(InputSlot(spec.arg.name, "constant", value=spec.arg.value))
                    continue
                kind = "tensor" if isinstance(spec.arg, TensorArgument) else "scalar"
                v = g.new_value(ph.name, self.meta_of(val), "input")
                self.env[ph] = v
                slots.append(InputSlot(ph.name, kind, len(user_inputs)))
                user_inputs.append(v)
            else:
                raise ExportError(f"input {ph.name} is a {spec.kind.name}, which ostinato does not support "
                                  "(custom objects and effect tokens); keep such state outside the model")
        for n in ep.graph.nodes:
            if n.op == "call_function":
                self.convert_call(n)
            elif n.op == "output":
                results = n.args[0]
        if self.unsupported:
            seen, ops = set(), []
            for item in self.unsupported:
                if item not in seen:
                    seen.add(item)
                    ops.append(item)
            raise UnsupportedOpError(ops, _unsupported_hint(self.strict, self.higher_order))
        for spec, r in zip(sig.output_specs, results):
            value = self.env.get(r) if isinstance(r, torch.fx.Node) else r
            if spec.kind == OutputKind.USER_OUTPUT:
                if isinstance(spec.arg, ConstantArgument):
                    g.outputs.append(spec.arg.value)
                else:
                    g.outputs.append(value)
            elif spec.kind == OutputKind.BUFFER_MUTATION:
                target = next(v for v in g.state if v.name == spec.target)
                g.mutations.append((target, value))
            elif spec.kind == OutputKind.USER_INPUT_MUTATION:
                target = next(v for v in g.inputs if v.name == spec.target)
                g.mutations.append((target, value))
            else:
                raise ExportError(f"output {spec.arg} is a {spec.kind.name}; ostinato exports inference "
                                  "graphs only (call model.eval() and export under torch.no_grad())")
        return g, weights, state_init, slots


def _unsupported_hint(strict: bool, higher_order: bool) -> str:
    if strict:
        return ("Fix: rewrite those lines with supported ops, register a decomposition for the op "
                "(torch.library / torch._decomp) so torch.export lowers it to core ATen ops, or export "
                "with strict=False to run such ops through eager torch between ostinato's plans.")
    more = (" Higher-order ops (torch.cond, while_loop, auto_functionalized: a torch.library op that "
            "mutates its arguments) cannot run through eager torch either; use torch.where for a "
            "cond, and custom ops that return new tensors instead of mutating arguments."
            if higher_order else "")
    return ("Only torch ops (OpOverloads, such as torch.library custom ops) can run through eager torch "
            "when ostinato lacks them." + more + " Fix: rewrite those lines with supported ops, or "
            "wrap the code in a torch.library.custom_op (with a fake implementation) so it runs eagerly.")


def convert(ep: ExportedProgram, strict: bool = False, regions=None):
    """Return (graph, weights, state_init, input_slots) for a core-ATen ExportedProgram.

    Ops ostinato lacks become ``fallback.*`` nodes that run through eager torch, unless ``strict``:
    then, as for ops that are not torch ops at all, UnsupportedOpError lists them with their source lines.
    ``regions`` (regional export) instantiates a block's IR at each of its opaque calls.
    """
    return _Converter(ep, strict, regions).run()


__all__ = ["convert", "source_line", "SymIntArgument"]
