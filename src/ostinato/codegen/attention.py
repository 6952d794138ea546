"""Decode attention with its neighbours: the step's cache writes and rotary embedding join the attention.

A decoder layer's decode step runs, between its QKV projection and its output projection, ``rope(q)``,
``rope(k)``, ``kv_update_(k_cache, k)``, ``kv_update_(v_cache, v)`` and ``sdpa(q, k_cache, v_cache)``:
five launches for a few kilobytes of work. This pass, run on the scheduler's result, puts one
``ost.decode_attention_`` node (ir/fused_ops.py; one Triton kernel on CUDA) in their place when

- the attention reads exactly the two caches' kv_update_ results and is not causal-by-flag, with one
  query token and one row written per step (static shapes), on 4-D [B, H, S, D] caches written on
  dim 2, all of one dtype; or on sequence-major [B, S, H, D] caches written on dim 1, which the attention
  reads through a transpose to [B, H, S, D] as its q is one of a [B, 1, H, D] tensor (the transposes,
  read by the attention alone, join the node, which then takes q, k and v in that layout); a position
  mask is ``q_pos``, and an explicit mask (Mistral's sliding
  window, a padding mask: boolean, or additive as the sdpa pass makes them) is read by the kernel
  when it broadcasts over the [B, Hq, 1, S] scores, and a soft cap on the scores (Gemma 2) is applied
  before it;
- the ropes are absorbed only as a pair, with the same cos, sin and form, each read by nothing but the
  attention (q) and the key's write (k), keeping their dtype; otherwise they stay launches of their own;
- so are RMSNorms before the ropes, alike for q and k: each head's (Qwen 3, Gemma 3) or one of the whole
  projection before its view into heads (OLMo 2, in fp32 between casts); a generated group whose every
  node the attention takes goes with it (one it would take in part stays, and the norms with it);
- q, k and v may each be an ``ost.row_scale`` of an fp32 product (a batched step's norm folded into its
  projection, passes/fold_norms.py): the node then takes the products and the norm's input, and the
  kernel scales them;
- moving the members to the attention's place changes nothing: no impure node stands between them
  and nothing outside them reads a member's value before the attention runs.

The kernel's own plan still checks the real tensors (layouts, the position's shape) and runs the
reference where they do not fit. OSTINATO_FUSE_ATTENTION=0 turns the pass off (the A/B switch).
"""
from __future__ import annotations

import os

import torch

from ..ir import Node, Value, get_op
from ..ir.types import TensorMeta
from .schedule import FusionGroup

OP = "ost.decode_attention_"


def attention_fusion_enabled() -> bool:
    return os.environ.get("OSTINATO_FUSE_ATTENTION", "1") != "0"


def _tensor(v) -> bool:
    return isinstance(v, Value) and isinstance(v.meta, TensorMeta)


def _static(v: Value) -> tuple[int, ...] | None:
    shape = v.meta.shape
    return tuple(shape) if all(isinstance(d, int) for d in shape) else None


def _broadcasts(mask, scores: tuple[int, ...]) -> bool:
    """``mask`` is a boolean or floating tensor of static shape broadcasting over ``scores``."""
    if not _tensor(mask) or not (mask.meta.dtype == torch.bool or mask.meta.dtype.is_floating_point):
        return False
    shape = _static(mask)
    if shape is None or len(shape) > len(scores):
        return False
    return all(m in (1, s) for m, s in zip(shape[::-1], scores[::-1]))


def _only_reader(v: Value, reader: Node, users: dict, graph_reads: set[int]) -> bool:
    return v.id not in graph_reads and [id(u) for u in users.get(v.id, ())] == [id(reader)]


def _slice(v: Value, reader: Node, users, graph_reads, lone: set[int]) -> Node | None:
    """The lone aten.slice.Tensor of the last dim, step 1, making ``v``, read by ``reader`` alone."""
    node = v.producer
    if node is None or node.op != "aten.slice.Tensor" or id(node) not in lone or node.kwargs \
            or not _only_reader(v, reader, users, graph_reads) or not _tensor(node.args[0]):
        return None
    src, dim, start, end, step = (*node.args, *(0, None, None, 1)[len(node.args) - 1:])[:5]
    rank = len(src.meta.shape)
    return node if isinstance(dim, int) and dim % rank == rank - 1 and step == 1 else None


def _partial(v: Value, reader: Node, users, graph_reads, lone: set[int]):
    """(the rope, the whole rows, the rotary dim, [the cat and slices]) when ``v`` is the partial rotary
    embedding of GPT-NeoX, Phi-2, StableLM and GPT-J: ``cat([rope(x[..., :R]), x[..., R:]], -1)``, each
    piece lone and read by the next alone; else None."""
    cat = v.producer
    if cat is None or cat.op != "aten.cat" or id(cat) not in lone or cat.kwargs \
            or not _only_reader(v, reader, users, graph_reads):
        return None
    parts, dim = (*cat.args, 0)[:2]
    if len(parts) != 2 or not all(_tensor(x) for x in parts) or dim % len(v.meta.shape) != len(v.meta.shape) - 1:
        return None
    rope, rest = parts[0].producer, _slice(parts[1], cat, users, graph_reads, lone)
    if rope is None or rope.op != "ost.rope" or id(rope) not in lone or rest is None \
            or not _only_reader(parts[0], cat, users, graph_reads):
        return None
    rot = _slice(rope.args[0], rope, users, graph_reads, lone) if _tensor(rope.args[0]) else None
    if rot is None or rot.args[0] is not rest.args[0]:
        return None
    width = _static(rest.args[0])
    r = rot.args[3] if len(rot.args) > 3 else None
    end = rest.args[3] if len(rest.args) > 3 else None
    if width is None or not isinstance(r, int) or (*rot.args, 0)[2] not in (0, None) or (*rest.args, 0)[2] != r \
            or not 0 < r < width[-1] or r % 2 or not (end is None or end >= width[-1]):
        return None     # (the rest must run to the row's end: the merged node takes the whole row)
    return rope, rest.args[0], r, [cat, rot, rest]


def _cast(v: Value, reader: Node, users, graph_reads, lone: set[int]) -> Node | None:
    """The lone dtype cast (aten._to_copy with only a dtype) making ``v``, read by ``reader`` alone."""
    node = v.producer
    if node is None or node.op != "aten._to_copy" or id(node) not in lone or set(node.kwargs) != {"dtype"} \
            or len(node.args) != 1 or not _tensor(node.args[0]) or not _only_reader(v, reader, users, graph_reads):
        return None
    return node


def _ropes(q: Value, k_new: Value, sdpa: Node, k_write: Node, users, graph_reads, lone: set[int]):
    """(q before rope, k before rope, cos, sin, interleaved, [the nodes taken], the rotary dim: None for the
    whole head, wide) when both are roped alike: over the whole head, or both over its first R dims, or
    (``wide``) in fp32 over half rows and cast back to them (OLMo's fp32 cos; Cohere's rows cast up first)."""
    partial = [_partial(x, r, users, graph_reads, lone) for x, r in ((q, sdpa), (k_new, k_write))]
    rotary, extra, readers, wide = None, [], [sdpa, k_write], False
    if all(partial) and partial[0][2] == partial[1][2]:
        (rq, q_rows, rotary, q_nodes), (rk, k_rows, _, k_nodes) = partial
        extra = q_nodes + k_nodes
        q, k_new = rq.outputs[0], rk.outputs[0]     # the checks below as for whole-head ropes
    casts = [_cast(x, r, users, graph_reads, lone) for x, r in ((q, sdpa), (k_new, k_write))]
    if rotary is None and all(casts) and all(c.args[0].meta.dtype == torch.float32 for c in casts):
        readers, extra, wide = casts, list(casts), True
        q, k_new = (c.args[0] for c in casts)
    rq, rk = q.producer, k_new.producer
    if rq is None or rk is None or rq.op != "ost.rope" or rk.op != "ost.rope" or id(rq) not in lone \
            or id(rk) not in lone or rq.kwargs or rk.kwargs:
        return None
    qa, ka = (*rq.args, False)[:4], (*rk.args, False)[:4]
    if qa[1] is not ka[1] or qa[2] is not ka[2] or bool(qa[3]) != bool(ka[3]):
        return None
    if not (_tensor(qa[0]) and _tensor(ka[0]) and _tensor(qa[1]) and _tensor(qa[2])):
        return None
    rows = [qa[0], ka[0]]
    if wide:    # rows of the casts' dtype (Cohere casts them up first: that cast goes too), cos and sin fp32
        for n, (x, rope) in enumerate(zip(rows, (rq, rk))):
            up = _cast(x, rope, users, graph_reads, lone) if x.meta.dtype == torch.float32 else None
            if up is not None:
                rows[n] = up.args[0]
                extra.append(up)
        half = casts[0].outputs[0].meta.dtype
        if any(c.outputs[0].meta.dtype != half or x.meta.dtype not in (half, torch.float32)
               for x, c in zip(rows, casts)) or {qa[1].meta.dtype, qa[2].meta.dtype} - {torch.float32, half}:
            return None     # (rows cast up inside a group stay fp32: the kernel reads them so)
    elif qa[0].meta.dtype != q.meta.dtype or ka[0].meta.dtype != k_new.meta.dtype:
        return None     # the rope promoted, and is not cast back: not the kernel's rounding
    if rotary is not None:
        return q_rows, k_rows, qa[1], qa[2], bool(qa[3]), [rq, rk, *extra], rotary, False
    if not _only_reader(q, readers[0], users, graph_reads) or not _only_reader(k_new, readers[1], users, graph_reads):
        return None
    return rows[0], rows[1], qa[1], qa[2], bool(qa[3]), [rq, rk, *extra], None, wide


_NO_NORMS = (None, None, 0.0, None, 0.0, False)     # ost.decode_attention_'s norm arguments, unused


def _rms_norm(x: Value, reader: Node, users, graph_reads, lone: set[int]):
    """(the norm's input, its settings, the nodes) when ``x`` is made by a lone RMSNorm over its last dim with a
    weight as wide, read by ``reader`` alone: an ost.rms_norm over rows of the weight's dtype, or (OLMo 2's
    ``(weight * h).to(dtype)``) one over those rows cast to fp32, its result cast back (then the settings of
    ``rms_norm(rows, weight, eps, fp32, offset, weight_first=True)``, the same arithmetic); else None."""
    down = _cast(x, reader, users, graph_reads, lone)
    if down is not None:    # the cast back: the norm ran in fp32
        x, reader = down.args[0], down
        if x.meta.dtype != torch.float32:
            return None
    node = x.producer
    if node is None or node.op != "ost.rms_norm" or id(node) not in lone or node.kwargs \
            or not _only_reader(x, reader, users, graph_reads) or not 3 <= len(node.args) <= 6:
        return None
    rows, weight, eps, cdt, offset, first = (*node.args, *(None, 0.0, False)[len(node.args) - 3:])
    if not (_tensor(rows) and _tensor(weight)) or _static(weight) != (rows.meta.shape[-1],) \
            or not isinstance(eps, (int, float)):
        return None
    if down is None:
        return (rows, (float(eps), cdt, float(offset), bool(first)), [node]) \
            if weight.meta.dtype == rows.meta.dtype else None
    up = _cast(rows, node, users, graph_reads, lone)
    dt = down.outputs[0].meta.dtype
    if up is None or up.args[0].meta.dtype != dt or cdt not in (None, torch.float32) \
            or weight.meta.dtype not in (dt, torch.float32) or not (first or offset == 0):
        return None     # (w + offset in the weight's dtype, before the fp32 product: another rounding)
    return up.args[0], (float(eps), torch.float32, float(offset), True), [up, node, down]


def _head_norm(x: Value, reader: Node, users, graph_reads, lone: set[int]):
    """(the norm's input, its settings, the nodes, whole) when ``x`` (a head's [..., D] rows) is normed
    over the head dim (whole False), or is a lone view of [B, 1, H * D] rows normed whole, every head at
    once, as [B, 1, H, D] (OLMo 2's q and k norms; whole True); else None."""
    found = _rms_norm(x, reader, users, graph_reads, lone)
    if found is not None:
        return (*found, False)
    view = x.producer
    if view is None or view.op not in ("aten.view", "aten._unsafe_view", "aten.reshape") or id(view) not in lone \
            or view.kwargs or not _only_reader(x, reader, users, graph_reads) or not _tensor(view.args[0]):
        return None
    rows, shape = view.args[0], _static(x)
    if shape is None or len(shape) != 4 or shape[1] != 1 or _static(rows) != (shape[0], 1, shape[2] * shape[3]):
        return None
    found = _rms_norm(rows, view, users, graph_reads, lone)
    return None if found is None else (found[0], found[1], [*found[2], view], True)


def _norms(q_in: Value, k_in: Value, v: Value, ropes: list[Node], k_write: Node, major: bool, users, graph_reads,
           lone: set[int]):
    """Qwen 3's and Gemma 3's RMSNorm of each head before the rope, or OLMo 2's of the whole projection: (q, k
    and v rows, the norms' arguments, the nodes taken) when q's and k's rope inputs are such norms alike:
    of the rope's rows themselves (Gemma 3), or, over head-major caches, of [B, 1, H, D] rows (or of
    [B, 1, H * D] rows viewed so, OLMo 2) the model then transposes to [B, H, 1, D] (Qwen 3), whose
    transposes go too, v's included (the reference transposes the rows after the norms); else None."""
    rows, nodes, before = [], [], []
    for x, rope in zip((q_in, k_in), ropes):
        t = None if major or (x.producer is not None and x.producer.op in ("ost.rms_norm", "aten._to_copy")) \
            else _transposed(x, rope, users, graph_reads, lone)
        if t is not None:       # the transpose between the norm and the rope
            x, rope = t.args[0], t
            nodes.append(t)
        before.append(t is not None)
        found = _head_norm(x, rope, users, graph_reads, lone)
        if found is None:
            return None
        rows.append(found)
        nodes.extend(found[2])
    (q_rows, q_set, q_nodes, whole), (k_rows, k_set, k_nodes, k_whole) = rows
    if q_set != k_set or before[0] != before[1] or whole != k_whole:
        return None
    if before[0]:           # v too, as the rows before its transpose
        t = _transposed(v, k_write, users, graph_reads, lone)
        if t is None:
            return None
        v = t.args[0]
        nodes.append(t)
        if any(len(x.meta.shape) != (3 if whole else 4) or x.meta.shape[1] != 1 for x in (q_rows, k_rows)) \
                or len(v.meta.shape) != 4 or v.meta.shape[1] != 1:
            return None
    weight = [n for n in (*q_nodes, *k_nodes) if n.op == "ost.rms_norm"]
    return q_rows, k_rows, v, (weight[0].args[1], weight[1].args[1], *q_set), nodes


def _row_scaled(rows, members: list[Node], cache: Value, users, graph_reads, lone: set[int]):
    """((q, k, v) as the fp32 products, x, eps, their biases or None, whether the statistic is LayerNorm's
    (row_scale's ``center``), (the shift of x, q's, k's and v's pre-scale biases) or None, the ost.row_scale
    nodes and the
    transposes taken) when q, k and v (as the attention's members read them) are each a lone
    ``ost.row_scale`` to the caches' dtype of one ``x`` and ``eps``, read by a member alone, all three with a
    bias or none; else None."""
    nodes, taken, products = [], [], []
    inside = {id(m) for m in members}
    for v in rows:      # (read by members only: a partial rope's two slices read q and k)
        readers = users.get(v.id, ())
        if not _tensor(v) or v.id in graph_reads or not readers or any(id(u) not in inside for u in readers):
            return None
        node = v.producer
        turn = _transposed(v, None, users, graph_reads, lone) if node is not None \
            and node.op != "ost.row_scale" else None
        if turn is not None:    # [B, 1, H, D] rows scaled, then turned to [B, H, 1, D]: the kernel takes the rows
            v, node = turn.args[0], turn.args[0].producer
            if v.meta.shape[1] != 1 or [id(u) for u in users.get(v.id, ())] != [id(turn)]:
                return None
            taken.append(turn)
        if node is None or node.op != "ost.row_scale" or id(node) not in lone or node.kwargs \
                or len(node.args) not in (4, 5, 6, 8):
            return None
        nodes.append(node)
        products.append(node.args[0])
    x, eps, dtype = nodes[0].args[1:4]
    if any(n.args[1] is not x or n.args[2] != eps or n.args[3] != dtype for n in nodes) or dtype != cache.meta.dtype:
        return None
    biases = [n.args[4] if len(n.args) > 4 else None for n in nodes]
    if any(b is None for b in biases) != all(b is None for b in biases):
        return None         # (the kernel adds all three or none)
    centers = {bool(n.args[5]) if len(n.args) > 5 else False for n in nodes}
    shifts = [n.args[6] if len(n.args) > 6 else None for n in nodes]
    if len(centers) != 1 or any(t is not shifts[0] for t in shifts):
        return None         # (one statistic for the three)
    pres = [n.args[7] for n in nodes] if shifts[0] is not None else None
    return (tuple(products), x, float(eps), None if biases[0] is None else biases, centers.pop(),
            None if shifts[0] is None else (shifts[0], pres), nodes + taken)


def _transposed(v: Value, sdpa: Node, users, graph_reads, lone: set[int]) -> Node | None:
    """The lone node swapping dims 1 and 2 of a 4-D tensor that makes ``v``, read by ``sdpa`` alone (None: its
    readers checked by the caller)."""
    node = v.producer
    if node is None or id(node) not in lone or node.kwargs \
            or sdpa is not None and not _only_reader(v, sdpa, users, graph_reads) \
            or not _tensor(node.args[0]) or len(node.args[0].meta.shape) != 4:
        return None
    if node.op == "aten.permute" and [d % 4 for d in node.args[1]] == [0, 2, 1, 3]:
        return node
    if node.op == "aten.transpose.int" and sorted(d % 4 for d in node.args[1:3]) == [1, 2]:
        return node
    return None


def _rows_roped(q: Value, k_new: Value, sdpa: Node, k_write: Node, users, graph_reads, lone: set[int]):
    """(``_ropes``' answer, the two transposes) when q and the key written are lone transposes to [B, H, 1, D]
    of [B, 1, H, D] rows roped alike (GPT-J ropes before its transpose) with cos and sin broadcasting over
    the heads and the token (the merged node ropes the rows' [B, H, 1, D] view); else (None, [])."""
    turned = [_transposed(q, sdpa, users, graph_reads, lone), _transposed(k_new, k_write, users, graph_reads, lone)]
    if not all(turned) or any(t.args[0].meta.shape[1] != 1 for t in turned):
        return None, []
    ropes = _ropes(turned[0].args[0], turned[1].args[0], turned[0], turned[1], users, graph_reads, lone)
    if ropes is None or ropes[7] or any(_static(t) is None or len(t.meta.shape) > 4
                                        or any(d != 1 for d in _static(t)[-3:-1]) for t in ropes[2:4]):
        return None, []     # (a wide rope's casts: not taken this way)
    return ropes, turned


def _match(sdpa: Node, users, graph_reads, lone: set[int]) -> tuple[Node, list[Node]] | None:
    """The ost.decode_attention_ node for ``sdpa`` and the nodes it replaces, or None."""
    if len(sdpa.args) not in (8, 9) or sdpa.kwargs:
        return None
    q, k, v, mask, q_pos, scale, n_rep, causal, softcap = (*sdpa.args, None)[:9]
    if causal or not (_tensor(q) and _tensor(k) and _tensor(v)):
        return None
    views = [_transposed(x, sdpa, users, graph_reads, lone) for x in (q, k, v)]
    major = all(views)      # sequence-major caches, read through transposes
    if major:
        q, k, v = (n.args[0] for n in views)
    kw, vw = k.producer, v.producer
    if kw is None or vw is None or kw is vw or kw.op != "ost.kv_update_" or vw.op != "ost.kv_update_" \
            or id(kw) not in lone or id(vw) not in lone or kw.kwargs or vw.kwargs:
        return None
    (kc, kn, index, dim, ring), (vc, vn, index2, dim2, ring2) = (*kw.args, None)[:5], (*vw.args, None)[:5]
    if index2 is not index or dim2 != dim or ring2 != ring or dim != (1 if major else 2) or not _tensor(index):
        return None
    shapes = [_static(x) for x in (q, kc, vc, kn, vn)]
    if any(s is None or len(s) != 4 for s in shapes) or index.meta.shape != (1,):
        return None
    if major:       # as [B, H, S, D]
        shapes = [(s[0], s[2], s[1], s[3]) for s in shapes]
    (b, hq, t, d), (b2, hkv, _, d2) = shapes[0], shapes[1]
    if hkv == 1 and n_rep == 1:
        n_rep = hq      # one KV head broadcast over every query head (Falcon's multi-query sdpa): GQA's form
    if t != 1 or shapes[2] != shapes[1] or shapes[3] != (b, hkv, 1, d) or shapes[4] != shapes[3] \
            or (b2, d2) != (b, d) or hq != hkv * n_rep or d > 256:
        return None
    if len({x.meta.dtype for x in (q, kc, vc, kn, vn)}) != 1:
        return None
    if q_pos is not None and not _tensor(q_pos):
        return None
    if mask is not None and not _broadcasts(mask, (b, hq, 1, shapes[1][2])):
        return None
    members = [kw, vw, *(views if major else ()), sdpa]
    q_in, k_in, v_in, cos, sin, interleaved, norms, rotary, wide = q, kn, vn, None, None, False, _NO_NORMS, None, False
    ropes = _ropes(q, kn, views[0] if major else sdpa, kw, users, graph_reads, lone)
    if ropes is None and not major:     # [B, 1, H, D] rows roped, then transposed (GPT-J)
        ropes, turned = _rows_roped(q, kn, sdpa, kw, users, graph_reads, lone)
        members = turned + members
    if ropes is not None:
        q_in, k_in, cos, sin, interleaved, nodes, rotary, wide = ropes
        members = nodes + members
        normed = None if rotary else _norms(q_in, k_in, vn, nodes[:2], vw, major, users, graph_reads, lone)
        if normed is not None:
            q_in, k_in, v_in, norms, taken = normed
            members = taken + members
    scaled = _row_scaled((q_in, k_in, v_in), members, kc, users, graph_reads, lone)
    if scaled is not None:      # q, k and v as fp32 products of a folded norm's input (passes/fold_norms.py)
        (q_in, k_in, v_in), row_x, row_eps, row_bias, center, shift, taken = scaled
        members = taken + members
        extra = (*norms, rotary, bool(wide), row_x, row_eps, *((row_bias, center, *shift) if shift is not None
                                                                 else (row_bias, True) if center
                                                                 else () if row_bias is None else (row_bias,)))
    else:
        extra = (*norms, rotary, True) if wide else (*norms, rotary) if rotary else norms if norms is not _NO_NORMS else ()
    node = Node(OP, (kc, vc, q_in, k_in, v_in, index, dim, ring, cos, sin, interleaved, q_pos, scale, n_rep,
                     mask, softcap, *extra), {}, sdpa.name, sdpa.source)
    node.outputs = [sdpa.outputs[0], kw.outputs[0], vw.outputs[0]]
    return node, members


def absorb_attention(graph, items: list, users: dict, graph_reads: set[int]) -> list:
    """``items`` (the scheduler's result, in run order) with each decode attention and the nodes it
    can take replaced by one ost.decode_attention_ node, run where the attention stood. A generated group
    whose every node the attention takes (OLMo 2's norms in fp32 between their casts) goes with them;
    one it would take only in part stays, and the attention takes what it can without it."""
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    impure = [i for i, n in enumerate(graph.nodes) if get_op(n.op) is None or not get_op(n.op).pure]
    out = list(items)
    lone = {id(it) for it in items if isinstance(it, Node)}     # nodes no group or merge has taken
    # nodes of the pointwise and reduction groups (not a matmul group: its projection is never taken)
    grouped = {id(n): g for g in items if type(g) is FusionGroup for n in g.nodes}
    for sdpa in [it for it in items if isinstance(it, Node) and it.op == "ost.sdpa"]:
        for pool in (lone | set(grouped), lone):    # with the groups' nodes, then without
            m = _match(sdpa, users, graph_reads, pool)
            if m is None:
                continue
            node, members = m
            ids = {id(n) for n in members}
            taken = {id(grouped[i]): grouped[i] for i in ids if i in grouped}
            if any(id(n) not in ids for g in taken.values() for n in g.nodes):
                continue        # a group taken in part
            first, launch = min(position[id(n)] for n in members), position[id(sdpa)]
            if any(first < p < launch and id(graph.nodes[p]) not in ids for p in impure):
                continue        # a state write between: the cache writes must not move across it
            made = {v.id for n in members for v in n.outputs if v is not None}
            between = [it for it in out if not (isinstance(it, Node) and id(it) in ids) and id(it) not in taken
                       and first <= (it.launch_at if isinstance(it, FusionGroup) else position[id(it)]) < launch]
            if any(v.id in made for it in between for n in (it.nodes if isinstance(it, FusionGroup) else [it])
                   for v in n.inputs):
                continue        # read before the merged kernel makes it
            position[id(node)] = launch
            lone -= ids
            for i in ids:
                grouped.pop(i, None)
            out = [node if it is sdpa else it for it in out if id(it) not in taken
                   and (not (isinstance(it, Node) and id(it) in ids) or it is sdpa)]
            break
    return out
