"""``ost.kv_update``: a write of new rows into a static KV cache at a position, as torch.export
functionalizes it (``state <- write(state, ...)``), becomes one ``ost.kv_update(cache, new, index,
dim, ring)``; passes.reinplace then makes it ``ost.kv_update_`` where nothing reads the old cache.

Only writes into a cache are fused: a buffer the program writes back (state, or a mutated input),
or the result of an earlier fused write into one; a row write into a temporary stays an aten op.
Forms (the index is 1-D along exactly one dim; ``new`` has the cache's dtype, and its shape except
on that dim, where it has one row per index):
- ``aten.index_put(cache, [None, …, index, None, …], new)``, accumulate False: ``cache.index_copy_(d,
  pos, new)`` (torch.export decomposes it so), ``cache[:, :, pos] = new``, an explicit ``index_put_``;
  ``new`` may leave out leading 1-dims (index_put broadcasts it): they come back as unsqueezes;
- ``aten.index_copy(cache, dim, index, new)``;
- ``aten.slice_scatter(cache, copy(slice(cache, d, start, end), new), d, start, end)``: the slice
  assignment ``cache[:, :, start:end] = new`` with ``end - start`` provably ``new``'s length on ``d``
  (start from ``pos[0].item()`` or a symbolic size). The slice and the copy are absorbed and the index
  is a new ``aten.arange(start, end)``.
A ring buffer's ``index = pos % S`` (``aten.remainder`` or ``aten.fmod`` by a scalar equal to the
cache's length on ``dim``) is absorbed into ``ring=S`` (the remainder node too when nothing else reads it); fmod
is exact because index_put counts a negative slot from the end, which is ``pos mod S``.

Absorbed nodes never have other readers and are never graph outputs or mutation values; the write's
own result keeps its Value, so its readers and the ``state <- new`` mutation now read kv_update.
"""
from __future__ import annotations

import sympy
import torch

from ...ir import Graph, Node, ScalarMeta, TensorMeta, Value
from ..rewrite import drop_nodes, pinned_values

_INDEX_DTYPES = (torch.int64, torch.int32)
_RINGS = ("aten.remainder.Scalar", "aten.fmod.Scalar")


def _tensor(v) -> bool:
    return isinstance(v, Value) and isinstance(v.meta, TensorMeta)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _sole_reader(users, v: Value, pinned: set[int]) -> bool:
    return len(users.get(v.id, ())) == 1 and v.id not in pinned


def _rows_fit(cache: Value, new: Value, dim: int, rows, broadcast: bool = False) -> bool:
    """``new`` is the cache's dtype and shape with ``rows`` rows on ``dim``; with ``broadcast`` (an
    index_put's values) also that shape with some of its leading 1-dims left out."""
    c, n = cache.meta, new.meta
    want = tuple(str(rows) if i == dim else str(d) for i, d in enumerate(c.shape))
    have = tuple(str(d) for d in n.shape)
    lead = len(want) - len(have)
    if c.dtype != n.dtype or lead < 0 or (lead and not broadcast):
        return False
    return have == want[lead:] and all(d == "1" for d in want[:lead])


def _ring(cache: Value, index: Value, dim: int, users, pinned) -> tuple[Value, int | None, Node | None]:
    """(index, ring, absorbed remainder node): ``pos % S`` with S the cache's length on ``dim``."""
    rem = index.producer
    if rem is None or rem.op not in _RINGS or rem.kwargs or len(rem.args) != 2:
        return index, None, None
    pos, size = rem.args
    if not _tensor(pos) or pos.meta.rank != 1 or pos.meta.dtype not in _INDEX_DTYPES or not _int(size) \
            or str(size) != str(cache.meta.shape[dim]):
        return index, None, None
    # A remainder read elsewhere too (K's and V's writes share one; CSE shares it across layers) stays
    # for its other readers; the pipeline's dce drops it once no reader is left.
    return pos, size, rem if _sole_reader(users, index, pinned) else None


def _index_write(node: Node) -> tuple[Value, Value, Value, int] | None:
    """(cache, new, index, dim) of an index_put / index_copy that writes one 1-D index on one dim."""
    if node.op == "aten.index_put":
        names = ("self", "indices", "values", "accumulate")
        bound = {"accumulate": False, **dict(zip(names, node.args)), **node.kwargs}
        cache, indices, new = bound.get("self"), bound.get("indices"), bound.get("values")
        if bound["accumulate"] is not False or not isinstance(indices, (list, tuple)):
            return None
        given = [i for i, x in enumerate(indices) if x is not None]
        if len(given) != 1:
            return None
        dim = given[0]
        index = indices[dim]
    else:  # aten.index_copy
        names = ("self", "dim", "index", "source")
        bound = {**dict(zip(names, node.args)), **node.kwargs}
        cache, dim, index, new = bound.get("self"), bound.get("dim"), bound.get("index"), bound.get("source")
        if not _int(dim) or not _tensor(cache) or not -cache.meta.rank <= dim < cache.meta.rank:
            return None
        dim %= cache.meta.rank
    if not (_tensor(cache) and _tensor(new) and _tensor(index)) or dim >= cache.meta.rank:
        return None
    if index.meta.rank != 1 or index.meta.dtype not in _INDEX_DTYPES \
            or not _rows_fit(cache, new, dim, index.meta.shape[0], broadcast=node.op == "aten.index_put"):
        return None
    return cache, new, index, dim


def _expr(v) -> sympy.Expr | None:
    """A host int's symbolic value: an int, or a scalar Value whose meta records its expression."""
    if _int(v):
        return sympy.Integer(v)
    if isinstance(v, Value) and isinstance(v.meta, ScalarMeta) and v.meta.kind is int and v.meta.expr is not None:
        return v.meta.expr.expr
    return None


def _dim_expr(d) -> sympy.Expr:
    return sympy.Integer(d) if _int(d) else d.expr


def _same(a, b) -> bool:
    return a is b or (_int(a) and _int(b) and a == b)


def _slice_args(node: Node, names: tuple[str, ...]) -> dict:
    return {"dim": 0, "start": None, "end": None, "step": 1, **dict(zip(names, node.args)), **node.kwargs}


def _slice_write(node: Node, users, pinned) -> tuple[Value, Value, int, object, object, list[Node]] | None:
    """(cache, new, dim, start, end, [slice, copy]) of ``cache[.., start:end, ..] = new``."""
    w = _slice_args(node, ("self", "src", "dim", "start", "end", "step"))
    cache, src, dim, start, end = w.get("self"), w.get("src"), w["dim"], w["start"], w["end"]
    if not _tensor(cache) or not _tensor(src) or w["step"] != 1 or not _int(dim) \
            or not -cache.meta.rank <= dim < cache.meta.rank or not _sole_reader(users, src, pinned):
        return None
    dim %= cache.meta.rank
    copy = src.producer
    if copy is None or copy.op != "aten.copy" or len(copy.args) != 2 or set(copy.kwargs) - {"non_blocking"}:
        return None
    part, new = copy.args
    if not _tensor(part) or not _tensor(new) or not _sole_reader(users, part, pinned) \
            or part.producer is None or part.producer.op != "aten.slice.Tensor":
        return None
    sl = part.producer
    r = _slice_args(sl, ("self", "dim", "start", "end", "step"))
    if r.get("self") is not cache or r["step"] != 1 or not _int(r["dim"]) or r["dim"] % cache.meta.rank != dim \
            or not _same(r["start"], start) or not _same(r["end"], end):
        return None
    rows = part.meta.shape[dim]
    # The rows written are start..end-1 only when the slice is not clamped: end - start is its length.
    lo, hi = _expr(start), _expr(end)
    if lo is None or hi is None or sympy.expand(hi - lo - _dim_expr(rows)) != 0:
        return None
    if str(part.meta) != str(new.meta) or not _rows_fit(cache, new, dim, rows):
        return None
    return cache, new, dim, start, end, [sl, copy]


def fuse_kv_update(g: Graph) -> Graph:
    users = g.users()
    pinned = pinned_values(g)
    # Caches: buffers the program writes back (state, or a mutated input), and what a fused write made
    # of one (a second write in the same step). A row write into anything else stays an aten op.
    caches = {target.id for target, _ in g.mutations}
    replacement: dict[int, list[Node]] = {}
    dead: set[int] = set()
    for node in g.nodes:
        if not node.args or not isinstance(node.args[0], Value) or node.args[0].id not in caches:
            continue
        if node.op in ("aten.index_put", "aten.index_copy"):
            m = _index_write(node)
            if m is None:
                continue
            cache, new, index, dim = m
            index, ring, rem = _ring(cache, index, dim, users, pinned)
            if rem is not None:
                dead.add(id(rem))
            made: list[Node] = []
            # Values an index_put broadcasts (``cache[:, :, slot] = k.view(h, 1, d)``) get back their
            # leading 1-dims, so ``new`` has the cache's rank as kv_update's contract says.
            for _ in range(cache.meta.rank - new.meta.rank):
                unsq = Node("aten.unsqueeze", (new, 0), {}, f"{node.name}_rows{len(made)}", node.source)
                new = g.new_value(unsq.name, TensorMeta(new.meta.dtype, (1, *new.meta.shape)), "temp", unsq)
                unsq.outputs = [new]
                made.append(unsq)
        elif node.op == "aten.slice_scatter":
            m = _slice_write(node, users, pinned)
            if m is None:
                continue
            cache, new, dim, start, end, absorbed = m
            dead.update(id(n) for n in absorbed)
            # The index is start + arange(rows); the backend puts its own device in for the export's.
            arange = Node("aten.arange.start_step", (start, end, 1),
                          {"dtype": torch.int64, "layout": torch.strided, "device": torch.device("cpu"),
                           "pin_memory": False}, f"{node.name}_index", node.source)
            index = g.new_value(arange.name, TensorMeta(torch.int64, (new.meta.shape[dim],)), "temp", arange)
            arange.outputs = [index]
            made, ring = [arange], None
        else:
            continue
        out = node.outputs[0]
        caches.add(out.id)
        fused = Node("ost.kv_update", (cache, new, index, dim, ring), {}, node.name, node.source)
        fused.outputs = [out]
        out.producer = fused
        replacement[id(node)] = made + [fused]
    if not replacement:
        return g
    g.nodes = [r for n in g.nodes for r in replacement.get(id(n), (n,))]
    drop_nodes(g, dead)
    return g
