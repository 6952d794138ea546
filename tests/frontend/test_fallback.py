"""Ops ostinato lacks run through eager torch (fallback.* nodes) unless export(..., strict=True)."""
from __future__ import annotations

import copy
import logging
import os
import subprocess
import sys

import pytest
import torch
from torch.export import Dim

import ostinato
from ostinato.errors import MissingOpError, UnsupportedOpError
from ostinato.ir import get_op
from ostinato.ir.fallback import fallback_nodes, register_fallback, require_op
from ostinato.cache import set_cache
from ostinato.runtime import plan_cache
from frontend.fallback_ops import FALLBACK_OPS, model_and_input
from helpers import assert_same

HERE = os.path.dirname(os.path.abspath(__file__))


def _eager(model, x):
    with torch.no_grad():
        return model(x)


def test_custom_ops_fall_back_and_match_eager_with_and_without_replay(caplog):
    model, x = model_and_input(seed=1)
    with caplog.at_level(logging.WARNING, logger="ostinato"):
        prog = ostinato.export(copy.deepcopy(model), (x,))
    warnings = [r for r in caplog.records if "run through eager torch" in r.getMessage()]
    assert len(warnings) == 1                                    # one warning per export
    assert "ostinato_fb.center_on_host" in warnings[0].getMessage() and "strict=True" in warnings[0].getMessage()
    assert {n.op for n in prog.graph.nodes} >= FALLBACK_OPS
    assert any(n.op == "aten.linear" or n.op == "ost.linear" for n in prog.graph.nodes)  # the rest is ours
    plain = ostinato.compile(prog, device="cpu")
    replay = ostinato.compile(prog, device="cpu", replay=True)
    for step in range(4):
        x = torch.randn(3, 16) * (step + 1)
        ref = _eager(model, x)
        assert_same(plain(x), ref, msg=f"step {step} plain")
        assert_same(replay(x), ref, msg=f"step {step} replay")
    stats = replay.stats()
    assert stats["captures"] == 1 and stats["replays"] == 3


def test_dynamic_batch_with_fallback_ops_replays_each_shape():
    model, x = model_and_input(seed=2, batch=4)
    prog = ostinato.export(copy.deepcopy(model), (x,), dynamic_shapes=({0: Dim("batch", min=1, max=16)},))
    exe = ostinato.compile(prog, device="cpu", replay=True)
    for batch in (4, 7, 4, 2, 7):
        x = torch.randn(batch, 16)
        assert_same(exe(x), _eager(model, x), msg=f"batch {batch}")
    assert exe.stats()["captures"] == 3


def test_aten_op_outside_the_table_falls_back():
    class Bessel(torch.nn.Module):
        def forward(self, x):
            return torch.special.bessel_j0(x * 3).relu() + torch.i0(x)

    x = torch.randn(5, 6)
    prog = ostinato.export(Bessel(), (x,))
    ops = {n.op for n in prog.graph.nodes}
    assert {"fallback.aten.special_bessel_j0", "fallback.aten.i0"} <= ops
    assert "aten.relu" in ops
    exe = ostinato.compile(prog, device="cpu", replay=True)
    for _ in range(3):
        x = torch.randn(5, 6)
        assert_same(exe(x), Bessel()(x))
    reason = get_op("fallback.aten.i0").reason
    assert "no ostinato kernel for aten.i0" in reason and "ATen" in reason


def test_strict_refuses_unsupported_ops_naming_them():
    model, x = model_and_input()
    with pytest.raises(UnsupportedOpError) as info:
        ostinato.export(model, (x,), strict=True)
    names = {op for op, _ in info.value.ops}
    assert names == {"ostinato_fb.scale_shift", "ostinato_fb.center_on_host", "ostinato_fb.split_sign"}
    text = str(info.value)
    assert "fallback_ops.py" in text and "strict=False" in text


def test_higher_order_ops_still_raise_with_the_fix():
    class Cond(torch.nn.Module):
        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda t: t * 2, lambda t: t - 1, (x,))

    with pytest.raises(UnsupportedOpError) as info:
        ostinato.export(Cond(), (torch.randn(4),))
    assert [op for op, _ in info.value.ops] == ["higher_order.cond"]
    text = str(info.value)
    assert "Higher-order" in text and "Fix:" in text and "test_fallback.py" in text


def test_purity_follows_the_schema():
    assert get_op("fallback.ostinato_fb.scale_shift").pure            # functional custom op
    opdef = register_fallback(torch.ops.aten.add_.Tensor)            # writes its argument
    assert opdef.name == "fallback.aten.add_.Tensor" and not opdef.pure and opdef.category == "inplace"
    assert register_fallback(torch.ops.aten.add_.Tensor) is opdef     # registered once
    view = register_fallback(torch.ops.aten.diagonal.default)         # returns a view of its input
    assert not view.pure and view.category == "view"
    assert get_op("fallback.ostinato_fb.scale_shift").category == "fallback"


def test_unused_pure_fallback_is_removed_and_used_ones_are_kept_once():
    class Dup(torch.nn.Module):
        def forward(self, x):
            torch.ops.ostinato_fb.scale_shift(x, 3.0)                 # unused: dead code
            a = torch.ops.ostinato_fb.scale_shift(x, 2.0)
            b = torch.ops.ostinato_fb.scale_shift(x, 2.0)             # same call: merged
            return a + b

    x = torch.randn(6)
    prog = ostinato.export(Dup(), (x,))
    assert [n.op for n in prog.graph.nodes].count("fallback.ostinato_fb.scale_shift") == 1
    assert_same(ostinato.compile(prog)(x), Dup()(x))
    rows = fallback_nodes(prog.graph)
    assert len(rows) == 1 and rows[0][0] == "fallback.ostinato_fb.scale_shift"


def test_save_and_load_in_the_same_process(tmp_path):
    model, x = model_and_input(seed=3)
    prog = ostinato.export(copy.deepcopy(model), (x,))
    prog.save(tmp_path / "fb.ost")
    loaded = ostinato.load(tmp_path / "fb.ost")
    assert {n.op for n in loaded.graph.nodes} >= FALLBACK_OPS
    exe = ostinato.compile(loaded, device="cpu", replay=True)
    for _ in range(3):
        x = torch.randn(3, 16)
        assert_same(exe(x), _eager(model, x))


def test_unknown_ops_are_refused_with_the_fix():
    with pytest.raises(MissingOpError, match=r"no_such_lib::op is registered.*\n.*import the module"):
        require_op("fallback.no_such_lib.op", "node n")
    with pytest.raises(MissingOpError, match="unknown op 'ost.no_such_op'"):
        require_op("ost.no_such_op")
    assert get_op("fallback.load_library.x") is None                 # not an op namespace
    assert get_op("fallback.aten.__class__") is None


FRESH = """
import sys, torch, ostinato
from ostinato.errors import MissingOpError
d = sys.argv[1]
try:
    ostinato.load(d + "/fb.ost")
    print("LOADED WITHOUT THE OP")
except MissingOpError as e:
    print("MISSING:", str(e).replace("\\n", " | "))
sys.path.insert(0, sys.argv[2])
import fallback_ops  # registers ostinato_fb::* in this process
exe = ostinato.compile(ostinato.load(d + "/fb.ost"))
torch.save(exe(torch.load(d + "/x.pt")), d + "/out.pt")
print("SOURCE:", exe.plan_source)
"""


def test_load_in_a_fresh_process_needs_the_op_registered(tmp_path):
    model, x = model_and_input(seed=4)
    prog = ostinato.export(copy.deepcopy(model), (x,))
    prog.save(tmp_path / "fb.ost")
    x = torch.randn(3, 16)
    torch.save(x, tmp_path / "x.pt")
    # fills the disk plan cache the child shares (OSTINATO_CACHE_DIR): through the cache the environment
    # names and past this process's memo of plans (an earlier test may have set another cache, or left
    # the plan in the memo only: the child then compiled instead, seen once in a full parallel run)
    set_cache(None)
    plan_cache.memo.clear()
    ostinato.compile(prog)(x)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", FRESH, str(tmp_path), HERE], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in out.stdout.splitlines() if ": " in line)
    missing = lines["MISSING"]
    assert "ostinato_fb::" in missing and "is registered in this process" in missing
    assert "Fix: import the module that registers ostinato_fb::" in missing and "before ostinato.load" in missing
    assert lines["SOURCE"] == "cache"    # the cached plan's fallback ops resolved through torch.ops too
    assert_same(torch.load(tmp_path / "out.pt"), _eager(model, x))
