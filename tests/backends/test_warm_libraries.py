"""CUDA's library warm-up (backends/cuda/warm.py): which libraries a program gets warmed (CPU), and on
the GPU that compile starts the thread, the first call joins it and gives eager's result, and the switch
turns it off."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ostinato
from helpers import assert_same
from ostinato.backends.cuda import warm


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 32)

    def forward(self, q, k, v):
        return self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=q.shape[-2] > 1).transpose(1, 2).flatten(-2))


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return self.conv(x).relu()


def _qkv(rows: int, dtype) -> tuple:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, 2, rows, 16, generator=g).to(dtype) for _ in range(3))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_jobs_follow_the_programs_library_ops_and_dtypes(dtype):
    torch.manual_seed(0)
    linear = ostinato.export(nn.Sequential(nn.Linear(8, 8), nn.GELU()).to(dtype), (torch.randn(2, 8).to(dtype),))
    assert warm.jobs_for(linear.graph, 99) == [("gemm", dtype)]
    prefill = ostinato.export(Attention().to(dtype), _qkv(4, dtype))
    assert warm.jobs_for(prefill.graph, 99) == [("gemm", dtype), ("attention", dtype)]
    # one query row: the decode kernels take it, no cuDNN to warm
    decode = ostinato.export(Attention().to(dtype), _qkv(1, dtype))
    assert warm.jobs_for(decode.graph, 99) == [("gemm", dtype)]
    conv = ostinato.export(Conv().to(dtype), (torch.randn(1, 3, 8, 8).to(dtype),))
    assert warm.jobs_for(conv.graph, 99) == [("conv", dtype)]
    # nothing a library runs: nothing to warm
    plain = ostinato.export(nn.ReLU(), (torch.randn(4),))
    assert warm.jobs_for(plain.graph, 99) == []


@pytest.mark.cuda
def test_compile_warms_and_the_first_call_waits(monkeypatch):
    torch.manual_seed(0)
    model = Attention().to("cuda", torch.float16).eval()
    args = tuple(t.cuda() for t in _qkv(4, torch.float16))
    prog = ostinato.export(model, args)
    index = torch.cuda.current_device()
    monkeypatch.setattr(warm, "_started", set())        # as in a fresh process
    exe = ostinato.compile(prog, device="cuda", replay=True)
    assert {(index, "gemm", torch.float16), (index, "attention", torch.float16)} <= warm._started
    with torch.no_grad():
        expected = model(*args)
    for _ in range(3):      # step by step, capture, replay
        assert_same(exe(*args), expected)
        assert not warm._threads
    monkeypatch.setattr(warm, "_started", set())
    monkeypatch.setenv("OSTINATO_WARM_LIBRARIES", "0")
    ostinato.compile(prog, device="cuda")
    assert not warm._started and not warm._threads
