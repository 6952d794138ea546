"""``ost.layer_norm``: absorbs a layer norm over the last dim, whole or written out by hand.

Forms of the normalization (``h`` is the input, or its upcast):

- ``aten.layer_norm(h, [D], w, b, eps)`` (torch.export keeps ``nn.LayerNorm`` whole);
- ``c = h - mean(h, -1, keepdim)``, a variance ``mean(c**2)`` / ``mean(c*c)`` /
  ``var(h, -1, correction=0, keepdim)``, then ``c * rsqrt(var + eps)`` or ``c / sqrt(var + eps)``;
- ``ost.rms_norm(c, w, eps)`` on that ``c``: the rms_norm pass runs first and takes the ``mean(c**2)``
  form's tail (with the weight multiply after it) as an RMS norm of the centered input.

Then, in the compute dtype, ``* weight`` and ``+ bias`` (each [D], either operand order) where the norm
has none, and HF's casts: an upcast ``h = x.to(f32)`` read by nothing but the norm, and a cast back
to x's dtype right after the bias (``F.layer_norm(x.float(), …).type_as(x)`` too). A weight applied
after the cast back is not absorbed: the reference applies weight and bias before it.

Absorbed: each node of the chain, provided each intermediate has no reader outside the chain and is
not a graph output or mutation value. Kept: ``x``, the weight and the bias.
"""
from __future__ import annotations

from ...ir import Graph, Node, TensorMeta, Value
from ..rewrite import drop_nodes, is_dtype_cast, pinned_values

Users = dict[int, list[Node]]


def _only_user(users: Users, v: Value, pinned: set[int]) -> Node | None:
    readers = users.get(v.id, [])
    if len(readers) != 1 or v.id in pinned:
        return None
    return readers[0]


def _other(node: Node, v: Value):
    """The other operand of a binary node that reads ``v`` once."""
    if len(node.args) != 2 or node.kwargs:
        return None
    a, b = node.args
    if a is v and b is not v:
        return b
    if b is v and a is not v:
        return a
    return None


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _last_dims(dims, rank: int) -> bool:
    return isinstance(dims, (list, tuple)) and len(dims) == 1 and dims[0] in (-1, rank - 1)


def _is_mean_last(node: Node | None, h: Value) -> bool:
    """``mean(h, [-1], keepdim=True)``."""
    return node is not None and node.op == "aten.mean.dim" and not node.kwargs and len(node.args) == 3 \
        and node.args[0] is h and _last_dims(node.args[1], h.meta.rank) and node.args[2] is True




def _vector_of(v, d) -> bool:
    """A [D] tensor, D given as a dim of the normalized tensor."""
    return isinstance(v, Value) and isinstance(v.meta, TensorMeta) and v.meta.rank == 1 \
        and str(v.meta.shape[0]) == str(d)


def _match_aten(node: Node) -> tuple[list[Node], Value, Value | None, Value | None, float] | None:
    names = ("input", "normalized_shape", "weight", "bias", "eps", "cudnn_enable")
    bound = {**dict(zip(names, node.args)), **node.kwargs}
    h, shape = bound.get("input"), bound.get("normalized_shape")
    if not isinstance(h, Value) or not isinstance(h.meta, TensorMeta) or h.meta.rank == 0 \
            or not isinstance(shape, (list, tuple)) or len(shape) != 1 or not isinstance(shape[0], int) \
            or str(shape[0]) != str(h.meta.shape[-1]):
        return None
    eps = bound.get("eps", 1e-5)
    if not _is_number(eps):
        return None
    return [node], h, bound.get("weight"), bound.get("bias"), float(eps)


def _match_written(mean: Node, users: Users, pinned: set[int]
                   ) -> tuple[list[Node], Value, Value | None, Value | None, float] | None:
    """From the first mean: centered input, variance, eps, normalization (see the module docstring)."""
    h = mean.args[0] if mean.args else None
    if not isinstance(h, Value) or not isinstance(h.meta, TensorMeta) or h.meta.rank == 0 \
            or not _is_mean_last(mean, h):
        return None
    sub = _only_user(users, mean.outputs[0], pinned)
    if sub is None or sub.op != "aten.sub.Tensor" or sub.kwargs or sub.args != (h, mean.outputs[0]) \
            or sub.outputs[0].id in pinned:
        return None
    c = sub.outputs[0]
    readers = users.get(c.id, [])
    if len(readers) == 1 and readers[0].op == "ost.rms_norm":
        rms = readers[0]
        if rms.args[0] is not c or len(rms.args) != 4 or rms.args[3] is not None:
            return None
        return [mean, sub, rms], h, rms.args[1], None, float(rms.args[2])
    variance: list[Node] = []
    if len(readers) == 1:  # the variance reads h: var(h, -1, correction=0, keepdim=True)
        norm = readers[0]
        var = next((n for n in users.get(h.id, []) if n.op == "aten.var.correction"), None)
        if var is None or var.args[:1] != (h,) or len(var.args) != 2 or not _last_dims(var.args[1], h.meta.rank) \
                or var.kwargs.get("correction") not in (0, 0.0) or var.kwargs.get("keepdim") is not True \
                or set(var.kwargs) != {"correction", "keepdim"}:
            return None
        variance = [var]
    else:  # the variance reads c: mean(c**2) or mean(c*c); c's other reader normalizes
        distinct = list({id(n): n for n in readers}.values())
        if len(distinct) != 2:
            return None
        sq = next((n for n in distinct if n.op == "aten.pow.Tensor_Scalar" or n.op == "aten.mul.Tensor"
                   and n.args == (c, c)), None)
        if sq is None or (sq.op == "aten.pow.Tensor_Scalar" and (sq.args != (c, 2) and sq.args != (c, 2.0)
                                                                 or sq.kwargs)) \
                or len(readers) != (3 if sq.op == "aten.mul.Tensor" else 2):
            return None
        norm = distinct[1] if distinct[0] is sq else distinct[0]
        mean2 = _only_user(users, sq.outputs[0], pinned)
        if not _is_mean_last(mean2, sq.outputs[0]):
            return None
        variance = [sq, mean2]
    add = _only_user(users, variance[-1].outputs[0], pinned)
    if add is None or add.op != "aten.add.Tensor":
        return None
    eps = _other(add, variance[-1].outputs[0])
    if not _is_number(eps):
        return None
    root = _only_user(users, add.outputs[0], pinned)
    if root is None or root.op not in ("aten.rsqrt", "aten.sqrt") or root.kwargs:
        return None
    if root.op == "aten.rsqrt":
        if norm.op != "aten.mul.Tensor" or _other(norm, c) is not root.outputs[0]:
            return None
    elif norm.op != "aten.div.Tensor" or norm.kwargs or norm.args != (c, root.outputs[0]):
        return None
    if _only_user(users, root.outputs[0], pinned) is not norm:
        return None
    return [mean, sub, *variance, add, root, norm], h, None, None, float(eps)


def _match(node: Node, users: Users, pinned: set[int]) -> tuple[list[Node], tuple, Value] | None:
    core = _match_aten(node) if node.op == "aten.layer_norm" else _match_written(node, users, pinned)
    if core is None:
        return None
    absorbed, h, weight, bias, eps = core
    x, compute_dtype, out = h, None, absorbed[-1].outputs[0]
    up = h.producer
    # The upcast goes in only with the cast back, and when the norm is all that reads it.
    if is_dtype_cast(up) and h.id not in pinned and isinstance(up.args[0], Value) \
            and all(n in absorbed for n in users.get(h.id, [])):
        x, compute_dtype = up.args[0], up.kwargs["dtype"]

    def affine(op: str, out: Value) -> Node | None:
        """``out <op> v`` with v [D], if it may be absorbed: computed in the compute dtype."""
        node = _only_user(users, out, pinned)
        if node is None or node.op != op:
            return None
        v = _other(node, out)
        if not _vector_of(v, h.meta.shape[-1]) or node.outputs[0].meta.dtype != out.meta.dtype \
                or (compute_dtype is None and v.meta.dtype != x.meta.dtype):
            return None
        return node

    if weight is None and bias is None and (mul := affine("aten.mul.Tensor", out)) is not None:
        weight, out = _other(mul, out), mul.outputs[0]
        absorbed.append(mul)
    if bias is None and (add := affine("aten.add.Tensor", out)) is not None:
        bias, out = _other(add, out), add.outputs[0]
        absorbed.append(add)
    if compute_dtype is not None:
        down = _only_user(users, out, pinned)
        if is_dtype_cast(down) and down.kwargs["dtype"] == x.meta.dtype:
            absorbed = [up, *absorbed, down]
            out = down.outputs[0]
        else:
            x, compute_dtype = h, None
    if compute_dtype is None and any(v is not None and v.meta.dtype != h.meta.dtype for v in (weight, bias)):
        return None  # F.layer_norm wants weight and bias in the input's dtype
    return absorbed, (x, weight, bias, eps, compute_dtype), out


def fuse_layer_norm(g: Graph) -> Graph:
    users = g.users()
    pinned = pinned_values(g)  # intermediates must not be outputs; the chain's last value may be
    taken: set[int] = set()
    fused: list[tuple[list[Node], tuple, Value]] = []
    for node in g.nodes:
        if node.op in ("aten.layer_norm", "aten.mean.dim") and id(node) not in taken:
            m = _match(node, users, pinned)
            if m is not None and not any(id(n) in taken for n in m[0]):
                taken.update(id(n) for n in m[0])
                fused.append(m)
    if not fused:
        return g
    replacement: dict[int, Node] = {}
    for absorbed, args, out in fused:
        last = absorbed[-1]
        node = Node("ost.layer_norm", args, {}, last.name, last.source)
        node.outputs = [out]
        out.producer = node
        replacement[id(last)] = node
    g.nodes = [replacement.get(id(n), n) for n in g.nodes]
    drop_nodes(g, {id(n) for absorbed, _, _ in fused for n in absorbed[:-1]})
    return g
