"""Table-driven op tests: each row exports a one-op module, checks that the exported program contains
the core ATen op the row claims, and compares ostinato's CPU output with eager PyTorch.

The table lives in op_cases.py. Static rows run twice at the exported shape (fresh random values the
second time); dynamic rows export with torch.export.Dim ranges and run again at other sizes.
"""
from __future__ import annotations

import os
import sys

import pytest
import torch
from torch.utils import _pytree as pytree

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import ostinato  # noqa: E402
from ostinato.passes import GENERIC_PIPELINE  # noqa: E402
from helpers import BACKENDS, assert_same  # noqa: E402
from op_cases import CASES  # noqa: E402
from mlx_expected import mlx_skip_reason, mlx_through_torch  # noqa: E402

# Each xdist worker gets one thread: the tensors are tiny and the machine's cores are shared.
torch.set_num_threads(1)


class _OneOp1(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, a):
        return self.fn(a)


class _OneOp2(_OneOp1):
    def forward(self, a, b):
        return self.fn(a, b)


class _OneOp3(_OneOp1):
    def forward(self, a, b, c):
        return self.fn(a, b, c)


class _OneOp4(_OneOp1):
    def forward(self, a, b, c, d):
        return self.fn(a, b, c, d)


class _OneOp5(_OneOp1):
    def forward(self, a, b, c, d, e):
        return self.fn(a, b, c, d, e)


_MODULES = {1: _OneOp1, 2: _OneOp2, 3: _OneOp3, 4: _OneOp4, 5: _OneOp5}


TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


def _export(case):
    """The row's one-op module exported at its first sizes: (program, example args, whether dynamic).
    Without the fused patterns: a row tests the ATen op it claims (patterns have their own tests)."""
    model = _MODULES[len(case.ins)](case.fn).eval()
    args = case.args(0, case.seed)
    dyn = case.dyn and TORCH >= case.dyn_torch
    prog = ostinato.export(model, args, dynamic_shapes=case.dynamic_shapes() if dyn else None,
                           passes=GENERIC_PIPELINE, strict=True)
    return prog, args, dyn


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@pytest.mark.parametrize("device", BACKENDS)
def test_op(case, device):
    """On MLX the program compiles with strict=True (every op through an MLX handler), except the rows
    mlx_expected lists (ops or forms of ops the MLX backend runs through torch), which must still match
    eager; tests/ops/mlx_expected.py says why for each."""
    if device == "mlx":
        reason = mlx_skip_reason(case)
        if reason:
            pytest.skip(reason)
    prog, args, dyn = _export(case)
    counts = prog.op_counts()
    assert counts.get(case.op, 0) > 0, f"{case.id}: exported program lacks {case.op}; it has {dict(counts)}"
    strict = device == "mlx" and not mlx_through_torch(case)
    exe = ostinato.compile(prog, device=device, strict=strict)
    if device == "mlx" and not strict:
        assert exe.stats()["torch_bridged"] > 0, f"{case.id} now runs on MLX alone: drop it from mlx_expected"
    # Static rows: the export sizes again with new values. Dynamic rows: the second sizes.
    runs = [(args, "export inputs"),
            (case.args(1 if dyn else 0, case.seed + 1), "other sizes" if dyn else "new values")]
    for inputs, what in runs:
        # Inputs keep their layout (non-contiguous and view rows test exactly that); the eager
        # reference runs first, and none of these ops writes to its inputs.
        with torch.no_grad():
            ref = case.fn(*inputs)
        out = exe(*inputs)
        assert_same(out, ref, case.tol, msg=f"{case.id} ({what}):")


def test_table_coverage():
    ops = {c.op for c in CASES}
    ids = [c.id for c in CASES]
    assert len(set(ids)) == len(ids), "duplicate case ids"
    n_dyn = sum(c.dyn for c in CASES)
    dtypes = {s.dtype for c in CASES for s in c.ins}
    print(f"\nop table: {len(CASES)} cases ({n_dyn} dynamic) over {len(ops)} distinct core ATen ops, "
          f"{len(dtypes)} input dtypes")
    print("ops:", " ".join(sorted(o[len('aten.'):] for o in ops)))
    assert len(ops) >= 80
    assert len(CASES) >= 400


def test_claimed_ops_registered():
    """Every op a row claims is one ostinato registers (else the row could never pass)."""
    from ostinato.ir.ops import get_op
    missing = sorted({c.op for c in CASES if get_op(c.op) is None})
    assert not missing, f"rows claim ops ostinato does not register: {missing}"


def _to_cuda(x):
    """An input on the GPU with the same layout (non-contiguous and view rows keep theirs)."""
    if not isinstance(x, torch.Tensor):
        return x
    if x.is_contiguous():
        return x.cuda()
    base = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device="cuda")
    return base.copy_(x)


@pytest.mark.cuda
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_op_cuda(case):
    """Each row on the CUDA backend (exported on the CPU, compiled for CUDA) against eager on CUDA."""
    prog, args, dyn = _export(case)
    exe = ostinato.compile(prog, device="cuda", cache=False)
    for inputs in (args, case.args(1 if dyn else 0, case.seed + 1)):
        inputs = tuple(_to_cuda(x) for x in inputs)
        with torch.no_grad():
            ref = case.fn(*inputs)
        # Creation ops with no device argument make eager's result on the CPU; the executable makes
        # it on its own device. Values are compared on the CPU.
        cpu = lambda t: t.cpu() if isinstance(t, torch.Tensor) else t  # noqa: E731
        assert_same(pytree.tree_map(cpu, exe(*inputs)), pytree.tree_map(cpu, ref), case.tol,
                    msg=f"{case.id} (cuda):")
