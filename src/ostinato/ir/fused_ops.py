"""Fused ops (``ost.*``): one op where exported graphs have a chain, each with a reference
implementation in plain torch. The CPU backend runs the reference; it is the oracle for other
backends' kernels. A reference reproduces the chain it replaces operation by operation, so fusing
does not change results on the CPU."""
from __future__ import annotations

import math

import torch

from .ops import OpDef, register_op


def _into(out: torch.Tensor | None, h: torch.Tensor) -> torch.Tensor:
    """``h``, or ``h`` copied into ``out`` when one is given (the last step of an out= form)."""
    return h if out is None else out.copy_(h)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float,
             compute_dtype: torch.dtype | None = None, weight_offset: float = 0.0, weight_first: bool = False,
             *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x * rsqrt(mean(x**2, -1) + eps)``, computed in ``compute_dtype`` (HF's upcast) when given,
    then cast back to x's dtype, then times ``weight + weight_offset`` when a weight is given. ``out``
    receives the result (as every fused op's ``out=``: a replay writes into its static buffer instead
    of allocating).

    ``weight_first`` is Gemma's form: the weight, cast to the compute dtype, plus ``weight_offset``
    (Gemma's ``1 + weight``), multiplies in the compute dtype, and the product is cast back to x's
    dtype last. Otherwise ``weight + weight_offset`` is computed in the weight's dtype, as the
    model's own ``add`` would."""
    h = x if compute_dtype is None else x.to(compute_dtype)
    # In place on the fresh [..., 1] statistics: the same arithmetic as rsqrt(mean + eps), two fewer
    # allocations (this runs 2 * layers times a decode step).
    scale = h.pow(2).mean(-1, keepdim=True).add_(eps).rsqrt_()
    if weight is not None and weight_offset:
        weight = (weight.to(h.dtype) if weight_first else weight) + weight_offset
    if weight_first:
        h = h * scale if weight is None else h * scale * weight.to(h.dtype)
        return _into(out, h.to(x.dtype))
    if compute_dtype is not None:
        h = (h * scale).to(x.dtype)
        return _into(out, h) if weight is None else torch.mul(h, weight, out=out)
    if weight is None:
        return torch.mul(h, scale, out=out)
    return torch.mul(h * scale, weight, out=out)


register_op(OpDef("ost.rms_norm", rms_norm, category="fused"))


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float,
                 compute_dtype: torch.dtype | None = None, weight_offset: float = 0.0, weight_first: bool = False,
                 *, out_sum: torch.Tensor | None = None,
                 out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, rms_norm(s, weight, eps, ...))`` with ``s = x + residual``: a residual add and the norm
    that reads it (the next block's pre-norm), one pass over the row instead of two. Both results are
    returned: the sum is the residual stream the block adds to again."""
    s = torch.add(x, residual, out=out_sum)
    return s, rms_norm(s, weight, eps, compute_dtype, weight_offset, weight_first, out=out)


add_rms_norm.multi_output = True   # backends unpack its (sum, norm)
register_op(OpDef("ost.add_rms_norm", add_rms_norm, category="fused"))


def swiglu(gate: torch.Tensor, up: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(gate) * up``: the gated MLP of Llama-family models."""
    return torch.mul(torch.nn.functional.silu(gate), up, out=out)


def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "none", *,
          out: torch.Tensor | None = None) -> torch.Tensor:
    """``gelu(gate) * up``: the gated MLP of Gemma-family models."""
    return torch.mul(torch.nn.functional.gelu(gate, approximate=approximate), up, out=out)


register_op(OpDef("ost.swiglu", swiglu, category="fused"))
register_op(OpDef("ost.geglu", geglu, category="fused"))


def _halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.chunk(2, dim=-1)


def swiglu_packed(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(gate) * up`` where ``x = cat(gate, up, -1)``: one projection whose output is split."""
    gate, up = _halves(x)
    return swiglu(gate, up, out=out)


def geglu_packed(x: torch.Tensor, approximate: str = "none", *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``gelu(gate) * up`` where ``x = cat(gate, up, -1)``."""
    gate, up = _halves(x)
    return geglu(gate, up, approximate, out=out)


register_op(OpDef("ost.swiglu_packed", swiglu_packed, category="fused"))
register_op(OpDef("ost.geglu_packed", geglu_packed, category="fused"))


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float,
               compute_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Layer norm over the last dim, in ``compute_dtype`` (HF's upcast) when given, then cast back
    to x's dtype; ``weight`` and ``bias`` are applied in the compute dtype, before the cast back."""
    h = x if compute_dtype is None else x.to(compute_dtype)
    w = weight if weight is None or compute_dtype is None else weight.to(compute_dtype)
    b = bias if bias is None or compute_dtype is None else bias.to(compute_dtype)
    h = torch.nn.functional.layer_norm(h, (h.shape[-1],), w, b, eps)
    return h if compute_dtype is None else h.to(x.dtype)


register_op(OpDef("ost.layer_norm", layer_norm, category="fused"))


def gelu_new(h: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The tanh GELU as GPT-2's gelu_new writes it, ``0.5 * h * (1 + tanh(sqrt(2 / pi) * (h + 0.044715 * h**3)))``,
    op by op, so each step rounds to h's dtype as eager's do (the one-kernel tanh GELU rounds once: 1 bf16
    ulp apart). Products and sums in either operand order round alike, so every form the pattern takes
    (passes/patterns/linear.py) computes this."""
    inner = torch.pow(h, 3.0) * 0.044715 + h
    return _into(out, (h * 0.5) * (torch.tanh(inner * math.sqrt(2.0 / math.pi)) + 1.0))


# Each takes ``out=None`` (a new tensor) or a tensor to write.
ACTIVATIONS = {
    "relu": lambda h, out=None: torch.clamp_min(h, 0, out=out),
    "silu": lambda h, out=None: torch._C._nn.silu(h, out=out) if out is not None else torch.nn.functional.silu(h),
    "gelu": lambda h, out=None: torch._C._nn.gelu(h, out=out) if out is not None else torch.nn.functional.gelu(h),
    "gelu_tanh": lambda h, out=None: torch._C._nn.gelu(h, approximate="tanh", out=out) if out is not None
    else torch.nn.functional.gelu(h, approximate="tanh"),
    "gelu_new": gelu_new,
}


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           activation: str | None = None, weight_t: bool = False, *,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """``act(x @ weight.T + bias)``; ``activation`` is one of ACTIVATIONS or None.

    ``weight_t=True`` takes ``weight`` as [in, out] (GPT-2's Conv1D): ``addmm(bias, x2d, weight)`` over
    x flattened to 2-D and the result unflattened, as Conv1D computes it.
    """
    if weight_t:
        x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        h = torch.mm(x2, weight) if bias is None else torch.addmm(bias, x2, weight)
        if x.dim() != 2:
            h = h.view(*x.shape[:-1], weight.shape[-1])
    elif activation is None:
        return torch._C._nn.linear(x, weight, bias, out=out) if out is not None else \
            torch.nn.functional.linear(x, weight, bias)
    else:
        h = torch.nn.functional.linear(x, weight, bias)
    return _into(out, h) if activation is None else ACTIVATIONS[activation](h, out=out)


register_op(OpDef("ost.linear", linear, category="fused"))


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False, *,
         out: torch.Tensor | None = None) -> torch.Tensor:
    """Rotary embedding ``x * cos + rotate(x) * sin`` over the last dim.

    ``interleaved=False`` is HF's rotate_half (pairs are (i, i + d/2)): rotate(x) = cat(-x2, x1).
    ``interleaved=True`` is the GPT-J / Meta form (pairs are (2i, 2i+1)): rotate(x) interleaves
    -x[1::2] and x[::2]. cos and sin broadcast against x.
    """
    if interleaved:
        rotated = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
        return torch.add(x * cos, rotated * sin, out=out)
    # cat(-x2, x1) * sin == roll(x, d/2) * (sin * [-1.., 1..]) bit for bit: five ops instead of six. Each
    # product rounded to the tensors' dtype before the sum, as eager's two products are (addcmul kept the
    # second unrounded: 1 bf16 ulp apart from a transformers Llama on the CPU; the CUDA kernel rounds both)
    half = x.shape[-1] // 2
    return torch.add(x * cos, torch.roll(x, half, -1) * (sin * _half_signs(x.shape[-1], sin)), out=out)


_SIGNS: dict[tuple, torch.Tensor] = {}


def _half_signs(d: int, like: torch.Tensor) -> torch.Tensor:
    """[-1] * (d/2) + [1] * (d/2) in ``like``'s dtype and device (cached; never written)."""
    key = (d, like.dtype, like.device)
    fake = _is_fake(like)   # shape checks run references on fake tensors: those never meet the cache
    signs = None if fake else _SIGNS.get(key)
    if signs is None:
        signs = torch.ones(d, dtype=like.dtype, device=like.device)
        signs[: d // 2] = -1
        if not fake:
            _SIGNS[key] = signs
    return signs


def _is_fake(t: torch.Tensor) -> bool:
    return type(t) is not torch.Tensor and type(t).__name__ == "FakeTensor"


register_op(OpDef("ost.rope", rope, category="fused"))


def kv_update(cache: torch.Tensor, new: torch.Tensor, index: torch.Tensor, dim: int,
              ring: int | None = None) -> torch.Tensor:
    """A static KV cache with ``new`` written at ``index`` (1-D) along ``dim``.

    ``new`` has the cache's shape except on ``dim``, where it has ``len(index)`` rows. Semantics are
    those of ``index_put`` with ``index`` at ``dim`` (what torch.export makes of ``index_copy_`` and of
    ``cache[:, :, pos] = new``): a negative index counts from the end, unlike ``index_copy``, which
    rejects it. ``ring`` is the length of a ring-buffer cache: the slot is ``index % ring``.
    Functional: returns a new tensor; passes.reinplace turns it into ``ost.kv_update_``, which writes
    the state in place.
    """
    slots = index if ring is None else torch.remainder(index, ring)
    return torch.ops.aten.index_put(cache, [None] * (dim % cache.dim()) + [slots], new)


def kv_update_(cache: torch.Tensor, new: torch.Tensor, index: torch.Tensor, dim: int,
               ring: int | None = None) -> torch.Tensor:
    """In-place kv_update: writes ``cache`` and returns it."""
    slots = index if ring is None else torch.remainder(index, ring)
    return _INDEX_PUT_(cache, [None] * (dim % cache.dim()) + [slots], new)


_INDEX_PUT_ = torch.ops.aten.index_put_.default._op   # the operator itself: no overload lookup per call


register_op(OpDef("ost.kv_update", kv_update, category="fused"))
register_op(OpDef("ost.kv_update_", kv_update_, pure=False, category="inplace"))


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
         q_pos: torch.Tensor | None = None, scale: float | None = None, n_rep: int = 1,
         is_causal: bool = False, softcap: float | None = None) -> torch.Tensor:
    """Scaled dot-product attention with grouped KV heads and the causal mask built inside.

    q is [..., Hq, T, D]; k and v are [..., Hkv, S, D] with Hq = Hkv * n_rep: query head h reads KV
    head h // n_rep (repeat_interleave on the head dim, which HF's repeat_kv also computes).
    ``q_pos`` holds each query's position, shaped to broadcast as [..., T, 1]: key j is visible to
    query i when j <= q_pos[i] (the mask ``arange(S) <= q_pos`` that models build per step).
    ``mask`` is an explicit mask (bool: True = visible; float: added to the scores); with q_pos it
    is combined with the positional one.

    ``softcap`` caps the scaled scores as ``softcap * tanh(scores / softcap)`` before the mask (Gemma 2's
    attention, written out eagerly: passes/patterns/eager_attention.py); that form computes as the
    model wrote it, in q's dtype with the softmax in fp32.
    """
    if softcap is not None:
        return softcap_attention(q, k, v, mask, q_pos, scale, n_rep, is_causal, softcap)
    if q_pos is not None:
        visible = _positions(k.shape[-2], q_pos) <= q_pos
        if mask is None:
            mask = visible
        elif mask.dtype == torch.bool:
            mask = mask & visible
        else:
            mask = mask.masked_fill(~visible, float("-inf"))
    # enable_gqa reads KV head h // n_rep for query head h, as repeat_interleave would, without
    # copying the cache n_rep times (same results on the CPU; about half the time at decode sizes).
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                                            scale=scale, enable_gqa=n_rep > 1)


def softcap_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                      q_pos: torch.Tensor | None = None, scale: float | None = None, n_rep: int = 1,
                      is_causal: bool = False, softcap: float | None = None) -> torch.Tensor:
    """Attention as eager models write it out: ``softmax(cap(q k^T * scale) + mask)`` in fp32, rounded to
    q's dtype, times v; ``cap(s) = softcap * tanh(s / softcap)`` when ``softcap`` is given. The
    reference of ost.sdpa with a soft cap, and of the ``ost.softcap_attention`` the eager-attention
    pattern leaves for fuse_sdpa."""
    if n_rep > 1:
        k, v = k.repeat_interleave(n_rep, dim=-3), v.repeat_interleave(n_rep, dim=-3)
    s = torch.matmul(q, k.transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    t, n = q.shape[-2], k.shape[-2]
    if q_pos is not None:
        s = s.masked_fill(~(_positions(n, q_pos) <= q_pos), float("-inf"))
    if is_causal:
        s = s.masked_fill(~torch.ones(t, n, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(p, v)


register_op(OpDef("ost.softcap_attention", softcap_attention, category="fused"))


_POSITIONS: dict[tuple, torch.Tensor] = {}


def _positions(n: int, like: torch.Tensor) -> torch.Tensor:
    """``arange(n)`` on ``like``'s device (cached for real tensors; never written)."""
    if _is_fake(like):
        return torch.arange(n, device=like.device)
    key = (n, like.device)
    t = _POSITIONS.get(key)
    if t is None:
        t = _POSITIONS[key] = torch.arange(n, device=like.device)
    return t


register_op(OpDef("ost.sdpa", sdpa, category="fused"))


def decode_attention_(k_cache: torch.Tensor, v_cache: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                      v: torch.Tensor, index: torch.Tensor, dim: int, ring: int | None = None,
                      cos: torch.Tensor | None = None, sin: torch.Tensor | None = None, interleaved: bool = False,
                      q_pos: torch.Tensor | None = None, scale: float | None = None,
                      n_rep: int = 1, mask: torch.Tensor | None = None,
                      softcap: float | None = None, q_norm: torch.Tensor | None = None,
                      k_norm: torch.Tensor | None = None, norm_eps: float = 0.0,
                      norm_dtype: torch.dtype | None = None, norm_offset: float = 0.0,
                      norm_first: bool = False,
                      rotary: int | None = None,
                      wide: bool = False, row_x: torch.Tensor | None = None,
                      row_eps: float = 0.0, row_bias: list | None = None, row_center: bool = False,
                      row_shift: torch.Tensor | None = None, row_pre: list | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decode step's attention with the step's cache writes: ``rope`` on q and k when ``cos`` and
    ``sin`` are given, ``kv_update_`` of k and v into the caches (in place), then ``sdpa`` of q over the
    caches with the explicit ``mask``, if any, and the scores' ``softcap``. Returns (attention, k_cache,
    v_cache). Not made by any pass: the CUDA code generator (codegen/attention.py) puts it in place of
    those nodes, one kernel instead of five.

    The caches are [B, Hkv, S, D] written on dim 2, with q [B, Hq, 1, D] and k, v [B, Hkv, 1, D]; or
    [B, S, Hkv, D] written on dim 1 (a sequence-major cache, read through a transpose), with q, k and v
    in the same sequence-major layout ([B, 1, H, D]) and the rope's cos and sin broadcasting over it. The
    attention is [B, Hq, 1, D] either way, as ``sdpa`` gives it.

    With ``q_norm`` and ``k_norm`` (Qwen 3's and Gemma 3's RMSNorm of each head), q and k first go through
    ``rms_norm(x, weight, norm_eps, norm_dtype, norm_offset, norm_first)``; q, k and v may then come as
    [B, 1, H, D] rows over [B, H, S, D] caches (the norm's input, before the model's transpose), which
    become [B, H, 1, D] after the norms (one token: the same order). Without norms too, q, k and v may come
    as such [B, 1, H, D] rows over head-major caches (GPT-J ropes its rows before the transpose), with cos
    and sin broadcasting over heads and the token (the rope then runs on the [B, H, 1, D] view). q and k may also come as [B, 1, H * D]
    rows with weights as wide (OLMo 2's norm of the whole projection, every head at once): normed whole,
    then viewed as [B, 1, H, D] rows (D the caches' head dim).

    ``rotary``: the rope turns only the first ``rotary`` dims of each head (GPT-NeoX's, Phi-2's partial
    rotary embedding; cos and sin that wide), the rest pass through. ``wide``: the rope runs in fp32 over
    the rows cast up (OLMo's fp32 cos and sin over half rows; Cohere's rows cast up, which may come in
    fp32) and its result is cast to the caches' dtype.

    ``row_x`` (passes/fold_norms.py): q, k and v come as fp32 products of a norm's input ``row_x`` with the
    norm's weight folded in, and are first ``row_scale``d by ``row_x``'s rows (``row_eps``) to the caches'
    dtype, before anything else; ``row_bias`` (q's, k's and v's projection biases, as row_scale takes them),
    added after the scale; ``row_center``: the statistic is LayerNorm's (row_scale's ``center``);
    ``row_shift``: that of ``row_x + row_shift`` (row_scale's ``shift``), with q's, k's and v's ``row_pre``
    added before the scale (row_scale's ``pre``)."""
    if row_x is not None:
        q, k, v = (row_scale(t, row_x, row_eps, k_cache.dtype, b, row_center, row_shift, c)
                   for t, b, c in zip((q, k, v), row_bias or (None, None, None), row_pre or (None, None, None)))
    if q_norm is not None:
        q = rms_norm(q, q_norm, norm_eps, norm_dtype, norm_offset, norm_first)
        k = rms_norm(k, k_norm, norm_eps, norm_dtype, norm_offset, norm_first)
        q, k = (t.unflatten(-1, (-1, k_cache.shape[-1])) if t.dim() == 3 else t for t in (q, k))
    if not sequence_major(dim, k_cache):     # [B, 1, H, D] rows over head-major caches: as [B, H, 1, D]
        q, k, v = (t.transpose(1, 2) if t.shape[1] == 1 else t for t in (q, k, v))
    if cos is not None and rotary:
        dt = k_cache.dtype
        q, k = (torch.cat((rope(t[..., :rotary].float() if wide else t[..., :rotary], cos, sin, interleaved).to(dt),
                           t[..., rotary:].to(dt)), -1) for t in (q, k))
    elif cos is not None:
        q, k = (rope(t.float() if wide else t, cos, sin, interleaved).to(k_cache.dtype) for t in (q, k))
    kv_update_(k_cache, k, index, dim, ring)
    kv_update_(v_cache, v, index, dim, ring)
    keys, values = k_cache, v_cache
    if sequence_major(dim, k_cache):
        q, keys, values = q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
    return sdpa(q, keys, values, mask, q_pos, scale, n_rep, False, softcap), k_cache, v_cache


def sequence_major(dim: int, cache) -> bool:
    """ost.decode_attention_'s caches are [B, S, H, D] written on dim 1 (else [B, H, S, D] on dim 2)."""
    return len(cache.shape) == 4 and dim % 4 == 1


decode_attention_.multi_output = True
register_op(OpDef("ost.decode_attention_", decode_attention_, pure=False, category="inplace", writes=(0, 1)))


def _packed_rows(ws: list[torch.Tensor]) -> torch.Tensor | None:
    """The [sum of rows, in] matrix the weights are consecutive row blocks of, when they are: contiguous,
    one after another in one storage (runtime.packing lays them out so); else None."""
    w0 = ws[0]
    if type(w0) not in (torch.Tensor, torch.nn.Parameter) or w0.device.type == "meta":
        return None      # fake tensors (shape checks) have no memory to look at
    if not all(w.is_contiguous() and w.dtype == w0.dtype and w.device == w0.device and w.shape[1:] == w0.shape[1:]
               for w in ws):
        return None
    size = w0.element_size()
    end = w0.data_ptr() + w0.numel() * size
    for w in ws[1:]:
        if w.data_ptr() != end or w.untyped_storage().data_ptr() != w0.untyped_storage().data_ptr():
            return None
        end += w.numel() * size
    rows = sum(w.shape[0] for w in ws)
    return w0.as_strided((rows,) + tuple(w0.shape[1:]), w0.stride())


def multi_linear(x: torch.Tensor, weights: list[torch.Tensor], biases: list[torch.Tensor] | None = None
                 ) -> tuple[torch.Tensor, ...]:
    """``tuple(linear(x, w_i, b_i))``: sibling projections of one input (q, k and v; gate and up). When
    the weights lie one after another in memory (the runtime packs them so) this is one matmul whose
    result is split into views along the last dim; otherwise one matmul each."""
    w = _packed_rows(weights)
    b = None if biases is None else _packed_rows(biases) if w is not None else None
    if w is None or (biases is not None and b is None):
        return tuple(torch.nn.functional.linear(x, wi, None if biases is None else biases[i])
                     for i, wi in enumerate(weights))
    return torch.nn.functional.linear(x, w, b).split([wi.shape[0] for wi in weights], dim=-1)


multi_linear.multi_output = True
register_op(OpDef("ost.multi_linear", multi_linear, category="fused"))


def moe_route(logits: torch.Tensor, top_k: int, normalize: bool, route_dtype: torch.dtype,
              weights_dtype: torch.dtype | None = None, topk_first: bool = False,
              ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A mixture of experts' routing as transformers' routers write it: ``softmax(logits)`` in
    ``route_dtype``, its ``top_k`` largest (values, expert ids), the values divided by their sum when
    ``normalize``, then cast to ``weights_dtype`` when given (Qwen-MoE casts them back to the logits'
    dtype; Mixtral keeps fp32). ``topk_first``: the ``top_k`` largest logits (in ``route_dtype``) chosen
    first and the softmax taken over them (GraniteMoe). ``ids`` ([T * top_k], the choices made already):
    their values, the same numbers ``topk`` gives for them. Not an op of its own: the shared first step
    of ost.moe_up (which chooses) and ost.moe_down (which takes moe_up's choice)."""
    scores = logits.to(route_dtype)
    if not topk_first:
        scores = torch.softmax(scores, -1)
    if ids is None:
        values, ids = torch.topk(scores, top_k, -1)
    else:
        ids = ids.view(logits.shape[0], top_k)
        values = torch.gather(scores, -1, ids)
    if topk_first:
        values = torch.softmax(values, -1)
    if normalize:
        values = values / values.sum(-1, keepdim=True)
    if weights_dtype is not None:
        values = values.to(weights_dtype)
    return values, ids


def moe_up(x: torch.Tensor, logits: torch.Tensor, weight: torch.Tensor, top_k: int, route_dtype: torch.dtype,
           activation: str = "silu", topk_first: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The first half of a mixture of experts' MLP for tokens ``x`` [T, K]: each token routed to its
    ``top_k`` experts (moe_route over ``logits`` [T, E]) and multiplied by each chosen expert's packed
    gate/up weight (``weight`` [E, 2I, K]), then gated (``act(gate) * up``, act silu or gelu). Returns
    ([T * top_k, I], the token's k rows one after another: row t * top_k + j is its j-th choice; the
    chosen expert ids, int64 [T * top_k]), as transformers' batched_mm experts compute it: the weights of
    the chosen experts gathered, one batched matrix-vector product, ost.swiglu_packed / ost.geglu_packed.
    The route is chosen here only: ost.moe_down takes the ids, so the two halves never choose apart,
    whichever of them runs a kernel and whichever its reference."""
    _, ids = moe_route(logits, top_k, False, route_dtype, None, topk_first)
    ids = ids.reshape(-1)
    rows = x.repeat_interleave(top_k, dim=0)
    h = torch.bmm(weight[ids], rows.unsqueeze(-1)).squeeze(-1)
    return (swiglu_packed(h) if activation == "silu" else geglu_packed(h)), ids


moe_up.multi_output = True


def moe_down(h: torch.Tensor, ids: torch.Tensor, logits: torch.Tensor, weight: torch.Tensor, top_k: int,
             route_dtype: torch.dtype, normalize: bool, weights_dtype: torch.dtype | None, out_dtype: torch.dtype,
             topk_first: bool = False, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """The second half: each row of ``h`` [T * top_k, I] (ost.moe_up's result) multiplied by its expert's
    ``weight`` [E, H, I] (``ids``: moe_up's choices), scaled by its routing weight (moe_route's values for
    those choices), the token's k rows summed: [T, H] in ``out_dtype``. The product is computed in the
    promotion of h's dtype and the routing weights' (fp32 for Mixtral's fp32 weights: each expert's result
    is rounded to h's dtype first, as the batched product gives it), the sum in that dtype."""
    values, _ = moe_route(logits, top_k, normalize, route_dtype, weights_dtype, topk_first, ids)
    d = torch.bmm(weight[ids], h.unsqueeze(-1)).squeeze(-1)
    scaled = d * values.reshape(-1).unsqueeze(-1)
    return _into(out, scaled.view(logits.shape[0], top_k, -1).sum(1).to(out_dtype))


def moe_down_shared(h: torch.Tensor, ids: torch.Tensor, logits: torch.Tensor, weight: torch.Tensor, top_k: int,
                    route_dtype: torch.dtype, normalize: bool, weights_dtype: torch.dtype | None,
                    out_dtype: torch.dtype, topk_first: bool, gate: torch.Tensor, up: torch.Tensor, activation: str,
                    shared_weight: torch.Tensor, shared_logit: torch.Tensor | None, *,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """ost.moe_down's result plus a shared expert's, as Qwen2-MoE adds them: the shared expert's gated
    activations (``act(gate) * up`` [T, I_s], ost.swiglu / ost.geglu of its gate and up projections)
    times ``shared_weight`` [H, I_s], scaled by ``sigmoid(shared_logit)`` ([T, 1], its gate's projection)
    when one is given, added to the routed experts' sum. Each step in its own op's dtype, as the module's
    ops compute it."""
    experts = moe_down(h, ids, logits, weight, top_k, route_dtype, normalize, weights_dtype, out_dtype, topk_first)
    shared = torch.nn.functional.linear(swiglu(gate, up) if activation == "silu" else geglu(gate, up), shared_weight)
    if shared_logit is not None:
        shared = torch.sigmoid(shared_logit) * shared
    return _into(out, experts + shared)


register_op(OpDef("ost.moe_up", moe_up, category="fused"))
register_op(OpDef("ost.moe_down", moe_down, category="fused"))
register_op(OpDef("ost.moe_down_shared", moe_down_shared, category="fused"))


from .fold_ops import row_scale  # noqa: E402  (registers the folded norm's ops; the decode attention's row scale)
