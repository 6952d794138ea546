"""Library ops through the op-level graph cache: each prepared choice gives the ATen op's result, is
made once per signature (hits after the first call), and the cache shows it in its counters. The
functions are device-agnostic torch, so they are checked on CPU tensors here and on CUDA by the op
table (tests/ops) on the GPU."""
from __future__ import annotations

import weakref

import torch

from ostinato.backends.cuda import library_ops as L
from ostinato.cache import op_graph_cache

aten = torch.ops.aten


def _close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_layout_flags():
    x = torch.randn(6, 4)
    assert L._layout(x) == "dense" and L._layout(x.t()) == "transposed"
    assert L._layout(x[:, ::2]) == "copy" and L._layout(torch.randn(1, 5)) == "dense"


def test_matmuls_match_aten_for_every_operand_layout():
    a, b = torch.randn(8, 6), torch.randn(6, 5)
    for aa in (a, a.t().contiguous().t(), torch.randn(8, 12)[:, ::2]):
        for bb in (b, b.t().contiguous().t(), torch.randn(6, 10)[:, ::2]):
            _close(L.mm(aa, bb), aten.mm(aa, bb))
            bias = torch.randn(5)
            _close(L.addmm(bias, aa, bb, beta=0.5, alpha=2.0), aten.addmm(bias, aa, bb, beta=0.5, alpha=2.0))
    x, w, bias = torch.randn(2, 3, 6), torch.randn(5, 6), torch.randn(5)
    _close(L.linear(x, w, bias), aten.linear(x, w, bias))
    _close(L.linear(x, w), aten.linear(x, w))


def test_linear_over_a_batch_of_transposed_matrices_copies_once():
    """[B, L, D] views of [B, D, L] tensors (Mamba's projections) are made dense first, so one GEMM runs
    instead of a batch of small transposed ones; views whose rows fold into one matrix are left alone."""
    w, bias = torch.randn(5, 6), torch.randn(5)
    x = torch.randn(4, 6, 3).transpose(1, 2)          # [4, 3, 6], each matrix column-major
    assert L._linear_plan(x, w).copy_a
    _close(L.linear(x, w, bias), aten.linear(x, w, bias))
    for fine in (torch.randn(4, 3, 6), torch.randn(1, 6, 3).transpose(1, 2), torch.randn(3, 6).t().contiguous().t(),
                 torch.randn(4, 3, 8)[:, :, :6]):     # dense, one matrix, 2-D transposed, padded rows that fold
        assert not L._linear_plan(fine, w).copy_a, fine.stride()
        _close(L.linear(fine, w, bias), aten.linear(fine, w, bias))


def test_bmm_with_a_broadcast_operand_folds_into_one_gemm(monkeypatch):
    a = torch.randn(4, 3, 6)
    b = torch.randn(6, 5).expand(4, 6, 5)
    plan = L._matmul_plan(a, b, True)
    assert plan.fold_batch
    calls = []
    monkeypatch.setattr(L, "aten", type("A", (), {"mm": staticmethod(lambda *x: calls.append("mm") or aten.mm(*x)),
                                                  "bmm": staticmethod(lambda *x: calls.append("bmm") or aten.bmm(*x))}))
    out = L.bmm(a, b)
    assert calls == ["mm"]
    _close(out, aten.bmm(a, b.contiguous()))
    c = torch.randn(4, 6, 5)
    assert not L._matmul_plan(a, c, True).fold_batch
    _close(L.bmm(a, c), aten.bmm(a, c))


def test_convolution_in_channels_last_keeps_the_prepared_weight():
    x = torch.randn(2, 4, 9, 9).contiguous(memory_format=torch.channels_last)
    w, bias = torch.randn(6, 4, 3, 3), torch.randn(6)
    args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    out = L.convolution(x, w, bias, *args)
    _close(out, aten.convolution(x.contiguous(), w, bias, *args))
    n = len(L.prepared_weights._items)
    L.convolution(x, w, bias, *args)
    assert len(L.prepared_weights._items) == n        # converted once
    w.add_(1.0)                                       # a new version of the weight is converted again
    _close(L.convolution(x, w, bias, *args), aten.convolution(x.contiguous(), w, bias, *args))
    plain = torch.randn(2, 4, 9, 9)
    assert L._conv_plan(plain, w, [1, 1], [1, 1], [1, 1], False, 1, None).memory_format is torch.contiguous_format
    _close(L.convolution(plain, w, None, *args), aten.convolution(plain, w, None, *args))


def test_prepared_weights_live_only_as_long_as_their_weight():
    """An entry is dropped with its weight, and never serves another tensor at a reused address (the
    bug: a freed model's converted weight given to a new model's conv of the same shape)."""
    w = torch.randn(6, 4, 3, 3)
    n = len(L.prepared_weights._items)
    got = L._prepared_weight(w, torch.channels_last)
    assert torch.equal(got, w) and got.is_contiguous(memory_format=torch.channels_last)
    assert len(L.prepared_weights._items) == n + 1
    del w, got
    assert len(L.prepared_weights._items) == n
    a, b = torch.randn(6, 4, 3, 3), torch.randn(6, 4, 3, 3)
    key = (b.data_ptr(), b._version, b.shape, b.stride(), b.dtype, b.get_device(), torch.channels_last)
    L.prepared_weights._items[key] = (weakref.ref(a), a.contiguous(memory_format=torch.channels_last))
    assert torch.equal(L._prepared_weight(b, torch.channels_last), b)      # a's entry at b's address: not used


def test_convolution_asked_for_channels_last_converts_its_input():
    x, w, bias = torch.randn(2, 4, 9, 9), torch.randn(6, 4, 3, 3), torch.randn(6)
    args = ([2, 1], [1, 0], [1, 1], False, [0, 0], 1)
    out = L.convolution(x, w, bias, *args, memory_format=torch.channels_last)
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    _close(out, aten.convolution(x, w, bias, *args))
    assert L._conv_plan(x, w, [2, 1], [1, 0], [1, 1], True, 1, torch.channels_last).memory_format is torch.contiguous_format   # transposed


def test_patch_embeddings_run_nhwc_as_one_matrix_product(monkeypatch):
    """A convolution over non-overlapping patches (kernel = stride, no padding: ViT's and DiT's patch
    embedding) run channels-last is one product over rows of patches, not cuDNN: the convolution's result
    and layout (NHWC or NCHW), with bias or without, square or not."""
    calls, real = [], L.patch_conv
    monkeypatch.setattr(L, "patch_conv", lambda *a: calls.append(a) or real(*a))
    for shape, w_shape, patch, bias in (((2, 4, 8, 8), (12, 4, 2, 2), [2, 2], True),
                                        ((1, 3, 12, 8), (5, 3, 4, 2), [4, 2], False),
                                        ((3, 3, 8, 8), (6, 3, 4, 4), [4, 4], True)):
        for fmt in (torch.channels_last, None):      # NHWC (the lowering's choice for fp16/bf16), NCHW
            x, w = torch.randn(shape), torch.randn(w_shape)
            b = torch.randn(w_shape[0]) if bias else None
            args = (patch, [0, 0], [1, 1], False, [0, 0], 1)
            n = len(calls)
            out = L.convolution(x, w, b, *args, memory_format=fmt)
            assert len(calls) == n + 1
            assert out.shape == (shape[0], w_shape[0], shape[2] // patch[0], shape[3] // patch[1])
            assert out.is_contiguous(memory_format=torch.channels_last if fmt else torch.contiguous_format)
            _close(out, aten.convolution(x, w, b, *args))
    x, w = torch.randn(2, 4, 9, 9), torch.randn(6, 4, 3, 3)
    for args in (([3, 3], [1, 1], [1, 1]), ([2, 2], [0, 0], [1, 1]), ([1, 1], [0, 0], [1, 1])):
        assert not L.is_patch_conv(x, w, *args, False, 1)     # padded, overlapping, or not patches
    assert L.is_patch_conv(x, w, [3, 3], [0, 0], [1, 1], False, 1) and not L.is_patch_conv(x, w, [3, 3], [0, 0],
                                                                                            [1, 1], True, 1)
    monkeypatch.setenv("OSTINATO_PATCH_GEMM", "0")           # the A/B switch: cuDNN's convolution again
    n = len(calls)
    x, w = torch.randn(2, 4, 8, 8), torch.randn(12, 4, 2, 2)
    _close(L.convolution(x, w, None, [2, 2], [0, 0], [1, 1], False, [0, 0], 1, memory_format=torch.channels_last),
           aten.convolution(x, w, None, [2, 2], [0, 0], [1, 1], False, [0, 0], 1))
    assert len(calls) == n


def test_topk_of_one_is_a_reduction_with_the_same_answer():
    x = torch.randn(5, 37)
    for largest in (True, False):
        for dim in (-1, 0):
            v, i = L.topk(x, 1, dim, largest)
            rv, ri = aten.topk(x, 1, dim, largest)
            _close(v, rv)
            assert torch.equal(i, ri)
        v, i = L.topk(x, 4, -1, largest)
        rv, ri = aten.topk(x, 4, -1, largest)
        _close(v, rv)
        assert torch.equal(i, ri)


def test_one_preparation_per_signature_then_hits():
    op_graph_cache.clear()
    before = op_graph_cache.stats()
    a, b = torch.randn(7, 3), torch.randn(3, 2)
    for _ in range(5):
        L.mm(a, b)
    L.mm(torch.randn(9, 3), b)          # another shape: another entry
    after = op_graph_cache.stats()
    assert after["misses"] - before["misses"] == 2
    assert after["hits"] - before["hits"] == 4
    assert after["entries"] == 2
    import ostinato
    assert ostinato.cache.stats()["op_graph"]["entries"] == 2


def test_outer_products_are_a_broadcast_multiply_bit_for_bit(monkeypatch):
    """A matmul over K = 1 (the rotary tables' ``inv_freq @ positions``, folded at compile) is one product
    per element: a broadcast multiply gives ATen's result exactly in each float dtype, and calls no
    GEMM (no cuBLAS set-up on the compile's path). fp32 under TF32 matmuls keeps the GEMM, whose inputs
    are rounded first; a K of 2 is a GEMM."""
    g = torch.Generator().manual_seed(3)
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        a, b = torch.randn(3, 17, 1, generator=g).to(dt), torch.randn(3, 1, 9, generator=g).to(dt)
        assert torch.equal(L.bmm(a, b), aten.bmm(a, b)), dt
        assert torch.equal(L.mm(a[0], b[0]), aten.mm(a[0], b[0])), dt
    calls = []
    real = aten.bmm
    monkeypatch.setattr(L, "aten", type("A", (), {"__getattr__": lambda self, n: getattr(aten, n),
                                                  "bmm": lambda self, *x: calls.append("bmm") or real(*x)})())
    a, b = torch.randn(2, 5, 1, generator=g), torch.randn(2, 1, 4, generator=g)
    L.bmm(a, b)
    assert calls == []
    L.bmm(torch.randn(2, 5, 2, generator=g), torch.randn(2, 2, 4, generator=g))
    assert calls == ["bmm"]
    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        L.bmm(a, b)
        assert calls == ["bmm", "bmm"]
        assert L.bmm(a.half(), b.half()).dtype == torch.float16 and calls == ["bmm", "bmm"]
    finally:
        torch.set_float32_matmul_precision(old)
