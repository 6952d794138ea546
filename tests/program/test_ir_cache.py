"""The decoded-program cache: a second load of the same file builds the same graph from the cache
instead of walking the FlatBuffer, and a damaged entry only costs the walk."""
from __future__ import annotations

import logging

import pytest
import torch

import ostinato
from ostinato.cache import Cache, set_cache
from ostinato.cache.memory import MemoryTier
from ostinato.program import ir_cache, reader
from helpers import assert_same
from program.models import AllDtypes, Tied, WithConstants, tiny_decoder_program


@pytest.fixture
def fresh_cache():
    cache = Cache([MemoryTier(64 << 20)])
    set_cache(cache)
    yield cache
    set_cache(None)


def _programs():
    yield "tiny_decoder_dynamic", tiny_decoder_program()[1]
    yield "all_dtypes", ostinato.export(AllDtypes(), (torch.randn(3, 4),))
    yield "tied", ostinato.export(Tied(), (torch.randint(0, 10, (2, 3)),))
    yield "constants", ostinato.export(WithConstants(), (torch.randn(2, 3), 3, "fast"))


def _describe(prog) -> tuple:
    g = prog.graph
    return (str(prog), [(s.name, s.kind, s.index, s.value) for s in prog.inputs], prog.hints, prog.info,
            str(prog.in_spec), str(prog.out_spec), [v.slot for v in g.constants + g.inputs + g.state],
            sorted(g.symbols.items()), [(n.op, n.name, n.source) for n in g.nodes],
            {k: (t.dtype, tuple(t.shape)) for k, t in prog.weights.items()})


def test_cached_decode_builds_the_same_program(tmp_path, fresh_cache, monkeypatch):
    # A file younger than the racy window is hashed but not recorded (ir_cache.RACY_NS): the second load
    # would then record it, a put of its own, whenever the window ends between the two loads.
    from ostinato.program import ir_cache
    monkeypatch.setattr(ir_cache, "RACY_NS", 0)
    monkeypatch.setattr(ir_cache, "RACY_WHOLE_SECONDS_NS", 0)
    for name, prog in _programs():
        path = tmp_path / f"{name}.ost"
        prog.save(path)
        assert fresh_cache.stats()["memory"]["puts"] >= 1        # save warms the cache ...
        fresh_cache.clear()                                      # ... dropped: the first load walks the FlatBuffer
        first = ostinato.load(path)
        puts = fresh_cache.stats()["memory"]["puts"]
        second = ostinato.load(path)
        assert fresh_cache.stats()["memory"]["puts"] == puts, f"{name}: the second load stored anew"
        assert _describe(second) == _describe(first), name
        # and the weights are the file's own mapping, not copies held by the cache
        for k, t in second.weights.items():
            assert torch.equal(t, first.weights[k])


def test_second_load_runs_like_eager(tmp_path, fresh_cache):
    model, prog = tiny_decoder_program(seed=3)
    prog.save(tmp_path / "m.ost")          # fills the decoded-program cache
    hits = fresh_cache.stats()["memory"]["hits"]
    loaded = ostinato.load(tmp_path / "m.ost", verify=False)
    assert fresh_cache.stats()["memory"]["hits"] == hits + 1
    exe = ostinato.compile(loaded, cache=False)
    pos = 0
    for n in (3, 1, 1):   # a prompt, then decode steps: both KV caches advance alike
        ids, positions = torch.randint(0, 64, (1, n)), torch.arange(pos, pos + n)
        pos += n
        with torch.no_grad():
            assert_same(exe(ids, positions), model(ids, positions))


def test_a_damaged_entry_is_a_miss(tmp_path, fresh_cache, caplog):
    _, prog = tiny_decoder_program()
    path = tmp_path / "m.ost"
    prog.save(path)
    want = _describe(ostinato.load(path))
    header, _ = reader.read_header(path)
    fresh_cache.put(ir_cache.ir_key(header.fb_sha256), b'{"symbols": [["s0", 1, 8, ""]], "values": 7}')
    with caplog.at_level(logging.WARNING, logger="ostinato"):
        again = ostinato.load(path)
    assert _describe(again) == want
    assert "discarding decoded program" in caplog.text


def test_arguments_of_every_kind_round_trip():
    from ostinato.ir import Graph, TensorMeta
    g = Graph()
    x = g.new_value("x", TensorMeta(torch.float32, (2, 3)), "input")
    args = (x, [x, 1, 2.5, None, True, "s"], (3, -1), {"k": x, "dt": torch.bfloat16},
            torch.device("cpu"), torch.strided, torch.channels_last, float("inf"))
    blob = ir_cache._enc(list(args))
    back = ir_cache._dec(blob, {x.id: x})
    assert tuple(back) == args and type(back[2]) is tuple and type(back[1]) is list
    assert back[0] is x and back[3]["k"] is x
