"""KV-cache writes and attention over a static cache (a decode step's one query token, a short prompt's
few; grouped KV heads)."""
from __future__ import annotations

import contextlib
import math
import os
import threading

import torch

from ....cache.op_cache import op_graph_cache, op_key
from ....ir.fused_ops import sequence_major
from ..runtime import KernelLibrary
from .common import SHORT_QUERIES, block_for, cdiv, pow2


def _row_strides(new: torch.Tensor, dim: int) -> tuple[int, int, int, int] | None:
    """(the second outer dim's size, the two outer dims' strides, a row's stride) of ``new`` written on
    ``dim``, when the dims after ``dim`` are dense (as one run of ``inner`` elements) and at most two
    dims come before it; else None (the caller copies it dense first)."""
    expected = 1
    for size, stride in zip(reversed(new.shape[dim + 1:]), reversed(new.stride()[dim + 1:])):
        if size != 1 and stride != expected:
            return None
        expected *= size
    outer, st = new.shape[:dim], new.stride()[:dim]
    if len(outer) > 2:
        return None
    outer, st = (1,) * (2 - len(outer)) + tuple(outer), (0,) * (2 - len(st)) + tuple(st)
    return outer[1], st[0], st[1], new.stride(dim)


def _kv_write(cache: torch.Tensor, new: torch.Tensor, index: torch.Tensor, dim: int, ring) -> None:
    dim %= cache.dim()
    outer = math.prod(cache.shape[:dim])
    inner = math.prod(cache.shape[dim + 1:])
    n_new = index.numel()
    new = new.expand(*cache.shape[:dim], n_new, *cache.shape[dim + 1:])
    strides = _row_strides(new, dim)
    if strides is None:
        new = new.contiguous()
        strides = _row_strides(new, dim) or (1, n_new * inner, 0, inner)    # (more than two outer dims)
    if outer and n_new and inner:
        block = min(block_for(inner), 1024)
        LIBRARY.kernel("kv_update", RING=ring is not None, BLOCK=block)(
            cache, new, index.contiguous(), cache.shape[dim], n_new, inner, int(ring or 1), *strides,
            grid=(outer * n_new, cdiv(inner, block)))


def kv_update_(cache, new, index, dim, ring=None):
    """ost.kv_update_ on CUDA: writes the (contiguous) cache in place and returns it."""
    if not cache.is_contiguous():
        from ....ir.fused_ops import kv_update_ as reference
        return reference(cache, new, index, dim, ring)
    _kv_write(cache, new, index, dim, ring)
    return cache


def kv_update(cache, new, index, dim, ring=None):
    """ost.kv_update on CUDA: a copy of the cache with the rows written."""
    out = cache.contiguous().clone()
    _kv_write(out, new, index, dim, ring)
    return out


def _position_strides(q_pos, batch: int, rows: int) -> tuple[int, int] | None:
    """(batch, row) strides through which the attention kernels read each query's position from ``q_pos``:
    one position, or one per batch row and/or query row (shape [B, 1, T, 1] once padded to rank 4,
    either of B and T possibly 1); None when it varies otherwise (per head: the reference then)."""
    if q_pos is None or q_pos.numel() == 1:
        return 0, 0
    if q_pos.dim() > 4:
        return None
    p = q_pos.reshape((1,) * (4 - q_pos.dim()) + tuple(q_pos.shape))
    if p.shape[1] != 1 or p.shape[3] != 1 or p.shape[0] not in (1, batch) or p.shape[2] not in (1, rows):
        return None
    e = p.expand(batch, 1, rows, 1)
    return e.stride(0), e.stride(2)


def _mask_plan(mask, q, n_keys: int) -> tuple | None:
    """The attention kernels' (MASK, batch, head, query row and key strides) for an explicit mask over the
    [B, Hq, T, S] scores: MASK 0 none, 1 added (a float mask), 2 hiding where False (a boolean one); None
    when it does not broadcast so (the reference then)."""
    if mask is None:
        return 0, 0, 0, 0, 0
    if mask.dim() > 4 or not (mask.dtype == torch.bool or mask.dtype.is_floating_point):
        return None
    try:
        e = mask.expand(q.shape[0], q.shape[1], q.shape[2], n_keys)
    except RuntimeError:
        return None
    return 2 if mask.dtype == torch.bool else 1, e.stride(0), e.stride(1), e.stride(2), e.stride(3)


def _rows_plan(q, k, v, mask, q_pos, n_rep: int) -> tuple | None:
    """(BLOCK_N, BLOCK_D, the positions' strides, the mask's plan) when the Triton kernel handles this call
    (4-D q/k/v of one batch, one head dim of at most 256, dense, in all three (not MLA's narrower v), k and
    v of Hq / n_rep heads, 1 to SHORT_QUERIES query rows: a decode step, a short prompt; positions and a
    mask as _position_strides and _mask_plan take them), else None (torch's
    SDPA: past a short prompt, its tensor-core kernels; their set-up, cuDNN's graph built per shape on
    each thread, is tens of milliseconds of a first call that the short prompts do without)."""
    if not (q.dim() == 4 and k.dim() == 4 and v.dim() == 4 and 1 <= q.shape[-2] <= SHORT_QUERIES
            and q.shape[-1] == k.shape[-1] == v.shape[-1] <= 256 and k.shape[-2] == v.shape[-2]
            and q.shape[0] == k.shape[0] == v.shape[0] and k.shape[1] == v.shape[1]
            and k.shape[1] * n_rep == q.shape[1]
            and q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1):
        return None
    positions = _position_strides(q_pos, q.shape[0], q.shape[-2])
    masking = _mask_plan(mask, q, k.shape[-2]) if positions is not None else None
    return None if masking is None else (64, block_for(q.shape[-1]), positions, masking)


def _dense_last(mask):
    """``mask`` with a unit stride on its last dim, as torch's fused attention kernels (cuDNN, flash,
    memory-efficient) require; given anything else torch runs the math path (fp32 matmuls and a
    softmax kernel: T5's position bias, permuted, took it in eager too). Dims broadcast with stride 0
    stay broadcast: only the distinct values are copied."""
    if mask is None or mask.dim() == 0 or mask.stride(-1) == 1 or mask.shape[-1] == 1:
        return mask
    last = mask.dim() - 1
    base = mask[tuple(slice(0, 1) if d != last and mask.stride(d) == 0 else slice(None) for d in range(mask.dim()))]
    return base.contiguous().expand(mask.shape)


def cudnn_attention_enabled() -> bool:
    """OSTINATO_CUDNN_ATTENTION=0 keeps torch's SDPA off cuDNN's attention for every size and form (the
    A/B switch of SMALL_WITHOUT_CUDNN; a masked or grouped-query attention may then run torch's math
    kernel, slow and memory-hungry at long sequences)."""
    return os.environ.get("OSTINATO_CUDNN_ATTENTION", "1") != "0"


# Attention of at most this many (batch x query head x query x key) scores runs torch's SDPA without
# cuDNN's where flash attention takes it (no mask, no grouped KV heads, fp16/bf16, a head dim flash
# supports): cuDNN's first call sets the library up (0.06-0.1 s of a warm DiT's or ViT's first output on an
# H200, docs/benchmarks/warm_start_gpu_1127c/), and at these sizes flash attention took as long (replay:
# DiT-B/2 at 32x32, 1.6M scores, 0.599 / 0.602 ms; ViT-B/16 at batch 1, 0.47M, 0.534 / 0.536). Larger ones
# keep cuDNN's, which was faster there: ViT-B/16 at batch 32 (15M) 2.805 / 2.897 ms, Whisper-base's
# encoder (18M) 0.477 / 0.600, a 2048-token causal prefill of hidden 4096 13.9 / 41.2. A masked or
# grouped-query attention keeps torch's choice at every size: flash takes neither, and without cuDNN such
# a call may fall to the math kernel.
SMALL_WITHOUT_CUDNN = 1 << 22
# torch's backend flags are process-wide: entering and leaving the context from two threads at once
# must not leave cuDNN's attention off for good
_BACKENDS_LOCK = threading.Lock()


def _without_cudnn(q: torch.Tensor, k: torch.Tensor, mask, q_pos, n_rep: int, softcap) -> bool:
    """Whether this ost.sdpa call runs torch's SDPA without cuDNN's attention (SMALL_WITHOUT_CUDNN)."""
    if softcap is not None:
        return False        # the eager form: no SDPA call
    if not cudnn_attention_enabled():
        return True
    d = q.shape[-1]
    return (mask is None and q_pos is None and n_rep == 1 and q.dtype in (torch.float16, torch.bfloat16)
            and 0 < d <= 256 and d % 8 == 0 and q.numel() // d * k.shape[-2] <= SMALL_WITHOUT_CUDNN)


@contextlib.contextmanager
def _torch_attention_backends(q: torch.Tensor, k: torch.Tensor, mask, q_pos, n_rep: int, softcap):
    """The context torch's SDPA runs in for ost.sdpa's reference path: the backends the process has on
    but cuDNN's where _without_cudnn says so, else as it is."""
    if not _without_cudnn(q, k, mask, q_pos, n_rep, softcap):
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with _BACKENDS_LOCK:
        cuda = torch.backends.cuda
        allowed = [b for b, on in ((SDPBackend.FLASH_ATTENTION, cuda.flash_sdp_enabled()),
                                   (SDPBackend.EFFICIENT_ATTENTION, cuda.mem_efficient_sdp_enabled()),
                                   (SDPBackend.MATH, cuda.math_sdp_enabled())) if on]
        if not allowed:      # the process turned them all off: torch's own choice stands
            yield
            return
        with sdpa_kernel(allowed):
            yield


def sdpa(q, k, v, mask=None, q_pos=None, scale=None, n_rep=1, is_causal=False, softcap=None, *, out=None):
    """ost.sdpa on CUDA: a decode step or a short prompt (_rows_plan) runs the Triton kernel; every other
    case runs the reference (torch's SDPA, or the eager form with a soft cap). The choice is made once per
    shapes and layout (the op-level graph cache)."""
    key = op_key("ost.sdpa", q, k, v, *(() if q_pos is None else (q_pos,)), *(() if mask is None else (mask,)),
                 masked=mask is not None, is_causal=is_causal, n_rep=n_rep)
    plan = op_graph_cache.get(key, lambda: _rows_plan(q, k, v, mask, q_pos, n_rep))
    if plan is None:
        from ....ir.fused_ops import sdpa as reference
        with _torch_attention_backends(q, k, mask, q_pos, n_rep, softcap):
            res = reference(q, k, v, _dense_last(mask), q_pos, scale, n_rep, is_causal, softcap)
        return res if out is None else out.copy_(res)
    block_n, block_d, (pos_sb, pos_st), (mask_kind, *mask_strides) = plan
    B, Hq, T, D = q.shape
    S = k.shape[-2]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    LIBRARY.kernel("decode_attention", n_keys=S, HAS_POS=q_pos is not None, CAUSAL=bool(is_causal),
                   MASK=mask_kind, SOFTCAP=softcap is not None, BLOCK_N=block_n, BLOCK_D=block_d)(
        q, k, v, q if q_pos is None else q_pos, q if mask is None else mask, out, D, n_rep, Hq, T,
        float(scale if scale is not None else 1.0 / math.sqrt(D)), float(softcap or 1.0),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1),
        v.stride(2), out.stride(0), out.stride(1), out.stride(2), pos_sb, pos_st, *mask_strides, grid=(B * Hq * T,))
    return out


def _head_major(k_cache, v_cache, q, k, v, cos, sin, dim, normed: bool = False) -> tuple:
    """The decode attention's tensors as [B, H, S, D] views: sequence-major caches ([B, S, H, D] written on
    dim 1, ir/fused_ops.decode_attention_) and their q, k, v, cos and sin transposed; with the heads'
    norms, [B, 1, H * D] rows (normed whole) viewed as [B, 1, H, D]; [B, 1, H, D] rows over head-major
    caches transposed (one token: a view); else as they are."""
    if normed:
        q, k = (t.unflatten(-1, (-1, k_cache.shape[-1])) if t.dim() == 3 else t for t in (q, k))
    if not sequence_major(dim, k_cache):
        q, k, v = (t.transpose(1, 2) if t.shape[1] == 1 else t for t in (q, k, v))
        return k_cache, v_cache, q, k, v, cos, sin
    swap = [t if t is None else t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)).transpose(1, 2) if t.dim() <= 4
            else t for t in (cos, sin)]
    return (k_cache.transpose(1, 2), v_cache.transpose(1, 2), q.transpose(1, 2), k.transpose(1, 2),
            v.transpose(1, 2), *swap)


def _norm_plan(q, k, q_norm, k_norm, norm_dtype, norm_first, dtype=None) -> int | None:
    """The kernel's NORM for the heads' norms: 0 without them; 1 (the weight after the cast back, Qwen 3's)
    or 2 (weight first, Gemma 3's and OLMo 2's) with weights of q's dtype as wide as the rows normed (each
    head's, or [B, 1, H * D] rows normed whole), computed in fp32; None (the reference) else. ``dtype``: the
    rows' dtype as normed (q's, unless q and k are fp32 products scaled to the caches' dtype first)."""
    if q_norm is None:
        return 0
    dtype = dtype or q.dtype
    if q.dim() != k.dim() or not all(w.shape == (x.shape[-1],) and w.is_contiguous() and w.dtype == dtype
                                     for w, x in ((q_norm, q), (k_norm, k))) \
            or (norm_dtype or dtype) != torch.float32:
        return None
    return 2 if norm_first else 1


def _fused_decode_plan(k_cache, v_cache, q, k, v, index, dim, cos, sin, q_pos, n_rep, mask,
                       normed: bool = False, rotary: int | None = None, wide: bool = False,
                       row_x=None) -> tuple | None:
    """(BLOCK_N, BLOCK_D, the mask's plan) when the fused decode kernel handles this call: one query token and one
    new row, contiguous caches ([B, Hkv, S, D] written on dim 2, or [B, S, Hkv, D] on dim 1), rows with a
    dense head dim, cos and sin broadcasting over q and k, a mask broadcasting over [B, Hq, 1, S] if any;
    else None (the reference). With ``row_x`` (q, k and v fp32 products to scale by its rows' norm
    statistic): its rows along dim 0, one per batch row, their last dim dense, and no whole-row norms."""
    if q.dim() not in ((3, 4) if normed else (4,)) or k.dim() != q.dim() or v.dim() != 4 or k_cache.dim() != 4 \
            or dim % 4 not in (1, 2) or index.numel() != 1 or v_cache.shape != k_cache.shape \
            or q.dim() == 3 and (q.shape[-1] % k_cache.shape[-1] or k.shape[-1] % k_cache.shape[-1]):
        return None     # (3-D: [B, 1, H * D] rows normed whole)
    dense = k_cache.is_contiguous() and v_cache.is_contiguous()
    if row_x is not None and (row_x.shape[0] != k_cache.shape[0] or row_x.stride(-1) != 1 or q.dim() == 3
                              or any(n != 1 for n in row_x.shape[1:-1])
                              or not q.dtype == k.dtype == v.dtype == torch.float32):
        return None
    k_cache, v_cache, q, k, v, cos, sin = _head_major(k_cache, v_cache, q, k, v, cos, sin, dim, normed)
    B, Hkv, S, D = k_cache.shape
    positions = _position_strides(q_pos, B, 1)
    if not (positions is not None and dense
            and q.shape == (B, Hkv * n_rep, 1, D) and k.shape == (B, Hkv, 1, D) and v.shape == k.shape
            and q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1 and D <= 256
            and k_cache.dtype == v_cache.dtype and (row_x is not None or v.dtype == k_cache.dtype)
            and (row_x is not None or {q.dtype, k.dtype} <= ({k_cache.dtype, torch.float32} if wide and cos is not None
                                                            else {k_cache.dtype}))):
        return None     # (a wide rope's rows may come in fp32, already cast up)
    if cos is not None:
        width = rotary or D     # the rotated dims: the whole head, or its first ``rotary``
        if width % 2 or width > D or any(t.dim() > 4 or t.shape[-1] != width for t in (cos, sin)):
            return None     # the kernel reads a row of cos and sin per head, as wide as the rotated dims
        try:
            for t in (cos, sin):
                t.expand(*q.shape[:-1], width), t.expand(*k.shape[:-1], width)
        except RuntimeError:
            return None
    masking = _mask_plan(mask, q, S)
    return None if masking is None else (64, block_for(D), positions[0], masking)


def _biases_fit(biases, rows) -> bool:
    """Whether q's, k's and v's biases are all given, one element per element of each's row, [B, 1, H, D] or
    [B, H, 1, D] (the kernel reads head h's at h * D), as ost.row_scale adds them."""
    return len(biases) == 3 and all(
        isinstance(b, torch.Tensor) and b.dim() == 1 and t.dim() == 4 and 1 in t.shape[1:3]
        and b.numel() == t[0].numel() for b, t in zip(biases, rows))


def _rope_strides(t, shape) -> tuple[int, int]:
    """(batch, head) strides of ``t`` broadcast over ``shape`` ([B, H, 1, D]; its rotated dims, t's last);
    0 on broadcast dims."""
    e = t.expand(*shape[:-1], t.shape[-1])
    return e.stride(0), e.stride(1)


def decode_attention_(k_cache, v_cache, q, k, v, index, dim, ring=None, cos=None, sin=None, interleaved=False,
                      q_pos=None, scale=None, n_rep=1, mask=None, softcap=None, q_norm=None, k_norm=None,
                      norm_eps=0.0, norm_dtype=None, norm_offset=0.0, norm_first=False, rotary=None, wide=False,
                      row_x=None, row_eps=0.0, row_bias=None, row_center=False, row_shift=None, row_pre=None):
    """ost.decode_attention_ on CUDA: the heads' norms, rope, the cache writes and the attention in one
    kernel (source/attention.py) where its plan allows, else the reference."""
    normed = q_norm is not None
    scaled = row_x is not None
    biased = scaled and row_bias is not None
    shifted = scaled and row_shift is not None and row_pre is not None
    key = op_key("ost.decode_attention_", k_cache, v_cache, q, k, v, index,
                 *(() if cos is None else (cos, sin)), *(() if q_pos is None else (q_pos,)),
                 *(() if mask is None else (mask,)), *((q_norm, k_norm) if normed else ()),
                 *((row_x,) if scaled else ()), *(b for b in row_bias or () if b is not None),
                 *((row_shift, *row_pre) if shifted else ()), dim=dim,
                 n_rep=n_rep, scaled=scaled, biased=biased, centered=bool(row_center),
                 has_shift=row_shift is not None, has_pre=row_pre is not None,
                 masked=mask is not None, normed=normed, norm_dtype=str(norm_dtype), norm_first=bool(norm_first),
                 rotary=rotary, wide=bool(wide))

    def plan_of():     # (row-scaled q and k come as fp32 products: the heads' norms are in the caches' dtype)
        norm = _norm_plan(q, k, q_norm, k_norm, norm_dtype, norm_first, k_cache.dtype if scaled else q.dtype)
        plan = None if norm is None else _fused_decode_plan(k_cache, v_cache, q, k, v, index, dim, cos, sin, q_pos,
                                                            n_rep, mask, normed, rotary, wide, row_x)
        if plan is not None and biased and not _biases_fit(row_bias, (q, k, v)):
            plan = None     # (the kernel adds all three, one element per element of each row, or none)
        if plan is not None and shifted and (row_shift.dim() != 1 or row_shift.shape[0] != row_x.shape[-1]
                                             or not _biases_fit(row_pre, (q, k, v))):
            plan = None
        if plan is not None and scaled and (row_shift is None) != (row_pre is None):
            plan = None
        return None if plan is None else (*plan, norm)
    plan = op_graph_cache.get(key, plan_of)
    if plan is None:
        from ....ir.fused_ops import decode_attention_ as reference
        return reference(k_cache, v_cache, q, k, v, index, dim, ring, cos, sin, interleaved, q_pos, scale, n_rep,
                         mask, softcap, q_norm, k_norm, norm_eps, norm_dtype, norm_offset, norm_first, rotary, wide,
                         row_x, row_eps, row_bias, row_center, row_shift, row_pre)
    block_n, block_d, pos_sb, (mask_kind, m_sb, m_sh, _, m_sn), norm = plan
    caches, whole = (k_cache, v_cache), normed and q.dim() == 3     # (whole: norms over every head at once)
    k_cache, v_cache, q, k, v, cos, sin = _head_major(k_cache, v_cache, q, k, v, cos, sin, dim, normed)
    B, Hkv, S, D = k_cache.shape
    Hq = q.shape[1]
    out = torch.empty(q.shape, dtype=k_cache.dtype, device=q.device)     # (a wide rope's q may be fp32)
    rope = cos is not None
    if rope:
        cos, sin = cos.contiguous(), sin.contiguous()   # the head dim dense; broadcast dims stride 0
        strides = (*_rope_strides(cos, q.shape), *_rope_strides(sin, q.shape),
                   *_rope_strides(cos, k.shape), *_rope_strides(sin, k.shape))
    else:
        cos = sin = q
        strides = (0,) * 8
    LIBRARY.kernel("decode_attention_kv", n_keys=S, HAS_POS=q_pos is not None, MASK=mask_kind,
                   SOFTCAP=softcap is not None, ROPE=rope, INTERLEAVED=bool(interleaved), RING=ring is not None,
                   NORM=norm, WHOLE=whole, WIDE=bool(wide) and rope, RBIAS=biased, RSHIFT=shifted, BLOCK_N=block_n,
                   ROWSCALE=(2 if row_center else 1) if scaled else 0,
                   BLOCK_D=block_d, BLOCK_R=min(pow2(row_x.shape[-1]), 4096) if scaled else 16)(
        q, k, v, k_cache, v_cache, index, index if q_pos is None else q_pos, cos, sin, q if mask is None else mask,
        q_norm if normed else q, k_norm if normed else q, row_x if scaled else q,
        row_shift.contiguous() if shifted else q,
        *([t.contiguous() for t in row_bias] if biased else (q, q, q)),
        *([t.float().contiguous() for t in row_pre] if shifted else (q, q, q)), out, D, n_rep, Hq,
        float(scale if scale is not None else 1.0 / math.sqrt(D)), float(softcap or 1.0), int(ring or 1),
        float(norm_eps), float(norm_offset), int(rotary or D), row_x.stride(0) if scaled else 0,
        row_x.shape[-1] if scaled else 1, float(row_eps),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), *strides,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), out.stride(0), out.stride(1), pos_sb, m_sb, m_sh,
        m_sn, grid=(B * Hq,))
    return (out, *caches)


decode_attention_.multi_output = True

LIBRARY = KernelLibrary("attention", {"kv_update": "kv_update_kernel", "decode_attention": "decode_attention_kernel",
                                      "decode_attention_kv": "decode_attention_kv_kernel"})
