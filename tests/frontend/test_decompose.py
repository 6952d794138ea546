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
    with decompositions(table) as run:
        got = [str(run(ep).graph) for ep in eps]
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
