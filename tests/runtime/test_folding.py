"""Constant folding at compile (runtime/folding.py): launches that read only weights run once when the
executable is built; a step runs the rest. Checked against eager on random inputs, with folding on and
off, on modules in the forms models use (a relative position bias, per-layer projections of a shared
table, a repeat over the batch) and on transformers' T5 and DeBERTa-v2 encoders."""
from __future__ import annotations

import copy

import pytest
import torch

import ostinato
from helpers import LastHidden, assert_same


class RelativeBias(torch.nn.Module):
    """T5's form: buckets of aranges, an embedding, a permute; added to input-dependent scores. Plus
    DeBERTa's: a projection of a shared table (weights only), then split into heads and repeated."""

    def __init__(self, t=6, heads=2, dim=8, repeat=False):
        super().__init__()
        self.bias = torch.nn.Embedding(16, heads)
        self.table = torch.nn.Parameter(torch.randn(2 * t, dim))
        self.proj = torch.nn.Linear(dim, dim)
        self.q = torch.nn.Linear(dim, dim)
        self.t, self.heads, self.repeat = t, heads, repeat

    def forward(self, x):                     # x: [B, T, dim]
        pos = torch.arange(self.t)
        rel = (pos[None, :] - pos[:, None]).abs().clamp(max=15)
        bias = self.bias(rel).permute(2, 0, 1)[None]               # [1, H, T, T]: weights only
        keys = self.proj(torch.nn.functional.layer_norm(self.table, (self.table.shape[-1],)))
        keys = keys.view(2 * self.t, self.heads, -1).transpose(0, 1)   # [H, 2T, D/H]: weights only
        if self.repeat:
            keys = keys.repeat(x.shape[0], 1, 1)                    # [B*H, 2T, D/H]: grows with the batch
        q = self.q(x).view(x.shape[0], self.t, self.heads, -1).transpose(1, 2)
        k = keys.reshape(x.shape[0] if self.repeat else 1, self.heads, 2 * self.t, -1)
        scores = q @ k[..., :self.t, :].transpose(-1, -2) + bias
        return scores.softmax(-1)


def _run(model, inputs, monkeypatch, fold: bool):
    monkeypatch.setenv("OSTINATO_FOLD_CONSTANTS", "1" if fold else "0")
    prog = ostinato.export(copy.deepcopy(model), inputs[0])
    exe = ostinato.compile(prog, cache=False)
    for a in inputs:
        with torch.no_grad():
            assert_same(exe(*a), model(*a))
    return exe


@pytest.mark.parametrize("repeat", [False, True])
def test_weight_only_values_fold_and_match(monkeypatch, repeat):
    from ostinato.runtime import folding
    monkeypatch.setattr(folding, "_GROWTH_SLACK", 4096)    # the model's tensors are a few hundred bytes
    torch.manual_seed(0)
    model = RelativeBias(repeat=repeat).eval()
    gen = torch.Generator().manual_seed(1)
    inputs = [(torch.randn(64, 6, 8, generator=gen),) for _ in range(3)]
    on = _run(model, inputs, monkeypatch, fold=True)
    off = _run(model, inputs, monkeypatch, fold=False)
    assert off.stats()["folded_launches"] == 0
    assert on.stats()["folded_launches"] >= 5            # aranges, buckets, embedding, norm, projection, ...
    assert on.stats()["kernels"] < off.stats()["kernels"]
    # a copy 64x its input (the repeat, exported as the copy of an expanded view) stays a per-step launch
    # (torch's decomposition of the repeat expands [H, 2T, D/H] to [B, 1, 1, H, 2T, D/H]; the matmul's
    # broadcast of k over the batch is another copy, of rank 4, in both variants)
    expanded = {n.name for n in on.program.graph.nodes if n.op == "aten.clone"
                and n.args[0].producer is not None and n.args[0].producer.op == "aten.expand"
                and n.args[0].meta.rank == 6}
    repeats = [l for l in on.launches if l.op == "aten.repeat" or l.name in expanded]
    assert len(repeats) == (1 if repeat else 0), [l.op for l in on.launches]


class ReturnsATable(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        return x + 1, self.w * 2          # the second output depends on the weight only


def test_a_returned_value_is_never_folded(monkeypatch):
    model = ReturnsATable().eval()
    exe = _run(model, [(torch.randn(4),)], monkeypatch, fold=True)
    first = exe(torch.randn(4))[1]
    first.add_(100.0)                     # the caller owns what it receives
    assert_same(exe(torch.randn(4))[1], model.w.detach() * 2)


def _hf(name):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if name == "t5":
        config = transformers.T5Config(d_model=32, d_ff=64, d_kv=8, num_layers=2, num_heads=4, vocab_size=100)
        model = transformers.T5EncoderModel(config)
    else:
        config = transformers.DebertaV2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                              intermediate_size=64, vocab_size=100, relative_attention=True,
                                              position_buckets=16, norm_rel_ebd="layer_norm", share_att_key=True,
                                              pos_att_type=["p2c", "c2p"], max_relative_positions=-1,
                                              position_biased_input=False)
        model = transformers.DebertaV2Model(config)
    return LastHidden(model, use_cache=None).eval()


@pytest.mark.parametrize("name", ["t5", "deberta"])
def test_transformers_encoders_fold_their_position_tables(monkeypatch, name):
    model = _hf(name)
    gen = torch.Generator().manual_seed(2)
    inputs = [(torch.randint(3, 100, (2, 12), generator=gen),) for _ in range(2)]
    on = _run(model, inputs, monkeypatch, fold=True)
    off = _run(model, inputs, monkeypatch, fold=False)
    assert on.stats()["folded_launches"] > 0
    assert on.stats()["kernels"] < off.stats()["kernels"], (on.stats()["kernels"], off.stats()["kernels"])


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["t5", "deberta"])
def test_folding_on_the_gpu(monkeypatch, name):
    """The same encoders compiled for CUDA (generated kernels folded too), step and replay, bf16."""
    model = _hf(name).to("cuda", torch.bfloat16)
    gen = torch.Generator().manual_seed(3)
    inputs = [(torch.randint(3, 100, (2, 12), generator=gen).cuda(),) for _ in range(3)]
    prog = ostinato.export(copy.deepcopy(model), inputs[0])
    for replay in (False, True):
        exe = ostinato.compile(prog, device="cuda", replay=replay, cache=False)
        assert exe.stats()["folded_launches"] > 0
        for a in inputs:
            with torch.no_grad():
                assert_same(exe(*a), model(*a), tol=3e-2)


def test_a_value_an_impure_launch_takes_is_never_folded(monkeypatch):
    """A weight-only value that a state write reads (through a view) stays a per-call value."""
    from ostinato.backends.base import Launch
    from ostinato.runtime.folding import fold_constants

    w = torch.randn(4)
    template = [w, None, None, None]

    def launch(fn, op, args, outs):
        return Launch.of(fn, op, op, tuple(args), {}, tuple(outs), False)

    from ostinato.backends.base import _Slot
    plan = [launch(torch.mul, "aten.mul.Tensor", [_Slot(0), 2.0], [1]),
            launch(lambda x, shape: x.view(shape), "aten.view", [_Slot(1), [2, 2]], [2]),
            launch(lambda v, c: v.copy_(c.view(2, 2)), "aten.copy_", [_Slot(2), _Slot(3)], [-1]),
            launch(torch.add, "aten.add.Tensor", [_Slot(0), 1.0], [3])]

    class B:
        def synchronize(self):
            pass

    rest, which = fold_constants(plan, template, {0}, set(), B())
    # the copy_ may write any argument: the view of the doubled weight (so the doubling too) and the add
    assert [l.op for l in rest] == ["aten.mul.Tensor", "aten.view", "aten.copy_", "aten.add.Tensor"]
    assert template[1:] == [None, None, None] and which == frozenset()
    # without the write, the same launches fold
    reader = launch(torch.add, "aten.add.Tensor", [_Slot(2), _Slot(3)], [4])      # slot 3: an input
    template.append(None)
    rest, which = fold_constants([plan[0], plan[1], reader], template, {0}, set(), B())
    assert rest == [reader] and which == {0, 1}
    assert template[1] is None and torch.equal(template[2], (w * 2).view(2, 2))   # only what the rest reads


class ReturnsAView(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 3))

    def forward(self, x):
        return x + 1, (self.w * 2).t()    # a view of a weight-only value


def test_a_returned_view_of_a_weight_only_value_is_fresh_each_call(monkeypatch):
    model = ReturnsAView().eval()
    exe = _run(model, [(torch.randn(4),)], monkeypatch, fold=True)
    first = exe(torch.randn(4))[1]
    first.add_(100.0)
    assert_same(exe(torch.randn(4))[1], (model.w.detach() * 2).t())


def test_a_plan_folded_otherwise_is_not_reused(monkeypatch):
    """Two executables of one program in one process (the plan comes from memory the second time):
    folding on, then off, then on again; each matches eager."""
    torch.manual_seed(0)
    model = RelativeBias().eval()
    gen = torch.Generator().manual_seed(4)
    inputs = [(torch.randn(2, 6, 8, generator=gen),) for _ in range(2)]
    prog = ostinato.export(copy.deepcopy(model), inputs[0])
    for fold in ("1", "0", "1"):
        monkeypatch.setenv("OSTINATO_FOLD_CONSTANTS", fold)
        exe = ostinato.compile(prog)
        assert (exe.stats()["folded_launches"] > 0) == (fold == "1")
        for a in inputs:
            with torch.no_grad():
                assert_same(exe(*a), model(*a))


class Siblings(torch.nn.Module):
    """Two projections of one input: packed into one buffer by a plain compile."""

    def __init__(self):
        super().__init__()
        self.q, self.k = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.q(x) * self.k(x)


@pytest.mark.parametrize("make", [RelativeBias, Siblings])
def test_torch_compile_backend_sees_weight_updates(make):
    """torch.compile(backend="ostinato") aliases the model's weights: an in-place update reaches every
    value computed from them (nothing folded, no sibling weights copied into a packed buffer)."""
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(2, 6, 8)
    compiled = torch.compile(model, backend="ostinato")
    with torch.no_grad():
        assert_same(compiled(x), model(x))
        for p in model.parameters():
            p.mul_(1.5).add_(0.25)
        assert_same(compiled(x), model(x))


def test_protected_takes_an_impure_ops_declared_writes():
    """An impure op that declares the arguments it writes (OpDef.writes: the decode attention writes its two
    caches, not q's biases, which a folded LayerNorm's fold_bias makes from weights) protects those and what
    they are views of, not the rest it reads; one that declares none protects everything it reads."""
    from ostinato.runtime.folding import protected, written_reads
    args = (1, 2, 3, 4, 5)      # caches 1 and 2, q 3, ..., a bias 5 (value ids)
    written = written_reads("ost.decode_attention_", args, lambda a: [a])
    assert written == [1, 2]
    steps = [("aten.view", [0], [1], None), ("ost.fold_bias", [9], [5], None),
             ("ost.decode_attention_", [1, 2, 3, 4, 5], [6, 7, 8], written)]
    assert protected(steps, set()) == {0, 1, 2}         # (0: the cache 1 is a view of it)
    assert written_reads("ost.kv_update_", args, lambda a: [a]) is None
    assert protected([("ost.kv_update_", [1, 5], [6], None)], set()) == {1, 5}
