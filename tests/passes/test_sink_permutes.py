"""passes.sink_permutes: a permute of a pointwise result read by pointwise ops moves onto the operands."""
import torch
from torch.export import Dim

from helpers import export_and_compare


def _permuted_ops(prog):
    """The ops whose result a permute reads."""
    return sorted(n.args[0].producer.op for n in prog.graph.nodes
                  if n.op == "aten.permute" and n.args[0].producer is not None)


class LayerScale(torch.nn.Module):
    """ConvNeXt's end of block: gamma * h over NHWC, back to NCHW, the residual add."""

    def __init__(self, c=6):
        super().__init__()
        self.gamma = torch.nn.Parameter(torch.rand(c) + 0.5)

    def forward(self, x, h):
        return x + (self.gamma * h).permute(0, 3, 1, 2)


class Chain(torch.nn.Module):
    """A chain of pointwise ops with a broadcast operand and a Python scalar, then a transposing permute."""

    def forward(self, a, b, y):
        return torch.sigmoid(torch.nn.functional.silu(a * 2.0 + b) - 1.0).permute(2, 0, 1) * y


class Kept(torch.nn.Module):
    """Permutes that stay: an op whose result is also read elsewhere, one read by a matmul, one that is an
    output of the graph read by nothing else."""

    def forward(self, a, w):
        s = a.sin()
        t = a.cos().permute(1, 0)
        return s.permute(1, 0) + s.sum(), t @ w, (a * 3).permute(1, 0)


def test_layer_scale_sinks_and_matches():
    x, h = torch.randn(2, 6, 4, 5), torch.randn(2, 4, 5, 6)
    prog, _ = export_and_compare(LayerScale(), (x, h))
    # the permutes read the gamma's view and h: nothing computed is permuted any more
    assert _permuted_ops(prog) == ["aten.view"]
    assert [n.op for n in prog.graph.nodes if n.op.startswith("aten.") and "permute" not in n.op
            and "view" not in n.op] == ["aten.mul.Tensor", "aten.add.Tensor"]


def test_chain_sinks_all_the_way():
    a, b, y = torch.randn(3, 4, 5), torch.randn(5), torch.randn(5, 3, 4)
    prog, _ = export_and_compare(Chain(), (a, b, y))
    assert _permuted_ops(prog) == ["aten.view"]     # b's view; a itself is an input


def test_symbolic_batch_with_full_rank_operands():
    x, h = torch.randn(2, 6, 4, 5), torch.randn(2, 4, 5, 6)

    class Full(torch.nn.Module):
        def forward(self, x, h):
            return x + (h * h).permute(0, 3, 1, 2)

    batch = Dim("batch", min=1, max=8)
    prog, _ = export_and_compare(Full(), (x, h), dynamic_shapes=({0: batch}, {0: batch}),
                                 more_inputs=[(torch.randn(5, 6, 4, 5), torch.randn(5, 4, 5, 6))])
    assert _permuted_ops(prog) == []


def test_permutes_that_stay():
    a, w = torch.randn(4, 3), torch.randn(4, 2)
    prog, _ = export_and_compare(Kept(), (a, w))
    assert _permuted_ops(prog) == ["aten.cos", "aten.mul.Tensor", "aten.sin"]
