"""The launches of one step of a graph on a device, worked out without the device: the scheduler's
fusion groups (one generated kernel each, on CUDA with fusion on) and the nodes that do device work on
their own. Shown by ``ostinato inspect --launches``.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any, Iterable

from ..ir import Graph, Node, Value
from ..ir.ops import does_device_work
from ..ir.types import TensorMeta
from .schedule import FusionGroup, fusion_enabled, schedule
from .triton_source import kernel_name


def fuses(device: str) -> bool:
    """Whether the device's backend lowers fusion groups to generated kernels: CUDA, unless
    OSTINATO_FUSION=0."""
    if os.environ.get("OSTINATO_CUDA_REFERENCE") == "1" or importlib.util.find_spec("triton") is None:
        return False        # the CUDA backend runs references then (backends/cuda/ops.py)
    return device == "cuda" and fusion_enabled()


def node_is_kernel(node: Node) -> bool:
    """Whether a node does device work once lowered (views and size arithmetic do not): the runtime's
    rule for launches (it reads only the op's name)."""
    return does_device_work(node.op)


def _values(xs: Iterable[Any]) -> Iterable[Value]:
    for x in xs:
        if isinstance(x, Value):
            yield x
        elif isinstance(x, (list, tuple)):
            yield from _values(x)


def node_bytes(node: Node) -> int | None:
    """Bytes a node reads and writes (each tensor input and output once); None when a shape is symbolic."""
    total, seen = 0, set()
    for v in (*_values(node.inputs), *_values(node.outputs)):
        if v.id in seen or not isinstance(v.meta, TensorMeta):
            continue
        seen.add(v.id)
        n = 1
        for d in v.meta.shape:
            if not isinstance(d, int):
                return None
            n *= d
        total += n * v.meta.dtype.itemsize
    return total


def constant_nodes(graph: Graph) -> set[int]:
    """ids of the nodes compile-time folding runs once (runtime/folding.py), as it decides: pure ops reading
    only constants, literals and such nodes' results (creation ops reading nothing included), none of whose
    results the graph returns or writes back, an impure node takes, or one of those is a view of. (The
    runtime also leaves unfolded a result much larger than its inputs, and any past 1 GiB folded in all;
    those limits, which depend on sizes at compile, are not applied here.) Empty where folding is off."""
    from ..runtime.folding import _foldable_op, folding_enabled, protected as protected_of, written_reads
    if not folding_enabled():
        return set()
    keep = {v.id for v in graph.output_values()} | {v.id for pair in graph.mutations for v in pair}

    def ids(a):     # the values one argument reads (a list's items)
        return [v.id for v in (a if isinstance(a, (list, tuple)) else (a,)) if isinstance(v, Value)]
    protected = protected_of([(n.op, [v.id for v in n.inputs], [v.id for v in n.outputs if v is not None],
                               written_reads(n.op, n.args, ids)) for n in graph.nodes], keep)
    made = {v.id for v in graph.constants}
    out: set[int] = set()
    for node in graph.nodes:
        if all(v.id in made for v in node.inputs) and _foldable_op(node.op) and node.outputs \
                and all(v is not None and v.id not in protected for v in node.outputs):
            out.add(id(node))
            made.update(v.id for v in node.outputs)
    return out


def launch_table(graph: Graph, device: str) -> list[dict]:
    """One row per device launch of a step, in order: ``kind`` ("fused" or the op), ``name`` (the group
    or the node), ``ops`` (the ops it runs, in order), ``op_count``, ``kernel`` (the generated kernel's
    name, None for other ops) and ``bytes`` (read + written; None when symbolic)."""
    if fuses(device):
        from ..backends.cuda.layout import channels_last_convs     # the layouts CUDA's lowering picks
        items: list[Node | FusionGroup] = schedule(graph, frozenset(channels_last_convs(graph)))
    else:
        items = list(graph.nodes)
    folded = constant_nodes(graph)
    rows: list[dict] = []
    for item in items:
        if all(id(n) in folded for n in (item.nodes if isinstance(item, FusionGroup) else [item])):
            continue        # made from weights alone: run once at compile (runtime/folding.py), not per step
        if isinstance(item, FusionGroup):
            assert item.spec is not None
            ops = [n.op for n in item.nodes]
            rows.append({"index": len(rows), "kind": "fused", "name": item.name, "ops": ops,
                         "op_count": len(ops), "kernel": kernel_name(item.spec), "bytes": item.bytes_moved()})
        elif node_is_kernel(item):
            rows.append({"index": len(rows), "kind": item.op, "name": item.name, "ops": [item.op],
                         "op_count": 1, "kernel": None, "bytes": node_bytes(item)})
    return rows


def summarize(graph: Graph, rows: list[dict]) -> dict:
    """Totals of a launch table: launches, generated fused kernels, the ops they absorb, the graph's
    nodes without device work (skipped), and the bytes moved (None when any launch's are symbolic)."""
    fused = [r for r in rows if r["kind"] == "fused"]
    sizes = [r["bytes"] for r in rows]
    return {
        "nodes": len(graph.nodes),
        "launches": len(rows),
        "fused_kernels": len(fused),
        "ops_absorbed": sum(r["op_count"] for r in fused),
        "skipped": len(graph.nodes) - sum(r["op_count"] for r in rows),
        "bytes": None if any(b is None for b in sizes) else sum(sizes),
    }
