"""Attention written out eagerly (passes/patterns/eager_attention.py): which forms become one attention
node, which stay, and that the program still equals eager on random inputs."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ostinato
from helpers import assert_same

B, HQ, HKV, D = 2, 4, 2, 8


def repeat_kv(x, n_rep):     # transformers' form
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


class Eager(nn.Module):
    """q, k, v given; attention as a model writes it out:

    - ``scale``: ``* scale`` (``div``: ``/ sqrt(d)`` instead);
    - ``softcap``: Gemma 2's ``tanh(s / cap) * cap``;
    - ``mask``: an additive mask input added to the scores;
    - ``gqa``: k and v through HF's repeat_kv;
    - ``leak``: the scores are also returned (read outside the chain: nothing may change);
    - ``upcast``: ``softmax(dtype=float32).to(q.dtype)`` (else a plain softmax).
    """

    def __init__(self, softcap=None, mask=False, gqa=False, leak=False, div=False, upcast=True):
        super().__init__()
        self.softcap, self.mask, self.gqa, self.leak, self.div, self.upcast = softcap, mask, gqa, leak, div, upcast

    def forward(self, q, k, v, mask=None):
        if self.gqa:
            k, v = repeat_kv(k, HQ // HKV), repeat_kv(v, HQ // HKV)
        s = torch.matmul(q, k.transpose(2, 3))
        s = s / math.sqrt(D) if self.div else s * D ** -0.5
        if self.softcap is not None:
            s = torch.tanh(s / self.softcap) * self.softcap
        if mask is not None:
            s = s + mask
        p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype) if self.upcast else F.softmax(s, dim=-1)
        out = torch.matmul(p, v)
        return (out, s) if self.leak else out


def _inputs(t: int, gqa: bool, mask: bool, s: int = 6):
    g = torch.Generator().manual_seed(t * 10 + s)
    hk = HKV if gqa else HQ
    q = torch.randn(B, HQ, t, D, generator=g) * 2
    k, v = torch.randn(B, hk, s, D, generator=g), torch.randn(B, hk, s, D, generator=g)
    extra = ()
    if mask:
        m = torch.randn(B, 1, t, s, generator=g)
        m[..., 0] = float("-inf")       # one key hidden from every query
        extra = (m,)
    return (q, k, v, *extra)


def _run(model, t, gqa=False, mask=False):
    args = _inputs(t, gqa, mask)
    prog = ostinato.export(model, args)
    exe = ostinato.compile(prog, device="cpu")
    for seed in (1, 2):
        more = _inputs(t, gqa, mask, s=6)
        more = tuple(x + 0.1 * seed * torch.randn_like(x) if x.dtype.is_floating_point and torch.isfinite(x).all()
                     else x for x in more)
        assert_same(exe(*more), model(*more), tol=1e-5)
    return prog.op_counts()


@pytest.mark.parametrize("t", [1, 5])
@pytest.mark.parametrize("gqa, mask, div, upcast", [(False, False, False, True), (True, True, True, True),
                                                    (True, False, False, False)])
def test_written_out_attention_becomes_sdpa(t, gqa, mask, div, upcast):
    ops = _run(Eager(mask=mask, gqa=gqa, div=div, upcast=upcast), t, gqa, mask)
    assert ops.get("ost.sdpa") == 1 and "aten.bmm" not in ops and "aten._softmax" not in ops, ops
    assert "aten.expand" not in ops, ops     # the heads' expansion went into the attention (n_rep)


@pytest.mark.parametrize("mask", [False, True])
def test_softcap_decode_becomes_sdpa_with_the_cap(mask):
    ops = _run(Eager(softcap=3.0, mask=mask, gqa=True), 1, True, mask)
    assert ops.get("ost.sdpa") == 1 and "aten.tanh" not in ops and "aten.bmm" not in ops, ops


def test_softcap_prefill_keeps_its_form():
    """No fused kernel takes a soft cap over several queries: the written-out form stays."""
    ops = _run(Eager(softcap=3.0, mask=True), 5, False, True)
    assert "ost.sdpa" not in ops and ops.get("aten.bmm") == 2 and ops.get("aten.tanh") == 1, ops


def test_scores_read_elsewhere_stay():
    args = _inputs(1, False, False)
    model = Eager(leak=True)
    prog = ostinato.export(model, args)
    ops = prog.op_counts()
    assert "ost.sdpa" not in ops and ops.get("aten.bmm") == 2, ops
    assert_same(ostinato.compile(prog, device="cpu")(*args), model(*args), tol=1e-5)


def test_softcap_values_match_on_the_reference():
    """ost.sdpa's reference with a soft cap is the eager form (fp32 here: equal to rounding)."""
    from ostinato.ir.fused_ops import sdpa
    q, k, v, m = _inputs(1, True, True)
    want = Eager(softcap=2.0, gqa=True)(q, k, v, m)
    got = sdpa(q, k, v, m, None, D ** -0.5, HQ // HKV, False, 2.0)
    assert_same(got, want, tol=1e-6)
    assert not torch.allclose(got, Eager(gqa=True)(q, k, v, m), atol=1e-3)     # the cap changes the result


class Odd(nn.Module):
    """Forms that must keep their written-out attention (each would change the result as SDPA):
    ``bool``: a boolean tensor added to the scores (adds 1.0 where True, not a visibility mask);
    ``wide``: a mask with more query rows than q, which broadcasts the scores larger;
    ``heads_last``: the output viewed as [B, T, H, D] straight from the [B*H, T, D] product."""

    def __init__(self, form: str):
        super().__init__()
        self.form = form

    def forward(self, q, k, v, m):
        s = torch.matmul(q, k.transpose(2, 3)) * D ** -0.5
        s = s + (m > 0) if self.form == "bool" else s + m
        p = F.softmax(s, dim=-1)
        if self.form == "heads_last":
            b, h, t, _ = q.shape
            return torch.bmm(p.view(b * h, t, -1), v.reshape(b * h, -1, D)).view(b, t, h, D)
        return torch.matmul(p, v)


@pytest.mark.parametrize("form", ["bool", "wide", "heads_last"])
def test_forms_sdpa_would_change_stay(form):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, HQ, n, D, generator=g) for n in (3 if form == "heads_last" else 1, 6, 6))
    m = torch.randn(B, 1, 3 if form == "wide" else 1, 6, generator=g)
    model = Odd(form)
    prog = ostinato.export(model, (q, k, v, m))
    assert "ost.sdpa" not in prog.op_counts(), prog.op_counts()
    assert_same(ostinato.compile(prog, device="cpu")(q, k, v, m), model(q, k, v, m), tol=1e-5)
