"""Dead-code elimination: drop pure nodes none of whose outputs is used.

A Value is used when a kept node reads it, it is a graph output, or it is either side of a mutation.
One backward sweep reaches the fixed point: a node's readers all come after it. Impure nodes stay:
in-place writes have effects, and random ops stay too (dropping one would shift the random stream
of the ops after it, so results would no longer match eager under the same seed).
"""
from __future__ import annotations

from ..ir import Graph, get_op
from .rewrite import pinned_values


def eliminate_dead_code(g: Graph) -> Graph:
    live = pinned_values(g)
    kept = []
    for node in reversed(g.nodes):
        op = get_op(node.op)
        removable = op is not None and op.pure
        if removable and not any(o is not None and o.id in live for o in node.outputs):
            continue
        live.update(v.id for v in node.inputs)
        kept.append(node)
    kept.reverse()
    g.nodes = kept
    return g
