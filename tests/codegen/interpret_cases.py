"""Generated fusion kernels in Triton's interpreter against eager, on CPU tensors. Run with
TRITON_INTERPRET=1 (test_triton_fused.py does): ``python interpret_cases.py zoo|rows float32|float16``.
Prints one JSON object, case -> "ok" or the first line of the failure."""
from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
for p in (HERE, os.path.dirname(HERE), os.path.join(os.path.dirname(os.path.dirname(HERE)), "src")):
    sys.path.insert(0, p)

import torch  # noqa: E402

import ostinato  # noqa: E402
from ostinato.ir.ops import does_device_work  # noqa: E402
from ostinato.passes import DEFAULT_PIPELINE, GENERIC_PIPELINE  # noqa: E402
from fusion_backend import InterpretedFusionBackend, fused_executable, fused_ops  # noqa: E402
from fusion_models import CASES, GroupNormSiLU as ResCore  # noqa: E402
from helpers import assert_same  # noqa: E402

# fp16 on the CPU: eager rounds some ops differently from the kernel's fp32 arithmetic (one ulp of fp16).
TOL = {torch.float32: 1e-5, torch.float16: 4e-3}


class Rows(torch.nn.Module):
    """A norm and a softmax over rows of a given length, a broadcast weight, a transposed input and a
    reduction over two dims."""

    def __init__(self, n):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(n))

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
        t = x.transpose(0, 1)
        return h, torch.softmax(t * 2.0, dim=-1), (t.sigmoid() + 1).sum(dim=(0, 2))


class ChannelsLast(torch.nn.Module):
    """Groups reading channels-last tensors (a conv's output on the GPU): outputs keep that layout."""

    def __init__(self):
        super().__init__()
        self.gn = torch.nn.GroupNorm(4, 16)
        self.bn = torch.nn.BatchNorm2d(16).eval()

    def forward(self, x):
        h = x.contiguous(memory_format=torch.channels_last)
        a = torch.nn.functional.silu(self.gn(h)) + 1.0
        b = torch.relu(self.bn(h)) * h
        return a, b


def run(model, args, groups, tol):
    torch.manual_seed(0)
    prog = ostinato.export(model.eval(), args, passes=GENERIC_PIPELINE)
    exe = fused_executable(prog, InterpretedFusionBackend())
    got = fused_ops(exe).get("ost.fused", 0)
    if groups is not None and got != groups:
        raise AssertionError(f"{got} fused groups, expected {groups}")
    with torch.no_grad():
        ref = model(*args)
    out = exe(*args)
    assert_same(out, ref, tol=tol)
    if isinstance(model, ChannelsLast):
        assert all(o.is_contiguous(memory_format=torch.channels_last) for o in out), "layout not kept"


def _check(fn) -> str:
    try:
        fn()
        return "ok"
    except Exception as e:  # noqa: BLE001 - reported per case
        return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


_PROJECTIONS = ("aten.linear", "ost.multi_linear", "ost.linear", "aten.addmm", "aten.mm")


def _linear_case(cls, make, name: str, dtype) -> tuple:
    """(model, inputs, executable, its matmul groups, the projections left to cuBLAS) of ``cls()`` in
    ``dtype`` exported on ``make``'s inputs from a generator seeded by ``name``, lowered as on CUDA."""
    torch.manual_seed(0)
    model = cls().to(dtype).eval()
    args = make(torch.Generator().manual_seed(sum(map(ord, name))))
    exe = fused_executable(ostinato.export(model, args), InterpretedFusionBackend())
    groups = [l for l in exe.launches if l.op == "ost.fused" and '"kind":"linear"' in l.args[0]]
    return model, args, exe, groups, [l.op for l in exe.launches if l.op in _PROJECTIONS]


def _plans(group) -> list:
    """The launch plans a matmul group's launcher made (gen_lin_<digest>_<kind><xr_pro><xr_epi>[_i]:
    ``p.kernel.library.module.split("_")[3][:2]`` is the kernel's kind)."""
    from ostinato.backends.cuda.kernels.fused import launcher
    return [p for p in launcher(group.args[0])._plans.values() if p is not None]


def _layout_case(dtype) -> None:
    """fusion_models.ConvNet through the CUDA lowering's layouts: fp16 convolutions asked to run
    channels-last, the layout handed on from conv to conv (the input converted once, by the stem), the
    lone one after the pixel shuffle left as it is, outputs as eager gives them, values as eager's."""
    from ostinato.backends.cuda import library_ops
    from fusion_backend import InterpretedCUDALowering
    from fusion_models import ConvNet
    seen = []

    def conv(x, *args, **kwargs):
        seen.append((x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous(),
                     kwargs.get("memory_format")))
        return library_ops.convolution(x, *args, **kwargs)

    class Backend(InterpretedCUDALowering):
        def kernel(self, op):
            return conv if op == "aten.convolution" else super().kernel(op)

    torch.manual_seed(0)
    model, args = ConvNet().eval().to(dtype), ConvNet.inputs(dtype)
    exe = fused_executable(ostinato.export(model, args), Backend())
    with torch.no_grad():
        ref = model(*args)
    out = exe(*args)
    assert_same(out, ref, tol=1e-4 if dtype == torch.float32 else 1e-2)
    assert all(o.is_contiguous() for o in out), [o.stride() for o in out]
    want = torch.channels_last if dtype in (torch.float16, torch.bfloat16) else None
    # the last convolution reads the pixel shuffle's result (made through 6-D views): no channels-last
    # neighbour, so it stays in its input's layout rather than convert it (layout._islands)
    assert len(seen) == 7 and all(fmt is want for _, fmt in seen[:6]) and seen[6][1] is None, seen
    if want is not None:
        converted = sum(not already for already, _ in seen[:6])
        assert converted == 1, f"{converted} of {len(seen)} convolutions converted their input: {seen}"


# kernels from a layer's attention to the next's (else 5; Cohere's attention and MLP share a norm)
CENSUS_STRIDE = {"cohere": 4, "falcon": 4}


def main(what: str, dtype_name: str) -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    dtype = getattr(torch, dtype_name)
    results = {}
    if what == "hf":     # transformers' decoders, several decode steps (int64 scalar groups included)
        from fusion_backend import hf_decode_matches
        # Mistral and Gemma 2 (a window of 4 keys): 6 steps, so the window slides past the first keys
        for family, steps in (("llama", 3), ("gemma", 3), ("mistral", 6), ("gemma2", 6), ("qwen3", 3), ("gemma3", 6),
                              ("gpt_neox", 3), ("phi", 3)):
            try:
                prog = hf_decode_matches(family, InterpretedFusionBackend(), steps, tol=1e-4)
                merged = fused_ops(fused_executable(prog, InterpretedFusionBackend())).get("ost.decode_attention_", 0)
                layers = sum(1 for n in prog.graph.nodes if n.op == "ost.sdpa")
                if merged != layers:
                    raise AssertionError(f"{merged} merged decode attentions for {layers} layers")
                results[family] = "ok"
            except Exception as e:  # noqa: BLE001 - reported per case
                results[family] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        print(json.dumps(results))
        return
    if what == "census":    # bench/launch_census.py's families whose ropes take other forms, in fp16
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
        import copy

        import launch_census
        # Qwen 3: the heads' norms; GPT-NeoX: a partial rotary embedding; OLMo: an fp32 cos over half rows,
        # cast back; Cohere: rows cast up, interleaved; OLMo 2: norms of the whole q and k projections (in
        # fp32 between casts), then OLMo's rope; Falcon: one KV head broadcast (multi-query); GPT-J: an
        # interleaved partial rope on [B, 1, H, D] rows before the transpose to head-major caches; BLOOM
        for family in ("qwen3", "gpt_neox", "olmo", "cohere", "olmo2", "falcon", "gptj", "bloom"):
            try:     # BLOOM: eager attention only (ALiBi biases summed with the causal mask: an additive mask)
                wrapper, steps = launch_census.build(family, 2, "eager" if family == "bloom" else "sdpa", 1, dtype)
                ref = copy.deepcopy(wrapper)
                exe = fused_executable(launch_census.export(wrapper, steps[0]), InterpretedFusionBackend())
                for n, step in enumerate(steps):
                    with torch.no_grad():
                        expected = ref(**step)
                    assert_same(exe(**step), expected, msg=f"{family} step {n}:")
                merged = fused_ops(exe).get("ost.decode_attention_", 0)
                # what the attention takes stays out of the launches (one cat is the step's cos/sin: not a layer's)
                left = [l.op for l in exe.launches if l.op in ("ost.rope", "ost.rms_norm", "aten._to_copy")]
                left += ["aten.cat"] * max(0, sum(l.op == "aten.cat" for l in exe.launches) - 1)
                # nor a generated kernel of their own (OLMo 2's norms between their casts are a group): the
                # launches from one layer's attention to the next's
                kernels = [l.op for l in exe.launches if does_device_work(l.op)]
                at = [i for i, op in enumerate(kernels) if op == "ost.decode_attention_"]
                if at[1] - at[0] != CENSUS_STRIDE.get(family, 5):
                    left += kernels[at[0]:at[1]]
                results[family] = "ok" if merged == 2 and not left else f"{merged} merged for 2 layers; left {left}"
            except Exception as e:  # noqa: BLE001 - reported per case
                results[family] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        print(json.dumps(results))
        return
    if what == "fold":      # batched decode steps whose norms fold into their projections (passes/fold_norms.py)
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
        import copy

        import launch_census
        from fusion_models import FoldedMLP
        # Llama (q, k, v; gate, up), Qwen 3 (the heads' norms after the scale), Phi-3 (packed q/k/v and gate/up:
        # slices of one product), Gemma (1 + w, GeGLU), Qwen 2 (q's, k's and v's biases after the scale): 2
        # layers, 20 sequences, 3 steps, every launch between two attentions one of the six, the attention
        # taking q's, k's and v's row scales
        from ostinato.ir import fused_ops as reference_ops
        real = reference_ops.decode_attention_
        fallbacks = []

        def counted(*args, **kwargs):      # the decode attention's launcher falls back to this reference
            fallbacks.append(1)
            return real(*args, **kwargs)
        reference_ops.decode_attention_ = counted
        # OPT, StarCoder 2 and GPT-2 (Conv1D): biased output projections, accumulated without their biases; the attention
        # and the row-scale group take the statistic of the lagging stream plus its offset (row_shift)
        for family in ("llama", "qwen3", "phi3", "gemma", "qwen2", "stablelm", "olmo", "opt", "starcoder2", "gpt2"):
            fallbacks.clear()
            try:
                wrapper, steps = launch_census.build(family, 2, "sdpa", 20, dtype)
                ref = copy.deepcopy(wrapper)
                prog = launch_census.export(wrapper, steps[0])
                exe = fused_executable(prog, InterpretedFusionBackend())
                for n, step in enumerate(steps):
                    with torch.no_grad():
                        expected = ref(**step)
                    assert_same(exe(**step), expected, tol=2e-2, msg=f"{family} step {n}:")
                kernels = [l.op for l in exe.launches if does_device_work(l.op)]
                at = [i for i, op in enumerate(kernels) if op == "ost.decode_attention_"]
                layer = kernels[at[0]:at[1]]
                want = ["ost.decode_attention_", "ost.linear_acc_", "ost.linear_out", "ost.fused", "ost.linear_acc_",
                        "ost.linear_out"]
                results[family] = (f"the attention ran its reference {len(fallbacks)} times" if fallbacks else
                                   "ok" if layer == want else f"a layer's launches: {layer}")
            except Exception as e:  # noqa: BLE001 - reported per case
                results[family] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        reference_ops.decode_attention_ = real
        # rows longer than one block of the row-scale group: its statistic over x (1100 wide) walked in chunks,
        # the gate/up rows (5000: a looped kernel) split over programs; biased gate and up projections: the
        # row-scale group adds each bias after the scale
        # (a LayerNorm's: its rows' mean 2 against their spread 3, over rows longer than a block too)
        # a lagging stream's (a biased product accumulated without its bias): the statistic of x plus its
        # shift, and the pre-scale bias, in the row-scale group, over one block and over longer rows
        for name, kwargs, width, biased in (("long_rows", {"hidden": 1100, "inter": 5000}, 1100, 0),
                                            ("biased_mlp", {"bias": True}, 64, 2),
                                            ("layer_norm_mlp", {"layer": True}, 64, 2),
                                            ("layer_norm_long_rows", {"layer": True, "hidden": 1100, "inter": 5000},
                                             1100, 2),
                                            ("lagged_mlp", {"layer": True, "lag": True}, 64, None),
                                            ("lagged_long_rows", {"lag": True, "hidden": 1100, "inter": 5000},
                                             1100, None)):
            try:
                torch.manual_seed(0)
                model = FoldedMLP(**kwargs).to(dtype).eval()
                args = ((torch.randn(24, 1, width) * 3 + 2).to(dtype),)
                prog = ostinato.export(model, args, passes=DEFAULT_PIPELINE)
                layer = kwargs.get("layer", False)
                scales = [n for n in prog.graph.nodes if n.op == "ost.row_scale"]
                if biased is None:      # (the lagging stream's: shift and pre on both row scales)
                    if len(scales) != 2 or any(len(n.args) != 8 or n.args[6] is None for n in scales):
                        raise AssertionError(f"not two lagging row scales: {prog.op_counts()}")
                elif sum(n.args[4] is not None and (len(n.args) == 6) == layer for n in scales
                         if len(n.args) > 4) != biased:
                    raise AssertionError(f"not {biased} biased row scales: {prog.op_counts()}")
                exe = fused_executable(prog, InterpretedFusionBackend())
                ops = [l.op for l in exe.launches if does_device_work(l.op)]
                want = ["ost.linear_out", "ost.fused", "aten.linear"]
                if biased is None:      # (x * 2, then the biased product accumulated into it)
                    want = ["aten.mul.Tensor", "ost.linear_acc_"] + want
                if ops != want:
                    raise AssertionError(f"launches {ops}")
                with torch.no_grad():
                    assert_same(exe(*args), model(*args), tol=2e-2)
                results[name] = "ok"
            except Exception as e:  # noqa: BLE001 - reported per case
                results[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        print(json.dumps(results))
        return
    if what == "edge":      # the reviewer's cases: each must equal eager (NaN where eager has NaN)
        from fusion_models import EDGE_CASES
        for name, (cls, make, exact) in EDGE_CASES.items():
            try:
                model, args = cls(), make()
                prog = ostinato.export(model, args, passes=GENERIC_PIPELINE)
                exe = fused_executable(prog, InterpretedFusionBackend())
                with torch.no_grad():
                    assert_same(exe(*args), model(*args), tol=0.0 if exact else 1e-5)
                results[name] = "ok"
            except Exception as e:  # noqa: BLE001 - reported per case
                results[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        print(json.dumps(results))
        return
    if what == "dynamic":    # symbolic sizes stay symbolic: one program, kernels run at several sizes
        from torch.export import Dim
        from fusion_models import GroupNormSiLU, RMSPlain
        # sizes off the block sizes, and both ends of each symbol's range (bounds: issue #17)
        cases = [("rms_seq", RMSPlain(), lambda n: (torch.randn(2, n, 64),), ({1: Dim("seq", min=1, max=300)},),
                  (1, 3, 7, 33, 300)),
                 ("gn_width", GroupNormSiLU(), lambda n: (torch.randn(2, 16, 5, n),),
                  ({3: Dim("w", min=2, max=130)},), (2, 3, 7, 33, 130))]
        for name, model, make, dyn, sizes in cases:
            try:
                model.eval()
                prog = ostinato.export(model, make(7), dynamic_shapes=dyn, passes=GENERIC_PIPELINE)
                exe = fused_executable(prog, InterpretedFusionBackend())
                for n in sizes:
                    args = make(n)
                    with torch.no_grad():
                        assert_same(exe(*args), model(*args), tol=1e-4, msg=f"size {n}:")
                results[name] = "ok"
            except Exception as e:  # noqa: BLE001 - reported per case
                results[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        print(json.dumps(results))
        return
    if what == "linear":     # matmul groups: one row, several, the most a group takes (16)
        from fusion_models import (BiasGeluHead, Conv1DBlock, DecoderLayer, LongLoneProjections, LoneProjections,
                                   PackedGatedMLP)
        from ostinato.backends.cuda.kernels import split_k
        from ostinato.backends.cuda.kernels.fused import launcher
        split_k._SPLIT_K_MIN_WEIGHTS = 0    # lone_long_k's small weights split as a Llama-1B down projection's
        # the default pipeline's ost.linear takes fc + GELU as one op (the activation becomes the epilogue);
        # the generic pipeline leaves aten.gelu for the scheduler
        items = [(f"decoder_rows{m}", lambda m=m: (DecoderLayer().to(dtype), DecoderLayer.inputs(m, dtype), None))
                 for m in (1, 3, 16)]
        items += [(f"conv1d_rows{m}", lambda m=m: (Conv1DBlock().to(dtype), Conv1DBlock.inputs(m, dtype), None))
                  for m in (1, 5)]
        items += [(f"packed_{act}_rows{m}", lambda m=m, act=act: (PackedGatedMLP(act=act).to(dtype),
                                                                   PackedGatedMLP.inputs(m, dtype), None))
                  for act, m in (("silu", 1), ("gelu", 3))]
        items.append(("lone_rows1", lambda: (LoneProjections().to(dtype), LoneProjections.inputs(1, dtype), None)))
        items.append(("lone_long_k", lambda: (LongLoneProjections().to(dtype), LongLoneProjections.inputs(1, dtype),
                                              None)))
        items.append(("bias_gelu_head", lambda: (BiasGeluHead().to(dtype), (torch.randn(2, 3, 48).to(dtype),
                                                                            torch.randn(2, 3, 80).to(dtype)),
                                                 GENERIC_PIPELINE)))
        items.append(("bias_gelu_head_patterns", lambda: (BiasGeluHead().to(dtype), (
            torch.randn(2, 3, 48).to(dtype), torch.randn(2, 3, 80).to(dtype)), None)))
        tol = TOL[dtype] * 4 if dtype == torch.float16 else TOL[dtype]
        for name, make in items:
            torch.manual_seed(0)
            try:
                model, args, passes = make()
                prog = ostinato.export(model.eval(), args, passes=passes)
                exe = fused_executable(prog, InterpretedFusionBackend())
                groups = [l for l in exe.launches if l.op == "ost.fused" and '"kind":"linear"' in l.args[0]]
                if not groups:
                    raise AssertionError(f"{len(groups)} matmul groups")
                transposed = sum('"wt":true' in l.args[0] for l in groups)
                if name.startswith("conv1d") and transposed < 3:    # all three Conv1D projections
                    raise AssertionError(f"{transposed} matmul groups read a transposed weight")
                if name.startswith("lone") and len(groups) != 2:      # proj, and q + k as one multi_linear
                    raise AssertionError(f"{len(groups)} matmul groups for two lone projections")
                halves = sum('"one_weight":true' in l.args[0] for l in groups)
                if name.startswith("packed") and halves != 1:       # the gate_up projection with its gating
                    raise AssertionError(f"{halves} matmul groups gate one weight's halves")
                with torch.no_grad():
                    assert_same(exe(*args), model(*args), tol=tol)
                    if name == "lone_long_k":   # twice: the counters were left at zero for the next launch
                        assert_same(exe(*args), model(*args), tol=tol)
                if name == "lone_long_k":   # (launchers are shared by spec: lone_rows1's K=64 plans are there too)
                    splits = {p.nsplit for l in groups for k, p in launcher(l.args[0])._plans.items()
                              if p is not None and k[0][0][0][-1] == 8192}
                    if splits != {4}:
                        raise AssertionError(f"split-K ways {splits}")
                results[name] = "ok"
            except Exception as e:  # noqa: BLE001 - reported per case
                results[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        print(json.dumps(results))
        return
    if what == "linear_dot":     # matmul groups past 16 rows (fp16: the tl.dot kernel) against eager
        os.environ["OSTINATO_DOT_ROWS"] = "64"      # (off by default)
        from fusion_models import Conv1DBlock, DecoderLayer, LoneProjections, PackedGatedMLP

        def rand(gen, *shape):
            return torch.randn(*shape, generator=gen).to(dtype)

        # (name, model class, inputs from a seeded generator, matmul groups expected)
        items = [(f"decoder_rows{m}", DecoderLayer, lambda g, m=m: (rand(g, m, 1, 64),), 4) for m in (17, 32, 48, 64)]
        items += [(f"conv1d_rows{m}", Conv1DBlock, lambda g, m=m: (rand(g, m, 1, 48),), 3) for m in (17, 32, 48, 64)]
        items.append(("packed_silu_rows48", PackedGatedMLP, lambda g: (rand(g, 48, 1, 64),), 2))
        items.append(("lone_rows32", LoneProjections, lambda g: (rand(g, 32, 64), rand(g, 32, 1, 64)), 2))
        for name, cls, make, expected in items:
            def case(name=name, cls=cls, make=make, expected=expected):
                model, args, exe, groups, left = _linear_case(cls, make, name, dtype)
                if len(groups) != expected or left:
                    raise AssertionError(f"{len(groups)} matmul groups, projections left: {left}")
                if name.startswith("conv1d") and sum('"wt":true' in l.args[0] for l in groups) != 3:
                    raise AssertionError("not every Conv1D projection reads its weight transposed")
                with torch.no_grad():
                    assert_same(exe(*args), model(*args), tol=TOL[dtype] * 4)
                for l in groups:    # each ran the tl.dot kernel
                    kinds = {p.kernel.library.module.split("_")[3][:2] for p in _plans(l)}
                    if kinds != {"md"}:
                        raise AssertionError(f"{l.name} ran {kinds} kernels, not the tl.dot one")
            results[name] = _check(case)
        print(json.dumps(results))
        return
    if what == "linear_pick":      # OSTINATO_DOT_PICK=prologue: q/k/v with their norm, down with its SwiGLU
        os.environ.update(OSTINATO_DOT_ROWS="64", OSTINATO_DOT_PICK="prologue")    # (off by default)
        print(json.dumps(_pick_cases(dtype)))
        return
    if what == "linear_tiled":     # matmul groups past 128 rows (fp16: the tl.dot kernel tiled over rows)
        os.environ["OSTINATO_TILED_LINEAR"] = "1"   # (off by default)
        from fusion_models import Conv1DBlock, ConvNeXtBlock, DecoderLayer, LoneProjections, PackedGatedMLP

        def rand(gen, *shape):
            return torch.randn(*shape, generator=gen).to(dtype)

        # (name, model class, inputs from a seeded generator, matmul groups expected, projections left
        # to cuBLAS): 129 rows (one past a block), 300 (a part-filled third block), 392 (2 x 14 x 14)
        # (the decoder's output projection has no pointwise neighbour: its residual add is in the second
        # norm's group)
        items = [(f"decoder_rows{m}", DecoderLayer, lambda g, m=m: (rand(g, m, 1, 64),), 3, 1) for m in (129, 300)]
        items += [("conv1d_rows300", Conv1DBlock, lambda g: (rand(g, 300, 1, 48),), 3, 0),
                  ("packed_gelu_rows200", lambda: PackedGatedMLP(act="gelu"), lambda g: (rand(g, 200, 1, 64),), 2, 0),
                  # (LayerNorm -> fc1 -> GELU is one group; fc2's layer scale and residual are read
                  # through the permute back, over the image's NCHW shape, not its rows: cuBLAS)
                  ("convnext_rows392", ConvNeXtBlock, lambda g: (rand(g, 2, 16, 14, 14),), 1, 1),
                  ("convnext_rows130", ConvNeXtBlock, lambda g: (rand(g, 2, 16, 1, 65),), 1, 1),
                  # wider results: several column blocks (192 columns in 128s; two slices of 160 in 64s)
                  ("convnext_wide_rows300", lambda: ConvNeXtBlock(48), lambda g: (rand(g, 2, 48, 10, 15),), 1, 1),
                  ("packed_wide_rows200", lambda: PackedGatedMLP(i=160), lambda g: (rand(g, 200, 1, 64),), 2, 0),
                  ("lone_rows300", LoneProjections, lambda g: (rand(g, 300, 64), rand(g, 300, 1, 64)), 0, 2)]
        from ostinato.backends.cuda.kernels.fused import forget_plans
        # each case twice: the row-stationary kernel (a short K: the default) and the K-loop one
        items = [(f"{name}_{kind}", *rest, kind) for name, *rest in items for kind in ("mr", "md")]
        for name, cls, make, expected, lone, kind in items:
            def case(name=name, cls=cls, make=make, expected=expected, lone=lone, kind=kind):
                os.environ["OSTINATO_TILED_KLOOP"] = "1" if kind == "md" else "0"
                forget_plans()
                model, args, exe, groups, left = _linear_case(cls, make, name, dtype)
                if len(groups) != expected or len(left) != lone:
                    raise AssertionError(f"{len(groups)} matmul groups, projections left: {left}")
                with torch.no_grad():
                    assert_same(exe(*args), model(*args), tol=TOL[dtype] * 4)
                for l in groups:    # each ran the tl.dot kernel over several blocks of rows
                    plans = _plans(l)
                    kinds = {p.kernel.library.module.split("_")[3][:2] for p in plans}
                    if kinds != {kind} or any(p.grid[1] < 2 or (kind == "mr" and p.grid[0] != 1) for p in plans):
                        raise AssertionError(f"{l.name} ran {kinds} kernels over grids {[p.grid for p in plans]}")
            results[name] = _check(case)
        print(json.dumps(results))
        return
    if what == "scan":       # a state-space scan: each token's update and its small matvec in one group
        from fusion_models import SelectiveScan
        torch.manual_seed(0)
        model, args = SelectiveScan(), SelectiveScan.inputs(dtype)
        steps = args[0].shape[2]

        def scan():
            # the pipeline of a program exported from CUDA tensors (small_matvec rewrites; not from CPU ones)
            prog = ostinato.export(model.eval(), args, passes=DEFAULT_PIPELINE)
            exe = fused_executable(prog, InterpretedFusionBackend())
            ops = fused_ops(exe)
            if ops.get("aten.bmm") or ops.get("aten.mm"):
                raise AssertionError(f"matmuls left: {ops}")
            reducing = [l for l in exe.launches if l.op == "ost.fused" and '"red":[2]' in l.args[0]]
            if len(reducing) != steps:      # one group per token: its state update and its sum
                raise AssertionError(f"{len(reducing)} reducing groups for {steps} tokens: {ops}")
            with torch.no_grad():
                assert_same(exe(*args), model(*args), tol=TOL[dtype] * (4 if dtype == torch.float16 else 1))
        print(json.dumps({"scan": _check(scan)}))
        return
    if what == "layout":     # fp16 convolutions lowered channels-last, as on CUDA
        print(json.dumps({"conv_net": _check(lambda: _layout_case(dtype))}))
        return
    if what == "zoo":
        items = [(c.name, lambda c=c: (*c.build(dtype), c.groups)) for c in CASES]
        tol = TOL[dtype]
    else:
        items = [(f"row{n}", lambda n=n: (Rows(n), (torch.randn(3, 5, n),), 2)) for n in (1, 3, 100, 4096, 5000)]
        items.append(("channels_last", lambda: (ChannelsLast(), (torch.randn(2, 16, 5, 6),), 1)))
        # rows longer than a register tile, walked in chunks over a channels-last tensor
        items.append(("channels_last_looped", lambda: (ChannelsLast(), (torch.randn(2, 16, 40, 40),), 1)))
        # a squeeze-excite pooling over channels-last pixels: rows across memory, several per tile (held
        # whole, and walked in chunks)
        items.append(("pooled_channels_last", lambda: (PooledChannelsLast(), (torch.randn(2, 16, 5, 6),), 1)))
        items.append(("pooled_channels_last_looped", lambda: (PooledChannelsLast(), (torch.randn(2, 24, 70, 70),), 1)))
        # a reduction-only group of few long rows, with NaN in one row: max/min keep it across split parts
        items.append(("few_long_rows_nan", lambda: (LongRowStats(), (_with_nan(torch.randn(3, 9000)),), 1)))
        # few long rows of a GroupNorm + SiLU (parts of unequal length) and of a variance about a value
        # other than the mean, over an input far from zero: a split row's centred pair (moment_pairs)
        items.append(("split_group_norm", lambda: (ResCore(64, 8), (torch.randn(2, 64, 40, 40) * 3 + 50,), None)))
        items.append(("split_shifted_moment", lambda: (ShiftedMoment(), (torch.randn(3, 9000) * 2 + 30,), 1)))
        # squares about a centre given from outside (not from the sum of x), with an inf in x: not a
        # centred pair (its parts would give inf - inf), inf as eager gives
        items.append(("split_outside_centre_inf", lambda: (OutsideCentre(), (_with_inf(torch.randn(3, 9000)),
                                                                              torch.zeros(3, 1)), 1)))
        tol = 1e-4
    for name, make in items:
        torch.manual_seed(0)
        try:
            model, args, groups = make()
            run(model, args, groups, tol)
            results[name] = "ok"
        except Exception as e:  # noqa: BLE001 - reported per case
            results[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    if what == "rows":
        results["split_outlier_part"] = _check(_outlier_part)
        results["split_rows"] = _split_rows_seen()
        results["column_rows"] = _column_rows_seen()
    print(json.dumps(results))


def _pick_groups(groups, half: bool) -> None:
    """The matmul groups OSTINATO_DOT_PICK=prologue leaves a decoder layer, each the tl.dot kernel: q/k/v
    (three slices) with an RMSNorm prologue (a sum of squares), down (one slice) with a SwiGLU one (a
    sigmoid over gate, times up); none in fp32 (max_rows: 16)."""
    if not half:
        if groups:
            raise AssertionError(f"{len(groups)} matmul groups in fp32")
        return
    specs = [json.loads(l.args[0]) for l in groups]
    qkv = [s for s in specs if len(s["w"]) == 3 and any(op[0] == "rsqrt" for op in s["pro"]["ops"])]
    down = [s for s in specs if len(s["w"]) == 1 and any(op[0] == "sigmoid" for op in s["pro"]["ops"])]
    if len(qkv) + len(down) != len(specs) or len(qkv) != len(down):
        raise AssertionError(f"matmul groups: {len(qkv)} q/k/v with a norm, {len(down)} down with SwiGLU, "
                             f"{len(specs)} in all")


def _ran_dot(groups) -> None:
    """Each matmul group ran the tl.dot kernel (its launch plans are made on its first run)."""
    for l in groups:
        kinds = {p.kernel.library.module.split("_")[3][:2] for p in _plans(l)}
        if kinds != {"md"}:
            raise AssertionError(f"{l.name} ran {kinds} kernels, not the tl.dot one")


def _pick_cases(dtype) -> dict:
    """A decoder layer with Llama's proportions (gate/up the heaviest) at 17, 32 and 48 rows: RMSNorm + q/k/v
    + their gating, and SwiGLU + down + bias + residual, against eager; o and gate/up left to cuBLAS. A
    transformers Llama (two layers, batch 32, two decode steps): add + RMSNorm + q/k/v (the add's sum
    stored for the next add) and SwiGLU + down each layer, the logits as close to eager's as those of the
    same program with every projection a cuBLAS call (OSTINATO_DOT_ROWS=16), within twice that plus an
    fp16 ulp of their scale (2**-10). In fp32 nothing moves (the same programs, every projection cuBLAS's)."""
    import copy
    from fusion_backend import batched_llama
    from fusion_models import DecoderLayer
    half = dtype in (torch.float16, torch.bfloat16)
    results = {}

    def rand(gen, *shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    for m in (17, 32, 48):
        def layer(m=m):
            model, args, exe, groups, left = _linear_case(lambda: DecoderLayer(i=128), lambda g: (rand(g, m, 1, 64),),
                                                          f"pick{m}", dtype)
            _pick_groups(groups, half)
            if sorted(left) != sorted(["aten.linear", "ost.multi_linear"] if half else
                                      ["ost.multi_linear", "aten.linear", "ost.multi_linear", "aten.linear"]):
                raise AssertionError(f"projections left to cuBLAS: {left}")
            with torch.no_grad():
                assert_same(exe(*args), model(*args), tol=TOL[dtype] * 4)
            _ran_dot(groups)
        results[f"decoder_rows{m}"] = _check(layer)

    def llama():
        wrapper, steps = batched_llama(32, dtype, layers=2, steps=2)
        prog = ostinato.export(copy.deepcopy(wrapper), (), steps[0], trace_strict=True)
        errors = {}
        for rows in ("64", "16"):
            os.environ["OSTINATO_DOT_ROWS"] = rows
            exe = fused_executable(prog, InterpretedFusionBackend())
            groups = [l for l in exe.launches if l.op == "ost.fused" and '"kind":"linear"' in l.args[0]]
            if rows == "64":
                _pick_groups(groups, half)
                if len(groups) != (4 if half else 0):
                    raise AssertionError(f"{len(groups)} matmul groups for two layers")
            ref, worst, scale = copy.deepcopy(wrapper), 0.0, 0.0
            for kwargs in steps:
                with torch.no_grad():
                    want = ref(**kwargs).float()
                got = exe(**kwargs).float()
                worst, scale = max(worst, (got - want).abs().max().item()), max(scale, want.abs().max().item())
            errors[rows] = worst, scale
            _ran_dot(groups)
        os.environ["OSTINATO_DOT_ROWS"] = "64"
        (pick, scale), (cublas, _) = errors["64"], errors["16"]
        if not pick <= 2 * cublas + scale * 2 ** -10:
            raise AssertionError(f"max |logits - eager's|: {pick:.3g} picked, {cublas:.3g} with cuBLAS "
                                 f"(scale {scale:.3g})")
    results["llama_b32"] = _check(llama)
    return results


class PooledChannelsLast(torch.nn.Module):
    """MobileNetV3's squeeze-excite input: an activation over a channels-last tensor and its mean over
    the pixels (a row per channel, strided by the channel count)."""

    def forward(self, x):
        a = torch.nn.functional.hardswish(x.contiguous(memory_format=torch.channels_last) * 2.0 + 1.0)
        return a, a.mean((2, 3), keepdim=True)


def _column_rows_seen() -> str:
    """Whether launches took rows across memory several per tile (OSTINATO_COLUMN_ROWS, on by default)."""
    from ostinato.backends.cuda.kernels.fused import _LAUNCHERS, column_rows_enabled
    columns = sum(getattr(p, "columns", False) for f in _LAUNCHERS.values() for p in getattr(f, "_plans", {}).values())
    if column_rows_enabled() != (columns > 0):
        return f"{columns} column launch plans with OSTINATO_COLUMN_ROWS={os.environ.get('OSTINATO_COLUMN_ROWS')}"
    return "ok"


class LongRowStats(torch.nn.Module):
    """Statistics only (no full-size output): mean, max, min and a centred sum of squares of each row."""

    def forward(self, x):
        m = x.mean(-1, keepdim=True)
        return m, x.amax(-1), x.amin(-1), ((x - m) ** 2).sum(-1)


class ShiftedMoment(torch.nn.Module):
    """Squares about the mean plus an offset, as a user might write a biased second moment."""

    def forward(self, x):
        c = x - (x.sum(-1, keepdim=True) / x.shape[-1] + 0.125)
        v = (c * c).sum(-1, keepdim=True) / x.shape[-1]
        return c * torch.rsqrt(v + 1e-5), v


class OutsideCentre(torch.nn.Module):
    def forward(self, x, c):
        return x.sum(-1, keepdim=True), ((x - c) ** 2).sum(-1, keepdim=True)


class Variance(torch.nn.Module):
    def forward(self, x):
        m = x.mean(-1, keepdim=True)
        return ((x - m) ** 2).mean(-1, keepdim=True)


def _outlier_part() -> None:
    """A split variance whose first part's mean is far from the rest (centred on the row's mean, the
    merge loses nothing: 2e-7 from float64; centred on part 0's, 2.9e-5)."""
    from ostinato.backends.cuda.kernels.fused import split_enabled
    torch.manual_seed(0)
    x = torch.randn(1, 262144) * 1e-2
    x[:, :1024] += 100.0
    prog = ostinato.export(Variance().eval(), (x,), passes=GENERIC_PIPELINE)
    out = fused_executable(prog, InterpretedFusionBackend())(x)
    out = out[0] if isinstance(out, (tuple, list)) else out
    exact = Variance()(x.double())
    err = ((out.double() - exact) / exact).abs().max().item()
    if err > 1e-6 and split_enabled():
        raise AssertionError(f"relative error {err:.3g} from float64")


def _with_inf(x):
    x[2, 17] = float("inf")
    return x


def _with_nan(x):
    x[1, 4321] = float("nan")
    return x


def _split_rows_seen() -> str:
    """Whether the launches split their long rows across programs as OSTINATO_SPLIT_REDUCTION asks."""
    from ostinato.backends.cuda.kernels.fused import _LAUNCHERS, split_enabled
    split = sum(p.ws_shape is not None for f in _LAUNCHERS.values() for p in getattr(f, "_plans", {}).values()
                if p is not None and hasattr(p, "ws_shape"))
    if split_enabled() != (split > 0):
        return f"{split} split launch plans with OSTINATO_SPLIT_REDUCTION={os.environ.get('OSTINATO_SPLIT_REDUCTION')}"
    # the centred pairs (moment_pairs) of the split norms and variances share a kernel: one fewer each
    from ostinato.codegen.triton_source import moment_pairs, split_slots
    paired = [(len(p.stages) + 1, split_slots(f.spec) + 1 - len(moment_pairs(f.spec)))
              for f in _LAUNCHERS.values() for p in getattr(f, "_plans", {}).values()
              if getattr(p, "ws_shape", None) is not None and moment_pairs(f.spec)]
    if split_enabled() and (len(paired) < 3 or any(k != want for k, want in paired)):
        return f"split launch plans with a centred pair (kernels, expected): {paired}"
    return "ok"


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
