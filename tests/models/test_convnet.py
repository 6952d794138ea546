"""A small hand-written conv net: conv, eval-mode BatchNorm with non-trivial running statistics, ReLU,
max/avg/adaptive pooling, interpolation and upsampling, a residual skip and a concat skip; batch dynamic."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

import pytest

import ostinato
from helpers import BACKENDS, assert_same


def batch_norm(channels: int) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(channels)
    with torch.no_grad():
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.2, 0.2)
    return bn


class SmallConvNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), batch_norm(16), nn.ReLU())
        self.pool = nn.MaxPool2d(2)
        self.block = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, bias=False), batch_norm(16), nn.ReLU(),
                                   nn.Conv2d(16, 16, 3, padding=1, bias=False), batch_norm(16))
        self.down = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.avg = nn.AvgPool2d(2)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.fuse = nn.Conv2d(32 + 16, 16, 1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, classes)

    def forward(self, x):
        x = self.pool(self.stem(x))                 # [B, 16, 16, 16]
        x = F.relu(x + self.block(x))               # residual skip
        y = self.avg(F.relu(self.down(x)))          # [B, 32, 4, 4]
        y = F.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False)  # 8x8
        y = self.up(y)                              # 16x16
        z = F.relu(self.fuse(torch.cat([x, y], dim=1)))  # concat skip
        return self.fc(self.gap(z).flatten(1)), z


@pytest.mark.parametrize("device", BACKENDS)
def test_convnet_dynamic_batch(device):
    torch.manual_seed(0)
    model = SmallConvNet().eval()
    batch = Dim("batch", min=1, max=16)
    prog = ostinato.export(model, (torch.randn(2, 3, 32, 32),), dynamic_shapes=({0: batch},))
    assert prog.graph.symbols, "batch did not become a size symbol"
    exe = ostinato.compile(prog, device=device)
    for b in (2, 5):
        x = torch.randn(b, 3, 32, 32)
        with torch.no_grad():
            expected = model(x)
        assert_same(exe(x), expected, msg=f"batch {b}")
