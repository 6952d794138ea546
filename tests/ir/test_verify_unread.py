"""verify() and results nothing reads: their recorded shape may be the exporting device's."""
from __future__ import annotations

import pytest
import torch

import ostinato
from ostinato.errors import GraphError
from ostinato.ir import TensorMeta, verify


class ConvBN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def _program():
    torch.manual_seed(0)
    model = ConvBN().eval().to(torch.bfloat16)
    x = torch.randn(1, 3, 8, 8, dtype=torch.bfloat16)
    return ostinato.export(model, (x,)), model, x


def test_batch_norm_statistics_recorded_by_another_device_verify():
    prog, model, x = _program()
    (bn,) = [n for n in prog.graph.nodes if n.op == "aten._native_batch_norm_legit_no_training"]
    users = prog.graph.users()
    unread = [o for o in bn.outputs[1:] if o is not None and o.id not in users]
    assert unread, "the saved statistics are expected to be unread"
    for o in unread:   # what an export on CUDA records for bf16: the statistics in f32[C]
        o.meta = TensorMeta(torch.float32, (8,))
    verify(prog.graph, check_shapes=True, hints=prog.hints)
    with torch.no_grad():
        assert torch.equal(ostinato.compile(prog)(x), model(x))


def test_a_read_result_with_a_wrong_record_still_fails():
    prog, _, _ = _program()
    (bn,) = [n for n in prog.graph.nodes if n.op == "aten._native_batch_norm_legit_no_training"]
    bn.outputs[0].meta = TensorMeta(torch.float32, tuple(bn.outputs[0].meta.shape))
    with pytest.raises(GraphError, match="recorded as"):
        verify(prog.graph, check_shapes=True, hints=prog.hints)


class Histogram(torch.nn.Module):
    def forward(self, x):
        return torch.histc(x, bins=4, min=0, max=3).cumsum(0)


def _histc_program_as_cuda_records_it(bins_recorded: int):
    """transformers' grouped experts count tokens per expert with ``histc`` of int32 ids on CUDA, whose
    CPU kernel refuses int32: the program as a CUDA export records it (its input and result int32)."""
    prog = ostinato.export(Histogram(), (torch.randint(0, 4, (8,)).float(),))
    (h,) = [n for n in prog.graph.nodes if n.op == "fallback.aten.histc"]
    prog.graph.inputs[0].meta = TensorMeta(torch.int32, (8,))
    h.outputs[0].meta = TensorMeta(torch.int32, (bins_recorded,))
    (c,) = [n for n in prog.graph.nodes if n.op == "aten.cumsum"]
    c.outputs[0].meta = TensorMeta(torch.int64, (bins_recorded,))
    return prog


def test_an_op_whose_cpu_kernel_refuses_an_integer_dtype_is_checked_for_its_shapes():
    with pytest.raises(RuntimeError, match="not implemented for"):
        torch.histc(torch.zeros(8, dtype=torch.int32), bins=4, min=0, max=3)
    prog = _histc_program_as_cuda_records_it(4)
    verify(prog.graph, check_shapes=True, hints=prog.hints)
    # the shapes are still derived (on float64 stand-ins): a wrong recorded length is refused
    bad = _histc_program_as_cuda_records_it(5)
    with pytest.raises(GraphError, match="histc"):
        verify(bad.graph, check_shapes=True, hints=bad.hints)
