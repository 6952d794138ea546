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
    """Siblings that must not merge: one with a bias beside two without, and a weight also read elsewhere."""

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
    assert [w.name for w in node.args[1]] == ["a.weight", "c.weight"] and node.args[2] is None
    exe = ostinato.compile(prog)
    with torch.no_grad():
        assert_same(exe(x), m(x))


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
