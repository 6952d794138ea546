"""The table of Triton kernel cases: each fused op's launcher against its reference (ir/fused_ops.py).

Sizes are off the kernels' block sizes (rows of 33, 100, 8195 elements, caches of 9, 70, 4099 keys) and
reach the largest each kernel takes (a row of MAX_BLOCK - 3, a 4099-key cache). Every tensor the kernel
gets lies inside a larger buffer between two guard bands of a sentinel (NaN, or a huge index): a kernel
that writes outside its tensor changes a guard, one that reads outside gets the sentinel into its result
(issue #17's bounds tests; compute-sanitizer cannot see either inside one allocation).

Used on the GPU (test_triton_kernels.py, `cuda` marker) and on the CPU through Triton's interpreter
(run in a subprocess with TRITON_INTERPRET=1: ``python tests/backends/kernel_cases.py float32``).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Callable

import torch

from ostinato.backends.cuda.kernels.common import SHORT_QUERIES

TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


@dataclass
class KernelCase:
    op: str
    name: str
    make: Callable[[torch.Generator, torch.dtype, str], tuple[tuple, dict]]
    in_place: bool = False   # the op writes its first argument
    # Tolerance against a CPU reference when it differs from TOL. Plain-form (no upcast) fp16 norms:
    # CPU torch's fp16 rsqrt is not correctly rounded (rsqrt(2.6777) gives 0.61084, CUDA and the
    # kernel 0.61133, the nearest), and that ulp of the scale becomes up to two in the result.
    cpu_tol: dict | None = None
    # Tolerance on every device when it differs from TOL. The fused decode attention rotates q and k as
    # eager models do (each product rounded to the dtype, then the sum); the ost.rope reference's
    # addcmul rounds once, so in fp16 the two may differ by two ulps.
    tol: dict | None = None
    # Dtypes in which the reference itself is defined on every device (None: all). A row with no
    # visible key gives 0 in torch's CPU and fp32 CUDA SDPA, but other values in its fp16/bf16 CUDA
    # kernels; the fused kernel gives 0.
    dtypes: tuple | None = None
    # The launcher must run its kernel on these inputs: its reference (``fused_ops.<op's name>``, which a
    # launcher calls for a case it does not take) must not be called. A case written for the kernel then
    # fails when a launcher's conditions stop taking it, instead of passing on the reference's result.
    launches: bool = False


def _r(g, shape, dtype, device, scale=1.0):
    return (torch.randn(shape, generator=g) * scale).to(dtype).to(device)


_ROPE_TOL = {torch.float16: 2.5e-3}
_HALF = (torch.float16, torch.bfloat16)
_SOFTCAP_TOL = {torch.float16: 5e-3, torch.bfloat16: 4e-2}


def _slices(packed, cols, *extra):
    """(gate, up) as the two column slices of one packed projection's output."""
    return (packed[..., :cols], packed[..., cols:2 * cols], *extra), {}
_LONGEST = (1 << 16) - 3     # backends/cuda/kernels/common.MAX_BLOCK - 3: the longest row, off a power of two


def _window(n_keys: int, pos: int, width: int, dt, dev) -> torch.Tensor:
    """Mistral's sliding window as the sdpa pass hands it over: [1, 1, 1, S], 0 on the ``width`` keys
    up to ``pos``, -inf elsewhere."""
    keys = torch.arange(n_keys, device=dev)
    seen = (keys <= pos) & (keys > pos - width)
    return torch.zeros(n_keys, dtype=dt, device=dev).masked_fill(~seen, float("-inf")).view(1, 1, 1, n_keys)


CASES = [
    # a folded norm's row scale where nothing takes it (passes/fold_norms.py): fp32 products of rows along
    # dim 0 scaled by x's rows (x 100 and 5000 wide: one block, and a loop), one row's elements off the block
    KernelCase("ost.row_scale", "heads", lambda g, dt, dev: ((_r(g, (5, 1, 3, 40), torch.float32, dev, 3.0),
                                                             _r(g, (5, 1, 100), dt, dev, 2.0), 1e-5, dt), {})),
    KernelCase("ost.row_scale", "long-x-wide-rows", lambda g, dt, dev: ((_r(g, (3, 1, 1300), torch.float32, dev),
                                                                        _r(g, (3, 5000), dt, dev), 1e-6, dt), {})),
    # with a biased projection's bias (Qwen 2's q, k and v), one element per element of a row
    KernelCase("ost.row_scale", "bias-heads", lambda g, dt, dev: ((_r(g, (4, 1, 3, 40), torch.float32, dev, 3.0),
                                                                  _r(g, (4, 1, 100), dt, dev, 2.0), 1e-5, dt,
                                                                  _r(g, (120,), dt, dev)), {})),
    # a folded LayerNorm's: the statistic about the row's mean (rows of mean 3), its shift through the weights
    # as an fp32 bias; and over x rows walked in chunks
    KernelCase("ost.row_scale", "center-bias-heads", lambda g, dt, dev: (
        (_r(g, (4, 1, 3, 40), torch.float32, dev, 3.0), _r(g, (4, 1, 100), dt, dev, 2.0) + 3, 1e-5, dt,
         _r(g, (120,), torch.float32, dev), True), {})),
    KernelCase("ost.row_scale", "center-long-x", lambda g, dt, dev: (
        (_r(g, (3, 1, 1300), torch.float32, dev), _r(g, (3, 5000), dt, dev) - 2, 1e-6, dt, None, True), {})),
    # a lagging residual stream (passes/fold_norms.py: biased output projections accumulated without their
    # biases): the statistic of x plus an fp32 shift of large entries, LayerNorm's and RMSNorm's, and the
    # shift through the weights added to the product before the scale
    KernelCase("ost.row_scale", "shift-center-bias-heads", lambda g, dt, dev: (
        (_r(g, (4, 1, 3, 40), torch.float32, dev, 3.0), _r(g, (4, 1, 100), dt, dev, 2.0), 1e-5, dt,
         _r(g, (120,), torch.float32, dev), True, _r(g, (100,), torch.float32, dev, 6.0) + 2,
         _r(g, (120,), torch.float32, dev, 5.0)), {})),
    KernelCase("ost.row_scale", "shift-long-x", lambda g, dt, dev: (
        (_r(g, (3, 1, 1300), torch.float32, dev), _r(g, (3, 5000), dt, dev), 1e-6, dt, None, False,
         _r(g, (5000,), torch.float32, dev, 4.0), _r(g, (1300,), torch.float32, dev, 3.0)), {})),
    KernelCase("ost.rms_norm", "w", lambda g, dt, dev: ((_r(g, (3, 5, 64), dt, dev), _r(g, (64,), dt, dev), 1e-6), {}),
               cpu_tol={torch.float16: 2e-3}),
    KernelCase("ost.rms_norm", "noweight-odd", lambda g, dt, dev: ((_r(g, (7, 100), dt, dev), None, 1e-5), {})),
    KernelCase("ost.rms_norm", "upcast", lambda g, dt, dev: ((_r(g, (2, 3, 48), dt, dev), _r(g, (48,), dt, dev), 1e-6,
                                                             torch.float32), {})),
    KernelCase("ost.add_rms_norm", "w", lambda g, dt, dev: ((_r(g, (3, 5, 64), dt, dev), _r(g, (3, 5, 64), dt, dev),
                                                             _r(g, (64,), dt, dev), 1e-6), {}),
               cpu_tol={torch.float16: 2e-3}),
    KernelCase("ost.add_rms_norm", "upcast-odd", lambda g, dt, dev: ((_r(g, (7, 100), dt, dev, 4.0), _r(g, (7, 100), dt, dev),
                                                                      _r(g, (100,), dt, dev), 1e-5, torch.float32), {})),
    KernelCase("ost.add_rms_norm", "noweight", lambda g, dt, dev: ((_r(g, (2, 48), dt, dev), _r(g, (2, 48), dt, dev),
                                                                    None, 1e-6), {})),
    KernelCase("ost.rms_norm", "gemma", lambda g, dt, dev: ((_r(g, (3, 5, 64), dt, dev), _r(g, (64,), dt, dev, 0.3), 1e-6,
                                                            torch.float32, 1.0, True), {})),
    KernelCase("ost.rms_norm", "offset-plain", lambda g, dt, dev: ((_r(g, (4, 40), dt, dev), _r(g, (40,), dt, dev, 0.3),
                                                                   1e-6, None, 1.0), {}), cpu_tol={torch.float16: 2e-3}),
    KernelCase("ost.add_rms_norm", "gemma", lambda g, dt, dev: ((_r(g, (2, 3, 48), dt, dev), _r(g, (2, 3, 48), dt, dev),
                                                                _r(g, (48,), dt, dev, 0.3), 1e-6, torch.float32, 1.0,
                                                                True), {})),
    KernelCase("ost.layer_norm", "wb", lambda g, dt, dev: ((_r(g, (4, 96), dt, dev), _r(g, (96,), dt, dev),
                                                            _r(g, (96,), dt, dev), 1e-5), {})),
    KernelCase("ost.layer_norm", "plain", lambda g, dt, dev: ((_r(g, (2, 3, 40), dt, dev, 3.0), None, None, 1e-5), {})),
    KernelCase("ost.rope", "half", lambda g, dt, dev: ((_r(g, (2, 4, 5, 32), dt, dev), _r(g, (5, 32), dt, dev),
                                                        _r(g, (5, 32), dt, dev)), {})),
    KernelCase("ost.rope", "interleaved", lambda g, dt, dev: ((_r(g, (1, 3, 2, 16), dt, dev), _r(g, (1, 1, 2, 16), dt, dev),
                                                               _r(g, (1, 1, 2, 16), dt, dev), True), {})),
    # 1050 rows of 16: several programs of 128 rows, the last one part-filled
    KernelCase("ost.rope", "many-rows", lambda g, dt, dev: ((_r(g, (3, 5, 70, 16), dt, dev), _r(g, (70, 16), dt, dev),
                                                             _r(g, (70, 16), dt, dev)), {})),
    KernelCase("ost.rope", "3d", lambda g, dt, dev: ((_r(g, (6, 3, 8), dt, dev), _r(g, (6, 1, 8), dt, dev),
                                                      _r(g, (6, 1, 8), dt, dev)), {})),
    KernelCase("ost.swiglu", "", lambda g, dt, dev: ((_r(g, (3, 7, 40), dt, dev), _r(g, (3, 7, 40), dt, dev)), {})),
    # a packed sibling projection's slices and a head view of one: read where they lie, no copy
    KernelCase("ost.swiglu", "packed-slices", lambda g, dt, dev: _slices(_r(g, (3, 7, 80), dt, dev), 40)),
    KernelCase("ost.swiglu", "dense-and-slice", lambda g, dt, dev: ((_r(g, (3, 7, 40), dt, dev),
                                                                     _r(g, (3, 7, 96), dt, dev)[..., 50:90]), {})),
    KernelCase("ost.geglu", "packed-slices", lambda g, dt, dev: _slices(_r(g, (2, 3, 66), dt, dev), 33, "tanh")),
    KernelCase("ost.rope", "head-view", lambda g, dt, dev: ((_r(g, (2, 5, 12, 32), dt, dev)[:, :, 4:8].permute(0, 2, 1, 3),
                                                             _r(g, (5, 32), dt, dev), _r(g, (5, 32), dt, dev)), {}),
               tol=_ROPE_TOL),
    KernelCase("ost.geglu", "tanh", lambda g, dt, dev: ((_r(g, (5, 33), dt, dev), _r(g, (5, 33), dt, dev), "tanh"), {})),
    KernelCase("ost.geglu", "erf", lambda g, dt, dev: ((_r(g, (5, 33), dt, dev), _r(g, (5, 33), dt, dev)), {})),
    KernelCase("ost.swiglu_packed", "", lambda g, dt, dev: ((_r(g, (2, 3, 64), dt, dev),), {})),
    KernelCase("ost.geglu_packed", "", lambda g, dt, dev: ((_r(g, (4, 30), dt, dev),), {})),
    KernelCase("ost.kv_update_", "dim2", lambda g, dt, dev: ((_r(g, (2, 3, 16, 8), dt, dev), _r(g, (2, 3, 2, 8), dt, dev),
                                                              torch.tensor([5, -1], device=dev), 2), {}), True),
    # a prefill's keys as the projection leaves them ([B, T, H, D] transposed: not dense), and a batch
    # of one broadcast over the cache's two (stride 0): read through their strides
    KernelCase("ost.kv_update_", "dim2-transposed", lambda g, dt, dev: ((_r(g, (2, 3, 16, 8), dt, dev),
                                                                         _r(g, (2, 4, 3, 8), dt, dev).transpose(1, 2),
                                                                         torch.tensor([5, -1, 0, 9], device=dev), 2), {}), True),
    KernelCase("ost.kv_update_", "dim2-broadcast", lambda g, dt, dev: ((_r(g, (2, 3, 16, 8), dt, dev),
                                                                        _r(g, (1, 3, 2, 8), dt, dev), torch.tensor([7, 2], device=dev),
                                                                        2), {}), True),
    KernelCase("ost.kv_update_", "ring", lambda g, dt, dev: ((_r(g, (1, 2, 8, 4), dt, dev), _r(g, (1, 2, 1, 4), dt, dev),
                                                              torch.tensor([13], device=dev), 2, 8), {}), True),
    KernelCase("ost.kv_update", "dim1", lambda g, dt, dev: ((_r(g, (2, 10, 6), dt, dev), _r(g, (2, 3, 6), dt, dev),
                                                             torch.tensor([0, 4, 9], device=dev), 1), {})),
    KernelCase("ost.linear", "gelu_tanh-bias", lambda g, dt, dev: ((_r(g, (2, 3, 24), dt, dev), _r(g, (40, 24), dt, dev, 0.2),
                                                                    _r(g, (40,), dt, dev), "gelu_tanh"), {})),
    # GPT-2's written-out tanh GELU: the kernel's tanh GELU rounds once, the reference at each op (within TOL)
    KernelCase("ost.linear", "gelu_new-bias", lambda g, dt, dev: ((_r(g, (2, 3, 24), dt, dev), _r(g, (40, 24), dt, dev, 0.2),
                                                                   _r(g, (40,), dt, dev), "gelu_new"), {})),
    KernelCase("ost.linear", "silu-nobias", lambda g, dt, dev: ((_r(g, (5, 16), dt, dev), _r(g, (8, 16), dt, dev, 0.3),
                                                                 None, "silu"), {})),
    KernelCase("ost.linear", "relu-weight_t", lambda g, dt, dev: ((_r(g, (2, 4, 12), dt, dev), _r(g, (12, 20), dt, dev, 0.3),
                                                                   _r(g, (20,), dt, dev), "relu", True), {})),
    KernelCase("ost.linear", "gelu", lambda g, dt, dev: ((_r(g, (3, 32), dt, dev), _r(g, (16, 32), dt, dev, 0.2),
                                                          _r(g, (16,), dt, dev), "gelu"), {})),
    KernelCase("ost.linear", "plain", lambda g, dt, dev: ((_r(g, (3, 32), dt, dev), _r(g, (16, 32), dt, dev, 0.2),
                                                           _r(g, (16,), dt, dev)), {})),
    KernelCase("ost.sdpa", "decode-gqa-pos", lambda g, dt, dev: ((_r(g, (2, 4, 1, 32), dt, dev), _r(g, (2, 2, 70, 32), dt, dev),
                                                                  _r(g, (2, 2, 70, 32), dt, dev), None,
                                                                  torch.tensor([[37]], device=dev), None, 2), {})),
    # positions at a block's edge (the kernel walks blocks up to the position only): 63 ends block 0,
    # 64 needs block 1's first key
    KernelCase("ost.sdpa", "decode-block-edge", lambda g, dt, dev: ((_r(g, (2, 4, 1, 32), dt, dev),
                                                                     _r(g, (2, 2, 130, 32), dt, dev),
                                                                     _r(g, (2, 2, 130, 32), dt, dev), None,
                                                                     torch.tensor([63, 64], device=dev).view(2, 1, 1, 1),
                                                                     None, 2), {})),
    KernelCase("ost.sdpa", "decode-nomask", lambda g, dt, dev: ((_r(g, (1, 3, 1, 16), dt, dev), _r(g, (1, 3, 9, 16), dt, dev),
                                                                 _r(g, (1, 3, 9, 16), dt, dev)), {})),
    # short prompts (at most SHORT_QUERIES query rows): the Triton kernel, one program per query row. torch's
    # is_causal (query i sees keys j <= i, top-left); positions per query row ([T, 1]) and per batch and row
    # ([B, 1, T, 1]) over a static cache longer than the prompt, with GQA; a boolean mask per row and a float
    # one per head; the largest short prompt; one row more, torch's SDPA
    KernelCase("ost.sdpa", "prompt-causal", lambda g, dt, dev: ((_r(g, (1, 2, 5, 16), dt, dev), _r(g, (1, 2, 5, 16), dt, dev),
                                                                 _r(g, (1, 2, 5, 16), dt, dev)), {"is_causal": True})),
    KernelCase("ost.sdpa", "prompt-causal-more-keys", lambda g, dt, dev: ((_r(g, (2, 3, 6, 8), dt, dev),
                                                                           _r(g, (2, 3, 9, 8), dt, dev),
                                                                           _r(g, (2, 3, 9, 8), dt, dev)), {"is_causal": True})),
    KernelCase("ost.sdpa", "prompt-positions-gqa", lambda g, dt, dev: ((_r(g, (1, 4, 7, 32), dt, dev), _r(g, (1, 2, 70, 32), dt, dev),
                                                                        _r(g, (1, 2, 70, 32), dt, dev), None,
                                                                        torch.arange(7, device=dev).view(7, 1) + 60, None, 2), {})),
    KernelCase("ost.sdpa", "prompt-positions-per-batch", lambda g, dt, dev: ((_r(g, (2, 2, 3, 16), dt, dev),
                                                                              _r(g, (2, 2, 20, 16), dt, dev),
                                                                              _r(g, (2, 2, 20, 16), dt, dev), None,
                                                                              torch.tensor([[0, 1, 2], [9, 10, 11]], device=dev)
                                                                              .view(2, 1, 3, 1)), {})),
    KernelCase("ost.sdpa", "prompt-bool-mask-rows", lambda g, dt, dev: ((_r(g, (1, 2, 4, 16), dt, dev), _r(g, (1, 2, 12, 16), dt, dev),
                                                                         _r(g, (1, 2, 12, 16), dt, dev),
                                                                         torch.rand(1, 1, 4, 12, generator=g).to(dev) > 0.4), {})),
    KernelCase("ost.sdpa", "prompt-float-mask-heads", lambda g, dt, dev: ((_r(g, (1, 2, 4, 16), dt, dev),
                                                                           _r(g, (1, 2, 12, 16), dt, dev),
                                                                           _r(g, (1, 2, 12, 16), dt, dev),
                                                                           _r(g, (1, 2, 4, 12), dt, dev)), {})),
    KernelCase("ost.sdpa", "prompt-longest", lambda g, dt, dev: ((_r(g, (1, 2, SHORT_QUERIES, 16), dt, dev),
                                                                  _r(g, (1, 2, SHORT_QUERIES, 16), dt, dev),
                                                                  _r(g, (1, 2, SHORT_QUERIES, 16), dt, dev)), {"is_causal": True})),
    # MLA's shapes (DeepSeek: v's head dim narrower than q's and k's): torch's SDPA
    KernelCase("ost.sdpa", "prompt-narrow-v-fallback", lambda g, dt, dev: ((_r(g, (1, 2, 4, 24), dt, dev),
                                                                            _r(g, (1, 2, 6, 24), dt, dev),
                                                                            _r(g, (1, 2, 6, 16), dt, dev)),
                                                                           {"is_causal": True})),
    KernelCase("ost.sdpa", "prompt-fallback", lambda g, dt, dev: ((_r(g, (1, 2, SHORT_QUERIES + 1, 16), dt, dev),
                                                                   _r(g, (1, 2, SHORT_QUERIES + 1, 16), dt, dev),
                                                                   _r(g, (1, 2, SHORT_QUERIES + 1, 16), dt, dev)),
                                                                  {"is_causal": True})),
    KernelCase("ost.decode_attention_", "rope-gqa-pos", lambda g, dt, dev: (
        (_r(g, (2, 2, 40, 24), dt, dev), _r(g, (2, 2, 40, 24), dt, dev),
         _r(g, (2, 1, 4, 24), dt, dev).transpose(1, 2), _r(g, (2, 2, 1, 24), dt, dev), _r(g, (2, 2, 1, 24), dt, dev),
         torch.tensor([29], device=dev), 2, None, _r(g, (2, 1, 1, 24), dt, dev), _r(g, (2, 1, 1, 24), dt, dev), False,
         torch.tensor([20, 35], device=dev).view(2, 1, 1, 1), None, 2), {}), tol=_ROPE_TOL),
    KernelCase("ost.decode_attention_", "interleaved-ring", lambda g, dt, dev: (
        (_r(g, (1, 3, 16, 16), dt, dev), _r(g, (1, 3, 16, 16), dt, dev), _r(g, (1, 3, 1, 16), dt, dev),
         _r(g, (1, 3, 1, 16), dt, dev), _r(g, (1, 3, 1, 16), dt, dev), torch.tensor([21], device=dev), 2, 16,
         _r(g, (1, 1, 16), dt, dev), _r(g, (1, 1, 16), dt, dev), True, None, 0.3, 1), {}), tol=_ROPE_TOL),
    KernelCase("ost.decode_attention_", "norope-last-slot", lambda g, dt, dev: (
        (_r(g, (1, 2, 70, 32), dt, dev), _r(g, (1, 2, 70, 32), dt, dev), _r(g, (1, 6, 1, 32), dt, dev),
         _r(g, (1, 2, 1, 32), dt, dev), _r(g, (1, 2, 1, 32), dt, dev), torch.tensor([-1], device=dev), 2, None,
         None, None, False, torch.tensor([[69]], device=dev), None, 3), {})),
    # positions per head ([B, 1, 1] broadcasts over the heads, not the batch): the reference
    # multi-query (Falcon-7B: one KV head, every query head reads it): n_rep is the query heads' count
    KernelCase("ost.decode_attention_", "mqa-rope-pos", lambda g, dt, dev: (
        (_r(g, (2, 1, 24, 16), dt, dev), _r(g, (2, 1, 24, 16), dt, dev), _r(g, (2, 4, 1, 16), dt, dev),
         _r(g, (2, 1, 1, 16), dt, dev), _r(g, (2, 1, 1, 16), dt, dev), torch.tensor([7], device=dev), 2, None,
         _r(g, (1, 1, 1, 16), dt, dev), _r(g, (1, 1, 1, 16), dt, dev), False,
         torch.tensor([[7]], device=dev), None, 4), {}), tol=_ROPE_TOL),
    # GPT-J: q and k as [B, 1, H, D] rows over head-major caches (roped before the model's transpose), an
    # interleaved rope over the first 8 dims, v head-major
    KernelCase("ost.decode_attention_", "rows-head-major-partial-interleaved", lambda g, dt, dev: (
        (_r(g, (2, 2, 24, 16), dt, dev), _r(g, (2, 2, 24, 16), dt, dev), _r(g, (2, 1, 4, 16), dt, dev),
         _r(g, (2, 1, 2, 16), dt, dev), _r(g, (2, 2, 1, 16), dt, dev), torch.tensor([5], device=dev), 2, None,
         _r(g, (1, 1, 1, 8), dt, dev), _r(g, (1, 1, 1, 8), dt, dev), True,
         torch.tensor([[5]], device=dev), None, 2, None, None, None, None, 0.0, None, 0.0, False, 8), {}),
        tol=_ROPE_TOL),
    KernelCase("ost.decode_attention_", "positions-per-head-fallback", lambda g, dt, dev: (
        (_r(g, (2, 2, 8, 16), dt, dev), _r(g, (2, 2, 8, 16), dt, dev), _r(g, (2, 2, 1, 16), dt, dev),
         _r(g, (2, 2, 1, 16), dt, dev), _r(g, (2, 2, 1, 16), dt, dev), torch.tensor([3], device=dev), 2, None,
         None, None, False, torch.tensor([2, 6], device=dev).view(2, 1, 1)), {})),
    # cos and sin of one column broadcast over the head dim: the reference
    KernelCase("ost.decode_attention_", "one-column-cos-fallback", lambda g, dt, dev: (
        (_r(g, (1, 2, 8, 16), dt, dev), _r(g, (1, 2, 8, 16), dt, dev), _r(g, (1, 2, 1, 16), dt, dev),
         _r(g, (1, 2, 1, 16), dt, dev), _r(g, (1, 2, 1, 16), dt, dev), torch.tensor([5], device=dev), 2, None,
         _r(g, (1, 1, 1, 1), dt, dev), _r(g, (1, 1, 1, 1), dt, dev)), {})),
    # no key visible (a negative position): zeros, as torch's SDPA gives
    KernelCase("ost.decode_attention_", "nothing-visible", lambda g, dt, dev: (
        (_r(g, (1, 2, 8, 16), dt, dev), _r(g, (1, 2, 8, 16), dt, dev), _r(g, (1, 2, 1, 16), dt, dev),
         _r(g, (1, 2, 1, 16), dt, dev), _r(g, (1, 2, 1, 16), dt, dev), torch.tensor([5], device=dev), 2, None,
         None, None, False, torch.tensor([[-1]], device=dev)), {}), dtypes=(torch.float32,)),
    KernelCase("ost.sdpa", "positions-per-head-fallback", lambda g, dt, dev: (
        (_r(g, (2, 2, 1, 16), dt, dev), _r(g, (2, 2, 9, 16), dt, dev), _r(g, (2, 2, 9, 16), dt, dev), None,
         torch.tensor([3, 7], device=dev).view(2, 1, 1)), {})),
    # the largest sizes: the longest row the norm kernels take, a cache past 4096 keys, a long gated row
    KernelCase("ost.rms_norm", "longest-row", lambda g, dt, dev: ((_r(g, (2, _LONGEST), dt, dev), _r(g, (_LONGEST,), dt, dev),
                                                                  1e-6), {}), cpu_tol={torch.float16: 2e-3}),
    KernelCase("ost.add_rms_norm", "longest-row-upcast", lambda g, dt, dev: (
        (_r(g, (2, _LONGEST), dt, dev), _r(g, (2, _LONGEST), dt, dev), _r(g, (_LONGEST,), dt, dev), 1e-6, torch.float32), {})),
    KernelCase("ost.layer_norm", "longest-row", lambda g, dt, dev: ((_r(g, (2, _LONGEST), dt, dev), _r(g, (_LONGEST,), dt, dev),
                                                                    _r(g, (_LONGEST,), dt, dev), 1e-5), {})),
    KernelCase("ost.swiglu", "long-odd", lambda g, dt, dev: ((_r(g, (3, 8195), dt, dev), _r(g, (3, 8195), dt, dev)), {})),
    KernelCase("ost.kv_update_", "long-cache", lambda g, dt, dev: ((_r(g, (1, 2, 4099, 8), dt, dev), _r(g, (1, 2, 3, 8), dt, dev),
                                                                    torch.tensor([0, 2048, 4098], device=dev), 2), {}), True),
    KernelCase("ost.sdpa", "decode-long-cache", lambda g, dt, dev: ((_r(g, (1, 4, 1, 64), dt, dev), _r(g, (1, 2, 4099, 64), dt, dev),
                                                                     _r(g, (1, 2, 4099, 64), dt, dev), None,
                                                                     torch.tensor([[4098]], device=dev), None, 2), {})),
    KernelCase("ost.decode_attention_", "long-cache-last-slot", lambda g, dt, dev: (
        (_r(g, (1, 2, 4099, 64), dt, dev), _r(g, (1, 2, 4099, 64), dt, dev), _r(g, (1, 4, 1, 64), dt, dev),
         _r(g, (1, 2, 1, 64), dt, dev), _r(g, (1, 2, 1, 64), dt, dev), torch.tensor([4098], device=dev), 2, None,
         None, None, False, torch.tensor([[4098]], device=dev), None, 2), {})),
    # explicit masks: a sliding window (additive, -inf outside, as the sdpa pass makes it) with
    # positions; a boolean padding mask per batch row; a float bias per head (no -inf) over GQA
    KernelCase("ost.decode_attention_", "window-additive", lambda g, dt, dev: (
        (_r(g, (1, 2, 40, 32), dt, dev), _r(g, (1, 2, 40, 32), dt, dev), _r(g, (1, 4, 1, 32), dt, dev),
         _r(g, (1, 2, 1, 32), dt, dev), _r(g, (1, 2, 1, 32), dt, dev), torch.tensor([30], device=dev), 2, None,
         _r(g, (1, 1, 1, 32), dt, dev), _r(g, (1, 1, 1, 32), dt, dev), False, torch.tensor([[30]], device=dev), None,
         2, _window(40, 30, 8, dt, dev)), {}), tol=_ROPE_TOL),
    KernelCase("ost.decode_attention_", "padding-bool-per-batch", lambda g, dt, dev: (
        (_r(g, (2, 2, 70, 16), dt, dev), _r(g, (2, 2, 70, 16), dt, dev), _r(g, (2, 2, 1, 16), dt, dev),
         _r(g, (2, 2, 1, 16), dt, dev), _r(g, (2, 2, 1, 16), dt, dev), torch.tensor([66], device=dev), 2, None,
         None, None, False, None, None, 1, torch.rand(2, 1, 1, 70, generator=g).to(dev) > 0.3), {})),
    KernelCase("ost.decode_attention_", "bias-per-head", lambda g, dt, dev: (
        (_r(g, (1, 2, 20, 16), dt, dev), _r(g, (1, 2, 20, 16), dt, dev), _r(g, (1, 4, 1, 16), dt, dev),
         _r(g, (1, 2, 1, 16), dt, dev), _r(g, (1, 2, 1, 16), dt, dev), torch.tensor([7], device=dev), 2, None,
         None, None, False, None, 0.2, 2, _r(g, (4, 1, 20), dt, dev)), {})),
    # Gemma 2: soft-capped scores (scaled up so the cap bites), a sliding window, GQA; the reference is
    # the eager form, which rounds each step to the dtype (the kernel keeps fp32): a wider tolerance
    KernelCase("ost.decode_attention_", "softcap-window", lambda g, dt, dev: (
        (_r(g, (1, 2, 40, 32), dt, dev), _r(g, (1, 2, 40, 32), dt, dev), _r(g, (1, 4, 1, 32), dt, dev, 3.0),
         _r(g, (1, 2, 1, 32), dt, dev), _r(g, (1, 2, 1, 32), dt, dev), torch.tensor([30], device=dev), 2, None,
         None, None, False, None, 0.25, 2, _window(40, 30, 8, dt, dev), 5.0), {}), tol=_SOFTCAP_TOL),
    KernelCase("ost.sdpa", "decode-softcap", lambda g, dt, dev: ((_r(g, (2, 4, 1, 32), dt, dev, 3.0),
                                                                  _r(g, (2, 2, 40, 32), dt, dev),
                                                                  _r(g, (2, 2, 40, 32), dt, dev), None,
                                                                  torch.tensor([[30]], device=dev), 0.25, 2, False, 5.0),
                                                                 {}), tol=_SOFTCAP_TOL),
    KernelCase("ost.sdpa", "decode-window", lambda g, dt, dev: ((_r(g, (1, 4, 1, 32), dt, dev), _r(g, (1, 2, 40, 32), dt, dev),
                                                                 _r(g, (1, 2, 40, 32), dt, dev), _window(40, 30, 8, dt, dev),
                                                                 torch.tensor([[30]], device=dev), None, 2), {})),
    # sequence-major [B, S, H, D] caches written on dim 1, q, k and v [B, 1, H, D], cos and sin over them
    KernelCase("ost.decode_attention_", "seq-major-rope-gqa-pos", lambda g, dt, dev: (
        (_r(g, (2, 40, 2, 24), dt, dev), _r(g, (2, 40, 2, 24), dt, dev), _r(g, (2, 1, 4, 24), dt, dev),
         _r(g, (2, 1, 2, 24), dt, dev), _r(g, (2, 1, 2, 24), dt, dev), torch.tensor([29], device=dev), 1, None,
         _r(g, (2, 1, 1, 24), dt, dev), _r(g, (2, 1, 1, 24), dt, dev), False,
         torch.tensor([20, 35], device=dev).view(2, 1, 1, 1), None, 2), {}), tol=_ROPE_TOL),
    KernelCase("ost.decode_attention_", "seq-major-ring-window", lambda g, dt, dev: (
        (_r(g, (1, 16, 3, 16), dt, dev), _r(g, (1, 16, 3, 16), dt, dev), _r(g, (1, 1, 3, 16), dt, dev),
         _r(g, (1, 1, 3, 16), dt, dev), _r(g, (1, 1, 3, 16), dt, dev), torch.tensor([21], device=dev), -3, 16,
         _r(g, (1, 16), dt, dev), _r(g, (1, 16), dt, dev), True, None, 0.3, 1, _window(16, 5, 8, dt, dev)), {}),
        tol=_ROPE_TOL),
    # the heads' RMSNorm before the rope (Qwen 3: [B, 1, H, D] rows over head-major caches; Gemma 3: 1 + w,
    # weight first, over [B, H, 1, D] rows; over sequence-major caches)
    KernelCase("ost.decode_attention_", "qk-norm-rows-rope-gqa", lambda g, dt, dev: (
        (_r(g, (2, 2, 40, 24), dt, dev), _r(g, (2, 2, 40, 24), dt, dev), _r(g, (2, 1, 4, 24), dt, dev, 3.0),
         _r(g, (2, 1, 2, 24), dt, dev, 3.0), _r(g, (2, 1, 2, 24), dt, dev), torch.tensor([29], device=dev), 2, None,
         _r(g, (2, 1, 1, 24), dt, dev), _r(g, (2, 1, 1, 24), dt, dev), False,
         torch.tensor([20, 35], device=dev).view(2, 1, 1, 1), None, 2, None, None, _r(g, (24,), dt, dev),
         _r(g, (24,), dt, dev), 1e-6, torch.float32), {}), tol=_ROPE_TOL),
    KernelCase("ost.decode_attention_", "qk-norm-gemma-heads", lambda g, dt, dev: (
        (_r(g, (1, 2, 20, 32), dt, dev), _r(g, (1, 2, 20, 32), dt, dev), _r(g, (1, 4, 1, 32), dt, dev),
         _r(g, (1, 2, 1, 32), dt, dev), _r(g, (1, 2, 1, 32), dt, dev), torch.tensor([7], device=dev), 2, None,
         _r(g, (1, 1, 1, 32), dt, dev), _r(g, (1, 1, 1, 32), dt, dev), False, None, 0.25, 2,
         _window(20, 7, 4, dt, dev), None, _r(g, (32,), dt, dev, 0.5), _r(g, (32,), dt, dev, 0.5), 1e-6,
         torch.float32, 1.0, True), {}), tol=_ROPE_TOL),
    KernelCase("ost.decode_attention_", "qk-norm-seq-major", lambda g, dt, dev: (
        (_r(g, (1, 16, 2, 16), dt, dev), _r(g, (1, 16, 2, 16), dt, dev), _r(g, (1, 1, 4, 16), dt, dev),
         _r(g, (1, 1, 2, 16), dt, dev), _r(g, (1, 1, 2, 16), dt, dev), torch.tensor([5], device=dev), 1, None,
         _r(g, (1, 16), dt, dev), _r(g, (1, 16), dt, dev), True, None, None, 2, None, None, _r(g, (16,), dt, dev),
         _r(g, (16,), dt, dev), 1e-5, torch.float32), {}), tol=_ROPE_TOL),
    # OLMo 2's norms of the whole projections, every head at once: [B, 1, H * D] rows with weights as wide,
    # the weight first in fp32 (then a wide rope, GQA, positions); the upcast form over sequence-major caches
    KernelCase("ost.decode_attention_", "qk-norm-whole-wide-rope-gqa", lambda g, dt, dev: (
        (_r(g, (2, 2, 40, 24), dt, dev), _r(g, (2, 2, 40, 24), dt, dev), _r(g, (2, 1, 96), dt, dev, 3.0),
         _r(g, (2, 1, 48), dt, dev, 3.0), _r(g, (2, 1, 2, 24), dt, dev), torch.tensor([29], device=dev), 2, None,
         _r(g, (2, 1, 1, 24), torch.float32, dev), _r(g, (2, 1, 1, 24), torch.float32, dev), False,
         torch.tensor([20, 35], device=dev).view(2, 1, 1, 1), None, 2, None, None, _r(g, (96,), dt, dev),
         _r(g, (48,), dt, dev), 1e-6, torch.float32, 0.0, True, None, True), {}), tol=_ROPE_TOL),
    KernelCase("ost.decode_attention_", "qk-norm-whole-seq-major", lambda g, dt, dev: (
        (_r(g, (1, 16, 2, 16), dt, dev), _r(g, (1, 16, 2, 16), dt, dev), _r(g, (1, 1, 96), dt, dev),
         _r(g, (1, 1, 32), dt, dev), _r(g, (1, 1, 2, 16), dt, dev), torch.tensor([5], device=dev), 1, None,
         _r(g, (1, 16), dt, dev), _r(g, (1, 16), dt, dev), True, None, None, 3, None, None, _r(g, (96,), dt, dev),
         _r(g, (32,), dt, dev), 1e-5, torch.float32), {}), tol=_ROPE_TOL),
    # a batched step's norm folded into the projections (passes/fold_norms.py): q, k and v fp32 products as
    # [B, 1, H, D] rows, scaled first by the RMSNorm statistic of the norm's input (its rows, 40 wide here:
    # off the kernel's block); then as Qwen 3's (the heads' norms after the scale), and over sequence-major
    # caches without a rope
    KernelCase("ost.decode_attention_", "row-scaled-rows-rope-gqa", lambda g, dt, dev: (
        (_r(g, (3, 2, 40, 24), dt, dev), _r(g, (3, 2, 40, 24), dt, dev), _r(g, (3, 1, 4, 24), torch.float32, dev, 3.0),
         _r(g, (3, 1, 2, 24), torch.float32, dev, 3.0), _r(g, (3, 1, 2, 24), torch.float32, dev, 3.0),
         torch.tensor([29], device=dev), 2, None, _r(g, (3, 1, 1, 24), dt, dev), _r(g, (3, 1, 1, 24), dt, dev), False,
         torch.tensor([20, 35, 3], device=dev).view(3, 1, 1, 1), None, 2, None, None, None, None, 0.0, None, 0.0, False,
         None, False, _r(g, (3, 1, 40), dt, dev, 4.0), 1e-5), {}), tol=_ROPE_TOL),
    # with q's, k's and v's projection biases added after the scale (Qwen 2)
    KernelCase("ost.decode_attention_", "row-scaled-bias-rows-rope-gqa", lambda g, dt, dev: (
        (_r(g, (3, 2, 40, 24), dt, dev), _r(g, (3, 2, 40, 24), dt, dev), _r(g, (3, 1, 4, 24), torch.float32, dev, 3.0),
         _r(g, (3, 1, 2, 24), torch.float32, dev, 3.0), _r(g, (3, 1, 2, 24), torch.float32, dev, 3.0),
         torch.tensor([29], device=dev), 2, None, _r(g, (3, 1, 1, 24), dt, dev), _r(g, (3, 1, 1, 24), dt, dev), False,
         torch.tensor([20, 35, 3], device=dev).view(3, 1, 1, 1), None, 2, None, None, None, None, 0.0, None, 0.0, False,
         None, False, _r(g, (3, 1, 40), dt, dev, 4.0), 1e-5,
         [_r(g, (96,), dt, dev, 2.0), _r(g, (48,), dt, dev, 2.0), _r(g, (48,), dt, dev, 2.0)]), {}), tol=_ROPE_TOL),
    # biases over sequence-major caches, multi-query (one KV head), no rope; and before the heads' norms
    KernelCase("ost.decode_attention_", "row-scaled-bias-seq-major-mqa", lambda g, dt, dev: (
        (_r(g, (2, 16, 1, 16), dt, dev), _r(g, (2, 16, 1, 16), dt, dev), _r(g, (2, 1, 4, 16), torch.float32, dev),
         _r(g, (2, 1, 1, 16), torch.float32, dev), _r(g, (2, 1, 1, 16), torch.float32, dev),
         torch.tensor([5], device=dev), 1, None, None, None, False, None, None, 4, None, None, None, None, 0.0, None,
         0.0, False, None, False, _r(g, (2, 64), dt, dev), 1e-5,
         [_r(g, (64,), dt, dev, 2.0), _r(g, (16,), dt, dev, 2.0), _r(g, (16,), dt, dev, 2.0)]), {})),
    KernelCase("ost.decode_attention_", "row-scaled-bias-qk-norm-rows", lambda g, dt, dev: (
        (_r(g, (2, 2, 20, 16), dt, dev), _r(g, (2, 2, 20, 16), dt, dev), _r(g, (2, 1, 4, 16), torch.float32, dev, 3.0),
         _r(g, (2, 1, 2, 16), torch.float32, dev, 3.0), _r(g, (2, 1, 2, 16), torch.float32, dev),
         torch.tensor([9], device=dev), 2, None, _r(g, (2, 1, 1, 16), dt, dev), _r(g, (2, 1, 1, 16), dt, dev), True,
         None, None, 2, None, None, _r(g, (16,), dt, dev), _r(g, (16,), dt, dev), 1e-6, torch.float32, 0.0, False,
         None, False, _r(g, (2, 1, 100), dt, dev), 1e-6,
         [_r(g, (64,), dt, dev, 2.0), _r(g, (32,), dt, dev, 2.0), _r(g, (32,), dt, dev, 2.0)]), {}), tol=_ROPE_TOL),
    KernelCase("ost.decode_attention_", "row-scaled-qk-norm-rows", lambda g, dt, dev: (
        (_r(g, (2, 2, 20, 16), dt, dev), _r(g, (2, 2, 20, 16), dt, dev), _r(g, (2, 1, 4, 16), torch.float32, dev, 3.0),
         _r(g, (2, 1, 2, 16), torch.float32, dev, 3.0), _r(g, (2, 1, 2, 16), torch.float32, dev),
         torch.tensor([9], device=dev), 2, None, _r(g, (2, 1, 1, 16), dt, dev), _r(g, (2, 1, 1, 16), dt, dev), False,
         None, None, 2, None, None, _r(g, (16,), dt, dev), _r(g, (16,), dt, dev), 1e-6, torch.float32, 0.0, False,
         None, False, _r(g, (2, 1, 1100), dt, dev), 1e-6), {}), tol=_ROPE_TOL),
    KernelCase("ost.decode_attention_", "row-scaled-seq-major", lambda g, dt, dev: (
        (_r(g, (2, 16, 2, 16), dt, dev), _r(g, (2, 16, 2, 16), dt, dev), _r(g, (2, 1, 4, 16), torch.float32, dev),
         _r(g, (2, 1, 2, 16), torch.float32, dev), _r(g, (2, 1, 2, 16), torch.float32, dev),
         torch.tensor([5], device=dev), 1, None, None, None, False, None, None, 2, None, None, None, None, 0.0, None,
         0.0, False, None, False, _r(g, (2, 64), dt, dev), 1e-5), {})),
    # a folded LayerNorm (StableLM's: its shift as fp32 biases, a partial rope of 8 dims; rows of mean 3); then
    # OLMo's (no shift) over sequence-major caches
    KernelCase("ost.decode_attention_", "row-scaled-layer-bias-partial-rope", lambda g, dt, dev: (
        (_r(g, (2, 2, 40, 24), dt, dev), _r(g, (2, 2, 40, 24), dt, dev), _r(g, (2, 1, 4, 24), torch.float32, dev, 3.0),
         _r(g, (2, 1, 2, 24), torch.float32, dev, 3.0), _r(g, (2, 1, 2, 24), torch.float32, dev, 3.0),
         torch.tensor([29], device=dev), 2, None, _r(g, (2, 1, 1, 8), dt, dev), _r(g, (2, 1, 1, 8), dt, dev), False,
         torch.tensor([20, 35], device=dev).view(2, 1, 1, 1), None, 2, None, None, None, None, 0.0, None, 0.0, False,
         8, False, _r(g, (2, 1, 40), dt, dev, 2.0) + 3, 1e-5,
         [_r(g, (96,), torch.float32, dev), _r(g, (48,), torch.float32, dev), _r(g, (48,), torch.float32, dev)],
         True), {}), tol=_ROPE_TOL),
    # the same two with the statistic of a lagging stream plus its shift (OPT's, StarCoder 2's)
    KernelCase("ost.decode_attention_", "row-scaled-layer-shift-partial-rope", lambda g, dt, dev: (
        (_r(g, (2, 2, 40, 24), dt, dev), _r(g, (2, 2, 40, 24), dt, dev), _r(g, (2, 1, 4, 24), torch.float32, dev, 3.0),
         _r(g, (2, 1, 2, 24), torch.float32, dev, 3.0), _r(g, (2, 1, 2, 24), torch.float32, dev, 3.0),
         torch.tensor([29], device=dev), 2, None, _r(g, (2, 1, 1, 8), dt, dev), _r(g, (2, 1, 1, 8), dt, dev), False,
         torch.tensor([20, 35], device=dev).view(2, 1, 1, 1), None, 2, None, None, None, None, 0.0, None, 0.0, False,
         8, False, _r(g, (2, 1, 40), dt, dev, 2.0), 1e-5,
         [_r(g, (96,), torch.float32, dev), _r(g, (48,), torch.float32, dev), _r(g, (48,), torch.float32, dev)],
         True, _r(g, (40,), torch.float32, dev, 5.0) + 3,
         [_r(g, (96,), torch.float32, dev, 4.0), _r(g, (48,), torch.float32, dev, 4.0),
          _r(g, (48,), torch.float32, dev, 4.0)]), {}), tol=_ROPE_TOL),
    KernelCase("ost.decode_attention_", "row-scaled-shift-seq-major", lambda g, dt, dev: (
        (_r(g, (2, 16, 2, 16), dt, dev), _r(g, (2, 16, 2, 16), dt, dev), _r(g, (2, 1, 4, 16), torch.float32, dev),
         _r(g, (2, 1, 2, 16), torch.float32, dev), _r(g, (2, 1, 2, 16), torch.float32, dev),
         torch.tensor([5], device=dev), 1, None, None, None, False, None, None, 2, None, None, None, None, 0.0, None,
         0.0, False, None, False, _r(g, (2, 5000), dt, dev), 1e-5, None, False,
         _r(g, (5000,), torch.float32, dev, 3.0),
         [_r(g, (64,), torch.float32, dev, 3.0), _r(g, (32,), torch.float32, dev, 3.0),
          _r(g, (32,), torch.float32, dev, 3.0)]), {})),
    KernelCase("ost.decode_attention_", "row-scaled-layer-seq-major", lambda g, dt, dev: (
        (_r(g, (2, 16, 2, 16), dt, dev), _r(g, (2, 16, 2, 16), dt, dev), _r(g, (2, 1, 4, 16), torch.float32, dev),
         _r(g, (2, 1, 2, 16), torch.float32, dev), _r(g, (2, 1, 2, 16), torch.float32, dev),
         torch.tensor([5], device=dev), 1, None, None, None, False, None, None, 2, None, None, None, None, 0.0, None,
         0.0, False, None, False, _r(g, (2, 5000), dt, dev) - 3, 1e-5, None, True), {})),
    # partial rotary embeddings (GPT-NeoX, Phi-2): the first 8 dims of each head turned, the rest passed
    KernelCase("ost.decode_attention_", "partial-rotary-gqa", lambda g, dt, dev: (
        (_r(g, (2, 2, 40, 24), dt, dev), _r(g, (2, 2, 40, 24), dt, dev), _r(g, (2, 4, 1, 24), dt, dev),
         _r(g, (2, 2, 1, 24), dt, dev), _r(g, (2, 2, 1, 24), dt, dev), torch.tensor([29], device=dev), 2, None,
         _r(g, (2, 1, 1, 8), dt, dev), _r(g, (2, 1, 1, 8), dt, dev), False,
         torch.tensor([20, 35], device=dev).view(2, 1, 1, 1), None, 2, None, None, None, None, 0.0, None, 0.0, False,
         8), {}), tol=_ROPE_TOL),
    KernelCase("ost.decode_attention_", "partial-rotary-interleaved-seq-major", lambda g, dt, dev: (
        (_r(g, (1, 16, 2, 16), dt, dev), _r(g, (1, 16, 2, 16), dt, dev), _r(g, (1, 1, 2, 16), dt, dev),
         _r(g, (1, 1, 2, 16), dt, dev), _r(g, (1, 1, 2, 16), dt, dev), torch.tensor([9], device=dev), 1, None,
         _r(g, (1, 1, 1, 8), dt, dev), _r(g, (1, 1, 1, 8), dt, dev), True, None, None, 1, None, None, None, None, 0.0,
         None, 0.0, False, 8), {}), tol=_ROPE_TOL),
    # a rope in fp32 cast back (OLMo: fp32 cos over half rows; Cohere: rows already cast up, half cos)
    KernelCase("ost.decode_attention_", "wide-rope-fp32-cos", lambda g, dt, dev: (
        (_r(g, (2, 2, 40, 32), dt, dev), _r(g, (2, 2, 40, 32), dt, dev), _r(g, (2, 4, 1, 32), dt, dev),
         _r(g, (2, 2, 1, 32), dt, dev), _r(g, (2, 2, 1, 32), dt, dev), torch.tensor([29], device=dev), 2, None,
         _r(g, (2, 1, 1, 32), torch.float32, dev), _r(g, (2, 1, 1, 32), torch.float32, dev), False,
         torch.tensor([20, 35], device=dev).view(2, 1, 1, 1), None, 2, None, None, None, None, 0.0, None, 0.0, False,
         None, True), {}), tol=_ROPE_TOL),
    KernelCase("ost.decode_attention_", "wide-rope-fp32-rows", lambda g, dt, dev: (
        (_r(g, (1, 2, 20, 16), dt, dev), _r(g, (1, 2, 20, 16), dt, dev), _r(g, (1, 4, 1, 16), torch.float32, dev),
         _r(g, (1, 2, 1, 16), torch.float32, dev), _r(g, (1, 2, 1, 16), dt, dev), torch.tensor([11], device=dev), 2,
         None, _r(g, (1, 1, 1, 16), dt, dev), _r(g, (1, 1, 1, 16), dt, dev), True, torch.tensor([[11]], device=dev),
         None, 2, None, None, None, None, 0.0, None, 0.0, False, None, True), {}), tol=_ROPE_TOL),
    # both: fp32 rows roped over their first 8 dims in fp32, the rest passed through, all cast to the caches'
    KernelCase("ost.decode_attention_", "wide-partial-rotary", lambda g, dt, dev: (
        (_r(g, (1, 2, 20, 16), dt, dev), _r(g, (1, 2, 20, 16), dt, dev), _r(g, (1, 2, 1, 16), torch.float32, dev),
         _r(g, (1, 2, 1, 16), torch.float32, dev), _r(g, (1, 2, 1, 16), dt, dev), torch.tensor([6], device=dev), 2,
         None, _r(g, (1, 1, 1, 8), torch.float32, dev), _r(g, (1, 1, 1, 8), torch.float32, dev), False, None, None, 1,
         None, None, None, None, 0.0, None, 0.0, False, 8, True), {}), tol=_ROPE_TOL),
    KernelCase("ost.decode_attention_", "two-rows-fallback", lambda g, dt, dev: (
        (_r(g, (1, 2, 8, 16), dt, dev), _r(g, (1, 2, 8, 16), dt, dev), _r(g, (1, 2, 2, 16), dt, dev),
         _r(g, (1, 2, 2, 16), dt, dev), _r(g, (1, 2, 2, 16), dt, dev), torch.tensor([3, 4], device=dev), 2), {})),
    # a mixture of experts' decode step: 3 tokens, 8 experts, top 2 (Mixtral's routing: fp32 softmax,
    # normalized, fp32 weights) and top 3 of 6 (Qwen-MoE's: weights cast back to the logits' dtype); K, I
    # and H off the blocks; logits spread wide so no two of a token's probabilities tie. moe_up returns
    # its result and the chosen ids; moe_down takes ids (_moe_down: the ones moe_up would choose)
    KernelCase("ost.moe_up", "top2-silu", launches=True, make=lambda g, dt, dev: (
        (_r(g, (3, 72), dt, dev), _r(g, (3, 8), dt, dev, 3.0), _r(g, (8, 2 * 40, 72), dt, dev, 0.2), 2,
         torch.float32), {})),
    KernelCase("ost.moe_up", "top3-gelu", launches=True, make=lambda g, dt, dev: (
        (_r(g, (2, 33), dt, dev), _r(g, (2, 6), dt, dev, 3.0), _r(g, (6, 2 * 24, 33), dt, dev, 0.2), 3,
         torch.float32, "gelu"), {})),
    KernelCase("ost.moe_down", "top2-normalized", launches=True, make=lambda g, dt, dev: _moe_down(
        g, dt, dev, 3, 40, 8, 72, 2, torch.float32, True, None)),
    # GraniteMoe's routing: the top k of the fp32 logits, the softmax over them, cast to the input's dtype
    KernelCase("ost.moe_up", "topk-first", launches=True, make=lambda g, dt, dev: (
        (_r(g, (3, 40), dt, dev), _r(g, (3, 8), dt, dev, 3.0), _r(g, (8, 2 * 24, 40), dt, dev, 0.2), 2,
         torch.float32, "silu", True), {})),
    KernelCase("ost.moe_down", "topk-first", launches=True, make=lambda g, dt, dev: _moe_down(
        g, dt, dev, 3, 24, 8, 40, 2, torch.float32, False, dt, topk_first=True)),
    # the routing in the logits' own precision (ROUTE 1 in fp16/bf16), normalized; weights cast up to fp32
    KernelCase("ost.moe_down", "route-in-dtype", launches=True, make=lambda g, dt, dev: _moe_down(
        g, dt, dev, 3, 24, 8, 40, 2, dt, True, torch.float32)),
    KernelCase("ost.moe_up", "route-in-dtype", launches=True, make=lambda g, dt, dev: (
        (_r(g, (3, 40), dt, dev), _r(g, (3, 8), dt, dev, 3.0), _r(g, (8, 2 * 24, 40), dt, dev, 0.2), 2, dt), {})),
    # moe_down weighs the ids it is given, not a choice of its own: ids no top-k would make, tied logits
    KernelCase("ost.moe_down", "given-ids", launches=True, make=lambda g, dt, dev: _moe_down(
        g, dt, dev, 2, 24, 8, 40, 3, torch.float32, True, None, ids=[7, 0, 3, 3, 5, 1], tied=True)),
    KernelCase("ost.moe_down", "top3-cast-weights", launches=True, make=lambda g, dt, dev: _moe_down(
        g, dt, dev, 2, 24, 6, 33, 3, torch.float32, False, dt)),
    # a shared expert added (Qwen2-MoE): its gated activations' down product, scaled by sigmoid(logit) or
    # not; its width (I_s) other than the experts', off the blocks; its gate and up read with row strides
    # (columns of one projection, as a multi-linear gives them)
    KernelCase("ost.moe_down_shared", "sigmoid-gated-silu", launches=True, make=lambda g, dt, dev: _moe_down_shared(
        g, dt, dev, 3, 24, 8, 40, 2, torch.float32, False, dt, 56, "silu", True)),
    KernelCase("ost.moe_down_shared", "ungated-gelu", launches=True, make=lambda g, dt, dev: _moe_down_shared(
        g, dt, dev, 2, 24, 6, 33, 3, torch.float32, True, None, 20, "gelu", False)),
    # fp16/bf16 steps of 2 to MAX_TOKENS tokens take the grouped kernels (a program per expert and column
    # block), the cases above included; one token keeps the per-choice kernels in every dtype. 20 and 40
    # tokens: more than one 16-row block, top 4 of 16 experts (some chosen by many tokens, some by none);
    # only fp16/bf16 (fp32 keeps the per-choice kernels). The grouped up kernel's tl.dot sums K in another
    # order than the reference's product: a gate or up value one ulp apart can become two after the gating
    KernelCase("ost.moe_up", "one-token", launches=True, make=lambda g, dt, dev: (
        (_r(g, (1, 72), dt, dev), _r(g, (1, 8), dt, dev, 3.0), _r(g, (8, 2 * 40, 72), dt, dev, 0.2), 2,
         torch.float32), {})),
    KernelCase("ost.moe_down", "one-token", launches=True, make=lambda g, dt, dev: _moe_down(
        g, dt, dev, 1, 40, 8, 72, 2, torch.float32, True, None)),
    KernelCase("ost.moe_up", "20-tokens-top4", launches=True, dtypes=_HALF, tol={torch.float16: 2.5e-3},
               make=lambda g, dt, dev: ((_r(g, (20, 150), dt, dev), _r(g, (20, 16), dt, dev, 3.0),
                                         _r(g, (16, 2 * 72, 150), dt, dev, 0.2), 4, torch.float32), {})),
    KernelCase("ost.moe_down", "20-tokens-top4", launches=True, dtypes=_HALF, make=lambda g, dt, dev: _moe_down(
        g, dt, dev, 20, 150, 16, 72, 4, torch.float32, True, None)),
    KernelCase("ost.moe_down_shared", "40-tokens-sigmoid-gated", launches=True, dtypes=_HALF,
               make=lambda g, dt, dev: _moe_down_shared(g, dt, dev, 40, 24, 16, 40, 4, dt, True, dt, 56, "silu", True)),
    # the grouped down kernel's other paths: a shared expert wider than its K step across the splits (300 wide,
    # 8 splits: five take a share) with gelu; GraniteMoe's top-k-first routing; and one expert (no split)
    KernelCase("ost.moe_down_shared", "12-tokens-wide-shared-gelu", launches=True, dtypes=_HALF,
               make=lambda g, dt, dev: _moe_down_shared(g, dt, dev, 12, 24, 16, 40, 4, torch.float32, True, dt, 300,
                                                        "gelu", True)),
    KernelCase("ost.moe_down", "10-tokens-topk-first", launches=True, dtypes=_HALF, make=lambda g, dt, dev: _moe_down(
        g, dt, dev, 10, 24, 8, 40, 2, torch.float32, False, dt, topk_first=True)),
    KernelCase("ost.moe_down", "9-tokens-one-expert", launches=True, dtypes=_HALF, make=lambda g, dt, dev: _moe_down(
        g, dt, dev, 9, 24, 1, 40, 1, torch.float32, True, None)),
]


def _moe_down_shared(g, dt, dev, tokens, inter, experts, hidden, k, route_dtype, normalize, weights_dtype,
                     shared_inter, activation, gated):
    """ost.moe_down_shared's arguments: _moe_down's, then the shared expert's gate and up ([tokens,
    shared_inter] slices of one [tokens, 2 * shared_inter + 1] projection), activation, W_s [hidden,
    shared_inter] and its gate's logit (the projection's last column) when ``gated``."""
    args, _ = _moe_down(g, dt, dev, tokens, inter, experts, hidden, k, route_dtype, normalize, weights_dtype)
    proj = _r(g, (tokens, 2 * shared_inter + 1), dt, dev)
    gate, up, logit = proj[:, :shared_inter], proj[:, shared_inter:2 * shared_inter], proj[:, -1:]
    w_s = _r(g, (hidden, shared_inter), dt, dev, 0.2)
    return (*args, gate, up, activation, w_s, logit if gated else None), {}


def _moe_down(g, dt, dev, tokens, inter, experts, hidden, k, route_dtype, normalize, weights_dtype, topk_first=False,
              ids=None, tied=False):
    """ost.moe_down's arguments: h [tokens * k, inter], the chosen ids (moe_route's, or ``ids``), logits
    [tokens, experts] (all equal when ``tied``), W [experts, hidden, inter]; the result in dt."""
    from ostinato.ir.fused_ops import moe_route
    h = _r(g, (tokens * k, inter), dt, dev)
    logits = torch.zeros(tokens, experts, dtype=dt, device=dev) if tied else _r(g, (tokens, experts), dt, dev, 3.0)
    w = _r(g, (experts, hidden, inter), dt, dev, 0.2)
    chosen = torch.tensor(ids, device=dev) if ids is not None else \
        moe_route(logits, k, False, route_dtype, None, topk_first)[1].reshape(-1)
    return (h, chosen, logits, w, k, route_dtype, normalize, weights_dtype, dt, topk_first), {}


def _clone(args):
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


GUARD = 64    # elements each side: 128 bytes or more, so a guarded tensor keeps 16-byte alignment


def _sentinel(dtype: torch.dtype):
    return float("nan") if dtype.is_floating_point else (1 << 40 if dtype == torch.int64 else -(1 << 30))


def guarded(args) -> tuple[tuple, list]:
    """``args`` with each tensor copied into the middle of a buffer whose ``GUARD`` elements on each side
    (and any gap the strides leave) hold a sentinel, same shape, strides and dtype; with the buffers and
    their guard bytes as they were, for ``guards_intact``."""
    out, bands = [], []
    for a in args:
        if not isinstance(a, torch.Tensor) or a.numel() == 0:
            out.append(a)
            continue
        span = 1 + sum((n - 1) * st for n, st in zip(a.shape, a.stride()))
        buf = torch.full((span + 2 * GUARD,), _sentinel(a.dtype), dtype=a.dtype, device=a.device)
        view = buf.as_strided(a.shape, a.stride(), GUARD)
        view.copy_(a)
        raw = buf.view(torch.uint8)
        size = a.element_size()
        bands.append((a.shape, raw, raw[:GUARD * size].clone(), raw[(GUARD + span) * size:].clone(), span * size))
        out.append(view)
    return tuple(out), bands


def guards_intact(bands) -> str | None:
    """None when every guard band is as it was, else which argument's band changed."""
    for k, (shape, raw, before, after, nbytes) in enumerate(bands):
        head, tail = raw[:before.numel()], raw[before.numel() + nbytes:]
        if not torch.equal(head, before) or not torch.equal(tail, after):
            return f"tensor argument {k} (shape {list(shape)}): the kernel wrote outside it"
    return None


def check(case: KernelCase, dtype: torch.dtype, device: str, seed: int = 0) -> tuple[bool, str]:
    """Run the case's launcher and the reference on the same random inputs; (ok, what differed)."""
    from ostinato.backends.cuda.ops import triton_kernels
    from ostinato.ir import get_op
    g = torch.Generator().manual_seed(seed)
    args, kwargs = case.make(g, dtype, device)
    kernel = triton_kernels()[case.op]
    ref_args, (got_args, bands) = _clone(args), guarded(args)
    ref = get_op(case.op).target(*ref_args, **kwargs)
    fell_back = []
    if case.launches:
        from ostinato.ir import fused_ops
        name = case.op.split(".", 1)[1]
        reference = getattr(fused_ops, name)
        setattr(fused_ops, name, lambda *a, **kw: fell_back.append(1) or reference(*a, **kw))
        try:
            got = kernel(*got_args, **kwargs)
        finally:
            setattr(fused_ops, name, reference)
        if fell_back:
            return False, "the launcher ran its reference, not its kernel"
    else:
        got = kernel(*got_args, **kwargs)
    broken = guards_intact(bands)
    if broken:
        return False, broken
    if case.in_place and got is not got_args[0]:
        return False, "in-place op did not return its first argument"
    refs, gots = (ref, got) if isinstance(ref, tuple) else ((ref,), (got,))
    if not isinstance(got, type(ref)) or len(gots) != len(refs):
        return False, f"{len(gots)} results vs the reference's {len(refs)}"
    for k, r in enumerate(refs):     # a result that is an argument (a written cache) must stay one
        for i, a in enumerate(ref_args):
            if r is a and gots[k] is not got_args[i]:
                return False, f"result {k} is argument {i} in the reference but a new tensor in the kernel's"
    details, all_ok = [], True
    for k, (r, o) in enumerate(zip(refs, gots)):
        if o.shape != r.shape or o.dtype != r.dtype:
            return False, f"result {k}: {o.dtype}{list(o.shape)} vs reference {r.dtype}{list(r.shape)}"
        tol = (case.tol or {}).get(dtype, TOL[dtype])
        tol = (case.cpu_tol or {}).get(dtype, tol) if o.device.type == "cpu" else tol
        err = (o.float() - r.float()).abs().max().item() if o.numel() else 0.0
        bound = tol * (1 + r.float().abs().max().item()) if r.numel() else 0.0
        all_ok &= torch.allclose(o.float(), r.float(), rtol=tol, atol=tol, equal_nan=True)
        details.append(f"max |kernel - reference| = {err:.3g} (bound ~{bound:.3g})")
    return all_ok, "; ".join(details)


def _check_reporting(case: KernelCase, dtype: torch.dtype) -> dict:
    try:
        ok, detail = check(case, dtype, "cpu")
    except Exception as e:  # noqa: BLE001 - reported per case, the test names it
        ok, detail = False, f"raised {type(e).__name__}: {str(e)[-300:]}"
    return {"op": case.op, "name": case.name, "ok": ok, "detail": detail}


def cases_for(dtype: torch.dtype) -> list[KernelCase]:
    return [c for c in CASES if c.dtypes is None or dtype in c.dtypes]


def main() -> None:
    dtype = getattr(torch, sys.argv[1])
    print(json.dumps([_check_reporting(c, dtype) for c in cases_for(dtype)]))


if __name__ == "__main__":
    main()
