"""The residual add taken into the RMS norm that reads its sum (``ost.add_rms_norm``)."""
import pytest
import torch

import ostinato
from helpers import export_and_compare
from test_rms_norm import HFRMSNorm


class ResidualNorm(torch.nn.Module):
    """A residual add whose sum is normalized and also read again (the pre-norm block's pattern)."""

    def __init__(self, dim, upcast: bool, alpha=None, broadcast=False):
        super().__init__()
        self.norm = HFRMSNorm(dim) if upcast else None
        self.weight = torch.nn.Parameter(torch.rand(dim) + 0.5)
        self.alpha, self.broadcast = alpha, broadcast

    def forward(self, x, r):
        r = r[0] if self.broadcast else r
        s = x + r if self.alpha is None else torch.add(x, r, alpha=self.alpha)
        if self.norm is not None:
            n = self.norm(s)
        else:
            n = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return s * 3, n


@pytest.mark.parametrize("upcast", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_residual_add_and_norm_become_one_op(upcast, dtype):
    torch.manual_seed(2)
    model = ResidualNorm(40, upcast).to(dtype)
    x, r = torch.randn(3, 4, 40, dtype=dtype), torch.randn(3, 4, 40, dtype=dtype)
    # Compared exactly (assert_same): the reference is the add and the norm, as eager computes them.
    prog, exe = export_and_compare(model, (x, r), more_inputs=[(torch.randn(3, 4, 40, dtype=dtype) * 4,
                                                               torch.randn(3, 4, 40, dtype=dtype))])
    assert prog.op_counts()["ost.add_rms_norm"] == 1
    assert "aten.add.Tensor" not in prog.op_counts() and "ost.rms_norm" not in prog.op_counts()
    (node,) = [n for n in prog.graph.nodes if n.op == "ost.add_rms_norm"]
    assert len(node.outputs) == 2 and node.args[4] == (torch.float32 if upcast and dtype != torch.float32 else None)
    # Replay writes both results into the arena through the reference's out_sum= and out=.
    g = ostinato.Graph()
    with ostinato.graph(g):
        exe(x, r)
    assert "out_sum=" in g.source
    x2, r2 = torch.randn(3, 4, 40, dtype=dtype), torch.randn(3, 4, 40, dtype=dtype)
    g.replay(x2, r2)
    with torch.no_grad():
        expected = model(x2, r2)
    assert all(torch.equal(a, b) for a, b in zip(g.outputs, expected))


@pytest.mark.parametrize("kind", ["alpha", "broadcast"])
def test_add_that_is_not_a_plain_residual_is_not_taken_in(kind):
    model = ResidualNorm(16, upcast=False, alpha=2 if kind == "alpha" else None, broadcast=kind == "broadcast")
    prog, _ = export_and_compare(model, (torch.randn(2, 16), torch.randn(2, 16)),
                                 more_inputs=[(torch.randn(2, 16), torch.randn(2, 16))])
    assert "ost.add_rms_norm" not in prog.op_counts() and prog.op_counts()["ost.rms_norm"] == 1


def test_weight_computed_after_the_add_is_not_taken_in():
    """The fused node stands where the add stood: a weight computed later keeps the two apart."""
    from ostinato.ir import Graph
    from ostinato.passes.patterns import fuse_add_rms_norm
    from pass_harness import f32, op, run_graph
    g = Graph()
    x, r = (g.new_value(name, f32(2, 8), "input") for name in "xr")
    w0 = g.new_value("w0", f32(8), "input")
    s = op(g, "aten.add.Tensor", (x, r), f32(2, 8))
    w = op(g, "aten.neg", (w0,), f32(8))
    n = op(g, "ost.rms_norm", (s, w, 1e-6, None), f32(2, 8))
    g.outputs = [s, n]
    fuse_add_rms_norm(g)
    assert [node.op for node in g.nodes] == ["aten.add.Tensor", "aten.neg", "ost.rms_norm"]
    # Moved before the add, the weight's producer lets the pair fuse; the results stay the same.
    g.nodes = [g.nodes[1], g.nodes[0], g.nodes[2]]
    feeds = {"x": torch.randn(2, 8), "r": torch.randn(2, 8), "w0": torch.randn(8)}
    before = run_graph(g, feeds)
    fuse_add_rms_norm(g)
    assert [node.op for node in g.nodes] == ["aten.neg", "ost.add_rms_norm"]
    after = run_graph(g, feeds)
    assert all(torch.equal(a, b) for a, b in zip(before, after))
