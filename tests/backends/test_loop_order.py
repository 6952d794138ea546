"""The order generated kernels walk their dims in (backends/cuda/kernels/fused.py): the densest dim of
the operand that spans them innermost, so a channels-last tensor is walked coalesced."""
from __future__ import annotations

import math

import torch
from hypothesis import given, settings, strategies as st

from ostinato.backends.cuda.kernels.fused import _collapse, _loop_order


def _strides(t: torch.Tensor) -> list[int]:
    return [0 if n == 1 else s for n, s in zip(t.shape, t.stride())]


def test_channels_last_is_walked_channel_innermost():
    x = torch.empty(2, 8, 5, 6).contiguous(memory_format=torch.channels_last)
    bias = torch.empty(1, 8, 1, 1)
    order = _loop_order([0, 1, 2, 3], tuple(x.shape), [_strides(bias), _strides(x)])   # bias broadcasts: skipped
    assert order == [0, 2, 3, 1]
    sizes, strides = _collapse([x.shape[d] for d in order], [[_strides(x)[d] for d in order]])
    assert sizes == [2 * 5 * 6 * 8] and strides == [[1]]        # one dense run


def test_row_major_and_unspanned_orders_are_kept():
    x = torch.empty(3, 4, 5)
    assert _loop_order([0, 1, 2], (3, 4, 5), [_strides(x)]) == [0, 1, 2]
    assert _loop_order([0, 2], (3, 4, 5), [[0, 0, 1]]) == [0, 2]          # no candidate spans dim 0
    assert _loop_order([1, 2], (3, 1, 5), [[5, 0, 1]]) == [2, 1]          # a size-1 dim goes last, unwalked


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=4), st.randoms(use_true_random=False))
def test_any_permuted_layout_collapses_to_its_dense_run(sizes, rnd):
    """A tensor of any dim order: walked in the order chosen, its elements are visited at increasing,
    contiguous addresses."""
    perm = list(range(len(sizes)))
    rnd.shuffle(perm)
    t = torch.empty([sizes[p] for p in perm]).permute([perm.index(d) for d in range(len(sizes))])
    assert list(t.shape) == sizes
    order = _loop_order(list(range(len(sizes))), tuple(sizes), [_strides(t)])
    ws, wst = _collapse([sizes[d] for d in order], [[_strides(t)[d] for d in order]])
    assert math.prod(ws) == t.numel()
    assert len(ws) == 1 and wst[0][0] in (0, 1)

