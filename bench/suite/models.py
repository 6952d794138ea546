"""Architectures the suite builds that transformers does not give us: a UNet block stack and a DiT
block stack (diffusion-like, small but real: conv + GroupNorm + attention; adaLN transformer blocks
over patch tokens) and a ResNet-style conv net. Random weights; every norm gets non-trivial affine
parameters so a wrong kernel cannot hide behind weight 1, bias 0."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of (float) diffusion timesteps [B] -> [B, dim], as in DDPM/DiT."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def perturb_norms(model: nn.Module) -> nn.Module:
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.GroupNorm, nn.LayerNorm, nn.BatchNorm2d)):
                if getattr(m, "weight", None) is not None:
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.2, 0.2)
                if isinstance(m, nn.BatchNorm2d):
                    m.running_mean.uniform_(-0.5, 0.5)
                    m.running_var.uniform_(0.5, 2.0)
    return model


# ---- UNet block stack ------------------------------------------------------------------------------

class ResBlock(nn.Module):
    """GroupNorm, SiLU, 3x3 conv, plus the timestep embedding, twice; 1x1 skip when channels change."""

    def __init__(self, cin: int, cout: int, temb: int, groups: int):
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(groups, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.temb = nn.Linear(temb, cout)
        self.norm2, self.conv2 = nn.GroupNorm(groups, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, emb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.temb(F.silu(emb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return self.skip(x) + h


class SpatialAttention(nn.Module):
    """Self-attention over the H*W positions of a feature map (GroupNorm first, residual after)."""

    def __init__(self, ch: int, heads: int, groups: int):
        super().__init__()
        self.heads = heads
        self.norm = nn.GroupNorm(groups, ch)
        self.qkv, self.proj = nn.Linear(ch, 3 * ch), nn.Linear(ch, ch)

    def forward(self, x):
        b, c, h, w = x.shape
        t = self.norm(x).flatten(2).transpose(1, 2)                        # [B, HW, C]
        q, k, v = self.qkv(t).view(b, h * w, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, h * w, c)
        return x + self.proj(a).transpose(1, 2).reshape(b, c, h, w)


class UNetStack(nn.Module):
    """A two-level UNet on latents [B, 4, H, W] with timesteps [B]: ResBlocks and spatial attention
    at each level, a middle block, skip concatenations on the way up (a Stable-Diffusion-like stack)."""

    def __init__(self, ch: int = 128, heads: int = 4, groups: int = 32, in_ch: int = 4):
        super().__init__()
        temb = 4 * ch
        self.ch = ch
        self.time = nn.Sequential(nn.Linear(ch, temb), nn.SiLU(), nn.Linear(temb, temb))
        self.conv_in = nn.Conv2d(in_ch, ch, 3, padding=1)
        self.down1, self.attn1 = ResBlock(ch, ch, temb, groups), SpatialAttention(ch, heads, groups)
        self.pool1 = nn.Conv2d(ch, ch, 3, stride=2, padding=1)
        self.down2, self.attn2 = ResBlock(ch, 2 * ch, temb, groups), SpatialAttention(2 * ch, heads, groups)
        self.mid1, self.mid_attn = ResBlock(2 * ch, 2 * ch, temb, groups), SpatialAttention(2 * ch, heads, groups)
        self.mid2 = ResBlock(2 * ch, 2 * ch, temb, groups)
        self.up2, self.up_attn2 = ResBlock(4 * ch, 2 * ch, temb, groups), SpatialAttention(2 * ch, heads, groups)
        self.upsample = nn.Conv2d(2 * ch, 2 * ch, 3, padding=1)
        self.up1, self.up_attn1 = ResBlock(3 * ch, ch, temb, groups), SpatialAttention(ch, heads, groups)
        self.norm_out, self.conv_out = nn.GroupNorm(groups, ch), nn.Conv2d(ch, in_ch, 3, padding=1)
        perturb_norms(self)

    def forward(self, x, t):
        emb = self.time(timestep_embedding(t, self.ch).to(x.dtype))
        h1 = self.attn1(self.down1(self.conv_in(x), emb))                  # [B, C, H, W]
        h2 = self.attn2(self.down2(self.pool1(h1), emb))                   # [B, 2C, H/2, W/2]
        m = self.mid2(self.mid_attn(self.mid1(h2, emb)), emb)
        u = self.up_attn2(self.up2(torch.cat([m, h2], 1), emb))
        u = self.upsample(F.interpolate(u, scale_factor=2.0, mode="nearest"))
        u = self.up_attn1(self.up1(torch.cat([u, h1], 1), emb))
        return self.conv_out(F.silu(self.norm_out(u)))


# ---- DiT block stack -------------------------------------------------------------------------------

def modulate(x, shift, scale):
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class DiTBlock(nn.Module):
    """adaLN-Zero transformer block (Peebles & Xie): the condition gives shift/scale/gate for attention
    and MLP. The modulation weights are random, not zero, so every path contributes."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))

    def forward(self, x, c):
        b, n, d = x.shape
        sh1, sc1, g1, sh2, sc2, g2 = self.ada(c).chunk(6, dim=1)
        q, k, v = self.qkv(modulate(self.norm1(x), sh1, sc1)).view(b, n, 3, self.heads, d // self.heads) \
            .permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)
        x = x + g1.unsqueeze(1) * self.proj(a)
        return x + g2.unsqueeze(1) * self.mlp(modulate(self.norm2(x), sh2, sc2))


class DiTStack(nn.Module):
    """Latents [B, C, H, W], timesteps [B], class labels [B] -> [B, C, H, W]: patchify, fixed 2-D
    sin-cos positions, adaLN blocks, final adaLN layer, unpatchify."""

    def __init__(self, dim: int = 768, depth: int = 12, heads: int = 12, patch: int = 2, in_ch: int = 4,
                 size: int = 32, classes: int = 1000):
        super().__init__()
        self.dim, self.patch, self.in_ch, self.grid = dim, patch, in_ch, size // patch
        self.embed = nn.Conv2d(in_ch, dim, patch, stride=patch)
        self.register_buffer("pos", self._positions(dim, self.grid), persistent=False)
        self.time = nn.Sequential(nn.Linear(256, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.label = nn.Embedding(classes, dim)
        self.blocks = nn.ModuleList(DiTBlock(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))
        self.out = nn.Linear(dim, patch * patch * in_ch)

    @staticmethod
    def _positions(dim: int, grid: int) -> torch.Tensor:
        def sincos(d, pos):
            omega = 1.0 / 10000 ** (torch.arange(d // 2, dtype=torch.float64) / (d / 2))
            out = pos.reshape(-1, 1).double() * omega[None]
            return torch.cat([out.sin(), out.cos()], dim=1)
        ys, xs = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
        return torch.cat([sincos(dim // 2, ys), sincos(dim // 2, xs)], dim=1).float()[None]

    def forward(self, x, t, y):
        b = x.shape[0]
        h = self.embed(x).flatten(2).transpose(1, 2) + self.pos.to(x.dtype)     # [B, N, D]
        c = self.time(timestep_embedding(t, 256).to(x.dtype)) + self.label(y)
        for block in self.blocks:
            h = block(h, c)
        shift, scale = self.ada(c).chunk(2, dim=1)
        h = self.out(modulate(self.norm(h), shift, scale))                      # [B, N, p*p*C]
        p, g = self.patch, self.grid
        h = h.view(b, g, g, p, p, self.in_ch).permute(0, 5, 1, 3, 2, 4)
        return h.reshape(b, self.in_ch, g * p, g * p)


# ---- ResNet-style conv net ---------------------------------------------------------------------------

class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    """ResNet-18's layout (stem, four stages of two basic blocks, pooled linear head) at width ``width``
    (64 is ResNet-18); eval-mode BatchNorm with non-trivial running statistics."""

    def __init__(self, width: int = 64, blocks: tuple[int, ...] = (2, 2, 2, 2), classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        layers, cin = [], width
        for i, n in enumerate(blocks):
            cout = width * 2 ** i
            for j in range(n):
                layers.append(BasicBlock(cin, cout, 2 if (j == 0 and i > 0) else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)
        perturb_norms(self)

    def forward(self, x):
        h = self.layers(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


# ---- MobileNetV3 ---------------------------------------------------------------------------------------
# torchvision's MobileNetV3 (Howard et al. 2019) as written there; torchvision itself is not a dependency:
# the registry's wheels for torch 2.13 are CUDA builds whose operator library does not load with the CPU
# torch ("operator torchvision::nms does not exist" at import), and timm needs torchvision.

# (input channels, kernel, expanded channels, output channels, squeeze-excite, hard-swish, stride)
MOBILENET_V3 = {
    "large": ([(16, 3, 16, 16, False, False, 1), (16, 3, 64, 24, False, False, 2), (24, 3, 72, 24, False, False, 1),
               (24, 5, 72, 40, True, False, 2), (40, 5, 120, 40, True, False, 1), (40, 5, 120, 40, True, False, 1),
               (40, 3, 240, 80, False, True, 2), (80, 3, 200, 80, False, True, 1), (80, 3, 184, 80, False, True, 1),
               (80, 3, 184, 80, False, True, 1), (80, 3, 480, 112, True, True, 1), (112, 3, 672, 112, True, True, 1),
               (112, 5, 672, 160, True, True, 2), (160, 5, 960, 160, True, True, 1), (160, 5, 960, 160, True, True, 1)],
              1280),
    "small": ([(16, 3, 16, 16, True, False, 2), (16, 3, 72, 24, False, False, 2), (24, 3, 88, 24, False, False, 1),
               (24, 5, 96, 40, True, True, 2), (40, 5, 240, 40, True, True, 1), (40, 5, 240, 40, True, True, 1),
               (40, 5, 120, 48, True, True, 1), (48, 5, 144, 48, True, True, 1), (48, 5, 288, 96, True, True, 2),
               (96, 5, 576, 96, True, True, 1), (96, 5, 576, 96, True, True, 1)],
              1024),
}


def _divisible(v: float, d: int = 8) -> int:
    out = max(d, int(v + d / 2) // d * d)
    return out + d if out < 0.9 * v else out


def _conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act: type | None = nn.ReLU) -> nn.Sequential:
    layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, *([act()] if act is not None else []))


class SqueezeExcite(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        mid = _divisible(ch // 4)
        self.fc1, self.fc2 = nn.Conv2d(ch, mid, 1), nn.Conv2d(mid, ch, 1)

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.fc2(F.relu(self.fc1(s))))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, k: int, exp: int, cout: int, se: bool, hs: bool, stride: int):
        super().__init__()
        act = nn.Hardswish if hs else nn.ReLU
        layers = [] if exp == cin else [_conv_bn(cin, exp, 1, act=act)]
        layers.append(_conv_bn(exp, exp, k, stride, groups=exp, act=act))
        if se:
            layers.append(SqueezeExcite(exp))
        layers.append(_conv_bn(exp, cout, 1, act=None))
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.block(x)
        return x + y if self.residual else y


class MobileNetV3(nn.Module):
    """MobileNetV3 "large" or "small" (width 1.0), eval-mode BatchNorm with non-trivial statistics."""

    def __init__(self, arch: str = "large", classes: int = 1000):
        super().__init__()
        blocks, last = MOBILENET_V3[arch]
        layers = [_conv_bn(3, 16, 3, 2, act=nn.Hardswish)]
        layers += [InvertedResidual(*b) for b in blocks]
        cin = blocks[-1][3]
        layers.append(_conv_bn(cin, 6 * cin, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(6 * cin, last), nn.Hardswish(), nn.Linear(last, classes))
        perturb_norms(self)

    def forward(self, x):
        return self.classifier(F.adaptive_avg_pool2d(self.features(x), 1).flatten(1))
