"""Small models and exported programs shared by the replay tests.

The whole-model builders come from tests/models (imported, not copied). Those files are test modules
in a folder without ``__init__.py``: pytest imports them under their base names (``test_convnet``,
...), so they are imported here the same way, with tests/models appended to ``sys.path`` (appended,
not prepended: ``models`` must not shadow anything, and tests/program has a ``models.py`` of its own).

Exporting is the slow part of every test here, so each program is exported once per process
(``functools.lru_cache``) next to a pristine copy of its model; tests deep-copy the model for their
eager reference, so eager state (KV caches, counters) starts from the initial values every time.
"""
from __future__ import annotations

import copy
import functools
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

import ostinato

_MODELS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")
if _MODELS_DIR not in sys.path:
    sys.path.append(_MODELS_DIR)

import test_convnet as convnet  # noqa: E402
import test_hf_decoders as hf_decoders  # noqa: E402
import test_tiny_decoder as tiny  # noqa: E402
import test_whisper_encoder as whisper  # noqa: E402

from examples.tiny_decoder import decode_inputs  # noqa: E402

TINY_BATCH = 2
MAX_BATCH = 16


class Accumulator(nn.Module):
    """A state buffer that grows by ``x.sum()`` per call: with ``x = ones(2, 3)`` call N returns 6 * N."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(()))

    def forward(self, x):
        self.total += x.sum()
        return self.total * 1


class RowMLP(nn.Module):
    """Rows are independent (Linear, GELU, Linear): padding the batch cannot change the real rows."""

    def __init__(self, dim: int = 8, hidden: int = 32, out: int = 4):
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, out)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class CountingRowMLP(RowMLP):
    """RowMLP plus a call counter in state that also sums its input (zero padding adds nothing):
    shows whether capturing changed the state."""

    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(()))

    def forward(self, x):
        self.total += x.sum() + 1.0
        return self.down(F.gelu(self.up(x))), self.total * 1


class MutatesInput(nn.Module):
    """Writes its input in place (a user-visible input mutation) and returns a value computed from it."""

    def forward(self, x):
        x.mul_(2.0)
        return x + 1.0


def fresh(model: nn.Module) -> nn.Module:
    """An eager reference with its own state, starting from the exported model's initial values."""
    return copy.deepcopy(model)


def batch_dim(max_batch: int = MAX_BATCH) -> Dim:
    return Dim("batch", min=1, max=max_batch)


@functools.lru_cache(maxsize=None)
def tiny_decoder() -> tuple[nn.Module, ostinato.Program]:
    """tests/models' tiny decoder (examples/tiny_decoder.TinyDecoder, 4 small layers), batch 2."""
    model = tiny.make_model(TINY_BATCH)
    pristine = copy.deepcopy(model)
    prog = ostinato.export(model, decode_inputs(0, TINY_BATCH, tiny.VOCAB, torch.Generator().manual_seed(0)))
    return pristine, prog


@functools.lru_cache(maxsize=None)
def hf_decoder(family: str) -> tuple[nn.Module, ostinato.Program]:
    wrapper = hf_decoders.make_wrapper(family)
    pristine = copy.deepcopy(wrapper)
    gen = torch.Generator().manual_seed(0)
    prog = ostinato.export(wrapper, (), hf_decoders.decode_inputs(0, gen), trace_strict=True)
    return pristine, prog


@functools.lru_cache(maxsize=None)
def whisper_encoder() -> tuple[nn.Module, ostinato.Program]:
    encoder = whisper.make_encoder()
    prog = ostinato.export(encoder, (whisper.features(2),), dynamic_shapes=({0: Dim("batch", min=1, max=8)},))
    return encoder, prog


@functools.lru_cache(maxsize=None)
def conv_net(dynamic: bool) -> tuple[nn.Module, ostinato.Program]:
    torch.manual_seed(0)
    model = convnet.SmallConvNet().eval()
    shapes = ({0: batch_dim()},) if dynamic else None
    return model, ostinato.export(model, (torch.randn(2, 3, 32, 32),), dynamic_shapes=shapes)


@functools.lru_cache(maxsize=None)
def row_mlp(dynamic: bool = True, max_batch: int = MAX_BATCH) -> tuple[nn.Module, ostinato.Program]:
    torch.manual_seed(0)
    model = RowMLP().eval()
    shapes = ({0: batch_dim(max_batch)},) if dynamic else None
    return model, ostinato.export(model, (torch.randn(4, 8),), dynamic_shapes=shapes)


@functools.lru_cache(maxsize=None)
def counting_row_mlp() -> tuple[nn.Module, ostinato.Program]:
    torch.manual_seed(0)
    model = CountingRowMLP().eval()
    pristine = copy.deepcopy(model)
    return pristine, ostinato.export(model, (torch.randn(4, 8),), dynamic_shapes=({0: batch_dim()},))


@functools.lru_cache(maxsize=None)
def accumulator() -> tuple[nn.Module, ostinato.Program]:
    model = Accumulator()
    pristine = copy.deepcopy(model)
    return pristine, ostinato.export(model, (torch.ones(2, 3),))


def eager(model: nn.Module, *args, **kwargs):
    with torch.no_grad():
        return model(*args, **kwargs)


def snapshot(out):
    """A copy of a call's outputs (replay outputs are the captured buffers, rewritten by the next call)."""
    return torch.utils._pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, out)
