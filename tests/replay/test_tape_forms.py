"""What a CPU tape runs for each launch gives the plan's (and eager's) values: found by running diffusers'
models through replay (a sweep, 2026-11-27). A bf16 linear over rows in several dims through its out=
form rounds twice and drifted layer by layer until a capture failed or a replay answered differently from
eager; an allocation's undefined values (``torch.empty_like`` filled by slice assignment) made the check
of every later launch compare whatever two allocations held."""
from __future__ import annotations

import torch
from torch.export import Dim

import ostinato


class _Block(torch.nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.norm, self.fc1, self.fc2 = torch.nn.LayerNorm(d), torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class _Stack(torch.nn.Module):
    def __init__(self, d: int = 16, n: int = 6):
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block(d) for _ in range(n))
        self.out = torch.nn.Linear(d, d, bias=False)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.out(x)


def test_bf16_replay_of_three_dim_linears_is_eager_bit_for_bit():
    torch.manual_seed(0)
    model = _Stack().eval().bfloat16()
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(2, 16, 16, generator=g).bfloat16() for _ in range(5)]
    exe = ostinato.compile(ostinato.export(model, (xs[0],), cache=False), device="cpu", replay=True, cache=False)
    for x in xs:
        with torch.no_grad():
            ref = model(x)
        out = exe(x)
        assert torch.equal(out, ref), (out.float() - ref.float()).abs().max()
    assert exe.runner.stats()["replays"] >= 2


class _Rope(torch.nn.Module):
    """diffusers' Wan rotary embedding: an ``empty_like`` buffer filled through two strided slices."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(24, 24)

    def forward(self, x, cos, sin):
        x = self.proj(x)
        x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
        out = torch.empty_like(x)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x1 * sin + x2 * cos
        return out.sum(-1) + 1.0


def test_replay_of_a_buffer_filled_by_slices_matches_eager_at_every_batch():
    torch.manual_seed(0)
    model = _Rope().eval()
    cos, sin = torch.randn(32, 1, 12), torch.randn(32, 1, 12)
    prog = ostinato.export(model, (torch.randn(2, 32, 2, 24), cos, sin),
                           dynamic_shapes=({0: Dim("batch", min=1, max=8)}, None, None), cache=False)
    exe = ostinato.compile(prog, device="cpu", replay=True, cache=False)
    g = torch.Generator().manual_seed(2)
    for b in (3, 2, 3, 2, 4, 4, 4):
        junk = [torch.full((b * 32 * 2 * 24 * 4,), float(j + 7)) for j in range(4)]   # garbage on the heap
        del junk
        x = torch.randn(b, 32, 2, 24, generator=g)
        with torch.no_grad():
            ref = model(x, cos, sin)
        torch.testing.assert_close(exe(x, cos, sin), ref, rtol=0, atol=0)
    assert exe.runner.stats()["replays"] >= 2
