"""``exe.stats()`` counts exactly, and ``exe.static_inputs()`` are the captured buffers themselves:
written in place and passed back, they replay with no copy."""
from __future__ import annotations

import torch

import ostinato
from helpers import assert_same
from replay.replay_models import accumulator, eager, row_mlp

REPLAY_KEYS = {"captures", "replays", "bucket_hits", "plan_hits", "plan_misses", "uncaptured_calls",
               "capture_seconds"}


def test_exact_counts_for_two_shape_signatures_without_buckets():
    """A dynamic batch and no buckets: one exact capture per size; every other call replays."""
    model, prog = row_mlp(dynamic=True)
    exe = ostinato.compile(prog, device="cpu", replay=True)
    (symbol,) = prog.graph.symbols
    stats = exe.stats()
    assert {k: stats[k] for k in REPLAY_KEYS} == dict.fromkeys(REPLAY_KEYS, 0)
    torch.manual_seed(1)
    sizes = (2, 2, 3, 2, 3, 3, 2)
    for b in sizes:
        x = torch.randn(b, 8)
        assert_same(exe(x), eager(model, x), msg=f"batch {b}:")
    stats = exe.stats()
    assert stats["captures"] == 2 and stats["plan_misses"] == 2
    assert stats["plan_hits"] == stats["replays"] == len(sizes) - 2
    assert stats["bucket_hits"] == 0
    assert stats["capture_seconds"] > 0
    assert stats["launches"] == len(exe.launches)
    assert [r.signature for r in exe.memory_report()] == [f"{symbol}=2", f"{symbol}=3"]


def test_stats_without_replay_have_no_replay_counts():
    _, prog = row_mlp(dynamic=True)
    exe = ostinato.compile(prog, device="cpu")
    exe(torch.randn(3, 8))
    stats = exe.stats()
    assert not REPLAY_KEYS & set(stats)
    assert stats["launches"] == len(exe.launches) > 0
    assert exe.memory_report() == []


def test_explicit_graphs_count_in_memory_report_not_in_stats():
    _, prog = row_mlp(dynamic=True)
    exe = ostinato.compile(prog, device="cpu", replay=True)
    g = ostinato.Graph()
    with ostinato.graph(g):
        exe(torch.randn(3, 8))
    g.replay()
    assert exe.stats()["captures"] == 0 and exe.stats()["replays"] == 0
    assert exe.memory_report() == [g.memory_report()]


def test_static_inputs_replay_without_copy():
    model, prog = row_mlp(dynamic=False)
    exe = ostinato.compile(prog, device="cpu", replay=True)
    torch.manual_seed(2)
    x = torch.randn(4, 8)
    exe(x)
    static = exe.static_inputs()
    assert isinstance(static, tuple) and len(static) == 1
    assert static[0] is not x and torch.equal(static[0], x), "the static input holds the last call's values"
    before = exe.stats()
    for i in range(3):
        new = torch.randn(4, 8)
        static[0].copy_(new)
        out = exe(*static)
        assert_same(out, eager(model, new), msg=f"call {i}:")
        assert exe.static_inputs()[0] is static[0], "static_inputs() handed out another buffer"
    after = exe.stats()
    assert after["plan_hits"] == before["plan_hits"] + 3
    assert after["replays"] == before["replays"] + 3
    assert after["captures"] == before["captures"] == 1


def test_static_inputs_are_not_copied(monkeypatch):
    """A fresh input is copied into the static one before a replay; the static input itself is not."""
    model, prog = row_mlp(dynamic=False)
    exe = ostinato.compile(prog, device="cpu", replay=True)
    exe(torch.randn(4, 8))
    (static,) = exe.static_inputs()
    writes = []
    real_copy = torch.Tensor.copy_

    def counting_copy(self, src, *args, **kwargs):
        if self.data_ptr() == static.data_ptr():
            writes.append(src)
        return real_copy(self, src, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "copy_", counting_copy)
    x = torch.randn(4, 8)
    assert_same(exe(x), eager(model, x))
    assert len(writes) == 1 and writes[0] is x
    writes.clear()
    with torch.no_grad():
        static.mul_(-1.0)
    assert_same(exe(static), eager(model, -x))
    assert writes == []


def test_static_inputs_of_a_session():
    _, prog = accumulator()
    exe = ostinato.compile(prog, device="cpu", replay=True)
    session = exe.new_session()
    session(torch.ones(2, 3))
    (static,) = exe.static_inputs(session)
    static.fill_(2.0)
    assert float(session(static)) == 6.0 + 12.0
    assert float(session(static)) == 6.0 + 24.0
    assert exe.stats()["plan_hits"] == 2
