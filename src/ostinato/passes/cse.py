"""Common-subexpression elimination by value numbering.

Two nodes compute the same thing when they run the same pure op on the same arguments: Values are
compared by identity (after earlier merges, so whole duplicated subgraphs collapse in one forward
sweep), constants structurally and *by type* (``1``, ``1.0`` and ``True`` promote differently),
floats by their bits (``0.0`` and ``-0.0`` give different results; ``==`` would merge them).
Random and host-syncing ops are never merged: two ``torch.rand`` calls must draw different numbers.
"""
from __future__ import annotations

import struct
from typing import Any, Hashable

import torch

from ..ir import Graph, Node, Value, get_op
from .rewrite import Replacements, drop_nodes, pinned_values, substitute, substitute_graph_refs, volatile_values

_OPAQUE = (torch.dtype, torch.device, torch.layout, torch.memory_format)


class _Unkeyable(Exception):
    """An argument with no structural identity we trust (the node is then never merged)."""


def structural_key(obj: Any) -> Hashable:
    if isinstance(obj, Value):
        return ("%", obj.id)
    if obj is None or isinstance(obj, (bool, int, str)):
        return (type(obj).__name__, obj)
    if isinstance(obj, float):
        return ("float", struct.pack("<d", obj))
    if isinstance(obj, complex):
        return ("complex", struct.pack("<dd", obj.real, obj.imag))
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, tuple(structural_key(o) for o in obj))
    if isinstance(obj, dict):
        return ("dict", tuple(sorted((str(k), structural_key(o)) for k, o in obj.items())))
    if isinstance(obj, _OPAQUE):
        return (type(obj).__name__, str(obj))
    raise _Unkeyable(type(obj).__name__)


def _mergeable(node: Node, volatile: set[int]) -> bool:
    op = get_op(node.op)
    if op is None or not op.pure or op.random or op.host_sync:
        return False
    return not any(v.id in volatile for v in node.inputs)


def _node_key(node: Node) -> Hashable | None:
    try:
        metas = tuple(None if o is None else str(o.meta) for o in node.outputs)
        return (node.op, structural_key(node.args), structural_key(node.kwargs), metas)
    except _Unkeyable:
        return None


def eliminate_common_subexpressions(g: Graph) -> Graph:
    pinned = pinned_values(g)
    volatile = volatile_values(g)
    table: dict[Hashable, Node] = {}
    mapping: Replacements = {}
    dead: set[int] = set()
    for node in g.nodes:
        substitute(node, mapping)
        if not _mergeable(node, volatile):
            continue
        key = _node_key(node)
        if key is None:
            continue
        first = table.get(key)
        if first is None:
            table[key] = node
            continue
        # A node producing a graph output or a mutation value stays, so two outputs never alias.
        if any(o is not None and o.id in pinned for o in node.outputs):
            continue
        if any((o is None) != (f is None) for o, f in zip(node.outputs, first.outputs)):
            continue
        for o, f in zip(node.outputs, first.outputs):
            if o is not None:
                mapping[o.id] = f
        dead.add(id(node))
    substitute_graph_refs(g, mapping)
    drop_nodes(g, dead)
    return g
