import copy
import math

import pytest
import torch
import torch.nn.functional as F
import transformers
from torch.export import Dim
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.activations import ACT2FN
from transformers.integrations.executorch import TorchExportableModuleWithStaticCache
from transformers.pytorch_utils import Conv1D

import ostinato
from helpers import assert_same, export_and_compare

pytestmark = pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects")


def gelu_new_commuted(x):
    """gelu_new with every multiply and add written the other way round."""
    return (1.0 + torch.tanh((0.044715 * x ** 3 + x) * math.sqrt(2.0 / math.pi))) * (x * 0.5)


ACTS = {
    "relu": (torch.relu, "relu"),
    "silu": (F.silu, "silu"),
    "gelu": (F.gelu, "gelu"),
    "gelu_tanh": (lambda h: F.gelu(h, approximate="tanh"), "gelu_tanh"),
    "gelu_new": (ACT2FN["gelu_new"], "gelu_new"),            # GPT-2's, written out: pow/mul/add/tanh
    "gelu_new_commuted": (gelu_new_commuted, "gelu_new"),
}


class MLP(torch.nn.Module):
    def __init__(self, act: str, bias: bool, conv1d: bool = False, dim: int = 16, hidden: int = 32):
        super().__init__()
        self.up = Conv1D(hidden, dim) if conv1d else torch.nn.Linear(dim, hidden, bias=bias)
        self.down = torch.nn.Linear(hidden, dim, bias=bias)
        if conv1d:
            torch.nn.init.normal_(self.up.bias)
        self.act = ACTS[act][0]

    def forward(self, x):
        return self.down(self.act(self.up(x)))


def _compare(model, shape, dynamic_shapes=None, more_shape=None):
    x = torch.randn(*shape)
    more = torch.randn(*(more_shape or shape))
    prog, _ = export_and_compare(model, (x,), dynamic_shapes=dynamic_shapes, more_inputs=[(more,)])
    return prog


@pytest.mark.parametrize("act", list(ACTS))
@pytest.mark.parametrize("bias", [True, False])
def test_linear_and_activation_become_one_op(act, bias):
    prog = _compare(MLP(act, bias), (2, 3, 16))
    assert prog.op_counts() == {"ost.linear": 1, "aten.linear": 1}
    node = next(n for n in prog.graph.nodes if n.op == "ost.linear")
    x, w, b, name, weight_t = node.args
    assert x is prog.graph.inputs[0] and name == ACTS[act][1] and weight_t is False
    assert (b is not None) == bias


@pytest.mark.parametrize("act", ["gelu_new", "relu"])
@pytest.mark.parametrize("rank", [3, 2])
def test_conv1d_addmm_and_views_are_absorbed(act, rank):
    prog = _compare(MLP(act, True, conv1d=True), (2, 3, 16)[-rank:])
    assert prog.op_counts() == {"ost.linear": 1, "aten.linear": 1}
    node = next(n for n in prog.graph.nodes if n.op == "ost.linear")
    assert node.args[0] is prog.graph.inputs[0] and node.args[3:] == (ACTS[act][1], True)


@pytest.mark.parametrize("conv1d", [False, True])
def test_dynamic_shapes(conv1d):
    shapes = ({0: Dim("b", max=8), 1: Dim("t", max=32)},)
    prog = _compare(MLP("gelu_new", True, conv1d), (2, 3, 16), shapes, more_shape=(3, 5, 16))
    assert prog.op_counts()["ost.linear"] == 1 and "aten.addmm" not in prog.op_counts()


class PreActivationReused(torch.nn.Module):
    """The projection's result is read twice (activation and a residual), or returned: no fusion."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (torch.nn.Linear(16, 16) for _ in range(3))
        self.conv = Conv1D(16, 16)

    def forward(self, x):
        h = self.a(x)
        g = self.b(x)
        k = self.conv(x)
        return torch.relu(h) + h, F.gelu(g), g, ACT2FN["gelu_new"](k) * k, self.c(x)


def test_pre_activation_with_another_reader_is_not_fused():
    prog = _compare(PreActivationReused(), (2, 3, 16))
    ops = prog.op_counts()
    # a, b and c read x: one ost.multi_linear (their activations stay apart)
    assert ops["ost.multi_linear"] == 1 and "aten.linear" not in ops
    assert ops["aten.relu"] == 1 and ops["aten.tanh"] == 1
    # the whole Conv1D is an ost.linear without its activation (read twice), over x's own rows
    (node,) = [n for n in prog.graph.nodes if n.op == "ost.linear"]
    assert "aten.addmm" not in ops and node.args[0] is prog.graph.inputs[0] and node.args[3:] == (None, True)


class Gated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate, self.up, self.down = (torch.nn.Linear(16, 16, bias=False) for _ in range(3))

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


def test_gated_mlp_is_left_to_swiglu():
    prog = _compare(Gated(), (2, 16))
    assert prog.op_counts() == {"ost.multi_linear": 1, "aten.linear": 1, "ost.swiglu": 1}


def test_gpt2_decode_has_one_linear_per_mlp():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_inner=128, vocab_size=128, n_positions=64,
                                     pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.uniform_(-0.5, 0.5) if name.endswith("bias") else p.uniform_(0.5, 1.5)
    model.generation_config = GenerationConfig(use_cache=True, cache_implementation="static")
    wrapper = TorchExportableModuleWithStaticCache(model, batch_size=2, max_cache_len=16).eval()
    ref = copy.deepcopy(wrapper)
    gen = torch.Generator().manual_seed(1)

    def inputs(pos):
        return {"input_ids": torch.randint(0, 128, (2, 1), generator=gen), "cache_position": torch.tensor([pos])}

    prog = ostinato.export(wrapper, (), inputs(0), trace_strict=True)
    ops = prog.op_counts()
    assert "aten.tanh" not in ops and "aten.pow.Tensor_Scalar" not in ops
    acts = [n.args[3] for n in prog.graph.nodes if n.op == "ost.linear"]
    # per layer: c_fc with its GELU; c_attn and mlp.c_proj whole, without an activation
    assert sorted(acts, key=str) == [None] * 4 + ["gelu_new"] * 2, acts
    # attn.c_proj flattens the heads' transpose itself (no view pair to take): it stays
    assert ops["aten.addmm"] == 2
    exe = ostinato.compile(prog)
    outs = []
    for step in range(8):
        kwargs = inputs(step)
        with torch.no_grad():
            expected = ref(**kwargs)
        assert_same(exe(**kwargs), expected, msg=f"step {step}")
        outs.append(expected)
    assert not torch.equal(outs[0], outs[-1])


class ResidualAddmm(torch.nn.Module):
    """A Conv1D-shaped addmm whose 'bias' is a [rows, N] residual: not one ost.linear's bias."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(16, 24) * 0.1)

    def forward(self, x, r):
        return torch.addmm(r, x.view(-1, 16), self.weight).view(2, 3, 24)


def test_addmm_with_a_residual_for_bias_stays():
    model, args = ResidualAddmm(), (torch.randn(2, 3, 16), torch.randn(6, 24))
    prog = ostinato.export(model, args)
    assert "ost.linear" not in prog.op_counts() and prog.op_counts().get("aten.addmm") == 1
    assert_same(ostinato.compile(prog, device="cpu")(*args), model(*args), tol=1e-5)


@pytest.mark.parametrize("act", ["gelu_new", "gelu_new_commuted"])
@pytest.mark.parametrize("conv1d", [False, True])
def test_written_out_gelu_in_bf16_is_eagers_bit_for_bit(act, conv1d):
    """GPT-2's gelu_new, folded into ost.linear, rounds at each op as eager does: the CPU's result equals
    eager's exactly in bf16 (the one-kernel tanh GELU it was folded into before was 1 ulp apart)."""
    torch.manual_seed(0)
    model = MLP(act, True, conv1d, dim=64, hidden=256).to(torch.bfloat16).eval()
    exe = ostinato.compile(ostinato.export(model, (torch.randn(2, 5, 64, dtype=torch.bfloat16),)))
    assert exe.program.op_counts()["ost.linear"] == 1
    assert next(n for n in exe.program.graph.nodes if n.op == "ost.linear").args[3] == "gelu_new"
    for seed in range(3):
        x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16) * 3
        with torch.no_grad():
            want = model(x)
        assert torch.equal(exe(x), want)


def test_gpt2_in_bf16_gives_eagers_logits_bit_for_bit():
    """transformers' GPT-2 (gelu_new written out, Conv1D projections) in bf16 on the CPU: ostinato's logits
    are eager's exactly, on prompts it was not exported with."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_inner=256, vocab_size=128, n_positions=64,
                                     pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = transformers.GPT2LMHeadModel(config).eval().to(torch.bfloat16)
    exe = ostinato.compile(ostinato.export(model, (torch.randint(0, 128, (2, 9)),), {"use_cache": False}))
    assert [n.args[3] for n in exe.program.graph.nodes if n.op == "ost.linear"].count("gelu_new") == 2
    for seed in range(3):
        ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            want = model(ids, use_cache=False).logits
        got = exe(ids, use_cache=False)
        assert torch.equal(got.logits if hasattr(got, "logits") else got[0], want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_written_out_gelu_on_mlx(dtype):
    """The MLX backend's gelu_new computes the written form too (op by op in the dtype)."""
    pytest.importorskip("mlx.core", reason="MLX is a dev dependency: pip install 'mlx[cpu]'")
    torch.manual_seed(0)
    model = MLP("gelu_new", True, True, dim=32, hidden=64).to(dtype).eval()
    prog = ostinato.export(model, (torch.randn(2, 5, 32, dtype=dtype),))
    assert [n.args[3] for n in prog.graph.nodes if n.op == "ost.linear"] == ["gelu_new"]
    exe = ostinato.compile(prog, device="mlx")
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(1)).to(dtype) * 3
    with torch.no_grad():
        assert_same(exe(x), model(x))
