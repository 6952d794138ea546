"""frontend/decompose.py: several programs decomposed with torch's CIA override entered once give the
graphs ``run_decompositions`` gives, and torch is left as it was."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ostinato.frontend import decomposition_table
from ostinato.frontend.decompose import decompositions


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        h = F.silu(self.lin(x))   # linear, silu, layer_norm: kept whole (KEEP_WHOLE)
        return self.norm(h).repeat(1, 2) + F.gelu(h).sum(-1, keepdim=True)


class Other(nn.Module):
    def forward(self, x):
        return F.scaled_dot_product_attention(x, x, x).flatten(1).softmax(-1)


def _export(model, x):
    with torch.no_grad():
        return torch.export.export(model.eval(), (x,), strict=False)


def test_same_graphs_as_run_decompositions_and_torch_restored():
    xp = torch.export.exported_program
    override = xp._override_composite_implicit_decomp
    kernels = dict(torch.ops.aten.linear.default.py_kernels)
    table = decomposition_table()
    eps = [_export(Net(), torch.randn(3, 8)), _export(Other(), torch.randn(2, 4, 5, 8))]
    want = [str(ep.run_decompositions(table).graph) for ep in eps]
    with decompositions(table) as core:
        got = [str(core.run(ep).graph) for ep in eps]
    assert got == want
    assert "aten.linear.default" in got[0] and "aten.scaled_dot_product_attention" in got[1]
    assert xp._override_composite_implicit_decomp is override
    assert dict(torch.ops.aten.linear.default.py_kernels) == kernels


def test_an_error_inside_restores_torch():
    xp = torch.export.exported_program
    override = xp._override_composite_implicit_decomp
    try:
        with decompositions(decomposition_table()):
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert xp._override_composite_implicit_decomp is override
    ep = _export(Net(), torch.randn(3, 8)).run_decompositions(decomposition_table())
    assert "aten.linear.default" in str(ep.graph)


class Tied(nn.Module):
    """Tied embedding and head (one tensor, two names), a buffer the forward writes, kept-whole ops."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight
        self.norm = nn.LayerNorm(8)
        self.register_buffer("count", torch.zeros(8))

    def forward(self, ids):
        h = self.norm(F.silu(self.embed(ids)))
        self.count.copy_(self.count + h.sum((0, 1)))   # a buffer's new value, written with copy_
        return self.head(h) * 0.5


def _normal(ep) -> list[str]:
    """The graph's text without torch's metadata asserts (which ostinato drops) and user counts."""
    import re
    return [re.sub(r"\[num_users=\d+\] ", "", line) for line in str(ep.graph).splitlines()
            if "_assert_tensor_metadata" not in line]


def test_export_straight_to_core_aten_is_the_two_step_program():
    model, ids = Tied().eval(), torch.randint(0, 16, (2, 5))
    table = decomposition_table()
    with torch.no_grad():
        want = torch.export.export(model, (ids,), strict=False).run_decompositions(table)
        with decompositions(table) as core:
            got = core.export(model, (ids,))
    assert _normal(got) == _normal(want)
    assert got.graph_signature.input_specs == want.graph_signature.input_specs
    assert got.graph_signature.output_specs == want.graph_signature.output_specs
    assert "aten.copy" not in str(got.graph)
    # Both uses of the tied weight read its last name's placeholder, as in the re-traced program.
    head = next(n for n in got.graph.nodes if n.name == "p_head_weight")
    assert len(head.users) == 2 and not next(n for n in got.graph.nodes if n.name == "p_embed_weight").users


class Scaled(nn.Module):
    def forward(self, x, k: int, mode: str):
        return (x * k).softmax(-1), mode


def test_constant_input_is_inlined_as_in_the_two_step_program():
    args = (torch.randn(2, 3), 3, "fast")
    table = decomposition_table()
    with torch.no_grad():
        want = torch.export.export(Scaled(), args, strict=False).run_decompositions(table)
        with decompositions(table) as core:
            got = core.export(Scaled(), args)
    assert _normal(got) == _normal(want)
    assert "aten.mul.Tensor](args = (%x, 3)" in str(got.graph)
