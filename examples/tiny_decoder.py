"""A dispatch-heavy tiny decoder: many small layers, a static KV cache updated with index_copy_.

Used by the demo, the model tests and the benchmarks. One decode step takes one token per batch row.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Layer(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, max_seq: int, batch: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, 2 * dim, bias=False)
        self.up = nn.Linear(dim, 2 * dim, bias=False)
        self.down = nn.Linear(2 * dim, dim, bias=False)
        shape = (batch, kv_heads, max_seq, self.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape), persistent=False)

    def forward(self, x, pos, cos, sin, mask):
        b, t, d = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        rep = self.heads // self.kv_heads
        keys = self.k_cache.repeat_interleave(rep, dim=1)
        values = self.v_cache.repeat_interleave(rep, dim=1)
        a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class TinyDecoder(nn.Module):
    """Token ids [batch, t] and positions [t] → logits [batch, t, vocab]; KV caches are buffers."""

    def __init__(self, dim: int = 128, layers: int = 64, heads: int = 4, kv_heads: int = 2,
                 vocab: int = 256, max_seq: int = 64, batch: int = 1):
        super().__init__()
        self.max_seq = max_seq
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Layer(dim, heads, kv_heads, max_seq, batch) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        head_dim = dim // heads
        inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        freqs = torch.outer(torch.arange(max_seq).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, tokens, pos):
        x = self.embed(tokens)
        cos, sin = self.cos[pos], self.sin[pos]
        # Causal mask over the whole static cache: query at pos[i] sees keys at positions <= pos[i].
        keys = torch.arange(self.max_seq, device=tokens.device)
        mask = keys.unsqueeze(0) <= pos.unsqueeze(1)
        for layer in self.layers:
            x = layer(x, pos, cos, sin, mask)
        return self.head(self.norm(x))


def decode_inputs(step: int, batch: int = 1, vocab: int = 256, generator=None):
    """Inputs of decode step ``step``: one random token per row at position ``step``."""
    tokens = torch.randint(0, vocab, (batch, 1), generator=generator)
    return tokens, torch.tensor([step])


def tiny_llama(layers: int = 64):
    """The 64-layer tiny Llama (hidden 128) with the inputs of its first decode step: a factory for
    ``ostinato inspect --passes examples.tiny_decoder:tiny_llama``."""
    torch.manual_seed(0)
    return TinyDecoder(dim=128, layers=layers).eval(), decode_inputs(0)


def tiny_llama_4_layers():
    """The tiny Llama cut to 4 layers (exports in about a second): the README's quick start uses it,
    ``ostinato export examples.tiny_decoder:tiny_llama_4_layers -o m.ost``."""
    return tiny_llama(layers=4)
