"""``ost.linear``: absorbs a projection and the activation right after it.

Projections: ``aten.linear(x, W, b)``, and GPT-2's Conv1D ``view(addmm(b, view(x, [-1, in]), W), [..., out])``
with W as [in, out] (``weight_t=True``; the two views go in when both are there, else the bare addmm), or
without a bias ``mm`` of a constant W [in, out] (a module's ``x @ self.w``; a transposed weight's matmul is
already ``aten.linear``, matmul_linear.py).
Activations: relu, silu, gelu (``approximate`` none or tanh), and the tanh GELU written out as GPT-2's
gelu_new exports it: ``(y * 0.5) * (tanh((y + y**3 * 0.044715) * sqrt(2/pi)) + 1)``, operands of each
multiply and add in either order. That one is the activation ``gelu_new``, whose reference computes it op by
op as written (each step rounded to the dtype, as eager's are; ``gelu_tanh``'s one kernel rounds once).

Absorbed: the projection, its views and the activation's nodes, provided the projection's result (and
every intermediate) has no reader outside the chain and is not a graph output or mutation value; the
activation's result may feed anything. A projection without an activation is left alone (aten.linear
with a bias is already one kernel), except a whole Conv1D (both views there): it becomes ``ost.linear``
over x's own rows with no activation, so the CUDA code generator sees the norm producing x and the add
reading the result as its neighbours (codegen/linear.py), as it sees an ``aten.linear``'s. Runs after
gated_mlp, whose ``act(gate) * up`` is no longer a bare activation by then.
"""
from __future__ import annotations

import math

from ...ir import Graph, Node, TensorMeta, Value
from ..rewrite import drop_nodes, pinned_values

Users = dict[int, list[Node]]

_SIMPLE = {"aten.relu": "relu", "aten.silu": "silu"}
_VIEWS = ("aten.view", "aten.reshape", "aten._unsafe_view")


def _only_user(users: Users, v: Value, pinned: set[int]) -> Node | None:
    readers = users.get(v.id, [])
    if len(readers) != 1 or v.id in pinned:
        return None
    return readers[0]


def _scalar_operand(node: Node | None, op: str, v: Value, value: float):
    """True when ``node`` is ``v <op> value`` or ``value <op> v`` (a Python number close to ``value``)."""
    if node is None or node.op != op or node.kwargs or len(node.args) != 2:
        return False
    a, b = node.args
    k = b if a is v else a if b is v else None
    return isinstance(k, (int, float)) and not isinstance(k, bool) and math.isclose(k, value, rel_tol=1e-9)


def _other(node: Node | None, op: str, v: Value):
    """The other operand of ``node`` when it is the binary ``op`` reading ``v`` once."""
    if node is None or node.op != op or node.kwargs or len(node.args) != 2:
        return None
    a, b = node.args
    return b if a is v and b is not v else a if b is v and a is not v else None


def _gelu_written(y: Value, users: Users, pinned: set[int]) -> list[Node] | None:
    """The nodes of gelu_new's written-out tanh GELU reading ``y``, the result's producer last."""
    readers = users.get(y.id, [])
    if len(readers) != 3 or len({id(n) for n in readers}) != 3:
        return None
    half = next((n for n in readers if _scalar_operand(n, "aten.mul.Tensor", y, 0.5)), None)
    cube = next((n for n in readers if n.op == "aten.pow.Tensor_Scalar" and not n.kwargs
                 and n.args in ((y, 3), (y, 3.0))), None)
    if half is None or cube is None:
        return None
    k = _only_user(users, cube.outputs[0], pinned)
    if not _scalar_operand(k, "aten.mul.Tensor", cube.outputs[0], 0.044715):
        return None
    inner = _only_user(users, k.outputs[0], pinned)
    if _other(inner, "aten.add.Tensor", k.outputs[0]) is not y:
        return None
    scaled = _only_user(users, inner.outputs[0], pinned)
    if not _scalar_operand(scaled, "aten.mul.Tensor", inner.outputs[0], math.sqrt(2 / math.pi)):
        return None
    tanh = _only_user(users, scaled.outputs[0], pinned)
    if tanh is None or tanh.op != "aten.tanh" or tanh.kwargs:
        return None
    one = _only_user(users, tanh.outputs[0], pinned)
    if not _scalar_operand(one, "aten.add.Tensor", tanh.outputs[0], 1.0):
        return None
    out = _only_user(users, one.outputs[0], pinned)
    if _other(out, "aten.mul.Tensor", one.outputs[0]) is not half.outputs[0] \
            or _only_user(users, half.outputs[0], pinned) is not out:
        return None
    return [half, cube, k, inner, scaled, tanh, one, out]


def _activation(y: Value, users: Users, pinned: set[int]) -> tuple[str, list[Node]] | None:
    """The activation reading ``y`` (and nothing else reading it): its name and its nodes."""
    if y.id in pinned:
        return None
    readers = users.get(y.id, [])
    if len(readers) == 1:
        act = readers[0]
        if act.op in _SIMPLE and act.args == (y,) and not act.kwargs:
            return _SIMPLE[act.op], [act]
        if act.op == "aten.gelu" and act.args[:1] == (y,) and len(act.args) <= 2 \
                and set(act.kwargs) <= {"approximate"}:
            approximate = act.kwargs.get("approximate", act.args[1] if len(act.args) > 1 else "none")
            if approximate in ("none", "tanh"):
                return ("gelu" if approximate == "none" else "gelu_tanh"), [act]
        return None
    nodes = _gelu_written(y, users, pinned)
    return None if nodes is None else ("gelu_new", nodes)


def _same_dims(a, b) -> bool:
    return len(a) == len(b) and all(str(p) == str(q) for p, q in zip(a, b))


def _conv1d_views(mm: Node, x2: Value, users: Users, pinned: set[int]) -> tuple[Node, Node] | None:
    """The flatten ``x2`` before ``addmm`` (or ``mm``) and the unflatten after it, when both are there and
    undo each other."""
    y2 = mm.outputs[0]
    before, after = x2.producer, _only_user(users, y2, pinned)
    if before is None or before.op not in _VIEWS or after is None or after.op not in _VIEWS \
            or _only_user(users, x2, pinned) is not mm:
        return None
    x = before.args[0]
    if not isinstance(x, Value) or not isinstance(x.meta, TensorMeta) or x.meta.rank < 2 \
            or str(x.meta.shape[-1]) != str(x2.meta.shape[-1]):
        return None
    out_shape = after.outputs[0].meta.shape
    if not _same_dims(out_shape[:-1], x.meta.shape[:-1]) or str(out_shape[-1]) != str(y2.meta.shape[-1]):
        return None
    return before, after


def _match(node: Node, users: Users, pinned: set[int]) -> tuple[list[Node], tuple, Value] | None:
    if node.op == "aten.linear":
        names = ("input", "weight", "bias")
        bound = {**dict(zip(names, node.args)), **node.kwargs}
        if len(node.args) > 3 or set(node.kwargs) - set(names):
            return None
        x, weight, bias, weight_t = bound.get("input"), bound.get("weight"), bound.get("bias"), False
        absorbed, y = [node], node.outputs[0]
    else:  # aten.addmm(bias, x2d, W): beta and alpha must be 1; aten.mm(x2d, W) of a constant W [in, out]
        if node.op == "aten.mm":
            if len(node.args) != 2 or node.kwargs or not isinstance(node.args[1], Value) \
                    or node.args[1].role != "constant":
                return None
            bias, (x, weight) = None, node.args
        elif len(node.args) != 3 or any(node.kwargs.get(k, 1) != 1 for k in ("beta", "alpha")) \
                or set(node.kwargs) - {"beta", "alpha"}:
            return None
        else:
            bias, x, weight = node.args
        weight_t, absorbed, y = True, [node], node.outputs[0]
        views = _conv1d_views(node, x, users, pinned) if isinstance(x, Value) else None
        if views is not None:
            x, absorbed, y = views[0].args[0], [views[0], node, views[1]], views[1].outputs[0]
    if not all(isinstance(v, Value) for v in (x, weight)):
        return None
    act = _activation(y, users, pinned)
    if act is None:
        # a whole Conv1D: one node over x's rows, whatever reads it; its bias one per column ([N]: an
        # addmm adding a [rows, N] residual is not one ost.linear's bias)
        per_column = bias is None or (isinstance(bias, Value) and isinstance(bias.meta, TensorMeta)
                                      and _same_dims(bias.meta.shape, y.meta.shape[-1:]))
        return (absorbed, (x, weight, bias, None, True), y) if len(absorbed) == 3 and per_column else None
    name, act_nodes = act
    return absorbed + act_nodes, (x, weight, bias, name, weight_t), act_nodes[-1].outputs[0]


def fuse_linear(g: Graph) -> Graph:
    users = g.users()
    pinned = pinned_values(g)
    taken: set[int] = set()
    fused: list[tuple[list[Node], tuple, Value]] = []
    for node in g.nodes:
        if node.op in ("aten.linear", "aten.addmm", "aten.mm") and id(node) not in taken:
            m = _match(node, users, pinned)
            if m is not None and not any(id(n) in taken for n in m[0]):
                taken.update(id(n) for n in m[0])
                fused.append(m)
    if not fused:
        return g
    replacement: dict[int, Node] = {}
    for absorbed, args, out in fused:
        last = absorbed[-1]
        node = Node("ost.linear", args, {}, last.name, last.source)
        node.outputs = [out]
        out.producer = node
        replacement[id(last)] = node
    g.nodes = [replacement.get(id(n), n) for n in g.nodes]
    drop_nodes(g, {id(n) for absorbed, _, _ in fused for n in absorbed[:-1]})
    return g
