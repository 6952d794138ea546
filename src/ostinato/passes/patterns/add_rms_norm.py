"""``ost.add_rms_norm``: a residual ``add(a, b)`` whose sum an ``ost.rms_norm`` normalizes (the next
block's pre-norm reading the residual stream) becomes one node with two outputs, the sum and the norm:
one pass over each row instead of two. Runs after the rms_norm pattern, on the norms it made.
"""
from __future__ import annotations

from ...ir import Graph, Node, TensorMeta, Value
from ..rewrite import drop_nodes


def _same_tensor_meta(*vs) -> bool:
    """Tensors Values all of one shape and dtype."""
    if not all(isinstance(v, Value) and isinstance(v.meta, TensorMeta) for v in vs):
        return False
    return len({(tuple(str(d) for d in v.meta.shape), v.meta.dtype) for v in vs}) == 1


def fuse_add_rms_norm(g: Graph) -> Graph:
    """``ost.add_rms_norm``: a residual ``add(a, b)`` whose sum an ``ost.rms_norm`` normalizes becomes one
    node with two outputs, the sum (still read by whoever read it) and the norm.

    Fused only when the add is plain (no alpha, no broadcast, no dtype promotion: a, b and the sum
    alike) and the norm's weight exists where the add stands (a graph input, or produced before it),
    since the fused node takes the add's place. A sum read by several norms fuses with the first.
    """
    position = {id(n): i for i, n in enumerate(g.nodes)}
    replaced: dict[int, Node] = {}
    dropped: set[int] = set()
    for norm in g.nodes:
        if norm.op != "ost.rms_norm" or not isinstance(norm.args[0], Value):
            continue
        add = norm.args[0].producer
        if add is None or add.op != "aten.add.Tensor" or add.kwargs or len(add.args) != 2 or id(add) in replaced:
            continue
        a, b = add.args
        if not _same_tensor_meta(a, b, add.outputs[0]):
            continue
        weight = norm.args[1]
        if isinstance(weight, Value) and weight.producer is not None \
                and position.get(id(weight.producer), len(g.nodes)) >= position[id(add)]:
            continue
        node = Node("ost.add_rms_norm", (a, b) + tuple(norm.args[1:]), {}, norm.name, norm.source)
        node.outputs = [add.outputs[0], norm.outputs[0]]
        for v in node.outputs:
            v.producer = node
        replaced[id(add)] = node
        dropped.add(id(norm))
    if replaced:
        g.nodes = [replaced.get(id(n), n) for n in g.nodes]
        drop_nodes(g, dropped)
    return g
