"""The data segment's writer: streamed with its sha256 on a second thread (the same bytes as hashing
after each write), and the weights of one ``ost.multi_linear`` laid out one after another, so a loaded
program's groups are packed already (runtime/packing.py)."""
import io

import torch

import ostinato
from ostinato.program import writer
from ostinato.program.fb.TensorRole import TensorRole
from ostinato.program.format import SCHEMA_VERSION, DataHasher, align
from helpers import assert_same
from program.models import Tied, tiny_decoder_program


def _old_layout(program):
    """The writer's layout before sibling groups: every extent in the program's order."""
    entries, seen, size = [], {}, 0
    named = [(n, TensorRole.Weight, t) for n, t in program.weights.items()]
    named += [(n, TensorRole.StateInit, t) for n, t in program.state_init.items()]
    for name, role, t in named:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype) \
            if t.numel() else None
        if key is not None and key in seen:
            entries.append((name, role, t, seen[key]))
            continue
        offset = size
        size = align(size + t.numel() * t.element_size())
        if key is not None:
            seen[key] = offset
        entries.append((name, role, t, offset))
    return entries, size


def _old_write_data(f, entries, data_size):
    """The writer's data segment before: each extent written, then hashed, on the caller's thread."""
    h = DataHasher(SCHEMA_VERSION)
    pos = 0
    for _, _, t, offset in entries:
        if offset < pos:
            continue
        gap = b"\0" * (offset - pos)
        raw = writer._as_bytes(t)
        for chunk in (gap, raw):
            f.write(chunk)
            h.update(chunk)
        pos = offset + len(raw)
    tail = b"\0" * (data_size - pos)
    f.write(tail)
    h.update(tail)
    return h.digest()


def _old_bytes(program, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(writer, "_layout_tensors", _old_layout)
        m.setattr(writer, "_write_data", _old_write_data)
        return writer.to_bytes(program)


class Biased(torch.nn.Module):
    """q, k, v with biases: in the program's order their weights and biases alternate."""

    def __init__(self, d=32):
        super().__init__()
        self.q, self.k, self.v = torch.nn.Linear(d, d), torch.nn.Linear(d, 16), torch.nn.Linear(d, 16)
        self.o = torch.nn.Linear(64, d, bias=False)

    def forward(self, x):
        return self.o(torch.cat([self.q(x), self.k(x), self.v(x)], dim=-1))


def test_bytes_are_the_old_writers_where_groups_are_adjacent(monkeypatch):
    # Random weights, tied ones, state: the threaded hash and the layout change nothing here.
    _, prog = tiny_decoder_program(seed=3)
    assert prog.op_counts().get("ost.multi_linear")
    assert writer.to_bytes(prog) == _old_bytes(prog, monkeypatch)
    torch.manual_seed(1)
    tied = ostinato.export(Tied(), (torch.randint(0, 512, (2, 7)),))
    assert writer.to_bytes(tied) == _old_bytes(tied, monkeypatch)


def test_hash_pieces_match_one_update(monkeypatch):
    # Extents larger than a piece are hashed in pieces on the worker: the digest is the whole segment's.
    monkeypatch.setattr(writer, "_PIECE", 1000)
    _, prog = tiny_decoder_program(seed=4)
    entries, size = writer._layout_tensors(prog)
    new, old = io.BytesIO(), io.BytesIO()
    assert writer._write_data(new, entries, size) == _old_write_data(old, entries, size)
    assert new.getvalue() == old.getvalue() and len(new.getvalue()) == size


def test_a_groups_weights_are_laid_out_together_and_load_packed(tmp_path):
    torch.manual_seed(0)
    model = Biased().eval()
    x = torch.randn(2, 5, 32)
    prog = ostinato.export(model, (x,))
    assert prog.op_counts()["ost.multi_linear"] == 1
    assert list(prog.weights)[:6] == ["q.weight", "q.bias", "k.weight", "k.bias", "v.weight", "v.bias"]
    entries, _ = writer._layout_tensors(prog)
    assert [e[0] for e in entries] == list(prog.weights)   # the tensor table keeps the program's order
    off = {e[0]: e[3] for e in entries}
    assert off["k.weight"] == off["q.weight"] + 32 * 32 * 4 and off["v.weight"] == off["k.weight"] + 16 * 32 * 4
    assert off["k.bias"] == off["q.bias"] + 32 * 4 and off["v.bias"] == off["k.bias"] + 16 * 4
    prog.save(tmp_path / "m.ost")
    assert (tmp_path / "m.ost").read_bytes() == writer.to_bytes(prog)
    loaded = ostinato.load(tmp_path / "m.ost")
    for names in (("q.weight", "k.weight", "v.weight"), ("q.bias", "k.bias", "v.bias")):
        ts = [loaded.weights[n] for n in names]
        assert all(b.data_ptr() == a.data_ptr() + a.numel() * 4 for a, b in zip(ts, ts[1:])), names
        assert all(torch.equal(loaded.weights[n], prog.weights[n]) for n in names)
    exe = ostinato.compile(loaded, cache=False)
    slot = {v.name: v.slot for v in loaded.graph.constants}
    assert exe._template[slot["k.weight"]].data_ptr() == loaded.weights["k.weight"].data_ptr()   # not copied
    with torch.no_grad():
        assert_same(exe(x), model(x))
    # Saved again from the loaded program: the same bytes.
    assert writer.to_bytes(loaded) == writer.to_bytes(prog)
