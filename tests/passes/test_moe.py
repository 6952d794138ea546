"""passes/patterns/moe.py: a mixture of experts' decode MLP becomes ost.moe_up + ost.moe_down.

On transformers' own modeling code (from_config, random weights, the static-cache decode step): Mixtral
with both experts implementations (grouped_mm, the default; batched_mm), Qwen3-MoE (top 4 of 8, weights
cast back to bf16), OLMoE (not normalized) and GraniteMoe (top-k of the logits first, then the softmax over
them) make 6 launches a layer and match eager. On modules written
here in other styles: the forms it takes fuse and match eager on random inputs; the forms it does not take
(separate gate and up weights, a prefill) stay as they were, and match too.
"""
from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn.functional as F

import ostinato
from ostinato.ir import Value
from ostinato.passes.manager import DEFAULT_PIPELINE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects")


def _census():
    sys.path.insert(0, ROOT)
    from bench import launch_census
    return launch_census


@pytest.mark.parametrize("family, check", [("mixtral", True), ("mixtral-batched_mm", False), ("qwen3_moe", True),
                                           ("olmoe", False), ("granitemoe", True), ("qwen2_moe", True)])
def test_transformers_moe_layers_take_six_launches(family, check):
    """Qwen2-MoE's shared expert (its down projection, sigmoid gate and the add) joins the sum's kernel."""
    r = _census().census_one(family, "sdpa", 1, check=check)
    assert r["error"] is None, r
    assert r["per_layer"] == 6 and r["unfused_per_layer"] == {}, r
    down = "ost.moe_down_shared" if family == "qwen2_moe" else "ost.moe_down"
    assert r["per_layer_launches"]["ost.moe_up"] == 1 and r["per_layer_launches"][down] == 1, r
    if check:
        assert r["fp32_ok"] and r["bf16_max_diff"] == 0.0, r   # the CPU runs the references: eager's ops


class Experts(torch.nn.Module):
    """A top-k MoE MLP written as transformers' batched_mm experts are, with the variations its models
    take: ids clamped (transformers 5.17), routing weights normalized or not, cast to the input's dtype or
    not; ``packed=False`` writes separate gate and up weights (a form the pattern leaves alone);
    ``leak`` also returns the routing weights (read outside the chain)."""

    def __init__(self, hidden=48, inter=40, experts=6, k=2, normalize=True, cast=False, clamp=False,
                 packed=True, leak=False, gelu=False, topk_first=False):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.router = torch.nn.Parameter(torch.randn(experts, hidden, generator=g))
        self.gate_up = torch.nn.Parameter(torch.randn(experts, 2 * inter, hidden, generator=g) * 0.2)
        self.down = torch.nn.Parameter(torch.randn(experts, hidden, inter, generator=g) * 0.2)
        self.k, self.normalize, self.cast, self.clamp, self.packed, self.leak = k, normalize, cast, clamp, packed, leak
        self.act = F.gelu if gelu else F.silu
        self.experts, self.topk_first = experts, topk_first

    def forward(self, x):
        t, hidden = x.shape
        logits = F.linear(x, self.router)
        if self.topk_first:      # GraniteMoe, GPT-OSS: the top k logits, then their softmax
            vals, ids = torch.topk(logits.float(), self.k, dim=-1)
            vals = torch.softmax(vals, dim=-1)
        else:
            probs = F.softmax(logits, dim=-1, dtype=torch.float)
            vals, ids = torch.topk(probs, self.k, dim=-1)
        if self.normalize and not self.topk_first:
            vals = vals / vals.sum(dim=-1, keepdim=True)
        weights = vals.to(x.dtype) if self.cast else vals
        flat = ids.reshape(-1)
        if self.clamp:
            flat = flat.clamp(0, self.experts - 1)
        rows = x.repeat_interleave(self.k, dim=0)
        up = torch.bmm(self.gate_up[flat], rows.unsqueeze(-1)).squeeze(-1)
        if self.packed:
            gate, u = up.chunk(2, dim=-1)
            h = self.act(gate) * u
        else:
            n = up.shape[-1] // 2
            h = self.act(up[..., :n].clone()) * up[..., n:].contiguous()
        down = torch.bmm(self.down[flat], h.unsqueeze(-1)).squeeze(-1)
        out = (down * weights.reshape(-1).unsqueeze(-1)).view(t, self.k, hidden).sum(dim=1).to(x.dtype)
        return (out, vals) if self.leak else out


class WithShared(torch.nn.Module):
    """Routed experts plus a shared expert added, as Qwen2-MoE writes it (``gated``: scaled by
    ``sigmoid(x @ w_g)``; ``gelu``: a GeGLU shared expert; ``leak``: its output also returned)."""

    def __init__(self, gated=True, gelu=False, leak=False, shared_inter=56, **kw):
        super().__init__()
        self.experts = Experts(**kw)
        hidden = self.experts.router.shape[1]
        g = torch.Generator().manual_seed(1)
        self.gate = torch.nn.Linear(hidden, shared_inter, bias=False)
        self.up = torch.nn.Linear(hidden, shared_inter, bias=False)
        self.down = torch.nn.Linear(shared_inter, hidden, bias=False)
        self.shared_gate = torch.nn.Linear(hidden, 1, bias=False) if gated else None
        for m in (self.gate, self.up, self.down, self.shared_gate):
            if m is not None:
                m.weight.data = torch.randn(m.weight.shape, generator=g) * 0.2
        self.act, self.leak = (F.gelu if gelu else F.silu), leak

    def forward(self, x):
        shared = self.down(self.act(self.gate(x)) * self.up(x))
        if self.shared_gate is not None:
            shared = torch.sigmoid(self.shared_gate(x)) * shared
        out = self.experts(x) + shared
        return (out, shared) if self.leak else out


@pytest.mark.parametrize("kw", [dict(), dict(gated=False), dict(gelu=True, cast=True, k=3)],
                         ids=["sigmoid-gated", "ungated", "geglu-cast-top3"])
@pytest.mark.parametrize("tokens", [1, 3])
def test_shared_expert_joins_the_down_kernel(kw, tokens):
    x = torch.randn(tokens, 48, generator=torch.Generator().manual_seed(tokens + 20))
    prog, got, expected = _run(WithShared(**kw), x)
    ops = _ops(prog)
    assert ops.count("ost.moe_up") == 1 and ops.count("ost.moe_down_shared") == 1, ops
    assert not {"ost.moe_down", "aten.sigmoid", "ost.swiglu", "ost.geglu", "aten.add.Tensor"} & set(ops), ops
    _same(got, expected, 1e-5)
    prog, got, expected = _run(WithShared(**kw), x, torch.bfloat16)
    assert "ost.moe_down_shared" in _ops(prog)
    assert torch.equal(got, expected)       # the reference repeats the module's ops, roundings included


def test_shared_expert_read_elsewhere_stays_apart():
    """The shared expert's output is also a result: the routed experts fuse, the shared expert stays."""
    x = torch.randn(2, 48, generator=torch.Generator().manual_seed(9))
    prog, got, expected = _run(WithShared(leak=True), x)
    ops = _ops(prog)
    assert "ost.moe_down" in ops and "ost.moe_down_shared" not in ops and "aten.sigmoid" in ops, ops
    _same(got, expected, 1e-5)


def _ops(prog) -> list[str]:
    return [n.op for n in prog.graph.nodes]


def _run(model, x, dtype=torch.float32):
    model = model.to(dtype)
    x = x.to(dtype)
    prog = ostinato.export(model, (x,), cache=False, passes=DEFAULT_PIPELINE)
    exe = ostinato.compile(prog)
    with torch.no_grad():
        expected = model(x)
        got = exe(x)
    return prog, got, expected


def _same(got, expected, tol):
    got, expected = (got, expected) if isinstance(got, (tuple, list)) else ((got,), (expected,))
    for a, b in zip(got, expected):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("kw", [dict(), dict(normalize=False), dict(cast=True, k=3), dict(clamp=True),
                                dict(gelu=True, k=1), dict(topk_first=True, cast=True)],
                         ids=["mixtral", "olmoe", "qwen-cast-top3", "clamped", "gelu-top1", "topk-first"])
@pytest.mark.parametrize("tokens", [1, 3])
def test_written_moe_fuses_and_matches_eager(kw, tokens):
    x = torch.randn(tokens, 48, generator=torch.Generator().manual_seed(tokens))
    prog, got, expected = _run(Experts(**kw), x)
    ops = _ops(prog)
    assert ops.count("ost.moe_up") == 1 and ops.count("ost.moe_down") == 1, ops
    assert not {"aten.topk", "aten.bmm", "aten.index.Tensor"} & set(ops), ops
    _same(got, expected, 1e-5)


def test_written_moe_in_bf16_is_eager_bit_for_bit():
    """The references repeat eager's ops, so on the CPU the fused program's bf16 result is eager's exactly."""
    x = torch.randn(2, 48, generator=torch.Generator().manual_seed(5))
    prog, got, expected = _run(Experts(cast=True), x, torch.bfloat16)
    assert "ost.moe_up" in _ops(prog)
    assert torch.equal(got, expected)


def test_routing_values_read_outside_stay_computed():
    """The routing weights are also a result: the experts fuse, the routing that makes them stays."""
    x = torch.randn(2, 48, generator=torch.Generator().manual_seed(7))
    prog, got, expected = _run(Experts(leak=True), x)
    assert {"ost.moe_up", "ost.moe_down", "aten.topk"} <= set(_ops(prog))
    _same(got, expected, 1e-5)


@pytest.mark.parametrize("kw, tokens", [(dict(packed=False), 2), (dict(), 80)], ids=["separate-gate-and-up", "prefill"])
def test_forms_left_alone_still_match(kw, tokens):
    x = torch.randn(tokens, 48, generator=torch.Generator().manual_seed(7))
    prog, got, expected = _run(Experts(**kw), x)
    assert "ost.moe_up" not in _ops(prog) and "aten.topk" in _ops(prog)
    _same(got, expected, 1e-5)


def test_routing_is_data_dependent():
    """Different tokens take different experts: a program that routed every token alike would differ."""
    model = Experts(experts=8, k=2)
    x = torch.randn(4, 48, generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        ids = torch.topk(F.linear(x, model.router), 2).indices
    assert len({tuple(sorted(r)) for r in ids.tolist()}) > 1
    prog, got, expected = _run(model, x)
    assert "ost.moe_down" in _ops(prog)
    _same(got, expected, 1e-5)


def test_moe_ops_survive_save_and_load(tmp_path):
    """The ops' arguments (dtypes, None, flags) go through the program file; the loaded program re-derives
    their shapes (load's check) and gives the same result."""
    model = Experts(cast=True, topk_first=True, k=3).to(torch.bfloat16)
    x = torch.randn(2, 48, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    prog = ostinato.export(model, (x,), cache=False, passes=DEFAULT_PIPELINE)
    path = str(tmp_path / "moe.ost")
    prog.save(path)
    loaded = ostinato.load(path)
    def plain_args(graph):      # the ops' arguments but their tensors
        return [tuple(a for a in n.args if not isinstance(a, Value)) for n in graph.nodes if n.op.startswith("ost.moe")]
    saved_args = plain_args(prog.graph)
    assert plain_args(loaded.graph) == saved_args and len(saved_args) == 2
    assert saved_args and saved_args[0][-1] is True          # topk_first kept
    with torch.no_grad():
        assert torch.equal(ostinato.compile(loaded)(x), model(x))


@pytest.mark.parametrize("gated", [True, False])
def test_shared_expert_op_survives_save_and_load(tmp_path, gated):
    """moe_down_shared's arguments (an activation's name; the gate's logit or None) go through the file."""
    model = WithShared(gated=gated, gelu=not gated).to(torch.bfloat16)
    x = torch.randn(3, 48, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    prog = ostinato.export(model, (x,), cache=False, passes=DEFAULT_PIPELINE)
    path = str(tmp_path / "shared.ost")
    prog.save(path)
    loaded = ostinato.load(path)
    node, = [n for n in loaded.graph.nodes if n.op == "ost.moe_down_shared"]
    assert node.args[12] == ("silu" if gated else "gelu") and (node.args[14] is None) == (not gated)
    with torch.no_grad():
        assert torch.equal(ostinato.compile(loaded)(x), model(x))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_transformers_own_grouped_op_fuses_too(dtype):
    """Outside bf16, transformers' grouped experts export its own ``grouped_mm_fallback`` op instead of
    torch's ``_grouped_mm``: the same chain, the same two ops, eager's logits."""
    lc = _census()
    wrapper, steps = lc.build("mixtral", 1, "sdpa", 1, dtype)
    ref = __import__("copy").deepcopy(wrapper)
    prog = lc.export(wrapper, steps[0])
    ops = _ops(prog)
    assert ops.count("ost.moe_up") == 1 and not any("grouped_mm" in op for op in ops), ops
    assert lc.max_diff(ref, prog, steps) <= (1e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.cuda
@pytest.mark.parametrize("shared", [False, True], ids=["routed", "shared-expert"])
@pytest.mark.parametrize("tokens", [1, 8, 33])
def test_replayed_moe_steps_on_cuda_match_eager(tokens, shared, monkeypatch):
    """A bf16 MoE MLP replayed on CUDA over three calls of new inputs: one token takes the per-choice
    kernels; 8 and 33 the grouped ones (the down kernel's experts split among programs, the last to arrive
    adding their sums, its counters reset for the next replay). Each call's result is eager's within four
    bf16 ulps of its scale (sums in another order: a product one ulp apart, the gating's two)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from ostinato.backends.cuda.kernels import moe as moe_kernels
    taken, kernel = [], moe_kernels.LIBRARY.kernel
    monkeypatch.setattr(moe_kernels.LIBRARY, "kernel", lambda name, **kw: taken.append(name) or kernel(name, **kw))
    model = (WithShared(experts=16, k=4) if shared else Experts(experts=16, k=4)).to("cuda", torch.bfloat16)
    xs = [torch.randn(tokens, 48, generator=torch.Generator().manual_seed(30 + i)).to("cuda", torch.bfloat16)
          for i in range(3)]
    prog = ostinato.export(model, (xs[0],), cache=False, passes=DEFAULT_PIPELINE)
    assert "ost.moe_up" in _ops(prog)
    exe = ostinato.compile(prog, device="cuda", replay=True)
    for x in xs:
        with torch.no_grad():
            expected = model(x)
            got = exe(x).clone()
        scale = expected.float().abs().max().item()
        assert (got.float() - expected.float()).abs().max().item() <= 4 * scale * 2 ** -8
    # this test's launches (16 experts of 40 x 48: the down kernel is grouped from 8 tokens)
    assert set(taken) == ({"moe_up", "moe_down"} if tokens == 1 else {"moe_up_grouped", "moe_down_grouped"}), taken


def test_a_cpu_program_fuses_only_small_gathers():
    """Exported from CPU tensors (the CPU and MLX backends run the references, which gather each chosen
    expert's weights per token and choice), 40 tokens x 2 choices stay the graph's ops; 30 x 2 fuse. The
    accelerator pipeline takes both (up to 64 tokens: CUDA's grouped kernels read each expert once)."""
    for tokens, fused_on_cpu in ((40, False), (30, True)):
        model = Experts()
        x = torch.randn(tokens, 48, generator=torch.Generator().manual_seed(tokens))
        cpu = ostinato.export(model, (x,), cache=False)
        assert ("ost.moe_up" in _ops(cpu)) == fused_on_cpu, tokens
        accel = ostinato.export(model, (x,), cache=False, passes=DEFAULT_PIPELINE)
        assert "ost.moe_up" in _ops(accel)
        with torch.no_grad():
            _same(ostinato.compile(cpu)(x), model(x), 1e-5)
