"""Small matrix-vector products as a multiply and a sum, for the code generator's groups.

``aten.bmm(A [b, m, k], B [b, k, 1])`` (and ``aten.mm(A [m, k], B [k, 1])``) with a short static ``k``
becomes ``sum(A * B^T, -1, keepdim=True)``, where ``B^T`` is a permute (a view) of B. In fp32; a
lower precision is read as fp32 and the sum rounded once, as the matmul's fp32 accumulation does. A
matmul is a library call of its own that no fusion group can take; the multiply and the sum are a
pointwise op and a row reduction, so the scheduler puts them in one group with what produces A.

Where this matters: a state-space model's scan as transformers writes it without its CUDA kernels
(Mamba: per token, ``state = dA * state + dBu`` then ``state @ C``, state [b, d, 16]). Each token was a
fused update and a cuBLAS matmul; it becomes one generated kernel writing the new state and its
output. ``k`` is at most MAX_K: a longer K is a matmul's work (a lone projection has its own kernels).
"""
from __future__ import annotations

import torch

from ..ir import Graph, Node, Value
from ..ir.types import TensorMeta
from .rewrite import unplaced_node

MAX_K = 64
_LOW = (torch.float16, torch.bfloat16)


def _matvec(node: Node) -> tuple[Value, Value] | None:
    """(A, B) when ``node`` is a bmm/mm whose B is one column of a short static K, else None."""
    if node.op not in ("aten.bmm", "aten.mm") or node.kwargs or len(node.args) != 2:
        return None
    a, b = node.args
    if not (isinstance(a, Value) and isinstance(b, Value) and isinstance(a.meta, TensorMeta)
            and isinstance(b.meta, TensorMeta)):
        return None
    rank = 3 if node.op == "aten.bmm" else 2
    if a.meta.rank != rank or b.meta.rank != rank or a.meta.dtype != b.meta.dtype:
        return None
    if a.meta.dtype not in (torch.float32, *_LOW):
        return None
    k, n = b.meta.shape[-2], b.meta.shape[-1]
    if not (isinstance(k, int) and n == 1 and 1 <= k <= MAX_K and a.meta.shape[-1] == k):
        return None
    return a, b


def rewrite_small_matvecs(g: Graph) -> Graph:
    """Every bmm/mm of one output column and K <= MAX_K as a permute, a multiply and a sum (see above)."""
    out: list[Node] = []
    changed = False
    for node in g.nodes:
        found = _matvec(node)
        if found is None:
            out.append(node)
            continue
        a, b = found
        result = node.outputs[0]
        name, src, dtype, rank = node.name, node.source, a.meta.dtype, a.meta.rank
        new: list[Node] = []

        def add(op: str, args: tuple, kwargs: dict, meta: TensorMeta, suffix: str) -> Value:
            v = unplaced_node(g, op, args, kwargs, meta, f"{name}_{suffix}", src)
            new.append(v.producer)
            return v
        bt_shape = b.meta.shape[:-2] + (1, b.meta.shape[-2])
        perm = list(range(rank - 2)) + [rank - 1, rank - 2]
        bt = add("aten.permute", (b, perm), {}, TensorMeta(dtype, bt_shape), "bt")
        if dtype in _LOW:
            a = add("aten._to_copy", (a,), {"dtype": torch.float32}, TensorMeta(torch.float32, a.meta.shape), "a32")
            bt = add("aten._to_copy", (bt,), {"dtype": torch.float32}, TensorMeta(torch.float32, bt_shape), "b32")
        prod = add("aten.mul.Tensor", (a, bt), {}, TensorMeta(torch.float32, a.meta.shape), "prod")
        if dtype in _LOW:
            s = add("aten.sum.dim_IntList", (prod, [-1], True), {}, TensorMeta(torch.float32, result.meta.shape), "sum")
            last = Node("aten._to_copy", (s,), {"dtype": dtype}, name, src)
        else:
            last = Node("aten.sum.dim_IntList", (prod, [-1], True), {}, name, src)
        last.outputs = [result]
        result.producer = last
        new.append(last)
        out.extend(new)
        changed = True
    if changed:
        g.nodes = out
    return g
