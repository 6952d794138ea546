"""Attention written out with a boolean mask applied by ``masked_fill`` or ``where``
(passes/patterns/eager_attention.py): which forms become one attention node, which stay, what the
attention gets as its mask, and that the program still equals eager on random inputs and masks."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import ostinato
from helpers import assert_same

B, HQ, HKV, D, S = 2, 4, 2, 8, 6
NEG_INF = float("-inf")


def repeat_kv(x, n_rep):     # transformers' form
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


class Masked(nn.Module):
    """q, k, v and a boolean mask ``m``; the scores masked as hand-written attention does:

    - ``form``: ``"fill_not"`` ``s.masked_fill(~m, fill)`` (m: True = visible); ``"fill"``
      ``s.masked_fill(m, fill)`` (m: True = hidden); ``"where"`` ``where(m, s, full([], fill))`` (GPT-2's old
      eager path); ``"where_scalar"`` ``where(m, s, fill)``;
    - ``fill``: a number, or ``"min"`` for ``finfo(s.dtype).min`` (what HF uses);
    - ``at``: ``"after"`` the scale, ``"before"`` it, ``"softcap"`` after a soft cap of 3, ``"under_cap"``
      before it;
    - ``gqa``: k and v through ``"repeat_kv"`` or ``"repeat_interleave"`` (else as many heads as q);
    - ``upcast``: ``softmax(s.float()).to(q.dtype)``, else a plain softmax.
    """

    def __init__(self, form="fill_not", fill=NEG_INF, at="after", gqa=None, upcast=True):
        super().__init__()
        self.form, self.fill, self.at, self.gqa, self.upcast = form, fill, at, gqa, upcast

    def mask(self, s, m):
        fill = torch.finfo(s.dtype).min if self.fill == "min" else self.fill
        if self.form == "fill_not":
            return s.masked_fill(~m, fill)
        if self.form == "fill":
            return s.masked_fill(m, fill)
        if self.form == "where":
            return torch.where(m, s, torch.full([], fill, dtype=s.dtype, device=s.device))
        return torch.where(m, s, fill)

    def forward(self, q, k, v, m):
        if self.gqa == "repeat_kv":
            k, v = repeat_kv(k, HQ // HKV), repeat_kv(v, HQ // HKV)
        elif self.gqa == "repeat_interleave":
            k, v = k.repeat_interleave(HQ // HKV, dim=1), v.repeat_interleave(HQ // HKV, dim=1)
        s = torch.matmul(q, k.transpose(-1, -2))
        if self.at == "before":
            s = self.mask(s, m)
        s = s / math.sqrt(D)
        if self.at == "under_cap":
            s = self.mask(s, m)
        if self.at in ("softcap", "under_cap"):
            s = torch.tanh(s / 3.0) * 3.0
        if self.at in ("after", "softcap"):
            s = self.mask(s, m)
        p = torch.softmax(s.float(), dim=-1).to(q.dtype) if self.upcast else torch.softmax(s, dim=-1)
        return torch.matmul(p, v)


def _inputs(seed, t=5, mask_shape=None, gqa=False, dtype=torch.float32, hidden=False):
    """q, k, v and a random boolean mask (``mask_shape``, default [B, 1, t, S]) in which every query sees
    at least one key; ``hidden``: the mask given means hidden (its negation)."""
    g = torch.Generator().manual_seed(seed)
    hk = HKV if gqa else HQ
    q = torch.randn(B, HQ, t, D, generator=g) * 2
    k, v = torch.randn(B, hk, S, D, generator=g), torch.randn(B, hk, S, D, generator=g)
    shape = mask_shape or (B, 1, t, S)
    visible = torch.rand(shape, generator=g) > 0.5
    visible[..., seed % S] = True
    return (q.to(dtype), k.to(dtype), v.to(dtype), ~visible if hidden else visible)


def _check(model, tol=1e-5, **kw):
    """The program exported on one set of inputs equals eager on two others (other masks); its ops."""
    prog = ostinato.export(model, _inputs(0, **kw))
    exe = ostinato.compile(prog, device="cpu")
    for seed in (1, 2):
        args = _inputs(seed, **kw)
        assert_same(exe(*args), model(*args), tol=tol)
    return prog


def _fused(prog):
    ops = prog.op_counts()
    return ops.get("ost.sdpa") == 1 and "aten.bmm" not in ops and "aten._softmax" not in ops


def _attention(prog):
    (node,) = [n for n in prog.graph.nodes if n.op == "ost.sdpa"]
    return node


@pytest.mark.parametrize("t", [1, 5])
@pytest.mark.parametrize("form, hidden", [("fill_not", False), ("fill", True), ("where", False),
                                          ("where_scalar", False)])
@pytest.mark.parametrize("fill", [NEG_INF, "min"])
def test_boolean_masks_become_one_attention(t, form, hidden, fill):
    prog = _check(Masked(form, fill), t=t, hidden=hidden)
    assert _fused(prog), prog.op_counts()
    mask = _attention(prog).args[3]
    if fill == NEG_INF:
        # the boolean mask, True = visible (fuse_sdpa converts it as any): ~m is read as m, no node made
        assert mask.producer.op == "aten.where.self"
        visible = mask.producer.args[0]
        assert visible.meta.dtype == torch.bool
        assert (visible.role == "input") == (form != "fill"), visible
        assert ("aten.bitwise_not" in prog.op_counts()) == (form == "fill")
    else:
        # finite: the additive where(m, fill, 0) / where(m, 0, fill) in the scores' dtype
        assert mask.meta.dtype == torch.float32 and mask.producer.op == "aten.where.self"
        assert mask.producer.args[0].role == "input" and "aten.bitwise_not" not in prog.op_counts()


@pytest.mark.parametrize("fill", [0.0, -5.0, -1e4, 1e30, float("inf"), -3e38])
@pytest.mark.parametrize("form", ["fill_not", "where"])
def test_fills_that_hide_nothing_stay(fill, form):
    """A fill above finfo.min is a value (-3e38 in fp32 too: finfo.min is -3.4e38), not a mask."""
    prog = _check(Masked(form, fill))
    ops = prog.op_counts()
    assert "ost.sdpa" not in ops and ops.get("aten.bmm") == 2 and ops.get("aten._softmax") == 1, ops


@pytest.mark.parametrize("shape", [(B, 1, 5, S), (1, 1, 5, S), (5, S), (B, HQ, 5, S), (1, S)])
def test_broadcast_masks(shape):
    prog = _check(Masked("fill_not"), mask_shape=shape)
    assert _fused(prog), prog.op_counts()


class AddedKeysMask(nn.Module):
    def forward(self, q, k, v, m):
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(D)
        return torch.matmul(torch.softmax(s + m, dim=-1), v)


@pytest.mark.parametrize("model", [Masked("fill_not"), AddedKeysMask()], ids=["boolean", "added"])
def test_masks_of_one_dim_stay(model):
    """torch's SDPA reads a mask's last two dims (a 1-D one fails there): a [S] mask keeps the written-out
    form, added (it crashed the program before) or boolean."""
    args = _inputs(0, mask_shape=(S,))
    if isinstance(model, AddedKeysMask):
        args = (*args[:3], torch.randn(S).masked_fill(~args[3], NEG_INF))
    prog = ostinato.export(model, args)
    assert "ost.sdpa" not in prog.op_counts() and prog.op_counts().get("aten.bmm") == 2, prog.op_counts()
    assert_same(ostinato.compile(prog, device="cpu")(*args), model(*args), tol=1e-5)


def test_mask_broadcasting_the_scores_larger_stays():
    """A mask of 3 query rows over one query's scores makes the result 3 rows: not an attention mask."""
    model = Masked("fill_not")
    args = _inputs(0, t=1, mask_shape=(B, 1, 3, S))
    prog = ostinato.export(model, args)
    assert "ost.sdpa" not in prog.op_counts() and prog.op_counts().get("aten.bmm") == 2
    assert_same(ostinato.compile(prog, device="cpu")(*args), model(*args), tol=1e-5)


@pytest.mark.parametrize("gqa", ["repeat_kv", "repeat_interleave"])
@pytest.mark.parametrize("fill", [NEG_INF, "min"])
def test_grouped_heads(gqa, fill):
    prog = _check(Masked("fill", fill, gqa=gqa), gqa=True, hidden=True)
    assert _fused(prog) and "aten.expand" not in prog.op_counts(), prog.op_counts()
    assert _attention(prog).args[6] == HQ // HKV       # n_rep: the heads' expansion went in


@pytest.mark.parametrize("t", [1, 5])
@pytest.mark.parametrize("form, hidden, fill", [("fill_not", False, NEG_INF), ("where", False, "min"),
                                                ("fill", True, "min"), ("where_scalar", False, NEG_INF)])
def test_bf16(t, form, hidden, fill):
    """The fused kernels keep the scores in fp32 where eager rounds them to bf16: 0.002-0.016 off, as for
    an added mask (tests/passes/test_eager_attention.py's forms)."""
    prog = _check(Masked(form, fill), tol=2e-2, t=t, dtype=torch.bfloat16, hidden=hidden)
    assert _fused(prog), prog.op_counts()
    assert _attention(prog).args[3].meta.dtype == torch.bfloat16


@pytest.mark.parametrize("fill, fused", [(NEG_INF, True), ("min", False)])
def test_mask_before_the_scale(fill, fused):
    """-inf / sqrt(D) is -inf: a mask. finfo.min / sqrt(D) is above finfo.min: a value (it hides keys in
    practice, but the rule is what the softmax sees), so nothing changes."""
    prog = _check(Masked("fill_not", fill, at="before"))
    assert _fused(prog) == fused, prog.op_counts()


@pytest.mark.parametrize("fill", [NEG_INF, "min"])
def test_after_the_softcap(fill):
    prog = _check(Masked("fill_not", fill, at="softcap"), t=1)
    assert _fused(prog) and "aten.tanh" not in prog.op_counts() and _attention(prog).args[8] == 3.0


def test_under_the_softcap_stays():
    """tanh(-inf / cap) * cap is -cap: the softmax sees a finite score, no mask."""
    prog = _check(Masked("fill_not", at="under_cap"), t=1)
    assert "ost.sdpa" not in prog.op_counts() and prog.op_counts().get("aten.bmm") == 2


def _no_visible_key(fill, dtype=torch.float32):
    """(eager, compiled) outputs where query 0 of batch 0 sees no key."""
    model = Masked("fill_not", fill)
    q, k, v, m = _inputs(3, dtype=dtype)
    m[0, 0, 0] = False
    prog = ostinato.export(model, (q, k, v, m))
    assert _fused(prog)
    return model(q, k, v, m), ostinato.compile(prog, device="cpu")(q, k, v, m)


def test_no_visible_key_with_neg_inf():
    """Eager gives NaN for that row; the attention 0 (torch's SDPA); every other row is eager's."""
    want, got = _no_visible_key(NEG_INF)
    assert want[0, :, 0].isnan().all() and (got[0, :, 0] == 0).all()
    want[0, :, 0] = 0
    assert_same(got, want, tol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_no_visible_key_with_finfo_min_keeps_uniform_weights(dtype):
    """finfo.min hides by value: eager's row is the mean of v, and stays so (an additive mask, not 0)."""
    want, got = _no_visible_key("min", dtype)
    v = _inputs(3, dtype=dtype)[2]
    assert_same(want[0, :, 0], v[0].float().mean(1).to(dtype), tol=1e-2)
    assert_same(got, want, tol=1e-5 if dtype == torch.float32 else 2e-2)


class Layers(nn.Module):
    """Two attentions over one boolean mask meaning hidden, masked_fill(m, fill) (other q, k and v the second
    time: CSE would merge the views of one k or v, which the pattern needs read by it alone)."""

    def __init__(self, fill):
        super().__init__()
        self.attention = Masked("fill", fill)

    def forward(self, q, k, v, m):
        return self.attention(q, k, v, m) + self.attention(q * 2, k * 2, v * 2, m)


@pytest.mark.parametrize("fill, made", [(NEG_INF, "aten.bitwise_not"), ("min", "aten.where.self")])
def test_masks_made_once_for_every_layer(fill, made):
    prog = _check(Layers(fill), hidden=True)
    ops = prog.op_counts()
    assert ops.get("ost.sdpa") == 2 and "aten.bmm" not in ops, ops
    assert ops.get(made) == 1, ops
    assert len({id(n.args[3]) for n in prog.graph.nodes if n.op == "ost.sdpa"}) == 1


class NotReadElsewhere(nn.Module):
    """``~m`` also returned: it stays for its other reader, the attention reads ``m``."""

    def forward(self, q, k, v, m):
        hidden = ~m
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(D)
        p = torch.softmax(s.masked_fill(hidden, NEG_INF), dim=-1)
        return torch.matmul(p, v), hidden


def test_negation_read_elsewhere_stays():
    prog = _check(NotReadElsewhere())
    assert _fused(prog) and prog.op_counts().get("aten.bitwise_not") == 1, prog.op_counts()


@pytest.mark.parametrize("padded", [False, True])
def test_gpt2_eager_attention_is_fused(padded):
    """GPT-2's eager attention (transformers 5: an added finfo.min mask, k transposed by one permute from
    [B, S, H, D] and copied by .contiguous()) becomes one attention a layer; left padding leaves query
    rows with no visible key, which keep eager's uniform weights."""
    transformers = pytest.importorskip("transformers")
    from helpers import export_and_compare
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, use_cache=False,
                                     attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(config).eval()
    assert model.config._attn_implementation == "eager"
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    kwargs = {"attention_mask": torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7])} if padded else {}
    prog, _ = export_and_compare(model, (ids,), kwargs, tol=1e-5)
    ops = prog.op_counts()
    assert ops.get("ost.sdpa") == 2 and "aten.bmm" not in ops and "aten._softmax" not in ops, ops
