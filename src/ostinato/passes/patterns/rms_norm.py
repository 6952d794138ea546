"""``ost.rms_norm``: absorbs pow(2) → mean(-1, keepdim) → add(eps) → rsqrt → mul(x, ·), the optional
upcast around it (HF's ``x.to(float32)`` … ``.to(input_dtype)``) and the weight multiply after it.

Absorbed: every node of the chain, provided each intermediate has exactly one reader and is not a
graph output or mutation value. Kept: ``x`` and the weight (whatever produces them).
"""
from __future__ import annotations

from ...ir import Graph, Node, TensorMeta, Value
from ..rewrite import drop_nodes, pinned_values


def _only_user(users: dict[int, list[Node]], v: Value, pinned: set[int]) -> Node | None:
    readers = users.get(v.id, [])
    if len(readers) != 1 or v.id in pinned:
        return None
    return readers[0]


def _other(node: Node, v: Value):
    """The other operand of a binary node that reads ``v`` once."""
    a, b = node.args[0], node.args[1]
    if a is v and b is not v:
        return b
    if b is v and a is not v:
        return a
    return None


def _is_cast(node: Node | None) -> bool:
    """``_to_copy(x, dtype=…)`` with nothing but a dtype change."""
    return node is not None and node.op == "aten._to_copy" and len(node.args) == 1 \
        and set(node.kwargs) == {"dtype"}


def _match(g: Graph, pow_node: Node, users, pinned) -> tuple[list[Node], tuple, Value] | None:
    if pow_node.args[1:] != (2,) and pow_node.args[1:] != (2.0,):
        return None
    h = pow_node.args[0]
    if not isinstance(h, Value) or not isinstance(h.meta, TensorMeta) or h.meta.rank == 0:
        return None
    absorbed = [pow_node]
    mean = _only_user(users, pow_node.outputs[0], pinned)
    if mean is None or mean.op != "aten.mean.dim" or mean.args[1:] not in (([-1], True), ([h.meta.rank - 1], True)) \
            or mean.kwargs:
        return None
    add = _only_user(users, mean.outputs[0], pinned)
    if add is None or add.op != "aten.add.Tensor" or add.args[0] is not mean.outputs[0] \
            or not isinstance(add.args[1], (int, float)) or isinstance(add.args[1], bool) or add.kwargs:
        return None
    rsqrt = _only_user(users, add.outputs[0], pinned)
    if rsqrt is None or rsqrt.op != "aten.rsqrt":
        return None
    norm = _only_user(users, rsqrt.outputs[0], pinned)
    if norm is None or norm.op != "aten.mul.Tensor" or _other(norm, rsqrt.outputs[0]) is not h:
        return None
    absorbed += [mean, add, rsqrt, norm]
    x, compute_dtype, out = h, None, norm.outputs[0]
    up = h.producer
    # The upcast is absorbed only when pow and the normalizing mul are its sole readers.
    if _is_cast(up) and h.id not in pinned and isinstance(up.args[0], Value) and len(users.get(h.id, [])) == 2:
        down = _only_user(users, out, pinned)
        if _is_cast(down) and down.kwargs["dtype"] == up.args[0].meta.dtype:
            x, compute_dtype = up.args[0], up.kwargs["dtype"]
            absorbed = [up] + absorbed + [down]
            out = down.outputs[0]
    weight = None
    mul = _only_user(users, out, pinned)
    if mul is not None and mul.op == "aten.mul.Tensor":
        w = _other(mul, out)
        if isinstance(w, Value) and isinstance(w.meta, TensorMeta) and w.meta.rank == 1 \
                and str(w.meta.shape[0]) == str(x.meta.shape[-1]):
            weight = w
            absorbed.append(mul)
            out = mul.outputs[0]
    return absorbed, (x, weight, float(add.args[1]), compute_dtype), out


def fuse_rms_norm(g: Graph) -> Graph:
    users = g.users()
    pinned = pinned_values(g)  # intermediates must not be outputs; the chain's last value may be
    taken: set[int] = set()
    fused: list[tuple[list[Node], tuple, Value]] = []
    for node in g.nodes:
        if node.op == "aten.pow.Tensor_Scalar" and id(node) not in taken:
            m = _match(g, node, users, pinned)
            if m is not None and not any(id(n) in taken for n in m[0]):
                taken.update(id(n) for n in m[0])
                fused.append(m)
    if not fused:
        return g
    replacement: dict[int, Node] = {}
    for absorbed, args, out in fused:
        last = absorbed[-1]
        node = Node("ost.rms_norm", args, {}, last.name, last.source)
        node.outputs = [out]
        out.producer = node
        replacement[id(last)] = node
    g.nodes = [replacement.get(id(n), n) for n in g.nodes]
    drop_nodes(g, {id(n) for absorbed, _, _ in fused for n in absorbed[:-1]})
    return g

