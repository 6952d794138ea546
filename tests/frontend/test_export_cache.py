"""The export cache (frontend/export_cache.py): a new checkpoint of the same architecture reuses the
graph and maps its own weights; anything the graph depends on changes the key, and why-miss names it."""
from __future__ import annotations

import importlib
import sys
import textwrap

import numpy as np
import pytest
import torch
import transformers
from torch import nn

import ostinato
from helpers import assert_same
from ostinato.cache import Cache, load_artifacts, save_artifacts, set_cache
from ostinato.cache.disk import DiskTier
from ostinato.cache.memory import MemoryTier
from ostinato.program.writer import flatbuffer_bytes, to_bytes

pytestmark = pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects")

CONFIG = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=96, max_position_embeddings=32)


@pytest.fixture
def cache_dir(tmp_path):
    """A private cache (memory + disk) for each test; the process-wide one is restored after."""
    set_cache(Cache([MemoryTier(64 << 20), DiskTier(tmp_path / "cache")]))
    yield tmp_path / "cache"
    set_cache(None)


def llama(seed: int, **overrides) -> nn.Module:
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**CONFIG, **overrides})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def no_trace(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("torch.export ran on an export-cache hit")
    monkeypatch.setattr(torch.export, "export", refuse)


def test_new_checkpoint_hits_and_maps_its_weights(cache_dir, monkeypatch):
    ids = torch.randint(0, 96, (2, 5))
    first = ostinato.export(llama(0), (ids,), {"use_cache": False})
    assert first.export_report["cache"]["hit"] is False
    new = llama(1)
    fresh = ostinato.export(new, (ids,), {"use_cache": False}, cache=False)
    # A fresh process: the memory tier is empty, the entry comes from the disk tier.
    set_cache(Cache([MemoryTier(64 << 20), DiskTier(cache_dir)]))
    with monkeypatch.context() as m:
        no_trace(m)
        hit = ostinato.export(new, (ids,), {"use_cache": False})
    assert hit.export_report["cache"]["hit"] is True
    # The whole file, weights included: the new checkpoint's, not the first one's.
    assert to_bytes(hit) == to_bytes(fresh) and to_bytes(hit) != to_bytes(first)
    assert flatbuffer_bytes(hit) == flatbuffer_bytes(first)
    assert all(hit.weights[n].data_ptr() == t.data_ptr() for n, t in new.named_parameters() if n in hit.weights)
    ids = torch.randint(0, 96, (2, 5))
    with torch.no_grad():
        ref = new(ids, use_cache=False).logits
    assert_same(ostinato.compile(hit)(ids, use_cache=False).logits, ref)


def test_bundle_carries_the_export(cache_dir, tmp_path, monkeypatch):
    ids = torch.randint(0, 96, (1, 4))
    ostinato.export(llama(0), (ids,), {"use_cache": False})
    blob = save_artifacts()
    set_cache(Cache([MemoryTier(64 << 20), DiskTier(tmp_path / "other")]))
    assert load_artifacts(blob).loaded
    with monkeypatch.context() as m:
        no_trace(m)
        assert ostinato.export(llama(2), (ids,), {"use_cache": False}).export_report["cache"]["hit"]


def eager_attention(model: nn.Module) -> nn.Module:
    model.set_attn_implementation("eager")
    return model


@pytest.mark.parametrize("change, component", [
    (lambda: (llama(0, rms_norm_eps=1e-3), (torch.randint(0, 96, (2, 5)),), {}), "target.structure"),
    # transformers 5's to_dict() leaves the attention implementation out: the key must not
    (lambda: (eager_attention(llama(0)), (torch.randint(0, 96, (2, 5)),), {}), "target.structure"),
    (lambda: (llama(0, intermediate_size=48), (torch.randint(0, 96, (2, 5)),), {}), "target.structure"),
    (lambda: (llama(0), (torch.randint(0, 96, (2, 6)),), {}), "target.inputs"),
    (lambda: (llama(0), (torch.randint(0, 96, (2, 5)),), {"strict": True}), "target.options"),
    (lambda: (llama(0), (torch.randint(0, 96, (2, 5)),),
              {"dynamic_shapes": ({1: torch.export.Dim("t", min=2, max=16)}, None)}), "target.dynamic_shapes"),
])
def test_what_the_graph_depends_on_misses_and_says_which(cache_dir, change, component):
    ostinato.export(llama(0), (torch.randint(0, 96, (2, 5)),), {"use_cache": False})
    model, args, kw = change()
    prog = ostinato.export(model, args, {"use_cache": False}, **kw)
    why = prog.export_report["cache"]
    assert why["hit"] is False and component in why["why"], why
    others = {"target.code", "target.structure", "target.inputs", "target.options", "target.dynamic_shapes"}
    assert not any(c in why["why"] for c in others - {component}), why


MODEL_SRC = textwrap.dedent('''
    import torch
    from torch import nn


    def act(x):
        return torch.tanh(x)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return act(self.fc(x)) + torch.tensor([0.5, 1.5]).repeat(4)
''')


def test_a_changed_line_of_the_model_misses_on_code(cache_dir, tmp_path, monkeypatch):
    pkg = tmp_path / "mods"
    pkg.mkdir()
    (pkg / "ostinato_cache_net.py").write_text(MODEL_SRC)
    monkeypatch.syspath_prepend(str(pkg))
    mod = importlib.import_module("ostinato_cache_net")
    x = torch.randn(3, 8)
    ostinato.export(mod.Net().eval(), (x,))
    # The forward's own constant (torch.tensor in forward) travels in the entry as bytes.
    net = mod.Net().eval()
    with monkeypatch.context() as m:
        no_trace(m)
        hit = ostinato.export(net, (x,))
    assert hit.export_report["cache"]["hit"]
    assert_same(ostinato.compile(hit)(x), net(x))
    # One changed line in a helper the forward calls (not the forward itself): a miss on the code.
    (pkg / "ostinato_cache_net.py").write_text(MODEL_SRC.replace("torch.tanh(x)", "torch.sigmoid(x)"))
    mod = importlib.reload(mod)
    net = mod.Net().eval()
    prog = ostinato.export(net, (x,))
    why = prog.export_report["cache"]
    assert not why["hit"] and "target.code" in why["why"] and "target.structure" not in why["why"], why
    assert_same(ostinato.compile(prog)(x), net(x))
    sys.modules.pop("ostinato_cache_net", None)


def test_tied_weights_map_to_the_new_model(cache_dir, monkeypatch):
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_inner=64, vocab_size=96, n_positions=32)
    ids = torch.randint(0, 96, (1, 6))
    torch.manual_seed(0)
    ostinato.export(transformers.GPT2LMHeadModel(cfg).eval(), (ids,), {"use_cache": False})
    torch.manual_seed(1)
    new = transformers.GPT2LMHeadModel(cfg).eval()
    assert new.lm_head.weight is new.transformer.wte.weight
    with monkeypatch.context() as m:
        no_trace(m)
        hit = ostinato.export(new, (ids,), {"use_cache": False})
    with torch.no_grad():
        ref = new(ids, use_cache=False).logits
    assert_same(ostinato.compile(hit)(ids, use_cache=False).logits, ref)


def test_cache_false_neither_reads_nor_writes(cache_dir):
    ids = torch.randint(0, 96, (1, 4))
    ostinato.export(llama(0), (ids,), {"use_cache": False}, cache=False)
    prog = ostinato.export(llama(0), (ids,), {"use_cache": False})
    assert prog.export_report["cache"]["hit"] is False
    assert "no entry" in prog.export_report["cache"]["why"]


def test_switching_the_same_models_attention_implementation_misses(cache_dir):
    """One model object exported with sdpa, then switched to eager attention (transformers 5 keeps the
    choice out of ``config.to_dict()``): the second export must trace its own graph, and it matches the
    switched model's eager outputs on a left-padded batch (the sdpa graph read the mask differently)."""
    model = llama(0)
    ids = torch.randint(0, 96, (2, 5))
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    ostinato.export(model, (ids,), {"attention_mask": mask, "use_cache": False})
    model.set_attn_implementation("eager")
    prog = ostinato.export(model, (ids,), {"attention_mask": mask, "use_cache": False})
    assert prog.export_report["cache"]["hit"] is False
    with torch.no_grad():
        ref = model(ids, attention_mask=mask, use_cache=False).logits
    assert_same(ostinato.compile(prog)(ids, attention_mask=mask, use_cache=False).logits, ref)


def _indexing_model(index, scale):
    class Pick(nn.Module):      # one source line, a different graph for each captured value
        def forward(self, x):
            return x[:, index] * scale
    return Pick()


def test_a_class_made_by_a_factory_misses_on_its_captured_values(cache_dir):
    """Two classes from one factory differ only in the values their forward captures: the second export
    must not take the first's graph (it did: the key named the class and its file only)."""
    x = torch.randn(3, 5, 4)
    first = ostinato.export(_indexing_model([1], 2.0), (x,))
    for index, scale in (([1, 2, 3], 2.0), ([1], 3.0)):
        model = _indexing_model(index, scale)
        prog = ostinato.export(model, (x,))
        assert prog.export_report["cache"]["hit"] is False
        assert_same(ostinato.compile(prog)(x), model(x))
    again = ostinato.export(_indexing_model([1], 2.0), (x,))
    assert again.export_report["cache"]["hit"] is True and first.export_report["cache"]["hit"] is False


STRUCTURE_KEY = textwrap.dedent("""
    import sys, torch, transformers
    from ostinato.frontend.export_cache import structure_component
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=96, max_position_embeddings=32)
    torch.manual_seed(0)
    print(structure_component(transformers.LlamaForCausalLM(config).eval()))
""")


def test_the_structure_key_is_the_same_in_every_process():
    """A causal LM carries a GenerationConfig whose private _original_object_hash is a str hash, different
    in each process: none of that may reach the key, or the disk cache and bundles never hit."""
    import os
    import subprocess
    from conftest import ROOT
    keys = set()
    for seed in ("0", "1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=f"{ROOT}/src")
        out = subprocess.run([sys.executable, "-c", STRUCTURE_KEY], env=env, capture_output=True, text=True,
                             timeout=300, check=True).stdout
        keys.add(out.strip().splitlines()[-1])
    assert len(keys) == 1, keys


class _PickByBuffer(nn.Module):
    """x[:, self.index]: a buffer of consecutive positions (the front end reads it as a slice)."""

    def __init__(self, index):
        super().__init__()
        self.register_buffer("index", torch.tensor(index))

    def forward(self, x):
        return x[:, self.index] * 2


def test_an_index_buffer_of_another_checkpoint_is_not_read_as_the_first_ones_slice(cache_dir):
    """Two models that differ only in an index buffer's values (a new checkpoint): the second must not
    take the first's graph with the first's positions baked in as a slice."""
    x = torch.randn(3, 6, 4)
    ostinato.export(_PickByBuffer([1, 2]), (x,))
    model = _PickByBuffer([3, 4])
    prog = ostinato.export(model, (x,))
    assert_same(ostinato.compile(prog)(x), model(x))


def _captured_model(part, scale):
    class Part(nn.Module):      # a captured slice and scale (a class made in a loop over a model's parts)
        def forward(self, x):
            return x[:, part] * scale
    return Part()


@pytest.mark.parametrize("first, second", [((slice(0, 2), 2.0), (slice(3, 5), 2.0)),
                                           ((slice(0, 2), np.float32(2.0)), (slice(0, 2), np.float32(3.0)))])
def test_a_class_capturing_a_slice_or_numpy_scalar_misses_on_its_value(cache_dir, first, second):
    """Two classes from one factory differ only in a captured ``slice`` or numpy scalar (neither has a
    ``__dict__``; the key held their type only): the graph is traced from their values, so the second
    export must not take the first's graph."""
    x = torch.randn(3, 6, 4)
    ostinato.export(_captured_model(*first), (x,))
    model = _captured_model(*second)
    prog = ostinato.export(model, (x,))
    assert prog.export_report["cache"]["hit"] is False
    assert_same(ostinato.compile(prog)(x), model(x))
