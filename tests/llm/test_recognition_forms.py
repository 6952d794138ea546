"""Issue #18's recognition clause, on decoders written the ways users write them: the KV cache written by
``index_copy_`` (dim 2 of [B, H, S, D]), ``index_put_`` (dim 0 of [S, H, D]) or slice assignment (dim 2
of [B, H, S, D], or dim 1 of [B, S, H, D]), RMSNorm with and without the fp32 upcast, and a fused QKV projection split by
``split``, ``chunk`` or a ``view`` of its output. For every combination the default pipeline finds every
norm and every cache write of every layer (fused norms, in-place ost.kv_update_ or a decode attention
that took them in), and the program equals eager over several decode steps with its state."""
from __future__ import annotations

import copy
import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ostinato
from helpers import assert_same

DIM, HEADS, CACHE, VOCAB, LAYERS = 64, 4, 16, 97, 3


class Norm(nn.Module):
    def __init__(self, upcast: bool):
        super().__init__()
        self.upcast, self.weight = upcast, nn.Parameter(torch.rand(DIM) + 0.5)

    def forward(self, x):
        if self.upcast:      # transformers' LlamaRMSNorm: in fp32, back to the input's dtype, then the weight
            h = x.to(torch.float32)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
            return self.weight * h.to(x.dtype)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Layer(nn.Module):
    def __init__(self, kv: str, upcast: bool, qkv: str):
        super().__init__()
        self.kv, self.qkv_form, self.hd = kv, qkv, DIM // HEADS
        self.norm1, self.norm2 = Norm(upcast), Norm(upcast)
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=False)
        self.out = nn.Linear(DIM, DIM, bias=False)
        self.gate, self.up, self.down = (nn.Linear(DIM, 2 * DIM, bias=False), nn.Linear(DIM, 2 * DIM, bias=False),
                                         nn.Linear(2 * DIM, DIM, bias=False))
        shape = {"slice_dim1": (1, CACHE, HEADS, self.hd), "index_put": (CACHE, HEADS, self.hd)}.get(
            kv, (1, HEADS, CACHE, self.hd))
        self.register_buffer("k_cache", torch.zeros(shape))
        self.register_buffer("v_cache", torch.zeros(shape))

    def _split(self, h):
        b, t, _ = h.shape
        if self.qkv_form == "split":
            q, k, v = h.split(DIM, dim=-1)
        elif self.qkv_form == "chunk":
            q, k, v = h.chunk(3, dim=-1)
        else:    # one view to [B, T, 3, H, D], then index
            h = h.view(b, t, 3, HEADS, self.hd)
            return h[:, :, 0], h[:, :, 1], h[:, :, 2]
        return tuple(z.view(b, t, HEADS, self.hd) for z in (q, k, v))

    def forward(self, x, pos):
        q, k, v = self._split(self.qkv(self.norm1(x)))           # [B, T, H, D] each
        q = q.transpose(1, 2)
        if self.kv == "slice_dim1":                             # cache [B, S, H, D]
            self.k_cache[:, pos] = k
            self.v_cache[:, pos] = v
            kc, vc = self.k_cache.transpose(1, 2), self.v_cache.transpose(1, 2)
        elif self.kv == "index_put":                            # cache [S, H, D], batch 1
            self.k_cache.index_put_((pos,), k[0])
            self.v_cache.index_put_((pos,), v[0])
            kc, vc = self.k_cache.transpose(0, 1).unsqueeze(0), self.v_cache.transpose(0, 1).unsqueeze(0)
        else:
            k, v = k.transpose(1, 2), v.transpose(1, 2)
            if self.kv == "index_copy":
                self.k_cache.index_copy_(2, pos, k)
                self.v_cache.index_copy_(2, pos, v)
            else:
                self.k_cache[:, :, pos] = k
                self.v_cache[:, :, pos] = v
            kc, vc = self.k_cache, self.v_cache
        mask = torch.arange(CACHE) <= pos.view(-1, 1)
        a = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask.view(1, 1, q.shape[2], CACHE))
        x = x + self.out(a.transpose(1, 2).reshape(x.shape))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Decoder(nn.Module):
    def __init__(self, kv: str, upcast: bool, qkv: str):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Layer(kv, upcast, qkv) for _ in range(LAYERS))
        self.norm = Norm(upcast)
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids, pos):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, pos)
        return self.head(self.norm(x))


FORMS = list(itertools.product(["index_copy", "index_put", "slice_dim2", "slice_dim1"], [False, True],
                               ["split", "chunk", "view"]))


@pytest.mark.parametrize("kv, upcast, qkv", FORMS,
                         ids=[f"{kv}-{'upcast' if up else 'plain'}-{qkv}" for kv, up, qkv in FORMS])
def test_every_norm_and_cache_write_is_found_and_decode_matches_eager(kv, upcast, qkv):
    torch.manual_seed(0)
    model = Decoder(kv, upcast, qkv).eval()
    ref = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (6, 1, 1), generator=g)
    prog = ostinato.export(model, (ids[0], torch.tensor([0])))
    ops: dict[str, int] = {}
    for n in prog.graph.nodes:
        ops[n.op] = ops.get(n.op, 0) + 1
    norms = ops.get("ost.rms_norm", 0) + ops.get("ost.add_rms_norm", 0)
    writes = ops.get("ost.kv_update_", 0) + 2 * ops.get("ost.decode_attention_", 0)
    assert norms == 2 * LAYERS + 1, f"{norms} of {2 * LAYERS + 1} norms fused: {ops}"
    assert writes == 2 * LAYERS, f"{writes} of {2 * LAYERS} cache writes in place: {ops}"
    assert ops.get("ost.sdpa", 0) + ops.get("ost.decode_attention_", 0) == LAYERS, ops
    left = {op: c for op, c in ops.items() if op in ("aten.index_put", "aten.index_copy", "aten.rsqrt",
                                                     "aten.scaled_dot_product_attention")}
    assert not left, f"unrecognised pieces remain: {left}"
    exe = ostinato.compile(prog)
    for step in range(6):   # positions 0, 2, 4, ...: slots written out of order, later ones read back
        pos = torch.tensor([(2 * step) % CACHE])
        with torch.no_grad():
            assert_same(exe(ids[step], pos), ref(ids[step], pos), msg=f"{kv}/{upcast}/{qkv} step {step}:")
