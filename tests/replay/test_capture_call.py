"""``compile(..., replay=True)`` by default: a shape's first call runs step by step, its second captures,
later calls replay (``OSTINATO_CAPTURE_CALL`` unset or 2). The rest of the replay tests run with the
capture on the first call (tests/conftest.py sets OSTINATO_CAPTURE_CALL=1).

What must hold of the default: the first output does not wait for a capture and is eager's; state
written in place is written once per call (the first call's step, the second call's capture, each
replay); an op no replay can repeat is named on the first call, not the second; ``static_inputs()``
needs the capture; each shape signature has its own first call."""
from __future__ import annotations

import pytest
import torch

import ostinato
from helpers import BACKENDS, assert_same, host
from ostinato.errors import CaptureError, OstinatoError, ReplayError
from replay.replay_models import (TINY_BATCH, accumulator, decode_inputs, eager, fresh, row_mlp, snapshot, tiny,
                                  tiny_decoder)
from replay.test_validation import Noisy

STEPS = 5
CUDA_CASES = [pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)]


@pytest.fixture(autouse=True)
def _default_capture_call(monkeypatch):
    monkeypatch.delenv("OSTINATO_CAPTURE_CALL", raising=False)


def _where(device: str) -> str:
    """Where a backend's inputs live (MLX takes CPU tensors)."""
    return "cuda" if device == "cuda" else "cpu"


def _counts(exe) -> tuple:
    s = exe.stats()
    return s["uncaptured_calls"], s["captures"], s["replays"]


@pytest.mark.parametrize("device", BACKENDS + CUDA_CASES)
def test_tiny_decoder_first_call_steps_second_captures(device):
    model, prog = tiny_decoder()
    ref = fresh(model).to(_where(device))
    exe = ostinato.compile(prog, device=device, replay=True)
    gen = torch.Generator().manual_seed(5)
    outs = []
    for s in range(STEPS):
        args = tuple(a.to(_where(device)) for a in decode_inputs(s, TINY_BATCH, tiny.VOCAB, gen))
        out = exe(*args)
        assert_same(host(out), host(eager(ref, *args)), msg=f"decode step {s}:")
        outs.append(snapshot(host(out)))
        assert _counts(exe) == (1, min(s, 1), max(s - 1, 0)), s    # uncaptured calls, captures, replays
    # the KV caches hold every step exactly once
    tiny.assert_state_matches({k: host(v).cpu() for k, v in exe.session.state.items()}, ref.cpu(), "replay")
    assert not torch.equal(outs[0], outs[-1])


@pytest.mark.parametrize("device", BACKENDS + CUDA_CASES)
def test_state_is_written_once_per_call(device):
    """Accumulator adds x.sum() to its state each call: call N returns 6 N on ones(2, 3), whether the
    call ran step by step (1), captured (2) or replayed (3, 4)."""
    _, prog = accumulator()
    exe = ostinato.compile(prog, device=device, replay=True)
    x = torch.ones(2, 3, device=_where(device))
    got = [float(host(exe(x))) for _ in range(4)]
    assert got == [6.0, 12.0, 18.0, 24.0]
    assert _counts(exe) == (1, 1, 2)


@pytest.mark.parametrize("device", BACKENDS)
def test_uncapturable_op_is_named_on_the_first_call(device):
    torch.manual_seed(0)
    prog = ostinato.export(Noisy(), (torch.randn(3, 4),))
    exe = ostinato.compile(prog, device=device, replay=True)
    with pytest.raises(CaptureError, match=r"cannot capture aten[.]rand .*draws random numbers"):
        exe(torch.randn(3, 4))
    assert _counts(exe) == (0, 0, 0)


@pytest.mark.parametrize("device", BACKENDS)
def test_each_shape_has_its_own_first_call_and_static_inputs_need_the_capture(device):
    model, prog = row_mlp(dynamic=True)
    exe = ostinato.compile(prog, device=device, replay=True)
    a, b = torch.randn(4, 8), torch.randn(6, 8)
    assert_same(host(exe(a)), eager(model, a))
    with pytest.raises(ReplayError, match="no capture yet.*call the executable twice"):
        exe.static_inputs()
    assert_same(host(exe(b)), eager(model, b))          # another shape: its own first call
    assert _counts(exe) == (2, 0, 0)
    assert_same(host(exe(a)), eager(model, a))          # the first shape's second call captures
    assert _counts(exe) == (2, 1, 0)
    (static,) = exe.static_inputs()
    assert tuple(static.shape) == (4, 8)
    c = torch.randn(4, 8)
    assert_same(host(exe(c)), eager(model, c))
    assert _counts(exe) == (2, 1, 1)
    assert exe.stats()["plan_misses"] == 3 and exe.stats()["plan_hits"] == 1


def test_capture_call_setting(monkeypatch):
    _, prog = accumulator()
    x = torch.ones(2, 3)
    monkeypatch.setenv("OSTINATO_CAPTURE_CALL", "1")
    exe = ostinato.compile(prog, device="cpu", replay=True)
    exe(x)
    assert _counts(exe) == (0, 1, 0)
    monkeypatch.setenv("OSTINATO_CAPTURE_CALL", "first")
    with pytest.raises(OstinatoError, match="OSTINATO_CAPTURE_CALL='first'.*give 1"):
        ostinato.compile(prog, device="cpu", replay=True)


@pytest.mark.parametrize("device", BACKENDS)
def test_buckets_by_default(device):
    """A bucketed dim: the first call of a rung runs step by step on the real sizes, the second captures
    the padded rung, later calls of any size in that rung replay it; every output is eager's."""
    model, prog = row_mlp(dynamic=True)
    exe = ostinato.compile(prog, device=device, replay=True, buckets={"batch": "pow2"})
    for n, counts in ((3, (1, 0, 0)), (4, (1, 1, 0)), (3, (1, 1, 1)), (2, (2, 1, 1)), (2, (2, 2, 1))):
        x = torch.randn(n, 8)
        out = host(exe(x))
        assert out.shape[0] == n
        assert_same(out, eager(model, x), msg=f"batch {n}:")
        assert _counts(exe) == counts, (n, _counts(exe))
