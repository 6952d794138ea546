"""Which memory layout a graph's 2-D convolutions run in on CUDA, decided once per graph at lowering.

fp16/bf16 convolutions run channels-last (NHWC): cuDNN's tensor-core kernels take that layout, and
given NCHW tensors it converts them to it and back around every convolution (two extra passes over
the activations). Once one convolution runs NHWC its output is channels-last, and what reads it keeps
that layout without a copy: torch's pointwise kernels follow their input's layout, generated kernels
give their full-size outputs the layout of a full-size input and walk dims in the order of its strides
(kernels/fused.py), and the next convolution takes it as it is. The model's input is converted once, by
the first convolution. Convolutions feeding a group norm of long groups stay in their input's
layout (see LONG_GROUP). A graph output that may have come out channels-last is made contiguous at the
end of the plan (one copy), as eager gives it (torch.compile keeps eager's output strides the same way).

``OSTINATO_CONV_LAYOUT=nchw`` keeps every convolution in the layout its input comes in, ``=nhwc`` runs
every one channels-last, those feeding long-grouped group norms too (the A/B switches); the mode is part
of the plan key.
"""
from __future__ import annotations

import os

import torch

from ...ir import Graph, Node, get_op
from ...ir.types import TensorMeta
from ..base import Launch, _bind

HALF = (torch.float16, torch.bfloat16)
CONV = "aten.convolution"


def conv_layout_mode() -> str:
    mode = os.environ.get("OSTINATO_CONV_LAYOUT", "auto")
    return mode if mode in ("nchw", "nhwc") else "auto"


def runs_channels_last(node: Node) -> bool:
    """A 2-D fp16/bf16 convolution (not transposed): the ones cuDNN runs fastest NHWC."""
    if node.op != CONV or len(node.args) < 9:
        return False
    x = node.args[0]
    meta = getattr(x, "meta", None)
    return (isinstance(meta, TensorMeta) and meta.rank == 4 and meta.dtype in HALF
            and node.args[6] is False)


# Group norms whose groups hold more elements than this are computed by the looped row kernel, which
# re-reads each group for its statistics (split across programs when the groups are few: fused.py):
# over a channels-last tensor every read takes a group's short run of channels in each pixel. With runs
# of fewer than NARROW_GROUP channels (4 bytes of each 32-byte sector at 2 channels) that measured 3-8x
# slower than over NCHW on an H100 (conv-stack, 2 channels per group: 0.05 -> 0.17 ms per norm);
# with 4 and 8 channels (unet-r64) the split kernels over NHWC cost what they cost over NCHW, and the
# convolutions around gain (0.913 -> 0.856 ms of GPU time per step). Shorter groups are held in
# registers and read once.
LONG_GROUP = 4096
NARROW_GROUP = 4


def _feeds_long_group_norm(graph: Graph) -> set[str]:
    """Convolutions whose result reaches a long- and narrow-grouped ``native_group_norm`` (more than
    LONG_GROUP elements, fewer than NARROW_GROUP channels per group) through pointwise ops only (a
    residual sum, an added bias or embedding, an activation): they stay in their input's layout."""
    keep: set[str] = set()
    for node in graph.nodes:
        if node.op != "aten.native_group_norm" or len(node.args) < 7:
            continue
        c, hw, groups = node.args[4], node.args[5], node.args[6]
        if all(isinstance(d, int) for d in (c, hw, groups)) and groups and (
                c // groups * hw <= LONG_GROUP or c // groups >= NARROW_GROUP):
            continue
        stack, seen = [node.args[0]], set()
        while stack:
            v = stack.pop()
            if getattr(v, "id", None) in seen or getattr(v, "producer", None) is None:
                continue
            seen.add(v.id)
            p = v.producer
            if p.op == CONV:
                keep.add(p.name)
            elif getattr(get_op(p.op), "category", None) == "elementwise":
                stack.extend(x for x in p.inputs if isinstance(x.meta, TensorMeta) and x.meta.rank == 4)
    return keep


def _conv_regions(graph: Graph) -> list[tuple[str, int, int]]:
    """(name, input region, result region) of every convolution: the 4-D values joined by the ops
    between convolutions (which keep a layout) form a region, numbered by one of its values' ids."""
    parent: dict[int, int] = {}

    def find(i: int) -> int:
        while parent.setdefault(i, i) != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def four_d(vs) -> list[int]:
        return [v.id for v in vs if v is not None and isinstance(v.meta, TensorMeta) and v.meta.rank == 4]

    convs = []
    for node in graph.nodes:
        if node.op == CONV:
            convs.append((node.name, node.args[0].id, node.outputs[0].id))
            continue
        ids = four_d(node.inputs) + four_d(node.outputs)
        for i in ids[1:]:
            parent[find(i)] = find(ids[0])
    return [(name, find(a), find(b)) for name, a, b in convs]


def _islands(regions: list[tuple[str, int, int]], chosen: set[str]) -> set[str]:
    """Chosen convolutions that would run channels-last alone: no other chosen one reads from or writes
    into the regions of their input and their result (_conv_regions). Such a one converts its input to
    NHWC and hands an NHWC result to NCHW neighbours (a mixed-layout add reads one side strided):
    measured slower than NCHW on an H100 (conv-stack's last pointwise convolution: 0.290 against 0.264
    ms per step)."""
    touching: dict[int, int] = {}
    for name, a, b in regions:
        if name in chosen:
            for r in {a, b}:
                touching[r] = touching.get(r, 0) + 1
    return {name for name, a, b in regions if name in chosen and touching[a] == 1 and touching[b] == 1}


def channels_last_convs(graph: Graph) -> set[str]:
    """Names of the convolutions to run channels-last: the fp16/bf16 2-D ones, less those feeding a
    long- and narrow-grouped group norm, then less those left alone (_islands). Those stay in their
    input's layout: computing them NHWC and copying the result back to NCHW was measured slower still
    on an H100 (unet-r64 1.04 -> 1.21 ms, conv-stack 0.255 -> 0.452 ms: torch's transposing copies)."""
    mode = conv_layout_mode()
    if mode == "nchw":
        return set()
    chosen = {n.name for n in graph.nodes if runs_channels_last(n)}
    if mode == "nhwc":
        return chosen
    chosen -= _feeds_long_group_norm(graph)
    regions = _conv_regions(graph)
    while True:     # dropping one may leave a neighbour alone
        alone = _islands(regions, chosen)
        if not alone:
            return chosen
        chosen -= alone


def outputs_to_restore(graph: Graph, nhwc: set[str]) -> list:
    """The graph's 4-D floating-point outputs computed from a channels-last convolution's result (what
    may leave the plan channels-last), each once."""
    if not nhwc:
        return []
    tainted: set[int] = set()
    for node in graph.nodes:
        if node.name in nhwc or any(a.id in tainted for a in node.inputs):
            for v in node.outputs:
                if v is not None and isinstance(v.meta, TensorMeta) and v.meta.rank == 4:
                    tainted.add(v.id)
    out, seen = [], set()
    for v in graph.output_values():
        if v.id in tainted and v.id not in seen and v.producer is not None and v.meta.dtype.is_floating_point:
            seen.add(v.id)
            out.append(v)
    return out


def restore_layouts(graph: Graph, nhwc: set[str], clone) -> list[Launch]:
    """Launches run after the rest of a plan: each output that may be channels-last, copied to
    contiguous in its own slot by ``clone`` (the backend's ``aten.clone``)."""
    return [Launch.of(clone, "aten.clone", f"{v.name}_contiguous", (_bind(v),),
                      {"memory_format": torch.contiguous_format}, (v.slot,), False)
            for v in outputs_to_restore(graph, nhwc)]


class ConvLayouts:
    """A backend mixin: ``with_layouts(graph, lower_all)`` lowers a graph with the convolutions this
    module picks running channels-last (their Launch gets ``memory_format=torch.channels_last``, which
    library_ops.convolution takes) and the outputs restored after."""

    # The names of the convolutions running NHWC in the graph being lowered (empty outside it): the
    # scheduler reads them (backends/base.fused_launches).
    channels_last: frozenset = frozenset()

    def with_layouts(self, graph: Graph, lower_all) -> list[Launch]:
        self.channels_last = frozenset(channels_last_convs(graph))
        try:
            return lower_all() + restore_layouts(graph, self.channels_last, self.kernel("aten.clone"))
        finally:
            self.channels_last = frozenset()

    def lower(self, node: Node) -> Launch:
        launch = super().lower(node)
        if node.name in self.channels_last:
            launch.kwargs["memory_format"] = torch.channels_last
        return launch
