"""A tiny Whisper encoder (random weights): conv front end, sinusoidal positions, transformer layers."""
from __future__ import annotations

import torch
from torch.export import Dim
from transformers import WhisperConfig
from transformers.models.whisper.modeling_whisper import WhisperEncoder

import pytest

import ostinato
from helpers import BACKENDS, assert_same

MEL_BINS, SOURCE_POSITIONS = 80, 50
FRAMES = 2 * SOURCE_POSITIONS  # the encoder requires exactly 2 * max_source_positions input frames


def make_encoder() -> WhisperEncoder:
    torch.manual_seed(0)
    config = WhisperConfig(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                           decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                           num_mel_bins=MEL_BINS, max_source_positions=SOURCE_POSITIONS,
                           max_target_positions=32, vocab_size=128, pad_token_id=0, bos_token_id=1,
                           eos_token_id=2, decoder_start_token_id=3)
    encoder = WhisperEncoder(config).eval()
    with torch.no_grad():  # layer norms start at weight 1, bias 0
        for name, p in encoder.named_parameters():
            if "layer_norm" in name:
                p.uniform_(0.5, 1.5) if name.endswith("weight") else p.uniform_(-0.2, 0.2)
    return encoder


def features(batch: int) -> torch.Tensor:
    return torch.randn(batch, MEL_BINS, FRAMES)


def check(exe, encoder, x, msg):
    with torch.no_grad():
        expected = encoder(x)
    out = exe(x)
    assert_same(out.last_hidden_state, expected.last_hidden_state, msg=msg)
    assert out.last_hidden_state.shape == (x.shape[0], SOURCE_POSITIONS, 64)


@pytest.mark.parametrize("device", BACKENDS)
def test_whisper_encoder_static(device):
    encoder = make_encoder()
    torch.manual_seed(1)
    x = features(2)
    exe = ostinato.compile(ostinato.export(encoder, (x,)), device=device)
    check(exe, encoder, x, "example input")
    check(exe, encoder, features(2), "new input")


@pytest.mark.parametrize("device", BACKENDS)
def test_whisper_encoder_dynamic_batch(device):
    encoder = make_encoder()
    torch.manual_seed(2)
    batch = Dim("batch", min=1, max=8)
    exe = ostinato.compile(ostinato.export(encoder, (features(2),), dynamic_shapes=({0: batch},)), device=device)
    for b in (2, 3, 1):
        check(exe, encoder, features(b), f"batch {b}")
