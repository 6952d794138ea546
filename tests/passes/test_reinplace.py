import copy

import torch

import ostinato
from ostinato.ir import Graph, TensorMeta, verify
from ostinato.passes.reinplace import reinplace_state_writes
from examples.tiny_decoder import TinyDecoder, decode_inputs
from helpers import assert_decode_matches, assert_same, export_and_compare


def test_kv_cache_writes_run_in_place_without_copy_back():
    torch.manual_seed(0)
    model = TinyDecoder(dim=32, layers=3, heads=2, kv_heads=1, vocab=64, max_seq=16).eval()
    ref = copy.deepcopy(model)
    prog = ostinato.export(model, decode_inputs(0, vocab=64))
    ops = prog.op_counts()
    # The writes are ost.kv_update (patterns.kv_update), made in place by reinplace.
    assert ops.get("ost.kv_update_") == 6 and not {"ost.kv_update", "aten.index_put", "aten.index_put_"} & set(ops)
    exe = ostinato.compile(prog)
    buffers = {n: t.data_ptr() for n, t in exe.session.state.items()}
    assert_decode_matches(exe, ref, 6)
    assert {n: t.data_ptr() for n, t in exe.session.state.items()} == buffers
    for name, t in ref.named_buffers():
        if name in exe.session.state:
            assert_same(exe.session.state[name], t)


class ReadsAfterWrite(torch.nn.Module):
    """A view taken before the write and used after it (eager: the view sees the new contents)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("buf", torch.randn(4, 3))

    def forward(self, x, idx):
        row = self.buf[0]
        self.buf.index_copy_(0, idx, x)
        return row * 2 + self.buf.sum(0)


def test_exported_writes_read_through_views_match_eager():
    export_and_compare(ReadsAfterWrite(), (torch.randn(2, 3), torch.tensor([0, 2])),
                       more_inputs=[(torch.randn(2, 3), torch.tensor([1, 0])) for _ in range(3)])


def _write_then_read(read_through_view: bool):
    """buf <- index_put(buf, [idx], x), and a later node that reads the OLD contents of buf."""
    g = Graph()
    f32 = lambda *s: TensorMeta(torch.float32, s)  # noqa: E731
    buf = g.new_value("buf", f32(4, 3), "state")
    x = g.new_value("x", f32(2, 3), "input")
    idx = g.new_value("idx", TensorMeta(torch.int64, (2,)), "input")
    src = buf
    if read_through_view:
        src = g.add_node("aten.select.int", (buf, 0, 1), {}, [f32(3)], "old_row").outputs[0]
    new = g.add_node("aten.index_put", (buf, [idx], x), {}, [f32(4, 3)], "write").outputs[0]
    old = g.add_node("aten.mul.Tensor", (src, 2.0), {}, [src.meta], "reads_old").outputs[0]
    g.outputs = [old]
    g.mutations = [(buf, new)]
    verify(g, check_shapes=True)
    return g


def test_no_in_place_write_when_old_contents_are_read_afterwards():
    for through_view in (False, True):
        g = reinplace_state_writes(_write_then_read(through_view))
        assert g.nodes[-2].op == "aten.index_put", through_view


def test_in_place_write_when_nothing_reads_the_old_contents():
    g = _write_then_read(False)
    g.nodes.pop()  # drop the late reader
    g.outputs = [g.nodes[-1].outputs[0]]
    assert reinplace_state_writes(g).nodes[-1].op == "aten.index_put_"
