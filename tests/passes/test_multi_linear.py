"""ost.multi_linear: sibling projections of one input become one op, run as one matmul over weights the
runtime packs one after another (no second copy), with results equal to eager."""
from __future__ import annotations

import torch

import ostinato
from helpers import assert_same


class QKV(torch.nn.Module):
    def __init__(self, bias: bool):
        super().__init__()
        self.q, self.k, self.v = torch.nn.Linear(32, 32, bias), torch.nn.Linear(32, 16, bias), torch.nn.Linear(32, 16, bias)
        self.other = torch.nn.Linear(16, 8)

    def forward(self, x, y):
        return self.q(x), self.k(x) * 2, torch.relu(self.v(x)), self.other(y)


def _weights_share_storage(exe, names):
    g = exe.program.graph
    slots = {v.name: v.slot for v in g.constants}
    ts = [exe._template[slots[n]] for n in names]
    return len({t.untyped_storage().data_ptr() for t in ts}) == 1


def test_siblings_become_one_op_and_one_buffer():
    for bias in (False, True):
        m = QKV(bias).eval()
        x, y = torch.randn(2, 5, 32), torch.randn(3, 16)
        prog = ostinato.export(m, (x, y))
        ops = prog.op_counts()
        assert ops["ost.multi_linear"] == 1 and ops["aten.linear"] == 1, ops
        exe = ostinato.compile(prog)
        assert _weights_share_storage(exe, ["q.weight", "k.weight", "v.weight"])
        if bias:
            assert _weights_share_storage(exe, ["q.bias", "k.bias", "v.bias"])
        with torch.no_grad():
            ref = m(x, y)
        assert_same(exe(x, y), ref)
        x2 = torch.randn(2, 5, 32)
        with torch.no_grad():
            assert_same(exe(x2, y), m(x2, y))


class Mixed(torch.nn.Module):
    """One with a bias beside three without: it stays alone. The weight also read elsewhere joins the
    group (its other reader reads the packed buffer's view of it)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 16, bias=False)
        self.b = torch.nn.Linear(16, 16, bias=True)
        self.c = torch.nn.Linear(16, 16, bias=False)
        self.tied = torch.nn.Linear(16, 16, bias=False)

    def forward(self, x):
        return self.a(x), self.b(x), self.c(x), self.tied(x) + self.tied.weight.sum()


def test_only_fitting_siblings_merge():
    m = Mixed().eval()
    x = torch.randn(4, 16)
    prog = ostinato.export(m, (x,))
    (node,) = [n for n in prog.graph.nodes if n.op == "ost.multi_linear"]
    assert [w.name for w in node.args[1]] == ["a.weight", "c.weight", "tied.weight"] and node.args[2] is None
    exe = ostinato.compile(prog)
    with torch.no_grad():
        assert_same(exe(x), m(x))
        x2 = torch.randn(4, 16)
        assert_same(exe(x2), m(x2))


class SharedProjections(torch.nn.Module):
    """DeBERTa's form: q, k, v of the hidden states, and k and q again over a shared table. Both sets
    are siblings; they share weights, so only the first becomes a multi_linear."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(16, 16) for _ in range(3))
        self.table = torch.nn.Parameter(torch.randn(6, 16))

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        pk, pq = self.k(self.table), self.q(self.table)
        return (q @ k.transpose(-1, -2)).softmax(-1) @ v + (q @ pk.t()).sum(-1, keepdim=True) + pq.mean()


def test_a_weight_joins_one_group_only():
    m = SharedProjections().eval()
    gen = torch.Generator().manual_seed(0)
    inputs = [(torch.randn(2, 5, 16, generator=gen),) for _ in range(2)]
    prog = ostinato.export(m, inputs[0])
    groups = [n for n in prog.graph.nodes if n.op == "ost.multi_linear"]
    assert [[w.name for w in n.args[1]] for n in groups] == [["q.weight", "k.weight", "v.weight"]]
    assert sum(n.op == "aten.linear" for n in prog.graph.nodes) == 2
    exe = ostinato.compile(prog)
    for a in inputs:
        with torch.no_grad():
            assert_same(exe(*a), m(*a))


def test_unpacked_weights_fall_back_to_one_matmul_each():
    from ostinato.ir.fused_ops import multi_linear
    x = torch.randn(3, 8)
    ws = [torch.randn(4, 8), torch.randn(6, 8)]
    out = multi_linear(x, ws, None)
    assert_same(out, tuple(torch.nn.functional.linear(x, w) for w in ws))
    buf = torch.cat(ws)
    packed = multi_linear(x, [buf[:4], buf[4:]], None)
    assert_same(packed, out, tol=1e-5)
    assert packed[0]._base is not None or packed[0].stride() != (4, 1)   # views of one result
