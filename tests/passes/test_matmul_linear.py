"""Projections written as matmuls with a transposed weight become aten.linear (passes/patterns/matmul_linear.py),
and a constant consecutive index becomes a slice (frontend/convert.py): checked against eager on random inputs."""
import pytest
import torch

import ostinato
from helpers import export_and_compare


class Styles(torch.nn.Module):
    """Four ways to write ``x @ W.T (+ b)``: the operator with .T, matmul with .t(), transpose(0, 1) with a
    bias added, and a 2-d input's addmm form."""

    def __init__(self, dim=16, hidden=24):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(hidden, dim) / 4)
        self.w2 = torch.nn.Parameter(torch.randn(dim, hidden) / 4)
        self.w3 = torch.nn.Parameter(torch.randn(dim, dim) / 4)
        self.b3 = torch.nn.Parameter(torch.randn(dim))
        self.w4 = torch.nn.Parameter(torch.randn(dim, dim) / 4)
        self.b4 = torch.nn.Parameter(torch.randn(dim))

    def forward(self, x):
        h = torch.relu(x @ self.w1.T)
        h = torch.matmul(h, self.w2.t()) + x
        h = h @ self.w3.transpose(0, 1) + self.b3
        flat = h.reshape(-1, h.shape[-1])
        return torch.addmm(self.b4, flat, self.w4.T).view(h.shape)


def test_every_style_becomes_linear_and_matches_eager():
    torch.manual_seed(0)
    prog, _ = export_and_compare(Styles(), (torch.randn(2, 3, 16),), more_inputs=[(torch.randn(2, 3, 16),)])
    ops = prog.op_counts()
    assert not {"aten.mm", "aten.addmm", "aten.permute", "aten.t"} & set(ops), ops
    linears = [n for n in prog.graph.nodes if n.op in ("aten.linear", "ost.linear")]
    assert len(linears) == 4
    # the flatten and unflatten around each matmul went in: every projection reads a 3-d tensor
    assert all(n.args[0].meta.rank == 3 for n in linears), [n.args[0].meta.shape for n in linears]
    # the weights stay the stored [out, in] constants
    assert all(n.args[1].role == "constant" for n in linears)


class ActivationWeight(torch.nn.Module):
    def forward(self, x, y):
        return x @ y.T


def test_a_matmul_with_an_input_stays_a_matmul():
    x, y = torch.randn(2, 3, 8), torch.randn(5, 8)
    prog, _ = export_and_compare(ActivationWeight(), (x, y))
    assert "aten.linear" not in prog.op_counts() and "ost.linear" not in prog.op_counts()


class Regrouped(torch.nn.Module):
    """The flattened rows are regrouped differently after the matmul (a view into heads, as Falcon's
    fused QKV): the linear reads x itself and the view reads its [..., out] result."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        return (x.reshape(-1, 8) @ self.w.T).view(3, 2, 8)


class FlatReadByAdd(torch.nn.Module):
    """The flat result is read by an add of a flat tensor: the flatten stays."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x, r):
        return x.reshape(-1, 8) @ self.w.T + r


def test_a_regrouping_view_reads_the_linear_of_x_itself():
    prog, _ = export_and_compare(Regrouped(), (torch.randn(2, 3, 8),), more_inputs=[(torch.randn(2, 3, 8),)])
    lin = next(n for n in prog.graph.nodes if n.op == "aten.linear")
    assert lin.args[0].meta.rank == 3 and tuple(lin.outputs[0].meta.shape) == (2, 3, 8)
    assert prog.op_counts().get("aten.view", 0) == 1


def test_a_flat_result_read_by_another_op_keeps_its_flatten():
    prog, _ = export_and_compare(FlatReadByAdd(), (torch.randn(2, 3, 8), torch.randn(6, 8)))
    lin = next(n for n in prog.graph.nodes if n.op in ("aten.linear", "ost.linear"))
    assert lin.args[0].meta.rank == 2


class FusedHeads(torch.nn.Module):
    """Falcon's multi-query split: ``qkv[..., :-2, :], qkv[..., [-2], :], qkv[..., [-1], :]``, and a gather
    that is not consecutive (kept as a gather)."""

    def __init__(self, heads=4, d=8):
        super().__init__()
        self.heads, self.d = heads, d
        self.qkv = torch.nn.Linear(d * heads, (heads + 2) * d, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        f = self.qkv(x).view(b, s, self.heads + 2, self.d)
        q, k, v = f[..., :-2, :], f[..., [-2], :], f[..., [-1], :]
        scattered = f[..., [0, 2], :]
        return q * k + v, scattered


def test_a_constant_consecutive_index_is_a_slice():
    torch.manual_seed(1)
    x = torch.randn(2, 3, 32)
    prog, _ = export_and_compare(FusedHeads(), (x,), more_inputs=[(torch.randn(2, 3, 32),)])
    ops = prog.op_counts()
    assert ops.get("aten.index.Tensor", 0) == 1, ops        # only [0, 2] stays a gather
    starts = sorted(n.args[2] for n in prog.graph.nodes if n.op == "aten.slice.Tensor" and n.args[1] == 2)
    assert starts[-2:] == [4, 5], starts


@pytest.mark.parametrize("index", [[-1], [1, 2, 3], [3]])
def test_index_as_slice_on_other_dims(index):
    class M(torch.nn.Module):
        def forward(self, x):
            return x[:, index] * 2

    x = torch.randn(3, 5, 4)
    prog, _ = export_and_compare(M(), (x,))
    assert "aten.index.Tensor" not in prog.op_counts()


class InOutWeights(torch.nn.Module):
    """Weights stored [in, out] and used as ``x @ self.w`` (research code, JAX ports): the up projection's
    GELU and the whole down projection become ost.linear (weight_t) like GPT-2's Conv1D."""

    def __init__(self, dim=16, hidden=32):
        super().__init__()
        self.up = torch.nn.Parameter(torch.randn(dim, hidden) / 4)
        self.down = torch.nn.Parameter(torch.randn(hidden, dim) / 4)

    def forward(self, x):
        return torch.nn.functional.gelu(x @ self.up) @ self.down + x


def test_in_out_weights_become_linears_with_their_activation():
    torch.manual_seed(2)
    prog, _ = export_and_compare(InOutWeights(), (torch.randn(2, 3, 16),), more_inputs=[(torch.randn(2, 3, 16),)])
    ops = prog.op_counts()
    assert ops.get("ost.linear") == 2 and "aten.mm" not in ops and "aten.gelu" not in ops, ops
    acts = sorted(str(n.args[3]) for n in prog.graph.nodes if n.op == "ost.linear")
    assert acts == ["None", "gelu"] and all(n.args[4] is True for n in prog.graph.nodes if n.op == "ost.linear")
