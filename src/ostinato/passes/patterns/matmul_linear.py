"""``aten.linear`` from the matmul forms of a projection, so every later pattern and the code generator
see one form whatever way the model's author wrote it.

A projection written ``x @ self.weight.T`` (Falcon's ``FalconLinear``, hand-written modules) or
``torch.matmul(x, w.t()) + b`` exports as ``view(mm(view(x, [-1, in]), permute(W, [1, 0])), [..., out])``
(with ``add`` after it, or ``addmm`` when x is 2-d), not as ``aten.linear``. Rewritten here:

- ``mm(a, T(W))`` → ``linear(a, W)``, and ``addmm(b, a, T(W))`` (beta = alpha = 1, b of shape [out]) →
  ``linear(a, W, b)``, where ``T(W)`` is ``permute(W, [1, 0])``, ``t(W)`` or ``transpose(W, 0, 1)`` of a 2-d
  constant W (a weight: an activation's product stays a matmul);
- then the flatten before goes when only views read the result: ``linear(x, W, b)`` of x's own leading
  dims, read by those views (an unflatten back to x's leading dims goes too:
  ``view(linear(view(x, [-1, in]), W, b), [*lead, out])`` → ``linear(x, W, b)``).

Nothing is recomputed and no value changes: ``linear(x, W)`` is ``x @ W.T`` by definition. The weight
stays the stored [out, in] tensor (its transposed view goes unread and DCE drops it). Runs before
multi_linear, so sibling projections written this way still become one matmul.
"""
from __future__ import annotations

from ...ir import Graph, Node, TensorMeta, Value
from ..rewrite import drop_nodes, pinned_values

_VIEWS = ("aten.view", "aten.reshape", "aten._unsafe_view")


def _transposed_weight(v) -> Value | None:
    """W when ``v`` is a transposed view of a 2-d constant W."""
    node = v.producer if isinstance(v, Value) else None
    if node is None or node.kwargs or not node.args:
        return None
    w = node.args[0]
    if not isinstance(w, Value) or w.role != "constant" or not isinstance(w.meta, TensorMeta) or w.meta.rank != 2:
        return None
    rest = [int(d) % 2 for d in node.args[1:]] if all(isinstance(d, int) for d in node.args[1:]) else None
    if node.op == "aten.t" and len(node.args) == 1:
        return w
    if node.op == "aten.permute" and len(node.args) == 2 and [int(d) % 2 for d in node.args[1]] == [1, 0]:
        return w
    if node.op == "aten.transpose.int" and rest is not None and len(rest) == 2 and rest[0] != rest[1]:
        return w
    return None


def _per_column(bias, out: Value) -> bool:
    return (isinstance(bias, Value) and isinstance(bias.meta, TensorMeta) and bias.meta.rank == 1
            and str(bias.meta.shape[0]) == str(out.meta.shape[-1]) and bias.meta.dtype == out.meta.dtype)


def _as_linear(node: Node) -> tuple | None:
    """The (input, weight[, bias]) of ``node`` as an ``aten.linear``, or None."""
    if node.op == "aten.mm" and len(node.args) == 2 and not node.kwargs:
        a, wt = node.args
        w = _transposed_weight(wt)
        return None if w is None or not isinstance(a, Value) else (a, w)
    if node.op == "aten.addmm" and len(node.args) == 3 and set(node.kwargs) <= {"beta", "alpha"} \
            and all(node.kwargs.get(k, 1) == 1 for k in ("beta", "alpha")):
        b, a, wt = node.args
        w = _transposed_weight(wt)
        if w is None or not isinstance(a, Value) or not _per_column(b, node.outputs[0]):
            return None
        return a, w, b
    return None


def _lift(node: Node, users: dict[int, list[Node]], pinned: set[int], dead: set[int]) -> None:
    """Let the linear read x itself instead of its flatten ``view(x, [-1, in])`` when only views read the
    result (an unflatten, or Falcon's view into heads): the result takes x's leading dims, which those
    views read as they read the flat rows (same elements, same order). An unflatten that gives exactly
    that shape goes, the linear making its value."""
    a, y = node.args[0], node.outputs[0]
    before = a.producer
    if before is None or before.op not in _VIEWS:
        return
    x = before.args[0]
    readers = users.get(y.id, [])
    if not isinstance(x, Value) or not isinstance(x.meta, TensorMeta) or x.meta.rank < 2 \
            or str(x.meta.shape[-1]) != str(a.meta.shape[-1]) or y.id in pinned or not readers \
            or any(r.op not in _VIEWS or r.args[0] is not y or id(r) in dead for r in readers):
        return
    shape = (*x.meta.shape[:-1], y.meta.shape[-1])
    node.args = (x, *node.args[1:])
    if len(users.get(a.id, [])) == 1 and a.id not in pinned:
        dead.add(id(before))     # (read by other matmuls too: it stays until they are lifted, then DCE takes it)
    y.meta = TensorMeta(y.meta.dtype, shape)
    after = readers[0]
    if len(readers) == 1 and after.outputs[0].id not in pinned \
            and [str(d) for d in after.outputs[0].meta.shape] == [str(d) for d in shape]:
        node.outputs = list(after.outputs)
        node.outputs[0].producer = node
        dead.add(id(after))


def rewrite_matmul_linears(g: Graph) -> Graph:
    users = g.users()
    pinned = pinned_values(g)
    dead: set[int] = set()
    for node in g.nodes:
        args = _as_linear(node) if id(node) not in dead else None
        if args is None:
            continue
        node.op, node.args, node.kwargs = "aten.linear", args, {}
        _lift(node, users, pinned, dead)
    drop_nodes(g, dead)
    return g
