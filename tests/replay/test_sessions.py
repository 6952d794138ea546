"""Sessions and threads: each session owns its state and its captures, so sessions on different threads
never share a buffer; with and without replay."""
from __future__ import annotations

import threading

import pytest
import torch

import ostinato
from helpers import assert_same
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
def test_threads_each_with_a_session_count_independently(replay):
    _, prog = accumulator()
    exe = ostinato.compile(prog, device="cpu", replay=replay)

    def work(i):
        session = exe.new_session()
        return [float(session(torch.ones(2, 3))) for _ in range(CALLS)]

    results = run_threads(work)
    expected = [6.0 * n for n in range(1, CALLS + 1)]
    for i in range(THREADS):
        assert results[i] == expected, f"thread {i}: {results[i]}"
    assert float(exe.session.state["total"]) == 0.0, "the executable's own session was touched"
    if replay:
        stats = exe.stats()
        assert stats["captures"] == THREADS and stats["replays"] == THREADS * (CALLS - 1)


@pytest.mark.parametrize("replay", [True, False], ids=["replay", "step"])
def test_threads_with_different_inputs_never_mix(replay):
    """Thread i adds (i + 1) * 6 per call: a buffer shared between sessions would show another
    thread's numbers."""
    _, prog = accumulator()
    exe = ostinato.compile(prog, device="cpu", replay=replay)

    def work(i):
        session = exe.new_session()
        x = torch.full((2, 3), float(i + 1))
        return [float(session(x)) for _ in range(CALLS)]

    results = run_threads(work)
    for i in range(THREADS):
        assert results[i] == [6.0 * (i + 1) * n for n in range(1, CALLS + 1)], f"thread {i}: {results[i]}"


def test_tiny_decoder_sessions_on_threads_match_sequential_step_by_step():
    """Each thread decodes its own token stream in its own session (capturing concurrently); results and
    KV caches equal those of step-by-step sessions run one after another."""
    model, prog = tiny_decoder()
    steps = 4
    gen = torch.Generator().manual_seed(21)
    streams = [[decode_inputs(s, TINY_BATCH, tiny.VOCAB, gen) for s in range(steps)] for _ in range(3)]
    step_exe = ostinato.compile(prog, device="cpu")
    expected, expected_state = [], []
    for stream in streams:
        session = step_exe.new_session()
        expected.append([snapshot(session(*args)) for args in stream])
        expected_state.append(session.state)

    rep = ostinato.compile(prog, device="cpu", replay=True)

    def work(i):
        session = rep.new_session()
        return [snapshot(session(*args)) for args in streams[i]], session

    results = run_threads(work, n=len(streams))
    for i in range(len(streams)):
        outs, session = results[i]
        for s in range(steps):
            assert_same(outs[s], expected[i][s], msg=f"thread {i} step {s}:")
        for name, t in expected_state[i].items():
            assert_same(session.state[name], t, msg=f"thread {i} state {name}:")
    assert not torch.equal(expected[0][-1], expected[1][-1])


def test_sessions_capture_separately_and_reset_in_place():
    _, prog = accumulator()
    exe = ostinato.compile(prog, device="cpu", replay=True)
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
    assert a.state["total"].data_ptr() != b.state["total"].data_ptr()
