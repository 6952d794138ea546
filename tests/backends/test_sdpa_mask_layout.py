"""The attention mask ost.sdpa hands torch on CUDA (backends/cuda/kernels/attention.py): a unit stride on
its last dim, which torch's fused kernels require (else they fall back to the math path), with the same
values and broadcast dims left broadcast. Checked on CPU tensors: the conversion is plain torch."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from ostinato.backends.cuda.kernels.attention import _dense_last


def test_bidirectional_traced_mask():
    """transformers' traced mask: [B, 1, T, T] with strides (0, T, 1, 0)."""
    m = (torch.arange(7)[None, None, :, None] >= 2).expand(4, 1, 7, 7)
    out = _dense_last(m)
    assert out.stride(-1) == 1 and out.stride(0) == 0 and out.shape == m.shape
    assert torch.equal(out, m)
    assert out.untyped_storage().nbytes() == 7 * 7     # the distinct values only, not the batch


def test_permuted_bias_is_copied_dense():
    """T5's position bias: an embedding [T, T, H] permuted to [1, H, T, T] (last stride H)."""
    bias = torch.randn(6, 6, 3).permute(2, 0, 1)[None]
    out = _dense_last(bias)
    assert out.stride(-1) == 1 and torch.equal(out, bias)


def test_ready_masks_are_untouched():
    for m in (None, torch.randn(2, 1, 5, 5), torch.ones(3, 1, 1, 5, dtype=torch.bool).expand(3, 2, 5, 5),
              torch.randn(2, 1, 5, 1).expand(2, 1, 5, 1)):
        assert _dense_last(m) is m


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=2, max_size=4), perm_seed=st.integers(0, 1000),
       broadcast=st.lists(st.booleans(), min_size=4, max_size=4), as_bool=st.booleans())
def test_any_layout(shape, perm_seed, broadcast, as_bool):
    gen = torch.Generator().manual_seed(perm_seed)
    base = torch.randn(*shape, generator=gen)
    if as_bool:
        base = base > 0
    perm = torch.randperm(len(shape), generator=gen).tolist()
    t = base.permute(perm)
    # broadcast some dims of size 1 in a slice of t
    idx = tuple(slice(0, 1) if b else slice(None) for b, _ in zip(broadcast, t.shape))
    t = t[idx].expand(t.shape)
    out = _dense_last(t)
    assert torch.equal(out, t) and out.shape == t.shape
    assert out.stride(-1) == 1 or out.shape[-1] == 1
    for d in range(t.dim() - 1):
        if t.stride(d) == 0:
            assert out.stride(d) == 0, (d, t.stride(), out.stride())


def test_small_attention_runs_torch_sdpa_without_cudnn(monkeypatch):
    """ost.sdpa's torch path leaves cuDNN's attention out (its first call sets cuDNN up) only where flash
    attention takes the call and it is small: DiT- and ViT-sized attention in bf16, no mask, as many KV heads
    as query heads. A long encoder's, a masked one's, a grouped-query one's and an fp32 one's keep torch's
    choice (without cuDNN those can fall to the math kernel); OSTINATO_CUDNN_ATTENTION=0 leaves it out
    everywhere. The same result either way, and the flags restored after."""
    from ostinato.backends.cuda.kernels import attention as A
    chosen = []
    real = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **kw: chosen.append(torch.backends.cuda.cudnn_sdp_enabled()) or real(*a, **kw))

    def run(shape_q, keys, dtype=torch.bfloat16, kv_heads=None, masked=False):
        q = torch.randn(shape_q).to(dtype)
        kv_shape = (*shape_q[:-3], kv_heads or shape_q[-3], keys, shape_q[-1])
        k, v = torch.randn(kv_shape).to(dtype), torch.randn(kv_shape).to(dtype)
        mask = torch.randn(1, 1, shape_q[-2], keys).to(dtype) if masked else None
        n_rep = shape_q[-3] // (kv_heads or shape_q[-3])
        got = A.sdpa(q, k, v, mask, n_rep=n_rep)
        torch.testing.assert_close(got, real(q, k, v, attn_mask=mask, enable_gqa=n_rep > 1))
        return chosen[-1]

    before = torch.backends.cuda.cudnn_sdp_enabled()
    assert before, "torch's default has cuDNN's attention on"
    assert run((2, 12, 256, 64), 256) is False                       # DiT-B/2's 1.6M scores
    assert torch.backends.cuda.cudnn_sdp_enabled() is True             # the context restored the flags
    assert run((1, 8, 1500, 8), 1500) is True                          # Whisper-base's 18M
    assert run((1, 8, 64, 16), 96, kv_heads=2, masked=True) is True    # a short grouped-query prefill
    assert run((1, 4, 64, 16), 96, masked=True) is True                # masked
    assert run((2, 12, 256, 64), 256, dtype=torch.float32) is True     # fp32: no flash attention
    monkeypatch.setenv("OSTINATO_CUDNN_ATTENTION", "0")
    assert run((1, 8, 1500, 8), 1500) is False
