"""Library ops on CUDA (cuBLAS matmuls, cuDNN convolutions, top-k) through the op-level graph cache.

What a call needs decided is decided once per (op, shapes, dtypes, strides, flags) and kept in
``op_graph_cache`` (bounded, locked, counted; ``ostinato.cache.stats()["op_graph"]``):

- matmuls: whether each operand goes to cuBLAS as it is (row- or column-major: cuBLAS transposes for
  free) or must be made dense first (a linear's batch of transposed matrices too: one GEMM then), whether a batched product whose second operand is broadcast
  over the batch (stride 0) folds into one 2-D GEMM instead of a strided-batched one;
- convolution: the memory format it runs in (NHWC when the lowering asks for it or the input is
  channels-last already, so cuDNN takes its tensor-core path without converting back and forth) with
  the weight converted once and kept; a patch embedding (kernel = stride) as one matrix product;
- top-k: k == 1 runs as a max/min reduction instead of a selection.

Every function takes the ATen op's arguments and returns what the op returns.
"""
from __future__ import annotations

import math
import os
import weakref
from dataclasses import dataclass

import torch

from ...cache.op_cache import OpGraphCache, op_graph_cache, op_key
from .kernels import conv as depthwise
from .runtime import deferring

aten = torch.ops.aten


def _layout(t: torch.Tensor) -> str:
    """How cuBLAS can take a matrix (the last two dims): "dense", "transposed" or "copy"."""
    if t.dim() < 2:
        return "dense"
    s0, s1 = t.stride(-2), t.stride(-1)
    rows, cols = t.shape[-2], t.shape[-1]
    if s1 == 1 and (s0 >= max(cols, 1) or rows <= 1):
        return "dense"
    if s0 == 1 and (s1 >= max(rows, 1) or cols <= 1):
        return "transposed"
    return "copy"


@dataclass(frozen=True)
class MatmulPlan:
    copy_a: bool          # an operand neither row- nor column-major is made dense first
    copy_b: bool
    fold_batch: bool      # [B, M, K] @ [K, N] broadcast over B: one [B*M, K] @ [K, N] GEMM


def _matmul_plan(a: torch.Tensor, b: torch.Tensor, batched: bool) -> MatmulPlan:
    fold = (batched and b.stride(0) == 0 and a.shape[0] > 1 and _layout(a) == "dense" and a.is_contiguous())
    return MatmulPlan(_layout(a) == "copy", _layout(b) == "copy", fold)


def _linear_plan(x: torch.Tensor, weight: torch.Tensor) -> MatmulPlan:
    """As a matmul's, and an input of more than two dims whose leading dims cannot fold into the rows of
    one matrix is made dense first: torch would run it as a batch of small transposed GEMMs (Mamba's
    x_proj and out_proj on [B, L, D] views of [B, D, L] tensors: cuBLAS's 32x32 fp32 tiles, 45 us each
    against 28 after a copy of 2 on an H100)."""
    plan = _matmul_plan(x, weight, False)
    if x.dim() > 2 and not plan.copy_a and math.prod(x.shape[:-2]) > 1 and x.shape[-2] > 1:
        try:
            flat = x.view(-1, x.shape[-1])
        except RuntimeError:
            flat = None
        if flat is None or _layout(flat) == "copy":
            plan = MatmulPlan(True, plan.copy_b, plan.fold_batch)
    return plan


def _operands(plan: MatmulPlan, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (a.contiguous() if plan.copy_a else a), (b.contiguous() if plan.copy_b else b)


def _outer(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a matmul of ``a`` and ``b`` is an outer product (K = 1: each result one product, no
    sum) that a broadcast multiply gives bit for bit: floating operands, and fp32 ones only where
    torch's matmuls are not allowed TF32 (cuBLAS would round their inputs first). Such a product (the
    rotary tables' ``inv_freq @ positions``) then needs no cuBLAS call, whose first use in a process
    costs about 0.1-0.2 s of library set-up on the compile's path (constant folding runs it)."""
    return (a.shape[-1] == 1 and a.dtype == b.dtype and a.dtype.is_floating_point
            and (a.dtype != torch.float32 or torch.get_float32_matmul_precision() == "highest"))


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if _outer(a, b):
        return torch.mul(a, b)
    plan = op_graph_cache.get(op_key("aten.mm", a, b), lambda: _matmul_plan(a, b, False))
    return aten.mm(*_operands(plan, a, b))


def addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta=1, alpha=1) -> torch.Tensor:
    plan = op_graph_cache.get(op_key("aten.addmm", bias, a, b, beta=beta, alpha=alpha),
                              lambda: _matmul_plan(a, b, False))
    a, b = _operands(plan, a, b)
    return aten.addmm(bias, a, b, beta=beta, alpha=alpha)


def bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if _outer(a, b):
        return torch.mul(a, b)
    plan = op_graph_cache.get(op_key("aten.bmm", a, b), lambda: _matmul_plan(a, b, True))
    if plan.fold_batch:
        B, M, K = a.shape
        return aten.mm(a.reshape(B * M, K), b[0]).view(B, M, b.shape[-1])
    return aten.bmm(*_operands(plan, a, b))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    args = (x, weight) if bias is None else (x, weight, bias)
    plan = op_graph_cache.get(op_key("aten.linear", *args), lambda: _linear_plan(x, weight))
    x, weight = _operands(plan, x, weight)
    return aten.linear(x, weight, bias)


@dataclass(frozen=True)
class ConvPlan:
    memory_format: torch.memory_format
    depthwise: bool = False    # an NCHW depthwise convolution: kernels/conv.py's Triton kernel runs it
    patches: bool = False      # a patch embedding run as one matrix product (patch_conv)


def patch_gemm_enabled() -> bool:
    """OSTINATO_PATCH_GEMM=0 leaves patch embeddings to cuDNN (the A/B switch)."""
    return os.environ.get("OSTINATO_PATCH_GEMM", "1") != "0"


def is_patch_conv(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation, transposed: bool,
                  groups: int) -> bool:
    """A 2-D convolution over non-overlapping patches that tile its input (a ViT's or DiT's patch
    embedding: kernel = stride > 1, no padding, one group)."""
    if x.dim() != 4 or weight.dim() != 4 or transposed or groups != 1:
        return False
    kh, kw = weight.shape[-2:]
    return (tuple(stride) == (kh, kw) and kh * kw > 1 and tuple(padding) == (0, 0)
            and tuple(dilation) == (1, 1) and x.shape[-2] % kh == 0 and x.shape[-1] % kw == 0)


def patch_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, channels_last: bool) -> torch.Tensor:
    """is_patch_conv's convolution as one matrix product: each patch one row (NHWC: ``x`` and ``weight``
    channels-last, the result channels-last as cuDNN's NHWC convolution gives it) or one column of a
    batch's [C * kh * kw, patches] matrix (NCHW: the result dense NCHW, as torch's convolution gives it).
    cuDNN's first convolution sets the library up (0.089 s in a profiled warm DiT process on an H200); the
    product goes through cuBLAS, which the model's projections set up anyway."""
    b, c, h, w = x.shape
    out_ch, _, kh, kw = weight.shape
    hp, wp = h // kh, w // kw
    if channels_last:
        rows = x.permute(0, 2, 3, 1).reshape(b, hp, kh, wp, kw, c).permute(0, 1, 3, 2, 4, 5)
        rows = rows.reshape(b * hp * wp, kh * kw * c)
        wm = weight.permute(0, 2, 3, 1).reshape(out_ch, kh * kw * c)
        y = torch.mm(rows, wm.t()) if bias is None else torch.addmm(bias, rows, wm.t())
        return y.view(b, hp, wp, out_ch).permute(0, 3, 1, 2)
    cols = x.reshape(b, c, hp, kh, wp, kw).permute(0, 1, 3, 5, 2, 4).reshape(b, c * kh * kw, hp * wp)
    wm = weight.reshape(out_ch, c * kh * kw).expand(b, out_ch, c * kh * kw)
    y = torch.bmm(wm, cols) if bias is None else torch.baddbmm(bias.view(1, out_ch, 1), wm, cols)
    return y.view(b, out_ch, hp, wp)


# Weights converted to a memory format, by (storage address, version, layout, format), each entry holding
# a weak reference to the weight it was made from: an address is reused once a tensor is freed (another
# model's weight of the same shape may land there), so an entry counts only for the very tensor it was
# made from, and goes when that tensor does. A new version of a weight is converted again; the least
# recently used entries go past 512.
prepared_weights = OpGraphCache(capacity=512)


def _prepared_weight(w: torch.Tensor, fmt: torch.memory_format) -> torch.Tensor:
    key = (w.data_ptr(), w._version, w.shape, w.stride(), w.dtype, w.get_device(), fmt)

    def prepare():
        weakref.finalize(w, prepared_weights.drop, key)
        return weakref.ref(w), w.contiguous(memory_format=fmt)

    return prepared_weights.get(key, prepare, valid=lambda entry: entry[0]() is w)[1]


def _conv_plan(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation, transposed: bool, groups: int,
               fmt: torch.memory_format | None) -> ConvPlan:
    nhwc = x.dim() == 4 and not transposed and (
        fmt is torch.channels_last or (not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)))
    patches = patch_gemm_enabled() and x.dtype == weight.dtype and weight.is_contiguous() \
        and is_patch_conv(x, weight, stride, padding, dilation, transposed, groups)
    if nhwc:
        return ConvPlan(torch.channels_last, patches=patches)
    from .ops import triton_kernels
    return ConvPlan(torch.contiguous_format, x.is_cuda and depthwise.enabled() and bool(triton_kernels())
                    and depthwise.takes(x, weight, stride, transposed, groups), patches=patches)


# kernels/conv.py's launcher, running torch's convolution while its kernel compiles (a cold cache)
_depthwise = deferring(depthwise.depthwise_conv2d, aten.convolution)


def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups, *,
                memory_format: torch.memory_format | None = None):
    """``aten.convolution``; ``memory_format=torch.channels_last`` (the lowering's choice for fp16/bf16,
    backends/cuda/layout.py) runs it NHWC, converting an input that is not channels-last yet; a depthwise
    one left NCHW runs kernels/conv.py's kernel (``OSTINATO_DEPTHWISE_KERNEL=0``: torch's)."""
    plan = op_graph_cache.get(
        op_key("aten.convolution", x, weight, transposed=transposed, groups=groups, stride=tuple(stride),
               padding=tuple(padding), dilation=tuple(dilation), fmt=memory_format, dw=depthwise.enabled(),
               patches=patch_gemm_enabled()),
        lambda: _conv_plan(x, weight, stride, padding, dilation, transposed, groups, memory_format))
    if plan.depthwise:
        return _depthwise(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    if plan.memory_format is torch.channels_last:
        weight = _prepared_weight(weight, torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
        if plan.patches:
            return patch_conv(x, weight, bias, True)
    elif plan.patches:
        return patch_conv(x, weight, bias, False)
    return aten.convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups)


@dataclass(frozen=True)
class TopkPlan:
    reduce: bool   # k == 1: a max/min reduction


def topk(x: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):
    plan = op_graph_cache.get(op_key("aten.topk", x, k=k, dim=dim, largest=largest),
                              lambda: TopkPlan(k == 1 and x.dim() > 0 and x.shape[dim] > 0))
    if plan.reduce:
        values, indices = (torch.max if largest else torch.min)(x, dim, keepdim=True)
        return values, indices
    return aten.topk(x, k, dim, largest, sorted)


LIBRARY_OPS = {"aten.mm": mm, "aten.addmm": addmm, "aten.bmm": bmm, "aten.linear": linear,
               "aten.convolution": convolution, "aten.topk": topk}
