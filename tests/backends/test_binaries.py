"""Compiled kernels as cached binaries: the launch type of each argument, and a second process that
finds the cubin in ostinato's disk tier without compiling, or importing Triton at all."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton", reason="Triton is a dev dependency: pip install -e '.[dev]'")

from ostinato.backends.cuda.binaries import BinaryMeta, binary_key, compile_binary, pack, unpack  # noqa: E402
from ostinato.backends.cuda.runtime import arg_type  # noqa: E402
from ostinato.errors import BackendError  # noqa: E402


def test_arg_types_carry_the_hints_triton_would_give():
    x = torch.randn(64)
    assert arg_type(x) == "*fp32:D"
    assert arg_type(x[1:]) == "*fp32"                 # 4 bytes past an aligned base
    assert arg_type(torch.zeros(3, dtype=torch.bfloat16)) == "*bf16:D"
    assert arg_type(48) == "i32:D" and arg_type(7) == "i32" and arg_type(-16) == "i32:D"
    assert arg_type(2**40) == "i64:D" and arg_type(2**31) == "i64:D" and arg_type(2**31 + 1) == "i64"
    assert arg_type(True) == "i1" and arg_type(1e-6) == "fp32" and arg_type(1) == "i32:1"
    with pytest.raises(BackendError, match="of type str"):
        arg_type("x")


def test_keys_differ_by_types_constexprs_and_arch():
    base = binary_key("norms", "rms_norm_kernel", ["*fp16:D"] * 3 + ["i32", "fp32"],
                      {"HAS_WEIGHT": True, "UPCAST": True, "BLOCK": 256}, 90)
    same = binary_key("norms", "rms_norm_kernel", ["*fp16:D"] * 3 + ["i32", "fp32"],
                      {"BLOCK": 256, "UPCAST": True, "HAS_WEIGHT": True}, 90)
    assert base.digest == same.digest
    for other in (binary_key("norms", "rms_norm_kernel", ["*fp16"] * 3 + ["i32", "fp32"],
                             {"HAS_WEIGHT": True, "UPCAST": True, "BLOCK": 256}, 90),
                  binary_key("norms", "rms_norm_kernel", ["*fp16:D"] * 3 + ["i32", "fp32"],
                             {"HAS_WEIGHT": True, "UPCAST": True, "BLOCK": 512}, 90),
                  binary_key("norms", "rms_norm_kernel", ["*fp16:D"] * 3 + ["i32", "fp32"],
                             {"HAS_WEIGHT": True, "UPCAST": True, "BLOCK": 256}, 80)):
        assert other.digest != base.digest


def test_pack_round_trip_and_wrong_argument_count():
    meta = BinaryMeta("k", 4, 128, "OOif" + "OO")
    got_meta, got = unpack(pack(meta, b"\x7fELF-bytes"))
    assert got_meta == meta and got == b"\x7fELF-bytes"
    with pytest.raises(BackendError, match=r"rms_norm_kernel takes 6 runtime arguments \(x_ptr, w_ptr, out_ptr"):
        compile_binary("norms", "rms_norm_kernel", ["*fp32:D"] * 3, {"HAS_WEIGHT": True, "UPCAST": False,
                                                                      "W_FIRST": False, "BLOCK": 64}, 90)
    with pytest.raises(BackendError, match="no value for constexpr BLOCK"):
        compile_binary("norms", "rms_norm_kernel", ["*fp32:D"] * 3 + ["i32", "fp32", "fp32"],
                       {"HAS_WEIGHT": True, "UPCAST": False, "W_FIRST": False}, 90)


CHILD = r"""
import json, sys
from ostinato.backends.cuda.binaries import get_binary
import ostinato.cache as oc
meta, cubin, origin = get_binary("norms", "rms_norm_kernel",
                                 ["*fp16:D", "*fp16:D", "*fp16:D", "i32:D", "fp32", "fp32"],
                                 {"HAS_WEIGHT": True, "UPCAST": True, "W_FIRST": False, "BLOCK": 256}, 90)
print(json.dumps({"origin": origin, "disk": oc.stats()["disk"], "cubin": len(cubin), "name": meta.name,
                  "triton_imported": "triton" in sys.modules}))
"""


def _run(cache_dir: str) -> dict:
    env = dict(os.environ, OSTINATO_CACHE_DIR=cache_dir)
    p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_second_process_reads_the_cubin_without_triton(tmp_path):
    cold = _run(str(tmp_path / "ost"))
    assert cold["origin"] == "compiled" and cold["triton_imported"] and cold["disk"]["puts"] == 1
    assert cold["name"] == "rms_norm_kernel" and cold["cubin"] > 1000
    warm = _run(str(tmp_path / "ost"))
    assert warm["origin"] == "cache" and warm["disk"]["hits"] == 1 and warm["disk"]["puts"] == 0, warm
    assert not warm["triton_imported"], "a warm process must not import Triton"
    assert warm["cubin"] == cold["cubin"]


def test_an_int_of_one_is_compiled_in_and_not_passed():
    types = ["*fp32:D", "*fp32:D", "*fp32:D", "i32", "fp32", "fp32"]
    flags = {"HAS_WEIGHT": True, "UPCAST": False, "W_FIRST": False, "BLOCK": 64}
    meta, _ = compile_binary("norms", "rms_norm_kernel", types, flags, 90)
    one, _ = compile_binary("norms", "rms_norm_kernel", types[:3] + ["i32:1", "fp32", "fp32"], flags, 90)
    assert meta.arg_types.startswith("OOOif") and one.arg_types.startswith("OOOf")
    assert len(one.arg_types) == len(meta.arg_types) - 1
