"""``ost.swiglu`` / ``ost.geglu``: absorbs ``act(gate) * up`` for act = silu or gelu.

Absorbed: the activation and the multiply, when the activation's result has no other reader and is
not a graph output. Kept: whatever produces ``gate`` and ``up`` (two projections, or one projection
whose output is split).
"""
from __future__ import annotations

from ...ir import Graph, Node
from ..rewrite import drop_nodes, pinned_values

ACTIVATIONS = {"aten.silu": "ost.swiglu", "aten.gelu": "ost.geglu"}


def fuse_gated_mlp(g: Graph) -> Graph:
    users = g.users()
    pinned = pinned_values(g)
    replacement: dict[int, Node] = {}
    absorbed: set[int] = set()
    for act in g.nodes:
        fused_op = ACTIVATIONS.get(act.op)
        if fused_op is None or id(act) in absorbed:
            continue
        h = act.outputs[0]
        readers = users.get(h.id, [])
        if len(readers) != 1 or h.id in pinned:
            continue
        mul = readers[0]
        if mul.op != "aten.mul.Tensor" or mul.kwargs or id(mul) in replacement:
            continue
        a, b = mul.args[0], mul.args[1]
        up = b if a is h else a if b is h else None
        if up is None or up is h or not hasattr(up, "meta") or str(up.meta) != str(h.meta):
            continue  # a broadcasting or scalar multiply is not a gated MLP
        args = (act.args[0], up)
        if fused_op == "ost.geglu":
            args += (act.kwargs.get("approximate", act.args[1] if len(act.args) > 1 else "none"),)
        node = Node(fused_op, args, {}, mul.name, mul.source)
        node.outputs = [mul.outputs[0]]
        mul.outputs[0].producer = node
        replacement[id(mul)] = node
        absorbed.add(id(act))
    if replacement:
        g.nodes = [replacement.get(id(n), n) for n in g.nodes]
        drop_nodes(g, absorbed)
    return g
