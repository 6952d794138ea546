"""Helpers shared by the Triton kernels' launchers."""
from __future__ import annotations

import torch

MAX_BLOCK = 1 << 16   # one program holds a whole row; rows longer than this are not for these kernels
# query rows up to which ost.sdpa runs the Triton attention kernel (a decode step, a short prompt); torch's SDPA
# past it (kernels/attention.py: _rows_plan)
SHORT_QUERIES = 32


def block_for(n: int) -> int:
    """The power-of-two block that holds ``n`` elements."""
    block = pow2(n)
    if block > MAX_BLOCK:
        raise ValueError(f"a row of {n} elements is longer than these kernels handle ({MAX_BLOCK})")
    return block


def pow2(n: int) -> int:
    """The smallest power of two at least ``n`` (1 for n <= 1)."""
    return 1 << (max(int(n), 1) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def rows_of(x: torch.Tensor) -> tuple[int, int]:
    """(rows, row length) of a contiguous tensor seen as [rows, last dim]."""
    n = x.shape[-1] if x.dim() else 1
    return (x.numel() // n if n else 0), n
