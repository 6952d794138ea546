"""Attention written out with biases added to the scores (passes/patterns/eager_attention.py): ALiBi per
head as a hand-written module adds it, and BLOOM's ``alibi.baddbmm(q, k^T)`` over [B*H]-flattened heads,
with a causal mask on top. Each becomes one attention whose mask is the sum of what was added; the
program equals eager on random inputs (fp32 1e-5; bf16 2e-2: the fused kernels keep the scores in fp32
where eager rounds them to bf16, as tests/passes/test_eager_attention_masks.py's test_bf16 says); forms
that would change the result stay."""
from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ostinato
from helpers import assert_same

B, H, D, S = 2, 4, 8, 6


def alibi_slopes(h: int) -> torch.Tensor:
    return torch.tensor([2 ** (-8 * (i + 1) / h) for i in range(h)])


class Alibi(nn.Module):
    """q [B, H, T, D], k and v [B, H, S, D], an additive mask [B, 1, T, S] (or a boolean one, True =
    visible, applied by ``masked_fill``); the ALiBi bias ``slope_h * j`` computed in the graph.

    - ``form``: ``"heads"`` adds it as [H, 1, S] to the [B, H, T, S] scores; ``"baddbmm"`` as BLOOM does, to
      the [B*H, T, S] scores of ``alibi.baddbmm(q, k^T, alpha=scale)``, then viewed as [B, H, T, S];
    - ``mask``: ``"add"``, ``"bool"`` or None;
    - ``scale_after``: the scale multiplies the biased scores (``(q k^T + alibi) * scale``: the bias is
      scaled, which an attention's mask is not).
    """

    def __init__(self, form="heads", mask="add", scale_after=False):
        super().__init__()
        self.form, self.mask, self.scale_after = form, mask, scale_after
        self.register_buffer("slopes", alibi_slopes(H))

    def forward(self, q, k, v, m=None):
        b, h, t, d = q.shape
        s_len = k.shape[-2]
        alibi = (self.slopes[:, None, None] * torch.arange(s_len, device=q.device)).to(q.dtype)     # [H, 1, S]
        if self.form == "baddbmm":
            alibi = alibi.repeat(b, 1, 1)       # [B*H, 1, S]
            s = alibi.baddbmm(q.reshape(b * h, t, d), k.reshape(b * h, s_len, d).transpose(-1, -2),
                              beta=1.0, alpha=d ** -0.5).view(b, h, t, s_len)
        elif self.scale_after:
            s = (torch.matmul(q, k.transpose(-1, -2)) + alibi) * d ** -0.5
        else:
            s = torch.matmul(q, k.transpose(-1, -2)) * d ** -0.5 + alibi
        if self.mask == "add":
            s = s + m
        elif self.mask == "bool":
            s = s.masked_fill(~m, torch.finfo(s.dtype).min)
        p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        if self.form == "baddbmm":
            return torch.bmm(p.view(b * h, t, s_len), v.reshape(b * h, s_len, d)).view(b, h, t, d)
        return torch.matmul(p, v)


def _inputs(seed, t, dtype, mask):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, t, D, generator=g) * 2
    k, v = torch.randn(B, H, S, D, generator=g), torch.randn(B, H, S, D, generator=g)
    extra = ()
    visible = torch.rand(B, 1, t, S, generator=g) > 0.4
    visible[..., seed % S] = True
    if mask == "add":
        extra = (torch.where(visible, 0.0, torch.finfo(dtype).min).to(dtype),)
    elif mask == "bool":
        extra = (visible,)
    return (q.to(dtype), k.to(dtype), v.to(dtype), *extra)


def _check(model, t, dtype=torch.float32, mask="add"):
    """The program (exported on one set of inputs) equals eager on two others; it."""
    prog = ostinato.export(model, _inputs(0, t, dtype, mask))
    exe = ostinato.compile(prog, device="cpu")
    for seed in (1, 2):
        args = _inputs(seed, t, dtype, mask)
        assert_same(exe(*args), model(*args), tol=1e-5 if dtype == torch.float32 else 2e-2)
    return prog


def _attention(prog):
    ops = prog.op_counts()
    assert ops.get("ost.sdpa") == 1 and "aten.bmm" not in ops and "aten._softmax" not in ops, ops
    (node,) = [n for n in prog.graph.nodes if n.op == "ost.sdpa"]
    return node


@pytest.mark.parametrize("t", [1, 5])
@pytest.mark.parametrize("form", ["heads", "baddbmm"])
@pytest.mark.parametrize("mask", ["add", "bool", None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_alibi_becomes_one_attention(t, form, mask, dtype):
    node = _attention(_check(Alibi(form, mask), t, dtype, mask))
    q, _, _, m = node.args[:4]
    assert q.meta.dtype == dtype and m.meta.dtype == dtype, node
    # the bias as [.., H, .., S] (BLOOM's [B*H, 1, S] viewed as [B, H, 1, S]), with the mask added to it
    assert m.meta.rank >= 3 and m.meta.shape[-3] == H and m.meta.shape[-1] == S, m.meta.shape
    if mask or form == "baddbmm":     # a sum (BLOOM's bias alone: its [B, H, 1, S] view)
        assert m.producer.op == ("aten.add.Tensor" if mask else "aten.view"), m.producer


def test_biased_attention_values_are_the_eager_form():
    """The attention's result with the summed mask equals eager's (fp32: equal to rounding) and differs
    from the same attention without the bias (the bias is not dropped)."""
    model = Alibi("baddbmm", "add")
    args = _inputs(3, 1, torch.float32, "add")
    prog = ostinato.export(model, args)
    _attention(prog)
    got = ostinato.compile(prog, device="cpu")(*args)
    assert_same(got, model(*args), tol=1e-5)
    plain = model.slopes.clone()
    model.slopes.zero_()
    assert not torch.allclose(got, model(*args), atol=1e-3)
    model.slopes.copy_(plain)


def test_layers_share_one_summed_mask():
    """Two attentions adding the same bias and mask read one sum, made once."""
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = Alibi("baddbmm", "add")

        def forward(self, q, k, v, m):     # (the second with its own k and v, as a layer has)
            return self.a(self.a(q, k, v, m) * 2, k + 1, v - 1, m)

    args = _inputs(4, 1, torch.bfloat16, "add")
    prog = ostinato.export(Two(), args)
    ops = prog.op_counts()
    assert ops.get("ost.sdpa") == 2 and "aten.bmm" not in ops, ops
    masks = {n.args[3].id for n in prog.graph.nodes if n.op == "ost.sdpa"}
    assert len(masks) == 1, masks
    assert_same(ostinato.compile(prog, device="cpu")(*args), Two()(*args), tol=2e-2)


class Kept(nn.Module):
    """Biased forms the attention would compute differently: ``"fp32_bias"`` an fp32 bias added to bf16
    scores made fp32 (eager keeps the bias unrounded; an attention's mask is in q's dtype); ``"wide"`` a
    bias with more query rows than q, which broadcasts the scores larger."""

    def __init__(self, form):
        super().__init__()
        self.form = form

    def forward(self, q, k, v, bias):
        s = torch.matmul(q, k.transpose(-1, -2)) * D ** -0.5
        s = s.float() + bias if self.form == "fp32_bias" else s + bias
        return torch.matmul(F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype), v)


@pytest.mark.parametrize("form", ["scale_after", "fp32_bias", "wide"])
def test_biased_forms_sdpa_would_change_stay(form):
    dtype = torch.bfloat16 if form == "fp32_bias" else torch.float32
    q, k, v, m = _inputs(5, 1, dtype, "add")
    if form == "scale_after":
        model, args = Alibi("heads", "add", scale_after=True), (q, k, v, m)
    else:
        bias = torch.randn(1, H, 3 if form == "wide" else 1, S) * 4
        model, args = Kept(form), (q, k, v, bias.to(torch.float32 if form == "fp32_bias" else dtype))
    prog = ostinato.export(model, args)
    assert "ost.sdpa" not in prog.op_counts(), prog.op_counts()
    assert_same(ostinato.compile(prog, device="cpu")(*args), model(*args), tol=1e-5 if dtype == torch.float32 else 2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bloom_decode_attention_is_one_sdpa(dtype):
    """transformers' BLOOM (eager attention: its only one), decode steps over a static cache: one ost.sdpa
    per layer, no bmm left, logits equal eager's (fp32 within 1e-4, the census' bound; bf16 1e-2)."""
    transformers = pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache
    torch.manual_seed(0)
    config = transformers.BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=128, pad_token_id=0,
                                      bos_token_id=1, eos_token_id=2)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.uniform_(-0.5, 0.5) if name.endswith("bias") else p.uniform_(0.5, 1.5)
    model = model.to(dtype)
    model.generation_config = GenerationConfig(use_cache=True, cache_implementation="static")
    wrapper = TorchExportableModuleWithStaticCache(model, batch_size=2, max_cache_len=16).eval()
    ref = copy.deepcopy(wrapper)
    gen = torch.Generator().manual_seed(1)
    steps = [{"input_ids": torch.randint(0, 128, (2, 1), generator=gen), "cache_position": torch.tensor([pos])}
             for pos in range(4)]
    prog = ostinato.export(wrapper, (), steps[0], trace_strict=True)
    ops = prog.op_counts()
    assert ops.get("ost.sdpa") == 2 and "aten.bmm" not in ops and "aten._softmax" not in ops, ops
    exe = ostinato.compile(prog, device="cpu")
    for i, kwargs in enumerate(steps):
        with torch.no_grad():
            expected = ref(**kwargs)
        got = exe(**kwargs)
        assert_same(got[0] if isinstance(got, (tuple, list)) else got, expected,
                    tol=1e-4 if dtype == torch.float32 else 1e-2, msg=f"step {i}")
    assert math.isfinite(float(expected.float().abs().max()))


class MultiQuery(nn.Module):
    """Falcon-7B's eager attention: one KV head that the matmuls broadcast over every query head
    (``q @ k.transpose(-1, -2)`` with k [B, 1, S, D]: an expand to H heads, copied where a batch > 1 cannot
    be viewed flat), an additive mask, softmax, ``@ v`` broadcast the same way."""

    def forward(self, q, k, v, mask):
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        return F.softmax(scores + mask, dim=-1, dtype=q.dtype) @ v


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_kv_head_broadcast_becomes_one_attention(batch, dtype):
    g = torch.Generator().manual_seed(batch)
    q = torch.randn(batch, H, 1, D, generator=g).to(dtype)
    k, v = (torch.randn(batch, 1, S, D, generator=g).to(dtype) for _ in range(2))
    mask = torch.zeros(batch, 1, 1, S, dtype=dtype)
    mask[..., S - 2:] = torch.finfo(dtype).min
    model = MultiQuery()
    prog = ostinato.export(model, (q, k, v, mask))
    ops = prog.op_counts()
    assert ops.get("ost.sdpa") == 1 and "aten.bmm" not in ops and "aten.expand" not in ops, ops
    att = next(n for n in prog.graph.nodes if n.op == "ost.sdpa")
    assert tuple(att.args[1].meta.shape) == (batch, 1, S, D)        # the cache's one head, not a copy
    exe = ostinato.compile(prog)
    for seed in range(2):
        g = torch.Generator().manual_seed(10 + seed)
        args = (torch.randn(batch, H, 1, D, generator=g).to(dtype),
                *(torch.randn(batch, 1, S, D, generator=g).to(dtype) for _ in range(2)), mask)
        with torch.no_grad():
            assert_same(exe(*args), model(*args), tol=2e-2 if dtype == torch.bfloat16 else None)


class UpcastScores(nn.Module):
    """GPT-J's eager attention: q and k cast to fp32 before the matmul (the scores in fp32), scaled, the
    model's bf16 additive mask added (promoted exactly), fp32 softmax cast back, ``@ v`` in bf16."""

    def forward(self, q, k, v, mask):
        scores = torch.matmul(q.to(torch.float32), k.to(torch.float32).transpose(-1, -2)) / math.sqrt(q.shape[-1])
        return F.softmax(scores + mask, dim=-1).to(v.dtype) @ v


@pytest.mark.parametrize("t", [1, 5])
def test_fp32_scores_of_bf16_q_and_k_become_one_attention(t):
    g = torch.Generator().manual_seed(t)
    dtype = torch.bfloat16
    q = torch.randn(B, H, t, D, generator=g).to(dtype)
    k, v = (torch.randn(B, H, S, D, generator=g).to(dtype) for _ in range(2))
    mask = torch.zeros(B, 1, t, S, dtype=dtype)
    mask[..., :2] = torch.finfo(dtype).min
    model = UpcastScores()
    prog = ostinato.export(model, (q, k, v, mask))
    ops = prog.op_counts()
    assert ops.get("ost.sdpa") == 1 and "aten.bmm" not in ops and "aten._to_copy" not in ops, ops
    att = next(n for n in prog.graph.nodes if n.op == "ost.sdpa")
    assert att.args[0].meta.dtype == dtype and att.args[1].meta.dtype == dtype
    exe = ostinato.compile(prog)
    for seed in range(2):
        g = torch.Generator().manual_seed(20 + seed)
        args = (torch.randn(B, H, t, D, generator=g).to(dtype),
                *(torch.randn(B, H, S, D, generator=g).to(dtype) for _ in range(2)), mask)
        with torch.no_grad():
            assert_same(exe(*args), model(*args), tol=2e-2)


def test_an_fp32_mask_on_fp32_scores_of_bf16_q_and_k_stays():
    """The mask in fp32 (not a bf16 value upcast): the attention's mask would be rounded to bf16."""
    dtype = torch.bfloat16
    q = torch.randn(B, H, 1, D).to(dtype)
    k, v = (torch.randn(B, H, S, D).to(dtype) for _ in range(2))
    mask = torch.randn(B, 1, 1, S) / 3       # fp32 values bf16 cannot hold
    prog = ostinato.export(UpcastScores(), (q, k, v, mask))
    assert "ost.sdpa" not in prog.op_counts()
    with torch.no_grad():
        assert_same(ostinato.compile(prog)(q, k, v, mask), UpcastScores()(q, k, v, mask), tol=1e-2)


class UpcastScoresTwoBiases(nn.Module):
    """UpcastScores with two bf16 biases added to the fp32 scores: eager adds them in fp32, exactly."""

    def forward(self, q, k, v, b1, b2):
        scores = torch.matmul(q.to(torch.float32), k.to(torch.float32).transpose(-1, -2)) / math.sqrt(q.shape[-1])
        return F.softmax(scores + b1 + b2, dim=-1).to(v.dtype) @ v


def test_two_biases_on_fp32_scores_of_bf16_q_and_k_are_not_summed_in_bf16():
    """A bias of 64 everywhere (softmax ignores it) and a fine one: their sum in bf16 (ulp 0.5 at 64) would
    lose the fine one's detail, which eager's fp32 adds keep (the fused attention was 0.16 off eager)."""
    dtype = torch.bfloat16
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, 5, D, generator=g).to(dtype)
    k, v = (torch.randn(B, H, S, D, generator=g).to(dtype) for _ in range(2))
    b1 = torch.full((B, 1, 5, S), 64.0, dtype=dtype)
    b2 = torch.randn(B, 1, 5, S, generator=g).to(dtype)
    model = UpcastScoresTwoBiases()
    prog = ostinato.export(model, (q, k, v, b1, b2))
    with torch.no_grad():
        assert_same(ostinato.compile(prog)(q, k, v, b1, b2), model(q, k, v, b1, b2), tol=2e-2)
