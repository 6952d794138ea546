"""torch <-> MLX at the edges of a plan, and the session's state cells.

MLX 0.32 builds an array from host memory only by copying it (``mx.array`` has no adopting form on
any platform), so a call's inputs and the program's weights are copied once into MLX's allocator;
the other way is free: an evaluated array exposes its memory through the buffer protocol, and a
torch tensor is made over it with no copy (bfloat16, which NumPy lacks, travels as uint16 bits).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

import mlx.core as mx

TORCH_TO_MX = {
    torch.float32: mx.float32, torch.float16: mx.float16, torch.bfloat16: mx.bfloat16,
    torch.float64: mx.float64, torch.int64: mx.int64, torch.int32: mx.int32, torch.int16: mx.int16,
    torch.int8: mx.int8, torch.uint8: mx.uint8, torch.bool: mx.bool_, torch.complex64: mx.complex64,
    torch.uint16: mx.uint16, torch.uint32: mx.uint32, torch.uint64: mx.uint64,
}
MX_TO_TORCH = {v: k for k, v in TORCH_TO_MX.items()}


def mx_dtype(dtype: torch.dtype) -> Any:
    try:
        return TORCH_TO_MX[dtype]
    except KeyError:
        raise TypeError(f"MLX has no dtype for {dtype}") from None


def torch_dtype(dtype: Any) -> torch.dtype:
    return MX_TO_TORCH[dtype]


def to_mx(t: torch.Tensor, borrowed: bool = False) -> mx.array:
    """A copy of a CPU tensor as an MLX array (any strides; bf16 through its bits). ``borrowed``: the
    tensor is the caller's (a call's input), which must stay resizable: torch locks the storage of a
    tensor that NumPy (or DLPack) has seen, so a private copy is handed over instead."""
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.detach()
    if borrowed:
        t = t.clone()
    if t.dtype == torch.bfloat16:
        return mx.array(t.contiguous().view(torch.int16).numpy()).view(mx.bfloat16)
    if t.dtype not in TORCH_TO_MX:
        raise TypeError(f"MLX has no dtype for {t.dtype}")
    if t.dim() == 0:
        return mx.array(t.numpy().reshape(()), dtype=TORCH_TO_MX[t.dtype])
    return mx.array(t.contiguous().numpy())


def to_torch(a: mx.array) -> torch.Tensor:
    """A CPU tensor over an evaluated MLX array's memory (no copy; it keeps the array alive)."""
    bf16 = a.dtype == mx.bfloat16
    n = np.array(a.view(mx.uint16) if bf16 else a, copy=False)
    if any(s < 0 for s in n.strides):     # a reversed view (flip): torch takes no negative strides
        n = np.ascontiguousarray(n)
    t = torch.from_numpy(n)
    return t.view(torch.bfloat16) if bf16 else t


def host(x: Any) -> Any:
    """A plan value as the caller sees it: MLX arrays become tensors, everything else passes."""
    if type(x) is mx.array:
        return to_torch(x)
    if isinstance(x, MLXBuffer):
        return x.torch()
    return x


class MLXBuffer:
    """A session's state buffer on MLX. MLX arrays are values, never written in place, so the session
    holds one cell per buffer: a run reads ``array`` and stores the new array there. It answers the
    few tensor methods the runtime calls on state (``copy_``, ``clone``, ``shape``, ``dtype``).

    ``mirror``: a torch tensor every write is copied into as well (torch.compile's state: the model's
    own buffer, which the code around the graph reads)."""

    __slots__ = ("array", "mirror")

    def __init__(self, array: mx.array, mirror: torch.Tensor | None = None):
        self.array = array
        self.mirror = mirror

    def copy_(self, src: Any) -> "MLXBuffer":
        if isinstance(src, MLXBuffer):
            src = src.array
        new = src if type(src) is mx.array else to_mx(src, borrowed=True)
        if tuple(new.shape) != tuple(self.array.shape):
            new = mx.broadcast_to(new, self.array.shape)
        if new.dtype != self.array.dtype:
            new = new.astype(self.array.dtype)
        self.array = new
        if self.mirror is not None:
            mx.eval(new)
            self.mirror.copy_(to_torch(new))
        return self

    def clone(self) -> "MLXBuffer":
        return MLXBuffer(self.array)

    def torch(self) -> torch.Tensor:
        """The buffer's current value as a CPU tensor (over MLX's memory; no copy)."""
        mx.eval(self.array)
        return to_torch(self.array)

    @property
    def shape(self) -> torch.Size:
        return torch.Size(self.array.shape)

    @property
    def dtype(self) -> torch.dtype:
        return torch_dtype(self.array.dtype)

    def __repr__(self) -> str:
        return f"MLXBuffer({self.dtype}{list(self.shape)})"
