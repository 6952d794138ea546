"""Triton kernels compiled through ostinato's cache: a second compile in a fresh process, with an
empty Triton directory, reads the binary from ostinato's disk tier instead of compiling."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason="Triton is a dev dependency: pip install -e '.[dev]'")

CHILD = r"""
import json, os, time
from ostinato.backends.cuda.kernel_cache import install
assert install()
import ostinato.cache as oc
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ostinato.backends.cuda.kernels import norms
sig = {"x_ptr": "*fp16", "w_ptr": "*fp16", "out_ptr": "*fp16", "n_cols": "i32", "eps": "fp32",
       "HAS_WEIGHT": "constexpr", "UPCAST": "constexpr", "BLOCK": "constexpr"}
t0 = time.perf_counter()
k = triton.compile(ASTSource(fn=norms.rms_norm_kernel, signature=sig,
                             constexprs={"HAS_WEIGHT": True, "UPCAST": True, "BLOCK": 256}),
                   target=GPUTarget("cuda", 90, 32))
print(json.dumps({"seconds": time.perf_counter() - t0, "disk": oc.stats()["disk"],
                  "cubin": len(k.asm["cubin"])}))
"""


def _run(cache_dir: str, triton_dir: str) -> dict:
    env = dict(os.environ, OSTINATO_CACHE_DIR=cache_dir, TRITON_CACHE_DIR=triton_dir)
    env.pop("TRITON_CACHE_MANAGER", None)
    p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_second_process_loads_the_kernel_from_ostinato_cache(tmp_path):
    cold = _run(str(tmp_path / "ost"), str(tmp_path / "triton1"))
    assert cold["disk"]["puts"] >= 2 and cold["disk"]["hits"] == 0 and cold["cubin"] > 0
    warm = _run(str(tmp_path / "ost"), str(tmp_path / "triton2"))   # empty Triton directory
    assert warm["disk"]["hits"] >= 2 and warm["disk"]["puts"] == 0, warm
    assert warm["cubin"] == cold["cubin"]


PLAIN = r"""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ostinato.backends.cuda.kernels import norms
sig = {"x_ptr": "*fp16", "w_ptr": "*fp16", "out_ptr": "*fp16", "n_cols": "i32", "eps": "fp32",
       "HAS_WEIGHT": "constexpr", "UPCAST": "constexpr", "BLOCK": "constexpr"}
k = triton.compile(ASTSource(fn=norms.rms_norm_kernel, signature=sig,
                             constexprs={"HAS_WEIGHT": True, "UPCAST": True, "BLOCK": 256}),
                   target=GPUTarget("cuda", 90, 32))
print(len(k.asm["cubin"]))
"""


def test_plain_triton_still_reads_its_directory_after_ostinato(tmp_path):
    """A process using Triton without ostinato, sharing Triton's directory with one that used
    ostinato's cache, compiles as before (ostinato's files live in a subfolder of their own)."""
    triton_dir = str(tmp_path / "triton")
    _run(str(tmp_path / "ost"), triton_dir)
    env = dict(os.environ, TRITON_CACHE_DIR=triton_dir)
    env.pop("TRITON_CACHE_MANAGER", None)
    for _ in range(2):   # compile, then read back what the plain file cache wrote
        p = subprocess.run([sys.executable, "-c", PLAIN], env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        assert int(p.stdout.strip().splitlines()[-1]) > 0
    assert os.path.isdir(os.path.join(triton_dir, "ostinato"))
