"""``ost.swiglu`` / ``ost.geglu``: absorbs ``act(gate) * up`` (either operand order) for act = silu or gelu.

Absorbed: the activation and the multiply, when the activation's result has no other reader and is
not a graph output. Kept: whatever produces ``gate`` and ``up``.

Packed form: when ``gate`` and ``up`` are the first and second halves of the last dim of one tensor
``h`` (one gate_up projection, split by ``split_with_sizes``/``split``/``chunk`` or by the slices
``[..., :n]`` and ``[..., n:]``), the split is absorbed too and the op is ``ost.swiglu_packed(h)`` /
``ost.geglu_packed(h, approximate)``, provided the halves have no other readers. Halves the other
way round (up first) stay a split feeding ``ost.swiglu``.
"""
from __future__ import annotations

from ...ir import Graph, Node, TensorMeta, Value
from ..rewrite import drop_nodes, pinned_values

ACTIVATIONS = {"aten.silu": "ost.swiglu", "aten.gelu": "ost.geglu"}
PACKED = {"ost.swiglu": "ost.swiglu_packed", "ost.geglu": "ost.geglu_packed"}
_SPLITS = ("aten.split_with_sizes", "aten.split.Tensor", "aten.chunk")
_END = 2 ** 62  # a slice end at least this large means "to the end" (export writes sys.maxsize)


def _last_dim(dim, rank: int) -> bool:
    return isinstance(dim, int) and not isinstance(dim, bool) and dim in (-1, rank - 1)


def _slice_bounds(node: Node) -> tuple | None:
    """(source, start, end) of ``aten.slice.Tensor`` over the last dim with step 1."""
    names = ("self", "dim", "start", "end", "step")
    bound = {"dim": 0, "start": None, "end": None, "step": 1, **dict(zip(names, node.args)), **node.kwargs}
    h = bound.get("self")
    if not isinstance(h, Value) or not isinstance(h.meta, TensorMeta) or bound["step"] != 1 \
            or not _last_dim(bound["dim"], h.meta.rank):
        return None
    return h, bound["start"], bound["end"]


def _packed_source(gate: Value, up: Value, users, pinned: set[int]) -> tuple[Value, list[Node]] | None:
    """``h`` and the split nodes when gate is h's first half and up its second, read only here."""
    if gate.id in pinned or up.id in pinned or len(users.get(gate.id, [])) != 1 \
            or len(users.get(up.id, [])) != 1 or str(gate.meta) != str(up.meta):
        return None
    split = gate.producer
    if split is None:
        return None
    if split.op in _SPLITS:
        h = split.args[0] if split.args else None
        dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
        if not isinstance(h, Value) or not isinstance(h.meta, TensorMeta) or not _last_dim(dim, h.meta.rank) \
                or split.outputs != [gate, up]:
            return None
        return h, [split]  # two outputs of equal shape along the last dim: the two halves
    if split.op != "aten.slice.Tensor" or up.producer is None or up.producer.op != "aten.slice.Tensor":
        return None
    first, second = _slice_bounds(split), _slice_bounds(up.producer)
    if first is None or second is None or first[0] is not second[0]:
        return None
    h, n, d = first[0], gate.meta.shape[-1], first[0].meta.shape[-1]
    end = second[2]
    to_end = end is None or (isinstance(end, int) and (end >= _END or str(end) == str(d)
                                                       or isinstance(d, int) and end >= d))
    if first[1] not in (0, None) or str(first[2]) != str(n) or str(second[1]) != str(n) or not to_end:
        return None
    return h, [split, up.producer]


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
        gate = act.args[0]
        packed = _packed_source(gate, up, users, pinned) if isinstance(gate, Value) else None
        if packed is not None:
            args, split_nodes = (packed[0],), packed[1]
            fused_op = PACKED[fused_op]
        else:
            args, split_nodes = (gate, up), []
        if fused_op in ("ost.geglu", "ost.geglu_packed"):
            args += (act.kwargs.get("approximate", act.args[1] if len(act.args) > 1 else "none"),)
        node = Node(fused_op, args, {}, mul.name, mul.source)
        node.outputs = [mul.outputs[0]]
        mul.outputs[0].producer = node
        replacement[id(mul)] = node
        absorbed.add(id(act))
        absorbed.update(id(n) for n in split_nodes)
    if replacement:
        g.nodes = [replacement.get(id(n), n) for n in g.nodes]
        drop_nodes(g, absorbed)
    return g
