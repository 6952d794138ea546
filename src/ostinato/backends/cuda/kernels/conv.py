"""Depthwise 2-D convolutions over NCHW (one group per input channel) as one Triton kernel.

Over NCHW, torch runs a bf16/fp32 depthwise convolution in its own CUDA kernel (cuDNN only takes the
channels-last form and some fp16 shapes): about 22 us for conv-stack's 8x64x64x64 bf16 3x3 on an H100, a
fifth of the memory bandwidth, where cuDNN's NHWC kernel takes 6.6. The convolutions that stay NCHW
(backends/cuda/layout.py keeps those before a narrow group norm there) run this kernel instead: a tile
of one output plane per program, every tap read through the input's strides.

Only stride 1 (any kernel size, padding, dilation): measured on an H100 in bf16 (bench/depthwise.py,
microseconds per call, torch's NCHW kernel / this kernel): conv-stack 8x64x64x64 3x3 21.1 / 6.9,
1x64x64x64 3.8 / 2.2, MobileNetV3's 32x240x14x14 5x5 28.7 / 23.7, ConvNeXt's 32x96x56x56 7x7 334 / 203;
at stride 2 torch's was faster on MobileNetV3's 32x72x56x56 (18.5 / 23.3).
"""
from __future__ import annotations

import os

import torch

from ..runtime import KernelLibrary
from .common import cdiv

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_TILE = 512        # output elements per program (8x64 beat 16x64 by 1.3x on conv-stack, H100)


def enabled() -> bool:
    """OSTINATO_DEPTHWISE_KERNEL=0 leaves every depthwise convolution to torch (the A/B switch)."""
    return os.environ.get("OSTINATO_DEPTHWISE_KERNEL", "1") != "0"


def takes(x: torch.Tensor, weight: torch.Tensor, stride, transposed: bool, groups: int) -> bool:
    """Whether the kernel runs this convolution: 2-D, stride 1, not transposed, one group per input
    channel, a float dtype shared by input and weight."""
    return (x.dim() == 4 and weight.dim() == 4 and not transposed and tuple(stride) == (1, 1) and x.dtype in _DTYPES
            and weight.dtype == x.dtype and groups == x.shape[1] and groups > 0
            and weight.shape[1] == 1 and weight.shape[0] % groups == 0)


def _tile(oh: int, ow: int) -> tuple[int, int]:
    bw = min(1 << max(ow - 1, 0).bit_length(), 128)
    bh = min(max(_TILE // bw, 1), 1 << max(oh - 1, 0).bit_length())
    return bh, bw


def _out_size(size: int, k: int, stride: int, pad: int, dil: int) -> int:
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def depthwise_conv2d(x, weight, bias, stride, padding, dilation, transposed=False, output_padding=(0, 0),
                     groups=1):
    """``aten.convolution``'s arguments for a convolution ``takes`` accepts: its result, dense NCHW."""
    n, c, h, w = x.shape
    c_out, _, kh, kw = weight.shape
    sh, sw = stride
    ph, pw = padding
    dh, dw = dilation
    oh, ow = _out_size(h, kh, sh, ph, dh), _out_size(w, kw, sw, pw, dw)
    out = torch.empty((n, c_out, oh, ow), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    weight = weight.contiguous()
    bh, bw = _tile(oh, ow)
    LIBRARY.kernel("depthwise_conv2d", KH=kh, KW=kw, HAS_BIAS=bias is not None, BLOCK_H=bh, BLOCK_W=bw)(
        x, weight, weight if bias is None else bias, out, c_out, c_out // c, h, w, oh, ow, *x.stride(),
        sh, sw, ph, pw, dh, dw, grid=(n * c_out, cdiv(oh, bh), cdiv(ow, bw)))
    return out


LIBRARY = KernelLibrary("conv", {"depthwise_conv2d": "depthwise_conv2d_kernel"})
