"""Attention written out eagerly becomes one attention node.

Models that need what ``F.scaled_dot_product_attention`` cannot do (Gemma 2's soft-capped scores), and
many written by hand, compute attention as

    scores = q @ k.transpose(-2, -1) * scale        # any number of multiplies / divides by numbers
    scores = tanh(scores / cap) * cap                # optional: the soft cap
    scores = scores + bias + mask                    # optional, any number; or a boolean mask, below
    probs = softmax(scores, dim=-1[, dtype=float32]).to(q.dtype)    # then an optional no-op dropout
    out = probs @ v

which torch.export gives as two ``bmm`` over [B*H, ...] views (k and v often through HF's repeat_kv, k
and q possibly through the copy ``.contiguous()`` makes, k's transpose possibly one permute from
[B, S, H, D] as GPT-2's) with the pointwise ops between. This pass puts one node in their place:

- without a soft cap, ``aten.scaled_dot_product_attention(q, k, v, mask, scale=scale)`` (any length):
  fuse_sdpa then takes it as any other attention (the grouped heads' expansion, the masks) and torch's
  fused kernels run it instead of two matmuls and a softmax over materialised scores;
- with one, ``ost.softcap_attention(q, k, v, mask, None, scale, 1, False, cap)``, only for one query
  token (a decode step): fuse_sdpa makes it an ``ost.sdpa`` with ``softcap``, which the CUDA decode
  kernels compute (codegen/attention.py merges it with the step's cache writes). Longer queries keep the
  written-out form: no fused kernel with a soft cap is built, and the code generator already makes the
  pointwise chain and softmax one kernel.

A boolean mask written as ``scores.masked_fill(m, fill)`` (export gives ``where(m, fill, scores)``) or
``where(m, scores, fill)`` (GPT-2's old eager path) masks where the add would, or before the scale's
multiplies (not under the soft cap: tanh makes -inf a finite -cap, no mask). It is a mask only when the
value the softmax then sees in the scores' dtype (the fill, a number or a ``scalar_tensor`` / ``full``
constant, after the scale written after it) is -inf or at most ``finfo(dtype).min``; any other fill (0,
-1e4, a lifted tensor constant whose value the graph does not hold) is a value, and nothing changes.
``m`` must be torch.bool, of rank 2 to 4 (SDPA reads a mask's last two dims; a 1-D one fails there, added
or boolean), broadcasting to the scores without making them larger; one boolean mask per attention.

- -inf: the attention gets the boolean mask, True = visible: ``m`` for ``where(m, scores, fill)``, its
  negation for masked_fill (``x`` itself when ``m`` is ``~x``, else one ``bitwise_not`` made per mask and
  shared by the layers), which fuse_sdpa reads as positions or converts as any boolean mask. A query
  with no visible key is NaN in eager (softmax over -inf alone) and 0 from the attention (torch's SDPA
  and the CUDA kernels; the soft cap's reference keeps the NaN), as for an added -inf mask.
- finite (HF's ``finfo.min``): the additive mask ``where(m, fill, 0)`` (``where(m, 0, fill)``) in the
  scores' dtype, made once per mask and shared, as if the model had added it: a query with no visible
  key keeps eager's uniform weights (in fp32 and bf16 the fill swamps any score the fused kernels add it
  to in fp32; in fp16 -65504 does not, and such a row gets the softmax of its raw scores, as an added
  fp16 ``finfo.min`` mask does). A boolean mask would make that row 0.

Rows with a visible key are the same either way, up to the rounding below.

Biases added to the scores after the scale and the soft cap (ALiBi's ``slope_h * j``, a relative-position
bias, HF's causal mask) are the attention's mask, each a float tensor of rank 2 to 4 in the scores' dtype
that does not broadcast them larger (the scores are the operand computed from the product). They may
also be added to the [B*H, T, S] scores before these are viewed as [B, H, T, S]: BLOOM's
``alibi.baddbmm(q, k^T, beta=1, alpha=scale)`` over [B*H]-flattened heads, which export gives as
``bmm`` of q and k^T (k^T being k's [B*H, S, D] view transposed) cast to fp32, ``mul`` by alpha, ``add`` of
the fp32 bias and a cast back; a [B*H, ...] bias is viewed as [B, H, ...] for the attention. A bias added
before a scale (which would scale it) or under the soft cap keeps the written-out form. Several biases
and a boolean mask are summed into one mask in q's dtype, made once for every attention adding the same
(the layers share it). The mask is in q's dtype, so each bias must be one or an exact upcast of one (a
decomposed baddbmm's fp32 cast of the bf16 ALiBi): the attention never rounds what eager does not. Where
all terms but one hide keys (0 or ``finfo.min``, HF's causal mask), the sum is exact on the visible keys.

The masks made go right after the latest producer of what they are made from (first when those are
inputs), where fuse_sdpa puts its own.

The fused kernels compute the scores in fp32 where the eager form rounds each step to q's dtype, or rounds
its fp32 scores once (the casts around a decomposed baddbmm): the results differ by that rounding (as
torch's own SDPA differs from the eager form). Casts of the scores to a dtype at least as wide as q's may
stand anywhere in the chain (a boolean mask only after the last). Every intermediate must be read by the
chain alone and not be a graph output or mutation value; otherwise nothing changes.
"""
from __future__ import annotations

import math

import torch

from ...ir import Graph, Node, TensorMeta, Value
from ..rewrite import drop_nodes, pinned_values
from .attention_masks import _Masks
from .sdpa import _int, _same

_RESHAPES = ("aten.view", "aten.reshape", "aten._unsafe_view")
_CAST_KWARGS = {"dtype", "layout", "device", "memory_format"}     # a cast or copy that keeps the values
_MASKED = ("aten.where.self", "aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
_NOT = ("aten.bitwise_not", "aten.logical_not")
_SCALES = ("aten.mul.Tensor", "aten.div.Tensor")


def _tensor(v) -> bool:
    return isinstance(v, Value) and isinstance(v.meta, TensorMeta)


def _number(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _same_shape(a: Value, b: Value) -> bool:
    return a.meta.rank == b.meta.rank and all(_same(x, y) for x, y in zip(a.meta.shape, b.meta.shape))


class _Chain:
    """The nodes a match absorbs, each checked to be its value's only reader."""

    def __init__(self, g: Graph, users, pinned: set[int]):
        self.g, self.users, self.pinned, self.nodes = g, users, pinned, []

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


def _head_broadcast(x: Value) -> bool:
    """``x`` is made by an expand that is a no-op but for one head broadcast over dim 1 of a 4-D tensor
    (Falcon's multi-query key and value: [B, 1, S, D] to [B, H, S, D]): sdpa broadcasts it the same."""
    node = x.producer
    if node is None or node.op != "aten.expand" or not _tensor(node.args[0]):
        return False
    src = node.args[0].meta.shape
    return len(src) == len(x.meta.shape) and all(
        _same(a, b) or (d == 1 and len(src) == 4 and _int(b) == 1) for d, (a, b) in enumerate(zip(x.meta.shape, src)))


def _uncopied(x: Value, chain: _Chain, reader: Node) -> tuple[Value, Node]:
    """(the source, its reader) of a contiguous copy ``x`` of a head-broadcast expand that ``reader`` alone
    reads (eager's matmul copies an expanded batch it cannot view flat: Falcon's key and value at batch > 1),
    the copy recorded; else (x, reader)."""
    node = x.producer
    if node is not None and node.op == "aten.clone" and len(node.args) == 1 and _tensor(node.args[0]) \
            and set(node.kwargs) <= {"memory_format"} and _head_broadcast(node.args[0]) and chain.only(x, reader):
        chain.nodes.append(node)
        return node.args[0], node
    return x, reader


def _unflatten(v: Value, chain: _Chain, reader: Node) -> Value | None:
    """The [B, H, ...] tensor ``v`` ([B*H, ...]) is a view of (through an expand that is a no-op or a
    broadcast of one head), when it is."""
    view = chain.back(v, reader, _RESHAPES)
    if view is None or not _tensor(view.args[0]):
        return None
    x = full = view.args[0]       # (the flattening is checked on the expanded heads)
    x, view = _uncopied(x, chain, view)
    if x.producer is not None and x.producer.op == "aten.expand" and chain.only(x, view) and _head_broadcast(x):
        chain.nodes.append(x.producer)
        view, x = x.producer, x.producer.args[0]
    s = full.meta.shape
    if x.meta.rank != 4 or v.meta.rank != 3 or _int(s[0]) is None or _int(s[1]) is None \
            or _int(v.meta.shape[0]) != _int(s[0]) * _int(s[1]) \
            or not all(_same(a, b) for a, b in zip(v.meta.shape[1:], s[2:])):
        return None
    return x


# -- boolean masks: masked_fill / where ------------------------------------------------------------
def _fill(x) -> torch.Tensor | None:
    """A fill's value as a 0-d tensor of its own dtype: a number, or a one-element ``scalar_tensor`` /
    ``full``; None for anything else (a lifted constant's value is not in the graph)."""
    if _number(x) is not None:
        return torch.tensor(_number(x), dtype=torch.float64)
    node = x.producer if _tensor(x) else None
    if node is None or x.meta.dtype == torch.bool or x.meta.dtype.is_complex:
        return None
    if node.op == "aten.scalar_tensor" and len(node.args) == 1:
        value = _number(node.args[0])
    elif node.op == "aten.full" and len(node.args) == 2 and all(_int(d) == 1 for d in node.args[0]):
        value = _number(node.args[1])
    else:
        return None
    return None if value is None else torch.tensor(value, dtype=torch.float64).to(x.meta.dtype)


def _masking(fill: torch.Tensor, dtype: torch.dtype, later: list[tuple[str, float]]) -> float | None:
    """What the softmax sees where the fill went (the scale ``later`` applied in ``dtype``, as eager
    rounds it) when that hides the key: -inf, or a finite value at most ``finfo(dtype).min``."""
    t = fill.to(dtype)
    for op, c in later:
        t = t * c if op == "aten.mul.Tensor" else t / c
    seen = float(t)
    return seen if seen == -math.inf or (math.isfinite(seen) and seen <= torch.finfo(dtype).min) else None


def _masked(x: Value, chain: _Chain, reader: Node, later: list[tuple[str, float]]):
    """((source, hides, fill), the scores, the node) for a ``masked_fill`` / ``where`` producing ``x`` with a
    boolean mask and a fill that hides (``source`` True hides the key when ``hides``, shows it otherwise);
    None when ``x`` is not made so (then it is a value: nothing may change)."""
    node = chain.back(x, reader, _MASKED)
    if node is None or node.kwargs or len(node.args) != 3:
        return None
    if node.op == "aten.where.self":
        m, a, b = node.args
        sides = [(a, b, False), (b, a, True)]       # where(m, scores, fill): m shows; where(m, fill, s) hides
    else:
        y, m, value = node.args
        sides = [(y, value, True)]
    for y, value, hides in sides:
        fill = _fill(value)
        if fill is not None and _tensor(y) and _tensor(m) and y.meta.dtype == x.meta.dtype \
                and x.meta.dtype.is_floating_point and _same_shape(y, x) and m.meta.dtype == torch.bool \
                and 2 <= m.meta.rank <= x.meta.rank:
            seen = _masking(fill, x.meta.dtype, later)
            if seen is None:
                return None
            inner = m.producer
            if inner is not None and inner.op in _NOT and len(inner.args) == 1 and _tensor(inner.args[0]) \
                    and inner.args[0].meta.dtype == torch.bool:
                if chain.only(m, node):      # ~x read by this mask alone goes with it; else it stays
                    chain.nodes.append(inner)
                m, hides = inner.args[0], not hides
            return (m, hides, seen), y, node
    return None


# -- the chain ------------------------------------------------------------------------------------
def _keys(kt4: Value, chain: _Chain, reader: Node, name: str):
    """(k as [B, H, S, D], the permute made for it or None) for ``kt4``, k with its last two dims swapped:
    a transpose of them, or a permute (GPT-2's [B, S, H, D] → [B, H, D, S]), under an optional copy."""
    t = kt4.producer
    if t is not None and t.op == "aten.clone" and set(t.kwargs) <= {"memory_format"} and len(t.args) == 1 \
            and _tensor(t.args[0]) and chain.only(kt4, reader):
        chain.nodes.append(t)
        kt4, reader, t = t.args[0], t, t.args[0].producer
    if t is None or t.op not in ("aten.permute", "aten.transpose.int") or not chain.only(kt4, reader) \
            or not _tensor(t.args[0]) or t.args[0].meta.rank != 4:
        return None
    dims = [_int(d) for d in (t.args[1] if t.op == "aten.permute" else t.args[1:3])]
    if None in dims:
        return None
    dims = [d % 4 for d in dims]
    if t.op == "aten.transpose.int" and sorted(dims) == [2, 3]:
        order = [0, 1, 2, 3]
    elif t.op == "aten.permute" and sorted(dims) == [0, 1, 2, 3]:      # k = the permute with its last two swapped
        order = [*dims[:2], dims[3], dims[2]]
    else:
        return None
    chain.nodes.append(t)
    src = t.args[0]
    if order == [0, 1, 2, 3]:
        return src, None
    node = Node("aten.permute", (src, order), {}, name, t.source)
    node.outputs = [chain.g.new_value(name, TensorMeta(src.meta.dtype, tuple(src.meta.shape[i] for i in order)),
                                      "temp", node)]
    return node.outputs[0], node


def _flat_keys(kt3: Value, chain: _Chain, reader: Node) -> Value | None:
    """k as [B, H, S, D] when ``kt3`` is its [B*H, S, D] view with the last two dims swapped (BLOOM's
    ``k.reshape(B * H, S, D).transpose(-1, -2)``); None when it is not made so (nothing recorded unless the
    transpose is one of a view that is no [B, H] flattening, and then no other form matches either)."""
    t = kt3.producer
    if t is None or not _tensor(t.args[0]) or t.args[0].meta.rank != 3 or not chain.only(kt3, reader):
        return None
    dims = [_int(d) for d in (t.args[1] if t.op == "aten.permute" else t.args[1:3])] \
        if t.op in ("aten.permute", "aten.transpose.int") else [None]
    if None in dims or [d % 3 for d in dims] not in (([0, 2, 1],) if t.op == "aten.permute" else ([1, 2], [2, 1])):
        return None
    view = t.args[0].producer
    if view is None or view.op not in _RESHAPES or not chain.only(t.args[0], t):
        return None
    chain.nodes.append(t)
    return _unflatten(t.args[0], chain, t)


def _below_upcast(x: Value, chain: _Chain, reader: Node) -> Value:
    """The source of ``x`` when ``x`` is an exact float upcast that ``reader`` alone reads (recorded; the
    attention computes its scores in fp32 anyway, as eager does after the cast), else ``x``."""
    src = _upcast(x)
    if src is None or chain.back(x, reader, ("aten._to_copy",)) is None:
        return x
    return src


def _upcast(v: Value) -> Value | None:
    """The value ``v`` is an exact float upcast of (a ``_to_copy`` to a wider float dtype), else None."""
    node = v.producer if _tensor(v) else None
    if node is None or node.op != "aten._to_copy" or len(node.args) != 1 or not _tensor(node.args[0]) \
            or not set(node.kwargs) <= _CAST_KWARGS:
        return None
    src, dst = node.args[0].meta.dtype, v.meta.dtype
    return node.args[0] if src != dst and _exact_in(src, dst) else None


_THROUGH = (*_SCALES, *_RESHAPES, "aten._to_copy", "aten.clone", "aten.tanh", "aten.add.Tensor", *_MASKED)


def _from_product(v: Value) -> bool:
    """Whether ``v`` is computed from an ``aten.bmm`` through the ops a chain of scores may hold: which of
    an add's operands is the scores, the other being a bias."""
    seen, todo = set(), [v]
    while todo and len(seen) < 64:
        x = todo.pop()
        node = x.producer if _tensor(x) and x.id not in seen else None
        if node is None:
            continue
        seen.add(x.id)
        if node.op == "aten.bmm":
            return True
        if node.op in _THROUGH:
            todo.extend(a for a in node.args if _tensor(a) and a.meta.dtype.is_floating_point)
    return False


def _exact_in(src: torch.dtype, dst: torch.dtype) -> bool:
    """Every ``src`` value is a ``dst`` value (the same float dtype, or a narrower one within its range)."""
    if src == dst:
        return True
    return src.is_floating_point and dst.is_floating_point and torch.finfo(src).bits < torch.finfo(dst).bits \
        and torch.finfo(src).max <= torch.finfo(dst).max


def _term(x: Value, chain: _Chain, reader: Node):
    """(the scores, the bias) when ``x`` is their sum: the bias a float tensor of the scores' dtype, or of a
    narrower one the add promotes exactly (GPT-J's bf16 mask on its fp32 scores), of rank 2 up to the scores' (SDPA reads a mask's last two dims as the queries' and keys':
    one of rank 0 or 1 fails there; a bool or integer tensor added is a number there, not a mask), that
    does not broadcast the scores any larger; the scores the operand computed from the product."""
    node = x.producer
    if len(node.args) != 2 or node.kwargs or not all(_tensor(a) for a in node.args):
        return None
    a, b = node.args
    for y, m in ((a, b), (b, a)):
        if y.meta.dtype == x.meta.dtype and y.meta.dtype.is_floating_point and _exact_in(m.meta.dtype, y.meta.dtype) \
                and 2 <= m.meta.rank <= x.meta.rank and _same_shape(x, y) and _from_product(y):
            return (y, m) if chain.back(x, reader, ("aten.add.Tensor",)) is not None else None
    return None


def _scores(x: Value, chain: _Chain, reader: Node, name: str):
    """(s4, q4, k4, the permute made for k4, scale, softcap, mask) walking back from the softmax's input
    ``x``; the mask (biases, boolean mask): the biases added as [(value, its [B, H, ...] view or None)],
    the boolean mask as its (source, hides, fill) or None.

    Walking back, the chain is: added biases and a boolean mask, the soft cap, the scale's multiplies and
    divides (a boolean mask may stand among them), then the [B*H, T, S] → [B, H, T, S] view of the product;
    under the view the same again over the flattened scores (the biases of ``baddbmm``, BLOOM's ALiBi),
    with casts anywhere (each a rounding the eager form does and the attention need not). A bias added
    before a scale or under the soft cap would be scaled: nothing matches then."""
    # each with whether it adds to the flattened scores, and whether eager adds it in a dtype the scores
    # stay in up to the softmax (no cast after it)
    biases: list[tuple[Value, bool, torch.dtype]] = []
    spec, softcap, scale = None, None, 1.0
    later: list[tuple[str, float]] = []     # the scale's ops after x, in the order eager applies them
    scaled = cast = False
    casts: list[torch.dtype] = []       # the dtypes the scores are cast to
    flat: Node | None = None
    while _tensor(x) and x.producer is not None and x.producer.op != "aten.bmm":
        node = x.producer
        if node.op in _MASKED:      # a boolean mask, after every cast (its fill is read in x's dtype)
            if spec is not None or softcap is not None or cast or flat is not None:
                return None
            found = _masked(x, chain, reader, later)
            if found is None:
                return None
            spec, x, reader = found
        elif node.op == "aten.add.Tensor":
            found = None if scaled else _term(x, chain, reader)
            if found is None:
                return None
            kept = min([*casts, x.meta.dtype], key=lambda c: torch.finfo(c).bits)
            biases.append((found[1], flat is not None, kept))
            x, reader = found[0], node
        elif node.op == "aten.mul.Tensor" and not scaled and len(node.args) == 2 and _tensor(node.args[0]) \
                and node.args[0].producer is not None and node.args[0].producer.op == "aten.tanh":
            # the soft cap: cap * tanh(s / cap)
            mul, tanh = node, node.args[0].producer
            cap = _number(mul.args[1])
            div = tanh.args[0].producer if _tensor(tanh.args[0]) else None
            if softcap is not None or cap is None or cap <= 0 or div is None or len(div.args) != 2 or div.kwargs \
                    or not ((div.op == "aten.div.Tensor" and _number(div.args[1]) == cap)
                    or (div.op == "aten.mul.Tensor" and _number(div.args[1]) is not None
                        and abs(_number(div.args[1]) * cap - 1) < 1e-12)):
                return None
            if chain.back(x, reader, ("aten.mul.Tensor",)) is None \
                    or chain.back(mul.args[0], mul, ("aten.tanh",)) is None \
                    or chain.back(tanh.args[0], tanh, (div.op,)) is None:
                return None
            softcap, x, reader, scaled = cap, div.args[0], div, True
        elif node.op in _SCALES:
            c = _number(node.args[1]) if len(node.args) == 2 and not node.kwargs else None
            if c is None or c == 0 or chain.back(x, reader, (node.op,)) is None:
                return None
            scale = scale * c if node.op == "aten.mul.Tensor" else scale / c
            later.insert(0, (node.op, c))
            x, reader, scaled = node.args[0], node, True
        elif node.op == "aten._to_copy" and set(node.kwargs) <= _CAST_KWARGS and len(node.args) == 1 \
                and _tensor(node.args[0]) and node.args[0].meta.dtype.is_floating_point:
            if chain.back(x, reader, ("aten._to_copy",)) is None:
                return None
            casts.append(x.meta.dtype)
            x, reader, cast = node.args[0], node, True
        elif node.op in _RESHAPES and flat is None and x.meta.rank == 4 and _tensor(node.args[0]) \
                and node.args[0].meta.rank == 3:
            if chain.back(x, reader, _RESHAPES) is None:
                return None
            flat, x, reader = node, node.args[0], node
        else:
            return None
    bmm = chain.back(x, reader, ("aten.bmm",))
    if bmm is None or flat is None or len(bmm.args) != 2:
        return None
    s4 = flat.outputs[0]
    operands = []
    for v in bmm.args:      # q and k^T, in fp32 through exact upcasts (a decomposed baddbmm's)
        src = _upcast(v)
        if src is not None and chain.back(v, bmm, ("aten._to_copy",)) is not None:
            operands.append((src, v.producer))
        else:
            operands.append((v, bmm))
    q4 = _unflatten(operands[0][0], chain, operands[0][1])
    if q4 is None:
        return None
    q4 = _below_upcast(q4, chain, chain.nodes[-1])      # GPT-J's query.to(float32) before the flatten
    k4, k4_node = _flat_keys(operands[1][0], chain, operands[1][1]), None
    if k4 is None:
        kt4 = _unflatten(operands[1][0], chain, operands[1][1])
        keys = None if kt4 is None else _keys(kt4, chain, chain.nodes[-1], f"{name}_keys")  # read by its view
        if keys is None:
            return None
        k4, k4_node = keys
        if k4_node is None:     # read by the transpose just recorded: key.to(float32).transpose(-1, -2)
            k4 = _below_upcast(k4, chain, chain.nodes[-1])
    dtype = q4.meta.dtype       # a cast to a narrower float could overflow where the attention would not
    if any(torch.finfo(c).bits < torch.finfo(dtype).bits or torch.finfo(c).max < torch.finfo(dtype).max for c in casts):
        return None
    b, h = _int(q4.meta.shape[0]), _int(q4.meta.shape[1])
    terms = []
    # Several terms are summed in q's dtype: where eager adds one in a wider dtype and never rounds the
    # scores back to q's (GPT-J's fp32 scores), that sum would round what eager keeps exact.
    if len(biases) > 1 and any(torch.finfo(kept).bits > torch.finfo(q4.meta.dtype).bits for _, _, kept in biases):
        return None
    for m, flattened, _ in biases:
        if m.meta.dtype != q4.meta.dtype:   # only an exact upcast of a value in q's dtype: no rounding added
            m = _upcast(m)
            if m is None or m.meta.dtype != q4.meta.dtype:
                return None
        shape = None
        if flattened and m.meta.rank == 3 and _int(m.meta.shape[0]) != 1:
            if _int(m.meta.shape[0]) != b * h:
                return None
            shape = [b, h, *m.meta.shape[1:]]
        terms.append((m, shape))
    return s4, q4, k4, k4_node, scale, softcap, (terms, spec)


def _match(g: Graph, pv: Node, users, pinned: set[int], masks: _Masks, absorbed: set[int]):
    """(the attention node, the nodes it needs made, the output view it replaces, absorbed nodes) or None."""
    chain = _Chain(g, users, pinned)
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
    found = _scores(x, chain, reader, pv.name)
    if found is None:
        return None
    s4, q4, k4, k4_node, scale, softcap, mask = found
    # v: [B, H, S, D], or HF's repeat_kv 5-D copy [B, Hkv, n_rep, S, D] flattened straight to [B*H, S, D]
    v3 = pv.args[1]
    view = chain.back(v3, pv, _RESHAPES)
    if view is None or not _tensor(view.args[0]):
        return None
    src, reader = _uncopied(view.args[0], chain, view)
    b, h, t, d = q4.meta.shape
    if src.meta.rank == 4 and _head_broadcast(src) and chain.only(src, reader):    # one head, broadcast
        chain.nodes.append(src.producer)
        src = src.producer.args[0]
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
                 and _same(k4.meta.shape[-1], d) and (_same(k4.meta.shape[1], h) or _int(k4.meta.shape[1]) == 1)
                 and _same(k4.meta.shape[0], b)
                 and all(_same(a, c) for a, c in zip(s4.meta.shape, (b, h, t, k4.meta.shape[2]))))
    result = out_view.outputs[0]      # the output view must be the [B, H, T, D] the attention gives
    shapes_ok = shapes_ok and result.meta.rank == 4 and all(
        _same(a, c) for a, c in zip(result.meta.shape, (b, h, t, v4.meta.shape[-1])))
    if not shapes_ok or (softcap is not None and _int(t) != 1):
        return None
    if len({q4.meta.dtype, k4.meta.dtype, v4.meta.dtype, out3.meta.dtype}) != 1 or not q4.meta.dtype.is_floating_point:
        return None
    if any(id(n) in absorbed for n in chain.nodes):
        return None
    mask = masks.combine(*mask, q4.meta.dtype, pv)     # made only now that the match holds
    if softcap is None:
        node = Node("aten.scaled_dot_product_attention", (q4, k4, v4, mask, 0.0, False), {"scale": scale},
                    pv.name, pv.source)
    else:
        node = Node("ost.softcap_attention", (q4, k4, v4, mask, None, scale, 1, False, softcap), {}, pv.name,
                    pv.source)
    node.outputs = [result]
    return node, [n for n in (k4_node, v4_node) if n is not None], out_view, chain.nodes + [pv]


def fuse_eager_attention(g: Graph) -> Graph:
    users = g.users()
    pinned = pinned_values(g)
    replacement: dict[int, list[Node]] = {}
    absorbed: set[int] = set()
    masks = _Masks(g)
    for node in list(g.nodes):
        if node.op != "aten.bmm" or id(node) in absorbed:
            continue
        m = _match(g, node, users, pinned, masks, absorbed)
        if m is None:
            continue
        attention, made, out_view, nodes = m
        attention.outputs[0].producer = attention
        replacement[id(out_view)] = [*made, attention]
        absorbed.update(id(n) for n in nodes)
    if replacement:
        nodes = [*masks.after.get(None, [])]
        for n in g.nodes:
            nodes.extend(replacement.get(id(n), [n]))
            nodes.extend(masks.after.get(id(n), []))
        g.nodes = nodes
        drop_nodes(g, absorbed)
    return g
