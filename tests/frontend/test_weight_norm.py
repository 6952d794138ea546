"""Weight norm stays one op (frontend/export.py's KEEP_WHOLE): torch's decomposition rounds g / |v| to the
dtype before the product, where the kernel rounds once, which put a quarter of a bf16 weight one ulp off
(Wav2Vec2's positional conv: 0.03 on its output). Whole, it runs once on the constants when compile folds
them, and the CPU's result is eager's bit for bit; MLX computes it itself (no op through torch)."""
from __future__ import annotations

import pytest
import torch
import transformers
from torch import nn

import ostinato
from helpers import assert_same


class WeightNormed(nn.Module):
    """A weight-normed grouped conv over time (Wav2Vec2's positional embedding) and a weight-normed linear
    normed over its input dim (``dim=1``)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(32, 32, 9, padding=4, groups=4), dim=2)
        self.lin = nn.utils.parametrizations.weight_norm(nn.Linear(32, 16), dim=1)

    def forward(self, x):
        return self.lin(torch.nn.functional.gelu(self.conv(x)).transpose(1, 2))


def _random(model: nn.Module, dtype) -> nn.Module:
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return model.eval().to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_weight_norm_is_kept_whole_and_exact_on_the_cpu(dtype):
    model = _random(WeightNormed(), dtype)
    prog = ostinato.export(model, (torch.randn(2, 32, 20, dtype=dtype),))
    assert prog.op_counts()["aten._weight_norm_interface"] == 2
    exe = ostinato.compile(prog)
    assert exe.folded_launches >= 2          # both weights computed once, at compile
    for seed in range(3):
        x = torch.randn(2, 32, 20, generator=torch.Generator().manual_seed(seed)).to(dtype)
        with torch.no_grad():
            assert torch.equal(exe(x), model(x))


def test_wav2vec2_in_bf16_is_eagers_bit_for_bit():
    config = transformers.Wav2Vec2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=128, conv_dim=(32,) * 7, num_conv_pos_embeddings=16)
    torch.manual_seed(0)
    model = transformers.Wav2Vec2Model(config).eval().to(torch.bfloat16)
    exe = ostinato.compile(ostinato.export(model, (torch.randn(1, 4000, dtype=torch.bfloat16),)))
    for seed in range(2):
        x = torch.randn(1, 4000, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
        with torch.no_grad():
            assert torch.equal(exe(x).last_hidden_state, model(x).last_hidden_state)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_weight_norm_on_mlx_runs_no_op_through_torch(dtype):
    pytest.importorskip("mlx.core", reason="MLX is a dev dependency: pip install 'mlx[cpu]'")
    model = _random(WeightNormed(), dtype)
    exe = ostinato.compile(ostinato.export(model, (torch.randn(2, 32, 20, dtype=dtype),)), device="mlx",
                           strict=True)
    x = torch.randn(2, 32, 20, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.no_grad():
        assert_same(exe(x), model(x))
