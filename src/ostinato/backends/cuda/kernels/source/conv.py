"""Depthwise 2-D convolution over NCHW. Only Triton source: the launcher (../conv.py) never imports this
module unless a kernel must be compiled."""
import triton
import triton.language as tl


@triton.jit
def depthwise_conv2d_kernel(x_ptr, w_ptr, b_ptr, out_ptr, n_out_ch, mult, H, W, OH, OW,
                            sxn, sxc, sxh, sxw, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w,
                            KH: tl.constexpr, KW: tl.constexpr, HAS_BIAS: tl.constexpr,
                            BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    """One [BLOCK_H, BLOCK_W] tile of one output plane (n, co) per program: out channel co reads input
    channel co // mult (``mult`` output channels per group), at input strides (sxn, sxc, sxh, sxw); the
    weight is [C_out, 1, KH, KW] dense, the output dense NCHW. As torch's depthwise kernel: the bias
    first, then every tap in fp32, rounded once to the output's dtype."""
    plane = tl.program_id(0)
    n = plane // n_out_ch
    co = plane % n_out_ch
    ci = co // mult
    oh = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)[:, None]
    ow = tl.program_id(2) * BLOCK_W + tl.arange(0, BLOCK_W)[None, :]
    inside = (oh < OH) & (ow < OW)
    base = x_ptr + n.to(tl.int64) * sxn + ci.to(tl.int64) * sxc
    acc = tl.zeros([BLOCK_H, BLOCK_W], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(b_ptr + co).to(tl.float32)
    for kh in tl.static_range(KH):
        ih = oh * stride_h - pad_h + kh * dil_h
        row_ok = inside & (ih >= 0) & (ih < H)
        for kw in tl.static_range(KW):
            iw = ow * stride_w - pad_w + kw * dil_w
            v = tl.load(base + ih * sxh + iw * sxw, mask=row_ok & (iw >= 0) & (iw < W), other=0.0)
            acc += v.to(tl.float32) * tl.load(w_ptr + co * (KH * KW) + kh * KW + kw).to(tl.float32)
    tl.store(out_ptr + plane.to(tl.int64) * OH * OW + oh * OW + ow, acc.to(out_ptr.dtype.element_ty), mask=inside)
