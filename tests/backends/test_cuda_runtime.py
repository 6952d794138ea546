"""The CUDA runtime primitives that need no GPU to check: kernels by name and specialization, errors
that name the kernel, bounds-checked copies, and the switch back to the references."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason="Triton is a dev dependency: pip install -e '.[dev]'")

from ostinato.backends.cuda.runtime import KernelLibrary, checked_copy  # noqa: E402
from ostinato.errors import BackendError  # noqa: E402


def test_library_creates_each_specialization_once():
    lib = KernelLibrary("norms", {"rms_norm": "rms_norm_kernel"})
    a = lib.kernel("rms_norm", HAS_WEIGHT=True, UPCAST=False, BLOCK=128)
    assert lib.kernel("rms_norm", BLOCK=128, UPCAST=False, HAS_WEIGHT=True) is a
    assert lib.kernel("rms_norm", HAS_WEIGHT=False, UPCAST=False, BLOCK=128) is not a
    assert len(lib) == 2
    with pytest.raises(BackendError, match="no Triton kernel named 'nope' in norms; known: rms_norm"):
        lib.kernel("nope")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the failure a machine without a GPU gives")
def test_a_failed_launch_names_the_kernel_and_its_specialization():
    from ostinato.backends.cuda.kernels.norms import LIBRARY
    x = torch.randn(2, 8)
    k = LIBRARY.kernel("rms_norm", HAS_WEIGHT=False, UPCAST=False, BLOCK=8)
    with pytest.raises(BackendError, match=r"Triton kernel rms_norm \[HAS_WEIGHT=False, UPCAST=False, BLOCK=8\]"):
        k(x, x, torch.empty_like(x), 8, 1e-6, grid=(2,))
    assert k.launches == 0


def test_checked_copy():
    dst = torch.zeros(2, 3)
    src = torch.randn(6)
    assert checked_copy(dst, src) is dst and torch.equal(dst.flatten(), src)
    with pytest.raises(BackendError, match=r"copy of torch.float32\[5\] into torch.float32\[2, 3\]"):
        checked_copy(dst, torch.randn(5))
    with pytest.raises(BackendError, match="sizes or dtypes differ"):
        checked_copy(dst, torch.randn(6).double())


def test_reference_switch(monkeypatch):
    from ostinato.backends.cuda import ops
    ops.triton_kernels.cache_clear()
    try:
        assert "ost.rms_norm" in ops.triton_kernels()
        ops.triton_kernels.cache_clear()
        monkeypatch.setenv("OSTINATO_CUDA_REFERENCE", "1")
        assert ops.triton_kernels() == {}
    finally:
        ops.triton_kernels.cache_clear()


def test_jit_switch_is_read_from_the_environment():
    import subprocess
    import sys
    code = "import ostinato.backends.cuda.runtime as r; print(r._FORCE_JIT)"
    for value, want in (("1", "True"), ("0", "False")):
        env = {**__import__("os").environ, "OSTINATO_TRITON_JIT": value}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == want


def test_a_kernel_loads_its_binary_once_per_device(monkeypatch):
    """A loaded binary belongs to one GPU's context: a kernel called on two devices loads one binary on
    each (the compiled cubin is shared through the cache), and each device's launches use its own."""
    from ostinato.backends.cuda import runtime
    loaded, lookups = [], []

    class FakeBinary:
        def __init__(self, meta, cubin, index, types):
            self.index = index
            loaded.append(index)

    monkeypatch.setattr(runtime, "LoadedBinary", FakeBinary)
    monkeypatch.setattr(runtime, "cached_binary", lambda *a: lookups.append(a[-1]) or ("meta", b"cubin"))
    monkeypatch.setattr(runtime.torch.cuda, "get_device_capability", lambda index: (9, 0))
    kernel = runtime.KernelLibrary("norms", {"rms_norm": "rms_norm_kernel"}).kernel("rms_norm", BLOCK=128)
    types = ("*fp32", "i32")
    a0 = kernel._binary(types, torch.device("cuda", 0))
    a1 = kernel._binary(types, torch.device("cuda", 1))
    assert (a0.index, a1.index) == (0, 1) and a0 is not a1
    assert kernel._binary(types, torch.device("cuda", 0)) is a0 and kernel._binary(types, torch.device("cuda", 1)) is a1
    assert loaded == [0, 1] and lookups == [90, 90]
