"""Custom ops ostinato has no kernel for, and a model using them (shared by the fallback tests).

Importing this module registers the ops: a process that loads a program using them must import it.
"""
from __future__ import annotations

import torch


@torch.library.custom_op("ostinato_fb::scale_shift", mutates_args=())
def scale_shift(x: torch.Tensor, s: float) -> torch.Tensor:
    return x * s + 1.0


@scale_shift.register_fake
def _(x, s):
    return torch.empty_like(x)


@torch.library.custom_op("ostinato_fb::center_on_host", mutates_args=())
def center_on_host(x: torch.Tensor) -> torch.Tensor:
    # Host work a CUDA graph could not capture: the mean is read back as a Python float.
    return x - float(x.mean().item())


@center_on_host.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("ostinato_fb::split_sign", mutates_args=())
def split_sign(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.clamp(min=0), (-x).clamp(min=0)


@split_sign.register_fake
def _(x):
    return torch.empty_like(x), torch.empty_like(x)


FALLBACK_OPS = {"fallback.ostinato_fb.scale_shift", "fallback.ostinato_fb.center_on_host",
                "fallback.ostinato_fb.split_sign"}


class UsesFallbackOps(torch.nn.Module):
    """Linear layers with custom ops between them, one with two outputs, one doing host work."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.inp = torch.nn.Linear(dim, dim)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x):
        h = torch.ops.ostinato_fb.scale_shift(self.inp(x), 0.5)
        h = torch.ops.ostinato_fb.center_on_host(torch.tanh(h))
        pos, neg = torch.ops.ostinato_fb.split_sign(self.out(h))
        return pos * 2 - neg, h.sum(-1)


def model_and_input(seed: int = 0, batch: int = 3, dim: int = 16):
    torch.manual_seed(seed)
    return UsesFallbackOps(dim).eval(), torch.randn(batch, dim)
