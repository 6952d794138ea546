"""Instantiate a block's IR at each of its call sites (regional export's second half).

The model's graph holds one ``ostinato_regional::call`` per block call. Each becomes a copy of the
block's nodes, converted once from its own ExportedProgram, with the block's inputs bound to the
call's values, its parameters and buffers to the instance's (named by their full path, as a full
export names them), its size symbols to the caller's, and its buffer mutations to the call's extra
outputs.
"""
from __future__ import annotations

import re

import sympy
import torch

from ..ir import Graph, ScalarMeta, SymDim, TensorMeta, Value
from ..ir.graph import map_values
from ..ir import verify
from .kinds import CallRecord
from .regional import BlockExport, _hint

PREFIX = "block."
_SUFFIX = re.compile(r"_\d+$")


class Block:
    """A block's IR, converted once, and how its inputs' sizes name symbols."""

    def __init__(self, export: BlockExport, convert):
        self.graph, self.weights, self.state_init, self.slots = convert(export.ep)
        self.outer_syms = export.outer_syms

        if any(s.kind != "tensor" for s in self.slots):
            raise ValueError("a block's inputs are tensors only")
        # The block's own symbol at each (input, dim), to be replaced by the caller's.
        ep = export.ep
        phs = [n for n in ep.graph.nodes if n.op == "placeholder"]
        user = [ph for spec, ph in zip(ep.graph_signature.input_specs, phs)
                if spec.kind.name == "USER_INPUT"]
        self.input_syms: list[list[str | None]] = []
        hints: dict[str, int] = {}
        for ph in user:
            val = ph.meta.get("val")
            names = []
            for d in getattr(val, "shape", ()):
                e = d.node.expr if isinstance(d, torch.SymInt) else None
                names.append(str(e) if e is not None and e.is_Symbol else None)
                if names[-1] is not None:
                    hints[names[-1]] = _hint(d)
            self.input_syms.append(names)
        # Every shape re-derived once per block, not once per instance (export checks the whole graph's
        # structure; its instances of this graph differ only in their weights and symbols' names).
        verify(self.graph, check_shapes=True, hints=hints)


def _sub_dim(d, subs):
    if isinstance(d, int) or not subs:
        return d
    e = d.expr.xreplace(subs)
    return int(e) if e.is_number else SymDim(e)


def _sub_meta(m, subs):
    if not subs or m is None:
        return m
    if isinstance(m, TensorMeta):
        return TensorMeta(m.dtype, tuple(_sub_dim(d, subs) for d in m.shape))
    if isinstance(m, ScalarMeta) and m.expr is not None:
        d = _sub_dim(m.expr, subs)
        return ScalarMeta(m.kind, d if isinstance(d, SymDim) else None)
    return m


def _lookup(module: torch.nn.Module, rel: str):
    try:
        obj = module
        for part in rel.split("."):
            obj = getattr(obj, part)
        return obj if isinstance(obj, torch.Tensor) else None
    except AttributeError:
        return None


def _symbol_source(g: Graph, name: str) -> tuple[Value, int] | None:
    """The first model input (and dim) whose size is the bare symbol ``name``."""
    for v in g.inputs:
        if isinstance(v.meta, TensorMeta):
            for i, d in enumerate(v.meta.shape):
                if isinstance(d, SymDim) and d.is_symbol and d.symbols[0] == name:
                    return v, i
    return None


def instantiate(conv, block: Block, rec: CallRecord, inputs: list[Value], real: dict) -> list[Value]:
    """Add ``block``'s nodes to ``conv.g`` for call ``rec``; return the call's outputs (the block's
    tensor outputs, then the new value of each buffer it mutates, in ``rec.out.mutated`` order)."""
    g: Graph = conv.g
    bg = block.graph
    subs: dict = {}
    for v, names in zip(inputs, block.input_syms):
        for d, name in zip(v.meta.shape, names):
            if name is not None:
                subs[sympy.Symbol(name, integer=True, positive=True)] = d.expr if isinstance(d, SymDim) \
                    else sympy.Integer(d)
    # SymDim parses its text: match the block's symbols by name, whatever their assumptions.
    subs = {s: e for s in {s for v in bg.inputs for d in getattr(v.meta, "shape", ())
                           if isinstance(d, SymDim) for s in d.expr.free_symbols}
            for k, e in subs.items() if str(s) == str(k)}
    env: dict[int, Value] = {}
    for v, outer in zip(bg.inputs, inputs):
        env[v.id] = outer
    for v in bg.constants + bg.state:
        rel = v.name[len(PREFIX):] if v.name.startswith(PREFIX) else v.name
        full = f"{rec.path}.{rel}"
        if v.role == "state":
            current = conv.state_now.get(full) or conv.named.get(full)
            if current is None:
                current = conv.named[full] = g.new_value(full, v.meta, "state")
                conv.state_init[full] = real.get(rel, block.state_init[v.name]).detach()
            env[v.id] = current
            continue
        current = conv.named.get(full)
        if current is None:
            tensor = real.get(rel)
            if tensor is None:
                tensor = _lookup(rec.module, rel)
            if tensor is None:
                tensor = block.weights[v.name]   # a constant the forward created: the same for every call
            current = conv.named[full] = g.new_value(full, v.meta, "constant")
            conv.weights[full] = tensor.detach()
        env[v.id] = current
    get = lambda v: env[v.id]  # noqa: E731
    for node in bg.nodes:
        args = map_values(node.args, get)
        kwargs = map_values(node.kwargs, get)
        metas = [None if o is None else _sub_meta(o.meta, subs) for o in node.outputs]
        if node.op == "aten.sym_size.int" and metas[0] is not None and metas[0].expr is not None \
                and metas[0].expr.is_symbol:
            # A size read from the block's own input (the mask, say) would keep that input alive where
            # the model no longer needs it: read it from the model's input as a full export does.
            src = _symbol_source(g, metas[0].expr.symbols[0])
            if src is not None:
                args = src
        new = g.add_node(node.op, args, kwargs, metas, node.name, node.source)
        for o, n in zip(node.outputs, new.outputs):
            if o is not None:
                env[o.id] = n
    outs = [env[o.id] if isinstance(o, Value) else o for o in bg.outputs]
    by_target = {t.name[len(PREFIX):] if t.name.startswith(PREFIX) else t.name: env[n.id]
                 for t, n in bg.mutations}
    for rel in rec.out.mutated:
        value = by_target[rel]
        conv.state_now[f"{rec.path}.{rel}"] = value
        outs.append(value)
    conv.block_values.update(id(v) for v in outs if isinstance(v, Value))
    return outs


def canonical_order(g: Graph, model: torch.nn.Module) -> None:
    """Constants and state in the order a full export lists them (parameters, then buffers, each in
    the model's order, then other constants), every value's id in that order, then the inputs' and
    the nodes' outputs, and the nodes named again in order as torch.fx names them (``add``, ``add_1``,
    ...; a regional export's nodes come from several fx graphs): the same model gives the same graph,
    regional or not."""
    rank = {name: i for i, (name, _) in enumerate(model.named_parameters())}
    rank.update({name: len(rank) + i for i, (name, _) in enumerate(model.named_buffers())})
    placeholders = sorted(g.constants + g.state, key=lambda v: (rank.get(v.name, len(rank)), v.id))
    g.constants = [v for v in placeholders if v.role == "constant"]
    g.state = [v for v in placeholders if v.role == "state"]
    next_id = 0
    for v in placeholders + g.inputs + g.temps():
        v.id = next_id
        next_id += 1
    g._next_id = next_id
    namer = torch.fx.graph._Namespace()
    for v in g.inputs:
        namer.create_name(v.name, None)
    for node in g.nodes:
        node.name = namer.create_name(_SUFFIX.sub("", node.name), None)
        outs = node.outputs
        for i, o in enumerate(outs):
            if o is not None:
                o.name = node.name if len(outs) == 1 else f"{node.name}.{i}"
