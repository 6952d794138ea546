"""Vision models as transformers writes them (random weights, tiny configs): a ViT (patch embedding
convolution, pre-norm encoder, pooler) and a ResNet (bottleneck stages, batch norm with non-trivial
running statistics, max pooling, adaptive average pooling), on every backend."""
from __future__ import annotations

import pytest
import torch
import transformers

import ostinato
from helpers import BACKENDS, assert_same


def _perturb(model: torch.nn.Module) -> torch.nn.Module:
    """Norm weights and running statistics away from their 1/0 defaults, so they are tested."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (torch.nn.BatchNorm2d, torch.nn.LayerNorm)):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
    return model.eval()


def make_vit() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=64,
                                    num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    return _perturb(transformers.ViTModel(config))


def make_resnet() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[32, 64],
                                       depths=[1, 1], layer_type="bottleneck")
    return _perturb(transformers.ResNetModel(config))


@pytest.mark.parametrize("make", [make_vit, make_resnet], ids=["vit", "resnet"])
@pytest.mark.parametrize("device", BACKENDS)
def test_vision_model(device, make):
    model = make()
    x = torch.randn(2, 3, 32, 32)
    exe = ostinato.compile(ostinato.export(model, (x,)), device=device)
    for inputs in (x, torch.randn(2, 3, 32, 32)):
        with torch.no_grad():
            ref = model(inputs)
        out = exe(inputs)
        assert_same(out.last_hidden_state, ref.last_hidden_state, msg="last_hidden_state")
        assert_same(out.pooler_output, ref.pooler_output, msg="pooler_output")
