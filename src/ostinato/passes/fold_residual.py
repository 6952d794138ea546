"""The residual add before a folded norm as the in-place accumulation of the projection that made one of its
operands (passes/fold_norms.py): ``r += h @ W^T`` (``ost.linear_acc_``, cuBLAS's beta=1), so the add leaves no
kernel of its own.

The sum -- ``ost.add_rms_norm``'s, or an ``aten.add`` making the norm's input or what reshapes make it of
(OPT's) -- must have one operand made by a projection (``aten.linear``, an ``ost.linear`` without an
activation, ``aten.addmm``; a constant weight and bias or none), through reshapes each read by the next alone,
read by this add alone; the other must be a temporary made by a node that is not a view, returned by nothing,
whose every other reader runs before the add (an ancestor of it), or a reshape of one (``accumulator``).

**Biased output projections (OPT, StarCoder 2, GPT-2).** cuBLAS's accumulation adds no bias, so a biased
projection accumulates without it and the stream then lags the true sum by the bias: ``t = s - o``, ``o`` the
fp32 sum of the biases so far (``ost.fold_offset``, made at compile). The folded norm takes the statistic of
``t + o`` and adds ``o`` through its weights (fold_norms.py). Any other reader of the sum (the next residual add)
reads ``t + o`` rounded to the stream's dtype; the next fold takes that as a lagging stream (``lags``: the
accumulation goes into ``t``, the offset grows by the next bias), so a layer stays six launches and only a
reader that is no fold (the final norm) adds the offset, in its own generated kernel.
"""
from __future__ import annotations

import math

import torch

from ..ir import Graph, Node, TensorMeta, Value, get_op
from ..ir.ops import may_alias

RESHAPES = ("aten.view", "aten._unsafe_view", "aten.reshape")


def static(v) -> tuple[int, ...] | None:
    if not isinstance(v, Value) or not isinstance(v.meta, TensorMeta):
        return None
    shape = tuple(v.meta.shape)
    return shape if all(isinstance(d, int) for d in shape) else None


def constant(v, rank: int) -> bool:
    return isinstance(v, Value) and v.role == "constant" and isinstance(v.meta, TensorMeta) and v.meta.rank == rank


def lone_projection(v, users: dict, pinned: set[int], reader: Node) -> tuple | None:
    """(the projection making ``v``, its input, its constant weight, whether that weight is [in, out], its
    constant bias or None, the reshapes between it and ``v``) when ``reader`` alone reads ``v`` and each
    reshape's input is read by the next alone. A projection: ``aten.linear``, an ``ost.linear`` without an
    activation (GPT-2's Conv1D: [in, out] weights), ``aten.addmm(bias, x, weight)`` of [in, out] weights."""
    if not isinstance(v, Value) or v.id in pinned or [id(u) for u in users.get(v.id, ())] != [id(reader)]:
        return None
    views = []
    node = v.producer
    while node is not None and node.op in RESHAPES and not node.kwargs and isinstance(node.args[0], Value) \
            and node.args[0].id not in pinned and [id(u) for u in users.get(node.args[0].id, ())] == [id(node)]:
        views.append(node)
        node = node.args[0].producer
    if node is None or node.kwargs:
        return None
    args = list(node.args)
    if node.op == "aten.linear" and len(args) in (2, 3):
        h, weight, bias, transposed = args[0], args[1], args[2] if len(args) == 3 else None, False
    elif node.op == "ost.linear" and 2 <= len(args) <= 5:
        args += [None, None, False][len(args) - 2:]
        if args[3] is not None:
            return None
        h, weight, bias, transposed = args[0], args[1], args[2], bool(args[4])
    elif node.op == "aten.addmm" and len(args) == 3:
        bias, h, weight, transposed = args[0], args[1], args[2], True
        if bias is None:
            return None
    else:
        return None
    if not constant(weight, 2) or not isinstance(h, Value):
        return None
    n_out = weight.meta.shape[1 if transposed else 0]
    if bias is not None and (not constant(bias, 1) or tuple(bias.meta.shape) != (n_out,)):
        return None
    return node, h, weight, transposed, bias, views


def accumulator(g: Graph, node: Node, shape, dtype, users: dict, pinned: set[int], lags: dict):
    """(``lone_projection``'s answer for the projection, the buffer to accumulate into, the offset it lags by or
    None, the nodes the accumulation replaces) of a sum (an ost.add_rms_norm's or an aten.add) that can be the
    projection's in-place accumulation into its other operand, else None. A biased projection accumulates
    without its bias: the result lags the sum by it (the caller carries the offset). The operand's
    buffer is written: it must be a temporary of its own (not a view, nor a result that may be its input
    itself), neither it nor any view of it may be the projection's input, a graph output or state, and
    everything that reads it or a view of it must run before the add (an ancestor of it). The operand may
    be a reshape of such a buffer, or a lagging stream (``lags``: an earlier fold's ``t + offset``) read
    by the add alone: the accumulation then goes into the buffer, or ``t``, carrying the offset on."""
    mine = None
    for o, r in ((node.args[0], node.args[1]), (node.args[1], node.args[0])):
        found = lone_projection(o, users, pinned, node)
        if found is None or static(o) != shape or not isinstance(r, Value) or static(r) != shape \
                or r.meta.dtype != dtype:
            continue
        lin, h, bias = found[0], found[1], found[4]
        if bias is not None and bias.meta.dtype != dtype or found[2].meta.dtype != dtype:
            continue
        if found[2].meta.shape[1 if found[3] else 0] != shape[-1]:
            continue
        for base, offset, dropped in _streams(r, users, pinned, node, lags):
            if base.role != "temp" or base.producer is None or base.meta.dtype != dtype \
                    or math.prod(static(base) or (-1,)) != math.prod(shape) or static(base)[-1] != shape[-1]:
                continue
            op = get_op(base.producer.op)
            # (the residual stream may already be an accumulation's result: it is its own buffer, not a view)
            if op is None or may_alias(base.producer.op) or (not op.pure and base.producer.op != "ost.linear_acc_"):
                continue
            aliases = _aliases(base, users)
            if any(a.id in pinned for a in aliases) or any(a is h for a in aliases):
                continue
            if mine is None:
                mine = _ancestors(node)
            if all(id(u) in mine for a in aliases for u in users.get(a.id, []) if u is not node):
                return found, base, offset, dropped + found[5]
    return None


def _streams(r: Value, users: dict, pinned: set[int], reader: Node, lags: dict):
    """The buffers a sum's operand ``r`` may be accumulated into, the furthest first: (the buffer, the
    offset it lags ``r`` by or None, the nodes that then go: a lagging stream's, reshapes nothing else
    reads), through reshapes (their other readers are the buffer's aliases, which the caller checks) and
    one lagging stream read by the next alone; ``r`` itself last."""
    chain, offset, dropped, v = [], None, [], r
    lone = True         # every value so far read by the next alone: what they are made of can go with them
    while isinstance(v, Value) and v.id not in pinned:
        node = v.producer
        lone = lone and [id(u) for u in users.get(v.id, ())] == [id(reader)]
        if v.id in lags and offset is None and lone:
            base, offset, nodes = lags[v.id]
            dropped = dropped + nodes
            reader, v = nodes[0], base
        elif node is not None and node.op in RESHAPES and not node.kwargs and isinstance(node.args[0], Value):
            if lone:
                dropped = dropped + [node]
            reader, v = node, node.args[0]
        else:
            break
        chain.append((v, offset, dropped))
    return chain[::-1] + [(r, None, [])]


def _reshape_chain(x: Value, s: Value, users: dict, pinned: set[int]) -> list[Node] | None:
    """The reshapes making ``x`` of ``s``, each value before ``x`` read by the next alone (not returned), else
    None."""
    chain = []
    while x is not s:
        node = x.producer
        if node is None or node.op not in RESHAPES or node.kwargs or not isinstance(node.args[0], Value):
            return None
        x = node.args[0]
        if x.id in pinned or [id(u) for u in users.get(x.id, ())] != [id(node)]:
            return None
        chain.append(node)
    return chain


def _aliases(v: Value, users: dict) -> list[Value]:
    """``v`` and every value that may share its memory: views of it (and views of those), and results of ops
    that may return their input itself."""
    out, stack, seen = [], [v], set()
    while stack:
        a = stack.pop()
        if a.id in seen:
            continue
        seen.add(a.id)
        out.append(a)
        for u in users.get(a.id, []):
            op = get_op(u.op)
            if may_alias(u.op) or (op is not None and op.category == "inplace"):
                stack.extend(o for o in u.outputs if o is not None)
    return out


def _ancestors(node: Node) -> set[int]:
    """ids of the nodes ``node`` depends on (transitively)."""
    seen: set[int] = set()
    stack = [node]
    while stack:
        for v in stack.pop().inputs:
            p = v.producer
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                stack.append(p)
    return seen


def sum_before(x: Value) -> Node | None:
    """The aten.add making ``x``, or making what a chain of reshapes makes ``x`` of: the fold must take it (as
    the accumulation of a projection) or leave the norm, with which it shares a kernel."""
    while isinstance(x, Value) and x.producer is not None:
        node = x.producer
        if node.op == "aten.add.Tensor":
            return node
        if node.op not in RESHAPES or not isinstance(node.args[0], Value):
            return None
        x = node.args[0]
    return None


def transpose(g: Graph, w: Value, at: Node, before: dict) -> Value:
    """A view of the 2-d ``w`` with its dims swapped, placed before ``at``."""
    t = Node("aten.t", (w,), {}, f"{w.name}_t", at.source)
    t.outputs = [g.new_value(t.name, TensorMeta(w.meta.dtype, tuple(w.meta.shape)[::-1]), "temp", t)]
    before.setdefault(id(at), []).append(t)
    return t.outputs[0]


def accumulate(g: Graph, node: Node, add: Node, x_in: Value | None, found: tuple, shape, users: dict,
               pinned: set[int], lags: dict, before: dict, dead: set, mapping: dict):
    """Rewrite ``add``, the sum before the norm ``node`` (``node`` itself for an ost.add_rms_norm; ``x_in`` the
    norm's input otherwise), as ``found``'s (``accumulator``'s answer) in-place accumulation: ``ost.linear_acc_``
    (after a transposed view of [in, out] weights) placed before the add, the offset the stream then lags by
    (``ost.fold_offset`` of the earlier offset and the projection's bias), and for the sum's other readers
    the lagging stream made whole (``t + o`` rounded, registered in ``lags``). New nodes go to ``before``,
    replaced ones to ``dead``, remapped values to ``mapping``. Returns (the value the row scales read as the
    norm's input, the offset or None), or None where a lagging sum is reshaped before its norm in a way this
    cannot take (nothing changed)."""
    (lin, h, weight, transposed, lin_bias, _), r, lag, dropped = found
    s_old = add.outputs[0]
    lagging = lag is not None or lin_bias is not None
    if lagging and add is not node and s_old is not x_in:
        # a sum reshaped before its norm (OPT's): the reshapes' results read by the next alone, the sum's
        # readers are then x_in's (the norm, the next residual add), which read the lagging stream
        chain = _reshape_chain(x_in, s_old, users, pinned)
        if chain is None:
            return None
        dead.update(id(n) for n in chain)
        s_old = x_in
    placed = []
    if transposed:
        weight = transpose(g, weight, add, before)
        placed = before.pop(id(add))
    acc = Node("ost.linear_acc_", (r, h, weight), {}, f"{add.name}_acc", add.source)
    total = g.new_value(acc.name, TensorMeta(s_old.meta.dtype, tuple(r.meta.shape)), "temp", acc)
    acc.outputs = [total]
    placed.append(acc)
    if tuple(r.meta.shape) != tuple(s_old.meta.shape):
        view = Node("aten.reshape", (total, list(s_old.meta.shape)), {}, f"{add.name}_rows", add.source)
        total = g.new_value(view.name, s_old.meta, "temp", view)
        view.outputs = [total]
        placed.append(view)
    if lin_bias is not None:    # the sum lags by the projection's bias too (fp32, made once at compile)
        parts = [lin_bias] if lag is None else [lag, lin_bias]
        off = Node("ost.fold_offset", (parts,), {}, f"{add.name}_offset", add.source)
        off.outputs = [g.new_value(off.name, TensorMeta(torch.float32, (shape[-1],)), "temp", off)]
        placed.insert(0, off)
        lag = off.outputs[0]
    if lag is None:
        mapping[s_old.id] = total
    elif s_old.id in pinned or any(u is not node for u in users.get(s_old.id, ())):
        # the sum's other readers (the next residual add) read ``total + lag``, rounded: a lagging stream,
        # which the next fold takes as its accumulation's buffer and offset
        up = Node("aten.add.Tensor", (total, lag), {}, f"{add.name}_lag", add.source)
        up.outputs = [g.new_value(up.name, TensorMeta(torch.float32, tuple(s_old.meta.shape)), "temp", up)]
        down = Node("aten._to_copy", (up.outputs[0],), {"dtype": s_old.meta.dtype}, f"{add.name}_lagged",
                    add.source)
        down.outputs = [g.new_value(down.name, s_old.meta, "temp", down)]
        placed += [up, down]
        mapping[s_old.id] = down.outputs[0]
        lags[down.outputs[0].id] = (total, lag, [up, down])
    before[id(add)] = placed
    dead.update((id(add), id(lin), *(id(n) for n in dropped)))
    # (the row scales' arguments are not remapped: OPT's reshape of the sum, when not lagging, reads the total)
    return (total if add is node or s_old is x_in else x_in), lag
