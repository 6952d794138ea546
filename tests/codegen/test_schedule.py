"""The scheduler on modules written in users' styles: the groups it finds, and each group's torch
reference (the primitives the kernel computes) equal to eager on random inputs."""
from __future__ import annotations

import os
import sys

import pytest
import torch

import ostinato
from ostinato import codegen
from ostinato.codegen.spec import GroupSpec, LinearSpec, parse_spec

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fusion_backend import ReferenceFusionBackend, fused_executable, fused_ops, unfused_compute  # noqa: E402
from fusion_models import CASES  # noqa: E402
from helpers import assert_same  # noqa: E402

from ostinato.passes import GENERIC_PIPELINE as GENERIC  # noqa: E402


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_groups_and_reference(case, dtype):
    model, args = case.build(dtype)
    model.eval()
    prog = ostinato.export(model, args, passes=GENERIC)
    exe = fused_executable(prog, ReferenceFusionBackend())
    counts = fused_ops(exe)
    assert counts.get("ost.fused", 0) == case.groups, counts
    assert sorted(unfused_compute(exe)) == sorted(case.leftover), unfused_compute(exe)
    with torch.no_grad():
        ref = model(*args)
    # bf16: the eager CPU kernels round some intermediates the fused group keeps in fp32 (layer norm)
    assert_same(exe(*args), ref, tol=2e-2 if dtype == torch.bfloat16 else None)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_default_pipeline_still_fuses(case):
    """With the hand patterns on (ost.rms_norm, ost.layer_norm, ...) the same chains fuse with their neighbours."""
    model, args = case.build(torch.float32)
    model.eval()
    prog = ostinato.export(model, args)
    exe = fused_executable(prog, ReferenceFusionBackend())
    assert not unfused_compute(exe) or set(unfused_compute(exe)) <= set(case.leftover)
    with torch.no_grad():
        assert_same(exe(*args), model(*args))


def test_conv_bias_added_by_the_reading_group(monkeypatch):
    """The convolutions whose result one group reads run without their bias (the group adds it); the one
    whose result is read twice by different kernels, and the output's, keep it; OSTINATO_FUSE_CONV_BIAS=0
    keeps them all. Values match eager either way."""
    case = next(c for c in CASES if c.name == "conv_bias_epilogues")
    model, args = case.build(torch.float32)
    prog = ostinato.export(model.eval(), args)
    with torch.no_grad():
        ref = model(*args)

    def biased(exe):
        return [l.args[2] is not None for l in exe.launches if l.op == "aten.convolution"]

    exe = fused_executable(prog, ReferenceFusionBackend())
    assert biased(exe) == [False, False, True, False, True]
    assert_same(exe(*args), ref)
    monkeypatch.setenv("OSTINATO_FUSE_CONV_BIAS", "0")
    exe = fused_executable(prog, ReferenceFusionBackend())
    assert biased(exe) == [True] * 5 and fused_ops(exe).get("ost.fused", 0) == 1
    assert_same(exe(*args), ref)


def test_depthwise_conv_bias_stays_in_torchs_kernel_unless_channels_last():
    """torch's depthwise kernels over NCHW add the bias as they write: the scheduler leaves it there; run
    channels-last (cuDNN, the bias a kernel of its own) the group reading the result takes it."""
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.SiLU()).eval()
    x = torch.randn(2, 8, 6, 5)
    prog = ostinato.export(model, (x,))
    conv = next(n for n in prog.graph.nodes if n.op == "aten.convolution")

    def conv_item(channels_last):
        items = codegen.schedule(prog.graph, channels_last)
        return next(i for i in items if getattr(i, "op", None) == "aten.convolution"), items

    item, items = conv_item(frozenset())
    assert item.args[2] is not None and not any(isinstance(i, codegen.FusionGroup) for i in items)
    item, items = conv_item(frozenset({conv.name}))
    assert item.args[2] is None and sum(isinstance(i, codegen.FusionGroup) for i in items) == 1


class BroadcastProducers(torch.nn.Module):
    """Chains over small tensors broadcast into the groups reading them (computed inside them), one reading
    a buffer the graph writes."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(2, 1, 8))

    def forward(self, x, y, s):
        t = s * 2.0 + 1.0                       # [2, 1, 8]: two lone nodes, both inlined
        a = torch.tanh(x) * t + x
        u = s.exp()
        b, c = torch.sigmoid(x * 3.0) + u, torch.relu(y * 2.0) - u
        w = self.cache.neg()
        self.cache.copy_(s * 0.5)               # s * 0.5 only feeds the write: it stays torch's
        return a, b, c, torch.sin(y) * w + y


def test_strided_copies_are_generated_kernels(monkeypatch):
    """A lone copy of a permuted view and a repeat (the copy of an expanded view) are generated kernels;
    the copy of a dense input stays torch's; OSTINATO_FUSE_STRIDED_COPIES=0 leaves all three to torch.
    Every variant equals eager."""
    from fusion_models import StridedCopies
    model, args = StridedCopies(), (torch.randn(3, 5, 32), torch.randn(4, 6, 8))
    prog = ostinato.export(model, args)
    ops = [n.op for n in prog.graph.nodes]
    assert "aten.repeat" not in ops and "aten.expand" in ops, ops      # decomposed at export
    with torch.no_grad():
        ref = model(*args)
    exe = fused_executable(prog, ReferenceFusionBackend())
    assert fused_ops(exe).get("ost.fused") == 2 and fused_ops(exe).get("aten.clone") == 1, fused_ops(exe)
    assert_same(exe(*args), ref)
    monkeypatch.setenv("OSTINATO_FUSE_STRIDED_COPIES", "0")
    off = fused_executable(prog, ReferenceFusionBackend())
    assert "ost.fused" not in fused_ops(off) and fused_ops(off).get("aten.clone") == 3, fused_ops(off)
    assert_same(off(*args), ref)


def test_broadcast_producers_computed_in_the_group():
    model = BroadcastProducers().eval()
    args = (torch.randn(2, 5, 8), torch.randn(2, 5, 8), torch.randn(2, 1, 8))
    prog = ostinato.export(model, args, passes=GENERIC)
    groups = [g for g in codegen.schedule(prog.graph) if isinstance(g, codegen.FusionGroup)]
    small = {n.outputs[0].id for n in prog.graph.nodes if n.op in ("aten.mul.Tensor", "aten.add.Tensor", "aten.exp")
             and n.outputs[0].meta.shape == (2, 1, 8)}
    assert len(small) == 4 and all(any(v.id in small for n in g.nodes for v in n.outputs) for g in groups
                                   if "aten.tanh" in [n.op for n in g.nodes])
    exe = fused_executable(prog, ReferenceFusionBackend())
    assert unfused_compute(exe) == ["aten.mul.Tensor"], unfused_compute(exe)
    ref = BroadcastProducers().eval()
    for _ in range(2):      # the second call reads the cache the first wrote
        with torch.no_grad():
            want = ref(*args)
        assert_same(exe(*args), want)


def test_spec_round_trip_and_rejects_bad_json():
    model, args = CASES[0].build(torch.float32)
    prog = ostinato.export(model.eval(), args, passes=GENERIC)
    groups = [g for g in codegen.schedule(prog.graph) if isinstance(g, codegen.FusionGroup)]
    assert len(groups) == 1
    text = groups[0].spec.to_json()     # a matmul group: the norm with the projection after it
    assert isinstance(groups[0].spec, LinearSpec) and parse_spec(text).to_json() == text
    inner = groups[0].spec.pro.to_json()
    assert GroupSpec.from_json(inner).to_json() == inner
    for bad in (text.replace('"rsqrt"', '"system"'), text.replace('"rank":3', '"rank":99'),
                text.replace('"v":1', '"v":7'), text.replace('"w":[64]', '"w":[]'),
                text.replace('"a":0', '"a":9'), text.replace('"dt":"f32"', '"dt":"i64"')):
        assert bad != text
        with pytest.raises(ValueError):
            parse_spec(bad)


def test_group_is_closed_by_an_outside_reader():
    """A value read by a node outside the group (a matmul) must exist before that node: the chain after
    the matmul is a second group, not a continuation of the first."""
    class M(torch.nn.Module):
        def forward(self, x, w):
            a = torch.relu(x) * 2.0
            b = a @ w
            return torch.sigmoid(b) + a.sum(-1, keepdim=True)

    x, w = torch.randn(4, 8), torch.randn(8, 8)
    prog = ostinato.export(M(), (x, w), passes=GENERIC)
    exe = fused_executable(prog, ReferenceFusionBackend())
    ops = [l.op for l in exe.launches]
    assert ops.index("aten.mm") < len(ops) - 1 and ops[-1] == "ost.fused"
    assert_same(exe(x, w), M()(x, w))


def test_state_write_is_not_crossed():
    """A group reading a buffer before an in-place state write must run before the write."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("cache", torch.zeros(4, 8))

        def forward(self, x, pos):
            before = torch.exp(self.cache) * 2.0
            self.cache.index_copy_(0, pos, x)
            return before + 1.0, self.cache * 3.0

    m = M()
    prog = ostinato.export(m, (torch.randn(1, 8), torch.tensor([1])))
    exe = fused_executable(prog, ReferenceFusionBackend())
    ref = M()
    for step in range(3):
        x, pos = torch.randn(1, 8), torch.tensor([step])
        with torch.no_grad():
            expected = ref(x, pos)
        assert_same(exe(x, pos), expected)


def test_fusion_off_switch(monkeypatch):
    from ostinato.backends.cuda.backend import CUDABackend
    monkeypatch.setenv("OSTINATO_FUSION", "0")
    assert not codegen.fusion_enabled()
    assert CUDABackend.plan_key_parts(object.__new__(CUDABackend)) == {"fusion": "off", "conv": "auto"}
    monkeypatch.setenv("OSTINATO_CONV_LAYOUT", "nchw")
    assert CUDABackend.plan_key_parts(object.__new__(CUDABackend))["conv"] == "nchw"


@pytest.mark.parametrize("family", ["llama", "gemma", "gpt2", "qwen3", "gemma3"])
def test_hf_decoders_decode_with_fusion(family):
    """transformers' models as their authors wrote them: several decode steps with fusion equal eager, and
    the static cache's scalar bookkeeping (cumulative_length's copy and adds) is one kernel per layer."""
    from fusion_backend import hf_decode_matches
    from ostinato.codegen.report import launch_table

    prog = hf_decode_matches(family, ReferenceFusionBackend(), 4)
    kinds = [r["kind"] for r in launch_table(prog.graph, "cuda")]
    if family != "gpt2":
        assert "aten.copy" not in kinds and "aten.add.Tensor" not in kinds, kinds


@pytest.mark.parametrize("name", ["short_and_rows", "half_compare", "nan_rows", "floor_div", "empty_rows",
                                  "empty_batch"])
def test_edge_cases_reference(name):
    from fusion_models import EDGE_CASES
    cls, make, exact = EDGE_CASES[name]
    model, args = cls(), make()
    prog = ostinato.export(model, args, passes=GENERIC)
    exe = fused_executable(prog, ReferenceFusionBackend())
    with torch.no_grad():
        assert_same(exe(*args), model(*args), tol=0.0 if exact else 1e-5)


def test_lone_node_takes_its_broadcast_producer():
    """A lone pointwise node reading a lone pointwise node's smaller result becomes one group of both."""

    class Gate(torch.nn.Module):
        def forward(self, x, s):
            return x * torch.sigmoid(s)

    args = (torch.randn(2, 8, 3, 4), torch.randn(2, 8, 1, 1))
    prog = ostinato.export(Gate(), args, passes=GENERIC)
    groups = [g for g in codegen.schedule(prog.graph) if isinstance(g, codegen.FusionGroup)]
    assert [sorted(n.op for n in g.nodes) for g in groups] == [["aten.mul.Tensor", "aten.sigmoid"]]
    exe = fused_executable(prog, ReferenceFusionBackend())
    assert not unfused_compute(exe)
    assert_same(exe(*args), Gate()(*args))


class GatherOwnValue(torch.nn.Module):
    """A gather from a value computed just before it, which the same expression also reads pointwise."""

    def forward(self, x, idx):
        y = x * 2 + 1
        return torch.gather(y, 1, idx) + y[:, :3]


def test_gather_reads_its_input_from_memory():
    """The gathered value is an output of an earlier kernel, never a register value of the gather's own
    group (which would read it at other positions than it computed it); the result equals eager."""
    g = torch.Generator().manual_seed(1)
    x, idx = torch.randn(4, 6, generator=g), torch.randint(0, 6, (4, 3), generator=g)
    prog = ostinato.export(GatherOwnValue(), (x, idx), passes=GENERIC)
    items = codegen.schedule(prog.graph)
    groups = [it for it in items if isinstance(it, codegen.FusionGroup)]
    holder = {n.op: k for k, gr in enumerate(groups) for n in gr.nodes}
    assert "aten.gather" in holder and holder["aten.gather"] != holder["aten.mul.Tensor"]
    gathered = next(gr for gr in groups if any(n.op == "aten.gather" for n in gr.nodes))
    assert [i[1] for i in gathered.spec.inputs].count("g") == 1
    exe = fused_executable(prog, ReferenceFusionBackend())
    assert_same(exe(x, idx), GatherOwnValue()(x, idx))


def test_gather_spec_checks_and_out_of_range_reads_zero():
    from ostinato.codegen.reference import _gathered
    base = {"v": 1, "rank": 2, "red": [], "scalars": [], "split": [],
            "inputs": [["f32", "g", 0, 1], ["i64", "x", 0]],
            "ops": [["in", "i64", "x", 1], ["gather", "f32", "x", 0, 0]], "outputs": [[1, "f32", "x", True]]}
    GroupSpec.from_dict(base)
    bad = [("in", {"ops": [["in", "f32", "x", 0]], "outputs": [[0, "f32", "x", True]]}),      # a "g" input loaded
           ("x input", {"inputs": [["f32", "x", 0], ["i64", "x", 0]]}),                       # gather of an "x" input
           ("float index", {"inputs": [["f32", "g", 0, 1], ["f32", "x", 0]],
                            "ops": [["in", "f32", "x", 1], ["gather", "f32", "x", 0, 0]]}),
           ("dim", {"inputs": [["f32", "g", 0, 2], ["i64", "x", 0]]}),
           ("split", {"rank": 3, "red": [2], "split": [0, 2]})]
    for what, change in bad:
        with pytest.raises(ValueError):
            GroupSpec.from_dict({**base, **change})
    x = torch.arange(12.0).view(3, 4)
    got = _gathered(x, 1, torch.tensor([[0, 3, 4, -1]]).expand(3, 4), (3, 4))
    assert torch.equal(got, torch.tensor([[0.0, 3, 0, 0], [4, 7, 0, 0], [8, 11, 0, 0]]))


class GatherEdges(torch.nn.Module):
    """Gathers the kernels must not take: a result broadcast over a dim its input is longer in (eager
    reads the input's first row there), and a per-row index inside a reduction's group (a selected
    log-probability beside its logsumexp)."""

    def forward(self, x, idx, y, logits, target):
        g = torch.gather(x, 1, idx) * 2 + y                       # [1, 4] result over a [3, 4] space
        lse = torch.logsumexp(logits, 1, keepdim=True)
        return g, lse - torch.gather(logits, 1, target)


def test_gathers_the_kernels_refuse_still_match():
    g = torch.Generator().manual_seed(2)
    args = (torch.randn(5, 7, generator=g), torch.randint(0, 7, (1, 4), generator=g), torch.randn(3, 4, generator=g),
            torch.randn(6, 10, generator=g), torch.randint(0, 10, (6, 1), generator=g))
    prog = ostinato.export(GatherEdges(), args, passes=GENERIC)
    groups = [it for it in codegen.schedule(prog.graph) if isinstance(it, codegen.FusionGroup)]
    for gr in groups:
        for n in gr.nodes:
            if n.op == "aten.gather":      # taken only in its own space, never in a reduction's
                assert tuple(gr.space.shape) == tuple(n.outputs[0].meta.shape) and not gr.space.red
    assert any(n.op == "aten.gather" for gr in groups for n in gr.nodes)      # the first, in its [1, 4]
    exe = fused_executable(prog, ReferenceFusionBackend())
    assert_same(exe(*args), GatherEdges()(*args))


def test_repeat_is_one_copy_and_high_ranks_stay_torchs():
    """repeat exports as one copy of an expanded view, a generated kernel; one whose view would pass the
    kernels' rank (5 repeats: rank 10) stays torch's copy. Both equal eager, at another batch too."""
    from ostinato.frontend.export import _repeat

    class Repeats(torch.nn.Module):
        def forward(self, x):
            return x.repeat(2, 3) * 2, x.repeat(3, 2, 1, 2, 1)

    for shape, reps in [((3, 5, 2), (4, 1, 1)), ((2, 3), (2, 3)), ((4,), (2, 3)), ((2, 0, 3), (2, 2, 2))]:
        x = torch.randn(shape)
        assert torch.equal(_repeat(x, reps), x.repeat(*reps)), (shape, reps)
    x = torch.randn(3, 4)
    prog = ostinato.export(Repeats(), (x,), dynamic_shapes=({0: torch.export.Dim("b", min=2, max=16)},))
    assert prog.op_counts().get("aten.clone") == 2 and "aten.repeat" not in prog.op_counts()
    exe = fused_executable(prog, ReferenceFusionBackend())
    assert fused_ops(exe).get("ost.fused") == 1 and fused_ops(exe).get("aten.clone") == 1, fused_ops(exe)
    for a in (x, torch.randn(7, 4)):
        assert_same(exe(a), Repeats()(a))


def test_bytes_moved_counts_what_broadcast_and_gathered_inputs_read():
    """inspect's bytes: a repeat's copy reads its source once (not the expanded view's size); a gather
    reads at most one element of its input per element of the space (not the whole input)."""
    from fusion_models import RelativeScores, StridedCopies, _relative
    prog = ostinato.export(StridedCopies(), (torch.randn(3, 5, 32), torch.randn(4, 6, 8)))
    groups = [g for g in codegen.schedule(prog.graph) if isinstance(g, codegen.FusionGroup)]
    repeat = next(g for g in groups if tuple(g.space.shape) == (3, 4, 6, 8) or len(g.space.shape) == 6)
    assert repeat.bytes_moved() == (4 * 6 * 8 + 12 * 6 * 8) * 4
    model, args = _relative(torch.float32)
    prog = ostinato.export(model, args)
    (scores,) = [g for g in codegen.schedule(prog.graph) if isinstance(g, codegen.FusionGroup)
                 and any(n.op == "aten.gather" for n in g.nodes)]
    space = 6 * 7 * 7
    # qk scores, two gathers (each <= the space) and their two [7, 7] indices, the softmax's output
    assert scores.bytes_moved() == (space + 2 * space + space) * 4 + 2 * 7 * 7 * 8


@pytest.mark.parametrize("lone", ["1", "0"])
def test_lone_one_row_projections_are_matmul_groups(lone, monkeypatch):
    """A one-row projection with no neighbour is a matmul group of its own (OSTINATO_LONE_GEMV=0 keeps
    cuBLAS); with three rows it stays a cuBLAS call either way. Outputs equal eager through the reference."""
    from fusion_models import LoneProjections
    from ostinato.codegen.report import launch_table
    monkeypatch.setenv("OSTINATO_LONE_GEMV", lone)
    for rows in (1, 3):
        torch.manual_seed(0)
        model = LoneProjections().eval()
        args = LoneProjections.inputs(rows, torch.float32)
        prog = ostinato.export(model, args)
        kinds = [r["kind"] for r in launch_table(prog.graph, "cuda")]
        groups = kinds.count("fused")
        assert groups == (2 if rows == 1 and lone == "1" else 0), (rows, kinds)
        with torch.no_grad():
            for got, want in zip(fused_executable(prog, ReferenceFusionBackend())(*args), model(*args)):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_dot_rows_take_half_dtypes_up_to_the_switch(monkeypatch):
    """Past 16 rows a projection is a matmul group (the tl.dot kernel) in fp16/bf16 up to OSTINATO_DOT_ROWS
    rows (off by default), its neighbours and lone ones alike (OSTINATO_LONE_GEMV=0: lone ones stay
    cuBLAS calls); fp32 stays cuBLAS's (a tl.dot would be TF32), and so do more rows and the switch at 16.
    The switch is part of the CUDA plan key. Outputs equal eager through the reference."""
    from fusion_models import DecoderLayer, LoneProjections
    from ostinato.backends.cuda.backend import CUDABackend
    from ostinato.codegen.linear import LINEAR_OPS
    from ostinato.codegen.report import launch_table

    def groups(cls, rows, dtype):
        """The matmul groups of ``cls`` at ``rows`` rows in ``dtype``."""
        torch.manual_seed(0)
        model = cls().eval().to(dtype)
        args = cls.inputs(rows, dtype)
        prog = ostinato.export(model, args)
        with torch.no_grad():
            assert_same(fused_executable(prog, ReferenceFusionBackend())(*args), model(*args))
        return sum(r["kind"] == "fused" and bool(set(r["ops"]) & set(LINEAR_OPS)) for r in launch_table(prog.graph, "cuda"))

    def key():
        return CUDABackend.plan_key_parts(object.__new__(CUDABackend))["fusion"]

    default = key()
    assert "dotrows" not in default
    assert groups(DecoderLayer, 32, torch.float16) == 0        # off by default
    monkeypatch.setenv("OSTINATO_DOT_ROWS", "64")
    assert key().endswith("-dotrows64")
    for dtype in (torch.float16, torch.bfloat16):
        assert groups(DecoderLayer, 17, dtype) == groups(DecoderLayer, 64, dtype) == 4
        assert groups(LoneProjections, 32, dtype) == 2
        assert groups(DecoderLayer, 65, dtype) == 0
    assert groups(DecoderLayer, 32, torch.float32) == 0
    monkeypatch.setenv("OSTINATO_LONE_GEMV", "0")
    # the output projection has no neighbour of its own (the residual add goes to the next norm's group)
    assert groups(LoneProjections, 32, torch.float16) == 0 and groups(DecoderLayer, 32, torch.float16) == 3
    monkeypatch.delenv("OSTINATO_LONE_GEMV")
    monkeypatch.setenv("OSTINATO_DOT_ROWS", "32")
    assert groups(DecoderLayer, 32, torch.float16) == 4 and groups(DecoderLayer, 33, torch.float16) == 0
    assert key() != default and key().endswith("-dotrows32")
    monkeypatch.setenv("OSTINATO_DOT_ROWS", "16")
    assert groups(DecoderLayer, 17, torch.float16) == 0 and groups(DecoderLayer, 16, torch.float16) == 3
    assert key() == default
    monkeypatch.setenv("OSTINATO_DOT_ROWS", "256")
    with pytest.raises(ValueError, match="OSTINATO_DOT_ROWS"):
        key()


class _HeadedDecoder(torch.nn.Module):
    """Two decoder layers with Llama's proportions (gate/up the heaviest of a layer), a final RMSNorm and a
    head heavier than any of the layers' projections."""

    def __init__(self):
        super().__init__()
        from fusion_models import DecoderLayer
        self.layers = torch.nn.ModuleList(DecoderLayer(i=128) for _ in range(2))
        self.w = torch.nn.Parameter(torch.rand(64) + 0.5)
        self.head = torch.nn.Linear(64, 1024, bias=False)

    def forward(self, x):
        from fusion_models import DecoderLayer
        for layer in self.layers:
            x = layer(x)
        return self.head(DecoderLayer._rms(x, self.w))


def test_dot_pick_prologue_moves_the_lighter_projections(monkeypatch):
    """OSTINATO_DOT_PICK=prologue (with OSTINATO_DOT_ROWS): past 16 rows only projections that take a
    prologue launched on its own otherwise are tl.dot matmul groups, all but the heaviest of them and no
    head. A decoder layer with Llama's proportions: RMSNorm + q/k/v (gated after) and SwiGLU + down +
    residual are the two groups, o and gate/up stay cuBLAS calls and the second norm its own launch (5
    launches; 9 by default, 4 with every projection moved). With q/k/v as heavy as gate/up both stay, and
    the output projection takes the gating as its prologue instead. A head heavier than the layers'
    projections stays cuBLAS's, the layers as before. Nothing changes without OSTINATO_DOT_ROWS, nor at 16
    rows or past OSTINATO_DOT_ROWS; the pick is part of the plan key; a bad value is refused. Outputs equal
    eager through the reference."""
    from fusion_models import DecoderLayer
    from ostinato.backends.cuda.backend import CUDABackend
    from ostinato.codegen.report import launch_table

    def launches(model, rows=32):
        """Each launch of ``model`` at ``rows`` rows in fp16 as its ops, a matmul group's in a tuple."""
        torch.manual_seed(0)
        model = model.eval().to(torch.float16)
        args = DecoderLayer.inputs(rows, torch.float16)
        prog = ostinato.export(model, args)
        with torch.no_grad():
            assert_same(fused_executable(prog, ReferenceFusionBackend())(*args), model(*args))
        return [tuple(r["ops"]) if r["kind"] == "fused" else r["kind"] for r in launch_table(prog.graph, "cuda")]

    def key():
        return CUDABackend.plan_key_parts(object.__new__(CUDABackend))["fusion"]

    monkeypatch.setenv("OSTINATO_DOT_PICK", "prologue")
    default = key()
    assert "pick" not in default and launches(DecoderLayer(i=128)) == [
        "ost.rms_norm", "ost.multi_linear", ("aten.sigmoid", "aten.mul.Tensor", "aten.add.Tensor"), "aten.linear",
        "ost.add_rms_norm", "ost.multi_linear", "ost.swiglu", "aten.linear", "aten.add.Tensor"]    # (no DOT_ROWS)
    monkeypatch.setenv("OSTINATO_DOT_ROWS", "64")
    assert key().endswith("-dotrows64-pickprologue")
    qkv = ("ost.rms_norm", "ost.multi_linear", "aten.sigmoid", "aten.mul.Tensor", "aten.add.Tensor")
    down = ("ost.swiglu", "aten.linear", "aten.add.Tensor")
    layer = [qkv, "aten.linear", "ost.add_rms_norm", "ost.multi_linear", down]
    for rows in (17, 32, 64):
        assert launches(DecoderLayer(i=128), rows) == layer, rows
    picked = {rows: launches(DecoderLayer(i=128), rows) for rows in (16, 65)}   # the GEMV kernel's rows, too many
    # q/k/v (3 x 64 x 64) as heavy as gate/up (2 x 96 x 64): both stay, o takes the gating
    assert launches(DecoderLayer()) == ["ost.rms_norm", "ost.multi_linear", ("aten.sigmoid", "aten.mul.Tensor",
                                        "aten.add.Tensor", "aten.linear"), "ost.add_rms_norm", "ost.multi_linear", down]
    # (each layer's residual add goes to the next add + RMSNorm: the first down has no epilogue)
    first = [qkv, *layer[1:4], ("ost.swiglu", "aten.linear")]
    second = [("ost.add_rms_norm", *qkv[1:]), *first[1:]]
    assert launches(_HeadedDecoder()) == [*first, *second, "ost.add_rms_norm", "aten.linear"]
    monkeypatch.setenv("OSTINATO_DOT_PICK", "all")
    assert key().endswith("-dotrows64") and len(launches(DecoderLayer(i=128))) == 4
    assert picked == {rows: launches(DecoderLayer(i=128), rows) for rows in (16, 65)}, picked
    monkeypatch.setenv("OSTINATO_DOT_PICK", "some")
    with pytest.raises(ValueError, match="OSTINATO_DOT_PICK"):
        key()


def test_dot_pick_batched_llama_takes_six_launches_per_layer(monkeypatch):
    """Issue #15 at batch 32 (bf16 transformers Llama, three layers): OSTINATO_DOT_ROWS=64 with
    OSTINATO_DOT_PICK=prologue is 6 launches a layer (add + RMSNorm + q/k/v, attention, o, add + RMSNorm,
    gate/up, SwiGLU + down; the final norm and the LM head stay as they were), against 5 with every
    projection moved and 8 by default."""
    from fusion_backend import batched_llama
    from ostinato.codegen.report import launch_table
    wrapper, steps = batched_llama(32, torch.bfloat16)
    prog = ostinato.export(wrapper, (), steps[0], trace_strict=True)

    def kinds():
        return [tuple(r["ops"]) if r["kind"] == "fused" else r["kind"] for r in launch_table(prog.graph, "cuda")]

    default = kinds()
    monkeypatch.setenv("OSTINATO_DOT_ROWS", "64")
    every = kinds()
    monkeypatch.setenv("OSTINATO_DOT_PICK", "prologue")
    picked = kinds()
    for got, per_layer in ((default, 8), (every, 5), (picked, 6)):
        at = [i for i, k in enumerate(got) if k == "ost.decode_attention_"]
        assert len(at) == 3 and at[1] - at[0] == at[2] - at[1] == per_layer, got
    at = picked.index("ost.decode_attention_", picked.index("ost.decode_attention_") + 1)
    assert picked[at - 1:at + 6] == [("ost.add_rms_norm", "ost.multi_linear"), "ost.decode_attention_", "aten.linear",
                                     "ost.add_rms_norm", "ost.multi_linear", ("ost.swiglu", "aten.linear"),
                                     ("ost.add_rms_norm", "ost.multi_linear")], picked
    assert picked[-2:] == default[-2:] == ["ost.add_rms_norm", "aten.linear"], picked
