"""``ost.moe_up`` / ``ost.moe_down``: a mixture of experts' MLP in a decode step, two launches.

transformers' experts (``integrations/moe.py``) route each token to its top-k experts and run every chosen
expert's gated MLP on it. The exported graph is a softmax over the router's logits, a ``topk``, the
values normalized (optionally) and cast (optionally) -- or (GraniteMoe) a ``topk`` of the logits and a softmax
over the values it chose, cast -- and then, for the ``batched_mm`` experts:

    rows  = repeat_interleave(x, k, 0)                   # [T*k, K], token t's rows t*k .. t*k+k-1
    ids   = view(topk.ids, [-1])                          # (5.17 clamps them to [0, E-1], a no-op)
    up    = squeeze(bmm(W_gate_up[ids], unsqueeze(rows, -1)), -1)
    h     = swiglu_packed(up)                            # (ost.geglu_packed alike)
    down  = squeeze(bmm(W_down[ids], unsqueeze(h, -1)), -1)
    out   = sum(view(down * unsqueeze(view(weights, [-1]), -1), [T, k, H]), 1)   # then an optional cast

The gathers copy every chosen expert's weight before the product reads it again, and routing alone is
four launches. ``ost.moe_up(x, logits, W_gate_up, k, ...)`` takes the route, the gather, the product
and the gating, and gives the chosen expert ids with its result; ``ost.moe_down(h, ids, logits, W_down,
k, ...)`` takes those ids (the route is chosen once: either op may run its kernel while the other runs its
reference, and ties would otherwise go apart), the routing weights of those choices (recomputed from the
logits: E values a token), the gather, the product and the sum over the k choices. On CUDA
each is one kernel reading only the chosen experts' weights (backends/cuda/kernels/moe.py).

The references compute what the chain computes, op by op; the pattern checks every intermediate is
read only inside the chain. Only decode-shaped steps are taken (at most MAX_TOKENS tokens, static sizes): a
prefill multiplies many rows by each expert, a grouped GEMM's work, left to the graph's own ops. A batched
decode step of 2 to MAX_TOKENS tokens runs CUDA's grouped kernels, which read each chosen expert once.
This is one of the hand-written patterns the fusion issue allows (like attention): routing is a
data-dependent choice of weights, which the generic code generator's pointwise and reduction groups
cannot express.
"""
from __future__ import annotations

import torch

from ...ir import Graph, Node, TensorMeta, Value
from ..dce import eliminate_dead_code
from ..rewrite import is_dtype_cast, pinned_values

MAX_TOKENS = 64    # tokens a step (CUDA's grouped kernels hold them in one block of rows)
# A program exported from CPU tensors (the CPU and MLX backends run the ops' references, which gather each
# chosen expert's weights once per (token, choice), as the batched_mm form does) takes only steps of at most
# this many tokens x choices: OLMoE's 32 tokens x 8 choices would gather about 2 GB a layer
MAX_GATHERED_ROWS = 64
_GATES = {"ost.swiglu_packed": "silu", "ost.geglu_packed": "gelu"}


def _static(v) -> bool:
    return isinstance(v, Value) and isinstance(v.meta, TensorMeta) and all(isinstance(d, int) for d in v.meta.shape)


def _make(v) -> Node | None:
    return v.producer if isinstance(v, Value) else None


def _ints(x) -> list | None:
    return list(x) if isinstance(x, (list, tuple)) and all(isinstance(i, int) for i in x) else None


class _Chain:
    """Reads of one chain: each step must be the only reader of the value before it."""

    def __init__(self, users: dict, pinned: set[int]):
        self.users, self.pinned = users, pinned

    def only_reader(self, v: Value, op: str | tuple) -> Node | None:
        readers = self.users.get(v.id, [])
        ops = (op,) if isinstance(op, str) else op
        if v.id in self.pinned or len(readers) != 1 or readers[0].op not in ops:
            return None
        return readers[0]


def _last(dim, rank: int) -> bool:
    return isinstance(dim, int) and dim in (-1, rank - 1)


def _route(topk: Node) -> tuple[Value, int, torch.dtype, bool] | None:
    """(logits [T, E], k, the dtype routing ran in, top-k first?) of ``topk(softmax(logits or its cast), k)``
    over the last dim, or of ``topk(logits or its cast, k)`` whose values a softmax reads (checked by
    _weights: GraniteMoe's order)."""
    probs = topk.args[0]
    k = topk.args[1] if len(topk.args) > 1 else topk.kwargs.get("k")
    dim = topk.args[2] if len(topk.args) > 2 else topk.kwargs.get("dim", -1)
    largest = topk.args[3] if len(topk.args) > 3 else topk.kwargs.get("largest", True)
    if not isinstance(k, int) or not largest or not _static(probs) or probs.meta.rank != 2 or not _last(dim, 2):
        return None
    sm = _make(probs)
    topk_first = sm is None or sm.op != "aten._softmax"
    if not topk_first and (not _last(sm.args[1], 2) or sm.args[2]):
        return None
    src = probs if topk_first else sm.args[0]
    cast = _make(src)
    logits = cast.args[0] if is_dtype_cast(cast) else src
    if not _static(logits) or not isinstance(src, Value):
        return None
    return logits, k, src.meta.dtype, topk_first


def _weights(vals: Value, chain: _Chain, topk_first: bool = False) -> tuple[Value, bool, torch.dtype | None] | None:
    """(the routing weights the experts read, normalized?, the dtype they were cast to or None);
    ``topk_first``: the weights are the softmax of the top-k values."""
    readers = chain.users.get(vals.id, [])
    normalize, w = False, vals
    if topk_first:
        sm = chain.only_reader(vals, "aten._softmax")
        if sm is None or not _last(sm.args[1], 2) or sm.args[2]:
            return None
        w = sm.outputs[0]
    elif len(readers) == 2 and vals.id not in chain.pinned:
        sums = [n for n in readers if n.op == "aten.sum.dim_IntList"]
        divs = [n for n in readers if n.op == "aten.div.Tensor"]
        if len(sums) != 1 or len(divs) != 1:
            return None
        s, d = sums[0], divs[0]
        if _ints(s.args[1]) not in ([-1], [1]) or not (len(s.args) > 2 and s.args[2]) or s.kwargs.get("dtype") \
                or d.args != (vals, s.outputs[0]) or len(chain.users.get(s.outputs[0].id, [])) != 1:
            return None
        normalize, w = True, d.outputs[0]
    elif len(readers) != 1:
        return None
    readers = chain.users.get(w.id, [])
    if len(readers) == 1 and is_dtype_cast(readers[0]) and w.id not in chain.pinned:
        return readers[0].outputs[0], normalize, readers[0].outputs[0].meta.dtype
    return w, normalize, None


def _expert_product(gather: Node, chain: _Chain) -> tuple[Value, Value, Value] | None:
    """(weight [E, N, K], rows [S, K], result [S, N]) of ``squeeze(bmm(weight[ids], unsqueeze(rows, -1)), -1)``."""
    weight = gather.args[0]
    if not _static(weight) or weight.meta.rank != 3:
        return None
    bmm = chain.only_reader(gather.outputs[0], "aten.bmm")
    if bmm is None or bmm.args[0] is not gather.outputs[0]:
        return None
    unsq = _make(bmm.args[1])
    if unsq is None or unsq.op != "aten.unsqueeze" or not _last(unsq.args[1], 3) \
            or len(chain.users.get(unsq.outputs[0].id, [])) != 1:
        return None
    rows = unsq.args[0]
    sq = chain.only_reader(bmm.outputs[0], ("aten.squeeze.dims", "aten.squeeze.dim"))
    if sq is None or not _static(rows) or rows.meta.rank != 2:
        return None
    dims = sq.args[1]
    if not (_ints(dims) in ([-1], [2]) or _last(dims, 3)):
        return None
    return weight, rows, sq.outputs[0]


def _token_sum(v: Value, t: int, k: int, chain: _Chain) -> Value | None:
    """The result of ``sum(view(v, [T, k, H]), 1)`` and its optional cast: the k choices of each token summed."""
    view = chain.only_reader(v, ("aten.view", "aten.reshape"))
    hidden = v.meta.shape[-1]
    if view is None or _ints(view.args[1]) not in ([t, k, hidden], [t, k, -1], [-1, k, hidden]):
        return None
    total = chain.only_reader(view.outputs[0], "aten.sum.dim_IntList")
    if total is None or _ints(total.args[1]) != [1] or (len(total.args) > 2 and total.args[2]) \
            or total.kwargs.get("dtype"):
        return None
    out = total.outputs[0]
    cast = chain.only_reader(out, "aten._to_copy")
    return cast.outputs[0] if cast is not None and is_dtype_cast(cast) else out


def _scaled(down: Value, chain: _Chain) -> tuple[Node, Value] | None:
    """(the multiply, the [S] vector) of ``down * unsqueeze(vector, -1)``."""
    mul = chain.only_reader(down, "aten.mul.Tensor")
    if mul is None:
        return None
    other = mul.args[1] if mul.args[0] is down else mul.args[0]
    unsq = _make(other)
    if unsq is None or unsq.op != "aten.unsqueeze" or not _last(unsq.args[1], 2):
        return None
    return mul, unsq.args[0]


def _flat(v, of: Value) -> bool:
    """Whether ``v`` is ``view(of, [-1])``."""
    node = _make(v)
    return node is not None and node.op in ("aten.view", "aten.reshape") and node.args[0] is of \
        and _ints(node.args[1]) == [-1]


def _weighted_sum(down: Value, weights: Value, t: int, k: int, chain: _Chain) -> Value | None:
    """The result of ``sum(view(down * unsqueeze(view(weights, [-1]), -1), [T, k, H]), 1)`` (and its cast)."""
    found = _scaled(down, chain)
    if found is None or not _flat(found[1], weights):
        return None
    return _token_sum(found[0].outputs[0], t, k, chain)


def _expert_ids(ids: Value, n_experts: int, chain: _Chain) -> list[Node] | None:
    """The gathers ``W[view(ids, [-1])]`` (through a clamp to [0, E-1]) reading the top-k ids."""
    flat = chain.only_reader(ids, ("aten.view", "aten.reshape"))
    if flat is None or _ints(flat.args[1]) != [-1]:
        return None
    v = flat.outputs[0]
    readers = chain.users.get(v.id, [])
    if len(readers) == 1 and readers[0].op == "aten.clamp":
        c = readers[0]
        lo = c.args[1] if len(c.args) > 1 else c.kwargs.get("min")
        hi = c.args[2] if len(c.args) > 2 else c.kwargs.get("max")
        if lo != 0 or hi != n_experts - 1:
            return None
        v = c.outputs[0]
        readers = chain.users.get(v.id, [])
    if v.id in chain.pinned or not readers or any(n.op != "aten.index.Tensor" or len(n.args) != 2
                                                   or list(n.args[1]) != [v] for n in readers):
        return None
    return readers


def _router_on_rows(g: Graph, logits: Value, up: Node) -> None:
    """The router's ``linear(view(a, [-1, K]), W)`` as ``view(linear(a, W), [-1, E])`` (an
    ``ost.multi_linear`` holding the router alike: Qwen2-MoE's router beside its shared expert's
    projections, each result viewed back), and the flattening view moved to just before ``up`` (its other
    reader): the projection then reads the norm's result itself, so the code generator can take the norm
    as its prologue (codegen/linear.py), one launch for both, with no read of that result between the norm
    and the projection."""
    lin = _make(logits)
    ok = lin is not None and lin.op in ("aten.linear", "ost.multi_linear") and lin.args and not lin.kwargs
    flat = _make(lin.args[0]) if ok else None
    if flat is None or flat.op not in ("aten.view", "aten.reshape"):
        return
    a, v = flat.args[0], flat.outputs[0]
    pinned = pinned_values(g)
    if not _static(a) or a.meta.rank < 2 or a.meta.shape[-1] != v.meta.shape[-1] \
            or any(o is None or o.id in pinned or not _static(o) for o in lin.outputs):
        return
    # the view moves to just before ``up``: no other node may read it (another block's moe_up before it)
    if v.id in pinned or any(n is not lin and n is not up and any(x is v for x in n.inputs) for n in g.nodes):
        return
    backs = []
    rows = []
    for o in lin.outputs:
        meta = TensorMeta(o.meta.dtype, (*a.meta.shape[:-1], o.meta.shape[-1]))
        r = g.new_value(f"{o.name}_rows", meta, "temp", lin)
        back = Node("aten.view", (r, list(o.meta.shape)), {}, f"{o.name}_view", lin.source)
        back.outputs, o.producer = [o], back
        rows.append(r)
        backs.append(back)
    lin.args = (a, *lin.args[1:])
    lin.outputs = rows
    nodes = [n for n in g.nodes if n is not flat]
    at = nodes.index(lin) + 1
    nodes[at:at] = backs
    nodes.insert(nodes.index(up), flat)
    g.nodes = nodes


def _batched(ids: Value, logits: Value, k: int, weights: Value, chain: _Chain):
    """(x, W_up, the gating node, W_down, the result) of the batched_mm experts (the module's note)."""
    t, n_experts = logits.meta.shape
    gathers = _expert_ids(ids, n_experts, chain)
    if gathers is None or len(gathers) != 2:
        return None
    products = [_expert_product(n, chain) for n in gathers]
    if None in products or any(p[0].meta.shape[0] != n_experts for p in products):
        return None
    # the up projection reads the repeated tokens, the down projection its gating's result
    ups = [p for p in products if _make(p[1]) is not None and _make(p[1]).op == "aten.repeat_interleave.self_int"]
    if len(ups) != 1:
        return None
    (w_up, rows, up_out), = ups
    w_down, h, down_out = products[1] if products[0] is ups[0] else products[0]
    rep = _make(rows)
    x = rep.args[0]
    if rep.args[1:3] != (k, 0) or not _static(x) or x.meta.rank != 2 or x.meta.shape[0] != t \
            or len(chain.users.get(rows.id, [])) != 1:
        return None
    gate = chain.only_reader(up_out, tuple(_GATES))
    if gate is None or gate.outputs[0] is not h:
        return None
    result = _weighted_sum(down_out, weights, t, k, chain)
    return None if result is None else (x, w_up, gate, w_down, result)


# torch's grouped GEMM, and transformers' own op for it where torch's is not used (weights other than bf16
# under torch.export: fp16 and fp32 models): both take (rows sorted by expert, W [E, K, N], offsets)
_GROUPED_MM = ("aten._grouped_mm", "fallback.aten._grouped_mm", "fallback.transformers.grouped_mm_fallback")


def _grouped_product(node: Node, offs: Value) -> tuple[Value, Value] | None:
    """(rows, W [E, N, K]) of ``_grouped_mm(rows, permute(W, [0, 2, 1]), offs)``."""
    args = list(node.args) + ([node.kwargs["offs"]] if "offs" in node.kwargs else [])
    if node.op not in _GROUPED_MM or len(args) != 3 or args[2] is not offs \
            or any(node.kwargs.get(key) is not None for key in ("bias", "out_dtype")):
        return None
    perm = _make(args[1])
    if perm is None or perm.op != "aten.permute" or _ints(perm.args[1]) != [0, 2, 1] or not _static(perm.args[0]):
        return None
    return args[0], perm.args[0]


def _sentinel_masking(sentinel: Value, users: dict) -> dict[int, Value] | None:
    """{masked value id: the value} for every ``where(unsqueeze(sentinel, -1), 0, value)``; None when the
    mask is read any other way."""
    out = {}
    for unsq in users.get(sentinel.id, []):
        if unsq.op != "aten.unsqueeze" or not _last(unsq.args[1], 2):
            return None
        for w in users.get(unsq.outputs[0].id, []):
            zero = _make(w.args[1]) if w.op == "aten.where.self" and len(w.args) == 3 else None
            if zero is None or zero.op != "aten.scalar_tensor" or zero.args[0] != 0 or w.args[0] is not unsq.outputs[0]:
                return None
            out[w.outputs[0].id] = w.args[2]
    return out


def _past_mask(v: Value, masked: dict[int, Value], chain: _Chain) -> Value | None:
    """``v``, or the sentinel masking of it that is its only reader."""
    readers = chain.users.get(v.id, [])
    if len(readers) == 1 and readers[0].op == "aten.where.self" and masked.get(readers[0].outputs[0].id) is v:
        return readers[0].outputs[0] if v.id not in chain.pinned else None
    return v


def _grouped(ids: Value, logits: Value, k: int, weights: Value, chain: _Chain):
    """The same for the grouped_mm experts: the choices sorted by expert (``sort``), the tokens gathered in
    that order, offsets from ``cumsum(histc(sorted ids))``, two ``_grouped_mm``, the routing weights gathered
    in that order, and the rows put back in the choices' order (``index`` by the inverse permutation, made by
    ``index_put(empty, [perm], arange(S))``) before the sum. Every row is its choice's product whatever the
    order, so the result is the batched form's; the order never leaves the chain."""
    t, n_experts = logits.meta.shape
    flat = chain.only_reader(ids, ("aten.view", "aten.reshape"))
    srt = chain.only_reader(flat.outputs[0], "aten.sort") if flat is not None and _ints(flat.args[1]) == [-1] else None
    if srt is None or any(a not in (0, -1, False) for a in srt.args[1:]) or srt.kwargs.get("descending"):
        return None
    sorted_ids, perm = srt.outputs
    # transformers 5.17 masks rows of expert ids >= E (expert parallelism's sentinels) at three points:
    # no id from a top-k over E experts is one, so each such masking is the value itself
    users = chain.users
    id_readers = users.get(sorted_ids.id, [])
    casts = [n for n in id_readers if is_dtype_cast(n)]
    sentinel = next((n.outputs[0] for n in id_readers if n.op == "aten.ge.Scalar" and n.args[1] == n_experts), None)
    if len(casts) != 1 or len(id_readers) != 1 + (sentinel is not None) or sorted_ids.id in chain.pinned:
        return None
    masked = _sentinel_masking(sentinel, users) if sentinel is not None else {}
    if masked is None:
        return None
    cast = casts[0]
    hist = chain.only_reader(cast.outputs[0], ("aten.histc", "fallback.aten.histc"))
    if hist is None or list(hist.args[1:4]) != [n_experts, 0, n_experts - 1]:
        return None
    csum = chain.only_reader(hist.outputs[0], "aten.cumsum")
    if csum is None or csum.args[1] not in (0, -1) or csum.kwargs.get("dtype") not in (torch.int32, None):
        return None
    offs = csum.outputs[0]
    mms = users.get(offs.id, [])
    products = [_grouped_product(n, offs) for n in mms]
    if len(mms) != 2 or None in products or offs.id in chain.pinned:
        return None
    readers = users.get(perm.id, [])
    by_op = {n.op: n for n in readers}
    tok, gw, inv = by_op.get("aten.div.Tensor_mode"), by_op.get("aten.index.Tensor"), by_op.get("aten.index_put")
    if len(readers) != 3 or None in (tok, gw, inv) or perm.id in chain.pinned:
        return None
    if tok.args[:2] != (perm, k) or tok.kwargs.get("rounding_mode") != "floor" \
            or list(gw.args[1]) != [perm] or not _flat(gw.args[0], weights):
        return None
    arange = _make(inv.args[2]) if len(inv.args) > 2 else None
    if list(inv.args[1]) != [perm] or (len(inv.args) > 3 and inv.args[3]) or arange is None \
            or arange.op not in ("aten.arange.start_step", "aten.arange.start", "aten.arange") \
            or [a for a in arange.args if isinstance(a, int)] not in ([0, t * k], [t * k], [0, t * k, 1]):
        return None
    products = [(masked.get(rows.id, rows), w) for rows, w in products]
    ups = [(n, p) for n, p in zip(mms, products) if _make(p[0]) is not None and _make(p[0]).op == "aten.index.Tensor"]
    if len(ups) != 1:
        return None
    (up_mm, (rows, w_up)), = ups
    down_mm, (h, w_down) = next((n, p) for n, p in zip(mms, products) if n is not up_mm)
    gather = _make(rows)
    x = gather.args[0]
    if list(gather.args[1]) != [tok.outputs[0]] or not _static(x) or x.meta.rank != 2 or x.meta.shape[0] != t \
            or any(w.meta.shape[0] != n_experts for w in (w_up, w_down)):
        return None
    up_out, down_out = (_past_mask(mm.outputs[0], masked, chain) for mm in (up_mm, down_mm))
    gate = chain.only_reader(up_out, tuple(_GATES)) if up_out is not None else None
    if gate is None or gate.outputs[0] is not h or down_out is None:
        return None
    found = _scaled(down_out, chain)
    if found is None or found[1] is not gw.outputs[0]:
        return None
    back = chain.only_reader(found[0].outputs[0], "aten.index.Tensor")
    if back is None or list(back.args[1]) != [inv.outputs[0]]:
        return None
    result = _token_sum(back.outputs[0], t, k, chain)
    return None if result is None else (x, w_up, gate, w_down, result)


_SHARED_GATES = {"ost.swiglu": "silu", "ost.geglu": "gelu"}


def _shared_expert(result: Value, chain: _Chain) -> tuple[Node, tuple] | None:
    """(the add, (gate, up, activation, W_s, gate logit or None)) of a shared expert added to the routed
    experts' ``result``: ``result + linear(act(gate) * up, W_s)``, the shared term optionally scaled by
    ``sigmoid(logit)`` ([T, 1]: Qwen2-MoE's shared_expert_gate), every step read only here and in
    ``result``'s dtype, all [T, ...]."""
    add = chain.only_reader(result, "aten.add.Tensor")
    if add is None or len(add.args) != 2 or add.kwargs.get("alpha", 1) != 1:
        return None
    term = add.args[1] if add.args[0] is result else add.args[0]
    if not _static(term) or term.meta.shape != result.meta.shape or len(chain.users.get(term.id, [])) != 1 \
            or term.id in chain.pinned:
        return None
    logit, shared = None, term
    scale = _make(term)
    if scale is not None and scale.op == "aten.mul.Tensor":
        for sig_v, shared_v in (scale.args, scale.args[::-1]):
            sig = _make(sig_v)
            if sig is not None and sig.op == "aten.sigmoid" and chain.only_reader(sig_v, "aten.mul.Tensor") is scale \
                    and chain.only_reader(shared_v, "aten.mul.Tensor") is scale:
                logit, shared = sig.args[0], shared_v
                break
        else:
            return None
    lin = _make(shared)
    if lin is None or lin.op != "aten.linear" or (len(lin.args) > 2 and lin.args[2] is not None) or lin.kwargs:
        return None
    act = _make(lin.args[0])
    if act is None or act.op not in _SHARED_GATES or act.args[2:] not in ((), ("none",)) or act.kwargs \
            or chain.only_reader(act.outputs[0], "aten.linear") is not lin:
        return None
    gate, up, w_s = act.args[0], act.args[1], lin.args[1]
    t, hidden = result.meta.shape if result.meta.rank == 2 else (None, None)
    dtype = result.meta.dtype
    if t is None or not all(_static(v) and v.meta.dtype == dtype for v in (gate, up, w_s, shared)) \
            or gate.meta.shape != up.meta.shape or gate.meta.rank != 2 or gate.meta.shape[0] != t \
            or w_s.meta.shape != (hidden, gate.meta.shape[1]):
        return None
    if logit is not None and (not _static(logit) or logit.meta.shape != (t, 1) or logit.meta.dtype != dtype):
        return None
    return add, (gate, up, _SHARED_GATES[act.op], w_s, logit)


def fuse_moe(g: Graph, max_rows: int | None = None) -> Graph:
    """The MoE MLPs of steps of at most MAX_TOKENS tokens (and, given ``max_rows``, at most that many tokens x
    choices) become ost.moe_up + ost.moe_down."""
    chain = _Chain(g.users(), pinned_values(g))
    replaced: dict[int, Node] = {}
    for topk in g.nodes:
        if topk.op != "aten.topk":
            continue
        found = _route(topk)
        if found is None:
            continue
        logits, k, route_dtype, topk_first = found
        t, n_experts = logits.meta.shape
        if not 0 < t <= MAX_TOKENS or (max_rows is not None and t * k > max_rows):
            continue
        vals, ids = topk.outputs
        weights = _weights(vals, chain, topk_first)
        if weights is None:
            continue
        found = _batched(ids, logits, k, weights[0], chain) or _grouped(ids, logits, k, weights[0], chain)
        if found is None:
            continue
        x, w_up, gate, w_down, result = found
        if gate.args[1:] not in ((), ("none",)):
            continue
        h = gate.outputs[0]
        normalize, weights_dtype = weights[1], weights[2]
        up = Node("ost.moe_up", (x, logits, w_up, k, route_dtype, _GATES[gate.op], topk_first), {}, gate.name,
                  gate.source)
        chosen = g.new_value(f"{gate.name}_experts", TensorMeta(torch.int64, (t * k,)), "temp", up)
        up.outputs, h.producer = [h, chosen], up
        args = (h, chosen, logits, w_down, k, route_dtype, normalize, weights_dtype, result.meta.dtype, topk_first)
        # a shared expert added to the sum joins its kernel: the op then ends at the add, not the sum
        shared = _shared_expert(result, chain)
        op, end, extra = ("ost.moe_down", result.producer, ()) if shared is None else ("ost.moe_down_shared", *shared)
        down = Node(op, (*args, *extra), {}, end.name, end.source)
        replaced[id(gate)], replaced[id(end)] = up, down
        down.outputs, end.outputs[0].producer = [end.outputs[0]], down
    if replaced:
        g.nodes = [replaced.get(id(n), n) for n in g.nodes]
        g = eliminate_dead_code(g)     # the rest of each chain, before later passes rewrite its products
        made = {id(r) for r in replaced.values()}
        for up in [n for n in g.nodes if n.op == "ost.moe_up" and id(n) in made]:
            _router_on_rows(g, up.args[1], up)
    return g


def fuse_moe_gathered(g: Graph) -> Graph:
    """fuse_moe for a CPU program: steps of at most MAX_GATHERED_ROWS tokens x choices."""
    return fuse_moe(g, MAX_GATHERED_ROWS)
