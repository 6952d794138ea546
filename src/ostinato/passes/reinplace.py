"""Write state in place: ``new = index_put(state, ...)`` with ``state <- new`` becomes ``index_put_``.

torch.export functionalizes a model's buffer writes: each ``cache.index_copy_(...)`` becomes a
functional op that copies the whole buffer, and the runtime copies the result back into the buffer.
When nothing reads the old contents afterwards (the buffer, or any view of it, after the write), the
op can run in place on the buffer and both copies disappear; the runtime sees the new value *is* the
state tensor and skips the copy-back.
"""
from __future__ import annotations

from ..ir import Graph, Value, get_op

INPLACE = {
    "aten.index_put": "aten.index_put_",
    "aten.index_copy": "aten.index_copy_",
    "aten.copy": "aten.copy_",
    "ost.kv_update": "ost.kv_update_",
}


def _aliases(g: Graph, base: Value, upto: int) -> set[int]:
    """Ids of ``base`` and every value that may alias it (views of views) among the first ``upto`` nodes."""
    ids = {base.id}
    for node in g.nodes[:upto]:
        opdef = get_op(node.op)
        if opdef is not None and opdef.category == "view" and any(v.id in ids for v in node.inputs):
            ids.update(o.id for o in node.outputs if o is not None)
    return ids


def reinplace_state_writes(g: Graph) -> Graph:
    index = {id(n): i for i, n in enumerate(g.nodes)}
    outputs = {v.id for v in g.output_values()}
    for target, new in g.mutations:
        node = new.producer
        if node is None or node.op not in INPLACE or not node.args or node.args[0] is not target:
            continue
        pos = index[id(node)]
        aliases = _aliases(g, target, pos)
        later_reads = any(v.id in aliases for n in g.nodes[pos + 1:] for v in n.inputs)
        other_args = any(v.id in aliases for v in node.inputs[1:])
        if later_reads or other_args or (aliases - {target.id}) & outputs:
            continue
        node.op = INPLACE[node.op]
    return g
