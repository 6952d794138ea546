"""Sibling projections' weights packed as they are placed (runtime/packing.py): one buffer per group,
views equal to the originals, no copy where they are packed already, none past the CPU's limit."""
import os

import pytest
import torch

import ostinato
from ostinato.runtime import packing
from helpers import assert_same


class QKV(torch.nn.Module):
    """Three sibling projections with biases and two without: two multi_linear groups."""

    def __init__(self, d=32):
        super().__init__()
        self.q, self.k, self.v = torch.nn.Linear(d, d), torch.nn.Linear(d, d // 2), torch.nn.Linear(d, d // 2)
        self.gate, self.up = torch.nn.Linear(d, 2 * d, bias=False), torch.nn.Linear(d, 2 * d, bias=False)
        self.out = torch.nn.Linear(2 * d, d, bias=False)

    def forward(self, x):
        h = torch.cat([self.q(x), self.k(x), self.v(x)], dim=-1)
        return self.out(h * torch.nn.functional.silu(self.gate(x)) * self.up(x))


def _groups(exe):
    """[(names, placed tensors)] of each multi_linear's weight and bias group."""
    return [([v.name for v in vals], [exe._template[v.slot] for v in vals]) for vals in packing._groups(exe.program.graph)]


def _one_buffer(ts):
    """The tensors lie one after another in one storage."""
    size = ts[0].element_size()
    return all(b.untyped_storage().data_ptr() == ts[0].untyped_storage().data_ptr()
               and b.data_ptr() == a.data_ptr() + a.numel() * size for a, b in zip(ts, ts[1:]))


@pytest.fixture
def model_and_prog():
    torch.manual_seed(0)
    model = QKV().eval()
    x = torch.randn(2, 5, 32)
    prog = ostinato.export(model, (x,))
    assert prog.op_counts()["ost.multi_linear"] == 2
    return model, x, prog


def test_small_groups_are_packed_into_one_buffer_equal_to_the_originals(model_and_prog):
    model, x, prog = model_and_prog
    exe = ostinato.compile(prog, cache=False)
    groups = _groups(exe)
    assert len(groups) == 3   # q/k/v weights, their biases, gate/up
    for names, ts in groups:
        assert _one_buffer(ts), names
        for n, t in zip(names, ts):
            assert torch.equal(t, prog.weights[n]) and t.data_ptr() != prog.weights[n].data_ptr()
    with torch.no_grad():
        assert_same(exe(x), model(x))


def test_groups_past_the_cpu_limit_stay_the_models_tensors(model_and_prog, monkeypatch):
    model, x, prog = model_and_prog
    monkeypatch.setattr(packing, "CPU_PACK_COPY_LIMIT", 1024)   # the biases' groups (192 bytes) still pack
    exe = ostinato.compile(prog, cache=False)
    for names, ts in _groups(exe):
        if names[0].endswith("bias"):
            assert _one_buffer(ts), names
        else:
            assert all(t.data_ptr() == prog.weights[n].data_ptr() for n, t in zip(names, ts)), names
    with torch.no_grad():
        assert_same(exe(x), model(x))


def test_a_loaded_programs_adjacent_weights_are_packed_in_place(model_and_prog, tmp_path):
    model, x, prog = model_and_prog
    prog.save(tmp_path / "m.ost")
    loaded = ostinato.load(tmp_path / "m.ost")
    # The reader's tensors are views of one mapping: q, k, v (saved one after another) are packed already.
    ws = [loaded.weights[n] for n in ("q.weight", "k.weight", "v.weight")]
    assert _one_buffer(ws)
    template = [None] * loaded.graph.assign_slots()
    backend = ostinato.compile(loaded, cache=False).backend
    assert packing.place_constants(loaded.graph, loaded.weights, backend, template) == 0   # nothing copied
    exe = ostinato.compile(loaded, cache=False)
    for names, ts in _groups(exe):
        assert _one_buffer(ts), names
        assert all(t.data_ptr() == loaded.weights[n].data_ptr() for n, t in zip(names, ts)), names
    with torch.no_grad():
        assert_same(exe(x), model(x))


def test_pack_sibling_weights_still_packs_a_template(model_and_prog):
    _, _, prog = model_and_prog
    g = prog.graph
    template = [None] * g.assign_slots()
    for v in g.constants:
        template[v.slot] = prog.weights[v.name]
    assert packing.pack_sibling_weights(g, template) == 3
    assert packing.pack_sibling_weights(g, template) == 0   # packed already


@pytest.mark.cuda
def test_upload_packs_each_group_into_one_device_buffer(model_and_prog):
    model, x, prog = model_and_prog
    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    _packed_on_gpu_and_like_eager(ostinato.compile(prog, device="cuda", cache=False), prog.weights, model, x)


def _packed_on_gpu_and_like_eager(exe, weights, model, x):
    """Each group one device buffer holding the original weights; the output eager's."""
    for names, ts in _groups(exe):
        assert ts[0].is_cuda and _one_buffer(ts), names
        for n, t in zip(names, ts):
            assert torch.equal(t.cpu(), weights[n])
    with torch.no_grad():
        assert_same(exe(x.cuda()), model.cuda()(x.cuda()))


class _Uploads:
    """A stand-in for a GPU backend in bulk_upload: a non-CPU device and an upload that clones and records."""
    device = torch.device("cuda")

    def __init__(self):
        self.sizes = []

    def upload_bytes(self, src):
        assert src.dtype == torch.uint8 and src.dim() == 1 and src.device.type == "cpu"
        self.sizes.append(src.numel())
        return src.clone()


def _saved_and_loaded(tmp_path, model, x):
    prog = ostinato.export(model, (x,))
    prog.save(tmp_path / "m.ost")
    return prog, ostinato.load(tmp_path / "m.ost")


def test_bulk_upload_places_a_loaded_programs_constants_as_views_of_a_few_runs(tmp_path, monkeypatch,
                                                                              model_and_prog):
    model, x, _ = model_and_prog
    exported, loaded = _saved_and_loaded(tmp_path, model, x)
    monkeypatch.setattr(packing, "BULK_MIN_BYTES", 1)
    up = _Uploads()
    g = loaded.graph
    out = packing.bulk_upload(g, loaded.weights, up)
    assert set(out) == {v.name for v in g.constants}
    for name, t in out.items():
        assert torch.equal(t, loaded.weights[name]) and t.dtype == loaded.weights[name].dtype, name
    total = sum(t.nbytes for t in loaded.weights.values())
    assert len(up.sizes) == 1 and total <= up.sizes[0] < total + 64 * len(out)   # one run, alignment padding only
    # the packed groups stay packed on the device: consecutive views of one buffer
    for vals in packing._groups(g):
        assert _one_buffer([out[v.name] for v in vals]), [v.name for v in vals]
    # constants placed already are left alone; a run ends where the next constant starts more than
    # BULK_GAP_BYTES after it (-1: even adjacent ones, so each constant is a run of its own)
    first = g.constants[0].name
    assert first not in packing.bulk_upload(g, loaded.weights, up, placed={first: loaded.weights[first]})
    monkeypatch.setattr(packing, "BULK_GAP_BYTES", -1)
    up.sizes.clear()
    again = packing.bulk_upload(g, loaded.weights, up)
    assert set(again) == set(out) and all(torch.equal(again[n], out[n]) for n in out)
    assert sorted(up.sizes) == sorted(t.nbytes for t in loaded.weights.values())


def test_bulk_upload_leaves_exported_small_live_and_cpu_programs_alone(tmp_path, monkeypatch, model_and_prog):
    model, x, _ = model_and_prog
    exported, loaded = _saved_and_loaded(tmp_path, model, x)
    up = _Uploads()
    assert packing.bulk_upload(loaded.graph, loaded.weights, up) == {}       # below BULK_MIN_BYTES
    monkeypatch.setattr(packing, "BULK_MIN_BYTES", 1)
    # an exported program's parameters each have a storage: at most one tensor's worth is a "run"
    out = packing.bulk_upload(exported.graph, exported.weights, up)
    assert len(out) <= 1
    with packing.live_weights():
        assert packing.bulk_upload(loaded.graph, loaded.weights, up) == {}

    class CPU(_Uploads):
        device = torch.device("cpu")
    assert packing.bulk_upload(loaded.graph, loaded.weights, CPU()) == {}


@pytest.mark.cuda
@pytest.mark.parametrize("chunk", [None, 4096])
def test_a_loaded_program_is_uploaded_in_runs_and_runs_like_eager(tmp_path, monkeypatch, model_and_prog, chunk):
    """On a GPU: the loaded program's constants cross in one run (through the pinned pipeline when its
    chunks are small), the groups stay packed, and the output is eager's."""
    from ostinato.backends.cuda import upload
    model, x, _ = model_and_prog
    _, loaded = _saved_and_loaded(tmp_path, model, x)
    monkeypatch.setattr(packing, "BULK_MIN_BYTES", 1)
    if chunk:
        monkeypatch.setattr(upload, "CHUNK_BYTES", chunk)
        monkeypatch.setattr(upload, "MIN_PIPELINED_BYTES", 2 * chunk)
    calls = []
    real = upload.upload
    monkeypatch.setattr(upload, "upload", lambda src, dev: calls.append(src.numel()) or real(src, dev))
    exe = ostinato.compile(loaded, device="cuda", cache=False)
    assert len(calls) == 1
    _packed_on_gpu_and_like_eager(exe, loaded.weights, model, x)


def test_populate_maps_a_file_range_without_changing_it(tmp_path):
    """The upload's page-table fill (MADV_POPULATE_READ): on Linux 5.14 and later it succeeds on any
    sub-range of a copy-on-write file mapping, unaligned start included (elsewhere it declines), and the
    bytes read after it are the file's; nothing to populate is refused."""
    import mmap
    import sys
    from ostinato.program.format import populate
    data = torch.randint(0, 256, (3 * mmap.PAGESIZE + 123,), dtype=torch.uint8)
    path = tmp_path / "blob"
    path.write_bytes(data.numpy().tobytes())
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    view = torch.frombuffer(mapped, dtype=torch.uint8)
    off = int(torch.randint(1, mmap.PAGESIZE, ()).item())
    release = tuple(int(x) for x in os.uname().release.split(".")[:2]) if hasattr(os, "uname") else (0, 0)
    able = sys.platform.startswith("linux") and release >= (5, 14)
    assert populate(view[off:].data_ptr(), view.numel() - off) is able
    assert torch.equal(view, data)
    assert populate(view.data_ptr(), 0) is False
    del view
    mapped.close()
