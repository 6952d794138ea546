"""The depthwise convolution kernel (backends/cuda/kernels/conv.py): compiled for sm_90 here, checked
against torch's convolution in Triton's interpreter on CPU tensors (fp32, fp16) and on the GPU (fp32,
fp16, bf16), each tensor between guard bands (kernel_cases.guarded) so a read or write outside it shows.

Run as a script (``python tests/backends/test_depthwise_conv.py float32``, with TRITON_INTERPRET=1) it
prints one JSON list of results, as kernel_cases.py does.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from kernel_cases import guarded, guards_intact  # noqa: E402

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}

# (name, input shape, channel multiplier, kernel (kh, kw), stride, padding, dilation, bias, input layout)
CASES = [
    ("3x3-pad1", (2, 5, 9, 11), 1, (3, 3), (1, 1), (1, 1), (1, 1), True, "nchw"),
    ("3x3-nobias", (1, 3, 8, 8), 1, (3, 3), (1, 1), (1, 1), (1, 1), False, "nchw"),
    ("5x5-stride2", (2, 4, 13, 10), 1, (5, 5), (2, 2), (2, 2), (1, 1), True, "nchw"),
    ("7x7-pad3-wide", (1, 2, 6, 140), 1, (7, 7), (1, 1), (3, 3), (1, 1), True, "nchw"),
    ("1x3-asym", (2, 3, 7, 9), 1, (1, 3), (1, 2), (0, 1), (1, 1), True, "nchw"),
    ("dilated", (1, 4, 12, 12), 1, (3, 3), (1, 1), (2, 2), (2, 2), True, "nchw"),
    ("multiplier2", (2, 3, 7, 7), 2, (3, 3), (1, 1), (1, 1), (1, 1), True, "nchw"),
    ("nopad-stride3", (1, 2, 11, 11), 1, (3, 3), (3, 3), (0, 0), (1, 1), False, "nchw"),
    ("channels-last-input", (2, 6, 5, 7), 1, (3, 3), (1, 1), (1, 1), (1, 1), True, "nhwc"),
    ("channel-slice-input", (2, 4, 6, 6), 1, (3, 3), (1, 1), (1, 1), (1, 1), True, "slice"),
    ("tall-plane", (1, 1, 300, 5), 1, (3, 3), (1, 1), (1, 1), (1, 1), True, "nchw"),
]


def _inputs(case, dtype, device, seed=0):
    name, shape, mult, (kh, kw), stride, padding, dilation, bias, layout = case
    g = torch.Generator().manual_seed(seed)
    n, c, h, w = shape
    if layout == "slice":            # every other channel of a wider tensor: a strided channel dim
        x = torch.randn(n, 2 * c, h, w, generator=g).to(dtype)[:, ::2]
    else:
        x = torch.randn(shape, generator=g).to(dtype)
        if layout == "nhwc":
            x = x.contiguous(memory_format=torch.channels_last)
    wt = (torch.randn(c * mult, 1, kh, kw, generator=g) / (kh * kw) ** 0.5).to(dtype)
    b = torch.randn(c * mult, generator=g).to(dtype) if bias else None
    x, wt = x.to(device), wt.to(device)
    return x, wt, (b.to(device) if b is not None else None), list(stride), list(padding), list(dilation), c


def check(case, dtype, device) -> tuple[bool, str]:
    from ostinato.backends.cuda.kernels import conv
    x, wt, b, stride, padding, dilation, groups = _inputs(case, dtype, device)
    assert conv.takes(x, wt, stride, False, groups) == (stride == [1, 1])
    ref = F.conv2d(x.float(), wt.float(), None if b is None else b.float(), stride, padding, dilation, groups)
    (gx, gw, *gb), bands = guarded((x, wt) + ((b,) if b is not None else ()))
    got = conv.depthwise_conv2d(gx, gw, gb[0] if gb else None, stride, padding, dilation, False, [0, 0], groups)
    broken = guards_intact(bands)
    if broken:
        return False, broken
    if got.shape != ref.shape or got.dtype != dtype or not got.is_contiguous():
        return False, f"result {got.dtype}{list(got.shape)} vs {dtype}{list(ref.shape)} (contiguous {got.is_contiguous()})"
    err = (got.float() - ref).abs().max().item()
    ok = torch.allclose(got.float(), ref, rtol=TOL[dtype], atol=TOL[dtype])
    return ok, f"max |kernel - fp32 conv| = {err:.3g}"


def test_kernel_compiles_for_sm90():
    """Through the backend's compile path, in each dtype, with and without bias."""
    pytest.importorskip("triton", reason="Triton is a dev dependency: pip install -e '.[dev]'")
    from ostinato.backends.cuda.binaries import compile_binary
    for dt, bias in (("fp32", True), ("fp16", False), ("bf16", True)):
        types = [f"*{dt}:D"] * 4 + ["i32"] * 16
        meta, cubin = compile_binary("conv", "depthwise_conv2d_kernel", types,
                                     {"KH": 3, "KW": 3, "HAS_BIAS": bias, "BLOCK_H": 16, "BLOCK_W": 64}, 90)
        assert cubin[:4] == b"\x7fELF" and meta.name == "depthwise_conv2d_kernel"


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_kernel_in_the_interpreter_matches_torch(dtype):
    pytest.importorskip("triton", reason="Triton is a dev dependency: pip install -e '.[dev]'")
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = subprocess.run([sys.executable, os.path.abspath(__file__), dtype], env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    results = json.loads(p.stdout.strip().splitlines()[-1])
    assert [r["name"] for r in results] == [c[0] for c in CASES]
    failed = [r for r in results if not r["ok"]]
    assert not failed, f"{dtype}: the kernel differs from torch's convolution: {failed}"


def test_a_wrong_tap_is_caught():
    """The check can fail: the reference with one weight changed differs beyond the tolerance."""
    x, wt, b, stride, padding, dilation, groups = _inputs(CASES[0], torch.float32, "cpu")
    ref = F.conv2d(x, wt, b, stride, padding, dilation, groups)
    bad = wt.clone()
    bad[0, 0, 1, 1] += 0.5
    assert not torch.allclose(F.conv2d(x, bad, b, stride, padding, dilation, groups), ref, rtol=1e-5, atol=1e-5)


def test_takes_only_depthwise_convolutions():
    from ostinato.backends.cuda.kernels import conv
    x = torch.randn(1, 4, 5, 5)
    assert conv.takes(x, torch.randn(4, 1, 3, 3), [1, 1], False, 4)
    assert conv.takes(x, torch.randn(8, 1, 3, 3), (1, 1), False, 4)                    # two outputs per channel
    assert not conv.takes(x, torch.randn(4, 2, 3, 3), [1, 1], False, 2)                # grouped, not depthwise
    assert not conv.takes(x, torch.randn(4, 4, 3, 3), [1, 1], False, 1)                # dense
    assert not conv.takes(x, torch.randn(4, 1, 3, 3), [1, 1], True, 4)                 # transposed
    assert not conv.takes(x.double(), torch.randn(4, 1, 3, 3).double(), [1, 1], False, 4)
    assert not conv.takes(x[0], torch.randn(4, 1, 3), [1], False, 4)               # 1-D
    assert not conv.takes(x, torch.randn(4, 1, 3, 3), [2, 2], False, 4)            # strided: torch's is faster


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_kernel_on_gpu_matches_torch(case, dtype):
    ok, detail = check(case, dtype, "cuda")
    assert ok, f"{case[0]} {dtype}: {detail}"


@pytest.mark.cuda
def test_library_op_runs_the_kernel_and_switch_turns_it_off(monkeypatch):
    """aten.convolution on CUDA: NCHW depthwise runs the Triton kernel (its launch count grows), the
    channels-last form and OSTINATO_DEPTHWISE_KERNEL=0 run torch's; all three match."""
    from ostinato.backends.cuda import library_ops
    from ostinato.backends.cuda.kernels import conv
    from ostinato.backends.cuda.runtime import awaiting_compiles
    x, wt, b, stride, padding, dilation, groups = _inputs(CASES[0], torch.bfloat16, "cuda")
    ref = F.conv2d(x, wt, b, stride, padding, dilation, groups)
    kernel = conv.LIBRARY.kernel("depthwise_conv2d", KH=3, KW=3, HAS_BIAS=True, BLOCK_H=16, BLOCK_W=16)
    assert conv._tile(9, 11) == (16, 16)
    before = kernel.launches
    with awaiting_compiles():
        got = library_ops.convolution(x, wt, b, stride, padding, dilation, False, [0, 0], groups)
    assert kernel.launches == before + 1
    assert torch.allclose(got.float(), ref.float(), rtol=2e-2, atol=2e-2)
    nhwc = library_ops.convolution(x, wt, b, stride, padding, dilation, False, [0, 0], groups,
                                   memory_format=torch.channels_last)
    monkeypatch.setenv("OSTINATO_DEPTHWISE_KERNEL", "0")
    off = library_ops.convolution(x, wt, b, stride, padding, dilation, False, [0, 0], groups)
    assert kernel.launches == before + 1
    for t in (nhwc, off):
        assert torch.allclose(t.float(), ref.float(), rtol=2e-2, atol=2e-2)


def main() -> None:
    dtype = getattr(torch, sys.argv[1])
    out = []
    for case in CASES:
        try:
            ok, detail = check(case, dtype, "cpu")
        except Exception as e:  # noqa: BLE001 - reported per case, the test names it
            ok, detail = False, f"raised {type(e).__name__}: {str(e)[-300:]}"
        out.append({"name": case[0], "ok": ok, "detail": detail})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
