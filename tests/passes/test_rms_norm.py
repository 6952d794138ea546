import copy

import pytest
import torch
import transformers

import ostinato
from examples.tiny_decoder import TinyDecoder, decode_inputs
from helpers import LastHidden, assert_decode_matches, export_and_compare


class HFRMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm, verbatim in structure: upcast, normalize, cast back, weight first."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(dim) + 0.5)
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + self.eps)
        return self.weight * h.to(dtype)


class KeepsVariance(torch.nn.Module):
    """The variance is also returned: the chain must stay as it is."""

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + 1e-5), var


def test_tiny_decoder_norms_become_one_op_each(tmp_path):
    torch.manual_seed(0)
    model = TinyDecoder(dim=32, layers=4, heads=2, kv_heads=1, vocab=64, max_seq=16).eval()
    ref = copy.deepcopy(model)
    raw = ostinato.export(copy.deepcopy(model), decode_inputs(0, vocab=64), passes=[])
    prog = ostinato.export(model, decode_inputs(0, vocab=64))
    ops = prog.op_counts()
    # Every norm but the first layer's input norm reads a residual sum and takes the add in.
    assert ops["ost.rms_norm"] == 1 and ops["ost.add_rms_norm"] == 2 * 4
    assert not {"aten.rsqrt", "aten.pow.Tensor_Scalar", "aten.mean.dim"} & set(ops)
    # pow, mean, add, rsqrt, mul and the weight mul → 1 per norm (the pass's own share of the report)
    after = {r["pass"]: r["nodes"] for r in prog.info["passes"]}
    assert after["export"] == raw.num_nodes and after["dce"] - after["rms_norm"] == 5 * 9
    prog.save(tmp_path / "fused.ost")
    exe = ostinato.compile(ostinato.load(tmp_path / "fused.ost"))
    assert_decode_matches(exe, ref, 6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_hf_upcast_form(dtype):
    torch.manual_seed(1)
    model = HFRMSNorm(48).to(dtype)
    x = torch.randn(2, 5, 48, dtype=dtype)
    prog, _ = export_and_compare(model, (x,), more_inputs=[(torch.randn(2, 5, 48, dtype=dtype),)])
    assert prog.op_counts() == {"ost.rms_norm": 1}
    node = prog.graph.nodes[0]
    assert node.args[3] == (None if dtype == torch.float32 else torch.float32)


def test_chain_with_another_reader_is_not_fused():
    prog, _ = export_and_compare(KeepsVariance(), (torch.randn(3, 8),), more_inputs=[(torch.randn(3, 8),)])
    assert "ost.rms_norm" not in prog.op_counts()
    assert prog.op_counts()["aten.rsqrt"] == 1


def test_llama_has_one_norm_op_per_norm():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                      max_position_embeddings=64)
    model = transformers.LlamaModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.uniform_(0.5, 1.5)

    ids = torch.randint(0, 128, (2, 7))
    prog, _ = export_and_compare(LastHidden(model), (ids,), more_inputs=[(torch.randint(0, 128, (2, 7)),)])
    assert prog.op_counts()["ost.rms_norm"] == 1 and prog.op_counts()["ost.add_rms_norm"] == 2 * 3
    assert "aten.rsqrt" not in prog.op_counts()



class GemmaRMSNorm(torch.nn.Module):
    """transformers' GemmaRMSNorm, verbatim in structure: normalize in fp32, multiply by (1 + weight)
    in fp32, cast back last."""

    def __init__(self, dim, eps=1e-6, also_return_weight=False):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(dim) - 0.5)
        self.eps, self.also_return_weight = eps, also_return_weight

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        w = 1.0 + self.weight.float()
        out = (h * w).type_as(x)
        return (out, w) if self.also_return_weight else out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gemma_form_is_one_op_with_its_weight_offset(dtype):
    torch.manual_seed(3)
    model = GemmaRMSNorm(48).to(dtype)
    prog, _ = export_and_compare(model, (torch.randn(2, 5, 48, dtype=dtype),),
                                 more_inputs=[(torch.randn(2, 5, 48, dtype=dtype) * 3,)])
    assert prog.op_counts() == {"ost.rms_norm": 1}
    (node,) = prog.graph.nodes
    # bf16/fp16: the upcast form with the weight first; fp32: the casts are no-ops, the plain form
    # with the offset added in the weight's dtype (the same arithmetic in fp32).
    if dtype == torch.float32:
        assert node.args[3:] == (None, 1.0, False)
    else:
        assert node.args[3:] == (torch.float32, 1.0, True)
    assert node.args[1] is prog.graph.constants[0] or node.args[1].role in ("constant", "input")


def test_gemma_weight_read_elsewhere_keeps_its_add():
    torch.manual_seed(4)
    model = GemmaRMSNorm(16, also_return_weight=True).to(torch.bfloat16)
    prog, _ = export_and_compare(model, (torch.randn(3, 16, dtype=torch.bfloat16),),
                                 more_inputs=[(torch.randn(3, 16, dtype=torch.bfloat16),)])
    (node,) = [n for n in prog.graph.nodes if n.op == "ost.rms_norm"]
    assert node.args[3:] == (torch.float32, 0.0, True) and prog.op_counts()["aten.add.Tensor"] == 1


class TorchRMSNormBlock(torch.nn.Module):
    """Pre-norm blocks written with torch's own RMSNorm (``nn.RMSNorm`` / ``F.rms_norm``, which export keeps
    as one ``aten.rms_norm``): residual adds between them, a projection after each."""

    def __init__(self, dim: int = 64, eps: float | None = None, affine: bool = True):
        super().__init__()
        self.n1 = torch.nn.RMSNorm(dim, eps=eps, elementwise_affine=affine)
        self.n2 = torch.nn.RMSNorm(dim, eps=eps, elementwise_affine=affine)
        self.a, self.b = torch.nn.Linear(dim, dim), torch.nn.Linear(dim, dim)

    def forward(self, x):
        h = x + self.a(self.n1(x))
        return h + self.b(torch.nn.functional.rms_norm(h, (h.shape[-1],), self.n2.weight, self.n2.eps))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("eps, affine", [(None, True), (1e-5, True), (1e-6, False)])
def test_torchs_rms_norm_is_one_op_and_eagers_bit_for_bit(dtype, eps, affine):
    """aten.rms_norm becomes ost.rms_norm (in fp32 with the weight before the cast back for half types: what
    torch's CPU kernel computes); the residual add before the second joins it as ost.add_rms_norm."""
    torch.manual_seed(0)
    model = TorchRMSNormBlock(eps=eps, affine=affine).eval()
    with torch.no_grad():
        for n in (model.n1, model.n2):
            if n.weight is not None:
                n.weight.uniform_(0.5, 1.5)
    model = model.to(dtype)
    prog = ostinato.export(model, (torch.randn(2, 5, 64, dtype=dtype),))
    ops = prog.op_counts()
    assert "aten.rms_norm" not in ops and ops["ost.rms_norm"] == 1 and ops["ost.add_rms_norm"] == 1, ops
    exe, exe_r = ostinato.compile(prog), ostinato.compile(prog, replay=True)
    for seed in range(3):
        x = (torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(seed)) * 3).to(dtype)
        with torch.no_grad():
            want = model(x)
        assert torch.equal(exe(x), want)
        assert torch.equal(exe_r(x), want)


class TwoDimNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.RMSNorm((4, 16))

    def forward(self, x):
        return self.norm(x)


def test_torchs_rms_norm_over_two_dims_or_a_weight_of_another_dtype_stays():
    prog = ostinato.export(TwoDimNorm().eval(), (torch.randn(2, 4, 16),))
    assert prog.op_counts().get("aten.rms_norm") == 1
    w = torch.nn.Parameter(torch.rand(16))

    class MixedWeight(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.rms_norm(x, (16,), w.to(torch.float32))

    prog = ostinato.export(MixedWeight(), (torch.randn(3, 16, dtype=torch.bfloat16),))
    assert "ost.rms_norm" not in prog.op_counts()
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    assert torch.equal(ostinato.compile(prog)(x), MixedWeight()(x))
