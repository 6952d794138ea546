import pytest
import torch
import torch.nn.functional as F
import transformers
from torch.export import Dim

import ostinato
from ostinato.passes.manager import DEFAULT_PIPELINE
from helpers import LastHidden, export_and_compare

D = 24
WITHOUT_RMS_NORM = [(name, fn) for name, fn in DEFAULT_PIPELINE if name != "rms_norm"]


class WrittenLayerNorm(torch.nn.Module):
    """A layer norm written out: variance as mean(c**2), mean(c*c) or var(correction=0); rsqrt or
    sqrt + div; optional weight and bias (applied before the cast back); optional HF upcast."""

    def __init__(self, variance="pow", root="rsqrt", weight=True, bias=True, upcast=False, eps=1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(D) + 0.5) if weight else None
        self.bias = torch.nn.Parameter(torch.rand(D) - 0.5) if bias else None
        self.variance, self.root, self.upcast, self.eps = variance, root, upcast, eps

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32) if self.upcast else x
        mean = h.mean(-1, keepdim=True)
        c = h - mean
        if self.variance == "var":
            var = h.var(-1, keepdim=True, unbiased=False)
        else:
            var = (c.pow(2) if self.variance == "pow" else c * c).mean(-1, keepdim=True)
        y = c * torch.rsqrt(var + self.eps) if self.root == "rsqrt" else c / torch.sqrt(var + self.eps)
        if self.weight is not None:
            y = self.weight * y
        if self.bias is not None:
            y = y + self.bias
        return y.to(dtype) if self.upcast else y


class OlmoLayerNorm(torch.nn.Module):
    """OLMo's form: ``F.layer_norm(x.float(), …).type_as(x)``, with or without an fp32 affine."""

    def __init__(self, affine: bool):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(D) + 0.5) if affine else None
        self.bias = torch.nn.Parameter(torch.rand(D) - 0.5) if affine else None

    def forward(self, x):
        return F.layer_norm(x.float(), (D,), self.weight, self.bias, 1e-5).type_as(x)


def _check(model, dtype, shape=(2, 5, D)):
    """Export with the default pipeline and compare with eager on two random inputs."""
    x = torch.randn(*shape, dtype=dtype) * 2 + 1
    prog, _ = export_and_compare(model, (x,), more_inputs=[(torch.randn(*shape, dtype=dtype) - 1,)])
    return prog


FORMS = [("pow", "rsqrt", True, True), ("mul", "rsqrt", True, True), ("var", "rsqrt", True, True),
         ("pow", "sqrt", True, True), ("var", "sqrt", True, True),
         ("pow", "rsqrt", False, False), ("mul", "sqrt", True, False), ("var", "rsqrt", False, True)]


@pytest.mark.parametrize("variance, root, weight, bias", FORMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_written_layer_norm_becomes_one_op(variance, root, weight, bias, dtype):
    torch.manual_seed(1)
    upcast = dtype != torch.float32
    model = WrittenLayerNorm(variance, root, weight, bias, upcast).to(dtype)
    prog = _check(model, dtype)
    assert prog.op_counts() == {"ost.layer_norm": 1}
    x, w, b, eps, compute_dtype = prog.graph.nodes[0].args
    assert x is prog.graph.inputs[0] and eps == 1e-5
    assert (w is not None, b is not None) == (weight, bias)
    assert compute_dtype == (torch.float32 if upcast else None)


@pytest.mark.parametrize("variance", ["pow", "var"])
def test_written_form_is_fused_without_the_rms_norm_pass(variance):
    model = WrittenLayerNorm(variance, upcast=True).to(torch.bfloat16)
    prog = ostinato.export(model, (torch.randn(2, 3, D, dtype=torch.bfloat16),), passes=WITHOUT_RMS_NORM)
    assert prog.op_counts() == {"ost.layer_norm": 1}
    exe = ostinato.compile(prog)
    x = torch.randn(2, 3, D, dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(exe(x), model(x), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_module_layer_norm(dtype):
    model = torch.nn.Sequential(torch.nn.LayerNorm(D), torch.nn.LayerNorm(D, elementwise_affine=False))
    with torch.no_grad():
        model[0].weight.uniform_(0.5, 1.5)
        model[0].bias.uniform_(-0.5, 0.5)
    prog = _check(model.to(dtype), dtype)
    assert prog.op_counts() == {"ost.layer_norm": 2}
    assert prog.graph.nodes[1].args[1:] == (None, None, 1e-5, None)


@pytest.mark.parametrize("affine", [False, True])
def test_olmo_upcast_form(affine):
    model = OlmoLayerNorm(affine)
    prog = _check(model, torch.bfloat16)
    assert prog.op_counts() == {"ost.layer_norm": 1}
    assert prog.graph.nodes[0].args[0] is prog.graph.inputs[0]
    assert prog.graph.nodes[0].args[4] == torch.float32


class WeightAfterCastBack(torch.nn.Module):
    """HF style: normalize in fp32, cast back, then the (bf16) weight: the weight stays a multiply."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(D) + 0.5)

    def forward(self, x):
        h = x.to(torch.float32)
        c = h - h.mean(-1, keepdim=True)
        h = c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


def test_weight_after_the_cast_back_is_not_absorbed():
    prog = _check(WeightAfterCastBack().to(torch.bfloat16), torch.bfloat16)
    assert prog.op_counts() == {"ost.layer_norm": 1, "aten.mul.Tensor": 1}
    assert prog.graph.nodes[0].args[1:] == (None, None, 1e-6, torch.float32)


class NotLayerNorms(torch.nn.Module):
    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        c = x - mean
        a = c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + 1e-5)   # mean is also returned
        m1 = x.mean(1, keepdim=True)
        c1 = x - m1
        b = c1 * torch.rsqrt(c1.pow(2).mean(1, keepdim=True) + 1e-5)  # over dim 1, not the last
        return a, mean, b


def test_other_reader_or_other_dim_is_not_fused():
    prog = _check(NotLayerNorms(), torch.float32)
    assert "ost.layer_norm" not in prog.op_counts()
    assert prog.op_counts()["aten.sub.Tensor"] == 2


def test_dynamic_shapes():
    model = torch.nn.Sequential(torch.nn.LayerNorm(D), WrittenLayerNorm("var", upcast=True))
    x = torch.randn(2, 5, D)
    shapes = ({0: Dim("b", max=8), 1: Dim("t", max=32)},)
    prog, _ = export_and_compare(model, (x,), dynamic_shapes=shapes, more_inputs=[(torch.randn(3, 7, D),)])
    assert prog.op_counts() == {"ost.layer_norm": 2}


def test_gpt2_has_one_layer_norm_op_per_norm():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_inner=128, vocab_size=128, n_positions=64)
    model = transformers.GPT2Model(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.uniform_(-0.5, 0.5) if name.endswith("bias") else p.uniform_(0.5, 1.5)
    prog, _ = export_and_compare(LastHidden(model), (torch.randint(0, 128, (2, 7)),),
                                 more_inputs=[(torch.randint(0, 128, (2, 7)),)])
    assert prog.op_counts()["ost.layer_norm"] == 2 * 2 + 1
    assert "aten.layer_norm" not in prog.op_counts()
