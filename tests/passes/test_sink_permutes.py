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


class GatherThenTranspose(torch.nn.Module):
    """DeBERTa's position-to-content scores: gathered at relative distances, transposed, then added; and
    a gather along a middle dim permuted three ways."""

    def forward(self, scores, p2c, idx, x, idx3):
        g = torch.gather(p2c, -1, idx.expand(scores.shape)).transpose(-1, -2)
        h = torch.gather(x, 1, idx3).permute(2, 0, 1)
        return scores + g / 2, h * 3


def test_gather_sinks_with_its_index_and_matches():
    g = torch.Generator().manual_seed(0)
    scores, p2c = torch.randn(3, 5, 5, generator=g), torch.randn(3, 5, 9, generator=g)
    idx = torch.randint(0, 9, (1, 5, 5), generator=g)
    x, idx3 = torch.randn(2, 6, 4, generator=g), torch.randint(0, 6, (2, 3, 4), generator=g)
    prog, _ = export_and_compare(GatherThenTranspose(), (scores, p2c, idx, x, idx3))
    gathers = [n for n in prog.graph.nodes if n.op == "aten.gather"]
    # both gathers now read permuted operands along their renumbered dims; nothing reads them permuted
    assert sorted(n.args[1] for n in gathers) == [1, 2]
    assert all(n.args[0].producer.op == "aten.permute" and n.args[2].producer.op == "aten.permute" for n in gathers)
    assert "aten.gather" not in _permuted_ops(prog)


# -- sink_unit_views: a view that only inserts or removes 1-dims -----------------------------------------
class OptStyleBlock(torch.nn.Module):
    """OPT's decoder layer as transformers writes it: the residual add over [B, 1, H], the sum reshaped to
    [B, H] for the LayerNorm and the MLP, then the second residual add viewed back to [B, 1, H] for the
    next layer's LayerNorm."""

    def __init__(self, h=32, dtype=torch.float32):
        super().__init__()
        self.attn_out = torch.nn.Linear(h, h).to(dtype)
        self.norm1 = torch.nn.LayerNorm(h).to(dtype)
        self.fc1 = torch.nn.Linear(h, 2 * h).to(dtype)
        self.fc2 = torch.nn.Linear(2 * h, h).to(dtype)
        self.norm2 = torch.nn.LayerNorm(h).to(dtype)

    def forward(self, x, a):
        hidden = x + self.attn_out(a)                   # [B, 1, H]
        shape = hidden.shape
        hidden = hidden.reshape(-1, hidden.size(-1))     # [B, H]
        residual = hidden
        hidden = self.fc2(torch.relu(self.fc1(self.norm1(hidden))))
        hidden = (residual + hidden).view(shape)        # [B, 1, H]
        return self.norm2(hidden)


def _view_sources(prog):
    """The ops whose result a view reads."""
    return sorted(n.args[0].producer.op for n in prog.graph.nodes
                  if n.op in ("aten.view", "aten.reshape", "aten._unsafe_view") and n.args[0].producer is not None)


def _adds_grouped_with_norms(prog) -> int:
    """How many of the scheduler's fusion groups hold both a residual add and a LayerNorm."""
    from ostinato.codegen import FusionGroup, schedule
    return sum(1 for it in schedule(prog.graph) if isinstance(it, FusionGroup)
               and {n.op for n in it.nodes} >= {"aten.add.Tensor", "ost.layer_norm"})


def test_unit_views_sink_through_the_residual_adds_and_match():
    torch.manual_seed(3)
    for dtype in (torch.float32, torch.bfloat16):
        x, a = torch.randn(8, 1, 32, dtype=dtype), torch.randn(8, 1, 32, dtype=dtype)
        prog, _ = export_and_compare(OptStyleBlock(dtype=dtype), (x, a),
                                     more_inputs=[(torch.randn(8, 1, 32, dtype=dtype),
                                                   torch.randn(8, 1, 32, dtype=dtype))])
        # each norm reads an add: the views moved onto the adds' operands
        norm_inputs = [n.args[0].producer.op for n in prog.graph.nodes if n.op == "ost.layer_norm"]
        assert norm_inputs == ["aten.add.Tensor", "aten.add.Tensor"]
        assert _adds_grouped_with_norms(prog) == 2


def test_unit_views_sink_with_a_symbolic_batch():
    batch = Dim("batch", min=2, max=16)
    prog, _ = export_and_compare(OptStyleBlock(), (torch.randn(4, 1, 32), torch.randn(4, 1, 32)),
                                 dynamic_shapes=({0: batch}, {0: batch}),
                                 more_inputs=[(torch.randn(9, 1, 32), torch.randn(9, 1, 32))])
    assert [n.args[0].producer.op for n in prog.graph.nodes if n.op == "ost.layer_norm"] == ["aten.add.Tensor"] * 2


class ViewsThatStay(torch.nn.Module):
    """Views that stay: one that merges non-unit dims, one over an op with a broadcast operand, one over an
    op whose result is read elsewhere too."""

    def __init__(self):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.rand(16) + 0.5)

    def forward(self, x, y):
        merged = (x * 2.0).reshape(-1, 16)               # [4, 2, 16] -> [8, 16]: not unit dims only
        biased = (y + self.bias).view(4, 16)              # [4, 1, 16] + [16]: a broadcast operand
        s = y.sin()
        return merged.sum(-1), biased.softmax(-1), s.view(4, 16) + s.sum()


def test_unit_views_that_stay():
    x, y = torch.randn(4, 2, 16), torch.randn(4, 1, 16)
    prog, _ = export_and_compare(ViewsThatStay(), (x, y))
    assert _view_sources(prog) == ["aten.add.Tensor", "aten.mul.Tensor", "aten.sin"]


class ScaledRelativeScores(torch.nn.Module):
    """DeBERTa-v3's relative scores: two gathers, each scaled, added, then viewed to four dims for the mask
    and the softmax."""

    def forward(self, c2p, p2c, idx):
        a = torch.gather(c2p, -1, idx) / 2.0
        b = torch.gather(p2c, -1, idx) / 3.0
        return torch.softmax((a + b).view(1, 3, 5, 5) + 1.0, dim=-1)


def test_unit_views_do_not_sink_onto_gathers():
    """The view stays after the add: sunk onto the gathers' results, it would keep the code generator from
    taking each gather into the kernel that scales it (two more launches a DeBERTa layer, 12% of a
    DeBERTa-v3-base step on an H200)."""
    from ostinato.codegen.report import launch_table
    g = torch.Generator().manual_seed(0)
    c2p, p2c = torch.randn(3, 5, 9, generator=g), torch.randn(3, 5, 9, generator=g)
    idx = torch.randint(0, 9, (3, 5, 5), generator=g)
    prog, _ = export_and_compare(ScaledRelativeScores(), (c2p, p2c, idx))
    assert _view_sources(prog) == ["aten.add.Tensor"]
    assert "aten.gather" not in [r["kind"] for r in launch_table(prog.graph, "cuda")]
