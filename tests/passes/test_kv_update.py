import copy
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.export import Dim

import ostinato
from examples.tiny_decoder import TinyDecoder, decode_inputs
from helpers import assert_decode_matches, assert_same, export_and_compare
from ostinato.ir import Graph
from ostinato.passes import DEFAULT_PIPELINE, run_passes
from pass_harness import f32, op, run_graph

sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
from test_hf_decoders import decode_inputs as hf_decode_inputs, make_wrapper  # noqa: E402

# Whatever a cache write may have been exported as: none may be left once it is fused.
WRITES = ("aten.index_put", "aten.index_put_", "aten.index_copy", "aten.index_copy_", "aten.slice_scatter",
          "aten.copy", "aten.slice.Tensor", "aten.remainder.Scalar", "aten.fmod.Scalar")
B, H, S, D = 2, 3, 8, 4


class Cache(nn.Module):
    """A static cache buffer [B, H, S, D]; forward writes x [B, H, T, D] at positions pos [T] along dim 2
    (``write``) and returns a value that reads the whole updated cache."""

    def __init__(self):
        super().__init__()
        self.register_buffer("k", torch.zeros(B, H, S, D), persistent=False)
        self.scale = nn.Parameter(torch.rand(D) + 0.5)

    def forward(self, x, pos):
        self.write(x, pos)
        return (self.k * self.scale).sum(2)


class IndexCopy(Cache):
    def write(self, x, pos):
        self.k.index_copy_(2, pos, x)


class SetItem(Cache):
    def write(self, x, pos):
        self.k[:, :, pos] = x


class IndexPut(Cache):
    def write(self, x, pos):
        torch.ops.aten.index_put_(self.k, [None, None, pos], x)


class SliceAtItem(Cache):
    """``start = pos[0].item()``: the slice start is a data-dependent size (u0)."""

    def write(self, x, pos):
        start = pos[0].item()
        torch._check(start >= 0)
        torch._check(start + x.shape[2] <= S)
        self.k[:, :, start:start + x.shape[2]] = x


class SliceAtLength(nn.Module):
    """The slice is the last T rows of the first ``mask.shape[1]``: positions from a symbolic size."""

    def __init__(self):
        super().__init__()
        self.register_buffer("k", torch.zeros(B, H, S, D), persistent=False)

    def forward(self, x, mask):
        end = mask.shape[1]
        self.k[:, :, end - x.shape[2]:end] = x
        return self.k.sum(2) * 2


class RingRemainder(Cache):
    def write(self, x, pos):
        self.k.index_copy_(2, pos % S, x)


class RingFmod(Cache):
    def write(self, x, pos):
        self.k[:, :, torch.fmod(pos, S)] = x


class RingSlotAlsoReturned(Cache):
    """The slot is read again after the write: the remainder stays, the write is still fused."""

    def forward(self, x, pos):
        slot = pos % S
        self.k.index_copy_(2, slot, x)
        return self.k.sum(2), slot * 3


class ReadsOldCache(Cache):
    """The old contents are read after the (functional) write: the write must not be in place."""

    def forward(self, x, pos):
        new = torch.index_copy(self.k, 2, pos, x)
        old = self.k.sum()
        self.k.copy_(new)
        return self.k.sum(2) + old


class TwoWrites(Cache):
    """Two writes into one cache in a step: the second writes into the first's result."""

    def write(self, x, pos):
        self.k.index_copy_(2, pos, x)
        self.k[:, :, (pos + 1) % S] = x * 2


class NotACache(nn.Module):
    """A row write into a temporary (no buffer is written back): an ordinary index_put."""

    def forward(self, x, pos):
        return torch.zeros(B, H, S, D).index_copy(2, pos, x) * 2


class TwoDimIndex(Cache):
    def write(self, x, pos):
        self.k[:, :, pos.view(-1, 1)] = x.unsqueeze(3)


class Broadcast(Cache):
    """``new`` has one batch row, broadcast by index_put: not the cache's shape, not fused."""

    def write(self, x, pos):
        self.k[:, :, pos] = x[:1]


class LeadingOnes(nn.Module):
    """A [1, H, S, D] cache written with ``k`` of shape [H, 1, D]: index_put broadcasts the batch dim."""

    def __init__(self):
        super().__init__()
        self.register_buffer("k", torch.zeros(1, H, S, D), persistent=False)
        self.scale = nn.Parameter(torch.rand(D) + 0.5)

    def forward(self, x, pos):
        self.k[:, :, pos % S] = x[0]
        return (self.k * self.scale).sum(2)


def steps(n, rows=1, start=0):
    gen = torch.Generator().manual_seed(n * 10 + rows)
    return [(torch.randn(B, H, rows, D, generator=gen), torch.arange(start + i * rows, start + (i + 1) * rows))
            for i in range(n)]


def run_decode(model, inputs, dynamic_shapes=None):
    """Export on the first inputs, then run every step through the program and eagerly; the outputs and
    the final cache contents must agree. Returns the program."""
    ref = copy.deepcopy(model)
    prog = ostinato.export(model, inputs[0], dynamic_shapes=dynamic_shapes)
    exe = ostinato.compile(prog, device="cpu")
    for i, args in enumerate(inputs):
        with torch.no_grad():
            expected = ref(*args)
        assert_same(exe(*args), expected, msg=f"step {i}:")
    final = ref.k
    assert_same(exe.session.state["k"], final, msg="final cache:")
    assert final.abs().sum() > 0
    return prog


def no_writes_left(prog):
    return not set(WRITES) & set(prog.op_counts())


@pytest.mark.parametrize("cls", [IndexCopy, SetItem, IndexPut])
def test_index_forms_become_one_inplace_update(cls):
    prog = run_decode(cls(), steps(S))
    assert prog.op_counts()["ost.kv_update_"] == 1 and no_writes_left(prog)
    node = next(n for n in prog.graph.nodes if n.op == "ost.kv_update_")
    assert node.args[0] is prog.graph.state[0] and node.args[2] is prog.graph.inputs[1]
    assert node.args[3:] == (2, None)


def test_negative_position_counts_from_the_end():
    # index_put (what cache[:, :, pos] = x exports to) takes -1 as the last row; so does kv_update.
    inputs = [(x, pos - S) for x, pos in steps(S)]
    prog = run_decode(SetItem(), inputs)
    assert prog.op_counts()["ost.kv_update_"] == 1


def test_dynamic_number_of_rows():
    # a 3-token prefill exported with T symbolic, then single tokens
    inputs = steps(1, rows=3) + steps(S - 3, start=3)
    T = Dim("T", min=1, max=S)
    prog = run_decode(IndexCopy(), inputs, dynamic_shapes=({2: T}, {0: T}))
    assert prog.op_counts()["ost.kv_update_"] == 1 and no_writes_left(prog)


def test_slice_at_item_position():
    prog = run_decode(SliceAtItem(), steps(S // 2, rows=2))
    counts = prog.op_counts()
    assert counts["ost.kv_update_"] == 1 and no_writes_left(prog)
    node = next(n for n in prog.graph.nodes if n.op == "ost.kv_update_")
    index = node.args[2].producer
    assert index.op == "aten.arange.start_step" and str(node.args[2].meta) == "i64[2]"


def test_slice_at_symbolic_length():
    L = Dim("L", min=2, max=S)
    inputs = [(torch.randn(B, H, 1, D), torch.ones(1, n, dtype=torch.bool)) for n in range(2, S + 1)]
    prog = run_decode(SliceAtLength(), inputs, dynamic_shapes=({}, {1: L}))
    assert prog.op_counts()["ost.kv_update_"] == 1 and no_writes_left(prog)


@pytest.mark.parametrize("cls", [RingRemainder, RingFmod])
def test_ring_buffer_wraps_around(cls):
    prog = run_decode(cls(), steps(S + 5))  # more steps than slots: rows 0..4 are written twice
    assert prog.op_counts()["ost.kv_update_"] == 1 and no_writes_left(prog)
    node = next(n for n in prog.graph.nodes if n.op == "ost.kv_update_")
    assert node.args[2] is prog.graph.inputs[1] and node.args[4] == S


def test_ring_slot_with_another_reader_stays_for_it():
    model = RingSlotAlsoReturned()
    ref = copy.deepcopy(model)
    prog = ostinato.export(model, steps(1)[0])
    exe = ostinato.compile(prog)
    for args in steps(S + 3):
        with torch.no_grad():
            assert_same(exe(*args), ref(*args))
    assert_same(exe.session.state["k"], ref.k)
    counts = prog.op_counts()
    assert counts["ost.kv_update_"] == 1 and counts["aten.remainder.Scalar"] == 1
    node = next(n for n in prog.graph.nodes if n.op == "ost.kv_update_")
    # the write takes the ring itself; the remainder stays for its other reader
    assert node.args[2] is prog.graph.inputs[1] and node.args[4] == S


def test_old_cache_read_after_write_stays_functional():
    prog = run_decode(ReadsOldCache(), steps(S))
    counts = prog.op_counts()
    assert counts["ost.kv_update"] == 1 and "ost.kv_update_" not in counts and no_writes_left(prog)


def test_two_writes_in_one_step():
    prog = run_decode(TwoWrites(), steps(S))
    counts = prog.op_counts()
    # Both writes are fused. Both stay functional: reinplace only makes a write in place whose cache
    # operand is the state itself, and the second write's cache is the first's result.
    assert counts["ost.kv_update"] == 2 and no_writes_left(prog)


def test_write_into_a_temporary_is_not_fused():
    prog, _ = export_and_compare(NotACache(), steps(1)[0], more_inputs=steps(3)[1:])
    assert prog.op_counts()["aten.index_put"] == 1 and "ost.kv_update" not in prog.op_counts()


def test_values_without_leading_ones_are_fused():
    prog = run_decode(LeadingOnes(), steps(S + 3))     # past S: the slot wraps around
    counts = prog.op_counts()
    assert counts["ost.kv_update_"] == 1 and no_writes_left(prog)
    node = next(n for n in prog.graph.nodes if n.op == "ost.kv_update_")
    assert str(node.args[1].meta) == f"f32[1,{H},1,{D}]" and node.args[4] == S


@pytest.mark.parametrize("cls", [TwoDimIndex, Broadcast])
def test_not_a_row_write_is_not_fused(cls):
    prog = run_decode(cls(), steps(S))
    counts = prog.op_counts()
    assert not {"ost.kv_update", "ost.kv_update_"} & set(counts)
    assert counts["aten.index_put_"] == 1


def test_index_copy_node_and_negative_dim():
    # torch.export decomposes index_copy to index_put; a graph holding aten.index_copy itself is fused too.
    g = Graph()
    cache = g.new_value("cache", f32(B, H, S, D), "state")
    new = g.new_value("new", f32(B, H, 2, D), "input")
    pos = g.new_value("pos", ostinato.ir.TensorMeta(torch.int64, (2,)), "input")
    out = op(g, "aten.index_copy", (cache, -2, pos, new), f32(B, H, S, D))
    g.outputs = [op(g, "aten.mul.Tensor", (out, 2.0), f32(B, H, S, D))]
    g.mutations = [(cache, out)]
    feeds = {"cache": torch.randn(B, H, S, D), "new": torch.randn(B, H, 2, D), "pos": torch.tensor([5, 1])}
    want = run_graph(g, {k: v.clone() for k, v in feeds.items()})
    g, _ = run_passes(g, DEFAULT_PIPELINE, verify_each=True)
    assert g.op_counts() == {"ost.kv_update_": 1, "aten.mul.Tensor": 1}
    assert g.nodes[0].args[3] == 2
    got_feeds = {k: v.clone() for k, v in feeds.items()}
    assert_same(run_graph(g, got_feeds), want)
    expected_cache = feeds["cache"].index_copy(2, feeds["pos"], feeds["new"])
    assert_same(got_feeds["cache"], expected_cache)


def test_tiny_decoder_has_one_inplace_update_per_cache():
    torch.manual_seed(0)
    layers = 3
    model = TinyDecoder(dim=32, layers=layers, heads=2, kv_heads=1, vocab=64, max_seq=16).eval()
    ref = copy.deepcopy(model)
    prog = ostinato.export(model, decode_inputs(0, vocab=64))
    assert prog.op_counts()["ost.kv_update_"] == 2 * layers and no_writes_left(prog)
    exe = ostinato.compile(prog)
    assert_decode_matches(exe, ref, 8)
    for name, buf in ref.named_buffers():
        if name.endswith("_cache"):
            assert_same(exe.session.state[name], buf, msg=name)
            assert buf[:, :, :8].abs().sum() > 0 and buf[:, :, 8:].abs().sum() == 0


@pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects")
def test_llama_static_cache_has_one_inplace_update_per_cache():
    wrapper = make_wrapper("llama")
    ref = copy.deepcopy(wrapper)
    gen = torch.Generator().manual_seed(1)
    prog = ostinato.export(wrapper, (), hf_decode_inputs(0, gen), trace_strict=True)
    layers = wrapper.model.config.num_hidden_layers
    assert prog.op_counts()["ost.kv_update_"] == 2 * layers
    assert not {"aten.index_put", "aten.index_put_", "aten.slice_scatter"} & set(prog.op_counts())
    exe = ostinato.compile(prog)
    for s in range(8):
        kwargs = hf_decode_inputs(s, gen)
        with torch.no_grad():
            expected = ref(**kwargs)
        assert_same(exe(**kwargs), expected, msg=f"step {s}")
    for name, buf in ref.named_buffers():
        if name.startswith(("key_cache", "value_cache")):
            assert_same(exe.session.state[name], buf, msg=name)
