"""``aten.view`` where a kernel returned another memory layout than the one torch.export saw."""
from __future__ import annotations

import torch

from ostinato.backends.cpu.backend import CPUBackend, view_or_reshape


def test_view_aliases_where_the_strides_allow_it():
    x = torch.randn(2, 3, 4)
    y = view_or_reshape(x, [6, 4])
    assert y.data_ptr() == x.data_ptr() and torch.equal(y, x.reshape(6, 4))


def test_a_layout_with_no_view_gets_a_copy_with_the_view_s_values():
    # [B, H, T, D] row-major, transposed to [B, T, H, D]: flattening (H, D) has no view.
    torch.manual_seed(0)
    a = torch.randn(2, 3, 5, 4)
    t = a.transpose(1, 2)
    try:
        t.view(2, 5, 12)
        raise AssertionError("expected this layout to have no view")
    except RuntimeError:
        pass
    got = view_or_reshape(t, [2, 5, 12])
    assert torch.equal(got, t.contiguous().view(2, 5, 12))


def test_backends_run_aten_view_through_it():
    assert CPUBackend().kernel("aten.view") is view_or_reshape
