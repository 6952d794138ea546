import copy

import torch

import ostinato
from ostinato.ir import Graph, TensorMeta, verify
from ostinato.passes import eliminate_common_subexpressions as cse
from ostinato.passes import eliminate_dead_code as dce
from helpers import assert_same
from pass_harness import f32, op, run_graph


def _graph():
    g = Graph()
    buf = g.new_value("buf", f32(4, 3), "state")
    x = g.new_value("x", f32(4, 3), "input")
    idx = g.new_value("idx", TensorMeta(torch.int64, (2,)), "input")
    dead1 = op(g, "aten.exp", (x,), f32(4, 3), node_name="dead1")
    op(g, "aten.sum", (dead1,), TensorMeta(torch.float32, ()), node_name="dead2")  # unused chain
    op(g, "aten.rand", ([4, 3],), f32(4, 3), {"device": torch.device("cpu")}, node_name="unused_rand")
    rows = op(g, "aten.index_select", (x, 0, idx), f32(2, 3), node_name="rows")
    write = op(g, "aten.index_put", (buf, [idx], rows), f32(4, 3), node_name="write")  # mutation value
    y = op(g, "aten.tanh", (x,), f32(4, 3), node_name="y")
    g.outputs = [y, 7]
    g.mutations = [(buf, write)]
    return g


def test_unused_pure_nodes_go_and_effects_stay():
    g = _graph()
    verify(g, check_shapes=True)
    feeds = {"buf": torch.randn(4, 3), "x": torch.randn(4, 3), "idx": torch.tensor([3, 1])}
    ref_feeds = {k: v.clone() for k, v in feeds.items()}
    expected = run_graph(g, ref_feeds)
    dce(g)
    assert [n.name for n in g.nodes] == ["unused_rand", "rows", "write", "y"]
    verify(g, check_shapes=True)
    out = run_graph(g, feeds)
    assert_same(out, expected)
    assert_same(feeds["buf"], ref_feeds["buf"])  # the state write still happened
    assert torch.equal(feeds["buf"][[3, 1]], feeds["x"][[3, 1]])


def test_dead_chain_goes_in_one_call():
    g = Graph()
    x = g.new_value("x", f32(5), "input")
    v = x
    for _ in range(6):
        v = op(g, "aten.neg", (v,), f32(5))
    g.outputs = [op(g, "aten.abs", (x,), f32(5))]
    dce(g)
    assert g.op_counts() == {"aten.abs": 1}


def test_in_place_writes_are_never_dropped():
    g = Graph()
    buf = g.new_value("buf", f32(4, 3), "state")
    x = g.new_value("x", f32(2, 3), "input")
    idx = g.new_value("idx", TensorMeta(torch.int64, (2,)), "input")
    op(g, "aten.index_put_", (buf, [idx], x), f32(4, 3))   # result unread, and not a mutation value
    g.outputs = [op(g, "aten.cos", (x,), f32(2, 3))]
    dce(g)
    assert g.op_counts() == {"aten.index_put_": 1, "aten.cos": 1}


class Duplicates(torch.nn.Module):
    def forward(self, x):
        a = torch.exp(x) * 2
        b = torch.exp(x) * 2   # same as a: after CSE it is a dead duplicate's chain
        return a + b, torch.exp(x).sum()


def test_after_cse_on_an_exported_module():
    model = Duplicates()
    x = torch.randn(3, 4)
    prog = ostinato.export(model, (x,), passes=[])
    assert prog.op_counts()["aten.exp"] == 3
    cse(prog.graph)
    dce(prog.graph)
    assert prog.op_counts() == {"aten.exp": 1, "aten.mul.Tensor": 1, "aten.add.Tensor": 1, "aten.sum.dim_IntList": 1}
    verify(prog.graph, check_shapes=True, hints=prog.hints)
    assert_same(ostinato.compile(prog)(x), copy.deepcopy(model)(x))
