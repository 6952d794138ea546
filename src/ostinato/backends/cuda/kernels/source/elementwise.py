"""Gated activations, rotary embeddings and the linear epilogue. Only Triton source: the
launchers (../elementwise.py) never import this module unless a kernel must be compiled."""
import triton
import triton.language as tl


@triton.jit
def _gelu(g, TANH: tl.constexpr):
    if TANH:
        inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        t = 2.0 * tl.sigmoid(2.0 * inner) - 1.0
        return 0.5 * g * (1.0 + t)
    return 0.5 * g * (1.0 + tl.erf(g * 0.7071067811865476))


@triton.jit
def gated_kernel(gate_ptr, up_ptr, out_ptr, n, cols, gate_stride, up_stride, ACT: tl.constexpr, BLOCK: tl.constexpr):
    """out[r, c] = act(gate[r, c]) * up[r, c]; ``gate_stride`` and ``up_stride`` are the row strides of
    gate and up (cols for dense tensors, 2 * cols for one packed projection or the slices of a packed
    sibling projection, up then starting at gate + cols); out is dense."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    r = offs // cols
    c = offs % cols
    g = tl.load(gate_ptr + r * gate_stride + c, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + r * up_stride + c, mask=mask, other=0.0).to(tl.float32)
    if ACT == 0:
        a = g * tl.sigmoid(g)
    elif ACT == 1:
        a = _gelu(g, False)
    else:
        a = _gelu(g, True)
    # The reference rounds the activation to the tensor's dtype before the product.
    a = a.to(out_ptr.dtype.element_ty).to(tl.float32)
    tl.store(out_ptr + offs, (a * u).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, n_rows, n_cols, d1, d2, x0, x1, x2, c0, c1, c2, s0, s1, s2,
                INTERLEAVED: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """ROWS rows of x ([d0, d1, d2, n_cols], rows at strides x0, x1, x2, the last dim dense; a head view
    of a packed projection needs no copy); cos/sin read through broadcast strides; out is dense."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    i2 = row % d2
    i1 = (row // d2) % d1
    i0 = row // (d1 * d2)
    x_row = x_ptr + i0 * x0 + i1 * x1 + i2 * x2
    cos_row = cos_ptr + i0 * c0 + i1 * c1 + i2 * c2
    sin_row = sin_ptr + i0 * s0 + i1 * s1 + i2 * s2
    cols = tl.arange(0, BLOCK)[None, :]
    mask = (cols < n_cols) & (row < n_rows)
    half = n_cols // 2
    if INTERLEAVED:   # pairs (2i, 2i+1): rotate = (-x[2i+1], x[2i])
        partner = cols ^ 1
        sign = tl.where(cols % 2 == 0, -1.0, 1.0)
    else:             # pairs (i, i + d/2): rotate = cat(-x2, x1)
        partner = tl.where(cols < half, cols + half, cols - half)
        sign = tl.where(cols < half, -1.0, 1.0)
    x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
    xr = tl.load(x_row + partner, mask=mask, other=0.0).to(tl.float32)
    c = tl.load(cos_row + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(sin_row + cols, mask=mask, other=0.0).to(tl.float32)
    dt = out_ptr.dtype.element_ty
    # Rounded as the reference's products are (each in the tensors' dtype), then summed.
    a = (x * c).to(dt).to(tl.float32)
    b = (sign * xr * s).to(dt).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (a + b).to(dt), mask=mask)


@triton.jit
def bias_act_kernel(h_ptr, b_ptr, out_ptr, n, cols, HAS_BIAS: tl.constexpr, ACT: tl.constexpr,
                    BLOCK: tl.constexpr):
    """out = act(h + bias) over rows of ``cols``: the epilogue a GEMM without one leaves to do."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    h = tl.load(h_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        h = h + tl.load(b_ptr + offs % cols, mask=mask, other=0.0).to(tl.float32)
    if ACT == 1:
        h = tl.maximum(h, 0.0)
    elif ACT == 2:
        h = h * tl.sigmoid(h)
    elif ACT == 3:
        h = _gelu(h, False)
    elif ACT == 4:
        h = _gelu(h, True)
    tl.store(out_ptr + offs, h.to(out_ptr.dtype.element_ty), mask=mask)
