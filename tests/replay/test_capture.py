"""The explicit capture API (``ostinato.Graph``, ``ostinato.graph``) and what a capture is: one real
call whose effects (outputs, state and input writes) happen once, then replays that repeat them."""
from __future__ import annotations

import threading

import pytest
import torch

import ostinato
from helpers import BACKENDS, host, assert_same
from replay.replay_models import MutatesInput, accumulator, eager, fresh, row_mlp


@pytest.mark.parametrize("device", BACKENDS)
def test_capture_is_one_call_and_each_replay_one_more(device):
    model, prog = accumulator()
    ref = fresh(model)
    exe = ostinato.compile(prog, device=device)
    torch.manual_seed(1)
    x = torch.rand(2, 3) + 0.5
    g = ostinato.Graph()
    with ostinato.graph(g):
        out = exe(x)
    expected = eager(ref, x)
    assert_same(out, expected, msg="capture:")
    assert_same(host(exe.session.state["total"]), ref.total)
    for i in range(3):
        new = torch.rand(2, 3) + 0.5
        g.replay(new)
        assert_same(out, eager(ref, new), msg=f"replay {i}:")
        assert_same(host(exe.session.state["total"]), ref.total, msg=f"state after replay {i}:")
    # Plain calls of the same executable and session keep working, on the same state.
    y = torch.rand(2, 3) + 0.5
    assert_same(exe(y), eager(ref, y))
    assert g.replays == 3


@pytest.mark.parametrize("device", BACKENDS)
def test_graph_holds_the_capture_and_reports_it(device):
    _, prog = row_mlp(dynamic=False)
    exe = ostinato.compile(prog, device=device)
    g = ostinato.Graph()
    assert "empty" in repr(g)
    with ostinato.graph(g) as entered:
        assert entered is g
        out = exe(torch.randn(4, 8))
    assert g.outputs is out
    assert "replays=0" in repr(g)
    if device == "mlx":     # the plan compiled with mx.compile, described
        assert "mx.compile" in g.source
    else:
        assert g.source.startswith("def replay_cpu():") and "out=" in g.source
    report = g.memory_report()
    assert report in exe.memory_report()
    assert 0 < report.arena_bytes <= report.naive_bytes and report.temporaries >= 2


@pytest.mark.parametrize("device", BACKENDS)
def test_calls_outside_the_block_are_not_captured(device):
    model, prog = row_mlp(dynamic=False)
    exe = ostinato.compile(prog, device=device)
    torch.manual_seed(2)
    x = torch.randn(4, 8)
    g = ostinato.Graph()
    with ostinato.graph(g):
        out = exe(x)
    kept = out.clone()
    y = torch.randn(4, 8)
    other = exe(y)   # step by step: a new tensor, the capture's output untouched
    assert other is not out
    assert torch.equal(out, kept)
    assert_same(other, eager(model, y))


@pytest.mark.parametrize("device", BACKENDS)
def test_two_graphs_of_one_executable_replay_independently(device):
    model, prog = row_mlp(dynamic=True)
    exe = ostinato.compile(prog, device=device)
    torch.manual_seed(3)
    a, b = torch.randn(3, 8), torch.randn(5, 8)
    ga, gb = ostinato.Graph(), ostinato.Graph()
    with ostinato.graph(ga):
        out_a = exe(a)
    with ostinato.graph(gb):
        out_b = exe(b)
    for _ in range(2):
        a.copy_(torch.randn(3, 8))
        b.copy_(torch.randn(5, 8))
        gb.replay()
        ga.replay()
        assert_same(out_a, eager(model, a))
        assert_same(out_b, eager(model, b))
    assert out_a.shape == (3, 4) and out_b.shape == (5, 4)


@pytest.mark.parametrize("device", BACKENDS)
def test_explicit_capture_writes_mutated_inputs_back(device):
    """A model that writes its input: the captured call and every replay write the static input, as
    eager writes its argument."""
    exe = ostinato.compile(ostinato.export(MutatesInput(), (torch.randn(5),)), device=device)
    torch.manual_seed(4)
    x = torch.randn(5)
    x0 = x.clone()
    g = ostinato.Graph()
    with ostinato.graph(g):
        out = exe(x)
    assert_same(x, 2 * x0)
    assert_same(out, 2 * x0 + 1)
    new = torch.randn(5)
    x.copy_(new)
    g.replay()
    assert_same(x, 2 * new)
    assert_same(out, 2 * new + 1)


@pytest.mark.parametrize("device", BACKENDS)
def test_step_by_step_writes_mutated_inputs_back(device):
    exe = ostinato.compile(ostinato.export(MutatesInput(), (torch.randn(5),)), device=device)
    torch.manual_seed(5)
    x = torch.randn(5)
    x0 = x.clone()
    assert_same(exe(x), 2 * x0 + 1)
    assert_same(x, 2 * x0)


@pytest.mark.parametrize("device", BACKENDS)
def test_replay_runner_writes_mutated_inputs_back(device):
    """Eager and step-by-step execution write the caller's tensor; replay=True must do the same, on the
    capturing call and on replays."""
    exe = ostinato.compile(ostinato.export(MutatesInput(), (torch.randn(5),)), device=device, replay=True)
    torch.manual_seed(6)
    for call in range(3):
        x = torch.randn(5)
        x0 = x.clone()
        out = exe(x)
        assert_same(out, 2 * x0 + 1, msg=f"call {call} output:")
        assert_same(x, 2 * x0, msg=f"call {call}: the input was not written")


@pytest.mark.parametrize("device", BACKENDS)
def test_capture_is_per_thread(device):
    """A capture open on one thread does not take another thread's calls."""
    model, prog = row_mlp(dynamic=False)
    exe = ostinato.compile(prog, device=device)
    torch.manual_seed(7)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    inside, done = threading.Event(), threading.Event()
    results: dict = {}

    def capture():
        g = ostinato.Graph()
        with ostinato.graph(g):
            inside.set()
            done.wait(timeout=30)
            results["captured"] = exe(x)
        results["graph"] = g

    t = threading.Thread(target=capture)
    t.start()
    assert inside.wait(timeout=30)
    try:
        results["plain"] = exe(y)   # another thread, while the capture is open
        plain_graph = ostinato.Graph()
        with ostinato.graph(plain_graph):   # and this thread may open its own capture meanwhile
            results["own"] = exe(y)
    finally:
        done.set()
        t.join(timeout=30)
    assert_same(results["plain"], eager(model, y))
    assert_same(results["own"], eager(model, y))
    assert plain_graph.captured is not None
    assert results["graph"].outputs is results["captured"]
    assert_same(results["captured"], eager(model, x))
