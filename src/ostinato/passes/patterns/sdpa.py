"""``ost.sdpa``: every ``aten.scaled_dot_product_attention`` (with dropout_p 0) becomes one
``ost.sdpa(q, k, v, mask, q_pos, scale, n_rep, is_causal)``; eager_attention's soft-capped
``ost.softcap_attention`` becomes one with a ninth argument, ``softcap``.

Absorbed: the grouped-query head expansion of K and V, when both are expanded by the same factor and
the expansion's intermediates are read by nothing else (and are not graph outputs or mutation values):

- ``repeat_interleave.self_int(kv, n_rep, dim=-3)``;
- HF's repeat_kv: ``unsqueeze(kv, -3) → expand([..., Hkv, n_rep, S, D]) → [clone] → view/reshape/
  _unsafe_view([..., Hkv*n_rep, S, D])``;
- ``enable_gqa=True`` on the attention itself (its factor multiplies an absorbed one).

Also absorbed: a dense copy (``clone``, what ``.contiguous()`` exports as) of q, k or v read by the
attention alone (Whisper's and BART's attention copy them after their transposes); the attention reads
the transposed view as it lies.

Also absorbed: the query's scaling by a power of two written before the attention,
``(q_proj(x) * c).view(...).transpose(1, 2)[.contiguous()]`` with ``scale=1.0`` (Whisper, OPT, BART and
their kin, which keep "the original order of scaling"). The ``mul`` (or ``div``) by a Python scalar goes,
the views read the unscaled projection, and the attention's scale is multiplied by ``c``. A power of two
scales without rounding, so the scores are bit for bit the same; the mul was one kernel a layer. It stays
where any value between it and the attention has another reader.

Read differently: the positional causal mask ``le(KV, Q)`` / ``ge(Q, KV)``, optionally under
``expand``, leading ``unsqueeze(0)`` or views adding or dropping leading 1-dims (which broadcast
exactly as the mask they produce), where KV is
``arange(0, S)`` viewed as [1, ..., 1, S] with S the key length and Q is shaped [..., T or 1, 1]. The
fused op gets ``q_pos=Q`` and no mask; its reference computes ``arange(S) <= Q``, the same values up to
leading singleton dims. Where Q is itself ``arange(0, T)`` along the queries and T == S (a causal
encoder such as CLIP's text tower, a prefill without a cache), that mask is the square causal one: the
fused op gets ``is_causal=True`` and no ``q_pos``. The mask nodes are not removed here: they are
usually shared by all layers, and the pipeline's dce_after_fusion drops them once nothing reads them.

Dropped: a mask that lets every query see every key whatever the inputs: computed from aranges and
literals alone (no input, weight or state), of static shape, and all True (bool) or all zero (float).
transformers builds such a bidirectional mask when traced (``arange(S)[..., None] >= 0`` expanded),
where eager passes none; torch's fused attention kernels refuse its stride-0 last dim, so the
attention would run the math path (fp32 matmuls and softmax) instead of cuDNN's or flash.

Where several queries (a static count) read positions not provably so (a prefill after a cache: positions
from an input), the positions' mask ``arange(S) <= Q`` is made once in the same additive form and passed
as ``mask``, shared by every attention reading those positions: the reference would build and convert
it in every layer (a Llama-1B prefill of 128 tokens: five kernels a layer, 8% of its step on an H100).
One query (a decode step) keeps ``q_pos``, which the decode kernels read.

Any other mask is passed as ``mask``; a boolean one as the additive mask torch's fused kernels take
(``where(mask, 0, -inf)`` in the query's dtype, the values torch computes from it on every call), made
once and shared by every attention reading that mask: torch would convert it again in every layer
(Mistral's sliding window: three kernels per layer of a 512-token prefill).
"""
from __future__ import annotations

import math

import torch

from ...ir import Graph, Node, TensorMeta, Value
from ...ir.ops import resolve_aten
from ..rewrite import drop_nodes, pinned_values

_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
_RESHAPES = ("aten.view", "aten.reshape", "aten._unsafe_view")
_ARANGES = {"aten.arange": ("end",), "aten.arange.start": ("start", "end"),
            "aten.arange.start_step": ("start", "end", "step")}


def _tensor(v) -> bool:
    return isinstance(v, Value) and isinstance(v.meta, TensorMeta)


def _text(d) -> str:
    """A size as text: an int, a SymDim, or a host scalar Value (``sym_size``) by its symbolic value."""
    if isinstance(d, Value):
        expr = getattr(d.meta, "expr", None)
        return f"%{d.name}" if expr is None else str(expr)
    return str(d)


def _int(d) -> int | None:
    """A size as a Python int when it is one (a SymDim or a scalar Value may be a plain integer)."""
    if isinstance(d, bool):
        return None
    if isinstance(d, int):
        return d
    text = _text(d)
    return int(text) if text.lstrip("-").isdigit() else None


def _same(a, b) -> bool:
    return _text(a) == _text(b)


def _strip(shape: tuple) -> tuple[str, ...]:
    """A shape as text without its leading 1-dims."""
    text = [_text(d) for d in shape]
    while text and text[0] == "1":
        text.pop(0)
    return tuple(text)


_SOFTCAP_PARAMS = ("query", "key", "value", "attn_mask", "q_pos", "scale", "n_rep", "is_causal", "softcap")


def _bind(node: Node) -> dict:
    bound = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False,
             "softcap": None, "q_pos": None, "n_rep": 1}
    bound.update(zip(_SOFTCAP_PARAMS if node.op == "ost.softcap_attention" else _SDPA_PARAMS, node.args))
    bound.update(node.kwargs)
    return bound


def _read_only_by(v: Value, reader: Node, users, pinned: set[int]) -> bool:
    """``v`` is read by ``reader`` alone (possibly several times) and is not pinned."""
    readers = users.get(v.id, [])
    return v.id not in pinned and bool(readers) and all(r is reader for r in readers)


# -- GQA head expansion ---------------------------------------------------------------------------
def _repeat_interleave(node: Node) -> tuple[Value, int] | None:
    names = ("self", "repeats", "dim")
    bound = {"dim": None, **dict(zip(names, node.args)), **node.kwargs}
    src, rep, dim = bound.get("self"), _int(bound.get("repeats")), bound["dim"]
    if not _tensor(src) or src.meta.rank < 3 or rep is None or rep < 1 or _int(dim) is None:
        return None
    if _int(dim) not in (-3, src.meta.rank - 3):
        return None
    return src, rep


def _repeat_kv(view: Node, users, pinned: set[int]) -> tuple[Value, int, list[Node]] | None:
    """HF's repeat_kv ending at ``view``: (source, n_rep, its nodes from last to first)."""
    x = view.args[0] if view.args else None
    nodes = [view]
    if not _tensor(x) or x.producer is None:
        return None
    if x.producer.op == "aten.clone":
        clone = x.producer
        fmt = clone.kwargs.get("memory_format", torch.contiguous_format)
        if not _read_only_by(x, view, users, pinned) or len(clone.args) != 1 \
                or set(clone.kwargs) - {"memory_format"} or fmt not in (None, torch.contiguous_format):
            return None
        nodes.append(clone)
        x = clone.args[0]
        if not _tensor(x) or x.producer is None:
            return None
    expand = x.producer
    if expand.op != "aten.expand" or not _read_only_by(x, nodes[-1], users, pinned):
        return None
    nodes.append(expand)
    u = expand.args[0]
    if not _tensor(u) or u.producer is None or u.producer.op != "aten.unsqueeze" \
            or not _read_only_by(u, expand, users, pinned):
        return None
    unsqueeze = u.producer
    src = unsqueeze.args[0]
    if not _tensor(src) or src.meta.rank < 3 or len(unsqueeze.args) != 2 or _int(unsqueeze.args[1]) is None:
        return None
    r = src.meta.rank
    if _int(unsqueeze.args[1]) % (r + 1) != r - 2:  # a new dim right after the heads
        return None
    nodes.append(unsqueeze)
    s, e, out = src.meta.shape, x.meta.shape, view.outputs[0].meta.shape
    heads, rep = _int(s[-3]), _int(e[-3])
    if heads is None or rep is None or len(e) != r + 1 or len(out) != r:
        return None
    if not all(_same(a, b) for a, b in zip(e, (*s[:-2], rep, *s[-2:]))) \
            or not all(_same(a, b) for a, b in zip(out, (*s[:-3], heads * rep, *s[-2:]))):
        return None
    return src, rep, nodes


def _expansion(kv: Value, sdpa: Node, users, pinned: set[int]) -> tuple[Value, int, list[Node]] | None:
    """(source, n_rep, absorbed nodes) when ``kv`` is a head expansion read only by ``sdpa``."""
    node = kv.producer
    if node is None or not _read_only_by(kv, sdpa, users, pinned):
        return None
    if node.op == "aten.repeat_interleave.self_int":
        m = _repeat_interleave(node)
        return None if m is None else (m[0], m[1], [node])
    if node.op in _RESHAPES:
        return _repeat_kv(node, users, pinned)
    return None


def _unclone(x: Value, sdpa: Node, users, pinned: set[int], absorbed: list[Node]) -> Value:
    """``x``'s source when ``x`` is a dense copy (``clone``, ``.contiguous()``) read by ``sdpa`` alone: the
    attention reads any strides (torch's kernels take a transposed [B, T, H, D] view as it lies; the
    decode kernels check theirs), so the copy is absorbed (appended to ``absorbed``). Whisper's attention
    copies q, k and v after its transposes: three kernels a layer."""
    node = x.producer
    if node is None or node.op != "aten.clone" or len(node.args) != 1 or set(node.kwargs) - {"memory_format"} \
            or node.kwargs.get("memory_format") not in (None, torch.contiguous_format, torch.preserve_format) \
            or not _read_only_by(x, sdpa, users, pinned) or not _tensor(node.args[0]):
        return x
    absorbed.append(node)
    return node.args[0]


_LAYOUT = (*_RESHAPES, "aten.transpose.int", "aten.permute", "aten.unsqueeze", "aten.squeeze.dim", "aten.clone")


def _power_of_two(c) -> bool:
    return isinstance(c, float | int) and not isinstance(c, bool) and c > 0 and math.isfinite(c) \
        and math.frexp(c)[0] == 0.5


def _unscale(q: Value, sdpa: Node, users, pinned: set[int], absorbed: list[Node]) -> tuple[Value, float]:
    """(``q`` read without its scaling, the factor) when ``q`` is layout ops over ``mul(x, c)`` or
    ``div(x, 1/c)`` with ``c`` a power of two, each value from the scaling to ``q`` read by the next alone
    (``q`` by ``sdpa``); the scaling goes to ``absorbed`` and the first layout op reads ``x``. Else (q, 1.0)."""
    if sum(v is q for v in sdpa.inputs) != 1:      # q is also the keys or values: they keep the scaling
        return q, 1.0
    chain, x, reader = [], q, sdpa
    while x.producer is not None and x.producer.op in _LAYOUT and _read_only_by(x, reader, users, pinned):
        reader = x.producer
        chain.append(reader)
        x = reader.args[0] if reader.args and _tensor(reader.args[0]) else None
        if x is None:
            return q, 1.0
    node = x.producer
    if node is None or node.op not in ("aten.mul.Tensor", "aten.mul.Scalar", "aten.div.Tensor", "aten.div.Scalar") \
            or len(node.args) != 2 or node.kwargs or not _tensor(node.args[0]) \
            or not _read_only_by(x, reader, users, pinned) or node.args[0].meta.dtype != x.meta.dtype \
            or tuple(map(str, node.args[0].meta.shape)) != tuple(map(str, x.meta.shape)):
        return q, 1.0
    c = node.args[1]
    if not _power_of_two(c):
        return q, 1.0
    factor = float(c) if node.op.startswith("aten.mul") else 1.0 / float(c)
    absorbed.append(node)
    source = node.args[0]
    if not chain:
        return source, factor
    first = chain[-1]
    first.args = (source, *first.args[1:])
    readers = users.setdefault(source.id, [])
    readers[:] = [first if r is node else r for r in readers]
    return q, factor


# -- positional causal mask -----------------------------------------------------------------------
def _is_key_positions(kv, length) -> bool:
    """``kv`` is ``arange(0, length)`` (int64) laid out as [1, ..., 1, length]."""
    return _tensor(kv) and kv.meta.rank >= 1 and _is_arange(kv, length, kv.meta.rank - 1)


def _is_arange(kv, length, dim: int) -> bool:
    """``kv`` is ``arange(0, length)`` (int64) laid out along ``dim``, every other dim of size 1."""
    if not _tensor(kv) or kv.meta.dtype != torch.int64 or not 0 <= dim < kv.meta.rank \
            or not _same(kv.meta.shape[dim], length) \
            or any(_int(d) != 1 for i, d in enumerate(kv.meta.shape) if i != dim):
        return False
    # With a single non-trivial dim, any chain of views keeps the values in order along it.
    node = kv.producer
    while node is not None and (node.op in _RESHAPES or node.op == "aten.unsqueeze"
                                or (node.op == "aten.add.Tensor" and len(node.args) == 2
                                    and _int(node.args[1]) == 0 and not node.kwargs)):
        node = node.args[0].producer if _tensor(node.args[0]) else None
    if node is None or node.op not in _ARANGES:
        return False
    bound = {"start": 0, "step": 1, **dict(zip(_ARANGES[node.op], node.args))}
    return _int(bound["start"]) == 0 and _int(bound["step"]) == 1 and _same(bound.get("end"), length)


def _query_positions(mask: Value, q: Value, k: Value) -> Value | None:
    """Q when ``mask`` broadcasts as ``arange(S) <= Q`` over the scores; None otherwise."""
    v = mask
    # expand, leading unsqueezes and views that only add or drop leading 1-dims change nothing once
    # the mask is broadcast over the scores.
    while v.producer is not None and (v.producer.op == "aten.expand" or (
            v.producer.op == "aten.unsqueeze" and _int(v.producer.args[1]) in (0, -v.meta.rank)) or (
            v.producer.op in _RESHAPES and _tensor(v.producer.args[0])
            and _strip(v.meta.shape) == _strip(v.producer.args[0].meta.shape))):
        v = v.producer.args[0]
        if not _tensor(v):
            return None
    cmp = v.producer
    if cmp is None or cmp.kwargs or len(cmp.args) != 2 or cmp.op not in ("aten.le.Tensor", "aten.ge.Tensor"):
        return None
    kv, qp = cmp.args if cmp.op == "aten.le.Tensor" else cmp.args[::-1]
    if not _is_key_positions(kv, k.meta.shape[-2]) or not _tensor(qp):
        return None
    # q_pos's contract: one position per query, broadcasting as [..., T, 1].
    shape = qp.meta.shape
    if not 2 <= len(shape) <= q.meta.rank or _int(shape[-1]) != 1 \
            or not (_same(shape[-2], q.meta.shape[-2]) or _int(shape[-2]) == 1):
        return None
    return qp


def _causal_positions(q_pos: Value, q: Value, k: Value) -> bool:
    """Whether query i's position is i, with as many queries as keys (not one static query): the mask
    ``arange(S) <= q_pos`` is then the square causal one, which the attention takes as ``is_causal``
    (torch's fused kernels skip the hidden blocks, and no mask is built: CLIP's text encoder built and
    converted it in every layer, five kernels of its 13). Queries that start later in the keys (a
    prefill after a cache, positions from an input) are not provably so and keep ``q_pos``."""
    t = q.meta.shape[-2]
    if not _same(t, k.meta.shape[-2]) or (_int(t) is not None and _int(t) < 2):
        return False    # (one static query: the decode kernels take q_pos)
    return q_pos.meta.rank >= 2 and _int(q_pos.meta.shape[-1]) == 1 and _is_arange(q_pos, t, q_pos.meta.rank - 2)


# -- masks that hide nothing ----------------------------------------------------------------------
# Pure ops a constant mask is built from (values computed on the CPU at export, small).
_CONST_OPS = frozenset("""aten.arange aten.arange.start aten.arange.start_step aten.full aten.ones aten.zeros
    aten.unsqueeze aten.view aten.reshape aten._unsafe_view aten.expand aten.permute aten.transpose.int
    aten.slice.Tensor aten.select.int aten.squeeze.dim aten._to_copy aten.clone aten.alias
    aten.ge.Scalar aten.gt.Scalar aten.le.Scalar aten.lt.Scalar aten.eq.Scalar aten.ne.Scalar
    aten.ge.Tensor aten.gt.Tensor aten.le.Tensor aten.lt.Tensor aten.eq.Tensor aten.ne.Tensor
    aten.logical_and aten.logical_or aten.logical_not aten.bitwise_and.Tensor aten.bitwise_or.Tensor
    aten.bitwise_not aten.add.Tensor aten.sub.Tensor aten.mul.Tensor aten.where.self aten.where.ScalarOther
    aten.where.ScalarSelf aten.masked_fill.Scalar""".split())
_CONST_LIMIT = 1 << 22   # elements of one materialised intermediate


def _static(shape) -> bool:
    return all(_int(d) is not None for d in shape)


def _constant(v, memo: dict, depth: int = 0):
    """``v``'s value as a CPU tensor (or Python scalar) when it depends on aranges and literals alone;
    None when it reads an input, a weight or state, a dynamic size, or an op outside _CONST_OPS."""
    if not isinstance(v, Value):
        if isinstance(v, (list, tuple)):
            items = [_constant(x, memo, depth) for x in v]
            return None if any(x is None for x in items) else type(v)(items)
        return v if isinstance(v, (bool, int, float)) or v is None else None
    if v.id in memo:
        return memo[v.id]
    node = v.producer
    memo[v.id] = None
    if node is None or node.op not in _CONST_OPS or depth > 64 or len(node.outputs) != 1 \
            or not isinstance(v.meta, TensorMeta) or not _static(v.meta.shape):
        return None
    args = [_constant(a, memo, depth + 1) for a in node.args]
    if any(a is None and b is not None for a, b in zip(args, node.args)):
        return None
    kwargs = {k: x for k, x in node.kwargs.items() if k not in ("device", "pin_memory", "layout")}
    if any(isinstance(x, (Value, list, tuple)) for x in kwargs.values()):
        return None
    if node.op.startswith("aten.arange") or node.op in ("aten.full", "aten.ones", "aten.zeros"):
        kwargs["device"] = "cpu"
    try:
        out = resolve_aten(node.op)(*args, **kwargs)
    except Exception:       # an op torch refuses here: not provably constant
        return None
    if not isinstance(out, torch.Tensor) or out.numel() > _CONST_LIMIT:
        return None
    memo[v.id] = out
    return out


def _hides_nothing(mask: Value, memo: dict) -> bool:
    """``mask`` is a constant that masks nothing: all True (bool) or all zero (added to the scores)."""
    if not _static(mask.meta.shape):
        return False
    m = _constant(mask, memo)
    if not isinstance(m, torch.Tensor):
        return False
    return bool(m.all()) if m.dtype == torch.bool else bool((m == 0).all())


# -- the pass -------------------------------------------------------------------------------------
def _match(g: Graph, node: Node, users, pinned: set[int], masks: dict) -> tuple[tuple, list[Node], list[Node]] | None:
    a = _bind(node)
    q, k, v, mask = a["query"], a["key"], a["value"], a["attn_mask"]
    if not (_tensor(q) and _tensor(k) and _tensor(v)) or q.meta.rank < 3 or k.meta.rank < 3:
        return None
    if a["dropout_p"] not in (0, 0.0) or (mask is not None and not _tensor(mask)):
        return None
    if a["q_pos"] is not None or a["n_rep"] != 1:     # eager_attention makes neither (positions, repeats)
        return None
    n_rep, absorbed = 1, []
    if a["enable_gqa"]:
        hq, hk = _int(q.meta.shape[-3]), _int(k.meta.shape[-3])
        if hq is None or hk is None or hk == 0 or hq % hk:
            return None
        n_rep = hq // hk
    ek, ev = _expansion(k, node, users, pinned), _expansion(v, node, users, pinned)
    if ek is not None and ev is not None and ek[1] == ev[1]:
        k, v = ek[0], ev[0]
        n_rep *= ek[1]  # repeat_interleave twice is repeat_interleave by the product
        absorbed = ek[2] + [n for n in ev[2] if all(n is not m for m in ek[2])]
    scale = a["scale"]
    d = _int(q.meta.shape[-1])
    if a["softcap"] is None and d and (scale is None or isinstance(scale, float | int)):
        q, factor = _unscale(q, node, users, pinned, absorbed)
        if factor != 1.0:
            scale = (1.0 / math.sqrt(d) if scale is None else float(scale)) * factor
    q, k, v = (_unclone(x, node, users, pinned, absorbed) for x in (q, k, v))
    q_pos = None
    if mask is not None and _hides_nothing(mask, masks.setdefault("constants", {})):
        mask = None
    if mask is not None:
        key = (mask.id, str(q.meta.shape[-2]), str(k.meta.shape[-2]), q.meta.rank)
        if key not in masks:  # layers share one mask: look at its chain once
            masks[key] = _query_positions(mask, q, k)
        q_pos = masks[key]
    if q_pos is not None:
        mask = None
    is_causal = bool(a["is_causal"])
    if q_pos is not None and _causal_positions(q_pos, q, k) and a["softcap"] is None and not is_causal:
        q_pos, is_causal = None, True
    made: list[Node] = []
    anchor = mask      # the made nodes go right after this value's producer
    t, s = _int(q.meta.shape[-2]), _int(k.meta.shape[-2])
    if q_pos is not None and a["softcap"] is None and t is not None and t > 1 and s is not None \
            and q.meta.dtype.is_floating_point:
        # several queries (a prefill after a cache): the positions' mask made once, additive, for
        # every layer reading these positions; the reference would build and convert it in each
        key = ("positions", q_pos.id, s, q.meta.dtype)
        if key not in masks:
            masks[key] = _position_mask(g, q_pos, s, q.meta.dtype, node)
            made, anchor = list(masks[key][1]), q_pos
        mask, q_pos = masks[key][0], None
    elif mask is not None and mask.meta.dtype == torch.bool and q.meta.dtype.is_floating_point:
        key = ("additive", mask.id, q.meta.dtype)
        if key not in masks:
            masks[key] = _additive(g, mask, q.meta.dtype, node)
            made = list(masks[key][1])
        mask = masks[key][0]
    args = (q, k, v, mask, q_pos, scale, n_rep, is_causal)
    return args + ((a["softcap"],) if a["softcap"] is not None else ()), absorbed, made, anchor


def _position_mask(g: Graph, q_pos: Value, s: int, dtype: torch.dtype, at: Node) -> tuple[Value, list[Node]]:
    """(``where(arange(s) <= q_pos, 0, -inf)`` in ``dtype``, the nodes computing it): the reference's mask
    for ``q_pos`` over ``s`` keys, as torch's attention converts it."""
    keys = Node("aten.arange", (s,), {"dtype": torch.int64, "layout": torch.strided, "device": torch.device("cpu"),
                                      "pin_memory": False}, f"{at.name}_mask_keys", at.source)
    keys.outputs = [g.new_value(keys.name, TensorMeta(torch.int64, (s,)), "temp", keys)]
    le = Node("aten.le.Tensor", (keys.outputs[0], q_pos), {}, f"{at.name}_mask_visible", at.source)
    le.outputs = [g.new_value(le.name, TensorMeta(torch.bool, (*q_pos.meta.shape[:-1], s)), "temp", le)]
    out, made = _additive(g, le.outputs[0], dtype, at)
    return out, [keys, le, *made]


def _additive(g: Graph, mask: Value, dtype: torch.dtype, at: Node, hidden: float = float("-inf"),
              hides: bool = False) -> tuple[Value, list[Node]]:
    """(``where(mask, 0, hidden)`` in ``dtype``, or ``where(mask, hidden, 0)`` when ``hides``; the nodes
    computing it): with -inf, what torch's attention computes from a boolean mask. The backend puts its
    own device in for the export's."""
    made, values = [], []
    for k, x in enumerate((0.0, hidden)):
        n = Node("aten.scalar_tensor", (x,), {"dtype": dtype, "layout": torch.strided, "device": torch.device("cpu")},
                 f"{at.name}_mask_{'zero' if k == 0 else 'hidden'}", at.source)
        values.append(g.new_value(n.name, TensorMeta(dtype, ()), "temp", n))
        n.outputs = [values[-1]]
        made.append(n)
    where = Node("aten.where.self", (mask, *(values[::-1] if hides else values)), {}, f"{at.name}_mask_additive",
                 at.source)
    out = g.new_value(where.name, TensorMeta(dtype, tuple(mask.meta.shape)), "temp", where)
    where.outputs = [out]
    return out, made + [where]


def fuse_sdpa(g: Graph) -> Graph:
    users = g.users()
    pinned = pinned_values(g)
    replacement: dict[int, Node] = {}
    absorbed: set[int] = set()
    masks: dict[tuple, Value | None] = {}
    # The additive masks made go right after the boolean mask's producer (first when it is an input),
    # not before the attention: there they would come after the layer's cache writes, which close the
    # scheduler's groups, so the mask's own group could not take them.
    after: dict[int | None, list[Node]] = {}
    for node in g.nodes:
        if node.op not in ("aten.scaled_dot_product_attention", "ost.softcap_attention"):
            continue
        m = _match(g, node, users, pinned, masks)
        if m is None:
            continue
        fused = Node("ost.sdpa", m[0], {}, node.name, node.source)
        fused.outputs = [node.outputs[0]]
        node.outputs[0].producer = fused
        replacement[id(node)] = [fused]
        if m[2]:
            producer = m[3].producer
            after.setdefault(None if producer is None else id(producer), []).extend(m[2])
        absorbed.update(id(n) for n in m[1])
    if replacement:
        nodes = [*after.get(None, [])]
        for n in g.nodes:
            nodes.extend(replacement.get(id(n), [n]))
            nodes.extend(after.get(id(n), []))
        g.nodes = nodes
        drop_nodes(g, absorbed)
    return g
