"""torch.compile(backend="ostinato") on CUDA: replay is on by default, outputs and KV caches equal eager's.

Run on the lent GPU; CI (no GPU) skips them.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo

import ostinato.dynamo as od

from examples.tiny_decoder import TinyDecoder, decode_inputs
from helpers import assert_same, assert_replay_counts

STRICT = {"eager_fallback": False}   # a graph ostinato cannot take fails the test instead of running eagerly


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    od.reset_stats()
    yield
    torch._dynamo.reset()

TOL = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def _cache_buffers(model):
    return {n: b for n, b in model.named_buffers() if n.endswith(("k_cache", "v_cache"))}


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_tiny_decoder_replays_on_cuda(dtype):
    torch.manual_seed(0)
    model = TinyDecoder(dim=128, layers=4).eval().to("cuda", dtype)
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="ostinato", options=STRICT)
    gen = torch.Generator().manual_seed(1)
    outs, refs = [], []
    with torch.no_grad():
        for step in range(6):
            args = tuple(t.cuda() for t in decode_inputs(step, generator=gen))
            outs.append(compiled(*args))
            refs.append(eager(*args))
            assert_same(outs[-1], refs[-1], TOL[dtype], msg=f"step {step}")
    # Outputs are copies: the first step's is not overwritten by later replays.
    assert_same(outs[0], refs[0], TOL[dtype], msg="step 0, read after the later steps")
    s = od.stats()
    assert s["compiled"] == 1 and s["eager"] == 0 and s["calls"] == 6, s
    (graph,) = od.compiled_graphs()
    assert graph.replay and graph.device.type == "cuda"
    rs = graph.executable.stats()
    assert_replay_counts(rs, calls=6)
    for name, buf in _cache_buffers(model).items():
        assert_same(buf, _cache_buffers(eager)[name], TOL[dtype], msg=f"buffer {name}")


@pytest.mark.cuda
def test_dynamic_batch_on_cuda():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                                torch.nn.Linear(64, 8)).eval().cuda()
    compiled = torch.compile(model, backend="ostinato", options=STRICT)
    with torch.no_grad():
        for b in (3, 7, 3, 7):
            x = torch.randn(b, 32, device="cuda")
            torch._dynamo.mark_dynamic(x, 0)
            assert_same(compiled(x), model(x), TOL[torch.float32], msg=f"batch {b}")
    s = od.stats()
    assert s["compiled"] == 1 and s["exports"] == 1 and s["specializations"] == 0, s
    (graph,) = od.compiled_graphs()
    assert_replay_counts(graph.executable.stats(), calls=4, captures=2)    # one capture per batch size
