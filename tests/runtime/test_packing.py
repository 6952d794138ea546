"""Sibling projections' weights packed as they are placed (runtime/packing.py): one buffer per group,
views equal to the originals, no copy where they are packed already, none past the CPU's limit."""
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
    exe = ostinato.compile(prog, device="cuda", cache=False)
    for names, ts in _groups(exe):
        assert ts[0].is_cuda and _one_buffer(ts), names
        for n, t in zip(names, ts):
            assert torch.equal(t.cpu(), prog.weights[n])
    with torch.no_grad():
        assert_same(exe(x.cuda()), model.cuda()(x.cuda()))
