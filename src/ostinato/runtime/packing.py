"""Weights laid out for the ops that read several at once: the weights (and biases) of one
``ost.multi_linear`` are copied one after another into one buffer, and the executable's constants become
views into it, so the op runs one matmul over them (ir/fused_ops.multi_linear) with no second copy of
the weights in memory."""
from __future__ import annotations

import torch

from ..ir import Graph, Value
from ..ir.fused_ops import _packed_rows


def pack_sibling_weights(graph: Graph, template: list) -> int:
    """Pack each multi_linear's constants in ``template`` (the environment by slot); returns how many
    groups were packed. A constant is packed once; a group with one already packed is left as is."""
    packed: set[int] = set()
    count = 0
    for node in graph.nodes:
        if node.op != "ost.multi_linear":
            continue
        for vals in (node.args[1], node.args[2]):
            if not vals or not all(isinstance(v, Value) and v.role == "constant" for v in vals) \
                    or any(v.id in packed for v in vals):
                continue
            tensors = [template[v.slot] for v in vals]
            t0 = tensors[0]
            if not all(isinstance(t, torch.Tensor) and t.dtype == t0.dtype and t.device == t0.device
                       and t.shape[1:] == t0.shape[1:] for t in tensors):
                continue
            if _packed_rows(tensors) is not None:   # already laid out so (another method of the program packed them)
                packed.update(v.id for v in vals)
                continue
            buf = torch.cat([t.contiguous() for t in tensors], dim=0)
            start = 0
            for v, t in zip(vals, tensors):
                template[v.slot] = buf[start:start + t.shape[0]]
                start += t.shape[0]
            packed.update(v.id for v in vals)
            count += 1
    return count
