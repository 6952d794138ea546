import copy
import math

import torch

import ostinato
from ostinato.ir import Graph, TensorMeta, verify
from ostinato.passes import eliminate_common_subexpressions as cse
from helpers import assert_same
from pass_harness import f32, op, run_graph


class MaskPerLayer(torch.nn.Module):
    """Each layer rebuilds the same causal mask from ``pos`` (what many decoders do)."""

    def __init__(self, layers: int = 4, dim: int = 8, max_seq: int = 16):
        super().__init__()
        self.max_seq = max_seq
        self.projs = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(layers))

    def forward(self, x, pos):
        for proj in self.projs:
            keys = torch.arange(self.max_seq)
            mask = keys.unsqueeze(0) <= pos.unsqueeze(1)           # [t, max_seq]
            bias = torch.where(mask, 0.0, -1e9).sum(-1, keepdim=True) * 1e-12
            x = torch.sin(proj(x)) + bias
        return x


def _compile_and_compare(prog, model, args_list):
    exe = ostinato.compile(prog)
    for args in args_list:
        with torch.no_grad():
            ref = model(*args)
        assert_same(exe(*args), ref)


def test_mask_built_in_every_layer_is_computed_once():
    model = MaskPerLayer().eval()
    ref = copy.deepcopy(model)
    args = (torch.randn(3, 8), torch.tensor([0, 5, 9]))
    prog = ostinato.export(model, args, passes=[])
    before = prog.op_counts()
    assert before["aten.arange.start_step"] == 4 and before["aten.le.Tensor"] == 4
    cse(prog.graph)
    after = prog.op_counts()
    for name in ("aten.arange.start_step", "aten.le.Tensor", "aten.where.self", "aten.sum.dim_IntList"):
        assert after[name] == 1, (name, after)
    # The layers' own work is not merged: different weights.
    assert after["aten.linear"] == 4 and after["aten.sin"] == 4
    verify(prog.graph, check_shapes=True, hints=prog.hints)
    _compile_and_compare(prog, ref, [args, (torch.randn(3, 8), torch.tensor([1, 15, 2]))])


class TwoRandoms(torch.nn.Module):
    def forward(self, x):
        return x + torch.rand(x.shape), x + torch.rand(x.shape)


def test_random_ops_are_never_merged():
    x = torch.randn(4, 5)
    prog = ostinato.export(TwoRandoms(), (x,))
    assert prog.op_counts()["aten.rand"] == 2
    cse(prog.graph)
    assert prog.op_counts()["aten.rand"] == 2 and prog.op_counts()["aten.add.Tensor"] == 2
    verify(prog.graph, check_shapes=True, hints=prog.hints)
    a, b = ostinato.compile(prog)(x)
    assert not torch.equal(a, b)  # two independent draws


def _graph_with(consts):
    """x → add(x, c) for each constant c, all summed into one output (so none is an output itself)."""
    g = Graph()
    x = g.new_value("x", f32(3), "input")
    outs = [op(g, "aten.add.Tensor", (x, c), f32(3)) for c in consts]
    acc = outs[0]
    for o in outs[1:]:
        acc = op(g, "aten.mul.Tensor", (acc, o), f32(3))
    g.outputs = [acc]
    return g


def test_constants_merge_by_type_and_bits_only():
    # Equal by == in Python, different results in torch (or different bits): never merged.
    g = _graph_with([0.0, -0.0, 1, 1.0, True, math.nan, math.nan, 2.5, 2.5])
    feeds = {"x": torch.tensor([-0.0, 1.0, -2.0])}
    expected = run_graph(g, dict(feeds))
    n_before = len(g.nodes)
    cse(g)
    adds = [n for n in g.nodes if n.op == "aten.add.Tensor"]
    # 0.0, -0.0, 1, 1.0, True, nan, 2.5: the second nan (same bits) and the second 2.5 merge.
    assert len(adds) == 7 and len(g.nodes) == n_before - 2
    verify(g, check_shapes=True)
    assert_same(run_graph(g, dict(feeds)), expected)


def test_duplicated_subgraph_collapses_and_outputs_are_kept_apart():
    g = Graph()
    x = g.new_value("x", f32(2, 3), "input")
    chains = []
    for _ in range(3):
        s = op(g, "aten.sin", (x,), f32(2, 3))
        c = op(g, "aten.cos", (s,), f32(2, 3))
        chains.append(op(g, "aten.mul.Tensor", (c, 2.0), f32(2, 3)))
    total = op(g, "aten.add.Tensor", (chains[0], chains[1]), f32(2, 3))
    # chains[2] is itself a graph output: its node stays (two outputs must not become one tensor).
    g.outputs = [total, chains[2], chains[0]]
    feeds = {"x": torch.randn(2, 3)}
    expected = run_graph(g, dict(feeds))
    cse(g)
    assert g.op_counts() == {"aten.sin": 1, "aten.cos": 1, "aten.mul.Tensor": 2, "aten.add.Tensor": 1}
    assert g.outputs[1] is not g.outputs[2]
    assert g.nodes[-1].inputs == [g.outputs[2], g.outputs[2]]  # add reads the surviving chain twice
    verify(g, check_shapes=True)
    assert_same(run_graph(g, dict(feeds)), expected)


def test_reads_of_a_buffer_written_in_place_are_not_merged():
    g = Graph()
    buf = g.new_value("buf", f32(4, 3), "state")
    x = g.new_value("x", f32(2, 3), "input")
    idx = g.new_value("idx", TensorMeta(torch.int64, (2,)), "input")
    old = op(g, "aten.mul.Tensor", (buf, 2.0), f32(4, 3))
    new = op(g, "aten.index_put_", (buf, [idx], x), f32(4, 3))
    again = op(g, "aten.mul.Tensor", (buf, 2.0), f32(4, 3))      # reads the written buffer
    out = op(g, "aten.sub.Tensor", (again, old), f32(4, 3))
    g.outputs = [out]
    g.mutations = [(buf, new)]
    verify(g, check_shapes=True)
    feeds = {"buf": torch.randn(4, 3), "x": torch.randn(2, 3), "idx": torch.tensor([0, 2])}
    expected = run_graph(g, {k: v.clone() for k, v in feeds.items()})
    assert expected[0].abs().sum() > 0
    cse(g)
    assert g.op_counts()["aten.mul.Tensor"] == 2
    assert_same(run_graph(g, {k: v.clone() for k, v in feeds.items()}), expected)


def test_functional_reads_of_state_do_merge():
    # Before reinplace the write is functional: both reads see the old buffer, so they are one.
    g = Graph()
    buf = g.new_value("buf", f32(4, 3), "state")
    x = g.new_value("x", f32(2, 3), "input")
    idx = g.new_value("idx", TensorMeta(torch.int64, (2,)), "input")
    old = op(g, "aten.mul.Tensor", (buf, 2.0), f32(4, 3))
    new = op(g, "aten.index_put", (buf, [idx], x), f32(4, 3))
    again = op(g, "aten.mul.Tensor", (buf, 2.0), f32(4, 3))
    g.outputs = [op(g, "aten.sub.Tensor", (again, old), f32(4, 3))]
    g.mutations = [(buf, new)]
    cse(g)
    assert g.op_counts()["aten.mul.Tensor"] == 1
    verify(g, check_shapes=True)
    assert torch.equal(run_graph(g, {"buf": torch.randn(4, 3), "x": torch.randn(2, 3),
                                     "idx": torch.tensor([0, 2])})[0], torch.zeros(4, 3))
