import copy

import pytest
import torch
import torch.nn.functional as F
import transformers

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
    assert prog.op_counts() == {"aten.linear": 3, op: 1}


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
