"""The CUDA lowering's choice of layout per convolution (backends/cuda/layout.py), checked on the graph
(the kernels are checked in tests/codegen: interpreted on CPU tensors, and on the GPU)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import ostinato
from ostinato.backends.cuda.layout import LONG_GROUP, NARROW_GROUP, channels_last_convs, outputs_to_restore


class ConvGroupNorm(nn.Module):
    """conv -> (+ residual) -> GroupNorm -> SiLU -> conv, as diffusion UNets write it."""

    def __init__(self, ch=32, groups=8):
        super().__init__()
        self.a, self.b = nn.Conv2d(ch, ch, 3, padding=1), nn.Conv2d(ch, ch, 3, padding=1)
        self.gn = nn.GroupNorm(groups, ch)

    def forward(self, x):
        h = self.a(x) + x
        return self.b(torch.nn.functional.silu(self.gn(h)))


def _convs(prog):
    return [n.name for n in prog.graph.nodes if n.op == "aten.convolution"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("groups", [8, 16])
def test_half_convolutions_run_channels_last_unless_feeding_long_narrow_groups(dtype, groups):
    ch = 32
    cpg = ch // groups
    short = ostinato.export(ConvGroupNorm(ch, groups).to(dtype), (torch.randn(1, ch, 8, 8, dtype=dtype),))
    assert channels_last_convs(short.graph) == set(_convs(short))          # groups of cpg x 64: held whole
    side = int((LONG_GROUP // cpg) ** 0.5) * 2                             # groups of cpg x side^2 > LONG_GROUP
    long = ostinato.export(ConvGroupNorm(ch, groups).to(dtype), (torch.randn(1, ch, side, side, dtype=dtype),))
    first, second = _convs(long)
    if cpg >= NARROW_GROUP:     # runs of 4+ channels per pixel: the split kernels read NHWC well enough
        assert channels_last_convs(long.graph) == {first, second}
        return
    # the one before the norm stays, and then the one after would run channels-last alone: it stays too
    assert channels_last_convs(long.graph) == set()
    assert [v.name for v in outputs_to_restore(long.graph, {second})] == [v.name for v in long.graph.output_values()]


class Chain(nn.Module):
    """``n`` convolutions in a row (SiLU between); ``alone``: then one more behind a narrow long group norm."""

    def __init__(self, n, alone=False, ch=32):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(ch, ch, 3, padding=1) for _ in range(n))
        self.gn = nn.GroupNorm(16, ch) if alone else None
        self.last = nn.Conv2d(ch, ch, 1) if alone else None

    def forward(self, x):
        for c in self.convs:
            x = torch.nn.functional.silu(c(x))
        if self.gn is not None:
            x = self.last(self.gn(x) + 1.0)
        return x


@pytest.mark.parametrize("n,alone,expect", [(1, False, 0), (2, False, 2), (3, False, 3), (2, True, 0)])
def test_convolutions_left_alone_stay_in_their_input_layout(n, alone, expect):
    """A convolution with no channels-last neighbour (a lone one; the one after a narrow long group
    norm, whose feeders stay NCHW, which then leaves the chain before it alone too) converts its input
    and hands NHWC to NCHW readers: it stays in its input's layout. Chains keep running channels-last."""
    side = 96 if alone else 8
    prog = ostinato.export(Chain(n, alone).half(), (torch.randn(1, 32, side, side, dtype=torch.float16),))
    assert len(channels_last_convs(prog.graph)) == expect


def test_fp32_and_nchw_switch_keep_every_layout(monkeypatch):
    prog = ostinato.export(ConvGroupNorm(), (torch.randn(1, 32, 8, 8),))
    assert channels_last_convs(prog.graph) == set() and outputs_to_restore(prog.graph, set()) == []
    half = ostinato.export(ConvGroupNorm().half(), (torch.randn(1, 32, 8, 8, dtype=torch.float16),))
    monkeypatch.setenv("OSTINATO_CONV_LAYOUT", "nchw")
    assert channels_last_convs(half.graph) == set()
    narrow = ostinato.export(ConvGroupNorm(32, 16).half(), (torch.randn(1, 32, 96, 96, dtype=torch.float16),))
    monkeypatch.setenv("OSTINATO_CONV_LAYOUT", "nhwc")      # every one, those before narrow long groups too
    assert channels_last_convs(narrow.graph) == set(_convs(narrow)) and len(_convs(narrow)) == 2
    monkeypatch.setenv("OSTINATO_CONV_LAYOUT", "auto")    # the feeder stays, the other would be alone
    assert channels_last_convs(narrow.graph) == set()
