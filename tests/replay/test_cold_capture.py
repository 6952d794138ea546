"""A replayed call on a cold kernel cache does not wait for the kernel compiles (issue #19).

``compile(..., replay=True)``: when the capture's warm-up finds kernels still compiling in worker
processes, the call gives the capture up (``CompilesInFlight``), runs step by step on the caller's own
inputs and stores no capture; the next call of that shape waits for the compiles and captures.
``stats()["uncaptured_calls"]`` counts those calls. ``capture_buckets`` (and ``ostinato.graph``) still
wait for the compiles and capture.

CPU tests run the real ``capture_cuda_graph`` up to its capture, with torch.cuda's streams replaced by
no-ops (module-local) and the warm-up counted as deferring an op call, as an op whose kernel compiles
does: its warm-up, the state restore, the give-up; then the runner's fallback, its counters, and that
state and input writes happen once. The CUDA test (``cold_case.py`` in a fresh process: a cold kernel
cache in process and on disk, compiles held back by a gate) runs on the GPU machine.
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import ostinato
from helpers import assert_same
from ostinato.backends.cuda.runtime import KernelLibrary
from ostinato.errors import ReplayError
from ostinato.replay import cuda_graph, runner as runner_mod
from ostinato.replay.capture import Captured, CompilesInFlight
from replay.replay_models import MutatesInput, batch_dim, counting_row_mlp, eager, fresh, snapshot


HERE = os.path.dirname(os.path.abspath(__file__))


class Histogram(nn.Module):
    """State written in place and not idempotently: ``counts.index_put_(..., accumulate=True)`` (reinplaced,
    so a warm-up really writes the session's buffer): a warm-up whose write stayed, or a call whose write
    happened twice, shows in the counts."""

    def __init__(self, bins: int = 8, dim: int = 4):
        super().__init__()
        self.proj = nn.Linear(dim, 1)
        self.register_buffer("counts", torch.zeros(bins))

    def forward(self, x, idx):
        self.counts.index_put_((idx,), self.proj(x).squeeze(-1), accumulate=True)
        return self.counts * 2.0, x.sum(-1)


class _Stream:
    def wait_stream(self, other) -> None:
        pass


class ReachedCapture(Exception):
    """Raised by the fake torch.cuda where the real capture would begin (after the warm-ups)."""


class _FakeCuda:
    """What capture_cuda_graph asks of torch.cuda before its capture, as no-ops on the CPU."""

    def Stream(self, device=None):   # noqa: N802 - torch's name
        return _Stream()

    def current_stream(self, device=None):
        return _Stream()

    def stream(self, s):
        return contextlib.nullcontext()

    def synchronize(self, device=None):
        raise ReachedCapture()


class _FakeTorch:
    cuda = _FakeCuda()

    def __getattr__(self, name):
        return getattr(torch, name)


class Cold:
    """Kernels "compiling" while ``compiling`` is set: every plan run inside capture_cuda_graph's warm-up
    defers op calls, as ops whose kernels compile in workers do. Records each capture's ``wait``."""

    def __init__(self):
        self.compiling = True
        self.waits: list[bool] = []
        self.warm_ups = 0


@pytest.fixture
def cold(monkeypatch):
    """Captured (in the runner) runs the real capture_cuda_graph first where it would give up (a call,
    kernels compiling), then (compiles done, or ``wait``) the CPU tape as usual."""
    state = Cold()
    monkeypatch.setitem(KernelLibrary.counts, "deferred", KernelLibrary.counts["deferred"])
    monkeypatch.setattr(cuda_graph, "torch", _FakeTorch())

    class ColdCaptured(Captured):
        def __init__(self, exe, session, leaves, bindings, holder=None, pool=None, *, wait=True):
            state.waits.append(wait)
            if state.compiling and not wait:
                _warm_up_and_give_up(state, exe, session, leaves)
            super().__init__(exe, session, leaves, bindings, holder=holder, pool=pool, wait=wait)

    monkeypatch.setattr(runner_mod, "Captured", ColdCaptured)
    return state


def _deferring_plan(state: Cold, exe):
    plan = exe._plan

    def run(env):
        state.warm_ups += 1
        KernelLibrary.counts["deferred"] += 1      # an op ran its reference: its kernel still compiles
        return plan(env)
    return plan, run


def _warm_up_and_give_up(state: Cold, exe, session, leaves) -> None:
    plan, exe._plan = _deferring_plan(state, exe)
    try:
        env0 = exe.bind(session, leaves)
        cuda_graph.capture_cuda_graph(exe, env0, session.state, exe.mutation_targets(session, leaves), None,
                                      wait=False)
    finally:
        exe._plan = plan
    raise AssertionError("capture_cuda_graph(wait=False) did not give up while kernels compiled")


@pytest.fixture(scope="module")
def histogram():
    torch.manual_seed(0)
    model = Histogram().eval()
    pristine = copy.deepcopy(model)
    prog = ostinato.export(model, (torch.randn(3, 4), torch.tensor([1, 5, 5])))
    assert any(n.op == "aten.index_put_" for n in prog.graph.nodes), "the state write was not made in place"
    return pristine, prog


def test_cold_call_runs_step_by_step_and_the_next_captures(cold, histogram):
    """The first call of a shape, kernels compiling: given up, answered step by step; the second call of
    that shape waits for the compiles (wait=True) and captures; the later ones replay."""
    model, prog = histogram
    ref = fresh(model)
    exe = ostinato.compile(prog, device="cpu", replay=True)
    torch.manual_seed(1)
    idx = torch.randint(0, 8, (3,))
    with pytest.raises(ReplayError, match="no capture yet"):
        exe.static_inputs()
    outs = []
    for step in range(5):
        x = torch.randn(3, 4)
        out = exe(x, idx)
        expected = eager(ref, x, idx)
        assert_same(out, expected, msg=f"call {step}:")
        assert_same(exe.session.state["counts"], ref.counts, msg=f"state after call {step}:")
        outs.append(out)
        stats = exe.stats()
        graphs = exe.session.replay.get("graphs", {})
        if step == 0:
            # given up: no capture stored, no memory report, the call counted; its outputs are new tensors
            assert stats["uncaptured_calls"] == 1 and stats["captures"] == 0 and not graphs
            assert stats["plan_misses"] == 1 and stats["replays"] == 0
            assert exe.memory_report() == []
            with pytest.raises(ReplayError, match="uncaptured_calls"):
                exe.static_inputs()
        else:
            assert stats["uncaptured_calls"] == 1 and stats["captures"] == 1 and len(graphs) == 1
            assert stats["replays"] == step - 1 and stats["plan_misses"] == 2 and stats["plan_hits"] == step - 1
    assert cold.warm_ups == 1       # the uncaptured call's warm-up (the tape's probes do not count)
    assert cold.waits == [False, True]      # the second call waited, though kernels were still compiling
    assert outs[0][0] is not outs[1][0] and outs[2][0] is outs[1][0]
    assert exe.static_inputs()[0].shape == (3, 4)


@pytest.mark.parametrize("sizes, counts", [((3, 3, 5, 3, 5), (2, 2, 1, 3)), ((4, 3, 4), (1, 1, 1, 1))],
                         ids=["padded", "exact-then-padded"])
def test_cold_bucketed_calls_give_real_sizes_and_state_once(cold, sizes, counts):
    """Buckets: an uncaptured call (the first of each rung) runs at the real size (no padding, no
    narrowing); the second of its rung captures, padded as usual. State (total += x.sum() + 1) is written
    once per call. ``counts``: uncaptured calls, captures, replays, bucket hits (uncaptured calls are not
    bucket hits)."""
    model, prog = counting_row_mlp()
    ref = fresh(model)
    exe = ostinato.compile(prog, device="cpu", replay=True, buckets={"batch": "pow2"})
    torch.manual_seed(2)
    for step, b in enumerate(sizes):
        x = torch.randn(b, 8)
        out = snapshot(exe(x))
        assert out[0].shape == (b, 4)
        assert_same(out, eager(ref, x), msg=f"call {step} (batch {b}):")
        assert_same(exe.session.state["total"], ref.total, msg=f"state after call {step}:")
    stats = exe.stats()
    assert (stats["uncaptured_calls"], stats["captures"], stats["replays"], stats["bucket_hits"]) == counts


def test_cold_call_writes_a_mutated_input_once(cold):
    """x.mul_(2): the uncaptured call writes the caller's tensor itself, once (no copy-back from a static
    input); after the capture the static input is copied back as before."""
    prog = ostinato.export(MutatesInput(), (torch.randn(4, 8),), dynamic_shapes=({0: batch_dim()},))
    exe = ostinato.compile(prog, device="cpu", replay=True, buckets={"batch": "pow2"})
    torch.manual_seed(3)
    for step, b in enumerate((3, 3, 3, 4)):
        x = torch.randn(b, 8)
        x0 = x.clone()
        out = exe(x)
        assert_same(x, 2 * x0, msg=f"input after call {step}:")
        assert_same(out, 2 * x0 + 1, msg=f"call {step}:")
    stats = exe.stats()
    assert (stats["uncaptured_calls"], stats["captures"], stats["replays"]) == (1, 1, 2)


def test_capture_buckets_still_waits(cold):
    """capture_buckets needs its captures: it asks with wait=True (so capture_cuda_graph waits) even
    while kernels compile, and a later call replays."""
    model, prog = counting_row_mlp()
    exe = ostinato.compile(prog, device="cpu", replay=True, buckets={"batch": [4, 8]})
    assert exe.runner.capture_buckets(exe.session) == 2
    assert cold.waits == [True, True] and cold.warm_ups == 0
    x = torch.randn(3, 8)
    assert_same(exe(x), eager(fresh(model), x))
    stats = exe.stats()
    assert (stats["uncaptured_calls"], stats["captures"], stats["replays"]) == (0, 2, 1)


@pytest.fixture
def fake_cuda(monkeypatch):
    """capture_cuda_graph on the CPU up to its capture (ReachedCapture there); the op calls deferred are
    this test's to count; returns the list wait_for_compiles appends to."""
    monkeypatch.setitem(KernelLibrary.counts, "deferred", KernelLibrary.counts["deferred"])
    monkeypatch.setattr(cuda_graph, "torch", _FakeTorch())
    waited: list[int] = []
    monkeypatch.setattr(cuda_graph, "wait_for_compiles", lambda: waited.append(1))
    return waited


def _until_capture(exe, x, idx, waited: list, deferring: bool = True, **kw) -> tuple[int, bool]:
    """The real capture_cuda_graph until its capture would begin: how many times it ran the plan (its
    warm-ups) and whether it waited for the compiles; CompilesInFlight where it gave up. ``deferring``:
    the first plan run defers an op call, as on a cold cache."""
    session = exe.session
    leaves = [x, idx]
    runs = []
    plan = exe._plan

    def run(env):
        runs.append(1)
        if deferring and len(runs) == 1:
            KernelLibrary.counts["deferred"] += 1
        return plan(env)
    exe._plan = run
    try:
        cuda_graph.capture_cuda_graph(exe, exe.bind(session, leaves), session.state,
                                      exe.mutation_targets(session, leaves), None, **kw)
    except ReachedCapture:
        return len(runs), bool(waited)
    finally:
        exe._plan = plan
    raise AssertionError("capture_cuda_graph neither captured nor gave up")


@pytest.mark.parametrize("kw", [{}, {"wait": True}], ids=["default", "wait"])
def test_capture_cuda_graph_waits_by_default(histogram, fake_cuda, kw):
    """Its other callers (capture_buckets, ostinato.graph) see no change: on a cold cache it waits for
    the compiles, warms up again, then captures; both warm-ups are undone."""
    exe = ostinato.compile(histogram[1], device="cpu")
    exe(torch.randn(3, 4), torch.tensor([0, 1, 1]))       # non-zero counts to restore
    before = exe.session.state["counts"].clone()
    assert _until_capture(exe, torch.randn(3, 4), torch.tensor([2, 2, 7]), fake_cuda, **kw) == (2, True)
    assert torch.equal(exe.session.state["counts"], before)


@pytest.mark.parametrize("wait", [True, False])
def test_warm_cache_captures_after_one_warm_up(histogram, fake_cuda, wait):
    """Nothing deferred (every kernel cached): one warm-up, no wait, on to the capture, as before."""
    exe = ostinato.compile(histogram[1], device="cpu")
    got = _until_capture(exe, torch.randn(3, 4), torch.tensor([2, 2, 7]), fake_cuda, deferring=False, wait=wait)
    assert got == (1, False)


def test_capture_cuda_graph_without_wait_gives_up_with_the_state_restored(histogram, fake_cuda):
    exe = ostinato.compile(histogram[1], device="cpu")
    exe(torch.randn(3, 4), torch.tensor([0, 1, 1]))
    before = exe.session.state["counts"].clone()
    with pytest.raises(CompilesInFlight) as e:
        _until_capture(exe, torch.randn(3, 4), torch.tensor([2, 2, 7]), fake_cuda, wait=False)
    assert e.value.deferred == 1 and not fake_cuda
    assert torch.equal(exe.session.state["counts"], before)


def _cold_case(case: str, cache_dir: str) -> dict:
    """tests/replay/cold_case.py in a fresh process: kernels cold in the process and in the cache."""
    p = subprocess.run([sys.executable, os.path.join(HERE, "cold_case.py"), case, cache_dir],
                       capture_output=True, text=True, timeout=900)
    lines = p.stdout.strip().splitlines()
    assert lines, f"{case}: no result (rc {p.returncode}): {p.stderr[-3000:]}"
    return json.loads(lines[-1])


@pytest.mark.cuda
@pytest.mark.parametrize("case", ["decoder", "buckets"])
def test_cold_cache_on_cuda_answers_step_by_step_then_captures(case, tmp_path):
    """On the GPU: calls made while compiles are held back give eager's outputs and states with no capture
    stored (uncaptured_calls counts them); once the compiles are done the next call captures and the
    later ones replay, still equal to eager (a KV cache across the transition; buckets; an input
    written in place)."""
    res = _cold_case(case, str(tmp_path / "cache"))
    assert res["ok"], res


def test_static_inputs_never_hand_out_another_shapes_buffers(cold):
    """Shape A captured, then shape B's first call goes uncaptured: static_inputs() raises (it named A's
    buffers before, found by review), and gives B's once B is captured."""
    model, prog = counting_row_mlp()
    exe = ostinato.compile(prog, device="cpu", replay=True)
    cold.compiling = False
    exe(torch.randn(3, 8))
    assert exe.static_inputs()[0].shape == (3, 8)
    cold.compiling = True
    exe(torch.randn(5, 8))
    assert exe.stats()["uncaptured_calls"] == 1
    with pytest.raises(ReplayError, match="uncaptured_calls"):
        exe.static_inputs()
    exe(torch.randn(5, 8))
    assert exe.static_inputs()[0].shape == (5, 8)
