"""KV-cache writes and attention over a static cache (a decode step's one query row, a short prompt's few).
Only Triton source: the launchers (../attention.py) never import this module unless a kernel must be compiled."""
import triton
import triton.language as tl


@triton.jit
def _slot(index_ptr, ring, n_slots, RING: tl.constexpr):
    """The cache row an index names: negative counts from the end; with RING, modulo the ring length."""
    slot = tl.load(index_ptr).to(tl.int64)
    if RING:
        slot = ((slot % ring) + ring) % ring
    return tl.where(slot < 0, slot + n_slots, slot)


@triton.jit
def kv_update_kernel(cache_ptr, new_ptr, index_ptr, n_slots, n_new, inner, ring, outer2, new_s1, new_s2, new_sj,
                     RING: tl.constexpr, BLOCK: tl.constexpr):
    """cache [outer, n_slots, inner] <- new [outer1, outer2, n_new, inner] at rows index[j] (negative counts
    from the end; with RING, modulo the ring length). ``new`` is read through its strides (new_s1 and
    new_s2 for the two outer dims, new_sj for its rows; inner dense): a prefill's keys and values, a
    transposed view of the projection, are not copied first. One program per (outer, j) and inner
    block."""
    pid = tl.program_id(0).to(tl.int64)
    o = pid // n_new
    j = pid % n_new
    slot = _slot(index_ptr + j, ring, n_slots, RING)
    offs = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    # A slot outside the cache (eager's index_put raises) writes nothing rather than another row.
    mask = (offs < inner) & (slot >= 0) & (slot < n_slots)
    v = tl.load(new_ptr + (o // outer2) * new_s1 + (o % outer2) * new_s2 + j * new_sj + offs, mask=mask)
    tl.store(cache_ptr + (o * n_slots + slot) * inner + offs, v.to(cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _online_softmax(m, l, acc, s, visible, vt):
    """One block of keys into the running (max, sum, weighted values): scores ``s`` [N] of the keys
    ``visible`` [N], their values ``vt`` [N, D]."""
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=0))
    # A block with no visible key leaves m at -inf: keep the exponentials at 0 then.
    alpha = tl.where(m_new == float("-inf"), 1.0, tl.exp(m - m_new))
    p = tl.where(visible, tl.exp(s - m_new), 0.0)
    return m_new, l * alpha + tl.sum(p, axis=0), acc * alpha + tl.sum(p[:, None] * vt, axis=0)


@triton.jit
def _mask_row(visible, mask_base, m_sn, n, MASK: tl.constexpr):
    """(what the explicit mask adds to the scores of keys ``n``, the keys still visible): MASK 1 adds a
    float mask (a key at -inf is hidden), MASK 2 hides the keys where a boolean one is False, 0 neither.
    Read before the keys and values, so a block the mask hides whole (a sliding window's far past, a
    static cache's future) loads nothing else."""
    add = tl.zeros(n.shape, tl.float32)
    if MASK == 1:
        add = tl.load(mask_base + n * m_sn, mask=visible, other=0.0).to(tl.float32)
        visible = visible & (add > float("-inf"))
    if MASK == 2:
        visible = visible & (tl.load(mask_base + n * m_sn, mask=visible, other=0) != 0)
    return add, visible


@triton.jit
def _capped(s, add, cap, SOFTCAP: tl.constexpr):
    """Scores ``s`` soft-capped (``cap * tanh(s / cap)``) with SOFTCAP, then the mask's ``add``."""
    if SOFTCAP:     # tanh(x) = 1 - 2 / (exp(2x) + 1): exact at both ends (exp overflowing to inf gives 1)
        s = cap * (1.0 - 2.0 / (tl.exp(2.0 * s / cap) + 1.0))
    return s + add


@triton.jit
def _last_key(pos_ptr, pos_off, row, n_keys: tl.constexpr, HAS_POS: tl.constexpr, CAUSAL: tl.constexpr):
    """The last key a query sees: its position (HAS_POS; negative: none), at most its own ``row`` with
    CAUSAL (torch's is_causal: query i sees keys j <= i), else the cache's last."""
    limit = tl.full((), n_keys - 1, tl.int64)
    if HAS_POS:
        limit = tl.load(pos_ptr + pos_off).to(tl.int64)
    if CAUSAL:
        limit = tl.minimum(limit, row)
    return limit


@triton.jit
def _attend(q, k_base, v_base, k_ss, v_ss, d, dmask, limit, skip, scale, cap, mask_base, m_sn,
            n_keys: tl.constexpr, MASK: tl.constexpr, SOFTCAP: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """softmax(softcap(q k^T * scale) + mask) v online over the cache rows j <= limit except row ``skip``:
    (running max, sum, weighted values). No block past the limit is read: a step at position p reads
    ceil((p + 1) / BLOCK_N) blocks, not the cache."""
    end = tl.minimum(tl.maximum(limit + 1, 0), n_keys).to(tl.int32)
    m = tl.full((), float("-inf"), tl.float32)
    l = tl.full((), 0.0, tl.float32)
    acc = tl.zeros((BLOCK_D,), tl.float32)
    for start in range(0, end, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        add, seen = _mask_row((n < n_keys) & (n <= limit) & (n != skip), mask_base, m_sn, n, MASK)
        kt = tl.load(k_base + n[:, None] * k_ss + d[None, :], mask=seen[:, None] & dmask[None, :],
                     other=0.0).to(tl.float32)
        vt = tl.load(v_base + n[:, None] * v_ss + d[None, :], mask=seen[:, None] & dmask[None, :],
                     other=0.0).to(tl.float32)
        m, l, acc = _online_softmax(m, l, acc, _capped(tl.sum(kt * q[None, :], axis=1) * scale, add, cap, SOFTCAP),
                                    seen, vt)
    return m, l, acc


@triton.jit
def decode_attention_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, mask_ptr, out_ptr, head_dim, n_rep, hq, n_q, scale, cap,
                            q_sb, q_sh, q_st, k_sb, k_sh, k_ss, v_sb, v_sh, v_ss, o_sb, o_sh, o_st, pos_sb, pos_st,
                            m_sb, m_sh, m_st, m_sn,
                            n_keys: tl.constexpr, HAS_POS: tl.constexpr, CAUSAL: tl.constexpr, MASK: tl.constexpr,
                            SOFTCAP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One (batch, query head, query row) of ``n_q`` rows (a decode step's one, a short prompt's few):
    softmax(softcap(q k^T * scale) + mask, keys j <= the row's position) v, online over key blocks.
    The cache length is a compile-time constant: a static cache has one."""
    pid = tl.program_id(0).to(tl.int64)
    t = pid % n_q
    bh = pid // n_q
    b = bh // hq
    h = bh % hq
    kvh = h // n_rep
    d = tl.arange(0, BLOCK_D)
    dmask = d < head_dim
    q = tl.load(q_ptr + b * q_sb + h * q_sh + t * q_st + d, mask=dmask, other=0.0).to(tl.float32)
    limit = _last_key(pos_ptr, b * pos_sb + t * pos_st, t, n_keys, HAS_POS, CAUSAL)
    m, l, acc = _attend(q, k_ptr + b * k_sb + kvh * k_sh, v_ptr + b * v_sb + kvh * v_sh, k_ss, v_ss, d, dmask,
                        limit, -1, scale, cap, mask_ptr + b * m_sb + h * m_sh + t * m_st, m_sn, n_keys,
                        MASK, SOFTCAP, BLOCK_N, BLOCK_D)
    out = tl.where(l > 0, acc / l, 0.0)    # no visible key: 0, as torch's SDPA gives
    tl.store(out_ptr + b * o_sb + h * o_sh + t * o_st + d, out.to(out_ptr.dtype.element_ty), mask=dmask)


@triton.jit
def _normed(x, w_ptr, d, dmask, rstd, offset, dt, NORM: tl.constexpr):
    """Elements ``d`` of a head's row ``x`` (fp32 values of ``dt``) through ost.rms_norm with statistics
    ``rstd``: NORM 1 rounds x * rstd to ``dt`` and multiplies by ``weight + offset`` (rounded to ``dt``),
    HF's upcast form; NORM 2 multiplies by ``weight + offset`` in fp32 and rounds once (Gemma's)."""
    w = tl.load(w_ptr + d, mask=dmask, other=0.0).to(tl.float32)
    if NORM == 1:
        h = (x * rstd).to(dt).to(tl.float32)
        return (h * (w + offset).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    return (x * rstd * (w + offset)).to(dt).to(tl.float32)


@triton.jit
def _whole_rstd(ptr, h_stride, n_heads, d, dmask, eps, head_dim):
    """The RMSNorm statistics (1 / rms, fp32) of a row of ``n_heads`` heads ``h_stride`` apart, normed whole
    (OLMo 2's q and k): every program reads the whole row, a few kilobytes, rather than launch a norm."""
    acc = tl.zeros(d.shape, tl.float32)
    for g in range(0, n_heads):
        x = tl.load(ptr + g * h_stride + d, mask=dmask, other=0.0).to(tl.float32)
        acc += x * x
    return 1.0 / tl.sqrt(tl.sum(acc, axis=0) / (n_heads * head_dim) + eps)


@triton.jit
def _scaled(x, srow, b_ptr, p_ptr, d, dmask, dt, RBIAS: tl.constexpr, RSHIFT: tl.constexpr):
    """A row-scaled fp32 product's elements ``d``: plus the pre-scale bias (RSHIFT), times the row's statistic,
    plus the bias, rounded to dt."""
    if RSHIFT:
        x += tl.load(p_ptr + d, mask=dmask, other=0.0).to(tl.float32)
    x = x * srow
    if RBIAS:
        x += tl.load(b_ptr + d, mask=dmask, other=0.0).to(tl.float32)
    return x.to(dt).to(tl.float32)


@triton.jit
def _rope_row(ptr, d, dmask, rot, c_ptr, s_ptr, dt, w_ptr, eps, offset, head_dim, rstd, srow, b_ptr, p_ptr,
              ROPE: tl.constexpr, INTERLEAVED: tl.constexpr, NORM: tl.constexpr, WHOLE: tl.constexpr,
              WIDE: tl.constexpr, ROWSCALE: tl.constexpr, RBIAS: tl.constexpr, RSHIFT: tl.constexpr):
    """A head's row [BLOCK_D] (or [BLOCK_N, BLOCK_D], its rows reduced one by one) in fp32, through the
    head's RMSNorm (weight ``w_ptr``) when NORM (WHOLE: with the statistics ``rstd`` of the row of every
    head, the weight's slice for this head at ``w_ptr``), then its first ``rot`` dims (cos and sin that
    wide; the rest pass through) rotated as ost.rope's kernel does (each product rounded to ``dt``, then
    their sum) when ROPE; WIDE: the rope in fp32 (an fp32 cos over half rows, OLMo's and Cohere's) and
    its result rounded to ``dt`` once. ROWSCALE: the row is an fp32 product, first scaled by ``srow`` and
    rounded to ``dt`` (ost.row_scale; RBIAS: the head's bias at ``b_ptr`` added after the scale; RSHIFT: the
    head's pre-scale bias at ``p_ptr`` added before it)."""
    xn = tl.load(ptr + d, mask=dmask, other=0.0).to(tl.float32)
    if ROWSCALE:
        xn = _scaled(xn, srow, b_ptr, p_ptr, d, dmask, dt, RBIAS, RSHIFT)
    if NORM != 0:
        if not WHOLE:
            rstd = 1.0 / tl.sqrt(tl.sum(xn * xn, axis=-1, keep_dims=True) / head_dim + eps)
        xn = _normed(xn, w_ptr, d, dmask, rstd, offset, dt, NORM)
    if ROPE:
        rotated = dmask & (d < rot)
        half = rot // 2
        if INTERLEAVED:
            partner = tl.where(d < rot, d ^ 1, d)
            sign = tl.where(d % 2 == 0, -1.0, 1.0)
        else:
            partner = tl.where(d < half, d + half, tl.where(d < rot, d - half, d))
            sign = tl.where(d < half, -1.0, 1.0)
        xr = tl.load(ptr + partner, mask=dmask, other=0.0).to(tl.float32)
        if ROWSCALE:
            xr = _scaled(xr, srow, b_ptr, p_ptr, partner, dmask, dt, RBIAS, RSHIFT)
        if NORM != 0:
            xr = _normed(xr, w_ptr, partner, dmask, rstd, offset, dt, NORM)
        # past ``rot``: cos 1 and sin 0, so the row passes through unchanged
        c = tl.load(c_ptr + d, mask=rotated, other=1.0).to(tl.float32)
        s = tl.load(s_ptr + d, mask=rotated, other=0.0).to(tl.float32)
        if WIDE:
            xn = (xn * c + sign * xr * s).to(dt).to(tl.float32)
        else:
            a = (xn * c).to(dt).to(tl.float32)
            b = (sign * xr * s).to(dt).to(tl.float32)
            xn = (a + b).to(dt).to(tl.float32)
    return xn


@triton.jit
def decode_attention_kv_kernel(q_ptr, k_ptr, v_ptr, kc_ptr, vc_ptr, index_ptr, pos_ptr, cos_ptr, sin_ptr, mask_ptr,
                               qw_ptr, kw_ptr, rx_ptr, rs_ptr, qb_ptr, kb_ptr, vb_ptr, qp_ptr, kp_ptr, vp_ptr, out_ptr, head_dim, n_rep, hq, scale,
                               cap, ring, eps, w_offset,
                               rot, rx_sb, rx_n, row_eps,
                               q_sb, q_sh, k_sb, k_sh, v_sb, v_sh, cq_b, cq_h, sq_b, sq_h, ck_b, ck_h, sk_b, sk_h,
                               c_sb, c_sh, c_ss, o_sb, o_sh, pos_sb, m_sb, m_sh, m_sn,
                               n_keys: tl.constexpr, HAS_POS: tl.constexpr, MASK: tl.constexpr,
                               SOFTCAP: tl.constexpr, ROPE: tl.constexpr,
                               INTERLEAVED: tl.constexpr, RING: tl.constexpr, NORM: tl.constexpr,
                               WHOLE: tl.constexpr, WIDE: tl.constexpr, ROWSCALE: tl.constexpr, RBIAS: tl.constexpr,
                               RSHIFT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
    """One (batch, query head) of ost.decode_attention_ (ROWSCALE: q, k and v fp32 products scaled first by
    the RMSNorm statistic (ROWSCALE 1; 2: LayerNorm's) of batch row b of ``rx_ptr``, ``rx_n`` wide, ``row_eps``; every program reads its
    row, a few kilobytes, rather than launch a norm; RSHIFT: the statistic of that row plus ``rs_ptr``
    (``rx_n`` wide: a residual stream lagging its biases), and q's, k's and v's pre-scale biases qp_ptr, kp_ptr
    and vp_ptr (laid out as their biases) added to them before the scale; RBIAS: then plus their biases qb_ptr, kb_ptr and vb_ptr,
    [heads * head_dim] each): q and the step's key normalized (NORM: each head's
    RMSNorm, weights qw_ptr and kw_ptr; WHOLE: one RMSNorm over all heads of q's row, one over k's, weights
    that wide) and rotated in registers, the
    key and value rows written into the caches (batch, head and row strides c_sb, c_sh, c_ss; the head
    dim dense) by the first query
    head of each KV head, and softmax(softcap(q k^T * scale) + mask, keys j <= pos) v online over the cache. No
    program reads the slot being written: the step's key and value come from registers instead, so
    the write and the reads of other programs never race."""
    pid = tl.program_id(0).to(tl.int64)
    b = pid // hq
    h = pid % hq
    kvh = h // n_rep
    d = tl.arange(0, BLOCK_D)
    dmask = d < head_dim
    dt = kc_ptr.dtype.element_ty
    q_rstd = 1.0
    k_rstd = 1.0
    srow = 1.0
    if ROWSCALE:    # (norms.row_scale_kernel's statistic: not imported, a binary's cache key hashes one file)
        # LayerNorm's (2) in one pass, about the row's first element: var = mean(d^2) - mean(d)^2 with
        # d = x - x[0] loses at most n * fp32's epsilon relatively ((x[0] - mean)^2 <= n * var)
        pivot = 0.0
        if ROWSCALE == 2:
            pivot = tl.load(rx_ptr + b * rx_sb).to(tl.float32)
            if RSHIFT:
                pivot += tl.load(rs_ptr).to(tl.float32)
        racc = tl.zeros([BLOCK_R], tl.float32)
        rtot = tl.zeros([BLOCK_R], tl.float32)
        for r0 in range(0, rx_n, BLOCK_R):
            rr = r0 + tl.arange(0, BLOCK_R)
            xv = tl.load(rx_ptr + b * rx_sb + rr, mask=rr < rx_n, other=0.0).to(tl.float32)
            if RSHIFT:
                xv += tl.load(rs_ptr + rr, mask=rr < rx_n, other=0.0).to(tl.float32)
            if ROWSCALE == 2:
                xv = tl.where(rr < rx_n, xv - pivot, 0.0)
                rtot += xv
            racc += xv * xv
        rvar = tl.sum(racc, axis=0) / rx_n
        if ROWSCALE == 2:
            rmean = tl.sum(rtot, axis=0) / rx_n
            rvar = tl.maximum(rvar - rmean * rmean, 0.0)
        srow = 1.0 / tl.sqrt(rvar + row_eps)
    if WHOLE:
        q_rstd = _whole_rstd(q_ptr + b * q_sb, q_sh, hq, d, dmask, eps, head_dim)
        k_rstd = _whole_rstd(k_ptr + b * k_sb, k_sh, hq // n_rep, d, dmask, eps, head_dim)
    q = _rope_row(q_ptr + b * q_sb + h * q_sh, d, dmask, rot, cos_ptr + b * cq_b + h * cq_h,
                  sin_ptr + b * sq_b + h * sq_h, dt, qw_ptr + h * head_dim * WHOLE, eps, w_offset, head_dim,
                  q_rstd, srow, qb_ptr + h * head_dim, qp_ptr + h * head_dim, ROPE, INTERLEAVED, NORM, WHOLE, WIDE,
                  ROWSCALE, RBIAS, RSHIFT)
    # The step's key and value as row 0 of a [BLOCK_N, BLOCK_D] block (the other rows masked off), in
    # the cache blocks' layout from the load on: reduced as those blocks are. (Kept as 1-D rows, they
    # are replicated across warps, and converting them to the blocks' layout makes identical writes to
    # one shared-memory slot, which compute-sanitizer's racecheck reports as hazards.)
    first = tl.arange(0, BLOCK_N) == 0
    d2 = d[None, :] + 0 * first[:, None].to(tl.int32)
    m2 = first[:, None] & dmask[None, :]
    kn = _rope_row(k_ptr + b * k_sb + kvh * k_sh, d2, m2, rot, cos_ptr + b * ck_b + kvh * ck_h,
                   sin_ptr + b * sk_b + kvh * sk_h, dt, kw_ptr + kvh * head_dim * WHOLE, eps, w_offset, head_dim,
                   k_rstd, srow, kb_ptr + kvh * head_dim, kp_ptr + kvh * head_dim, ROPE, INTERLEAVED, NORM, WHOLE,
                   WIDE, ROWSCALE, RBIAS, RSHIFT).to(dt)
    vn = tl.load(v_ptr + b * v_sb + kvh * v_sh + d2, mask=m2, other=0.0)
    if ROWSCALE:
        vn = _scaled(vn.to(tl.float32), srow, vb_ptr + kvh * head_dim, vp_ptr + kvh * head_dim, d2, m2, dt, RBIAS,
                     RSHIFT)
    vn = vn.to(dt)
    slot = _slot(index_ptr, ring, n_keys, RING)
    if h % n_rep == 0:     # a slot outside the cache (eager's index_put raises) writes nothing
        inside = m2 & (slot >= 0) & (slot < n_keys)
        row = b * c_sb + kvh * c_sh + slot * c_ss + d2
        tl.store(kc_ptr + row, kn, mask=inside)
        tl.store(vc_ptr + row, vn, mask=inside)
    base = b * c_sb + kvh * c_sh
    mask_base = mask_ptr + b * m_sb + h * m_sh
    limit = _last_key(pos_ptr, b * pos_sb, 0, n_keys, HAS_POS, False)
    m, l, acc = _attend(q, kc_ptr + base, vc_ptr + base, c_ss, c_ss, d, dmask, limit, slot, scale, cap,
                        mask_base, m_sn, n_keys, MASK, SOFTCAP, BLOCK_N, BLOCK_D)
    # the step's own key, when the query sees its slot (its mask entry is the slot's)
    seen = first & (slot <= limit) & (slot >= 0) & (slot < n_keys)
    add, seen = _mask_row(seen, mask_base, m_sn, slot + 0 * tl.arange(0, BLOCK_N), MASK)
    s = _capped(tl.sum(kn.to(tl.float32) * q[None, :], axis=1) * scale, add, cap, SOFTCAP)
    m, l, acc = _online_softmax(m, l, acc, s, seen, vn.to(tl.float32))
    out = tl.where(l > 0, acc / l, 0.0)    # no visible key: 0, as torch's SDPA gives
    tl.store(out_ptr + b * o_sb + h * o_sh + d, out.to(out_ptr.dtype.element_ty), mask=dmask)
