"""Shared test helpers: tolerances and comparing ostinato against eager PyTorch."""
from __future__ import annotations

import copy

import torch
from torch.utils import _pytree as pytree

import pytest

import ostinato

# The backends tests run on (CUDA has its own marked tests): parametrize with ``BACKENDS``.
BACKENDS = [pytest.param("cpu", id="cpu"), pytest.param("mlx", id="mlx", marks=pytest.mark.mlx)]


def host(x):
    """A state buffer or output as a CPU tensor, whichever backend made it (MLX keeps state in cells)."""
    to_torch = getattr(x, "torch", None)
    return to_torch() if callable(to_torch) and not isinstance(x, torch.Tensor) else x

# DESIGN.md's tolerances against eager; integer and bool outputs compare exactly.
TOL = {torch.float32: 1e-5, torch.float64: 1e-7, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def assert_same(out, ref, tol: float | None = None, msg: str = "") -> None:
    """Outputs equal eager's: same pytree structure, dtypes, shapes; values within the dtype's tolerance."""
    out_leaves, out_spec = pytree.tree_flatten(out)
    ref_leaves, ref_spec = pytree.tree_flatten(ref)
    assert out_spec == ref_spec, f"{msg} structure differs: {out_spec} vs {ref_spec}"
    for i, (o, r) in enumerate(zip(out_leaves, ref_leaves)):
        if isinstance(r, torch.Tensor):
            assert isinstance(o, torch.Tensor), f"{msg} leaf {i}: not a tensor"
            assert o.dtype == r.dtype and o.shape == r.shape, \
                f"{msg} leaf {i}: {o.dtype}{list(o.shape)} vs {r.dtype}{list(r.shape)}"
            if r.dtype.is_floating_point or r.dtype.is_complex:
                t = tol if tol is not None else TOL.get(r.dtype, 1e-5)
                torch.testing.assert_close(o, r, rtol=t, atol=t, equal_nan=True, msg=lambda m: f"{msg} leaf {i}: {m}")
            else:
                assert torch.equal(o, r), f"{msg} leaf {i}: integer/bool outputs differ"
        else:
            assert o == r, f"{msg} leaf {i}: {o!r} vs {r!r}"


def export_and_compare(model: torch.nn.Module, args: tuple, kwargs=None, dynamic_shapes=None,
                       more_inputs=(), tol=None):
    """Export ``model``, compile for the CPU, and compare with eager on ``args`` and each of ``more_inputs``.

    The eager reference runs on a deep copy, so state (buffers) evolves independently on both sides.
    """
    kwargs = kwargs or {}
    ref_model = copy.deepcopy(model)
    prog = ostinato.export(model, args, kwargs, dynamic_shapes=dynamic_shapes)
    exe = ostinato.compile(prog, device="cpu")
    for a in (args, *more_inputs):
        with torch.no_grad():
            ref = ref_model(*a, **kwargs)
        out = exe(*a, **kwargs)
        assert_same(out, ref, tol)
    return prog, exe


def assert_decode_matches(exe, ref_model: torch.nn.Module, steps: int, vocab: int = 64) -> None:
    """``steps`` decode steps of examples.tiny_decoder through ``exe`` equal the eager ``ref_model``'s
    (both keep their own KV caches)."""
    from examples.tiny_decoder import decode_inputs
    for step in range(steps):
        args = decode_inputs(step, vocab=vocab)
        with torch.no_grad():
            expected = ref_model(*args)
        assert_same(exe(*args), expected, msg=f"decode step {step}:")


class LastHidden(torch.nn.Module):
    """A transformers base model called on token ids without a cache, returning last_hidden_state
    (``use_cache=None``: encoders whose forward takes no such keyword)."""

    def __init__(self, model: torch.nn.Module, use_cache: bool | None = False):
        super().__init__()
        self.model = model
        self.kwargs = {} if use_cache is None else {"use_cache": use_cache}

    def forward(self, ids):
        return self.model(input_ids=ids, **self.kwargs).last_hidden_state


def assert_replay_counts(stats: dict, calls: int, captures: int = 1) -> None:
    """A replayed executable's counts after ``calls`` calls over ``captures`` shapes: one capture per shape,
    at most one call per shape answered without a capture (the first, on a cold kernel cache: its kernels
    still compiled in workers), every other call a replay."""
    uncaptured = stats.get("uncaptured_calls", 0)
    assert stats["captures"] == captures, stats
    assert 0 <= uncaptured <= captures, stats
    assert stats["replays"] == calls - captures - uncaptured, stats
