"""Shape buckets: ``compile(..., replay=True, buckets={"batch": "pow2" | [sizes]})`` pads a batch-like
dynamic dim up to a ladder rung, so one capture serves every size up to it; outputs are cut back to
the real size. ``runner.capture_buckets(session)`` captures every rung up front, largest first."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.export import Dim

import ostinato
from helpers import BACKENDS, host, assert_same
from ostinato.errors import InputError, OstinatoError
from ostinato.replay import bucket_ladders
from replay.replay_models import RowMLP, counting_row_mlp, eager, fresh, row_mlp

SIZES = (3, 4, 5, 7, 8, 16)


@pytest.mark.parametrize("device", BACKENDS)
def test_pow2_buckets_give_eager_results_and_count(device):
    model, prog = row_mlp(dynamic=True)
    exe = ostinato.compile(prog, device=device, replay=True, buckets={"batch": "pow2"})
    (symbol,) = prog.graph.symbols
    assert exe.runner.ladders == {symbol: [1, 2, 4, 8, 16]}
    torch.manual_seed(1)
    for b in SIZES:
        x = torch.randn(b, 8)
        out = exe(x)
        assert out.shape == (b, 4)
        assert_same(out, eager(model, x), msg=f"batch {b}:")
    # Rungs used: 4 (for 3, 4), 8 (for 5, 7, 8), 16. Padded calls: 3, 5, 7.
    stats = exe.stats()
    assert stats["captures"] == 3
    assert stats["bucket_hits"] == 3
    assert (stats["plan_misses"], stats["plan_hits"], stats["replays"]) == (3, 3, 3)
    assert [r.signature for r in exe.memory_report()] == [f"{symbol}=4", f"{symbol}=8", f"{symbol}=16"]


@pytest.mark.parametrize("device", BACKENDS)
def test_padding_is_zeroed_between_calls(device):
    """A full batch, then a smaller one on the same rung: the rows past the real size are zero again, so
    stale rows of the previous call cannot leak (into a reduction, say), and the real rows are right."""
    model, prog = row_mlp(dynamic=True)
    exe = ostinato.compile(prog, device=device, replay=True, buckets={"batch": "pow2"})
    torch.manual_seed(2)
    exe(torch.randn(8, 8))
    x = torch.randn(5, 8)
    assert_same(exe(x), eager(model, x))
    (static,) = exe.static_inputs()
    assert static.shape == (8, 8)
    assert torch.equal(static[:5], x)
    assert torch.equal(static[5:], torch.zeros(3, 8))


@pytest.mark.parametrize("device", BACKENDS)
def test_outputs_of_a_bucketed_call_are_cut_views(device):
    model, prog = row_mlp(dynamic=True)
    exe = ostinato.compile(prog, device=device, replay=True, buckets={"batch": [8]})
    torch.manual_seed(3)
    a = exe(torch.randn(5, 8))
    x = torch.randn(5, 8)
    b = exe(x)
    assert b is a, "the cut view of one real size is made once"
    assert_same(b, eager(model, x))
    c = exe(torch.randn(6, 8))
    assert c.shape == (6, 4) and c.data_ptr() == b.data_ptr()   # same captured buffer, cut at 6
    assert exe.stats()["captures"] == 1 and exe.stats()["bucket_hits"] == 3


@pytest.mark.parametrize("device", BACKENDS)
def test_explicit_ladder_and_a_batch_above_it(device):
    model, prog = row_mlp(dynamic=True)
    exe = ostinato.compile(prog, device=device, replay=True, buckets={"batch": [4, 2]})
    (symbol,) = prog.graph.symbols
    assert exe.runner.ladders == {symbol: [2, 4]}
    torch.manual_seed(4)
    for b in (1, 3, 4, 2):
        x = torch.randn(b, 8)
        assert_same(exe(x), eager(model, x), msg=f"batch {b}:")
    # 5 is inside the exported range [1, 16] but above the ladder.
    with pytest.raises(InputError, match=r"is 5, above the largest bucket 4; add a larger size to buckets"):
        exe(torch.randn(5, 8))
    assert exe.stats()["captures"] == 2


@pytest.mark.parametrize("device", BACKENDS)
def test_buckets_by_symbol_name(device):
    model, prog = row_mlp(dynamic=True)
    (symbol,) = prog.graph.symbols
    exe = ostinato.compile(prog, device=device, replay=True, buckets={symbol: [16]})
    x = torch.randn(9, 8)
    assert_same(exe(x), eager(model, x))
    assert exe.stats()["bucket_hits"] == 1


@pytest.mark.parametrize("device", BACKENDS)
def test_capture_buckets_largest_first_then_no_captures(device):
    model, prog = row_mlp(dynamic=True)
    exe = ostinato.compile(prog, device=device, replay=True, buckets={"batch": "pow2"})
    (symbol,) = prog.graph.symbols
    assert exe.runner.capture_buckets(exe.session) == 5
    assert [r.signature for r in exe.memory_report()] == [f"{symbol}={n}" for n in (16, 8, 4, 2, 1)]
    assert exe.stats()["captures"] == 5
    torch.manual_seed(5)
    for b in (*SIZES, 1, 2, 11):
        x = torch.randn(b, 8)
        assert_same(exe(x), eager(model, x), msg=f"batch {b}:")
    stats = exe.stats()
    assert stats["captures"] == 5 and stats["plan_misses"] == 0
    assert stats["plan_hits"] == stats["replays"] == len(SIZES) + 3
    assert exe.runner.capture_buckets(exe.session) == 0
    assert exe.stats()["captures"] == 5
    # A new session has captured nothing yet; one that already captured a rung by a call skips it.
    assert exe.runner.capture_buckets(exe.new_session()) == 5
    assert exe.stats()["captures"] == 10
    session = exe.new_session()
    x = torch.randn(7, 8)
    assert_same(session(x), eager(model, x))
    assert exe.runner.capture_buckets(session) == 4
    assert exe.stats()["captures"] == 15


@pytest.mark.parametrize("device", BACKENDS)
def test_capture_buckets_leaves_state_as_it_was(device):
    """Every capture is a call (here: total += sum + 1); capture_buckets restores the session's state."""
    model, prog = counting_row_mlp()
    ref = fresh(model)
    exe = ostinato.compile(prog, device=device, replay=True, buckets={"batch": [4, 16]})
    assert exe.runner.capture_buckets(exe.session) == 2
    assert float(host(exe.session.state["total"])) == 0.0
    torch.manual_seed(6)
    for b in (3, 12, 4):
        x = torch.randn(b, 8)
        assert_same(exe(x), eager(ref, x), msg=f"batch {b}:")
    assert exe.stats()["captures"] == 2


@pytest.mark.parametrize("device", BACKENDS)
def test_capture_buckets_needs_every_dynamic_dim_bucketed(device):
    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = RowMLP()

        def forward(self, x):
            return self.mlp(x)

    model = Tokens().eval()
    prog = ostinato.export(model, (torch.randn(2, 5, 8),),
                           dynamic_shapes=({0: Dim("batch", min=1, max=8), 1: Dim("seq", min=1, max=32)},))
    exe = ostinato.compile(prog, device=device, replay=True, buckets={"batch": "pow2"})
    seq_symbol = next(n for n, r in prog.graph.symbols.items() if r.label == "seq")
    with pytest.raises(OstinatoError, match=rf"capture_buckets needs a bucket ladder for every dynamic dim; "
                                            rf"missing: {seq_symbol}"):
        exe.runner.capture_buckets(exe.session)
    # Calls still work: batch padded, seq captured exactly.
    torch.manual_seed(7)
    for b, t in ((3, 5), (4, 5), (3, 6)):
        x = torch.randn(b, t, 8)
        assert_same(exe(x), eager(model, x), msg=f"batch {b} seq {t}:")
    assert exe.stats()["captures"] == 2 and exe.stats()["bucket_hits"] == 2


@pytest.mark.parametrize("device", BACKENDS)
def test_unknown_dim_name_lists_the_dims(device):
    _, prog = row_mlp(dynamic=True)
    (symbol,) = prog.graph.symbols
    with pytest.raises(OstinatoError, match=rf"buckets names 'bacth', which is not a dynamic dim of this program; "
                                            rf"its dynamic dims are: batch, {symbol}"):
        ostinato.compile(prog, device=device, replay=True, buckets={"bacth": "pow2"})
    _, static = row_mlp(dynamic=False)
    with pytest.raises(OstinatoError, match=r"dynamic dims are: none \(the program is static\)"):
        ostinato.compile(static, device=device, replay=True, buckets={"batch": "pow2"})


@pytest.mark.parametrize("sizes", [[0, 4], [4, 17], []])
@pytest.mark.parametrize("device", BACKENDS)
def test_ladder_sizes_outside_the_range(sizes, device):
    _, prog = row_mlp(dynamic=True)
    with pytest.raises(OstinatoError, match=r"buckets for 'batch': sizes .* are outside its range \[1, 16\]"):
        ostinato.compile(prog, device=device, replay=True, buckets={"batch": sizes})


@pytest.mark.parametrize("device", BACKENDS)
def test_pow2_ladder_ends_at_the_maximum(device):
    _, prog = row_mlp(dynamic=True, max_batch=12)
    (symbol,) = prog.graph.symbols
    assert bucket_ladders(prog, {"batch": "pow2"}) == {symbol: [1, 2, 4, 8, 12]}
    assert bucket_ladders(prog, {"batch": None}) == {symbol: [1, 2, 4, 8, 12]}
    assert bucket_ladders(prog, {"batch": (6, 3, 6)}) == {symbol: [3, 6]}
    assert bucket_ladders(prog, None) == {}
