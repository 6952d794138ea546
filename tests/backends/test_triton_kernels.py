"""Triton kernels of the CUDA backend: compiled for sm_90 here (no GPU needed), checked against each
op's reference in Triton's interpreter on the CPU (fp32, fp16), and on the GPU (fp32, fp16, bf16)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_cases import CASES, cases_for, check  # noqa: E402

triton = pytest.importorskip("triton", reason="Triton is a dev dependency: pip install -e '.[dev]'")

HERE = os.path.dirname(os.path.abspath(__file__))


def _compile_specs():
    from ostinato.backends.cuda.kernels.source import attention, elementwise, moe, norms
    ptr = lambda dt: f"*{dt}"  # noqa: E731
    specs = []
    for dt in ("fp32", "fp16", "bf16"):
        specs += [
            ("rms_norm", norms.rms_norm_kernel,
             {"x_ptr": ptr(dt), "w_ptr": ptr(dt), "out_ptr": ptr(dt), "n_cols": "i32", "eps": "fp32",
              "w_offset": "fp32", "HAS_WEIGHT": "constexpr", "UPCAST": "constexpr", "W_FIRST": "constexpr",
              "BLOCK": "constexpr"},
             {"HAS_WEIGHT": True, "UPCAST": dt != "fp32", "W_FIRST": False, "BLOCK": 128}),
            ("add_rms_norm", norms.add_rms_norm_kernel,
             {"x_ptr": ptr(dt), "r_ptr": ptr(dt), "w_ptr": ptr(dt), "sum_ptr": ptr(dt), "out_ptr": ptr(dt),
              "n_cols": "i32", "eps": "fp32", "w_offset": "fp32", "HAS_WEIGHT": "constexpr", "UPCAST": "constexpr",
              "W_FIRST": "constexpr", "BLOCK": "constexpr"},
             {"HAS_WEIGHT": True, "UPCAST": True, "W_FIRST": dt != "fp32", "BLOCK": 256}),
            ("row_scale", norms.row_scale_kernel,
             {"p_ptr": "*fp32", "x_ptr": ptr(dt), "b_ptr": ptr(dt), "s_ptr": "*fp32", "c_ptr": "*fp32",
              "out_ptr": ptr(dt),
              "n_per_row": "i32", "n_x": "i32", "x_stride": "i32", "eps": "fp32", "HAS_BIAS": "constexpr",
              "CENTER": "constexpr", "HAS_SHIFT": "constexpr", "BLOCK": "constexpr", "BLOCK_X": "constexpr"},
             {"HAS_BIAS": dt != "fp32", "CENTER": dt != "fp16", "HAS_SHIFT": dt != "bf16", "BLOCK": 1024,
              "BLOCK_X": 4096}),
            ("layer_norm", norms.layer_norm_kernel,
             {"x_ptr": ptr(dt), "w_ptr": ptr(dt), "b_ptr": ptr(dt), "out_ptr": ptr(dt), "n_cols": "i32",
              "eps": "fp32", "HAS_WEIGHT": "constexpr", "HAS_BIAS": "constexpr", "BLOCK": "constexpr"},
             {"HAS_WEIGHT": True, "HAS_BIAS": True, "BLOCK": 256}),
            ("gated", elementwise.gated_kernel,
             {"gate_ptr": ptr(dt), "up_ptr": ptr(dt), "out_ptr": ptr(dt), "n": "i32", "cols": "i32",
              "gate_stride": "i32", "up_stride": "i32", "ACT": "constexpr", "BLOCK": "constexpr"}, {"ACT": 2, "BLOCK": 1024}),
            ("bias_act", elementwise.bias_act_kernel,
             {"h_ptr": ptr(dt), "b_ptr": ptr(dt), "out_ptr": ptr(dt), "n": "i32", "cols": "i32",
              "HAS_BIAS": "constexpr", "ACT": "constexpr", "BLOCK": "constexpr"},
             {"HAS_BIAS": True, "ACT": 4, "BLOCK": 1024}),
            ("rope", elementwise.rope_kernel,
             {"x_ptr": ptr(dt), "cos_ptr": ptr(dt), "sin_ptr": ptr(dt), "out_ptr": ptr(dt), "n_rows": "i32",
              "n_cols": "i32", "d1": "i32", "d2": "i32", "x0": "i32", "x1": "i32", "x2": "i32", "c0": "i32", "c1": "i32",
              "c2": "i32", "s0": "i32", "s1": "i32", "s2": "i32", "INTERLEAVED": "constexpr", "ROWS": "constexpr",
              "BLOCK": "constexpr"}, {"INTERLEAVED": False, "ROWS": 16, "BLOCK": 128}),
            ("kv_update", attention.kv_update_kernel,
             {"cache_ptr": ptr(dt), "new_ptr": ptr(dt), "index_ptr": "*i64", "n_slots": "i32", "n_new": "i32",
              "inner": "i32", "ring": "i32", "outer2": "i32", "new_s1": "i32", "new_s2": "i32", "new_sj": "i32",
              "RING": "constexpr", "BLOCK": "constexpr"}, {"RING": True, "BLOCK": 128}),
            ("decode_attention", attention.decode_attention_kernel,
             {"q_ptr": ptr(dt), "k_ptr": ptr(dt), "v_ptr": ptr(dt), "pos_ptr": "*i64", "mask_ptr": "*i1",
              "out_ptr": ptr(dt), "head_dim": "i32", "n_rep": "i32", "hq": "i32", "n_q": "i32", "scale": "fp32",
              "cap": "fp32",
              **{k: "i32" for k in ("q_sb", "q_sh", "q_st", "k_sb", "k_sh", "k_ss", "v_sb", "v_sh", "v_ss", "o_sb",
                                     "o_sh", "o_st", "pos_sb", "pos_st", "m_sb", "m_sh", "m_st", "m_sn")},
              "n_keys": "constexpr", "HAS_POS": "constexpr", "CAUSAL": "constexpr", "MASK": "constexpr",
              "SOFTCAP": "constexpr", "BLOCK_N": "constexpr", "BLOCK_D": "constexpr"},
             {"n_keys": 4096, "HAS_POS": True, "CAUSAL": dt != "fp32", "MASK": 2, "SOFTCAP": True, "BLOCK_N": 64,
              "BLOCK_D": 64}),
            ("decode_attention_kv", attention.decode_attention_kv_kernel,
             {**{k: ptr(dt) for k in ("q_ptr", "k_ptr", "v_ptr", "kc_ptr", "vc_ptr")}, "index_ptr": "*i64",
              "pos_ptr": "*i64", "cos_ptr": ptr(dt), "sin_ptr": ptr(dt), "mask_ptr": ptr(dt), "qw_ptr": ptr(dt),
              "kw_ptr": ptr(dt), "rx_ptr": ptr(dt), "rs_ptr": "*fp32", "qb_ptr": ptr(dt), "kb_ptr": ptr(dt),
              "vb_ptr": ptr(dt), "qp_ptr": "*fp32", "kp_ptr": "*fp32", "vp_ptr": "*fp32", "out_ptr": ptr(dt), "head_dim": "i32", "n_rep": "i32", "hq": "i32",
              "scale": "fp32", "cap": "fp32", "ring": "i32", "eps": "fp32", "w_offset": "fp32", "rot": "i32",
              "rx_sb": "i32", "rx_n": "i32", "row_eps": "fp32",
              **{k: "i32" for k in ("q_sb", "q_sh", "k_sb", "k_sh", "v_sb", "v_sh", "cq_b", "cq_h", "sq_b", "sq_h",
                                     "ck_b", "ck_h", "sk_b", "sk_h", "c_sb", "c_sh", "c_ss", "o_sb", "o_sh", "pos_sb",
                                     "m_sb", "m_sh", "m_sn")},
              **{k: "constexpr" for k in ("n_keys", "HAS_POS", "MASK", "SOFTCAP", "ROPE", "INTERLEAVED", "RING",
                                          "NORM", "WHOLE", "WIDE", "ROWSCALE", "RBIAS", "RSHIFT", "BLOCK_N", "BLOCK_D",
                                          "BLOCK_R")}},
             {"n_keys": 4096, "HAS_POS": True, "MASK": 1, "SOFTCAP": dt != "fp16", "ROPE": True, "INTERLEAVED": dt == "fp16",
              "RING": dt == "fp32", "NORM": {"fp32": 0, "fp16": 1, "bf16": 2}[dt], "WHOLE": dt == "bf16",
              "WIDE": dt != "fp16", "ROWSCALE": {"fp32": 1, "fp16": 2, "bf16": 0}[dt], "RBIAS": dt == "fp16", "RSHIFT": dt != "bf16",
              "BLOCK_N": 64, "BLOCK_D": 128, "BLOCK_R": 1024}),
            ("moe_up", moe.moe_up_kernel,
             {"x_ptr": ptr(dt), "logits_ptr": ptr(dt), "w_ptr": ptr(dt), "out_ptr": ptr(dt), "ids_ptr": "*i64",
              **{k: "i32" for k in ("n_experts", "k_dim", "n_inter", "x_stride", "w_se", "w_sn")},
              **{k: "constexpr" for k in ("ROUTE", "TOPK", "ACT", "BLOCK_E", "BLOCK_TOPK", "BLOCK_N", "BLOCK_K")}},
             {"ROUTE": {"fp32": 0, "fp16": 2, "bf16": 1}[dt], "TOPK": 2, "ACT": int(dt == "fp16"), "BLOCK_E": 8, "BLOCK_TOPK": 2,
              "BLOCK_N": 16, "BLOCK_K": 256}),
            ("moe_down", moe.moe_down_kernel,
             {"h_ptr": ptr(dt), "ids_ptr": "*i64", "logits_ptr": ptr(dt), "w_ptr": ptr(dt), "out_ptr": ptr(dt),
              **{k: "i32" for k in ("n_experts", "k_dim", "n_out", "w_se", "w_sn")},
              **{k: ptr(dt) for k in ("g_ptr", "u_ptr", "ws_ptr", "sl_ptr")},
              **{k: "i32" for k in ("k_shared", "g_stride", "u_stride", "ws_stride", "sl_stride")},
              **{k: "constexpr" for k in ("ROUTE", "TOPK", "NORMALIZE", "WEIGHT_ROUND", "PRODUCT_ROUND", "SHARED",
                                          "SHARED_ACT", "BLOCK_E", "BLOCK_TOPK", "BLOCK_N", "BLOCK_K")}},
             {"ROUTE": {"fp32": 2, "fp16": 0, "bf16": 1}[dt], "TOPK": 8, "NORMALIZE": dt != "fp32",
              "WEIGHT_ROUND": dt == "bf16", "PRODUCT_ROUND": dt != "fp32",
              "SHARED": {"fp32": 0, "fp16": 1, "bf16": 2}[dt], "SHARED_ACT": int(dt == "fp16"), "BLOCK_E": 128,
              "BLOCK_TOPK": 8, "BLOCK_N": 8, "BLOCK_K": 512}),
        ]
        if dt == "fp32":
            continue        # the grouped kernels multiply fp16/bf16 operands with tl.dot
        specs += [
            ("moe_up_grouped", moe.moe_up_grouped_kernel,
             {"x_ptr": ptr(dt), "logits_ptr": ptr(dt), "w_ptr": ptr(dt), "out_ptr": ptr(dt), "ids_ptr": "*i64",
              **{k: "i32" for k in ("n_tokens", "n_experts", "k_dim", "n_inter", "x_stride", "w_se", "w_sn")},
              **{k: "constexpr" for k in ("ROUTE", "TOPK", "ACT", "BLOCK_T", "BLOCK_E", "BLOCK_N", "BLOCK_K")}},
             {"ROUTE": {"fp16": 2, "bf16": 1}[dt], "TOPK": 8, "ACT": int(dt == "fp16"), "BLOCK_T": 32, "BLOCK_E": 128,
              "BLOCK_N": 64, "BLOCK_K": 128}),
            ("moe_down_grouped", moe.moe_down_grouped_kernel,
             {"h_ptr": ptr(dt), "ids_ptr": "*i64", "logits_ptr": ptr(dt), "w_ptr": ptr(dt), "out_ptr": ptr(dt),
              **{k: "i32" for k in ("n_tokens", "n_experts", "k_dim", "n_out", "w_se", "w_sn")},
              **{k: ptr(dt) for k in ("g_ptr", "u_ptr", "ws_ptr", "sl_ptr")},
              **{k: "i32" for k in ("k_shared", "g_stride", "u_stride", "ws_stride", "sl_stride")},
              "part_ptr": "*fp32", "cnt_ptr": "*i32",
              **{k: "constexpr" for k in ("ROUTE", "TOPK", "NORMALIZE", "WEIGHT_ROUND", "PRODUCT_ROUND", "SHARED",
                                          "SHARED_ACT", "NSPLIT", "BLOCK_T", "BLOCK_E", "BLOCK_TOPK", "BLOCK_N",
                                          "BLOCK_K", "BLOCK_KS")}},
             {"ROUTE": {"fp16": 0, "bf16": 2}[dt], "TOPK": 4, "NORMALIZE": True, "WEIGHT_ROUND": dt == "bf16",
              "PRODUCT_ROUND": True, "SHARED": {"fp16": 1, "bf16": 2}[dt], "SHARED_ACT": int(dt == "fp16"),
              "NSPLIT": {"fp16": 1, "bf16": 4}[dt], "BLOCK_T": 64, "BLOCK_E": 64, "BLOCK_TOPK": 4, "BLOCK_N": 16,
              "BLOCK_K": 256, "BLOCK_KS": 64}),
        ]
    return [pytest.param(fn, sig, const, id=f"{name}-{sig[next(iter(sig))][1:]}") for name, fn, sig, const in specs]


@pytest.mark.parametrize("fn, signature, constexprs", _compile_specs())
def test_kernel_compiles_for_sm90(fn, signature, constexprs):
    """Through the backend's own compile path (explicit signature, alignment hints on the pointers): a
    cubin for sm_90 whose launch types are the runtime parameters plus Triton's scratch pointers."""
    from ostinato.backends.cuda.binaries import compile_binary
    runtime = [t + (":D" if t.startswith("*") else "") for t in signature.values() if t != "constexpr"]
    module = fn.fn.__module__.rsplit(".", 1)[-1]
    meta, cubin = compile_binary(module, fn.__name__, runtime, constexprs, 90)
    assert cubin[:4] == b"\x7fELF", f"{fn.__name__}: no cubin produced"
    assert meta.name == fn.__name__ and meta.num_warps >= 1
    letters = meta.arg_types
    assert letters[:len(runtime)] == "".join("O" if t.startswith("*") else ("f" if t == "fp32" else "i")
                                             for t in runtime)
    assert set(letters[len(runtime):]) <= {"O"} and len(letters) - len(runtime) <= 2


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_kernels_in_the_interpreter_match_their_references(dtype):
    """Every case of the table, run by Triton's interpreter on CPU tensors (bf16 is wrong there)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = subprocess.run([sys.executable, os.path.join(HERE, "kernel_cases.py"), dtype], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-4000:]
    results = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(results) == len(cases_for(getattr(torch, dtype)))
    failed = [r for r in results if not r["ok"]]
    assert not failed, f"{dtype}: kernels differ from their references: {failed}"


@pytest.mark.cuda
@pytest.mark.parametrize("case, dtype", [
    pytest.param(c, dt, id=f"{c.op}-{c.name}-{name}")
    for c in CASES for dt, name in ((torch.float32, "f32"), (torch.float16, "f16"), (torch.bfloat16, "bf16"))
    if c.dtypes is None or dt in c.dtypes])
def test_kernel_on_gpu_matches_reference(case, dtype):
    ok, detail = check(case, dtype, "cuda")
    assert ok, f"{case.op} {case.name} {dtype}: {detail}"


def test_guard_bands_catch_a_write_and_a_read_outside_the_tensor():
    """The bounds check of the kernel table can fail: a write one element past a guarded tensor changes
    its band, a read past it brings the sentinel (NaN) into the result; an in-bounds write does neither."""
    from kernel_cases import guarded, guards_intact
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 7, generator=g)
    (gx, idx), bands = guarded((x.t(), torch.tensor([1, 2])))
    assert torch.equal(gx, x.t()) and gx.stride() == x.t().stride() and torch.equal(idx, torch.tensor([1, 2]))
    gx.mul_(2.0)
    assert guards_intact(bands) is None
    span = gx.as_strided((36,), (1,), gx.storage_offset())      # 35 elements, and the one past them
    assert torch.isnan(span[35]), "a read past the tensor does not see the sentinel"
    span[35] = 0.0
    assert "argument 0" in guards_intact(bands)


def test_decode_attention_plan_takes_sequence_major_caches():
    """The fused decode kernel's plan takes contiguous [B, S, H, D] caches written on dim 1 (the kernel's
    row stride is then H * D), not such caches transposed from head-major ones, nor a layout whose
    q does not match the caches'."""
    from ostinato.backends.cuda.kernels.attention import _fused_decode_plan
    cache, q, k = torch.zeros(2, 40, 2, 24), torch.zeros(2, 1, 4, 24), torch.zeros(2, 1, 2, 24)
    index = torch.tensor([3])
    assert _fused_decode_plan(cache, cache.clone(), q, k, k.clone(), index, 1, None, None, None, 2, None) is not None
    strided = torch.zeros(2, 2, 40, 24).transpose(1, 2)
    assert _fused_decode_plan(strided, strided, q, k, k, index, 1, None, None, None, 2, None) is None
    assert _fused_decode_plan(cache, cache, q.transpose(1, 2), k, k, index, 1, None, None, None, 2, None) is None
    assert _fused_decode_plan(cache, cache, q, k, k, index, 2, None, None, None, 2, None) is None


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_row_scaled_decode_attention_takes_the_kernel(dtype):
    """Each row-scaled case of the table (q, k and v fp32 products of a folded norm: passes/fold_norms.py),
    the heads' norms in the caches' dtype included, plans the fused kernel rather than the reference (the
    interpreter's comparison would pass either way); q in the caches' dtype with a row scale does not."""
    from kernel_cases import CASES as TABLE
    from ostinato.backends.cuda.kernels.attention import _biases_fit, _fused_decode_plan, _norm_plan
    cases = [c for c in TABLE if c.name.startswith("row-scaled")]
    assert len(cases) == 10
    for case in cases:
        args, _ = case.make(torch.Generator().manual_seed(0), dtype, "cpu")
        kc, vc, q, k, v, index, dim, _, cos, sin, _, q_pos, _, n_rep, mask = args[:15]
        qn, kn, _, ndt, _, first, rotary, wide, row_x = args[16:25]
        assert _norm_plan(q, k, qn, kn, ndt, first, kc.dtype) is not None, case.name
        assert _fused_decode_plan(kc, vc, q, k, v, index, dim, cos, sin, q_pos, n_rep, mask, qn is not None, rotary,
                                  wide, row_x) is not None, case.name
        assert _fused_decode_plan(kc, vc, q.to(dtype), k, v, index, dim, cos, sin, q_pos, n_rep, mask,
                                  qn is not None, rotary, wide, row_x) is None, case.name
        if len(args) > 26 and args[26] is not None:     # q's, k's and v's biases: one per element of each's row
            assert _biases_fit(args[26], (q, k, v)), case.name
            assert not _biases_fit(args[26][::-1], (q, k, v)), case.name
        if len(args) > 29:      # a lagging stream's shift, and q's, k's and v's pre-scale biases: the kernel's too
            assert args[28].shape == row_x.shape[-1:] and _biases_fit(args[29], (q, k, v)), case.name


_FEW_FINITE = r"""
import json, torch
from ostinato.backends.cuda.kernels import moe
from ostinato.ir import fused_ops
g = torch.Generator().manual_seed(0)
out = {}
for tokens in (1, 10):                    # the per-choice kernel, then the grouped one
    x = torch.randn(tokens, 40, generator=g).half()
    logits = torch.randn(tokens, 6, generator=g).half()
    logits[:, 1::2] = float("-inf")       # 3 finite scores a token, top 5 (GraniteMoe's top-k first)
    w = (torch.randn(6, 2 * 24, 40, generator=g) * 0.2).half()
    h, ids = moe.moe_up(x, logits, w, 5, torch.float32, "silu", True)
    rows = torch.bmm(w[ids].float(), x.repeat_interleave(5, 0).float().unsqueeze(-1)).squeeze(-1).half()
    expected = fused_ops.swiglu_packed(rows)
    out[tokens] = {"ids": ids.view(tokens, 5).tolist(), "err": (h.float() - expected.float()).abs().max().item()}
print(json.dumps(out))
"""


def test_routing_with_fewer_finite_scores_than_choices_never_repeats_an_expert():
    """GraniteMoe-style top-k of logits where a token has fewer finite scores than choices: both up kernels
    choose the finite experts first, then the lowest ids not yet taken (never one twice: a repeated choice
    left a row of the result and its id unwritten), and every row is its choice's product."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = subprocess.run([sys.executable, "-c", _FEW_FINITE], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    for tokens, r in json.loads(p.stdout.strip().splitlines()[-1]).items():
        for choice in r["ids"]:
            assert sorted(choice[:3]) == [0, 2, 4] and choice[3:] == [1, 3], (tokens, choice)
        assert r["err"] <= 1e-2, (tokens, r["err"])
