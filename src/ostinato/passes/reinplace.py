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


def reinplace_state_writes(g: Graph) -> Graph:
    # One forward sweep: which state buffers each value may alias (views of views), and the last
    # node reading each buffer through any alias.
    targets = {target.id for target, _ in g.mutations}
    roots: dict[int, frozenset[int]] = {t: frozenset((t,)) for t in targets}
    last_read: dict[int, int] = {}
    for i, node in enumerate(g.nodes):
        hit = frozenset().union(*(roots.get(v.id, ()) for v in node.inputs))
        if not hit:
            continue
        for t in hit:
            last_read[t] = i
        opdef = get_op(node.op)
        if opdef is not None and opdef.category == "view":
            for o in node.outputs:
                if o is not None:
                    roots[o.id] = hit
    index = {id(n): i for i, n in enumerate(g.nodes)}
    aliased_outputs = {t for v in g.output_values() if v.id not in targets for t in roots.get(v.id, ())}
    for target, new in g.mutations:
        node = new.producer
        if node is None or node.op not in INPLACE or not node.args or node.args[0] is not target:
            continue
        later_reads = last_read.get(target.id, -1) > index[id(node)]
        other_args = any(target.id in roots.get(v.id, ()) for v in node.inputs[1:])
        if later_reads or other_args or target.id in aliased_outputs:
            continue
        node.op = INPLACE[node.op]
    return g
