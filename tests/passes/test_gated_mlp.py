import copy

import pytest
import torch
import torch.nn.functional as F
import transformers
from torch.export import Dim

import ostinato
from examples.tiny_decoder import TinyDecoder, decode_inputs
from helpers import LastHidden, assert_decode_matches, export_and_compare


class Gated(torch.nn.Module):
    def __init__(self, act: str, approximate: str = "none", dim: int = 16, hidden: int = 32):
        super().__init__()
        self.gate = torch.nn.Linear(dim, hidden, bias=False)
        self.up = torch.nn.Linear(dim, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, dim, bias=False)
        self.act, self.approximate = act, approximate

    def forward(self, x):
        g = self.gate(x)
        a = F.silu(g) if self.act == "silu" else F.gelu(g, approximate=self.approximate)
        return self.down(a * self.up(x))


@pytest.mark.parametrize("act, approximate, op", [("silu", "none", "ost.swiglu"), ("gelu", "none", "ost.geglu"),
                                                  ("gelu", "tanh", "ost.geglu")])
def test_gated_mlp_becomes_one_op(act, approximate, op):
    prog, _ = export_and_compare(Gated(act, approximate), (torch.randn(3, 16),),
                                 more_inputs=[(torch.randn(3, 16),)])
    # gate and up read one input: one ost.multi_linear (one matmul over both weights)
    assert prog.op_counts() == {"ost.multi_linear": 1, "aten.linear": 1, op: 1}


class NotGated(torch.nn.Module):
    def forward(self, x, y):
        a = F.silu(x)
        return a * 2.0, F.silu(y) * y[0], a  # scalar multiply, broadcast multiply, activation reused


def test_other_products_are_not_fused():
    prog, _ = export_and_compare(NotGated(), (torch.randn(4, 8), torch.randn(4, 8)),
                                 more_inputs=[(torch.randn(4, 8), torch.randn(4, 8))])
    assert "ost.swiglu" not in prog.op_counts() and prog.op_counts()["aten.silu"] == 2


def test_tiny_decoder_has_one_swiglu_per_layer():
    torch.manual_seed(0)
    model = TinyDecoder(dim=32, layers=4, heads=2, kv_heads=1, vocab=64, max_seq=16).eval()
    ref = copy.deepcopy(model)
    prog = ostinato.export(model, decode_inputs(0, vocab=64))
    assert prog.op_counts()["ost.swiglu"] == 4 and "aten.silu" not in prog.op_counts()
    exe = ostinato.compile(prog)
    assert_decode_matches(exe, ref, 4)


def test_gemma_mlp_is_one_geglu_per_layer():
    torch.manual_seed(0)
    config = transformers.GemmaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128,
                                      max_position_embeddings=64)
    model = transformers.GemmaModel(config).eval()

    prog, _ = export_and_compare(LastHidden(model), (torch.randint(0, 128, (1, 6)),),
                                 more_inputs=[(torch.randint(0, 128, (1, 6)),)])
    assert prog.op_counts()["ost.geglu"] == 2 and "aten.gelu" not in prog.op_counts()


class PackedGated(torch.nn.Module):
    """One gate_up projection split in halves: chunk, split, split_with_sizes or two slices.
    ``up_first`` multiplies as Phi-3 does (``up * act(gate)``); ``swapped`` takes the halves the other
    way round (up is the first half)."""

    def __init__(self, split: str, act: str = "silu", up_first: bool = False, swapped: bool = False,
                 dim: int = 16, hidden: int = 32):
        super().__init__()
        self.gate_up = torch.nn.Linear(dim, 2 * hidden, bias=False)
        self.down = torch.nn.Linear(hidden, dim, bias=False)
        self.split, self.act, self.up_first, self.swapped, self.hidden = split, act, up_first, swapped, hidden

    def forward(self, x):
        h, n = self.gate_up(x), self.hidden
        if self.split == "chunk":
            a, b = h.chunk(2, dim=-1)
        elif self.split == "split":
            a, b = h.split(n, dim=-1)
        elif self.split == "split_with_sizes":
            a, b = h.split([n, n], dim=h.dim() - 1)
        else:
            a, b = h[..., :n], h[..., n:]
        gate, up = (b, a) if self.swapped else (a, b)
        act = F.silu(gate) if self.act == "silu" else F.gelu(gate, approximate=self.act[5:] or "none")
        return self.down(up * act if self.up_first else act * up)


@pytest.mark.parametrize("split", ["chunk", "split", "split_with_sizes", "slices"])
@pytest.mark.parametrize("act, op", [("silu", "ost.swiglu_packed"), ("gelu", "ost.geglu_packed"),
                                     ("gelu_tanh", "ost.geglu_packed")])
def test_packed_gated_mlp_absorbs_the_split(split, act, op):
    prog, _ = export_and_compare(PackedGated(split, act), (torch.randn(2, 3, 16),),
                                 more_inputs=[(torch.randn(2, 3, 16),)])
    assert prog.op_counts() == {"aten.linear": 2, op: 1}
    node = next(n for n in prog.graph.nodes if n.op == op)
    assert node.args[0].producer.op == "aten.linear"
    if op == "ost.geglu_packed":
        assert node.args[1] == ("tanh" if act == "gelu_tanh" else "none")


@pytest.mark.parametrize("split", ["chunk", "slices"])
def test_packed_with_up_times_act_gate(split):  # Phi-3's order
    prog, _ = export_and_compare(PackedGated(split, up_first=True), (torch.randn(3, 16),),
                                 more_inputs=[(torch.randn(3, 16),)])
    assert prog.op_counts() == {"aten.linear": 2, "ost.swiglu_packed": 1}


@pytest.mark.parametrize("split", ["chunk", "slices"])
def test_packed_with_dynamic_shapes(split):
    shapes = ({0: Dim("b", max=8), 1: Dim("t", max=32)},)
    prog, _ = export_and_compare(PackedGated(split, "gelu"), (torch.randn(2, 3, 16),), dynamic_shapes=shapes,
                                 more_inputs=[(torch.randn(3, 5, 16),)])
    assert prog.op_counts() == {"aten.linear": 2, "ost.geglu_packed": 1}


@pytest.mark.parametrize("split", ["chunk", "slices"])
@pytest.mark.parametrize("up_first", [False, True])
def test_reversed_halves_are_not_packed(split, up_first):
    prog, _ = export_and_compare(PackedGated(split, swapped=True, up_first=up_first), (torch.randn(3, 16),),
                                 more_inputs=[(torch.randn(3, 16),)])
    ops = prog.op_counts()
    assert "ost.swiglu_packed" not in ops and ops["ost.swiglu"] == 1
    assert ops.get("aten.split_with_sizes", 0) + ops.get("aten.slice.Tensor", 0) == (1 if split == "chunk" else 2)


class HalvesReadElsewhere(torch.nn.Module):
    """A half that is also returned, and slices that are not halves: plain swiglu, split kept."""

    def __init__(self):
        super().__init__()
        self.p = torch.nn.Linear(16, 64, bias=False)
        self.q = torch.nn.Linear(16, 48, bias=False)

    def forward(self, x):
        gate, up = self.p(x).chunk(2, dim=-1)
        h = self.q(x)
        return F.silu(gate) * up, up, F.silu(h[..., :16]) * h[..., 16:32]


def test_halves_with_other_readers_or_not_halves_are_not_packed():
    prog, _ = export_and_compare(HalvesReadElsewhere(), (torch.randn(3, 16),), more_inputs=[(torch.randn(3, 16),)])
    ops = prog.op_counts()
    assert "ost.swiglu_packed" not in ops and ops["ost.swiglu"] == 2
    assert ops["aten.split_with_sizes"] == 1 and ops["aten.slice.Tensor"] == 2


def test_phi3_mlp_is_one_packed_swiglu_per_layer():
    torch.manual_seed(0)
    config = transformers.Phi3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                     max_position_embeddings=64, pad_token_id=0)
    model = transformers.Phi3Model(config).eval()
    prog, _ = export_and_compare(LastHidden(model), (torch.randint(0, 128, (1, 6)),),
                                 more_inputs=[(torch.randint(0, 128, (1, 6)),)])
    ops = prog.op_counts()
    assert ops["ost.swiglu_packed"] == 2 and "aten.silu" not in ops and "ost.swiglu" not in ops
