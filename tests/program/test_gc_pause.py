"""ir/bulk.py: load and compile hold Python's cyclic collector off while they run, and leave it as they
found it (on, off, after an error, or with OSTINATO_GC_PAUSE=0 not touched at all)."""
from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

import ostinato
from ostinato.ir.bulk import paused_gc as paused
from ostinato.program import reader


@pytest.fixture
def saved(tmp_path):
    path = str(tmp_path / "m.ost")
    ostinato.export(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), (torch.randn(2, 8),)).save(path)
    return path


@pytest.fixture(autouse=True)
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_load_runs_with_the_collector_off_and_turns_it_back_on(saved, monkeypatch):
    seen = []
    monkeypatch.setattr(reader, "DECODED_HOOKS", [lambda g: seen.append(gc.isenabled())])
    ostinato.load(saved)
    assert seen == [False] and gc.isenabled()


def test_compile_runs_with_the_collector_off(saved, monkeypatch):
    from ostinato.runtime import executable
    seen = []
    real = executable.fold_constants

    def spy(*a, **k):
        seen.append(gc.isenabled())
        return real(*a, **k)
    monkeypatch.setattr(executable, "fold_constants", spy)
    exe = ostinato.compile(ostinato.load(saved), "cpu", cache=False)
    assert seen and not any(seen) and gc.isenabled()
    x = torch.randn(2, 8)
    assert exe(x).shape == (2, 8)


def test_a_failed_load_turns_it_back_on(saved, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("decode failed")
    monkeypatch.setattr(reader, "cached_decode", broken)
    with pytest.raises(RuntimeError, match="decode failed"):
        ostinato.load(saved)
    assert gc.isenabled()


def test_the_callers_choice_stays(saved, monkeypatch):
    gc.disable()
    ostinato.load(saved)
    assert not gc.isenabled()          # off before: left off
    gc.enable()
    with paused():
        with paused():
            assert not gc.isenabled()
        assert not gc.isenabled()      # the outer pause still holds
    assert gc.isenabled()
    monkeypatch.setenv("OSTINATO_GC_PAUSE", "0")
    seen = []
    monkeypatch.setattr(reader, "DECODED_HOOKS", [lambda g: seen.append(gc.isenabled())])
    ostinato.load(saved)
    assert seen == [True]
