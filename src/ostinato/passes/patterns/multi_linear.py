"""``ost.multi_linear``: sibling projections of one input as one op (q, k, v; gate and up), so a backend
runs one matmul over the weights laid out one after another (runtime/packing.py) instead of one each.
Absorbed: ``aten.linear(x, W_i[, b_i])`` nodes reading the same ``x`` whose weights are constants of
one dtype and input width, all with biases (constants) or none, no weight twice. A weight other nodes
read too may join one group (they read the packed buffer's view of it, the same values): DeBERTa's
key and query projections also project its shared relative embeddings. A group sharing a weight or a
bias with a group formed before it is not formed (packing places each weight in one buffer).
Kept: every output Value (the op returns them in order), and linears that do not fit.
"""
from __future__ import annotations

from ...ir import Graph, Node, TensorMeta, Value


def _weight(node: Node) -> tuple | None:
    if node.op != "aten.linear" or node.kwargs or not 2 <= len(node.args) <= 3:
        return None
    x, w = node.args[0], node.args[1]
    b = node.args[2] if len(node.args) > 2 else None
    if not isinstance(x, Value) or not isinstance(w, Value) or w.role != "constant" \
            or not isinstance(w.meta, TensorMeta) or w.meta.rank != 2:
        return None
    if b is not None and (not isinstance(b, Value) or b.role != "constant"):
        return None
    return x, w, b


def fuse_multi_linear(g: Graph) -> Graph:
    siblings: dict[tuple, list[Node]] = {}
    for node in g.nodes:
        found = _weight(node)
        if found is None:
            continue
        x, w, b = found
        key = (x.id, w.meta.dtype, str(w.meta.shape[1]), b is None, None if b is None else b.meta.dtype)
        siblings.setdefault(key, []).append(node)
    merged: dict[int, Node] = {}
    dead: set[int] = set()
    packed: set[int] = set()          # weights and biases of the groups formed so far
    for nodes in siblings.values():
        if len(nodes) < 2:
            continue
        x = nodes[0].args[0]
        weights = [n.args[1] for n in nodes]
        biases = None if len(nodes[0].args) < 3 or nodes[0].args[2] is None else [n.args[2] for n in nodes]
        ids = [v.id for v in weights + (biases or [])]
        if len(set(ids)) != len(ids) or packed & set(ids):
            continue
        packed.update(ids)
        fused = Node("ost.multi_linear", (x, weights, biases), {}, nodes[0].name, nodes[0].source)
        fused.outputs = [n.outputs[0] for n in nodes]
        for v in fused.outputs:
            v.producer = fused
        merged[id(nodes[0])] = fused
        dead.update(id(n) for n in nodes[1:])
    if merged:
        g.nodes = [merged.get(id(n), n) for n in g.nodes if id(n) not in dead]
    return g
