"""``ost.rms_norm``: absorbs pow(2) → mean(-1, keepdim) → add(eps) → rsqrt → mul(x, ·), the optional
upcast around it (HF's ``x.to(float32)`` … ``.to(input_dtype)``) and the weight multiply after it, or
before the cast back (Gemma's form: ``weight_first``), with a weight computed as ``weight + c`` from a
weight read by nothing else (Gemma's ``1 + weight``: ``weight_offset``).

torch's own ``aten.rms_norm(x, [n], weight, eps)`` over the last dim (``F.rms_norm``, ``nn.RMSNorm``; export
keeps it whole) becomes ``ost.rms_norm`` too, with the arguments that compute what torch's CPU kernel does,
bit for bit: in float32 for fp16/bf16 with the weight multiplied before the cast back (``weight_first``),
as is in fp32 and fp64; no ``eps`` is the compute dtype's machine epsilon. The residual add before it
can then join it (add_rms_norm.py) and the projection after it take it as a prologue.

Absorbed: every node of the chain, provided each intermediate has exactly one reader and is not a
graph output or mutation value. Kept: ``x`` and the weight (whatever produces them).
"""
from __future__ import annotations

import torch

from ...ir import Graph, Node, TensorMeta, Value
from ..rewrite import drop_nodes, is_dtype_cast, pinned_values


def _only_user(users: dict[int, list[Node]], v: Value, pinned: set[int]) -> Node | None:
    readers = users.get(v.id, [])
    if len(readers) != 1 or v.id in pinned:
        return None
    return readers[0]


def _other(node: Node, v: Value):
    """The other operand of a binary node that reads ``v`` once."""
    a, b = node.args[0], node.args[1]
    if a is v and b is not v:
        return b
    if b is v and a is not v:
        return a
    return None


def _match(g: Graph, pow_node: Node, users, pinned) -> tuple[list[Node], tuple, Value] | None:
    if pow_node.args[1:] != (2,) and pow_node.args[1:] != (2.0,):
        return None
    h = pow_node.args[0]
    if not isinstance(h, Value) or not isinstance(h.meta, TensorMeta) or h.meta.rank == 0:
        return None
    absorbed = [pow_node]
    mean = _only_user(users, pow_node.outputs[0], pinned)
    if mean is None or mean.op != "aten.mean.dim" or mean.args[1:] not in (([-1], True), ([h.meta.rank - 1], True)) \
            or mean.kwargs:
        return None
    add = _only_user(users, mean.outputs[0], pinned)
    if add is None or add.op != "aten.add.Tensor" or add.args[0] is not mean.outputs[0] \
            or not isinstance(add.args[1], (int, float)) or isinstance(add.args[1], bool) or add.kwargs:
        return None
    rsqrt = _only_user(users, add.outputs[0], pinned)
    if rsqrt is None or rsqrt.op != "aten.rsqrt":
        return None
    norm = _only_user(users, rsqrt.outputs[0], pinned)
    if norm is None or norm.op != "aten.mul.Tensor" or _other(norm, rsqrt.outputs[0]) is not h:
        return None
    absorbed += [mean, add, rsqrt, norm]
    eps = float(add.args[1])
    x, compute_dtype, out = h, None, norm.outputs[0]
    up = h.producer
    # The upcast is absorbed only when pow and the normalizing mul are its sole readers.
    upcast = is_dtype_cast(up) and h.id not in pinned and isinstance(up.args[0], Value) and len(users.get(h.id, [])) == 2
    if upcast:
        down = _only_user(users, out, pinned)
        if is_dtype_cast(down) and down.kwargs["dtype"] == up.args[0].meta.dtype:
            x, compute_dtype = up.args[0], up.kwargs["dtype"]
            absorbed = [up] + absorbed + [down]
            out = down.outputs[0]
        else:
            gemma = _weight_first(users, pinned, up, out)
            if gemma is not None:
                mul, down, w = gemma
                weight, offset, weight_nodes = _offset_weight(users, pinned, w, weight_first=True)
                absorbed = [up] + weight_nodes + absorbed + [mul, down]
                return absorbed, (up.args[0], weight, eps, up.kwargs["dtype"], offset, True), down.outputs[0]
    weight = None
    mul = _only_user(users, out, pinned)
    if mul is not None and mul.op == "aten.mul.Tensor":
        w = _other(mul, out)
        if _is_row_weight(w, x):
            weight, offset, weight_nodes = _offset_weight(users, pinned, w, weight_first=False)
            if offset:
                absorbed = weight_nodes + absorbed + [mul]
                return absorbed, (x, weight, eps, compute_dtype, offset, False), mul.outputs[0]
            absorbed.append(mul)
            out = mul.outputs[0]
    return absorbed, (x, weight, eps, compute_dtype), out


def _is_row_weight(w, x: Value) -> bool:
    """A 1-D Value as long as x's last dim: a norm's per-channel weight."""
    return isinstance(w, Value) and isinstance(w.meta, TensorMeta) and w.meta.rank == 1 \
        and str(w.meta.shape[0]) == str(x.meta.shape[-1])


def _weight_first(users, pinned, up: Node, out: Value) -> tuple[Node, Node, Value] | None:
    """Gemma's form after the normalizing mul: ``mul(out, w)`` in the compute dtype, then the cast back
    to the input's dtype; (mul, cast, w) or None."""
    mul = _only_user(users, out, pinned)
    if mul is None or mul.op != "aten.mul.Tensor":
        return None
    w = _other(mul, out)
    if not _is_row_weight(w, up.args[0]) or w.meta.dtype != up.kwargs["dtype"]:
        return None
    down = _only_user(users, mul.outputs[0], pinned)
    if not is_dtype_cast(down) or down.kwargs["dtype"] != up.args[0].meta.dtype:
        return None
    return mul, down, w


def _offset_weight(users, pinned, w: Value, weight_first: bool) -> tuple[Value, float, list[Node]]:
    """``w = add(base, c)`` (Gemma's ``1 + weight``), read by the norm alone: (base, c, the nodes
    computing w). With ``weight_first`` a cast of base to the compute dtype is taken too (the reference
    casts the weight itself). Otherwise (w, 0.0, [])."""
    p = w.producer
    if p is None or p.op != "aten.add.Tensor" or p.kwargs or len(p.args) != 2 or w.id in pinned \
            or len(users.get(w.id, [])) != 1:
        return w, 0.0, []
    base, c = p.args
    if not _is_row_weight(base, w) or not isinstance(c, (int, float)) or isinstance(c, bool) or not c:
        return w, 0.0, []
    nodes = [p]
    cast = base.producer
    if weight_first and is_dtype_cast(cast) and isinstance(cast.args[0], Value) and base.id not in pinned \
            and len(users.get(base.id, [])) == 1 and _is_row_weight(cast.args[0], w):
        nodes.insert(0, cast)
        base = cast.args[0]
    return base, float(c), nodes


_HALF = (torch.float16, torch.bfloat16)


def _whole(node: Node) -> tuple | None:
    """ost.rms_norm's arguments for an ``aten.rms_norm`` node over the last dim (see the module), or None:
    another normalized shape, or a weight of another dtype than x's."""
    names = ("input", "normalized_shape", "weight", "eps")
    if len(node.args) > 4 or set(node.kwargs) - set(names):
        return None
    bound = {**dict(zip(names, node.args)), **node.kwargs}
    x, shape, weight, eps = (bound.get(n) for n in names)
    if not isinstance(x, Value) or not isinstance(x.meta, TensorMeta) or x.meta.rank == 0 \
            or x.meta.dtype not in (*_HALF, torch.float32, torch.float64) \
            or not isinstance(shape, (list, tuple)) or len(shape) != 1 or str(shape[0]) != str(x.meta.shape[-1]):
        return None
    if weight is not None and (not _is_row_weight(weight, x) or weight.meta.dtype != x.meta.dtype):
        return None
    half = x.meta.dtype in _HALF
    if eps is None:
        eps = torch.finfo(torch.float32 if half else x.meta.dtype).eps
    elif not isinstance(eps, (int, float)) or isinstance(eps, bool):
        return None
    return x, weight, float(eps), torch.float32 if half else None, 0.0, half


def fuse_rms_norm(g: Graph) -> Graph:
    users = g.users()
    pinned = pinned_values(g)  # intermediates must not be outputs; the chain's last value may be
    taken: set[int] = set()
    fused: list[tuple[list[Node], tuple, Value]] = []
    for node in g.nodes:
        if node.op == "aten.rms_norm":        # one node, which no chain below takes
            args = _whole(node)
            if args is not None:
                fused.append(([node], args, node.outputs[0]))
        elif node.op == "aten.pow.Tensor_Scalar" and id(node) not in taken:
            m = _match(g, node, users, pinned)
            if m is not None and not any(id(n) in taken for n in m[0]):
                taken.update(id(n) for n in m[0])
                fused.append(m)
    if not fused:
        return g
    replacement: dict[int, Node] = {}
    for absorbed, args, out in fused:
        last = absorbed[-1]
        node = Node("ost.rms_norm", args, {}, last.name, last.source)
        node.outputs = [out]
        out.producer = node
        replacement[id(last)] = node
    g.nodes = [replacement.get(id(n), n) for n in g.nodes]
    drop_nodes(g, {id(n) for absorbed, _, _ in fused for n in absorbed[:-1]})
    return g

