"""RMSNorm and LayerNorm kernels: one program per row, statistics in fp32. Only Triton source: the
launchers (../norms.py) never import this module unless a kernel must be compiled."""
import triton
import triton.language as tl


@triton.jit
def _rms_scaled(x, w_ptr, cols, mask, n_cols, eps, w_offset, xdt, HAS_WEIGHT: tl.constexpr, UPCAST: tl.constexpr,
                W_FIRST: tl.constexpr):
    """x (fp32 values of dtype xdt) times rsqrt(mean(x**2) + eps), rounded where the reference
    (ir/fused_ops.rms_norm) rounds, times weight + w_offset; in fp32."""
    if UPCAST:   # HF's upcast form: statistics and the product in fp32, then x's dtype
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    else:        # the plain form works in x's dtype: squares, mean, + eps and rsqrt each rounded
        sq = (x * x).to(xdt).to(tl.float32)
        mean = (tl.sum(sq, axis=0) / n_cols).to(xdt).to(tl.float32)
        rstd = (1.0 / tl.sqrt((mean + eps).to(xdt).to(tl.float32))).to(xdt).to(tl.float32)
    h = x * rstd
    if W_FIRST:  # Gemma's form: the weight (+ offset) multiplies in fp32, the cast back comes last
        if HAS_WEIGHT:
            h = h * (tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) + w_offset)
    else:
        h = h.to(xdt).to(tl.float32)
        if HAS_WEIGHT:   # weight + offset rounded to the weight's dtype, as the model's add is
            w = tl.load(w_ptr + cols, mask=mask, other=0.0)
            h = h * (w.to(tl.float32) + w_offset).to(w.dtype).to(tl.float32)
    return h


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, out_ptr, n_cols, eps, w_offset, HAS_WEIGHT: tl.constexpr, UPCAST: tl.constexpr,
                    W_FIRST: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    h = _rms_scaled(x, w_ptr, cols, mask, n_cols, eps, w_offset, x_ptr.dtype.element_ty, HAS_WEIGHT, UPCAST,
                    W_FIRST)
    tl.store(out_ptr + row * n_cols + cols, h.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, sum_ptr, out_ptr, n_cols, eps, w_offset, HAS_WEIGHT: tl.constexpr,
                        UPCAST: tl.constexpr, W_FIRST: tl.constexpr, BLOCK: tl.constexpr):
    """sum = x + r, rounded to the sum's dtype as the reference's add rounds; then rms_norm on it."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    sdt = sum_ptr.dtype.element_ty
    s = (tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
         + tl.load(r_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)).to(sdt)
    tl.store(sum_ptr + row * n_cols + cols, s, mask=mask)
    h = _rms_scaled(s.to(tl.float32), w_ptr, cols, mask, n_cols, eps, w_offset, sdt, HAS_WEIGHT, UPCAST, W_FIRST)
    tl.store(out_ptr + row * n_cols + cols, h.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def layer_norm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, n_cols, eps, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                      BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    d = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / n_cols + eps)
    h = d * rstd
    if HAS_WEIGHT:
        h = h * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        h = h + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, h.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def row_scale_kernel(p_ptr, x_ptr, b_ptr, s_ptr, c_ptr, out_ptr, n_per_row, n_x, x_stride, eps, HAS_BIAS: tl.constexpr,
                     CENTER: tl.constexpr, HAS_SHIFT: tl.constexpr, BLOCK: tl.constexpr, BLOCK_X: tl.constexpr):
    """ost.row_scale: out[row, j] = p[row, j] * rsqrt(mean(x[row] ** 2) + eps) (+ b[j] when HAS_BIAS) in
    fp32, rounded to out's dtype, for rows of ``n_per_row`` dense elements (CENTER: LayerNorm's statistic,
    the mean of ``(x[row] - mean(x[row])) ** 2``; HAS_SHIFT: the statistic of ``x[row] + s``, ``n_x`` wide,
    and ``c[j]`` added to ``p`` before the scale).
    One program per row and block of BLOCK of its elements,
    each reading its row of x (``n_x`` wide, rows ``x_stride`` apart)."""
    row = tl.program_id(0).to(tl.int64)
    # (the attention kernel's ROWSCALE computes the same statistic: kernel sources import no other, as a
    # binary's cache key hashes its own file only)
    # CENTER in one pass about the row's first element (the attention kernel's: within n * fp32's epsilon)
    pivot = 0.0
    if CENTER:
        pivot = tl.load(x_ptr + row * x_stride).to(tl.float32)
        if HAS_SHIFT:
            pivot += tl.load(s_ptr).to(tl.float32)
    acc = tl.zeros([BLOCK_X], tl.float32)
    tot = tl.zeros([BLOCK_X], tl.float32)
    for r0 in range(0, n_x, BLOCK_X):
        r = r0 + tl.arange(0, BLOCK_X)
        v = tl.load(x_ptr + row * x_stride + r, mask=r < n_x, other=0.0).to(tl.float32)
        if HAS_SHIFT:
            v += tl.load(s_ptr + r, mask=r < n_x, other=0.0).to(tl.float32)
        if CENTER:
            v = tl.where(r < n_x, v - pivot, 0.0)
            tot += v
        acc += v * v
    var = tl.sum(acc, axis=0) / n_x
    if CENTER:
        mean = tl.sum(tot, axis=0) / n_x
        var = tl.maximum(var - mean * mean, 0.0)
    rstd = 1.0 / tl.sqrt(var + eps)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n_per_row
    p = tl.load(p_ptr + row * n_per_row + offs, mask=m, other=0.0).to(tl.float32)
    if HAS_SHIFT:
        p += tl.load(c_ptr + offs, mask=m, other=0.0).to(tl.float32)
    p = p * rstd
    if HAS_BIAS:
        p += tl.load(b_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_per_row + offs, p.to(out_ptr.dtype.element_ty), mask=m)
