"""Sink permutes through pointwise ops: ``permute(f(a, b), dims)`` read only by pointwise ops becomes
``f(permute(a, dims), permute(b', dims))`` (``b'``: a lower-rank operand viewed with its broadcast's
leading 1-dims first).

A gather sinks the same way, its input and index both permuted and its dim renumbered:
``permute(gather(x, d, i), p)`` is ``gather(permute(x, p), p.index(d), permute(i, p))`` (DeBERTa's
position-to-content scores, gathered then transposed before they are added).

Values are the same up to the kernels: where the permute stands changes only the layout an op reads,
but torch's CPU kernels take other code paths over strided inputs, and for transcendental functions
those round differently (the Whisper encoder's GELU on its transposed input: 4.8e-7 off eager in fp32,
within tolerance; bit for bit in bf16). A pointwise chain that ends in a
permute and feeds pointwise ops (ConvNeXt's layer scale ``gamma * x`` over NHWC, permuted back to NCHW
for the residual add) is then one chain over one shape, which the code generator fuses into one kernel
(codegen/schedule.py groups values of one iteration space); the permuted operands are views, read
through their strides. The sunk op's result takes the permute's Value, so nothing downstream changes.

The permute sinks only where the op's result is read by nothing else and is no graph output or state
value, and the permute's readers are pointwise (elsewhere a permute's position does not matter for
fusion, and a matmul or a convolution may prefer the layout it had). Chains sink one op at a time
until an operand is no such op's result. Operands of a lower rank need static shapes (their view's
sizes); others may be symbolic.

``sink_unit_views`` does the same for a view that only inserts or removes dims of size 1:
``view(f(a, b), shape)`` becomes ``f(view(a, shape), view(b, shape))``. OPT's decoder layer adds its
residual over ``[B, 1, H]``, then reshapes the sum to ``[B, H]`` for its LayerNorm (and back after the
second add): the add and the norm then have one iteration space, and the code generator makes them one
kernel, as it does for GPT-2's layer, which has no reshape between them. Such a view moves no element,
so the result's layout, and every reader's, is what it was; its operands must have the op's full shape
(or none), so each one's view is the same view. It does not sink where it would end on a gather's result
(read through a view, a gather is not taken into its reader's kernel).
"""
from __future__ import annotations

from ..ir import Graph, Node, TensorMeta, Value, get_op
from .rewrite import pinned_values, unplaced_node

PERMUTE = "aten.permute"
GATHER = "aten.gather"
VIEWS = ("aten.view", "aten.reshape", "aten._unsafe_view")


def _pointwise(node: Node) -> bool:
    op = get_op(node.op)
    return op is not None and op.category == "elementwise" and op.pure and len(node.outputs) == 1 \
        and node.outputs[0] is not None and isinstance(node.outputs[0].meta, TensorMeta)


def _gather(node: Node) -> bool:
    """torch.gather(x, dim, index) with input and index of one rank (as torch requires)."""
    if node.op != GATHER or len(node.args) != 3 or set(node.kwargs) - {"sparse_grad"} \
            or node.kwargs.get("sparse_grad") or len(node.outputs) != 1 or node.outputs[0] is None:
        return False
    x, dim, index = node.args
    return isinstance(x, Value) and isinstance(index, Value) and isinstance(dim, int) \
        and isinstance(x.meta, TensorMeta) and isinstance(index.meta, TensorMeta) and x.meta.rank == index.meta.rank


def sink_permutes(g: Graph) -> Graph:
    return _sink_all(g, _sink)


def sink_unit_views(g: Graph) -> Graph:
    return _sink_all(g, _sink_view)


def _sink_all(g: Graph, sink) -> Graph:
    names = {n.name for n in g.nodes}

    def fresh(base: str) -> str:
        name, k = base, 1
        while name in names:
            name, k = f"{base}_{k}", k + 1
        names.add(name)
        return name

    changed = True
    while changed:
        changed = False
        users = g.users()
        pinned = pinned_values(g)
        for node in g.nodes:
            rewrite = sink(g, node, users, pinned, fresh)
            if rewrite is not None:
                old, new_nodes = rewrite
                g.nodes = [m for n in g.nodes if n is not old for m in (new_nodes if n is node else (n,))]
                changed = True
                break       # users and positions changed: look again
    return g


def _unit_only(a: tuple, b: tuple) -> bool:
    """Whether shapes ``a`` and ``b`` differ only in dims of size 1 (the same sizes otherwise, in order)."""
    return [d for d in a if d != 1] == [d for d in b if d != 1]


def _sink_view(g: Graph, view: Node, users: dict, pinned: set[int], fresh) -> tuple[Node, list[Node]] | None:
    """(the op to drop, the nodes replacing the view) when ``view`` only inserts or removes 1-dims and may
    sink through its input's pointwise producer, else None."""
    if view.op not in VIEWS or len(view.args) != 2 or view.kwargs or view.outputs[0] is None:
        return None
    src, out = view.args[0], view.outputs[0]
    if not isinstance(src, Value) or src.producer is None or not _pointwise(src.producer):
        return None
    if not isinstance(out.meta, TensorMeta) or not _unit_only(tuple(src.meta.shape), tuple(out.meta.shape)):
        return None
    f = src.producer
    if src.id in pinned or len(users.get(src.id, ())) != 1:
        return None
    shape = tuple(src.meta.shape)
    operands = [a for a in (*f.args, *f.kwargs.values()) if isinstance(a, Value) and isinstance(a.meta, TensorMeta)]
    if any(a.meta.rank and tuple(a.meta.shape) != shape for a in operands):
        return None     # a broadcast operand would need a view of its own shape
    if any(_sinks_onto_gather(a, users, pinned) for a in operands):
        return None
    new_nodes: list[Node] = []

    def operand(a):
        if not isinstance(a, Value) or not isinstance(a.meta, TensorMeta) or a.meta.rank == 0:
            return a
        y = unplaced_node(g, view.op, (a, view.args[1]), {}, TensorMeta(a.meta.dtype, tuple(out.meta.shape)),
                          fresh(f"{a.name}_view"), view.source)
        new_nodes.append(y.producer)
        return y

    moved = Node(f.op, tuple(operand(a) for a in f.args), {k: operand(v) for k, v in f.kwargs.items()}, f.name,
                 f.source)
    moved.outputs = [out]
    out.producer = moved
    return f, new_nodes + [moved]


def _sinks_onto_gather(a: Value, users: dict, pinned: set[int]) -> bool:
    """Whether a unit view placed on ``a`` would sink on, through the pointwise ops only their reader reads,
    until it stands on a gather's result: the code generator takes a gather into its reader's kernel only
    where the reader reads it directly (DeBERTa-v3's relative scores, gathered, scaled and added before a
    view to four dims: that view stays after the add, or the two gathers are kernels of their own)."""
    seen: set[int] = set()
    stack = [a]
    while stack:
        v = stack.pop()
        node = v.producer if isinstance(v, Value) else None
        if node is None or id(node) in seen or v.id in pinned or len(users.get(v.id, ())) != 1:
            continue
        seen.add(id(node))
        if node.op == GATHER:
            return True
        if _pointwise(node):
            stack.extend(x for x in (*node.args, *node.kwargs.values()) if isinstance(x, Value))
    return False


def _sink(g: Graph, perm: Node, users: dict, pinned: set[int], fresh) -> tuple[Node, list[Node]] | None:
    """(the op to drop, the nodes replacing the permute) when ``perm`` may sink through its input's
    producer, else None."""
    if perm.op != PERMUTE or len(perm.args) < 2 or perm.outputs[0] is None:
        return None
    src, out = perm.args[0], perm.outputs[0]
    if not isinstance(src, Value) or src.producer is None or not (_pointwise(src.producer) or _gather(src.producer)):
        return None
    f = src.producer
    if src.id in pinned or len(users.get(src.id, ())) != 1:
        return None
    readers = users.get(out.id, ())
    if not readers or not all(_pointwise(u) for u in readers):
        return None
    rank = len(src.meta.shape)
    operands = [a for a in (*f.args, *f.kwargs.values()) if isinstance(a, Value) and isinstance(a.meta, TensorMeta)]
    if any(a.meta.rank > rank or 0 < a.meta.rank < rank and not a.meta.is_static for a in operands):
        return None     # a higher rank than the result, or a lower rank whose view would need symbolic sizes
    dims = [d % rank for d in perm.args[1]]
    new_nodes: list[Node] = []

    def operand(a):
        if not isinstance(a, Value) or not isinstance(a.meta, TensorMeta) or a.meta.rank == 0:
            return a
        x = a
        if a.meta.rank < rank:     # with its broadcast's leading 1-dims first
            padded = (1,) * (rank - a.meta.rank) + tuple(a.meta.shape)
            x = unplaced_node(g, "aten.view", (a, list(padded)), {}, TensorMeta(a.meta.dtype, padded),
                              fresh(f"{a.name}_view"), f.source)
            new_nodes.append(x.producer)
        shape = tuple(x.meta.shape)
        y = unplaced_node(g, PERMUTE, (x, list(dims)), {}, TensorMeta(a.meta.dtype, tuple(shape[d] for d in dims)),
                          fresh(f"{a.name}_permute"), perm.source)
        new_nodes.append(y.producer)
        return y

    args = tuple(operand(a) for a in f.args)
    if f.op == GATHER:
        args = (args[0], dims.index(f.args[1] % rank), *args[2:])
    moved = Node(f.op, args, {k: operand(v) for k, v in f.kwargs.items()}, f.name, f.source)
    moved.outputs = [out]
    out.producer = moved
    return f, new_nodes + [moved]
