"""Canonicalize: remove no-op nodes, collapse chains of views, fold constant host arithmetic and
scalar identities (``x + 0``, ``x * 1``).

Removing a node replaces its output by its input everywhere (graph outputs and mutations too).
One forward sweep is enough: each node's arguments are rewritten before its rule runs, so a chain
``view(view(view(x)))`` becomes ``view(x)`` as the sweep reaches its end.

Copies (``clone``, ``_to_copy`` to the same dtype) are removed only where nobody can tell: the copy
is not a graph output or mutation value, its source is a temporary no in-place write touches, and
no layout-sensitive op (``view``, ``as_strided``) reads it, even through other views: a copy may
change strides (an expanded or transposed source becomes dense), and a later ``view`` can rely on it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..ir import Graph, Node, TensorMeta, Value, get_op
from .rewrite import Replacements, drop_nodes, pinned_values, substitute, substitute_graph_refs, volatile_values

_KEEP = object()  # a rule's answer when the node stays (None may be a folded constant)
_RESHAPES = ("aten.view", "aten.reshape", "aten._unsafe_view")
# Ops whose result depends on the input's strides, not only its values.
_LAYOUT_SENSITIVE = ("aten.view", "aten._unsafe_view", "aten.as_strided", "aten.view_as_complex",
                     "aten.view_as_real")


@dataclass
class _Context:
    pinned: set[int]
    volatile: set[int]
    users: dict[int, list[Node]]


def _same_shape(a: Value, b: Value) -> bool:
    # Symbolic dims compare by their canonical text: equal text is equal size for sure; unequal text
    # merely keeps a node that might have been removable.
    return (isinstance(a.meta, TensorMeta) and isinstance(b.meta, TensorMeta)
            and [str(d) for d in a.meta.shape] == [str(d) for d in b.meta.shape])


def _same_meta(a: Value, b: Value) -> bool:
    return _same_shape(a, b) and a.meta.dtype == b.meta.dtype


def _input(node: Node) -> Value | None:
    x = node.args[0] if node.args else None
    return x if isinstance(x, Value) else None


# -- views --------------------------------------------------------------------------------------
def _reshape(node: Node, ctx: _Context) -> Any:
    x, out = _input(node), node.outputs[0]
    if x is None:
        return _KEEP
    inner = x.producer
    if inner is not None and inner.op in _RESHAPES and isinstance(_input(inner), Value):
        # view∘view is a view of the source (viewability is transitive); a chain with a reshape
        # stays a reshape, and only when the inner result has no other reader (else its copy would
        # run twice).
        pure_views = node.op != "aten.reshape" and inner.op != "aten.reshape"
        if pure_views or (len(ctx.users.get(x.id, ())) == 1 and x.id not in ctx.pinned):
            node.args = (_input(inner), *node.args[1:])
            if node.op != inner.op:
                node.op = "aten.view" if pure_views else "aten.reshape"
            x = node.args[0]
    return x if _same_meta(x, out) else _KEEP


def _permute(node: Node, ctx: _Context) -> Any:
    x = _input(node)
    if x is None or not isinstance(x.meta, TensorMeta):
        return _KEEP
    rank = x.meta.rank
    dims = [int(d) % rank for d in node.args[1]] if rank else []
    inner = x.producer
    if inner is not None and inner.op == "aten.permute" and isinstance(_input(inner), Value):
        # out[i] = inner[dims[i]] = source[first[dims[i]]]
        first = [int(d) % rank for d in inner.args[1]]
        dims = [first[d] for d in dims]
        x = _input(inner)
        node.args = (x, dims, *node.args[2:])
    return x if dims == list(range(rank)) else _KEEP


def _transpose(node: Node, ctx: _Context) -> Any:
    x = _input(node)
    if x is None or not isinstance(x.meta, TensorMeta) or x.meta.rank == 0:
        return _KEEP
    d0, d1 = (int(d) % x.meta.rank for d in node.args[1:3])
    return x if d0 == d1 else _KEEP


def _same_shape_view(node: Node, ctx: _Context) -> Any:
    """expand / alias / detach: the output is the input when its shape is the input's."""
    x = _input(node)
    return x if x is not None and _same_meta(x, node.outputs[0]) else _KEEP


def _slice(node: Node, ctx: _Context) -> Any:
    x = _input(node)
    if x is None:
        return _KEEP
    args = list(node.args) + [None] * (5 - len(node.args))
    start = node.kwargs.get("start", args[2])
    step = node.kwargs.get("step", args[4] if args[4] is not None else 1)
    if start in (None, 0) and step == 1 and _same_meta(x, node.outputs[0]):
        return x
    return _KEEP


# -- copies ---------------------------------------------------------------------------------------
def _reaches_layout_sensitive(v: Value, ctx: _Context) -> bool:
    for user in ctx.users.get(v.id, ()):
        if user.op in _LAYOUT_SENSITIVE:
            return True
        op = get_op(user.op)
        if op is not None and op.category == "view":
            if any(o is not None and _reaches_layout_sensitive(o, ctx) for o in user.outputs):
                return True
    return False


def _removable_copy(node: Node, ctx: _Context) -> Value | None:
    x, out = _input(node), node.outputs[0]
    if x is None or x.role != "temp" or not _same_meta(x, out):
        return None
    if out.id in ctx.pinned or x.id in ctx.pinned or out.id in ctx.volatile or x.id in ctx.volatile:
        return None
    if _reaches_layout_sensitive(out, ctx):
        return None
    return x


def _cat(node: Node, ctx: _Context) -> Any:
    """cat of one tensor and empty ones (size 0 along the dim, static): that tensor, when it could stand
    for a copy of itself (as a removable clone). Phi-3's rotary embedding cats the rotated part with the
    pass-through part, empty when the rotary dim is the whole head (every Phi-3-mini layer). Where a
    layout-sensitive op reads the cat (eager attention's matmul: expand, view) it stays until the
    pipeline's second canonicalize, after the patterns took that reader."""
    parts = node.args[0] if node.args else None
    dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else 0)
    if not isinstance(parts, (list, tuple)) or not isinstance(dim, int):
        return _KEEP
    out = node.outputs[0]
    kept = []
    for p in parts:
        if not isinstance(p, Value) or not isinstance(p.meta, TensorMeta):
            return _KEEP
        size = p.meta.shape[dim] if -p.meta.rank <= dim < p.meta.rank else None
        if not (isinstance(size, int) and size == 0):
            kept.append(p)
    if len(kept) != 1 or len(parts) == 1:
        return _KEEP
    x = kept[0]
    if x.role != "temp" or not _same_meta(x, out) or x.id in ctx.pinned or out.id in ctx.pinned \
            or x.id in ctx.volatile or out.id in ctx.volatile or _reaches_layout_sensitive(out, ctx):
        return _KEEP
    return x


def _preserves_format(kwargs: dict) -> bool:
    return kwargs.get("memory_format") in (None, torch.preserve_format)


def _clone(node: Node, ctx: _Context) -> Any:
    if set(node.kwargs) - {"memory_format"} or len(node.args) != 1 or not _preserves_format(node.kwargs):
        return _KEEP
    x = _removable_copy(node, ctx)
    return _KEEP if x is None else x


_TO_COPY_NEUTRAL = {"dtype": None, "non_blocking": False, "pin_memory": (None, False),
                    "layout": (None, torch.strided), "memory_format": (None, torch.preserve_format)}


def _to_copy(node: Node, ctx: _Context) -> Any:
    # A device kwarg is the export device, which the backend swaps for its own: never neutral.
    for k, v in node.kwargs.items():
        allowed = _TO_COPY_NEUTRAL.get(k, _KEEP)
        if allowed is _KEEP or (k != "dtype" and v not in (allowed if isinstance(allowed, tuple) else (allowed,))):
            return _KEEP
    if len(node.args) != 1:
        return _KEEP
    x = _removable_copy(node, ctx)  # also checks the dtype is unchanged
    return _KEEP if x is None else x


def _to_dtype(node: Node, ctx: _Context) -> Any:
    x = _input(node)
    names = ("self", "dtype", "non_blocking", "copy", "memory_format")
    bound = {**dict(zip(names, node.args)), **node.kwargs}
    if x is None or bound.get("non_blocking", False) or not _preserves_format(bound):
        return _KEEP
    if not bound.get("copy", False):
        # to(dtype) without copy returns its input itself when the dtype already matches.
        return x if _same_meta(x, node.outputs[0]) else _KEEP
    y = _removable_copy(node, ctx)
    return _KEEP if y is None else y


# -- host arithmetic --------------------------------------------------------------------------------
def _fold_sym(node: Node, ctx: _Context) -> Any:
    if node.inputs or len(node.outputs) != 1:
        return _KEEP
    try:
        return get_op(node.op).target(*node.args, **node.kwargs)
    except Exception:  # noqa: BLE001 - e.g. division by zero: leave it for the run to report
        return _KEEP


def _sym_size(node: Node, ctx: _Context) -> Any:
    x = _input(node)
    if x is None or not isinstance(x.meta, TensorMeta) or x.meta.rank == 0:
        return _KEEP
    d = x.meta.shape[int(node.args[1]) % x.meta.rank]
    return d if isinstance(d, int) else _KEEP


# -- scalar identities ------------------------------------------------------------------------------
def _is_number(v: Any, value: int) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == value


def _identity_arith(node: Node, ctx: _Context) -> Any:
    """``x + 0``, ``x - 0``, ``x * 1``, ``x / 1`` (either side for + and *) are ``x`` when the result's
    dtype and shape are x's (an int tensor times 1.0 is a float tensor, and stays). The only value
    that changes is -0.0 + 0, which becomes +0.0; nothing downstream of a model can tell."""
    if node.kwargs.get("alpha", 1) != 1 or set(node.kwargs) - {"alpha"} or len(node.args) != 2:
        return _KEEP
    a, b = node.args
    unit = 0 if node.op in ("aten.add.Tensor", "aten.sub.Tensor") else 1
    commutes = node.op in ("aten.add.Tensor", "aten.mul.Tensor")
    x = a if _is_number(b, unit) else b if commutes and _is_number(a, unit) else None
    out = node.outputs[0]
    if not isinstance(x, Value) or not _same_meta(x, out):
        return _KEEP
    # The result is a fresh dense tensor and x may not be: same guards as removing a copy.
    if out.id in ctx.pinned or {x.id, out.id} & ctx.volatile or _reaches_layout_sensitive(out, ctx):
        return _KEEP
    return x


RULES: dict[str, Callable[[Node, _Context], Any]] = {
    "aten.cat": _cat,
    **{op: _identity_arith for op in ("aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor",
                                      "aten.div.Tensor")},
    **{op: _reshape for op in _RESHAPES},
    "aten.permute": _permute,
    "aten.transpose.int": _transpose,
    "aten.expand": _same_shape_view,
    "aten.alias": _same_shape_view,
    "aten.detach": _same_shape_view,
    "aten.slice.Tensor": _slice,
    "aten.clone": _clone,
    "aten._to_copy": _to_copy,
    "aten.to.dtype": _to_dtype,
    "aten.sym_size.int": _sym_size,
}


def _rule(op: str) -> Callable[[Node, _Context], Any] | None:
    if op.startswith("sym."):
        return _fold_sym
    return RULES.get(op)


def canonicalize(g: Graph) -> Graph:
    ctx = _Context(pinned_values(g), volatile_values(g), g.users())
    mutation_values = {new.id for _, new in g.mutations}
    mapping: Replacements = {}
    dead: set[int] = set()
    for node in g.nodes:
        substitute(node, mapping)
        rule = _rule(node.op)
        if rule is None or len(node.outputs) != 1 or node.outputs[0] is None:
            continue
        out = node.outputs[0]
        result = rule(node, ctx)
        if result is _KEEP or (out.id in mutation_values and not isinstance(result, Value)):
            continue
        mapping[out.id] = result
        dead.add(id(node))
    substitute_graph_refs(g, mapping)
    drop_nodes(g, dead)
    return g
