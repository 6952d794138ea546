"""CPU backend: every op runs with torch's CPU kernels; fused ops through their reference code."""
from __future__ import annotations

import torch

from ...ir import Node, get_op
from ..base import Backend, Launch


def returns_sequence(op_name: str) -> bool:
    """Whether an op's result is a tuple or list the Launch must unpack."""
    target = get_op(op_name).target
    schema = getattr(target, "_schema", None)
    if schema is None:
        return getattr(target, "multi_output", False)
    rets = schema.returns
    return len(rets) != 1 or isinstance(rets[0].type, torch.ListType)


def view_or_reshape(x: torch.Tensor, shape) -> torch.Tensor:
    """``aten.view``, or a copy (``reshape``) where ``x``'s strides allow no view. A kernel may return
    another memory layout than the one torch.export saw: CUDA's SDPA math path gives [B, H, T, D]
    row-major where export's efficient-attention kernel gave [B, T, H, D] underneath, and the
    ``transpose(1, 2).view(B, T, H * D)`` after it has no view then. Values in the graph are
    functional, so the copy holds what the view would; state buffers are dense and always view."""
    try:
        return x.view(shape)
    except RuntimeError:
        return x.reshape(shape)


class CPUBackend(Backend):
    name = "cpu"

    def __init__(self, device: torch.device | None = None):
        super().__init__(torch.device("cpu") if device is None else device)

    def lower(self, node: Node) -> Launch:
        _, kwargs = self.op_and_kwargs(node)
        return Launch(self.kernel(node.op), node, node.args, kwargs, returns_sequence(node.op))

    def kernel(self, op: str):
        if op == "aten.view":
            return view_or_reshape
        target = get_op(op).target
        # An OpOverload's __call__ only forwards to its C++ operator; calling that directly saves a
        # Python frame per launch.
        return getattr(target, "_op", target)
