"""``ost.rope``: absorbs ``x * cos + rotate(x) * sin``, the rotation included.

Rotations matched (d = x's last dim):
- rotate_half (HF): ``cat((-x2, x1), -1)`` where x1, x2 are the halves of x: two ``slice``s
  ``[0, h)`` and ``[h, end)`` of equal length, or one ``split_with_sizes`` / ``split`` / ``chunk``
  into two equal parts. ``interleaved=False``.
- interleaved (GPT-J / Meta): ``stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)``, exported as
  two step-2 slices, ``neg``, ``unsqueeze`` + ``cat`` (or ``stack``) and a view back to x's shape.
  ``interleaved=True``.
Either multiply and the add may have their operands either way round.

Absorbed: the slices or split, ``neg``, ``cat``/``stack`` (and the unsqueezes and view), both
multiplies and the add, provided every intermediate has exactly one reader and is not a graph output
or mutation value. Kept: x, cos and sin (whatever produces them). The fused op computes the very
expression it replaces (mul and add commute exactly, broadcasting is unchanged), so results are
bit-identical on the CPU.

Not matched: Meta's ``view_as_complex(x) * freqs_cis`` form (cos/sin are not in the graph as
tensors), a ``neg`` applied after the ``unsqueeze`` in the interleaved form, and rotations whose
halves are not the halves of the multiplied x. Partial rotary (GPT-NeoX's rotary_pct) is fused as
a rope of the rotated slice only; the pass-through part and the cat joining them stay.
"""
from __future__ import annotations

from typing import Any

from ...ir import Graph, Node, ScalarMeta, TensorMeta, Value
from ..rewrite import drop_nodes, pinned_values

_SPLITS = ("aten.split_with_sizes", "aten.split.Tensor", "aten.chunk")
_RESHAPES = ("aten.view", "aten.reshape", "aten._unsafe_view")
_INT64_MAX = 2 ** 63 - 1


class _Ctx:
    def __init__(self, g: Graph):
        self.users = g.users()
        self.pinned = pinned_values(g)

    def sole_reader(self, v: Any, node: Node) -> bool:
        """``v`` is a temporary read by ``node`` alone (once) and is not pinned."""
        return isinstance(v, Value) and v.id not in self.pinned and self.users.get(v.id, []) == [node]


def _tensor(v: Any) -> bool:
    return isinstance(v, Value) and isinstance(v.meta, TensorMeta)


def _is_dim(dim: Any, rank: int) -> bool:
    """``dim`` names the last dim of a rank-``rank`` tensor."""
    return type(dim) is int and rank > 0 and dim in (-1, rank - 1)


def _arg(node: Node, i: int, name: str, default: Any) -> Any:
    if name in node.kwargs:
        return node.kwargs[name]
    return node.args[i] if len(node.args) > i else default


def _reaches_end(end: Any, dim: Any) -> bool:
    if end is None:
        return True
    if type(end) is int:
        return end >= _INT64_MAX or (type(dim) is int and end >= dim)
    return isinstance(end, Value) and isinstance(end.meta, ScalarMeta) and end.meta.expr is not None \
        and str(end.meta.expr) == str(dim)


def _slice_of(v: Any, ctx: _Ctx, reader: Node) -> tuple[Node, Value, Any, Any, Any] | None:
    """``v = x[..., start:end:step]`` on the last dim, read by ``reader`` alone: (node, x, start, end, step)."""
    node = v.producer if isinstance(v, Value) else None
    if node is None or node.op != "aten.slice.Tensor" or not ctx.sole_reader(v, reader):
        return None
    x = node.args[0]
    if not _tensor(x) or not _is_dim(_arg(node, 1, "dim", 0), x.meta.rank):
        return None
    return node, x, _arg(node, 2, "start", None), _arg(node, 3, "end", None), _arg(node, 4, "step", 1)


def _last(v: Value) -> str:
    return str(v.meta.shape[-1])


# -- rotations: each returns (x, absorbed nodes) ----------------------------------------------------
def _halves(first: Any, second: Any, ctx: _Ctx, neg: Node, cat: Node) -> tuple[Value, list[Node]] | None:
    """``first``/``second`` are x's first and second halves (``second`` read by ``neg``, ``first`` by
    ``cat``): two slices, or the two outputs of one split."""
    if not (_tensor(first) and _tensor(second)) or _last(first) != _last(second):
        return None
    split = first.producer
    if split is not None and split.op in _SPLITS and second.producer is split:
        x = split.args[0]
        if split.outputs != [first, second] or not _tensor(x) \
                or not _is_dim(_arg(split, 2, "dim", 0), x.meta.rank) \
                or not ctx.sole_reader(first, cat) or not ctx.sole_reader(second, neg):
            return None
        if split.op == "aten.chunk" and _arg(split, 1, "chunks", None) != 2:
            return None
        return x, [split]  # two equal parts covering the dim are its halves
    s1, s2 = _slice_of(first, ctx, cat), _slice_of(second, ctx, neg)
    if s1 is None or s2 is None or s1[1] is not s2[1]:
        return None
    (n1, x, start1, _, step1), (n2, _, _, end2, step2) = s1, s2
    # A prefix and a suffix of equal length; the caller checks that together they are as long as x.
    if start1 not in (None, 0) or step1 != 1 or step2 != 1 or not _reaches_end(end2, x.meta.shape[-1]):
        return None
    return x, [n1, n2]


def _rotate_half(cat: Node, ctx: _Ctx) -> tuple[Value, list[Node]] | None:
    """``cat((-x2, x1), -1)``."""
    tensors = _arg(cat, 0, "tensors", None)
    if not isinstance(tensors, (list, tuple)) or len(tensors) != 2 or not _tensor(cat.outputs[0]) \
            or not _is_dim(_arg(cat, 1, "dim", 0), cat.outputs[0].meta.rank):
        return None
    negated, first = tensors
    neg = negated.producer if isinstance(negated, Value) else None
    if neg is None or neg.op != "aten.neg" or not ctx.sole_reader(negated, cat):
        return None
    m = _halves(first, neg.args[0], ctx, neg, cat)
    if m is None or _last(m[0]) != _last(cat.outputs[0]):  # the halves cover all of x
        return None
    return m[0], m[1] + [neg, cat]


def _unsqueezed(v: Any, reader: Node, ctx: _Ctx) -> tuple[Any, Node] | None:
    """``v = unsqueeze(a, -1)`` read by ``reader`` alone: (a, the unsqueeze)."""
    node = v.producer if isinstance(v, Value) else None
    if node is None or node.op != "aten.unsqueeze" or not ctx.sole_reader(v, reader) or not _tensor(v) \
            or not _is_dim(_arg(node, 1, "dim", 0), v.meta.rank):
        return None
    return node.args[0], node


def _interleaved(view: Node, ctx: _Ctx) -> tuple[Value, list[Node]] | None:
    """``stack((-x[..., 1::2], x[..., ::2]), -1)`` viewed back to x's shape."""
    pairs = view.args[0] if view.args else None
    stack = pairs.producer if isinstance(pairs, Value) else None
    if stack is None or not ctx.sole_reader(pairs, view) or not _tensor(pairs) or pairs.meta.rank < 2 \
            or str(pairs.meta.shape[-1]) != "2":
        return None
    tensors = _arg(stack, 0, "tensors", None)
    if not isinstance(tensors, (list, tuple)) or len(tensors) != 2 \
            or not _is_dim(_arg(stack, 1, "dim", 0), pairs.meta.rank):
        return None
    absorbed: list[Node] = []
    negated, even = tensors
    if stack.op == "aten.cat":  # stack as unsqueeze + cat
        u0, u1 = _unsqueezed(negated, stack, ctx), _unsqueezed(even, stack, ctx)
        if u0 is None or u1 is None:
            return None
        (negated, un0), (even, un1) = u0, u1
        absorbed += [un0, un1]
        reader0 = un0
    elif stack.op == "aten.stack":
        reader0 = stack
    else:
        return None
    neg = negated.producer if isinstance(negated, Value) else None
    if neg is None or neg.op != "aten.neg" or not ctx.sole_reader(negated, reader0):
        return None
    s_even, s_odd = _slice_of(even, ctx, absorbed[1] if absorbed else stack), _slice_of(neg.args[0], ctx, neg)
    if s_even is None or s_odd is None or s_even[1] is not s_odd[1]:
        return None
    x = s_even[1]
    dim = x.meta.shape[-1]
    if s_even[2] not in (None, 0) or s_odd[2] != 1 or s_even[4] != 2 or s_odd[4] != 2 \
            or not _reaches_end(s_even[3], dim) or not _reaches_end(s_odd[3], dim) \
            or _last(even) != _last(neg.args[0]) \
            or [str(d) for d in view.outputs[0].meta.shape] != [str(d) for d in x.meta.shape]:
        return None  # equal counts of even and odd elements: d is even and the pairs cover it
    return x, [s_even[0], s_odd[0], neg] + absorbed + [stack, view]


# -- x * cos + rot * sin --------------------------------------------------------------------------------
def _other(node: Node, v: Value) -> Any:
    a, b = node.args[0], node.args[1]
    if a is v and b is not v:
        return b
    if b is v and a is not v:
        return a
    return None


def _is_binary(node: Node | None, op: str) -> bool:
    return node is not None and node.op == op and len(node.args) == 2 \
        and (not node.kwargs or (op == "aten.add.Tensor" and node.kwargs == {"alpha": 1}))


def _products(rot: Value, x: Value, ctx: _Ctx) -> tuple[Value, Value, list[Node]] | None:
    readers = ctx.users.get(rot.id, [])
    if len(readers) != 1 or rot.id in ctx.pinned or not _is_binary(readers[0], "aten.mul.Tensor"):
        return None
    mul_sin = readers[0]
    sin = _other(mul_sin, rot)
    readers = ctx.users.get(mul_sin.outputs[0].id, [])
    if not _tensor(sin) or len(readers) != 1 or mul_sin.outputs[0].id in ctx.pinned \
            or not _is_binary(readers[0], "aten.add.Tensor"):
        return None
    add = readers[0]
    term = _other(add, mul_sin.outputs[0])
    mul_cos = term.producer if isinstance(term, Value) else None
    if not _is_binary(mul_cos, "aten.mul.Tensor") or not ctx.sole_reader(term, add):
        return None
    cos = _other(mul_cos, x)
    if not _tensor(cos):
        return None
    return cos, sin, [mul_cos, mul_sin, add]


def fuse_rope(g: Graph) -> Graph:
    ctx = _Ctx(g)
    taken: set[int] = set()
    fused: list[tuple[list[Node], tuple]] = []
    for node in g.nodes:
        if node.op == "aten.cat":
            m, interleaved = _rotate_half(node, ctx), False
        elif node.op in _RESHAPES:
            m, interleaved = _interleaved(node, ctx), True
        else:
            continue
        if m is None:
            continue
        x, rotation = m
        p = _products(node.outputs[0], x, ctx)
        if p is None:
            continue
        cos, sin, arith = p
        absorbed = rotation + arith
        if any(id(n) in taken for n in absorbed):
            continue
        taken.update(id(n) for n in absorbed)
        fused.append((absorbed, (x, cos, sin, interleaved)))
    if not fused:
        return g
    replacement: dict[int, Node] = {}
    for absorbed, args in fused:
        add = absorbed[-1]
        node = Node("ost.rope", args, {}, add.name, add.source)
        node.outputs = [add.outputs[0]]
        add.outputs[0].producer = node
        replacement[id(add)] = node
    g.nodes = [replacement.get(id(n), n) for n in g.nodes]
    drop_nodes(g, {id(n) for absorbed, _ in fused for n in absorbed[:-1]})
    return g
