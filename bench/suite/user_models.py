"""Models written the way users write them, not in the forms the repository's examples and hand patterns
know: the probes of issue #15 ([fusion]). A decoder with a fused QKV projection, its KV cache written by
``index_copy_`` (or a ring buffer by index assignment), and its norm as
``x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w`` (no upcast), or LayerNorm + GELU(tanh);
and a conv block of GroupNorm, SiLU, a depthwise conv and a pixel shuffle."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class PlainRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class UserDecoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int, cache_len: int, style: str):
        super().__init__()
        self.heads, self.hd, self.style, self.cache_len = heads, dim // heads, style, cache_len
        norm = PlainRMSNorm if style == "rms" else nn.LayerNorm
        self.norm1, self.norm2 = norm(dim), norm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=style != "rms")
        self.out = nn.Linear(dim, dim, bias=style != "rms")
        if style == "rms":
            self.gate, self.up = nn.Linear(dim, ffn, bias=False), nn.Linear(dim, ffn, bias=False)
        else:
            self.up = nn.Linear(dim, ffn)
        self.down = nn.Linear(ffn, dim, bias=style != "rms")
        self.register_buffer("k_cache", torch.zeros(1, heads, cache_len, self.hd))
        self.register_buffer("v_cache", torch.zeros(1, heads, cache_len, self.hd))

    def forward(self, x, pos):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, self.hd).transpose(1, 2) for z in (q, k, v))
        if self.style == "rms":
            self.k_cache.index_copy_(2, pos, k)
            self.v_cache.index_copy_(2, pos, v)
            mask = torch.arange(self.cache_len, device=x.device) <= pos.view(-1, 1)
        else:   # a ring buffer: the slot is pos modulo the cache length
            slot = pos % self.cache_len
            self.k_cache[:, :, slot] = k
            self.v_cache[:, :, slot] = v
            mask = torch.arange(self.cache_len, device=x.device) <= pos.view(-1, 1)
        a = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask.view(1, 1, t, -1))
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x)
        if self.style == "rms":
            h = F.silu(self.gate(h)) * self.up(h)
        else:
            h = F.gelu(self.up(h), approximate="tanh")
        return x + self.down(h)


class UserDecoder(nn.Module):
    """Token ids [1, 1] and position [1] → logits [1, 1, vocab]; KV caches are buffers."""

    def __init__(self, dim: int, layers: int, style: str = "rms", vocab: int = 1024, cache_len: int = 256,
                 heads: int | None = None, ffn: int | None = None):
        super().__init__()
        heads = heads or max(1, dim // 64)
        ffn = ffn or (4 * dim if style != "rms" else (8 * dim) // 3 // 64 * 64 or 4 * dim)
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(UserDecoderLayer(dim, heads, ffn, cache_len, style) for _ in range(layers))
        self.norm = PlainRMSNorm(dim) if style == "rms" else nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        with torch.no_grad():   # norms away from 1 and 0 so that a wrong weight shows
            for m in self.modules():
                if isinstance(m, (PlainRMSNorm, nn.LayerNorm)):
                    m.weight.uniform_(0.5, 1.5)

    def forward(self, ids, pos):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, pos)
        return self.head(self.norm(x))


class ConvBlock(nn.Module):
    def __init__(self, ch: int, groups: int = 32):
        super().__init__()
        self.gn1, self.gn2 = nn.GroupNorm(groups, ch), nn.GroupNorm(groups, ch)
        self.dw = nn.Conv2d(ch, ch, 3, padding=1, groups=ch)
        self.pw = nn.Conv2d(ch, ch, 1)
        with torch.no_grad():
            for gn in (self.gn1, self.gn2):
                gn.weight.uniform_(0.5, 1.5)
                gn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        h = self.dw(F.silu(self.gn1(x)))
        return x + self.pw(F.silu(self.gn2(h)))


class ConvStack(nn.Module):
    """Images [B, C, H, W] → [B, C/4, 2H, 2W]: conv blocks, then a pixel shuffle."""

    def __init__(self, ch: int = 64, blocks: int = 4):
        super().__init__()
        self.blocks = nn.Sequential(*(ConvBlock(ch) for _ in range(blocks)))

    def forward(self, x):
        return F.pixel_shuffle(self.blocks(x), 2)
