"""Attention written out eagerly becomes one attention node.

Models that need what ``F.scaled_dot_product_attention`` cannot do (Gemma 2's soft-capped scores), and
many written by hand, compute attention as

    scores = q @ k.transpose(-2, -1) * scale        # any number of multiplies / divides by numbers
    scores = tanh(scores / cap) * cap                # optional: the soft cap
    scores = scores + mask                           # optional
    probs = softmax(scores, dim=-1[, dtype=float32]).to(q.dtype)    # then an optional no-op dropout
    out = probs @ v

which torch.export gives as two ``bmm`` over [B*H, ...] views (k and v often through HF's repeat_kv)
with the pointwise ops between. This pass puts one node in their place:

- without a soft cap, ``aten.scaled_dot_product_attention(q, k, v, mask, scale=scale)`` (any length):
  fuse_sdpa then takes it as any other attention (the grouped heads' expansion, the masks) and torch's
  fused kernels run it instead of two matmuls and a softmax over materialised scores;
- with one, ``ost.softcap_attention(q, k, v, mask, None, scale, 1, False, cap)``, only for one query
  token (a decode step): fuse_sdpa makes it an ``ost.sdpa`` with ``softcap``, which the CUDA decode
  kernels compute (codegen/attention.py merges it with the step's cache writes). Longer queries keep the
  written-out form: no fused kernel with a soft cap is built, and the code generator already makes the
  pointwise chain and softmax one kernel.

The fused kernels compute the scores in fp32 where the eager form rounds each step to q's dtype: the
results differ by that rounding (as torch's own SDPA differs from the eager form). Every intermediate
must be read by the chain alone and not be a graph output or mutation value; otherwise nothing changes.
"""
from __future__ import annotations

from ...ir import Graph, Node, TensorMeta, Value
from ..rewrite import drop_nodes, pinned_values
from .sdpa import _int, _same

_RESHAPES = ("aten.view", "aten.reshape", "aten._unsafe_view")
_CAST_KWARGS = {"dtype", "layout", "device", "memory_format"}     # a cast or copy that keeps the values


def _tensor(v) -> bool:
    return isinstance(v, Value) and isinstance(v.meta, TensorMeta)


def _number(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


class _Chain:
    """The nodes a match absorbs, each checked to be its value's only reader."""

    def __init__(self, users, pinned: set[int]):
        self.users, self.pinned, self.nodes = users, pinned, []

    def only(self, v: Value, reader: Node) -> bool:
        readers = self.users.get(v.id, [])
        return v.id not in self.pinned and bool(readers) and all(r is reader for r in readers)

    def back(self, v: Value, reader: Node, ops) -> Node | None:
        """``v``'s producer when its op is in ``ops`` and ``reader`` alone reads ``v``; recorded."""
        node = v.producer if _tensor(v) else None
        if node is None or node.op not in ops or not self.only(v, reader):
            return None
        self.nodes.append(node)
        return node


def _unflatten(v: Value, chain: _Chain, reader: Node) -> Value | None:
    """The [B, H, ...] tensor ``v`` ([B*H, ...]) is a view of (through a no-op expand), when it is."""
    view = chain.back(v, reader, _RESHAPES)
    if view is None or not _tensor(view.args[0]):
        return None
    x = view.args[0]
    if x.producer is not None and x.producer.op == "aten.expand" and chain.only(x, view) \
            and all(_same(a, b) for a, b in zip(x.meta.shape, x.producer.args[0].meta.shape)):
        chain.nodes.append(x.producer)
        view, x = x.producer, x.producer.args[0]
    s = x.meta.shape
    if x.meta.rank != 4 or v.meta.rank != 3 or _int(s[0]) is None or _int(s[1]) is None \
            or _int(v.meta.shape[0]) != _int(s[0]) * _int(s[1]) \
            or not all(_same(a, b) for a, b in zip(v.meta.shape[1:], s[2:])):
        return None
    return x


def _scores(x: Value, chain: _Chain, reader: Node):
    """(s4, q4, kt4 source k4, scale, softcap, mask) walking back from the softmax's input ``x``."""
    mask, softcap, scale = None, None, 1.0
    node = chain.back(x, reader, ("aten.add.Tensor",))
    if node is not None:
        if len(node.args) != 2 or node.kwargs:
            return None
        a, b = node.args
        pick = [(a, b), (b, a)] if _tensor(b) else []
        for y, m in pick:       # the scores' operand is the one made by the chain's ops
            # an additive mask of the scores' own float dtype that does not broadcast them any larger (a
            # bool or integer tensor added is a number there, not SDPA's mask; another dtype would promote)
            if _tensor(m) and y.producer is not None and y.producer.op in (
                    "aten.mul.Tensor", "aten.div.Tensor", *_RESHAPES) and m.meta.rank <= 4 \
                    and m.meta.dtype == y.meta.dtype and y.meta.dtype.is_floating_point \
                    and len(x.meta.shape) == len(y.meta.shape) \
                    and all(_same(a, c) for a, c in zip(x.meta.shape, y.meta.shape)):
                mask, x, reader = m, y, node
                break
        else:
            return None
    # the soft cap: cap * tanh(s / cap)
    mul = x.producer if _tensor(x) else None
    if mul is not None and mul.op == "aten.mul.Tensor" and len(mul.args) == 2 and _tensor(mul.args[0]) \
            and mul.args[0].producer is not None and mul.args[0].producer.op == "aten.tanh":
        cap = _number(mul.args[1])
        tanh = mul.args[0].producer
        div = tanh.args[0].producer if _tensor(tanh.args[0]) else None
        if cap is None or cap <= 0 or div is None or len(div.args) != 2 or div.kwargs or not (
                (div.op == "aten.div.Tensor" and _number(div.args[1]) == cap)
                or (div.op == "aten.mul.Tensor" and _number(div.args[1]) is not None
                    and abs(_number(div.args[1]) * cap - 1) < 1e-12)):
            return None
        if chain.back(x, reader, ("aten.mul.Tensor",)) is None or chain.back(mul.args[0], mul, ("aten.tanh",)) is None \
                or chain.back(tanh.args[0], tanh, (div.op,)) is None:
            return None
        softcap, x, reader = cap, div.args[0], div
    while _tensor(x) and x.producer is not None and x.producer.op in ("aten.mul.Tensor", "aten.div.Tensor"):
        node = x.producer
        c = _number(node.args[1]) if len(node.args) == 2 and not node.kwargs else None
        if c is None or c == 0 or chain.back(x, reader, (node.op,)) is None:
            return None
        scale = scale * c if node.op == "aten.mul.Tensor" else scale / c
        x, reader = node.args[0], node
    s4 = x
    view = chain.back(s4, reader, _RESHAPES)
    if view is None or not _tensor(view.args[0]) or s4.meta.rank != 4:
        return None
    bmm = chain.back(view.args[0], view, ("aten.bmm",))
    if bmm is None:
        return None
    q4 = _unflatten(bmm.args[0], chain, bmm)
    kt4 = _unflatten(bmm.args[1], chain, bmm)
    if q4 is None or kt4 is None:
        return None
    t = kt4.producer
    if t is None or not chain.only(kt4, chain.nodes[-1]):     # read by its flattening view (or expand)
        return None
    dims = [_int(d) for d in (t.args[1] if t.op == "aten.permute" else t.args[1:3])]
    if None in dims or (t.op, [d % 4 for d in dims]) not in (("aten.permute", [0, 1, 3, 2]),
                                                              ("aten.transpose.int", [2, 3]),
                                                              ("aten.transpose.int", [3, 2])):
        return None     # k's last two dims swapped, and nothing else
    chain.nodes.append(t)
    k4 = t.args[0]
    if not _tensor(k4) or k4.meta.rank != 4:
        return None
    return s4, q4, k4, scale, softcap, mask


def _match(g: Graph, pv: Node, users, pinned: set[int]):
    """(the attention node, the view node it needs, the output view it replaces, absorbed nodes) or None."""
    chain = _Chain(users, pinned)
    if len(pv.args) != 2 or pv.kwargs:
        return None
    out3 = pv.outputs[0]
    readers = users.get(out3.id, [])
    if len(readers) != 1 or readers[0].op not in _RESHAPES or out3.id in pinned or readers[0].outputs[0].meta.rank != 4:
        return None
    out_view = readers[0]
    p4 = _unflatten(pv.args[0], chain, pv)
    if p4 is None:
        return None
    x, reader = p4, chain.nodes[-1]
    for op in ("aten.clone", "aten._to_copy"):      # dropout (no-op), then the cast back to q's dtype
        node = x.producer if _tensor(x) else None
        if node is not None and node.op == op and set(node.kwargs) <= _CAST_KWARGS \
                and len(node.args) == 1 and chain.back(x, reader, (op,)) is not None:
            x, reader = node.args[0], node
    sm = chain.back(x, reader, ("aten._softmax",))
    if sm is None or len(sm.args) != 3 or _int(sm.args[1]) is None or _int(sm.args[1]) % 4 != 3 or sm.args[2]:
        return None
    x, reader = sm.args[0], sm
    cast = x.producer if _tensor(x) else None
    if cast is not None and cast.op == "aten._to_copy" and set(cast.kwargs) <= _CAST_KWARGS \
            and chain.back(x, reader, ("aten._to_copy",)) is not None:
        x, reader = cast.args[0], cast
    found = _scores(x, chain, reader)
    if found is None:
        return None
    s4, q4, k4, scale, softcap, mask = found
    # v: [B, H, S, D], or HF's repeat_kv 5-D copy [B, Hkv, n_rep, S, D] flattened straight to [B*H, S, D]
    v3 = pv.args[1]
    view = chain.back(v3, pv, _RESHAPES)
    if view is None or not _tensor(view.args[0]):
        return None
    src = view.args[0]
    b, h, t, d = q4.meta.shape
    if src.meta.rank == 5 and _int(src.meta.shape[1]) is not None and _int(src.meta.shape[2]) is not None \
            and _int(src.meta.shape[1]) * _int(src.meta.shape[2]) == _int(h):
        v4_node = Node("aten.view", (src, [*src.meta.shape[:1], h, *src.meta.shape[3:]]), {}, f"{pv.name}_values",
                       pv.source)
        v4_node.outputs = [g.new_value(v4_node.name, TensorMeta(src.meta.dtype, (src.meta.shape[0], h,
                                                                                   *src.meta.shape[3:])),
                                       "temp", v4_node)]
        v4 = v4_node.outputs[0]
    elif src.meta.rank == 4:
        v4_node, v4 = None, src
    else:
        return None
    shapes_ok = (all(_same(a, c) for a, c in zip(k4.meta.shape, v4.meta.shape))
                 and _same(k4.meta.shape[-1], d) and _same(k4.meta.shape[1], h) and _same(k4.meta.shape[0], b)
                 and all(_same(a, c) for a, c in zip(s4.meta.shape, (b, h, t, k4.meta.shape[2]))))
    result = out_view.outputs[0]      # the output view must be the [B, H, T, D] the attention gives
    shapes_ok = shapes_ok and result.meta.rank == 4 and all(
        _same(a, c) for a, c in zip(result.meta.shape, (b, h, t, v4.meta.shape[-1])))
    if not shapes_ok or (softcap is not None and _int(t) != 1):
        return None
    if len({q4.meta.dtype, k4.meta.dtype, v4.meta.dtype, out3.meta.dtype}) != 1 or not q4.meta.dtype.is_floating_point:
        return None
    if softcap is None:
        node = Node("aten.scaled_dot_product_attention", (q4, k4, v4, mask, 0.0, False), {"scale": scale},
                    pv.name, pv.source)
    else:
        node = Node("ost.softcap_attention", (q4, k4, v4, mask, None, scale, 1, False, softcap), {}, pv.name,
                    pv.source)
    node.outputs = [result]
    return node, v4_node, out_view, chain.nodes + [pv]


def fuse_eager_attention(g: Graph) -> Graph:
    users = g.users()
    pinned = pinned_values(g)
    replacement: dict[int, list[Node]] = {}
    absorbed: set[int] = set()
    for node in list(g.nodes):
        if node.op != "aten.bmm" or id(node) in absorbed:
            continue
        m = _match(g, node, users, pinned)
        if m is None or any(id(n) in absorbed for n in m[3]):
            continue
        attention, v4_node, out_view, nodes = m
        attention.outputs[0].producer = attention
        replacement[id(out_view)] = [n for n in (v4_node, attention) if n is not None]
        absorbed.update(id(n) for n in nodes)
    if replacement:
        g.nodes = [x for n in g.nodes for x in replacement.get(id(n), [n])]
        drop_nodes(g, absorbed)
    return g
