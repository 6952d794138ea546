"""The CPU backend's GroupNorm takes any strides: torch.export's decomposition drops the
``contiguous(suggest_memory_format)`` that ``aten.group_norm`` runs first, where it was a no-op at the traced
sizes. diffusers' attention output (``transpose(-1, -2).reshape(b, c, h, w)`` plus the residual) reaches
the next ResnetBlock's GroupNorm with strides the CPU kernel refused at a dynamic batch of 1 (torch's own
decomposed program fails there too)."""
from __future__ import annotations

import torch
from torch.export import Dim

import ostinato


class _AttnOutNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)
        self.norm = torch.nn.GroupNorm(8, 64)

    def forward(self, x):
        b, c, h, w = x.shape
        t = self.lin(x.view(b, c, h * w).transpose(1, 2))
        return self.norm(t.transpose(-1, -2).reshape(b, c, h, w) + x)


def test_group_norm_after_a_transposed_attention_output_at_every_batch():
    torch.manual_seed(0)
    model = _AttnOutNorm().eval()
    prog = ostinato.export(model, (torch.randn(2, 64, 8, 8),), dynamic_shapes=({0: Dim("batch", min=1, max=8)},),
                           cache=False)
    exe = ostinato.compile(prog, device="cpu", cache=False)
    g = torch.Generator().manual_seed(3)
    for b in (2, 3, 1):
        x = torch.randn(b, 64, 8, 8, generator=g)
        with torch.no_grad():
            ref = model(x)
        torch.testing.assert_close(exe(x), ref, rtol=1e-5, atol=1e-5)
    # channels-last input stays channels-last for the kernel (its suggested format), and matches eager
    x = torch.randn(3, 64, 8, 8, generator=g).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        torch.testing.assert_close(exe(x), model(x), rtol=1e-5, atol=1e-5)
