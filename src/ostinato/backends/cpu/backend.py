"""CPU backend: every op runs with torch's CPU kernels; fused ops through their reference code."""
from __future__ import annotations

import torch
from torch._prims_common import suggest_memory_format

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


def native_group_norm(x: torch.Tensor, *args):
    """``aten.native_group_norm`` on an input made dense in its suggested memory format first, as
    ``aten.group_norm`` does before calling it. torch.export's decomposition drops that call where it
    was a no-op at the traced sizes, so at another size (a dynamic batch of 1 after a transposed
    attention output, diffusers' UNet) the CPU kernel would refuse the strides it gets."""
    return torch.ops.aten.native_group_norm(x.contiguous(memory_format=suggest_memory_format(x)), *args)


_OWN = {"aten.view": view_or_reshape, "aten.native_group_norm": native_group_norm}


class CPUBackend(Backend):
    name = "cpu"

    def __init__(self, device: torch.device | None = None):
        super().__init__(torch.device("cpu") if device is None else device)

    def lower(self, node: Node) -> Launch:
        _, kwargs = self.op_and_kwargs(node)
        return Launch(self.kernel(node.op), node, node.args, kwargs, returns_sequence(node.op))

    def kernel(self, op: str):
        own = _OWN.get(op)
        if own is not None:
            return own
        target = get_op(op).target
        # An OpOverload's __call__ only forwards to its C++ operator; calling that directly saves a
        # Python frame per launch.
        return getattr(target, "_op", target)
