"""Small modules written in the styles users write them (never the repository's examples' forms), each
with the fusion groups the scheduler must find in it. Used on the CPU (torch reference of each
group), in Triton's interpreter and on the GPU."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Case:
    name: str
    build: Callable[[torch.dtype], tuple[nn.Module, tuple]]
    groups: int                 # ost.fused launches expected (generic pipeline: no hand patterns)
    leftover: tuple = ()        # elementwise/reduction ATen ops allowed to stay unfused


class RMSPlain(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * w with no upcast, then a projection."""

    def __init__(self, d=64):
        super().__init__()
        self.w, self.proj = nn.Parameter(torch.randn(d)), nn.Linear(d, d, bias=False)

    def forward(self, x):
        return self.proj(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w)


class RMSUpcastDiv(nn.Module):
    """The upcast form written with a division by sqrt."""

    def __init__(self, d=64):
        super().__init__()
        self.w, self.proj = nn.Parameter(torch.randn(d)), nn.Linear(d, d, bias=False)

    def forward(self, x):
        h = x.float()
        h = h / torch.sqrt((h * h).mean(dim=-1, keepdim=True) + 1e-5)
        return self.proj(self.w * h.to(x.dtype))


class ResidualLayerNorm(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.ln, self.proj = nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x, y):
        h = x + y
        return self.proj(self.ln(h)), h


class GeluTanhFormula(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        u = self.up(x)
        g = 0.5 * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * torch.pow(u, 3.0))))
        return self.down(g)


class SwiGLUSeparate(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.g, self.u, self.d = nn.Linear(d, 2 * d, bias=False), nn.Linear(d, 2 * d, bias=False), nn.Linear(2 * d, d)

    def forward(self, x):
        return self.d(F.silu(self.g(x)) * self.u(x))


class MaskedSoftmax(nn.Module):
    def forward(self, q, k, mask):
        s = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5) + mask
        return torch.softmax(s, dim=-1)


class LayerScale(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.gamma, self.mlp = nn.Parameter(torch.rand(d) * 0.1), nn.Linear(d, d)

    def forward(self, x):
        return x + self.gamma * torch.relu(self.mlp(x))


class DiTModulation(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.norm, self.ada, self.mlp = nn.LayerNorm(d, elementwise_affine=False), nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x, c):
        shift, scale, gate = self.ada(F.silu(c)).chunk(3, dim=-1)
        h = self.norm(x) * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)
        return x + gate.unsqueeze(1) * self.mlp(h)


class ConvBNReLUAdd(nn.Module):
    def __init__(self, c=16):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)) + x)


class StatsHead(nn.Module):
    """Several reductions of one tensor (mean, var, amax) and a standardization."""

    def forward(self, x):
        m = x.mean(-1, keepdim=True)
        v = x.var(-1, keepdim=True, unbiased=False)
        z = (x - m) / torch.sqrt(v + 1e-5)
        return z, x.amax(-1)


class GroupNormSiLU(nn.Module):
    """UNet's resblock core: GroupNorm then SiLU, a conv, again, and the residual add."""

    def __init__(self, c=16, groups=4):
        super().__init__()
        self.gn1, self.gn2 = nn.GroupNorm(groups, c), nn.GroupNorm(groups, c)
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        with torch.no_grad():
            for gn in (self.gn1, self.gn2):
                gn.weight.uniform_(0.5, 1.5)
                gn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        h = self.conv(F.silu(self.gn1(x)))
        return x + F.silu(self.gn2(h))


class DecoderLayer(nn.Module):
    """A decode step's layer as a user might write it: RMSNorm with an upcast, separate q/k/v projections
    (one ost.multi_linear) mixed pointwise, an output projection with the residual, RMSNorm again and a
    SwiGLU MLP with separate gate/up projections and the residual add after the down projection."""

    def __init__(self, h=64, i=96):
        super().__init__()
        self.w1, self.w2 = nn.Parameter(torch.rand(h) + 0.5), nn.Parameter(torch.rand(h) + 0.5)
        self.q, self.k, self.v, self.o = (nn.Linear(h, h, bias=False) for _ in range(4))
        self.gate, self.up, self.down = nn.Linear(h, i, bias=False), nn.Linear(h, i, bias=False), nn.Linear(i, h)

    @staticmethod
    def _rms(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    def forward(self, x):
        n = self._rms(x, self.w1)
        a = self.q(n) * torch.sigmoid(self.k(n)) + self.v(n)
        h = x + self.o(a)
        n2 = self._rms(h, self.w2)
        return h + self.down(F.silu(self.gate(n2)) * self.up(n2))

    @staticmethod
    def inputs(rows: int, dtype):
        return (torch.randn(rows, 1, 64).to(dtype),)


class BiasGeluHead(nn.Module):
    """LayerNorm, a biased projection with GELU (tanh) and a scaled residual: bias and activation in the
    matmul group's epilogue."""

    def __init__(self, d=48, n=80):
        super().__init__()
        self.ln, self.fc, self.fc2 = nn.LayerNorm(d), nn.Linear(d, n), nn.Linear(d, n)

    def forward(self, x, r):
        y = F.gelu(self.fc(self.ln(x)), approximate="tanh")
        return y * 0.5 + r, self.fc2(x)


class LoneProjections(nn.Module):
    """Projections with no fusible neighbour: a biased one reading an input, a packed pair (q and k of
    one input) returned as they are. One row: each is a matmul group of its own (the generated GEMV)."""

    def __init__(self, d=64, n=40):
        super().__init__()
        self.proj, self.q, self.k = nn.Linear(d, n), nn.Linear(d, n, bias=False), nn.Linear(d, n, bias=False)

    def forward(self, x, y):
        return self.proj(x), self.q(y), self.k(y)

    @staticmethod
    def inputs(rows: int, dtype):
        return torch.randn(rows, 64).to(dtype), torch.randn(rows, 1, 64).to(dtype)


class LongLoneProjections(LoneProjections):
    """LoneProjections over a long K (8192, a Llama-1B down projection's): one row splits K four ways
    (split-K: partials, then the last program of each column block finishes it)."""

    def __init__(self, d=8192, n=40):
        super().__init__(d, n)

    @staticmethod
    def inputs(rows: int, dtype):
        return torch.randn(rows, 8192).to(dtype), torch.randn(rows, 1, 8192).to(dtype)


class FoldedMLP(nn.Module):
    """HF's RMSNorm (upcast, weight after the cast back) before a gated MLP's gate and up projections: in a
    half dtype with more than 16 rows, the default pipeline folds the norm into them (passes/fold_norms.py);
    ``bias``: gate and up have biases (the row scales add them); ``layer``: nn.LayerNorm (weight and shift)
    instead, its shift folded through the weights into the row scales' biases; ``lag``: the norm reads a
    residual sum whose product is biased (``2 x + pre(x)``): the product accumulates without its bias, and the
    row scales take the statistic of the stream plus it and its pre-scale bias (a lagging stream)."""

    def __init__(self, hidden: int = 64, inter: int = 160, bias: bool = False, layer: bool = False,
                 lag: bool = False):
        super().__init__()
        self.pre = nn.Linear(hidden, hidden) if lag else None
        if lag:
            with torch.no_grad():
                self.pre.bias.normal_(0.0, 2.0)
        self.w = nn.Parameter(torch.rand(hidden) + 0.5)
        self.gate = nn.Linear(hidden, inter, bias=bias)
        self.up = nn.Linear(hidden, inter, bias=bias)
        self.down = nn.Linear(inter, hidden, bias=False)
        self.norm = nn.LayerNorm(hidden) if layer else None
        if layer:
            with torch.no_grad():
                self.norm.weight.uniform_(0.5, 1.5)
                self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        if self.pre is not None:
            x = x * 2.0 + self.pre(x)
        if self.norm is not None:
            h = self.norm(x)
            return self.down(F.silu(self.gate(h)) * self.up(h))
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
        h = self.w * h.to(x.dtype)
        return self.down(F.silu(self.gate(h)) * self.up(h))


class PackedGatedMLP(nn.Module):
    """Phi-3's MLP: one gate_up projection (biased here), its output chunked in two and gated (SiLU, or
    GELU for the geglu form), the down projection and the residual: the gating is the packed
    projection's epilogue, over its two row blocks."""

    def __init__(self, h=64, i=48, act="silu"):
        super().__init__()
        self.norm = nn.LayerNorm(h)
        self.gate_up, self.down, self.act = nn.Linear(h, 2 * i), nn.Linear(i, h, bias=False), act

    def forward(self, x):
        gate, up = self.gate_up(self.norm(x)).chunk(2, dim=-1)
        gated = F.silu(gate) * up if self.act == "silu" else F.gelu(gate) * up
        return x + self.down(gated)

    @staticmethod
    def inputs(rows: int, dtype):
        return (torch.randn(rows, 1, 64).to(dtype),)


class Conv1DBlock(nn.Module):
    """GPT-2's block as transformers writes it: LayerNorm, Conv1D projections (weights stored [in, out],
    ``addmm`` over the rows flattened) with the residual adds, one projection plain and one followed by
    its GELU: matmul groups reading their weight transposed."""

    class Conv1D(nn.Module):
        def __init__(self, nf, nx):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(nx, nf) * 0.1)
            self.bias = nn.Parameter(torch.randn(nf) * 0.1)

        def forward(self, x):
            size_out = x.size()[:-1] + (self.weight.size(-1),)
            return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)

    def __init__(self, d=48, inner=96):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.proj, self.fc, self.out = self.Conv1D(d, d), self.Conv1D(inner, d), self.Conv1D(d, inner)

    def forward(self, x):
        h = x + self.proj(self.ln1(x))
        return h + self.out(F.gelu(self.fc(self.ln2(h)), approximate="tanh"))

    @staticmethod
    def inputs(rows: int, dtype):
        return (torch.randn(rows, 1, 48).to(dtype),)


def _r(*shape, dtype):
    return torch.randn(*shape).to(dtype)


class ConvNet(nn.Module):
    """Convolutions as vision and diffusion models write them, for the channels-last lowering: a strided
    stem with BatchNorm and max-pool, a residual block with a 1x1 downsample, GroupNorm + SiLU with a
    biased conv and a broadcast time embedding, attention over pixels (flatten, transpose, SDPA,
    transpose back), nearest upsampling, a depthwise conv and a pixel shuffle; a 4-D output and pooled
    logits."""

    def __init__(self, ch: int = 16):
        super().__init__()
        self.stem = nn.Conv2d(3, ch, 3, stride=2, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(ch)
        self.c1, self.bn1 = nn.Conv2d(ch, 2 * ch, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(2 * ch)
        self.c2, self.bn2 = nn.Conv2d(2 * ch, 2 * ch, 3, padding=1, bias=False), nn.BatchNorm2d(2 * ch)
        self.down, self.bnd = nn.Conv2d(ch, 2 * ch, 1, stride=2, bias=False), nn.BatchNorm2d(2 * ch)
        self.gn = nn.GroupNorm(4, 2 * ch)
        self.c3 = nn.Conv2d(2 * ch, 2 * ch, 3, padding=1)
        self.temb = nn.Linear(8, 2 * ch)
        self.qkv = nn.Linear(2 * ch, 6 * ch)
        self.dw = nn.Conv2d(2 * ch, 2 * ch, 3, padding=1, groups=2 * ch)
        self.out = nn.Conv2d(ch // 2, 4, 3, padding=1)
        self.head = nn.Linear(2 * ch, 10)
        for bn in (self.bn0, self.bn1, self.bn2, self.bnd):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x, t):
        x = F.max_pool2d(F.relu(self.bn0(self.stem(x))), 3, 2, 1)
        h = F.relu(self.bn1(self.c1(x)))
        x = F.relu(self.bn2(self.c2(h)) + self.bnd(self.down(x)))
        h = self.c3(F.silu(self.gn(x))) + self.temb(t)[:, :, None, None]
        b, c, hh, ww = h.shape
        q, k, v = self.qkv(h.flatten(2).transpose(1, 2)).chunk(3, dim=-1)
        a = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]
        x = x + a.transpose(1, 2).reshape(b, c, hh, ww)
        logits = self.head(x.mean(dim=(2, 3)))
        x = F.interpolate(x, scale_factor=2.0, mode="nearest")
        x = F.pixel_shuffle(F.silu(self.dw(x)), 2)
        return self.out(x), logits

    @staticmethod
    def inputs(dtype):
        return torch.randn(2, 3, 32, 32).to(dtype), torch.randn(2, 8).to(dtype)


class ConvBiasEpilogues(nn.Module):
    """Biased convolutions read by a group norm + SiLU, by a lone ReLU, by a residual add (its result
    read twice: by the ReLU and the add), and one whose result is the graph's output."""

    def __init__(self):
        super().__init__()
        self.c1, self.gn = nn.Conv2d(3, 16, 3, padding=1), nn.GroupNorm(4, 16)
        self.c2, self.c3, self.c4 = nn.Conv2d(16, 16, 3, padding=1), nn.Conv2d(16, 8, 1), nn.Conv2d(8, 8, 1)
        for c in (self.c1, self.c2, self.c3, self.c4):
            nn.init.uniform_(c.bias, -1.0, 1.0)

    def forward(self, x):
        h = F.silu(self.gn(self.c1(x)))
        h = torch.relu(self.c2(h))
        y = self.c3(h)
        z = self.c4(torch.relu(y)) + y
        return z, self.c4(z)


class ConvNeXtBlock(nn.Module):
    """transformers' ConvNeXt layer: a depthwise conv with bias, NCHW -> NHWC, layer norm, MLP, layer
    scale, back to NCHW, residual."""

    def __init__(self, ch: int = 16):
        super().__init__()
        self.dw = nn.Conv2d(ch, ch, 7, padding=3, groups=ch)
        self.norm = nn.LayerNorm(ch, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(ch, 4 * ch), nn.Linear(4 * ch, ch)
        self.gamma = nn.Parameter(torch.rand(ch) + 0.5)
        nn.init.uniform_(self.dw.bias, -1.0, 1.0)

    def forward(self, x):
        h = self.dw(x).permute(0, 2, 3, 1)
        h = self.fc2(F.gelu(self.fc1(self.norm(h))))
        return x + (self.gamma * h).permute(0, 3, 1, 2)


class SqueezeExcite(nn.Module):
    """MobileNetV3's block end: pooled, two biased 1x1 convs, the hardsigmoid gate broadcast over pixels."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.bn = nn.BatchNorm2d(c).eval()
        self.fc1, self.fc2 = nn.Conv2d(c, c // 4, 1), nn.Conv2d(c // 4, c, 1)
        nn.init.uniform_(self.fc2.bias, -1.0, 1.0)

    def forward(self, x):
        x = F.hardswish(self.bn(x))
        s = F.hardsigmoid(self.fc2(F.relu(self.fc1(x.mean((2, 3), keepdim=True)))))
        return x * s


class StridedCopies(nn.Module):
    """Heads made dense before a batched matmul (the copy of a permute), relative position keys repeated
    over the batch (torch's decomposition of repeat: the copy of an expanded view), each a generated
    kernel of its own; the copy of a dense input stays torch's."""

    def forward(self, x, pos):
        b, s, _ = x.shape
        q = x.view(b, s, 4, 8).permute(0, 2, 1, 3).contiguous().view(b * 4, s, 8)
        keys = pos.repeat(b, 1, 1)                   # [4, 6, 8] -> [4b, 6, 8]
        return torch.bmm(q, keys.transpose(1, 2)), x.clone()


class RelativeScores(nn.Module):
    """DeBERTa's disentangled attention scores as its authors wrote them: content-to-position and
    position-to-content scores gathered at clamped relative distances (the second transposed), added
    to the content scores, then the softmax. The gathers read the batched matmuls' results from memory
    inside the softmax's kernel (the transpose sunk through the gather at export)."""

    def forward(self, q, k, pos_k, pos_q, rel):
        bh, s, _ = q.shape
        p = pos_k.shape[1] // 2
        scores = torch.bmm(q, k.transpose(-1, -2))
        c2p = torch.bmm(q, pos_k.transpose(-1, -2))
        c2p = torch.gather(c2p, -1, torch.clamp(rel + p, 0, 2 * p - 1).unsqueeze(0).expand(bh, s, s))
        p2c = torch.bmm(k, pos_q.transpose(-1, -2))
        p2c = torch.gather(p2c, -1, torch.clamp(-rel + p, 0, 2 * p - 1).unsqueeze(0).expand(bh, s, s))
        return torch.softmax(scores + c2p / 2 + p2c.transpose(-1, -2) / 2, -1)


def _relative(dt):
    bh, s, d, p = 6, 7, 8, 4
    rel = torch.arange(s)[:, None] - torch.arange(s)[None, :]
    return RelativeScores(), (_r(bh, s, d, dtype=dt), _r(bh, s, d, dtype=dt), _r(bh, 2 * p, d, dtype=dt),
                              _r(bh, 2 * p, d, dtype=dt), rel)


class SelectiveScan(nn.Module):
    """A state-space scan as transformers' Mamba writes it without its CUDA kernels: per token the state
    is updated pointwise and multiplied by that token's C column (a matmul of one output column, K the
    state size)."""

    def forward(self, dA, dBu, C):      # dA, dBu [b, d, L, n]; C [b, L, n]
        state = torch.zeros(dA.shape[0], dA.shape[1], dA.shape[3], dtype=dA.dtype, device=dA.device)
        ys = []
        for i in range(dA.shape[2]):
            state = dA[:, :, i, :] * state + dBu[:, :, i, :]
            ys.append(torch.matmul(state, C[:, i, :].unsqueeze(-1))[:, :, 0])
        return torch.stack(ys, dim=-1), state

    @staticmethod
    def inputs(dtype, b=2, d=24, steps=6, n=16):
        return (torch.rand(b, d, steps, n).to(dtype), torch.randn(b, d, steps, n).to(dtype),
                torch.randn(b, steps, n).to(dtype))


CASES = [
    Case("rms_plain", lambda dt: (RMSPlain().to(dt), (_r(2, 5, 64, dtype=dt),)), 1),
    Case("rms_upcast_div", lambda dt: (RMSUpcastDiv().to(dt), (_r(2, 5, 64, dtype=dt),)), 1),
    Case("residual_layer_norm", lambda dt: (ResidualLayerNorm().to(dt), (_r(3, 64, dtype=dt), _r(3, 64, dtype=dt))), 1),
    Case("gelu_tanh_formula", lambda dt: (GeluTanhFormula().to(dt), (_r(2, 3, 64, dtype=dt),)), 1),
    Case("swiglu_separate", lambda dt: (SwiGLUSeparate().to(dt), (_r(2, 3, 64, dtype=dt),)), 1),
    Case("masked_softmax", lambda dt: (MaskedSoftmax(), (_r(2, 4, 9, 16, dtype=dt), _r(2, 4, 9, 16, dtype=dt),
                                                          _r(1, 1, 9, 9, dtype=dt))), 1),
    Case("layer_scale", lambda dt: (LayerScale().to(dt), (_r(2, 7, 64, dtype=dt),)), 1),
    # silu(c) with the projection after it (a matmul group), the norm with its modulation (1 + scale
    # computed inside it, per element: schedule._broadcast_producers), the projection and the gated
    # residual (another: 12 rows)
    Case("dit_modulation", lambda dt: (DiTModulation().to(dt), (_r(2, 6, 64, dtype=dt), _r(2, 64, dtype=dt))), 2),
    Case("conv_bn_relu_add", lambda dt: (ConvBNReLUAdd().to(dt), (_r(2, 16, 9, 9, dtype=dt),)), 1),
    Case("stats_head", lambda dt: (StatsHead(), (_r(4, 5, 33, dtype=dt),)), 1),
    Case("group_norm_silu", lambda dt: (GroupNormSiLU().to(dt), (_r(2, 16, 7, 9, dtype=dt),)), 2),
    # three of the four convolutions' biases added by the group reading their result; relu(y) stays
    # torch's (y is also read by the add); the last convolution's result is an output: torch adds its bias
    Case("conv_bias_epilogues", lambda dt: (ConvBiasEpilogues().to(dt), (_r(2, 3, 10, 12, dtype=dt),)), 3,
         leftover=("aten.relu",)),
    # the layer scale and the residual add, either side of a permute back to NCHW (passes.sink_permutes);
    # the layer norm and the GELU between cuBLAS matmuls are lone ops
    # the pooled statistics with the norm and activation; fc1's bias with the ReLU; fc2's bias, the
    # hardsigmoid (four ops as exported) and the gate's multiply over the pixels in one kernel (the gate
    # computed again per pixel: schedule._broadcast_producers)
    Case("squeeze_excite", lambda dt: (SqueezeExcite().to(dt), (_r(2, 16, 5, 6, dtype=dt),)), 3),
    Case("convnext_block", lambda dt: (ConvNeXtBlock().to(dt), (_r(2, 16, 9, 10, dtype=dt),)), 1,
         leftover=("aten.layer_norm", "aten.gelu")),
    Case("strided_copies", lambda dt: (StridedCopies(), (_r(3, 5, 32, dtype=dt), _r(4, 6, 8, dtype=dt))), 2),
    # the two clamped index computations, then the gathers, the adds and the softmax in one kernel
    Case("relative_scores", _relative, 3),
]


class ShortAndRows(torch.nn.Module):
    """A pointwise value of fewer dims beside a reduction over a longer one: they must not share a kernel
    as if the short value were per row."""

    def forward(self, x, y):
        a = x * 2
        c = a + y
        return a, c, torch.softmax(y, -1)


class HalfCompare(torch.nn.Module):
    """Comparisons with a Python float: torch rounds it to the tensor's dtype first."""

    def forward(self, x):
        y = x * 1.0 + 0.0
        return y < 0.1, y == 0.1, torch.where(y >= 0.2, y, -y)


class NanRows(torch.nn.Module):
    def forward(self, x):
        return (x * 2 + 1).amax(-1), (x - 1).amin(-1, keepdim=True) * 3


class FloorDiv(torch.nn.Module):
    def forward(self, x):
        return torch.div(x * 1.0, 0.1, rounding_mode="floor") + 1


class EmptyRows(torch.nn.Module):
    def forward(self, x):
        return (x * 2).sum(-1) + 1, torch.softmax(x * 3, -1)


EDGE_CASES = {
    # name: (model, args builder, exact?)
    "short_and_rows": (ShortAndRows, lambda: (torch.randn(8), torch.randn(1, 8)), False),
    "half_compare": (HalfCompare, lambda: (torch.tensor([0.1, 0.2, 0.3, -0.1], dtype=torch.float16),), True),
    "nan_rows": (NanRows, lambda: (torch.tensor([[1.0, float("nan"), 2.0], [0.5, -1.0, 3.0]]),), False),
    "floor_div": (FloorDiv, lambda: (torch.tensor([1.0, 0.3, -0.7, 2.5]),), True),
    "empty_rows": (EmptyRows, lambda: (torch.randn(3, 0),), False),
    "empty_batch": (EmptyRows, lambda: (torch.randn(0, 8192),), False),
}
