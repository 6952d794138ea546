"""passes.matvec: a bmm/mm of one output column and a short K becomes a permute, a multiply and a sum
(in fp32 for half precisions), which the code generator fuses with what produces its matrix. It is in
the default pipeline of programs exported from accelerator tensors, not CPU ones (the CPU backend does
not fuse): these tests ask for DEFAULT_PIPELINE by name and run the result on the CPU."""
import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch.export import Dim

import ostinato
from helpers import assert_same
from ostinato.passes import DEFAULT_PIPELINE, default_pipeline


def export_and_compare(model, args, tol):
    prog = ostinato.export(model, args, passes=DEFAULT_PIPELINE)
    exe = ostinato.compile(prog, device="cpu")
    with torch.no_grad():
        assert_same(exe(*args), model(*args), tol)
    return prog, exe


class StateTimesColumn(torch.nn.Module):
    """Mamba's per-token product: an updated state [b, d, k] times a column of C."""

    def forward(self, dA, state, dBu, c):
        state = dA * state + dBu
        return torch.matmul(state, c.unsqueeze(-1)), state


class MatrixColumn(torch.nn.Module):
    """aten.mm: [m, k] @ [k, 1] after a pointwise op."""

    def forward(self, a, v):
        return torch.tanh(a) @ v


def _ops(prog) -> dict:
    out: dict = {}
    for n in prog.graph.nodes:
        out[n.op] = out.get(n.op, 0) + 1
    return out


@settings(max_examples=12, deadline=None)
@given(b=st.integers(1, 3), d=st.integers(1, 40), k=st.integers(1, 64), seed=st.integers(0, 2**16))
def test_bmm_of_one_column_becomes_a_sum(b, d, k, seed):
    g = torch.Generator().manual_seed(seed)
    args = (torch.rand(b, d, k, generator=g), torch.randn(b, d, k, generator=g), torch.randn(b, d, k, generator=g),
            torch.randn(b, k, generator=g))
    prog, _ = export_and_compare(StateTimesColumn(), args, tol=1e-5)
    ops = _ops(prog)
    assert "aten.bmm" not in ops and ops.get("aten.sum.dim_IntList") == 1, ops


def test_mm_of_one_column_becomes_a_sum():
    prog, _ = export_and_compare(MatrixColumn(), (torch.randn(7, 33), torch.randn(33, 1)), tol=1e-5)
    ops = _ops(prog)
    assert "aten.mm" not in ops and ops.get("aten.sum.dim_IntList") == 1, ops


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_sums_in_fp32(dtype):
    """bf16/fp16: read as fp32, summed in fp32, rounded once: as close to eager's matmul as its own
    fp32 accumulation (an fp16 sum of 64 products would be further off)."""
    torch.manual_seed(3)
    args = tuple(t.to(dtype) for t in (torch.rand(2, 16, 64), torch.randn(2, 16, 64), torch.randn(2, 16, 64),
                                       torch.randn(2, 64)))
    prog = ostinato.export(StateTimesColumn(), args, passes=DEFAULT_PIPELINE)
    ops = _ops(prog)
    assert "aten.bmm" not in ops and ops.get("aten._to_copy", 0) >= 3, ops
    exe = ostinato.compile(prog, device="cpu")
    got = exe(*args)
    dA, state, dBu, c = (t.double() for t in args)
    new = (dA * state + dBu).to(dtype).double()         # eager rounds the state to the dtype
    exact = new @ c.unsqueeze(-1)
    assert (got[0].double() - exact).abs().max() <= 2 * torch.finfo(dtype).eps * exact.abs().max() + 1e-6


@pytest.mark.parametrize("shapes", [((2, 5, 65), (2, 65, 1)),     # K past MAX_K
                                    ((2, 5, 8), (2, 8, 2)),       # two output columns
                                    ((4, 8), (8, 3))], ids=["long-k", "two-columns", "mm-three-columns"])
def test_other_matmuls_stay(shapes):
    a, b = (torch.randn(s) for s in shapes)

    class M(torch.nn.Module):
        def forward(self, x, y):
            return x @ y
    prog, _ = export_and_compare(M(), (a, b), tol=1e-5)
    ops = _ops(prog)
    assert ops.get("aten.bmm", 0) + ops.get("aten.mm", 0) == 1 and "aten.sum.dim_IntList" not in ops, ops


def test_symbolic_rows_keep_the_rewrite_and_run_at_each_size():
    """The batch and rows may be symbolic; K and the one column must be static."""
    model = StateTimesColumn()
    make = lambda b, d: (torch.rand(b, d, 16), torch.randn(b, d, 16), torch.randn(b, d, 16), torch.randn(b, 16))  # noqa: E731
    dims = {0: Dim("b", min=1, max=8), 1: Dim("d", min=2, max=64)}
    prog = ostinato.export(model, make(3, 10), dynamic_shapes=(dims, dims, dims, {0: dims[0]}), passes=DEFAULT_PIPELINE)
    assert "aten.bmm" not in _ops(prog)
    exe = ostinato.compile(prog, device="cpu")
    for b, d in ((1, 2), (5, 33), (8, 64)):
        args = make(b, d)
        with torch.no_grad():
            assert_same(exe(*args), model(*args), 1e-5, msg=f"b={b} d={d}:")


def test_default_pipeline_rewrites_only_for_accelerator_tensors():
    """From CPU tensors the default export keeps the matmul (and the cache key names its pipeline);
    the pipeline for tensors elsewhere has the rewrite."""
    args = (torch.rand(2, 8, 16), torch.randn(2, 8, 16), torch.randn(2, 8, 16), torch.randn(2, 16))
    prog = ostinato.export(StateTimesColumn(), args)
    assert _ops(prog).get("aten.bmm") == 1
    names = lambda p: [n for n, _ in p]  # noqa: E731
    assert "small_matvec" not in names(default_pipeline((args, {})))
    assert "small_matvec" in names(default_pipeline(((torch.empty(2, device="meta"),), {})))
    assert names(default_pipeline(((torch.empty(2, device="meta"),), {}))) == names(DEFAULT_PIPELINE)
