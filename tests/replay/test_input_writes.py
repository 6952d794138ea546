"""An input the model writes in place, not idempotently (``x.index_put_(..., accumulate=True)``, kept in
place by reinplace): a replayed call writes it once, like eager. A capture's warm-up (CUDA) or probe
(the CPU tape) runs the plan before capturing; it must put that input back, as it puts the state back,
or the capture's first call adds twice (found by review: [4, 0, 2] where eager gives [2, 0, 1])."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import ostinato
from helpers import BACKENDS, assert_same

DEVICES = [*BACKENDS, pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)]


class AccumulatesIntoInput(nn.Module):
    def forward(self, x, idx, v):
        x.index_put_((idx,), v, accumulate=True)
        return v * 2.0 + x.sum()


def _args(gen, device):
    where = "cuda" if device == "cuda" else "cpu"     # MLX takes CPU tensors
    return (torch.randn(6, generator=gen).to(where), torch.randint(0, 6, (4,), generator=gen).to(where),
            torch.randn(4, generator=gen).to(where))


@pytest.mark.parametrize("device", DEVICES)
def test_an_input_accumulated_in_place_is_written_once_per_call(device):
    gen = torch.Generator().manual_seed(0)
    prog = ostinato.export(AccumulatesIntoInput(), _args(gen, "cpu"), cache=False)
    assert any(n.op == "aten.index_put_" for n in prog.graph.nodes), "the write was not kept in place"
    exe = ostinato.compile(prog, device=device, replay=True)
    for call in range(4):      # the capture, then replays
        x, idx, v = _args(gen, device)
        x_ref = x.clone()
        out = exe(x, idx, v)
        with torch.no_grad():
            ref = AccumulatesIntoInput()(x_ref, idx, v)
        assert_same(x, x_ref, 1e-5, msg=f"input after call {call}:")
        assert_same(out, ref, 1e-5, msg=f"call {call}:")


@pytest.mark.parametrize("device", DEVICES)
def test_ostinato_graph_capture_writes_the_input_once(device):
    gen = torch.Generator().manual_seed(1)
    prog = ostinato.export(AccumulatesIntoInput(), _args(gen, "cpu"), cache=False)
    exe = ostinato.compile(prog, device=device)
    x, idx, v = _args(gen, device)
    x_ref = x.clone()
    g = ostinato.Graph()
    with ostinato.graph(g):
        exe(x, idx, v)
    with torch.no_grad():
        AccumulatesIntoInput()(x_ref, idx, v)
    assert_same(x, x_ref, 1e-5, msg="input after the capture:")
