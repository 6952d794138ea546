"""Sessions and threads: each session owns its state and its captures, so sessions on different threads
never share a buffer; with and without replay."""
from __future__ import annotations

import threading

import pytest
import torch

import ostinato
from helpers import BACKENDS, assert_same, host
from replay.replay_models import TINY_BATCH, accumulator, decode_inputs, snapshot, tiny, tiny_decoder

THREADS, CALLS = 4, 10


def run_threads(work, n: int = THREADS) -> dict:
    """Run ``work(i)`` on n threads started together; their results, re-raising the first failure."""
    barrier = threading.Barrier(n)
    results: dict = {}
    errors: list = []

    def body(i):
        try:
            barrier.wait(timeout=30)
            results[i] = work(i)
        except BaseException as e:  # noqa: BLE001 - reported to the test below
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("replay", [True, False], ids=["replay", "step"])
@pytest.mark.parametrize("device", BACKENDS)
def test_threads_each_with_a_session_count_independently(replay, device):
    _, prog = accumulator()
    exe = ostinato.compile(prog, device=device, replay=replay)

    def work(i):
        session = exe.new_session()
        return [float(session(torch.ones(2, 3))) for _ in range(CALLS)]

    results = run_threads(work)
    expected = [6.0 * n for n in range(1, CALLS + 1)]
    for i in range(THREADS):
        assert results[i] == expected, f"thread {i}: {results[i]}"
    assert float(host(exe.session.state["total"])) == 0.0, "the executable's own session was touched"
    if replay:
        stats = exe.stats()
        assert stats["captures"] == THREADS and stats["replays"] == THREADS * (CALLS - 1)


@pytest.mark.parametrize("replay", [True, False], ids=["replay", "step"])
@pytest.mark.parametrize("device", BACKENDS)
def test_threads_with_different_inputs_never_mix(replay, device):
    """Thread i adds (i + 1) * 6 per call: a buffer shared between sessions would show another
    thread's numbers."""
    _, prog = accumulator()
    exe = ostinato.compile(prog, device=device, replay=replay)

    def work(i):
        session = exe.new_session()
        x = torch.full((2, 3), float(i + 1))
        return [float(session(x)) for _ in range(CALLS)]

    results = run_threads(work)
    for i in range(THREADS):
        assert results[i] == [6.0 * (i + 1) * n for n in range(1, CALLS + 1)], f"thread {i}: {results[i]}"


@pytest.mark.parametrize("device", BACKENDS)
def test_tiny_decoder_sessions_on_threads_match_sequential_step_by_step(device):
    """Each thread decodes its own token stream in its own session (capturing concurrently); results and
    KV caches equal those of step-by-step sessions run one after another."""
    model, prog = tiny_decoder()
    steps = 4
    gen = torch.Generator().manual_seed(21)
    streams = [[decode_inputs(s, TINY_BATCH, tiny.VOCAB, gen) for s in range(steps)] for _ in range(3)]
    step_exe = ostinato.compile(prog, device=device)
    expected, expected_state = [], []
    for stream in streams:
        session = step_exe.new_session()
        expected.append([snapshot(session(*args)) for args in stream])
        expected_state.append(session.state)

    rep = ostinato.compile(prog, device=device, replay=True)

    def work(i):
        session = rep.new_session()
        return [snapshot(session(*args)) for args in streams[i]], session

    results = run_threads(work, n=len(streams))
    for i in range(len(streams)):
        outs, session = results[i]
        for s in range(steps):
            assert_same(outs[s], expected[i][s], msg=f"thread {i} step {s}:")
        for name, t in expected_state[i].items():
            assert_same(host(session.state[name]), host(t), msg=f"thread {i} state {name}:")
    assert not torch.equal(expected[0][-1], expected[1][-1])


@pytest.mark.parametrize("device", BACKENDS)
def test_sessions_capture_separately_and_reset_in_place(device):
    _, prog = accumulator()
    exe = ostinato.compile(prog, device=device, replay=True)
    a, b = exe.new_session(), exe.new_session()
    ones = torch.ones(2, 3)
    assert [float(a(ones)) for _ in range(3)] == [6.0, 12.0, 18.0]
    assert float(b(2 * ones)) == 12.0
    assert exe.stats()["captures"] == 2   # one per session
    a.reset()
    assert float(a(ones)) == 6.0          # the capture survives a reset: state is reset in place
    assert float(b(ones)) == 18.0
    stats = exe.stats()
    assert (stats["captures"], stats["replays"]) == (2, 4)
    assert host(a.state["total"]).data_ptr() != host(b.state["total"]).data_ptr()


class Leaky(torch.nn.Module):
    """State that every call reads and writes (a decaying sum and a counter), so a call that saw another
    session's buffer, or ran interleaved with one on a shared temporary, changes every later output."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("h", torch.zeros(2, 8))
        self.register_buffer("n", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        self.h.mul_(0.5).add_(torch.tanh(self.lin(x)))
        self.n.add_(1)
        return self.h.sum(-1) * self.n, self.h.clone()


@pytest.mark.parametrize("replay", [True, False], ids=["replay", "step"])
@pytest.mark.parametrize("device", BACKENDS)
def test_eight_threads_thousand_calls_each_equal_serial_runs(replay, device):
    """8 threads x 1,000 calls, each thread on its own session of one stateful executable with its own
    random inputs: every output equals (bitwise) the same stream run serially in a fresh session."""
    threads, calls = 8, 1000
    torch.manual_seed(7)
    prog = ostinato.export(Leaky(), (torch.randn(2, 8),))
    exe = ostinato.compile(prog, device=device, replay=replay)
    streams = [torch.randn(calls, 2, 8, generator=torch.Generator().manual_seed(100 + i)) for i in range(threads)]

    def work(i):
        session = exe.new_session()
        return [snapshot(session(streams[i][c])) for c in range(calls)], session

    results = run_threads(work, n=threads)
    serial = ostinato.compile(prog, device=device, replay=replay)
    for i in range(threads):
        session = serial.new_session()
        outs, threaded = results[i]
        for c in range(calls):
            ref = session(streams[i][c])
            for got, want in zip(outs[c], ref):
                assert torch.equal(got, want), f"thread {i} call {c}"
        assert int(host(threaded.state["n"])) == calls
        assert torch.equal(host(threaded.state["h"]), host(session.state["h"]))
    assert int(host(exe.session.state["n"])) == 0, "the executable's own session was touched"
    if replay:
        assert exe.stats()["captures"] == threads and exe.stats()["replays"] == threads * (calls - 1)
