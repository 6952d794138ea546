"""ost.moe_up and ost.moe_down on CUDA (see ir/fused_ops.py and passes/patterns/moe.py): one program per
(token's choice, block of output columns) for the up projection, which routes its token from the logits
(E values) and records the choice, and one per (token, block of output columns) for the down projection,
which takes those choices and their scores from the logits again; each reads only the chosen experts'
weight rows, where they lie: no gathered copy of them. Cases the kernels do not take
(a weight whose last dim is not dense, more experts than MAX_EXPERTS, an fp64 tensor) run the reference."""
from __future__ import annotations

import torch

from ....ir import fused_ops
from ....passes.patterns.moe import MAX_TOKENS
from ..runtime import KernelLibrary
from .common import cdiv, pow2
from .split_k import scratch_pair

MAX_EXPERTS = 1024
MAX_TOPK = 64
# Block choices, from bench/moe_kernels.py's sweeps on an H200 (one token; docs/benchmarks/moe_gpu/): aiming
# at 1024 programs, 16384-element steps, column blocks down to 4 wide, 8 warps took Mixtral-8x7B's up
# kernel 120.2 us and its down kernel 66.8 us (3.9 and 3.5 TB/s of the chosen experts' weights), against
# 133.2 and 127.5 us at 512 programs, 4096-element steps, 8-wide blocks and 4 warps; Qwen3-30B-A3B's
# 28.0 and 30.6 us (repeats of one choice there varied by up to 1.7x: small kernels).
# The up kernel reads two weight rows per column (gate and up): once it also recorded its choices, ptxas
# spread its loads through its K loop at the same choice (100 registers instead of 126) and Mixtral's
# up kernel took 231-235 us; at twice the programs and half the step (the same elements in flight per
# program as the down kernel's) it took 121-124 us with 4 or 8 warps (docs/benchmarks/moe_gpu/call8/).
_PROGRAMS = 1024        # aim for at least this many programs (an H100/H200 has 132 SMs)
_UP_PROGRAMS = 2048     # the up kernel's
_TILE = 16384           # elements of W a program reads per step of its K loop (the up kernel: half, per row)
_MIN_BLOCK_N = 4        # the narrowest column block
_WARPS = 8
_LOW = (torch.float16, torch.bfloat16)
_DTYPES = (torch.float32, *_LOW)
# From this many tokens a step, fp16/bf16 experts go through the grouped kernels (source/moe.py: a program per
# expert and column block, every row routed to that expert multiplied at once), which read each chosen expert's
# weights once instead of once per (token, choice), up to the pattern's MAX_TOKENS (one block of rows).
GROUPED_FROM = 2
GROUPED_DOWN_FROM = 8
_LARGE_EXPERT = 8 << 20     # elements of one expert's down weight from which its grouped kernel runs from 2 tokens
_GROUPED_UP_N = 64      # the grouped up kernel's column block (its programs: experts x blocks)
_GROUPED_DOWN_N = 32    # the grouped down kernel's
_GROUPED_UP_K = 128     # elements of K a step of the up kernel's loop
_GROUPED_DOWN_K = 256   # the down kernel's
_GROUPED_WARPS = 4
_GROUPED_KS = 64        # the down kernel's K step over a shared expert ([T, K] activations in registers)
# The grouped down kernel has a program per 32 output columns (64 for a hidden size of 2048): it splits the
# chosen experts among up to 8 programs per column block until about this many run, the last of a block's
# splits to finish adding their fp32 sums (split_k.py's scratch: partials and arrival counters)
_DOWN_PROGRAMS = 1024
_MAX_DOWN_SPLIT = 8
# the grouped down kernel's scratch (split_k.scratch_pair), by (partial slices, their width, column blocks)
_SCRATCH: dict[tuple, dict] = {}


def _down_split(blocks: int, n_experts: int) -> int:
    split = 1
    while split < _MAX_DOWN_SPLIT and blocks * split < _DOWN_PROGRAMS and 2 * split <= n_experts:
        split *= 2
    return split


def _split_buffers(slices: int, cols: int, blocks: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The grouped down kernel's fp32 partials ([slices, cols]) and zeroed counters (blocks)."""
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    return scratch_pair((slices, cols), blocks, _SCRATCH.setdefault((slices, cols, blocks), {}), device, capturing)


def _blocks(columns: int, rows: int, k_dim: int, programs: int, tile: int) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_K): column blocks narrow enough that ``rows`` x the blocks make ``programs`` programs
    (a decode step has one or a few rows: a GEMV needs many programs to stream its weight), _MIN_BLOCK_N to
    64 wide, each step of the K loop reading ``tile`` elements of a weight row block."""
    block_n = 64
    while block_n > _MIN_BLOCK_N and rows * cdiv(columns, block_n) < programs:
        block_n //= 2
    return block_n, max(16, min(pow2(k_dim), tile // block_n))


def _takes(x: torch.Tensor, logits: torch.Tensor, weight: torch.Tensor, top_k: int, route_dtype) -> bool:
    return (x.dim() == 2 and logits.dim() == 2 and weight.dim() == 3 and x.dtype in _DTYPES
            and weight.dtype in _DTYPES and logits.dtype in _DTYPES and route_dtype in _DTYPES
            and 0 < top_k <= min(MAX_TOPK, logits.shape[1]) and logits.shape[1] <= MAX_EXPERTS
            and weight.shape[0] == logits.shape[1] and weight.stride(-1) == 1 and x.shape[0] == logits.shape[0])


def _route(logits: torch.Tensor, route_dtype: torch.dtype, topk_first: bool) -> int | None:
    """The kernels' ROUTE (source/moe.py: 0 softmax in fp32, 1 softmax rounded to the logits' low
    precision, 2 top-k of the logits first); None for a routing they do not compute as the reference
    does (top-k of logits rounded to a precision they are not in)."""
    if route_dtype != torch.float32 and logits.dtype != route_dtype:
        return None     # logits rounded to another precision first: the reference
    return 2 if topk_first else 0 if route_dtype == torch.float32 else 1


def _grouped(tokens: int, h: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the grouped kernels take this step: GROUPED_FROM to MAX_TOKENS tokens, fp16/bf16 rows and
    weights of one dtype (tl.dot's operands)."""
    return GROUPED_FROM <= tokens <= MAX_TOKENS and h.dtype in _LOW and weight.dtype == h.dtype


def moe_up(x, logits, weight, top_k: int, route_dtype, activation: str = "silu", topk_first: bool = False):
    route = _route(logits, route_dtype, topk_first)
    if not (_takes(x, logits, weight, top_k, route_dtype) and activation in ("silu", "gelu") and route is not None
            and weight.shape[1] % 2 == 0 and weight.shape[2] == x.shape[1]):
        return fused_ops.moe_up(x, logits, weight, top_k, route_dtype, activation, topk_first)
    x = x if x.stride(-1) == 1 else x.contiguous()
    logits = logits.contiguous()
    rows, inter, k_dim = x.shape[0] * top_k, weight.shape[1] // 2, weight.shape[2]
    result = torch.empty((rows, inter), dtype=x.dtype, device=x.device)
    ids = torch.empty((rows,), dtype=torch.int64, device=x.device)
    if result.numel() and _grouped(x.shape[0], x, weight):
        LIBRARY.kernel("moe_up_grouped", ROUTE=route, TOPK=top_k, ACT=0 if activation == "silu" else 1,
                       BLOCK_T=max(16, pow2(x.shape[0])), BLOCK_E=pow2(logits.shape[1]), BLOCK_N=_GROUPED_UP_N,
                       BLOCK_K=_GROUPED_UP_K, num_warps=_GROUPED_WARPS)(
            x, logits, weight, result, ids, x.shape[0], logits.shape[1], k_dim, inter, x.stride(0), weight.stride(0),
            weight.stride(1), grid=(logits.shape[1], cdiv(inter, _GROUPED_UP_N)))
    elif result.numel():
        block_n, block_k = _blocks(inter, rows, k_dim, _UP_PROGRAMS, _TILE // 2)
        LIBRARY.kernel("moe_up", ROUTE=route, TOPK=top_k,
                       ACT=0 if activation == "silu" else 1, BLOCK_E=pow2(logits.shape[1]), BLOCK_TOPK=pow2(top_k),
                       BLOCK_N=block_n, BLOCK_K=block_k, num_warps=_WARPS)(
            x, logits, weight, result, ids, logits.shape[1], k_dim, inter, x.stride(0), weight.stride(0),
            weight.stride(1), grid=(rows, cdiv(inter, block_n)))
    elif rows:      # no columns: the choices alone
        ids.copy_(fused_ops.moe_route(logits, top_k, False, route_dtype, None, topk_first)[1].reshape(-1))
    return result, ids


moe_up.multi_output = True


def moe_down(h, ids, logits, weight, top_k: int, route_dtype, normalize: bool, weights_dtype, out_dtype,
             topk_first: bool = False, *, out=None):
    result = _down(h, ids, logits, weight, top_k, route_dtype, normalize, weights_dtype, out_dtype, topk_first)
    if result is None:
        return fused_ops.moe_down(h, ids, logits, weight, top_k, route_dtype, normalize, weights_dtype, out_dtype,
                                  topk_first, out=out)
    return result if out is None else out.copy_(result)


def moe_down_shared(h, ids, logits, weight, top_k: int, route_dtype, normalize: bool, weights_dtype, out_dtype,
                    topk_first, gate, up, activation: str, shared_weight, shared_logit, *, out=None):
    result = _down(h, ids, logits, weight, top_k, route_dtype, normalize, weights_dtype, out_dtype, topk_first,
                   (gate, up, activation, shared_weight, shared_logit))
    if result is None:
        return fused_ops.moe_down_shared(h, ids, logits, weight, top_k, route_dtype, normalize, weights_dtype,
                                         out_dtype, topk_first, gate, up, activation, shared_weight, shared_logit,
                                         out=out)
    return result if out is None else out.copy_(result)


def _shared_fits(shared, tokens: int, n_out: int, out_dtype) -> bool:
    """Whether the down kernel takes this shared expert (gate, up, activation, W_s, logit or None): dense
    rows of out_dtype, W_s [n_out, I_s], the logit [T, 1]."""
    gate, up, activation, w_s, logit = shared
    return (activation in ("silu", "gelu") and gate.dim() == 2 and gate.shape == up.shape and gate.shape[0] == tokens
            and gate.dtype == up.dtype == w_s.dtype == out_dtype and gate.stride(-1) == 1 and up.stride(-1) == 1
            and w_s.dim() == 2 and w_s.stride(-1) == 1 and tuple(w_s.shape) == (n_out, gate.shape[1])
            and (logit is None or (tuple(logit.shape) == (tokens, 1) and logit.dtype == out_dtype)))


def _down(h, ids, logits, weight, top_k: int, route_dtype, normalize: bool, weights_dtype, out_dtype, topk_first,
          shared=None):
    """moe_down's kernel (and a shared expert's part, ``shared``: (gate, up, activation, W_s, logit or
    None)), or None where it does not take the case."""
    tokens = logits.shape[0] if logits.dim() == 2 else -1
    route = _route(logits, route_dtype, topk_first)
    # the routing weights end in weights_dtype (or the routing's), the product in its promotion with h's
    weights = weights_dtype or route_dtype
    product = torch.promote_types(h.dtype, weights)
    fits = (h.dim() == 2 and h.shape[0] == tokens * top_k and out_dtype in _DTYPES
            and (product == torch.float32 or product == h.dtype) and route is not None
            and (weights == torch.float32 or weights == h.dtype)
            and (route_dtype == torch.float32 or route_dtype == h.dtype)
            and ids.dtype == torch.int64 and ids.shape == (h.shape[0],)
            and _takes(h[::top_k], logits, weight, top_k, route_dtype) and weight.shape[2] == h.shape[1]
            and (shared is None or _shared_fits(shared, tokens, weight.shape[1], out_dtype)))
    if not fits:
        return None
    h, ids, logits = h.contiguous(), ids.contiguous(), logits.contiguous()
    n_out, k_dim = weight.shape[1], weight.shape[2]
    result = torch.empty((tokens, n_out), dtype=out_dtype, device=h.device)
    if result.numel():
        gate, up, activation, w_s, logit = shared or (h, h, "silu", weight, None)
        k_shared = gate.shape[1] if shared else 0
        # the grouped down kernel from GROUPED_DOWN_FROM tokens, or sooner for large experts: below it, small
        # experts' per-choice kernel was faster (docs/benchmarks/moe_gpu/: Qwen3-30B-A3B at 4 tokens 65 us
        # against 101, Mixtral-8x7B's 381 against 218)
        grouped = (_grouped(tokens, h, weight) and (tokens >= GROUPED_DOWN_FROM or n_out * k_dim >= _LARGE_EXPERT)
                   and (shared is None or out_dtype == h.dtype))    # (a shared expert's tl.dot is in out_dtype)
        block_n, block_k = (_GROUPED_DOWN_N, _GROUPED_DOWN_K if tokens <= 32 else _GROUPED_DOWN_K // 2) if grouped else \
            _blocks(n_out, tokens, max(k_dim, k_shared), _PROGRAMS, _TILE)
        rows, split = {}, ()
        if grouped:
            blocks = cdiv(n_out, block_n)
            nsplit = _down_split(blocks, logits.shape[1])
            rows = {"BLOCK_T": max(16, pow2(tokens)), "NSPLIT": nsplit, "BLOCK_KS": _GROUPED_KS}
            split = _split_buffers(nsplit * (2 if shared else 1), tokens * n_out, blocks, h.device) if nsplit > 1 \
                else (torch.empty(0, dtype=torch.float32, device=h.device),
                      torch.empty(0, dtype=torch.int32, device=h.device))
        LIBRARY.kernel("moe_down_grouped" if grouped else "moe_down", ROUTE=route, TOPK=top_k,
                       NORMALIZE=bool(normalize) or route == 2,   # (2: the chosen logits' softmax)
                       # the weights are rounded to h's dtype where they passed through a low precision
                       WEIGHT_ROUND=weights != torch.float32 or route_dtype != torch.float32,
                       PRODUCT_ROUND=product != torch.float32,
                       SHARED=0 if shared is None else 1 if logit is None else 2,
                       SHARED_ACT=0 if activation == "silu" else 1,
                       BLOCK_E=pow2(logits.shape[1]), BLOCK_TOPK=pow2(top_k), BLOCK_N=block_n, BLOCK_K=block_k,
                       num_warps=_GROUPED_WARPS if grouped else _WARPS, **rows)(
            h, ids, logits, weight, result, *((tokens,) if grouped else ()), logits.shape[1], k_dim, n_out,
            weight.stride(0), weight.stride(1), gate, up, w_s, logits if logit is None else logit, k_shared,
            gate.stride(0), up.stride(0), w_s.stride(0), 0 if logit is None else logit.stride(0), *split,
            grid=(blocks, nsplit) if grouped else (tokens, cdiv(n_out, block_n)))
    return result


LIBRARY = KernelLibrary("moe", {"moe_up": "moe_up_kernel", "moe_down": "moe_down_kernel",
                                "moe_up_grouped": "moe_up_grouped_kernel", "moe_down_grouped": "moe_down_grouped_kernel"})
