"""Which memory layout a graph's 2-D convolutions run in on CUDA, decided once per graph at lowering.

fp16/bf16 convolutions run channels-last (NHWC): cuDNN's tensor-core kernels take that layout, and
given NCHW tensors it converts them to it and back around every convolution (two extra passes over
the activations). Once one convolution runs NHWC its output is channels-last, and what reads it keeps
that layout without a copy: torch's pointwise kernels follow their input's layout, generated kernels
give their full-size outputs the layout of a full-size input and walk dims in the order of its strides
(kernels/fused.py), and the next convolution takes it as it is. The model's input is converted once, by
the first convolution. A graph output that may have come out channels-last is made contiguous at the
end of the plan (one copy), as eager gives it (torch.compile keeps eager's output strides the same way).

``OSTINATO_CONV_LAYOUT=nchw`` keeps every convolution in the layout its input comes in (the A/B
switch); it is part of the plan key.
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
    return "nchw" if mode == "nchw" else "auto"


def runs_channels_last(node: Node) -> bool:
    """A 2-D fp16/bf16 convolution (not transposed): the ones cuDNN runs fastest NHWC."""
    if node.op != CONV or len(node.args) < 9:
        return False
    x = node.args[0]
    meta = getattr(x, "meta", None)
    return (isinstance(meta, TensorMeta) and meta.rank == 4 and meta.dtype in HALF
            and node.args[6] is False)


def channels_last_convs(graph: Graph) -> set[str]:
    """Names of the convolution nodes to run channels-last."""
    if conv_layout_mode() == "nchw":
        return set()
    return {n.name for n in graph.nodes if runs_channels_last(n)}


def outputs_to_restore(graph: Graph, nhwc: set[str]) -> list:
    """The graph's 4-D floating-point outputs computed from a channels-last convolution's result (what
    may leave the plan channels-last), each once."""
    if not nhwc:
        return []
    tainted: set[int] = set()
    for node in graph.nodes:
        if node.name in nhwc or any(getattr(a, "id", None) in tainted for a in node.inputs):
            for v in node.outputs:
                if v is not None and isinstance(v.meta, TensorMeta) and v.meta.rank == 4:
                    tainted.add(v.id)
    out, seen = [], set()
    for v in graph.output_values():
        if v.id in tainted and v.id not in seen and v.producer is not None and v.meta.dtype.is_floating_point:
            seen.add(v.id)
            out.append(v)
    return out


def restore_layouts(graph: Graph, nhwc: set[str]) -> list[Launch]:
    """Launches run after the rest of a plan: each output that may be channels-last, copied to
    contiguous in its own slot."""
    clone = get_op("aten.clone").target
    return [Launch.of(getattr(clone, "_op", clone), "aten.clone", f"{v.name}_contiguous", (_bind(v),),
                      {"memory_format": torch.contiguous_format}, (v.slot,), False)
            for v in outputs_to_restore(graph, nhwc)]


class ConvLayouts:
    """A backend mixin: ``with_layouts(graph, lower_all)`` lowers a graph with the convolutions this
    module picks running channels-last (their Launch gets ``memory_format=torch.channels_last``, which
    library_ops.convolution takes) and the outputs restored after."""

    _nhwc: frozenset = frozenset()

    def with_layouts(self, graph: Graph, lower_all) -> list[Launch]:
        self._nhwc = frozenset(channels_last_convs(graph))
        try:
            return lower_all() + restore_layouts(graph, self._nhwc)
        finally:
            self._nhwc = frozenset()

    def lower(self, node: Node) -> Launch:
        launch = super().lower(node)
        if node.name in self._nhwc:
            launch.kwargs["memory_format"] = torch.channels_last
        return launch
