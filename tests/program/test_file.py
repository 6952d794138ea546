import copy
import os
import subprocess
import sys
import tracemalloc

import pytest
import torch

import ostinato
from ostinato.errors import ProgramFormatError
from ostinato.program import codegen, writer
from ostinato.program.format import (ChecksumError, InconsistentGraphError, LayoutError, NotAProgramError,
                                     SchemaVersionError, TruncatedError, SCHEMA_VERSION)
from helpers import assert_same
from program.models import ALL_DTYPES, AllDtypes, Tied, WithConstants, tiny_decoder_program


def save_load(prog, tmp_path, name="m.ost", **kw):
    path = tmp_path / name
    prog.save(path)
    return ostinato.load(path, **kw), path


def test_tiny_decoder_round_trip_runs_like_eager(tmp_path):
    model, prog = tiny_decoder_program()
    loaded, path = save_load(prog, tmp_path)
    exe = ostinato.compile(loaded)
    ref = copy.deepcopy(model)
    inputs = [(torch.randint(0, 64, (1, 3)), torch.arange(3))]
    inputs += [(torch.randint(0, 64, (1, 1)), torch.tensor([3 + i])) for i in range(5)]
    for args in inputs:
        with torch.no_grad():
            expected = ref(*args)
        assert_same(exe(*args), expected)
    assert str(loaded.graph) == str(prog.graph)
    assert {s.label for s in loaded.graph.symbols.values()} == {"T"}


def test_same_model_twice_and_save_load_save_are_byte_identical(tmp_path):
    _, a = tiny_decoder_program(seed=3)
    _, b = tiny_decoder_program(seed=3)
    a.save(tmp_path / "a.ost")
    b.save(tmp_path / "b.ost")
    first = (tmp_path / "a.ost").read_bytes()
    assert first == (tmp_path / "b.ost").read_bytes()
    ostinato.load(tmp_path / "a.ost").save(tmp_path / "c.ost")
    assert first == (tmp_path / "c.ost").read_bytes()
    _, c = tiny_decoder_program(seed=4)  # other weights, other bytes
    c.save(tmp_path / "d.ost")
    assert first != (tmp_path / "d.ost").read_bytes()


def test_every_dtype_round_trips_exactly(tmp_path):
    model = AllDtypes()
    prog = ostinato.export(model, (torch.randn(3, 4),))
    loaded, _ = save_load(prog, tmp_path)
    assert {t.dtype for t in loaded.weights.values()} == set(ALL_DTYPES)
    for name, t in prog.weights.items():
        assert loaded.weights[name].dtype == t.dtype and torch.equal(loaded.weights[name], t)
    x = torch.randn(3, 4)
    assert_same(ostinato.compile(loaded)(x), model(x))


def test_tied_weights_are_stored_once(tmp_path):
    model = Tied()
    prog = ostinato.export(model, (torch.randint(0, 512, (2, 5)),))
    loaded, path = save_load(prog, tmp_path)
    raw = 512 * 256 * 4
    assert raw < os.path.getsize(path) < 1.5 * raw
    assert sorted(loaded.weights) == ["embed.weight", "head.weight"]  # both names, one extent
    assert loaded.weights["embed.weight"].data_ptr() == loaded.weights["head.weight"].data_ptr()
    ids = torch.randint(0, 512, (2, 5))
    assert_same(ostinato.compile(loaded)(ids), model(ids))


def test_constant_inputs_and_outputs_round_trip(tmp_path):
    prog = ostinato.export(WithConstants(), (torch.randn(2, 3), 3, "fast"))
    loaded, _ = save_load(prog, tmp_path)
    x = torch.randn(2, 3)
    out = ostinato.compile(loaded)(x, 3, "fast")
    assert_same(out, WithConstants()(x, 3, "fast"))
    with pytest.raises(ostinato.errors.InputError, match="baked in at export"):
        ostinato.compile(loaded)(x, 3, "slow")


def _mapped_ranges(path):
    real = os.path.realpath(path)
    ranges = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[5] == real:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                ranges.append((lo, hi))
    return ranges


@pytest.mark.parametrize("verify", [True, False])
def test_weights_are_mmapped_not_copied(tmp_path, verify):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)])  # 8 MiB of weights
    prog = ostinato.export(model, (torch.randn(2, 512),))
    path = tmp_path / "big.ost"
    prog.save(path)
    tracemalloc.start()
    loaded = ostinato.load(path, verify=verify)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 2 * 2**20, f"load allocated {peak} bytes for 8 MiB of weights"
    ranges = _mapped_ranges(path)
    assert ranges, "the program file is not mapped"
    for name, t in loaded.weights.items():
        ptr = t.data_ptr()
        assert any(lo <= ptr and ptr + t.numel() * t.element_size() <= hi for lo, hi in ranges), name
        assert torch.equal(t, prog.weights[name])
    x = torch.randn(2, 512)
    assert_same(ostinato.compile(loaded)(x), model(x))


def test_loaded_weights_can_be_written_without_touching_the_file(tmp_path):
    prog = ostinato.export(torch.nn.Linear(4, 4), (torch.randn(1, 4),))
    loaded, path = save_load(prog, tmp_path)
    before = path.read_bytes()
    loaded.weights["weight"].add_(1.0)  # copy-on-write mapping: private to this process
    assert path.read_bytes() == before


def _blob(tmp_path):
    prog = ostinato.export(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()), (torch.randn(2, 8),),
                           passes=[])  # two nodes: the tests reorder and rewire them
    prog.save(tmp_path / "ok.ost")
    return prog, bytearray((tmp_path / "ok.ost").read_bytes())


def _write(tmp_path, data, name="bad.ost"):
    p = tmp_path / name
    p.write_bytes(bytes(data))
    return p


def test_wrong_magic(tmp_path):
    p = _write(tmp_path, b"PK\x03\x04" + b"\0" * 200)
    with pytest.raises(NotAProgramError, match="not an ostinato program"):
        ostinato.load(p)


def test_newer_schema(tmp_path):
    _, data = _blob(tmp_path)
    data[8:12] = (SCHEMA_VERSION + 1).to_bytes(4, "little")
    with pytest.raises(SchemaVersionError, match=rf"written by schema v{SCHEMA_VERSION + 1}; this ostinato "
                                                 rf"reads up to v{SCHEMA_VERSION}; upgrade"):
        ostinato.load(_write(tmp_path, data))


@pytest.mark.parametrize("keep", [4, 60, 200, -1])
def test_truncated(tmp_path, keep):
    _, data = _blob(tmp_path)
    with pytest.raises(ProgramFormatError, match="truncated|not an ostinato"):
        ostinato.load(_write(tmp_path, data[:keep]))


def test_checksum_mismatch_names_the_segment(tmp_path):
    _, data = _blob(tmp_path)
    fb = bytearray(data)
    fb[140] ^= 0xFF
    with pytest.raises(ChecksumError, match="FlatBuffer segment"):
        ostinato.load(_write(tmp_path, fb, "fb.ost"))
    tail = bytearray(data)
    tail[-3] ^= 0xFF
    with pytest.raises(ChecksumError, match="data segment") as info:
        ostinato.load(_write(tmp_path, tail, "data.ost"))
    assert info.value.segment == "data"


def test_offsets_out_of_range(tmp_path):
    _, data = _blob(tmp_path)
    bad = bytearray(data)
    bad[16:24] = (3).to_bytes(8, "little")  # FlatBuffer inside the header
    with pytest.raises(LayoutError, match="segment offsets out of range"):
        ostinato.load(_write(tmp_path, bad))
    bad = bytearray(data)
    bad[40:48] = (10**9).to_bytes(8, "little")  # data segment past the end
    with pytest.raises(TruncatedError):
        ostinato.load(_write(tmp_path, bad))


def test_tensor_extent_outside_data_segment(tmp_path, monkeypatch):
    prog, _ = _blob(tmp_path)
    real = writer._layout_tensors

    def shifted(program):
        entries, size = real(program)
        name, role, t, off = entries[-1]
        return entries[:-1] + [(name, role, t, off + 4096)], size

    monkeypatch.setattr(writer, "_layout_tensors", shifted)
    prog.save(tmp_path / "shifted.ost")
    with pytest.raises(LayoutError, match="outside the .*data segment"):
        ostinato.load(tmp_path / "shifted.ost", verify=False)  # the extent check runs without hashing


def test_inconsistent_graph_fails_the_verifier(tmp_path):
    prog, _ = _blob(tmp_path)
    g = prog.graph
    g.nodes.reverse()  # uses before definitions
    prog.save(tmp_path / "rev.ost")
    with pytest.raises(InconsistentGraphError, match="fails verification.*before it is defined"):
        ostinato.load(tmp_path / "rev.ost")


def test_save_is_atomic(tmp_path, monkeypatch):
    prog, data = _blob(tmp_path)
    target = tmp_path / "ok.ost"

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(writer.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        prog.save(target)
    assert target.read_bytes() == bytes(data)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.ost"]


def test_generated_code_is_fresh():
    stale = codegen.is_stale()
    assert stale == [], f"program/fb is stale ({stale}): run python -m ostinato.program.codegen"


def test_schema_states_the_append_only_rule():
    text = open(codegen.SCHEMA).read()
    assert "append-only" in text.lower()


def test_program_loads_and_runs_in_a_fresh_process(tmp_path):
    model, prog = tiny_decoder_program(seed=5)
    prog.save(tmp_path / "dec.ost")
    args = (torch.randint(0, 64, (1, 4)), torch.arange(4))
    torch.save(args, tmp_path / "args.pt")
    code = ("import sys, torch, ostinato; d = sys.argv[1]; exe = ostinato.compile(ostinato.load(d + '/dec.ost'));"
            "torch.save(exe(*torch.load(d + '/args.pt')), d + '/out.pt')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, env=env, timeout=300)
    with torch.no_grad():
        expected = model(*args)
    assert_same(torch.load(tmp_path / "out.pt"), expected)


def test_verify_checksums_mode(tmp_path):
    """verify="checksums": both hashes checked, structural rules kept, no shape re-derivation (so no
    torch._dynamo import in a fresh process); anything else is refused."""
    _, data = _blob(tmp_path)
    tail = bytearray(data)
    tail[-3] ^= 0xFF
    with pytest.raises(ChecksumError, match="data segment"):
        ostinato.load(_write(tmp_path, tail, "data.ost"), verify="checksums")
    good = _write(tmp_path, bytes(data), "good.ost")
    code = ("import sys, ostinato; p = ostinato.load(sys.argv[1], verify='checksums'); "
            "print(p.num_nodes, 'torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(good)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    nodes, dynamo = out.stdout.split()
    assert int(nodes) > 0 and dynamo == "False"
    with pytest.raises(ValueError, match="verify must be True, False or 'checksums'"):
        ostinato.load(good, verify="yes")


def test_verify_true_re_derives_shapes_once_per_file_content(tmp_path, monkeypatch):
    """A fresh process's first verify=True load re-derives every shape (importing torch._dynamo) and
    records it; the next process loading the same bytes checks the sha256 and skips that. A load
    that skips the checksums cannot use the record: its bytes are not proven the same."""
    from ostinato.cache import set_cache
    from ostinato.program import reader
    _, data = _blob(tmp_path)
    good = _write(tmp_path, bytes(data), "good.ost")
    code = ("import sys, ostinato; p = ostinato.load(sys.argv[1], verify=True); "
            "print(p.num_nodes, 'torch._dynamo' in sys.modules)")
    monkeypatch.setenv("OSTINATO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("OSTINATO_REDIS_URL", raising=False)
    seen = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", code, str(good)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        seen.append(out.stdout.split()[1])
    assert seen == ["True", "False"]
    calls = []
    monkeypatch.setattr(reader, "verify", lambda g, check_shapes=False, hints=None: calls.append(check_shapes))
    set_cache(None)   # this process's cache: the directory the fresh processes filled
    try:
        reader.load(good, verify_checksums=True, check_shapes=True)
        reader.load(good, verify_checksums=False, check_shapes=True)
    finally:
        set_cache(None)
    assert calls == [False, True]


def test_save_records_the_shape_check_so_the_first_verified_load_skips_it(tmp_path, monkeypatch, caplog):
    """save() re-derives the shapes of the program it wrote and records that they passed: a fresh
    process's first load(verify=True) of the file does not import torch._dynamo. A program whose
    recorded shapes are wrong is still saved, with a warning, and is not recorded."""
    from ostinato.ir import TensorMeta
    monkeypatch.setenv("OSTINATO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("OSTINATO_REDIS_URL", raising=False)
    from ostinato.cache import set_cache
    set_cache(None)
    try:
        _, prog = tiny_decoder_program()
        prog.save(tmp_path / "ok.ost")
        node = next(n for n in prog.graph.nodes if n.op.startswith("aten.") and n.outputs[0] is not None
                    and isinstance(n.outputs[0].meta, TensorMeta))
        node.outputs[0].meta = TensorMeta(node.outputs[0].meta.dtype, (3, 5, 7))   # a wrong record
        with caplog.at_level("WARNING", logger="ostinato"):
            prog.save(tmp_path / "bad.ost")
        assert "fails shape verification" in caplog.text
    finally:
        set_cache(None)
    code = ("import sys, ostinato; p = ostinato.load(sys.argv[1], verify=True); "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ok.ost")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False"]
    bad = subprocess.run([sys.executable, "-c", code, str(tmp_path / "bad.ost")], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode != 0 and "fails verification" in bad.stderr
