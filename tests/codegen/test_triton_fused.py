"""Generated fusion kernels: run in Triton's interpreter on CPU tensors against eager (fp32, fp16), and
compiled for sm_90 (no GPU needed) in every variant the launcher picks."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import ostinato
from ostinato.passes import DEFAULT_PIPELINE, GENERIC_PIPELINE

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fusion_backend import fused_executable  # noqa: E402
from fusion_models import CASES  # noqa: E402

pytest.importorskip("triton", reason="Triton is a dev dependency: pip install -e '.[dev]'")

HERE = os.path.dirname(os.path.abspath(__file__))


def _interpret(what: str, dtype: str, **env_vars: str) -> dict:
    """Run interpret_cases.py in a subprocess: Triton must be imported with TRITON_INTERPRET=1 set (its
    own @triton.jit helpers, tl.sigmoid among them, are made interpreted at import)."""
    env = dict(os.environ, TRITON_INTERPRET="1", **env_vars)
    p = subprocess.run([sys.executable, os.path.join(HERE, "interpret_cases.py"), what, dtype], env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _keep_ttgir(monkeypatch) -> list[str]:
    """The TTGIR of every kernel triton.compile makes from now on (in this test), in order."""
    import triton
    ttgir: list[str] = []
    real = triton.compile

    def keep_ir(*a, **k):
        c = real(*a, **k)
        ttgir.append(c.asm["ttgir"])
        return c
    monkeypatch.setattr(triton, "compile", keep_ir)
    return ttgir


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_interpreted_kernels_match_eager(dtype):
    results = _interpret("zoo", dtype)
    assert set(results) == {c.name for c in CASES}
    failed = {k: v for k, v in results.items() if v != "ok"}
    assert not failed, failed


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_interpreted_scan_steps(dtype):
    """A Mamba-style scan (passes/matvec.py): each token's state update and its product with C (a small
    matvec, rewritten as a multiply and a sum) are one generated kernel, and the scan matches eager."""
    assert _interpret("scan", dtype) == {"scan": "ok"}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_interpreted_conv_layouts(dtype):
    """A conv net (stem, residual block, GroupNorm, attention over pixels, upsampling, depthwise conv,
    pixel shuffle) lowered as on CUDA: fp16 convolutions channels-last with the layout handed from conv
    to conv through the generated kernels, fp32 ones left as they are; outputs contiguous and as eager's."""
    assert _interpret("layout", dtype) == {"conv_net": "ok"}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_interpreted_matmul_groups(dtype):
    """Matmul groups (a norm before the projection, packed slices gated after it, bias + GELU, a
    residual add) at 1, 3 and 16 rows: the generated GEMV kernels match eager."""
    results = _interpret("linear", dtype)
    assert results == {"decoder_rows1": "ok", "decoder_rows3": "ok", "decoder_rows16": "ok",
                       "conv1d_rows1": "ok", "conv1d_rows5": "ok", "packed_silu_rows1": "ok", "packed_gelu_rows3": "ok",
                       "lone_rows1": "ok", "lone_long_k": "ok",
                       "bias_gelu_head": "ok", "bias_gelu_head_patterns": "ok"}, results


@pytest.mark.parametrize("knobs", [{}, {"OSTINATO_DOT_STATS_STAGES": "3", "OSTINATO_DOT_STAGES": "4",
                                       "OSTINATO_DOT_RBLOCK": "32", "OSTINATO_DOT_XBLOCK": "64"},
                                   {"OSTINATO_DOT_SPLIT": "4", "OSTINATO_DOT_RBLOCK": "16"}])
def test_interpreted_dot_matmul_groups(knobs):
    """Matmul groups past 16 rows (17, 32, 48, 64) in fp16, the tl.dot kernel: a decoder layer (an RMSNorm
    before q/k/v gated pointwise, the output projection with the residual, an RMSNorm before gate/up with
    SwiGLU, the biased down projection with the residual), GPT-2's Conv1D block (weights stored [K, N]),
    a packed gate_up projection gated over its halves and lone projections; against eager on inputs from
    a seeded generator. Also with the sweep's knobs: pipelined statistics loops (``tl.range``), a set
    pipeline depth, K in steps of 32 (several steps over these short rows) and 64-row tiles; and K split
    four ways (partials, the last program to arrive adds them and runs the epilogue). (bf16 is not exact
    in Triton's interpreter: compiled for sm_90 below.)"""
    results = _interpret("linear_dot", "float16", **knobs)
    expected = [f"{case}_rows{m}" for case in ("decoder", "conv1d") for m in (17, 32, 48, 64)]
    assert results == {k: "ok" for k in expected + ["packed_silu_rows48", "lone_rows32"]}, results


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_interpreted_dot_pick_matmul_groups(dtype):
    """OSTINATO_DOT_PICK=prologue at 17, 32 and 48 rows: a decoder layer with Llama's proportions keeps two
    matmul groups, RMSNorm + q/k/v + their gating and SwiGLU + down + bias + residual (o and gate/up
    cuBLAS's), and a batch-32 transformers Llama over two decode steps add + RMSNorm + q/k/v (the sum
    stored for the next add) and SwiGLU + down each layer; both on the tl.dot kernel, against eager. In
    fp32 no projection moves (the same cases, everything cuBLAS's)."""
    results = _interpret("linear_pick", dtype)
    assert results == {k: "ok" for k in ("decoder_rows17", "decoder_rows32", "decoder_rows48", "llama_b32")}, results


def test_interpreted_tiled_matmul_groups():
    """With OSTINATO_TILED_LINEAR=1, matmul groups past 128 rows (129, 130, 200, 300, 392) in fp16, the
    tl.dot kernel tiled over blocks of rows: a decoder layer's projections with their norms and
    epilogues, GPT-2's Conv1D block, a packed gate_up projection with GeGLU, ConvNeXt's block (LayerNorm
    -> projection -> GELU in one kernel); lone projections stay cuBLAS calls. Each with the row-stationary
    kernel (K up to 256 in one tile, one program per row block walking the column blocks) and with the
    K-loop one (OSTINATO_TILED_KLOOP=1). Against eager on inputs from a seeded generator."""
    results = _interpret("linear_tiled", "float16")
    expected = [f"{case}_{kind}" for case in ("decoder_rows129", "decoder_rows300", "conv1d_rows300", "packed_gelu_rows200",
                                             "convnext_rows392", "convnext_rows130", "convnext_wide_rows300",
                                             "packed_wide_rows200", "lone_rows300")
                for kind in ("mr", "md")]
    assert results == {k: "ok" for k in expected}, results


@pytest.mark.parametrize("split", ["1", "0"])
def test_interpreted_row_lengths(split):
    """Rows held whole and walked in chunks (over 4096), lengths not multiples of the block, transposed
    inputs (strided loads), a reduction over two dims; channels-last inputs give channels-last outputs.
    Few long rows are split across programs (partial reductions, then a combining kernel) and, with
    OSTINATO_SPLIT_REDUCTION=0, walked by one program each: both match eager."""
    results = _interpret("rows", "float32", OSTINATO_SPLIT_REDUCTION=split)
    assert len(results) == 16
    failed = {k: v for k, v in results.items() if v != "ok"}
    assert not failed, failed


def test_interpreted_edge_cases():
    """Shorter values beside reductions, fp16 comparisons with a Python float, NaN in amax/amin, floor
    division, empty rows and an empty batch: the kernels give what eager gives."""
    from fusion_models import EDGE_CASES
    results = _interpret("edge", "float32")
    assert results == {k: "ok" for k in EDGE_CASES}, results


def test_interpreted_symbolic_sizes():
    """A program exported with a symbolic size runs its generated kernels at several sizes (sizes are
    launch arguments, not constants)."""
    results = _interpret("dynamic", "float32")
    assert results == {"rms_seq": "ok", "gn_width": "ok"}, results


def test_interpreted_hf_decoders():
    """transformers' Llama and Gemma (three decode steps), Mistral's sliding window and Gemma 2's soft-capped
    eager attention (six: the window slides) with every group a generated kernel and each layer's
    attention the merged decode kernel."""
    results = _interpret("hf", "float32")
    families = ("llama", "gemma", "mistral", "gemma2", "qwen3", "gemma3", "gpt_neox", "phi")
    assert results == dict.fromkeys(families, "ok"), results


def test_interpreted_decoders_with_other_ropes_in_fp16():
    """Decode attention merged with the heads' norms (Qwen 3), a partial rotary embedding (GPT-NeoX), a rope
    in fp32 cast back (OLMo: fp32 cos over half rows; Cohere: rows cast up first, interleaved), norms of
    the whole q and k projections before that rope (OLMo 2), multi-query attention (Falcon), an interleaved
    partial rope on rows before their transpose (GPT-J), ALiBi in an additive mask (BLOOM): transformers' models in fp16 (the wide rope's
    own case: its rows are half), three decode steps through the fused kernel in Triton's interpreter
    against eager, every layer's attention merged and nothing it takes left as a kernel of its own."""
    results = _interpret("census", "float16")
    families = ("qwen3", "gpt_neox", "olmo", "cohere", "olmo2", "falcon", "gptj", "bloom")
    assert results == dict.fromkeys(families, "ok"), results


def test_interpreted_folded_norms():
    """Batched decode steps (20 sequences, fp16) whose norms fold into their projections (passes/fold_norms.py):
    Llama, Qwen 3, Phi-3 (packed projections), Gemma, Qwen 2 (biased q, k and v), StableLM (LayerNorm with a
    shift, partial rotary), OLMo (LayerNorm without weights, in fp32), OPT, StarCoder 2 and GPT-2 (biased
    output projections, GPT-2's [in, out] Conv1D weights and its q/k/v split from one biased product: a
    residual stream lagging its biases, the statistic of it plus the offset) from transformers,
    three steps each
    against eager,
    through the row-scaling attention kernel and the generated row-scale groups in Triton's interpreter, each
    layer the six launches (attention, o += x, gate/up, the row-scaled gating, down += x, q/k/v); a gated
    MLP whose rows are longer than a block (the statistic over x walked in chunks), and one whose gate and
    up have biases (the row-scale group adds them); a LayerNorm's MLP, over one block and over longer rows
    (the statistic about the row's mean)."""
    results = _interpret("fold", "float16")
    assert results == dict.fromkeys(("llama", "qwen3", "phi3", "gemma", "qwen2", "stablelm", "olmo", "opt",
                                     "starcoder2", "gpt2", "long_rows", "lagged_mlp", "lagged_long_rows",
                                     "biased_mlp", "layer_norm_mlp", "layer_norm_long_rows"), "ok"), results


def _variants():
    """(case, pipeline, dtype): bf16 and fp32 groups, persistent and looped rows; the zoo through the generic
    pipeline, a Mamba-style scan through the default one (its matvecs rewritten, passes/matvec.py), and a
    gated MLP whose norm the default one folds into its projections (passes/fold_norms.py)."""
    from fusion_models import Case, FoldedMLP, SelectiveScan
    scan = Case("selective_scan", lambda dt: (SelectiveScan(), SelectiveScan.inputs(dt)), 6)
    # a norm folded into a gated MLP's projections (bf16, 24 rows): the row-scale group over gate/up's rows
    fold = Case("folded_mlp", lambda dt: (FoldedMLP().to(dt), (torch.randn(24, 1, 64).to(dt) * 3,)), 1)
    biased = Case("folded_mlp_bias", lambda dt: (FoldedMLP(bias=True).to(dt), (torch.randn(24, 1, 64).to(dt),)), 1)
    layer = Case("folded_mlp_layer_norm", lambda dt: (FoldedMLP(layer=True).to(dt),
                                                      ((torch.randn(24, 1, 64) * 3 + 2).to(dt),)), 1)
    # a lagging stream's statistic (x plus its shift, both gathered) and pre-scale bias in the row-scale group
    lag = Case("folded_mlp_lag", lambda dt: (FoldedMLP(layer=True, lag=True).to(dt), (torch.randn(24, 1, 64).to(dt),)),
               1)
    cases = [(c, GENERIC_PIPELINE) for c in CASES] + [(scan, DEFAULT_PIPELINE), (fold, DEFAULT_PIPELINE),
                                                      (biased, DEFAULT_PIPELINE), (layer, DEFAULT_PIPELINE),
                                                      (lag, DEFAULT_PIPELINE)]
    return [(c, p, dt) for c, p in cases for dt in (torch.bfloat16, torch.float32)]


def test_every_variant_compiles_for_sm90():
    """Each group of the zoo, in each variant its launch picks, compiles for sm_90 with Triton."""
    from ostinato.backends.base import fused_launches
    from ostinato.backends.cpu.backend import CPUBackend
    from ostinato.backends.cuda.binaries import compile_binary
    from ostinato.backends.cuda.kernels.fused import LinearLauncher, launcher
    from ostinato.backends.cuda.runtime import arg_type

    compiled, split_stages, cases_compiled = set(), 0, set()
    for case, pipeline, dtype in _variants():
        model, args = case.build(dtype)
        prog = ostinato.export(model.eval(), args, passes=pipeline)
        for launch in fused_launches(CPUBackend(), prog.graph, lambda *a: None):
            if launch.op != "ost.fused":
                continue
            spec_json = launch.args[0]
            f = launcher(spec_json)
            if isinstance(f, LinearLauncher):
                continue            # test_linear_variants_compile_for_sm90
            # inputs of the group's shapes, from a reference run of the model
            from ostinato.codegen.reference import parse
            exe = fused_executable(prog, CPUBackend())
            env_shapes = _input_tensors(exe, prog, args, launch)
            for long_rows in (False, True) if f.spec.red == [f.spec.rank - 1] else (False,):
                tensors = _stretch(env_shapes, f.spec) if long_rows else env_shapes
                plan = f.plan(tensors)
                outs = [torch.empty(s, dtype=dt) for s, dt in zip(plan.out_shapes, f.out_dtypes)]
                scalars = [1.5] * len(parse(spec_json).scalars)
                ws = (torch.empty(plan.ws_shape),) if plan.ws_shape else ()     # a split row's workspace
                types = tuple(arg_type(a) for a in (*tensors, *outs, *scalars, *plan.ints, *ws))
                for kernel in (*plan.stages, plan.kernel):
                    key = (kernel.library.module, types, tuple(sorted(kernel.specialization.items())))
                    if key in compiled:
                        continue
                    meta, cubin = compile_binary(kernel.library.module, kernel.library.function_name("k"),
                                                 types, kernel.specialization, 90)
                    assert cubin[:4] == b"\x7fELF" and meta.num_warps in (4, 8)
                    compiled.add(key)
                    cases_compiled.add(case.name)
                    split_stages += bool(plan.stages)
    assert len(compiled) >= len(CASES) and {"selective_scan", "folded_mlp", "folded_mlp_bias",
                                            "folded_mlp_lag"} <= cases_compiled
    assert split_stages, "no split row was compiled"


def test_split_norm_rows_take_two_kernels_without_layout_shuffles(monkeypatch):
    """Few long GroupNorm rows (a UNet's) split across programs: the variance's partials are made with
    the mean's (moment_pairs), so two kernels instead of three, and the combining kernel compiles for
    sm_90 with no layout conversion before its output loop. A [1, SBLOCK] partial tile that met a row
    value once made Triton keep a broadcast [1, RBLOCK] copy in every thread and convert it through
    shared memory (31 bar.sync): the combining kernel took 22 us instead of 5.5 on an H100."""
    from fusion_models import GroupNormSiLU
    from ostinato.backends.base import fused_launches
    from ostinato.backends.cpu.backend import CPUBackend
    from ostinato.backends.cuda.binaries import compile_binary
    from ostinato.backends.cuda.kernels.fused import launcher
    from ostinato.backends.cuda.runtime import arg_type
    from ostinato.codegen.triton_source import moment_pairs

    ttgir = _keep_ttgir(monkeypatch)
    model = GroupNormSiLU(64, 8).eval().to(torch.bfloat16)
    args = (torch.randn(2, 64, 40, 40, dtype=torch.bfloat16),)
    prog = ostinato.export(model, args, passes=GENERIC_PIPELINE)
    exe = fused_executable(prog, CPUBackend())
    checked = 0
    for launch in fused_launches(CPUBackend(), prog.graph, lambda *a: None):
        f = launcher(launch.args[0]) if launch.op == "ost.fused" else None
        if f is None or not getattr(f.spec, "red", None):
            continue
        tensors = _input_tensors(exe, prog, args, launch)
        plan = f.plan(tensors)
        assert moment_pairs(f.spec) and plan.ws_shape is not None and len(plan.stages) == 1
        outs = [torch.empty(sh, dtype=dt) for sh, dt in zip(plan.out_shapes, f.out_dtypes)]
        types = tuple(arg_type(a) for a in (*tensors, *outs, *plan.ints, torch.empty(plan.ws_shape)))
        for kernel in (*plan.stages, plan.kernel):
            ttgir.clear()
            compile_binary(kernel.library.module, kernel.library.function_name("k"), types, kernel.specialization, 90)
        assert len(ttgir) == 1 and "scf.for" in ttgir[0]
        assert "convert_layout" not in ttgir[0].split("scf.for")[0], "the combining kernel converts row values"
        checked += 1
    assert checked == 2


def _compile_linear_groups(model, args, compiled: set, shared: list | None = None) -> list:
    """Compile for sm_90 each matmul group of ``model`` exported on ``args`` (once per module, argument
    types and specialization in ``compiled``), with the arguments its launcher passes; their plans. The
    shared memory (bytes) each binary asks for goes to ``shared``."""
    from ostinato.backends.base import fused_launches
    from ostinato.backends.cpu.backend import CPUBackend
    from ostinato.backends.cuda.binaries import compile_binary
    from ostinato.backends.cuda.kernels.fused import LinearLauncher, launcher
    from ostinato.backends.cuda.runtime import arg_type
    prog = ostinato.export(model.eval(), args)
    exe = fused_executable(prog, CPUBackend())
    plans = []
    for launch in fused_launches(CPUBackend(), prog.graph, lambda *a: None):
        f = launcher(launch.args[0]) if launch.op == "ost.fused" else None
        if not isinstance(f, LinearLauncher):
            continue
        tensors = _input_tensors(exe, prog, args, launch)
        plan = f.plan(tensors)
        assert plan is not None, launch.name
        plans.append(plan)
        kargs, _ = f.arguments(plan, tensors, [1.5] * (len(f.spec.pro.scalars) + len(
            f.spec.epi.scalars if f.spec.epi else ())))
        types = tuple(arg_type(a) for a in kargs)
        key = (plan.kernel.library.module, types, tuple(sorted(plan.kernel.specialization.items())))
        if key in compiled:
            continue
        meta, cubin = compile_binary(plan.kernel.library.module, plan.kernel.library.function_name("k"),
                                     types, plan.kernel.specialization, 90)
        assert cubin[:4] == b"\x7fELF"
        compiled.add(key)
        if shared is not None:
            shared.append((type(model).__name__, plan.kernel.specialization, meta.shared))
    return plans


def test_linear_variants_compile_for_sm90(monkeypatch):
    """Each matmul group of the zoo and of a decoder layer (one row and several; bf16 and fp32) compiles
    for sm_90 with the arguments its launcher passes."""
    from fusion_models import Conv1DBlock, DecoderLayer, LongLoneProjections, LoneProjections, PackedGatedMLP

    builds = [c.build for c in CASES] + [lambda dt, m=m, cls=cls: (cls().to(dt), cls.inputs(m, dt))
                                         for m in (1, 3) for cls in (DecoderLayer, Conv1DBlock, PackedGatedMLP, LoneProjections)]
    builds.append(lambda dt: (LongLoneProjections().to(dt), LongLoneProjections.inputs(1, dt)))    # split-K
    from ostinato.backends.cuda.kernels import split_k
    monkeypatch.setattr(split_k, "_SPLIT_K_MIN_WEIGHTS", 0)     # its small weights split too
    compiled, splits = set(), 0
    for build in builds:
        for dtype in (torch.bfloat16, torch.float32):
            splits += sum(plan.nsplit > 1 for plan in _compile_linear_groups(*build(dtype), compiled))
    assert len({k[0] for k in compiled}) >= 8, compiled
    assert splits, "no split-K variant was compiled"


def test_dot_linear_variants_compile_for_sm90(monkeypatch):
    """The tl.dot matmul kernel (more than 16 rows, bf16 and fp16) of a decoder layer, a Conv1D block
    ([K, N] weights), a packed gated MLP and lone projections, at 17, 32 and 64 rows, compiles for sm_90
    with the arguments its launcher passes, and multiplies on tensor cores: an MMA layout (mma.sync at
    32 rows, wgmma at 64), its operands brought to shared memory by pipelined asynchronous copies."""
    from fusion_models import Conv1DBlock, DecoderLayer, LoneProjections, PackedGatedMLP

    ttgir = _keep_ttgir(monkeypatch)
    monkeypatch.setenv("OSTINATO_DOT_ROWS", "64")     # (off by default)
    compiled, dots = set(), 0
    for m, classes in ((17, (Conv1DBlock,)), (32, (DecoderLayer, Conv1DBlock, PackedGatedMLP, LoneProjections)),
                       (64, (DecoderLayer, PackedGatedMLP))):
        for cls in classes:
            for dtype in (torch.bfloat16, torch.float16):
                ttgir.clear()
                plans = _compile_linear_groups(cls().to(dtype), cls.inputs(m, dtype), compiled)
                assert plans and all("_md11" in p.kernel.library.module for p in plans), (cls.__name__, m)
                assert all(p.kernel.specialization["XBLOCK"] == (32 if m <= 32 else 64) for p in plans)
                mma = "versionMajor = 2" if m <= 32 else "versionMajor = 3"
                for ir in ttgir:
                    assert "nvidia_mma" in ir and mma in ir, (cls.__name__, m, dtype)
                    assert ("tt.dot" if m <= 32 else "warp_group_dot") in ir
                    assert "async_copy_global_to_local" in ir
                    dots += 1
    assert dots == len(compiled) >= 30, (dots, len(compiled))


def test_dot_pick_variants_compile_for_sm90(monkeypatch):
    """The matmul groups OSTINATO_DOT_PICK=prologue leaves two decoder layers with Llama's proportions (at 32
    rows in bf16 and fp16, at 64 in bf16): RMSNorm + q/k/v + gating, then add + RMSNorm + q/k/v storing the
    sum; SwiGLU + down, then SwiGLU + down + bias + residual. Each compiles for sm_90 with the arguments
    its launcher passes, a tl.dot kernel on tensor cores."""
    from fusion_models import DecoderLayer

    ttgir = _keep_ttgir(monkeypatch)
    monkeypatch.setenv("OSTINATO_DOT_ROWS", "64")     # (off by default)
    monkeypatch.setenv("OSTINATO_DOT_PICK", "prologue")
    compiled = set()
    for m, dtype in ((32, torch.bfloat16), (32, torch.float16), (64, torch.bfloat16)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(DecoderLayer(i=128), DecoderLayer(i=128)).to(dtype)
        ttgir.clear()
        plans = _compile_linear_groups(model, DecoderLayer.inputs(m, dtype), compiled)
        assert len(plans) == 4 and all("_md11" in p.kernel.library.module for p in plans), (m, dtype)
        for ir in ttgir:
            assert "nvidia_mma" in ir and ("tt.dot" if m <= 32 else "warp_group_dot") in ir, (m, dtype)
    assert len(compiled) == 12, len(compiled)     # four kernels each: every group differs from the others


def test_dot_pipeline_knobs_reach_triton(monkeypatch):
    """The sweep's knobs for the tl.dot kernel of a decoder layer at 32 rows reach the compiled binary:
    OSTINATO_DOT_STAGES as Triton's pipeline depth (more shared memory than the default depth's, less
    than an sm_90 block may have; fewer stages where the buffers would not fit), OSTINATO_DOT_STATS_STAGES
    as a pipelined statistics loop in the source and the module's name, OSTINATO_DOT_XBLOCK as 64-row
    tiles (wgmma); bad values are refused with the variable named."""
    from fusion_models import DecoderLayer
    from ostinato.backends.cuda.binaries import _GENERATED
    from ostinato.backends.cuda.kernels import fused
    from ostinato.backends.cuda.kernels.fused import forget_plans

    monkeypatch.setenv("OSTINATO_DOT_ROWS", "64")
    model, args = DecoderLayer().to(torch.bfloat16), DecoderLayer.inputs(32, torch.bfloat16)
    default: list = []
    _compile_linear_groups(model, args, set(), default)
    forget_plans()
    for k, v in {"OSTINATO_DOT_STAGES": "5", "OSTINATO_DOT_STATS_STAGES": "3", "OSTINATO_DOT_XBLOCK": "64"}.items():
        monkeypatch.setenv(k, v)
    ttgir = _keep_ttgir(monkeypatch)
    tuned: list = []
    plans = _compile_linear_groups(model, args, set(), tuned)
    assert all(p.kernel.specialization["num_stages"] == 5 and p.kernel.specialization["XBLOCK"] == 64
               for p in plans), [p.kernel.specialization for p in plans]
    assert all(p.kernel.library.module.endswith("_p3") for p in plans)
    assert sum("tl.range(" in _GENERATED[p.kernel.library.module] for p in plans) >= 2
    assert all("warp_group_dot" in ir for ir in ttgir)
    assert len(tuned) == len(default) and all(t[2] > d[2] for t, d in zip(tuned, default)), (tuned, default)
    assert all(t[2] <= 232448 for t in tuned), tuned
    # a depth whose buffers would not fit is lowered: 8 stages of 64 x 256 tiles over three slices
    forget_plans()
    monkeypatch.setenv("OSTINATO_DOT_STAGES", "8")
    monkeypatch.setenv("OSTINATO_DOT_RBLOCK", "256")
    deep = [p.kernel.specialization for p in _compile_linear_groups(model, args, set())]
    assert all(2 <= s["num_stages"] < 8 and s["RBLOCK"] == 256 for s in deep), deep
    monkeypatch.setenv("OSTINATO_DOT_STAGES", "9")
    with pytest.raises(ValueError, match="OSTINATO_DOT_STAGES=9"):
        fused.dot_stages()
    monkeypatch.setenv("OSTINATO_DOT_XBLOCK", "16")
    with pytest.raises(ValueError, match="OSTINATO_DOT_XBLOCK=16"):
        fused.dot_rows_block(32)


def test_dot_split_k_compiles_for_sm90(monkeypatch):
    """OSTINATO_DOT_SPLIT=4: the tl.dot kernels of a decoder layer (norm prologue, gated epilogue), a
    packed gated MLP and lone projections at 32 rows split K four ways (grid axis 1), compile for sm_90
    with the partials, counters and slice length their launcher passes, and ask for a partials buffer of
    [splits, slices * rows * columns]; a bad value is refused with the variable named."""
    from fusion_models import DecoderLayer, LoneProjections, PackedGatedMLP
    from ostinato.backends.cuda.kernels import fused

    monkeypatch.setenv("OSTINATO_DOT_ROWS", "64")
    monkeypatch.setenv("OSTINATO_DOT_SPLIT", "4")
    monkeypatch.setenv("OSTINATO_DOT_RBLOCK", "16")
    plans = []
    for cls in (DecoderLayer, PackedGatedMLP, LoneProjections):
        plans += _compile_linear_groups(cls().to(torch.bfloat16), cls.inputs(32, torch.bfloat16), set())
    # four ways, or one per K step where K has fewer (the layer's 48-wide down projection: three)
    assert plans and all(1 < p.nsplit == p.grid[1] == p.kernel.specialization["NSPLIT"] <= 4
                         and "_s" in p.kernel.library.module for p in plans), [(p.nsplit, p.grid) for p in plans]
    assert sum(p.nsplit == 4 for p in plans) >= len(plans) // 2
    slices = [len(p.views) or 1 for p in plans]
    assert all(p.ws_cols % (32 * p.tail[0]) == 0 for p in plans), [(p.ws_cols, p.tail) for p in plans]
    assert any(p.ws_cols > 32 * p.tail[0] for p in plans), slices    # a gated group keeps one partial a slice
    monkeypatch.setenv("OSTINATO_DOT_SPLIT", "3")
    with pytest.raises(ValueError, match="OSTINATO_DOT_SPLIT=3"):
        fused.dot_split()


@pytest.mark.parametrize("kind", ["mr", "md"])
def test_tiled_linear_variants_compile_for_sm90(monkeypatch, kind):
    """The tl.dot matmul kernels tiled over blocks of 128 rows (300 rows, bf16 and fp16) of a decoder
    layer, a Conv1D block, a packed gated MLP and ConvNeXt's block compile for sm_90 with the arguments
    their launcher passes (with OSTINATO_TILED_LINEAR=1), on wgmma: the row-stationary kernel (``mr``,
    a short K: one program per row block) and the K-loop one (``md``, OSTINATO_TILED_KLOOP=1, its
    operands brought by pipelined asynchronous copies); no such group without OSTINATO_TILED_LINEAR."""
    from fusion_models import Conv1DBlock, ConvNeXtBlock, DecoderLayer, PackedGatedMLP

    ttgir = _keep_ttgir(monkeypatch)
    monkeypatch.setenv("OSTINATO_TILED_LINEAR", "1")     # (off by default)
    monkeypatch.setenv("OSTINATO_TILED_KLOOP", "1" if kind == "md" else "0")
    compiled, dots, shared = set(), 0, []
    for model, args in [(cls(), cls.inputs(300, torch.float32)) for cls in (DecoderLayer, Conv1DBlock, PackedGatedMLP)] + \
            [(ConvNeXtBlock(ch), (torch.randn(2, ch, 10, 15),)) for ch in (48, 192)]:
        for dtype in (torch.bfloat16, torch.float16):
            ttgir.clear()
            plans = _compile_linear_groups(model.to(dtype), tuple(a.to(dtype) for a in args), compiled, shared)
            assert plans and all(f"_{kind}" in p.kernel.library.module for p in plans), type(model).__name__
            assert all(p.kernel.specialization["XBLOCK"] == 128 and p.grid[1] == 3 for p in plans)
            assert kind == "md" or all(p.grid[0] == 1 for p in plans)     # (row-stationary: one program a row block)
            for ir in ttgir:
                assert "warp_group_dot" in ir, (type(model).__name__, dtype)
                assert kind == "mr" or "async_copy_global_to_local" in ir, (type(model).__name__, dtype)
                dots += 1
    assert dots == len(compiled) >= 8, (dots, len(compiled))
    # every binary fits an sm_90 block's shared memory (227 KiB): ConvNeXt's K of 192 held whole asked
    # for 288 KiB on an H200 before its column blocks were fitted
    assert shared and all(b <= 232448 for _, _, b in shared), [s for s in shared if s[2] > 232448]
    assert kind == "md" or any(spec["RBLOCK"] == 256 and spec["NBLOCK"] < 128 for _, spec, _ in shared), shared
    monkeypatch.delenv("OSTINATO_TILED_LINEAR")
    assert not _compile_linear_groups(DecoderLayer().to(torch.bfloat16), DecoderLayer.inputs(300, torch.bfloat16), set())


def test_wide_index_variants_compile_for_sm90():
    """The 64-bit-index variants (tensors past 2^31 elements) of a held, a looped and a split row kernel
    compile."""
    from ostinato.backends.cuda.binaries import compile_binary
    from ostinato.backends.cuda.kernels.fused import launcher
    from ostinato.codegen.triton_source import param_names, split_stages
    from ostinato.passes import GENERIC_PIPELINE
    from fusion_models import NanRows, StatsHead
    for model, args in ((StatsHead(), (torch.randn(4, 5, 33),)), (NanRows(), (torch.randn(2, 3),))):
        prog = ostinato.export(model, args, passes=GENERIC_PIPELINE)
        specs = [n for n in __import__("ostinato").codegen.schedule(prog.graph) if hasattr(n, "spec")]
        for g in specs:
            f = launcher(g.spec.to_json())
            stages = [(False, None), (True, None)] + [(True, k) for k in range(split_stages(f.spec))]
            for loop, stage in stages:
                lib, name = f.library(2, 1, loop, True, stage)
                names = param_names(f.spec, 2, 1, loop, stage is not None)
                types = [("*fp32:D" if n.startswith(("in", "out", "ws")) else "i64") for n in names]
                spec = {"XBLOCK": 1 if loop else 4, "RBLOCK": 64, "num_warps": 4}
                if stage is not None:
                    spec["SBLOCK"] = 8
                meta, cubin = compile_binary(lib.module, lib.function_name(name), types, spec, 90)
                assert cubin[:4] == b"\x7fELF"


def _input_tensors(exe, prog, args, launch):
    """Tensors shaped as the launch's inputs: the reference plan's environment after a run."""
    env = exe.bind(exe.session, exe.check_inputs(args, {})[0])
    for l in exe.launches:
        from ostinato.runtime.codegen import compile_launches
        compile_launches([l], set(o for o in l.outs if o >= 0))(env)
    out = []
    from ostinato.backends.base import _Slot
    for a in launch.args[1:]:
        if type(a) is _Slot:
            v = env[a.i]
            if isinstance(v, torch.Tensor):
                out.append(v)
    return out


def _stretch(tensors, spec):
    """The same group's inputs with rows longer than the persistent limit (the looped variant)."""
    n = next(t.shape[-1] for k, t in enumerate(tensors) if spec.inputs[k][1] == "x")
    return [t.repeat_interleave(-(-5000 // n), dim=-1)[..., :5000].contiguous() if t.dim() and t.shape[-1] == n > 1
            else t for t in tensors]


def test_lone_tiles():
    """One-row projections with no neighbour: a long K splits (Llama-1B's down projection four ways), a
    short one takes 4 columns per program; a norm before it, an epilogue, several rows or the switch
    OSTINATO_SPLIT_K=0 leave linear_blocks' tiles."""
    from ostinato.backends.cuda.kernels.split_k import lone_tiles
    from ostinato.codegen.spec import GroupSpec, LinearSpec

    def group(ops: list) -> GroupSpec:     # (only what lone_tiles reads matters)
        return GroupSpec(2, [1], [["bf16", "x", 0]], [], ops, [[0, "bf16", "x", False]])

    def spec(reduces: bool, epi: bool) -> LinearSpec:
        return LinearSpec(group([["sum", "f32", "r", 0]] if reduces else []), 0, [False], [2048], False, "bf16",
                          [not epi], group([]) if epi else None, [0] if epi else None)
    lone = spec(False, False)
    assert lone_tiles(lone, 1, 2048, 8192) == (8, 256, 4)           # down: 1024 programs
    assert lone_tiles(lone, 1, 896, 4864) is None                   # Qwen2.5-0.5B's down: small, as before
    assert lone_tiles(lone, 1, 4096, 14336) == (8, 256, 2)          # a hidden-4096 down
    assert lone_tiles(lone, 1, 2048, 2048) == (4, 512, 1)           # o
    assert lone_tiles(lone, 1, 128256, 2048) is None                # a head: linear_blocks'
    assert lone_tiles(lone, 2, 2048, 8192) is None
    assert lone_tiles(spec(True, False), 1, 2048, 8192) is None
    assert lone_tiles(spec(False, True), 1, 2048, 8192) is None
    os.environ["OSTINATO_SPLIT_K"] = "0"
    try:
        assert lone_tiles(lone, 1, 2048, 8192) is None
    finally:
        del os.environ["OSTINATO_SPLIT_K"]


def test_linear_blocks_are_powers_of_two():
    """Block sizes of every matmul group shape are powers of two (Triton's tiles) and keep a step's
    tile within the register budget."""
    from ostinato.backends.cuda.kernels.fused import linear_blocks
    for m in (1, 2, 3, 5, 12, 16):
        for n in (2, 7, 64, 3000, 4096, 4097, 128256):
            for k in (2, 33, 512, 8192):
                for slices, transposed in ((1, False), (2, False), (3, False), (5, False), (1, True)):
                    nb, rb, warps = linear_blocks(m, n, k, slices, transposed)
                    assert all(v > 0 and v & (v - 1) == 0 for v in (nb, rb)), (m, n, k, slices, nb, rb)
                    assert rb <= max(16, 1 << (k - 1).bit_length()) and warps in (4, 8)
                    assert m == 1 or (1 << (m - 1).bit_length()) * nb * rb * slices <= 8192 * 5


def test_launch_plans_import_no_sympy(tmp_path):
    """A warm process's first call plans every generated kernel's launch: that must not import sympy
    (torch.broadcast_shapes does, ~1-3 s of first output on the GPU machine)."""
    from ostinato.backends.cpu.backend import CPUBackend
    from ostinato.backends.base import fused_launches
    from fusion_models import DecoderLayer, StatsHead
    cases = []
    for model, args in ((DecoderLayer(), DecoderLayer.inputs(1, torch.float32)), (StatsHead(), (torch.randn(4, 33),))):
        prog = ostinato.export(model.eval(), args)
        exe = fused_executable(prog, CPUBackend())
        cases += [(launch.args[0], _input_tensors(exe, prog, args, launch))
                  for launch in fused_launches(CPUBackend(), prog.graph, lambda *a: None) if launch.op == "ost.fused"]
    assert any('"kind":"linear"' in s for s, _ in cases) and any('"kind"' not in s for s, _ in cases)
    torch.save(cases, tmp_path / "cases.pt")
    code = ("import sys, torch\nfrom ostinato.backends.cuda.kernels.fused import launcher\n"
            f"cases = torch.load({str(tmp_path / 'cases.pt')!r})\n"
            "assert all(launcher(s).plan(t) is not None for s, t in cases)\n"
            "print('sympy' in sys.modules)\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(os.path.dirname(HERE)), "src"))
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip().splitlines()[-1] == "False"


def test_linear_plans_know_whether_the_weights_are_packed():
    """A matmul group's launcher is shared by every executable holding the group: weights of the same
    shapes that are not one packed block must not reuse a packed block's plan (and run the reference)."""
    from ostinato.backends.cpu.backend import CPUBackend
    from ostinato.backends.base import fused_launches
    from ostinato.backends.cuda.kernels.fused import LinearLauncher, launcher
    from ostinato.codegen.reference import fused
    from fusion_models import DecoderLayer
    model, args = DecoderLayer(), DecoderLayer.inputs(1, torch.float32)
    prog = ostinato.export(model.eval(), args)
    exe = fused_executable(prog, CPUBackend())
    launch = next(l for l in fused_launches(CPUBackend(), prog.graph, lambda *a: None)
                  if l.op == "ost.fused" and '"w":[64,64,64]' in l.args[0])
    f = launcher(launch.args[0])
    assert isinstance(f, LinearLauncher)
    tensors = _input_tensors(exe, prog, args, launch)
    n_pro = len(f.spec.pro.inputs)
    weights = tensors[n_pro:n_pro + 3]
    packed = torch.cat(weights).split(64)
    apart = [w.clone() for w in weights]
    with_packed = tensors[:n_pro] + list(packed) + tensors[n_pro + 3:]
    with_apart = tensors[:n_pro] + apart + tensors[n_pro + 3:]
    assert f.key(with_packed) != f.key(with_apart)
    assert f.plan(with_packed) is not None and f.plan(with_apart) is None
    got = f(*with_apart)     # the reference: no kernel for weights that are not one block
    assert f._plans[f.key(with_apart)] is None
    for a, b in zip(got, fused(launch.args[0], *with_apart)):
        assert torch.equal(a, b)


def test_split_k_scratch_is_never_shared_by_a_capture():
    """Split-K scratch: outside a capture one pair per (device, stream), reused by every launch there; a
    warm-up under recording_scratch lists each launch's pair; inside ostinato's capture each launch takes
    the next pair reserved before it (made outside the graph's pool), held for the graph and zeroed after
    it; a launch the reserve does not fit, or one inside a capture ostinato did not make, gets a pair of
    its own whose counters are zeroed by the capture itself."""
    from ostinato.backends.cuda.kernels.fused import _LinearPlan
    from ostinato.backends.cuda.kernels.split_k import (owned_scratch, recording_scratch, reserve_scratch,
                                                        split_scratch, zero_counters)
    plan = _LinearPlan(kernel=None, grid=(5, 4), pro_ints=[], epi_ints=[], tail=[40, 8192, 40], pro_shapes=[],
                       epi_shape=None, mm_shape=(1, 40), views=[], nsplit=4, kslice=2048, scratch={}, ws_cols=40)
    other = _LinearPlan(kernel=None, grid=(3, 2), pro_ints=[], epi_ints=[], tail=[24, 4096, 24], pro_shapes=[],
                        epi_shape=None, mm_shape=(1, 24), views=[], nsplit=2, kslice=2048, scratch={}, ws_cols=24)
    cpu = torch.device("cpu")
    with recording_scratch() as shapes:
        a = split_scratch(plan, cpu, False)
        b = split_scratch(plan, cpu, False)
    assert a[0] is b[0] and a[1] is b[1] and a[2] == 2048
    assert a[0].shape == (4, 40) and a[1].shape == (5,) and int(a[1].abs().sum()) == 0
    assert shapes == [((4, 40), 5), ((4, 40), 5)]
    reserve = reserve_scratch(shapes, cpu)
    made = [id(t) for pair in reserve for t in pair]
    with owned_scratch(reserve) as held:
        c = split_scratch(plan, cpu, True)
        f = split_scratch(other, cpu, True)     # not foreseen: a pair of its own, not held
        d = split_scratch(plan, cpu, True)
        g = split_scratch(plan, cpu, True)      # the reserve is spent: likewise
    assert len(held) == 2 and not reserve and c[1] is not d[1] and c[1] is not a[1]
    assert [id(t) for pair in held for t in pair] == made == [id(c[0]), id(c[1]), id(d[0]), id(d[1])]
    assert f[0].shape == (2, 24) and f[1].shape == (3,) and int(f[1].abs().sum()) == 0
    assert int(g[1].abs().sum()) == 0 and all(g[1] is not t for pair in held for t in pair)
    for _, cnt in held:
        cnt.fill_(3)
    zero_counters(held)
    assert all(int(cnt.abs().sum()) == 0 for _, cnt in held)
    e = split_scratch(plan, cpu, True)      # someone else's capture: fresh zeros
    assert e[1] is not a[1] and int(e[1].abs().sum()) == 0
