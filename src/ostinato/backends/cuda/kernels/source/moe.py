"""A mixture of experts' decode step: the route chosen per program of moe_up (and its ids recorded),
products with the chosen experts' weights read where they lie. Only Triton source: the launchers (../moe.py) never import this module
unless a kernel must be compiled."""
import triton
import triton.language as tl


@triton.jit
def _gelu(g):
    return 0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476))


@triton.jit
def _gated(acc_g, acc_u, dt: tl.constexpr, ACT: tl.constexpr):
    """act(g) * u in dt from the gate's and the up product's fp32 sums, each rounded to dt as a batched
    product's result is, then the activation (0 silu, 1 exact gelu) rounded before the product, as
    ost.swiglu_packed computes them."""
    g = acc_g.to(dt).to(tl.float32)
    u = acc_u.to(dt).to(tl.float32)
    if ACT == 0:
        a = g * tl.sigmoid(g)
    else:
        a = _gelu(g)
    return (a.to(dt).to(tl.float32) * u).to(dt)


@triton.jit
def _scores(logits_ptr, t, n_experts, ROUTE: tl.constexpr, BLOCK_E: tl.constexpr):
    """Token ``t``'s routing scores over its experts ([BLOCK_E], -inf past n_experts). ROUTE 0: the
    softmax's probabilities, computed in fp32; 1: the same rounded to the logits' dtype (a softmax run in
    bf16); 2: the logits themselves (top-k first, GraniteMoe)."""
    e = tl.arange(0, BLOCK_E)
    logit = tl.load(logits_ptr + t * n_experts + e, mask=e < n_experts, other=float("-inf")).to(tl.float32)
    if ROUTE == 2:
        return logit
    p = tl.exp(logit - tl.max(logit, 0))
    p = p / tl.sum(p, 0)
    if ROUTE == 1:
        p = p.to(logits_ptr.dtype.element_ty).to(tl.float32)
    return tl.where(e < n_experts, p, float("-inf"))


@triton.jit
def _route(logits_ptr, t, n_experts, ROUTE: tl.constexpr, TOPK: tl.constexpr, BLOCK_E: tl.constexpr,
           BLOCK_TOPK: tl.constexpr):
    """The expert ids of token ``t``'s TOPK choices, as a [BLOCK_TOPK] vector (choice j at j, the largest
    score first; ties to the lower expert id; never an expert twice, nor one past n_experts)."""
    e = tl.arange(0, BLOCK_E)
    score = _scores(logits_ptr, t, n_experts, ROUTE, BLOCK_E)
    slot = tl.arange(0, BLOCK_TOPK)
    ids = tl.zeros([BLOCK_TOPK], dtype=tl.int64)
    free = e < n_experts    # experts not yet chosen: with fewer finite scores than TOPK, the lowest free ids
    for i in tl.static_range(TOPK):
        best = tl.max(score, 0)
        idx = tl.min(tl.where((score == best) & free, e, BLOCK_E), 0)
        ids = tl.where(slot == i, idx.to(tl.int64), ids)
        free = free & (e != idx)
        score = tl.where(e == idx, float("-inf"), score)
    return ids


@triton.jit
def moe_up_kernel(x_ptr, logits_ptr, w_ptr, out_ptr, ids_ptr, n_experts, k_dim, n_inter, x_stride, w_se, w_sn,
                  ROUTE: tl.constexpr, TOPK: tl.constexpr, ACT: tl.constexpr, BLOCK_E: tl.constexpr,
                  BLOCK_TOPK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[t * TOPK + j, n] = act(g) * u for token t's j-th expert e, g = W[e, n] . x[t] and
    u = W[e, n_inter + n] . x[t] (W [E, 2 * n_inter, k_dim], its rows at w_sn, the last dim dense), each
    rounded to out's dtype as a batched product's result is, then the activation (0 silu, 1 exact gelu)
    rounded before the product, as ost.swiglu_packed computes them. The first column block's program of
    each row stores e at ids[t * TOPK + j]."""
    s = tl.program_id(0)
    t = s // TOPK
    j = s % TOPK
    ids = _route(logits_ptr, t, n_experts, ROUTE, TOPK, BLOCK_E, BLOCK_TOPK)
    e = tl.sum(tl.where(tl.arange(0, BLOCK_TOPK) == j, ids, 0), 0)
    if tl.program_id(1) == 0:
        tl.store(ids_ptr + s, e)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < n_inter
    w_rows = w_ptr + e * w_se + n.to(tl.int64)[:, None] * w_sn
    up_rows = w_rows + n_inter * w_sn
    acc_g = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, k_dim, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < k_dim
        xv = tl.load(x_ptr + t * x_stride + kk, mask=k_ok, other=0.0).to(tl.float32)[None, :]
        m = n_ok[:, None] & k_ok[None, :]
        acc_g += tl.sum(tl.load(w_rows + kk[None, :], mask=m, other=0.0).to(tl.float32) * xv, 1)
        acc_u += tl.sum(tl.load(up_rows + kk[None, :], mask=m, other=0.0).to(tl.float32) * xv, 1)
    tl.store(out_ptr + s.to(tl.int64) * n_inter + n, _gated(acc_g, acc_u, out_ptr.dtype.element_ty, ACT), mask=n_ok)


@triton.jit
def moe_down_kernel(h_ptr, ids_ptr, logits_ptr, w_ptr, out_ptr, n_experts, k_dim, n_out, w_se, w_sn,
                    g_ptr, u_ptr, ws_ptr, sl_ptr, k_shared, g_stride, u_stride, ws_stride, sl_stride,
                    ROUTE: tl.constexpr, TOPK: tl.constexpr, NORMALIZE: tl.constexpr,
                    WEIGHT_ROUND: tl.constexpr, PRODUCT_ROUND: tl.constexpr, SHARED: tl.constexpr,
                    SHARED_ACT: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_TOPK: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[t, n] = sum over token t's choices j (e_j = ids[t * TOPK + j], moe_up's) of
    r_j * (W[e_j, n] . h[t * TOPK + j]) (W [E, n_out, k_dim],
    h dense [T * TOPK, k_dim]): each product rounded to h's dtype, r_j the routing weight (divided by the
    chosen scores' sum when NORMALIZE, rounded to h's dtype when WEIGHT_ROUND), the weighted product
    rounded to h's dtype when PRODUCT_ROUND, the sum in fp32, stored in out's dtype. SHARED 1 adds a
    shared expert, Ws[n] . (act(g[t]) * u[t]) (Ws [n_out, k_shared], rows at ws_stride; act silu when
    SHARED_ACT is 0, exact gelu when 1), to that sum rounded to out's dtype; SHARED 2 scales it by
    sigmoid(sl[t]) first. Each of those steps is rounded to out's dtype, as its own op's result is."""
    t = tl.program_id(0)
    # the choices moe_up made (ids), their scores, and for ROUTE 2 the softmax of the chosen logits
    e = tl.arange(0, BLOCK_E)
    score = _scores(logits_ptr, t, n_experts, ROUTE, BLOCK_E)
    slot = tl.arange(0, BLOCK_TOPK)
    ids = tl.load(ids_ptr + t * TOPK + slot, mask=slot < TOPK, other=0)
    vals = tl.zeros([BLOCK_TOPK], dtype=tl.float32)
    for i in tl.static_range(TOPK):
        chosen = tl.sum(tl.where(slot == i, ids, 0), 0)
        vals = tl.where(slot == i, tl.sum(tl.where(e == chosen, score, 0.0), 0), vals)
    if ROUTE == 2:
        first = tl.max(tl.where(slot < TOPK, vals, float("-inf")), 0)
        vals = tl.where(slot < TOPK, tl.exp(vals - first), 0.0)
    total = tl.sum(vals, 0)
    hdt = h_ptr.dtype.element_ty
    if NORMALIZE:
        if ROUTE == 1:      # the sum of probabilities rounded to the logits' dtype, as the reference's is
            total = total.to(logits_ptr.dtype.element_ty).to(tl.float32)
        vals = vals / total
    if WEIGHT_ROUND:        # the routing weights in h's dtype (cast, or a routing run in it)
        vals = vals.to(hdt).to(tl.float32)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < n_out
    result = tl.zeros([BLOCK_N], dtype=tl.float32)
    for j in tl.static_range(TOPK):
        expert = tl.sum(tl.where(slot == j, ids, 0), 0)
        r = tl.sum(tl.where(slot == j, vals, 0.0), 0)
        w_rows = w_ptr + expert * w_se + n.to(tl.int64)[:, None] * w_sn
        h_row = h_ptr + (t * TOPK + j).to(tl.int64) * k_dim
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for k0 in range(0, k_dim, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            k_ok = kk < k_dim
            hv = tl.load(h_row + kk, mask=k_ok, other=0.0).to(tl.float32)[None, :]
            acc += tl.sum(tl.load(w_rows + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
                          .to(tl.float32) * hv, 1)
        prod = acc.to(hdt).to(tl.float32) * r
        if PRODUCT_ROUND:
            prod = prod.to(hdt).to(tl.float32)
        result += prod
    odt = out_ptr.dtype.element_ty
    if SHARED != 0:
        result = result.to(odt).to(tl.float32)
        ws_rows = ws_ptr + n.to(tl.int64)[:, None] * ws_stride
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for k0 in range(0, k_shared, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            k_ok = kk < k_shared
            gv = tl.load(g_ptr + t.to(tl.int64) * g_stride + kk, mask=k_ok, other=0.0).to(tl.float32)
            uv = tl.load(u_ptr + t.to(tl.int64) * u_stride + kk, mask=k_ok, other=0.0).to(tl.float32)
            if SHARED_ACT == 0:
                av = gv * tl.sigmoid(gv)
            else:
                av = _gelu(gv)
            av = (av.to(odt).to(tl.float32) * uv).to(odt).to(tl.float32)
            acc += tl.sum(tl.load(ws_rows + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
                          .to(tl.float32) * av[None, :], 1)
        shared = acc.to(odt).to(tl.float32)
        if SHARED == 2:
            sg = tl.sigmoid(tl.load(sl_ptr + t.to(tl.int64) * sl_stride).to(tl.float32)).to(odt).to(tl.float32)
            shared = (sg * shared).to(odt).to(tl.float32)
        result += shared
    tl.store(out_ptr + t.to(tl.int64) * n_out + n, result.to(odt), mask=n_ok)


# Grouped by expert: a batched decode step (several tokens) reads each chosen expert's weights once. The
# kernels above read an expert's rows once per (token, choice); at 32 tokens Mixtral's up kernel read 8x
# the chosen weights (docs/benchmarks/moe_gpu/). Here a program takes one expert (or walks them all) and
# multiplies its weight tile by every row routed to it with tl.dot (fp16/bf16 operands, fp32 sums).


@triton.jit
def _scores_rows(logits_ptr, n_tokens, n_experts, ROUTE: tl.constexpr, BLOCK_T: tl.constexpr,
                 BLOCK_E: tl.constexpr):
    """_scores for every token at once: [BLOCK_T, BLOCK_E] (-inf past n_experts; rows past n_tokens
    score as zero logits, and are masked by the callers)."""
    t = tl.arange(0, BLOCK_T)[:, None]
    e = tl.arange(0, BLOCK_E)[None, :]
    logit = tl.load(logits_ptr + t * n_experts + e, mask=(t < n_tokens) & (e < n_experts), other=0.0).to(tl.float32)
    logit = tl.where(e < n_experts, logit, float("-inf"))
    if ROUTE == 2:
        return logit
    p = tl.exp(logit - tl.max(logit, 1)[:, None])
    p = p / tl.sum(p, 1)[:, None]
    if ROUTE == 1:
        p = p.to(logits_ptr.dtype.element_ty).to(tl.float32)
    return tl.where(e < n_experts, p, float("-inf"))


@triton.jit
def moe_up_grouped_kernel(x_ptr, logits_ptr, w_ptr, out_ptr, ids_ptr, n_tokens, n_experts, k_dim, n_inter, x_stride,
                          w_se, w_sn, ROUTE: tl.constexpr, TOPK: tl.constexpr, ACT: tl.constexpr,
                          BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """moe_up_kernel's result, one program per (expert, block of output columns): every token is routed
    here (the same choice as _route's: the largest score first, ties to the lower id), the rows that
    chose this expert multiplied by its gate and up rows at once ([BLOCK_T, BLOCK_K] x [BLOCK_K, BLOCK_N]
    dots), stored at their (token, choice) rows. The first column block's program of each expert stores
    the expert's id at the ids of the rows that chose it. A program whose expert no token chose reads
    no weight."""
    expert = tl.program_id(0)
    t = tl.arange(0, BLOCK_T)
    e = tl.arange(0, BLOCK_E)[None, :]
    score = _scores_rows(logits_ptr, n_tokens, n_experts, ROUTE, BLOCK_T, BLOCK_E)
    hit = tl.zeros([BLOCK_T], dtype=tl.int32)
    slot = tl.zeros([BLOCK_T], dtype=tl.int32)
    free = (e < n_experts) & (t[:, None] >= 0)      # as _route's, per token
    for i in tl.static_range(TOPK):
        best = tl.max(score, 1)
        idx = tl.min(tl.where((score == best[:, None]) & free, e, BLOCK_E), 1)
        free = free & (e != idx[:, None])
        hit = tl.where(idx == expert, 1, hit)
        slot = tl.where(idx == expert, i, slot)
        score = tl.where(e == idx[:, None], float("-inf"), score)
    sel = (hit > 0) & (t < n_tokens)
    row = t.to(tl.int64) * TOPK + slot
    if tl.program_id(1) == 0:
        tl.store(ids_ptr + row, tl.zeros([BLOCK_T], dtype=tl.int64) + expert, mask=sel)
    if tl.sum(sel.to(tl.int32), 0) > 0:
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < n_inter
        w_rows = w_ptr + expert.to(tl.int64) * w_se + n.to(tl.int64)[:, None] * w_sn
        up_rows = w_rows + n_inter * w_sn
        acc_g = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
        for k0 in range(0, k_dim, BLOCK_K):
            kk = k0 + tl.arange(0, BLOCK_K)
            k_ok = kk < k_dim
            xv = tl.load(x_ptr + t.to(tl.int64)[:, None] * x_stride + kk[None, :], mask=sel[:, None] & k_ok[None, :],
                         other=0.0)
            m = n_ok[:, None] & k_ok[None, :]
            acc_g = tl.dot(xv, tl.trans(tl.load(w_rows + kk[None, :], mask=m, other=0.0)), acc_g)
            acc_u = tl.dot(xv, tl.trans(tl.load(up_rows + kk[None, :], mask=m, other=0.0)), acc_u)
        tl.store(out_ptr + row[:, None] * n_inter + n[None, :], _gated(acc_g, acc_u, out_ptr.dtype.element_ty, ACT),
                 mask=sel[:, None] & n_ok[None, :])


@triton.jit
def _shared_acc(t, t_ok, n, n_ok, odt: tl.constexpr, g_ptr, u_ptr, ws_ptr, k_lo, k_hi, g_stride, u_stride, ws_stride,
                SHARED_ACT: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KS: tl.constexpr):
    """A shared expert's fp32 sums over K in [k_lo, k_hi), output columns n, every token, as
    moe_down_kernel computes them: Ws[n, k] * (act(g[t, k]) * u[t, k]), the activation and the gating
    rounded to odt."""
    ws_rows = ws_ptr + n.to(tl.int64)[:, None] * ws_stride
    acc = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_KS):
        kk = k0 + tl.arange(0, BLOCK_KS)
        k_ok = kk < k_hi
        m = t_ok[:, None] & k_ok[None, :]
        gv = tl.load(g_ptr + t.to(tl.int64)[:, None] * g_stride + kk[None, :], mask=m, other=0.0).to(tl.float32)
        uv = tl.load(u_ptr + t.to(tl.int64)[:, None] * u_stride + kk[None, :], mask=m, other=0.0).to(tl.float32)
        if SHARED_ACT == 0:
            av = gv * tl.sigmoid(gv)
        else:
            av = _gelu(gv)
        av = (av.to(odt).to(tl.float32) * uv).to(odt)
        wv = tl.load(ws_rows + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(av, tl.trans(wv), acc)
    return acc


@triton.jit
def _shared_finish(acc, t, t_ok, odt: tl.constexpr, sl_ptr, sl_stride, SHARED: tl.constexpr):
    """The shared expert's output from its sums: rounded to odt, scaled by sigmoid(logit) when SHARED is 2."""
    shared = acc.to(odt).to(tl.float32)
    if SHARED == 2:
        sg = tl.sigmoid(tl.load(sl_ptr + t.to(tl.int64) * sl_stride, mask=t_ok, other=0.0).to(tl.float32))
        shared = (sg.to(odt).to(tl.float32)[:, None] * shared).to(odt).to(tl.float32)
    return shared


@triton.jit
def moe_down_grouped_kernel(h_ptr, ids_ptr, logits_ptr, w_ptr, out_ptr, n_tokens, n_experts, k_dim, n_out, w_se,
                            w_sn, g_ptr, u_ptr, ws_ptr, sl_ptr, k_shared, g_stride, u_stride, ws_stride, sl_stride,
                            part_ptr, cnt_ptr, ROUTE: tl.constexpr, TOPK: tl.constexpr, NORMALIZE: tl.constexpr,
                            WEIGHT_ROUND: tl.constexpr, PRODUCT_ROUND: tl.constexpr, SHARED: tl.constexpr,
                            SHARED_ACT: tl.constexpr, NSPLIT: tl.constexpr, BLOCK_T: tl.constexpr,
                            BLOCK_E: tl.constexpr, BLOCK_TOPK: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, BLOCK_KS: tl.constexpr):
    """moe_down_kernel's result (and its shared expert's), one program per (block of output columns, split)
    for every token: it walks its split's share of the chosen experts and multiplies each one's rows by
    all the rows routed to it at once, so each chosen expert's weights are read once. The routing weights
    are moe_down_kernel's, for all tokens at once; the weighted products are summed in expert order
    (moe_down_kernel: choice order), in fp32. With NSPLIT > 1 each split stores its fp32 sum at
    part_ptr[split] (and its share of a shared expert's K, summed, at part_ptr[NSPLIT + split]); the last
    split of a column block to arrive (cnt_ptr: its counter, zero before and after) adds them in split
    order and stores the result."""
    t = tl.arange(0, BLOCK_T)
    t_ok = t < n_tokens
    e = tl.arange(0, BLOCK_E)[None, :]
    slot = tl.arange(0, BLOCK_TOPK)[None, :]
    score = _scores_rows(logits_ptr, n_tokens, n_experts, ROUTE, BLOCK_T, BLOCK_E)
    ids = tl.load(ids_ptr + t[:, None] * TOPK + slot, mask=t_ok[:, None] & (slot < TOPK), other=-1)
    vals = tl.zeros([BLOCK_T, BLOCK_TOPK], dtype=tl.float32)
    for i in tl.static_range(TOPK):
        chosen = tl.sum(tl.where(slot == i, ids, 0), 1)
        vals = tl.where(slot == i, tl.sum(tl.where(e == chosen[:, None], score, 0.0), 1)[:, None], vals)
    if ROUTE == 2:
        first = tl.max(tl.where(slot < TOPK, vals, float("-inf")), 1)
        vals = tl.where(slot < TOPK, tl.exp(vals - first[:, None]), 0.0)
    total = tl.where(t_ok, tl.sum(vals, 1), 1.0)       # (rows past the tokens: no 0 / 0)
    hdt = h_ptr.dtype.element_ty
    if NORMALIZE:
        if ROUTE == 1:
            total = total.to(logits_ptr.dtype.element_ty).to(tl.float32)
        vals = vals / total[:, None]
    if WEIGHT_ROUND:
        vals = vals.to(hdt).to(tl.float32)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < n_out
    # the experts some token chose, in id order: one loop over their K steps (expert after expert), so the
    # loads of the next steps are in flight across experts (a loop per expert, of a few K steps each for
    # small experts, waited on every expert's first load)
    ev = tl.arange(0, BLOCK_E)
    used = tl.zeros([BLOCK_E], dtype=tl.int32)
    for j in tl.static_range(TOPK):
        col = tl.sum(tl.where(slot == j, ids, 0), 1)
        used = tl.maximum(used, tl.max(((col[:, None] == ev[None, :]) & t_ok[:, None]).to(tl.int32), 0))
    rank = tl.where(used > 0, tl.cumsum(used, 0) - 1, -1)
    k_steps = tl.cdiv(k_dim, BLOCK_K)
    n_used = tl.sum(used, 0)
    sid = tl.program_id(1)
    chunk = tl.cdiv(n_used, NSPLIT)
    a_end = tl.minimum(n_used, sid * chunk + chunk)
    result = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
    acc = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
    for i in range(sid * chunk * k_steps, a_end * k_steps):
        a = i // k_steps
        kk = (i - a * k_steps) * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = kk < k_dim
        expert = tl.sum(tl.where(rank == a, ev, 0), 0)
        here = ids == expert
        sel = tl.max(here.to(tl.int32), 1) > 0
        h_rows = h_ptr + (t.to(tl.int64) * TOPK + tl.sum(tl.where(here, slot, 0), 1))[:, None] * k_dim
        w_rows = w_ptr + expert.to(tl.int64) * w_se + n.to(tl.int64)[:, None] * w_sn
        hv = tl.load(h_rows + kk[None, :], mask=sel[:, None] & k_ok[None, :], other=0.0)
        wv = tl.load(w_rows + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(hv, tl.trans(wv), acc)
        # the expert's last K step: its weighted products join the sum, its accumulator starts again
        done = (i - a * k_steps) == k_steps - 1
        prod = acc.to(hdt).to(tl.float32) * tl.sum(tl.where(here, vals, 0.0), 1)[:, None]
        if PRODUCT_ROUND:
            prod = prod.to(hdt).to(tl.float32)
        result += tl.where(done & sel[:, None], prod, 0.0)
        acc = tl.where(done, 0.0, acc)
    odt: tl.constexpr = out_ptr.dtype.element_ty
    done_mask = t_ok[:, None] & n_ok[None, :]
    out_at = out_ptr + t.to(tl.int64)[:, None] * n_out + n[None, :]
    if NSPLIT == 1:
        if SHARED != 0:
            result = result.to(odt).to(tl.float32) + _shared_finish(_shared_acc(
                t, t_ok, n, n_ok, odt, g_ptr, u_ptr, ws_ptr, 0, k_shared, g_stride, u_stride, ws_stride, SHARED_ACT,
                BLOCK_T, BLOCK_N, BLOCK_KS), t, t_ok, odt, sl_ptr, sl_stride, SHARED)
        tl.store(out_at, result.to(odt), mask=done_mask)
    else:
        part = part_ptr + t.to(tl.int64)[:, None] * n_out + n[None, :]
        step = n_tokens * n_out
        tl.store(part + sid * step, result, mask=done_mask)
        if SHARED != 0:
            ks_chunk = tl.cdiv(tl.cdiv(k_shared, BLOCK_KS), NSPLIT) * BLOCK_KS
            k_lo = sid * ks_chunk
            tl.store(part + (NSPLIT + sid) * step, _shared_acc(
                t, t_ok, n, n_ok, odt, g_ptr, u_ptr, ws_ptr, k_lo, tl.minimum(k_shared, k_lo + ks_chunk), g_stride,
                u_stride, ws_stride, SHARED_ACT, BLOCK_T, BLOCK_N, BLOCK_KS), mask=done_mask)
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + tl.program_id(0), 1, sem="acq_rel", scope="gpu")
        if arrived == NSPLIT - 1:
            summed = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
            for s in tl.static_range(NSPLIT):
                summed += tl.load(part + s * step, mask=done_mask, other=0.0, cache_modifier=".cg")
            if SHARED != 0:
                shared = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
                for s in tl.static_range(NSPLIT):
                    shared += tl.load(part + (NSPLIT + s) * step, mask=done_mask, other=0.0, cache_modifier=".cg")
                summed = summed.to(odt).to(tl.float32) + _shared_finish(shared, t, t_ok, odt, sl_ptr, sl_stride, SHARED)
            tl.store(out_at, summed.to(odt), mask=done_mask)
            tl.atomic_xchg(cnt_ptr + tl.program_id(0), 0, sem="relaxed", scope="gpu")
