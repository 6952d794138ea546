"""KV-cache writes and decode attention (one query token over a static cache, grouped KV heads)."""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ....cache.op_cache import op_graph_cache, tensor_key
from ..runtime import KernelLibrary
from .common import block_for


@triton.jit
def kv_update_kernel(cache_ptr, new_ptr, index_ptr, n_slots, n_new, inner, ring, RING: tl.constexpr,
                     BLOCK: tl.constexpr):
    """cache [outer, n_slots, inner] <- new [outer, n_new, inner] at rows index[j] (negative counts from
    the end; with RING, modulo the ring length). One program per (outer, j) and inner block."""
    pid = tl.program_id(0).to(tl.int64)
    o = pid // n_new
    j = pid % n_new
    slot = tl.load(index_ptr + j).to(tl.int64)
    if RING:
        slot = ((slot % ring) + ring) % ring
    slot = tl.where(slot < 0, slot + n_slots, slot)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inner
    v = tl.load(new_ptr + (o * n_new + j) * inner + offs, mask=mask)
    tl.store(cache_ptr + (o * n_slots + slot) * inner + offs, v.to(cache_ptr.dtype.element_ty), mask=mask)


def _kv_write(cache: torch.Tensor, new: torch.Tensor, index: torch.Tensor, dim: int, ring) -> None:
    dim %= cache.dim()
    outer = math.prod(cache.shape[:dim])
    inner = math.prod(cache.shape[dim + 1:])
    n_new = index.numel()
    new = new.expand(*cache.shape[:dim], n_new, *cache.shape[dim + 1:]).contiguous()
    if outer and n_new and inner:
        block = min(block_for(inner), 1024)
        LIBRARY.kernel("kv_update", RING=ring is not None, BLOCK=block)(
            cache, new, index.contiguous(), cache.shape[dim], n_new, inner, int(ring or 1),
            grid=(outer * n_new, triton.cdiv(inner, block)))


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


@triton.jit
def decode_attention_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, out_ptr, head_dim, n_rep, hq, scale,
                            q_sb, q_sh, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss, o_sb, o_sh, pos_sb,
                            n_keys: tl.constexpr, HAS_POS: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_D: tl.constexpr):
    """One (batch, query head): softmax(q k^T * scale, keys j <= pos) v, online over key blocks.
    The cache length is a compile-time constant: a static cache has one."""
    pid = tl.program_id(0).to(tl.int64)
    b = pid // hq
    h = pid % hq
    kvh = h // n_rep
    d = tl.arange(0, BLOCK_D)
    dmask = d < head_dim
    q = tl.load(q_ptr + b * q_sb + h * q_sh + d, mask=dmask, other=0.0).to(tl.float32)
    limit = n_keys - 1
    if HAS_POS:
        limit = tl.load(pos_ptr + b * pos_sb).to(tl.int64)
    m = tl.full((), float("-inf"), tl.float32)
    l = tl.full((), 0.0, tl.float32)
    acc = tl.zeros((BLOCK_D,), tl.float32)
    for start in range(0, n_keys, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        nmask = (n < n_keys) & (n <= limit)
        kt = tl.load(k_ptr + b * k_sb + kvh * k_sh + n[:, None] * k_ss + d[None, :],
                     mask=nmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
        s = tl.sum(kt * q[None, :], axis=1) * scale
        s = tl.where(nmask, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        # A block with no visible key leaves m at -inf: keep the exponentials at 0 then.
        alpha = tl.where(m_new == float("-inf"), 1.0, tl.exp(m - m_new))
        p = tl.where(nmask, tl.exp(s - m_new), 0.0)
        vt = tl.load(v_ptr + b * v_sb + kvh * v_sh + n[:, None] * v_ss + d[None, :],
                     mask=nmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * vt, axis=0)
        l = l * alpha + tl.sum(p, axis=0)
        m = m_new
    out = acc / l
    tl.store(out_ptr + b * o_sb + h * o_sh + d, out.to(out_ptr.dtype.element_ty), mask=dmask)


def _decode_plan(q, k, v, mask, q_pos, is_causal) -> tuple | None:
    """(BLOCK_N, BLOCK_D) when the Triton decode kernel handles this call (one query token, no
    explicit mask, 4-D q/k/v with a dense head dim), else None (torch's SDPA)."""
    decode = (mask is None and not is_causal and q.dim() == 4 and q.shape[-2] == 1 and k.dim() == 4
              and q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1 and q.shape[-1] <= 256
              and (q_pos is None or q_pos.numel() == q.shape[0] or q_pos.numel() == 1))
    return (64, block_for(q.shape[-1])) if decode else None


def sdpa(q, k, v, mask=None, q_pos=None, scale=None, n_rep=1, is_causal=False, *, out=None):
    """ost.sdpa on CUDA: the decode case runs the Triton kernel; every other case runs the reference
    (torch's SDPA). The choice is made once per shapes and layout (the op-level graph cache)."""
    key = ("ost.sdpa", tensor_key(q), tensor_key(k), tensor_key(v), q.stride(), k.stride(), v.stride(),
           mask is None, None if q_pos is None else tensor_key(q_pos), is_causal)
    plan = op_graph_cache.get(key, lambda: _decode_plan(q, k, v, mask, q_pos, is_causal))
    if plan is None:
        from ....ir.fused_ops import sdpa as reference
        res = reference(q, k, v, mask, q_pos, scale, n_rep, is_causal)
        return res if out is None else out.copy_(res)
    block_n, block_d = plan
    B, Hq, _, D = q.shape
    S = k.shape[-2]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    pos = q_pos.reshape(-1) if q_pos is not None else q
    pos_sb = 1 if q_pos is not None and q_pos.numel() == B and B > 1 else 0
    LIBRARY.kernel("decode_attention", n_keys=S, HAS_POS=q_pos is not None, BLOCK_N=block_n, BLOCK_D=block_d)(
        q, k, v, pos, out, D, n_rep, Hq, float(scale if scale is not None else 1.0 / math.sqrt(D)),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), pos_sb, grid=(B * Hq,))
    return out

LIBRARY = KernelLibrary({"kv_update": kv_update_kernel, "decode_attention": decode_attention_kernel})
