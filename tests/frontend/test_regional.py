"""Regional export (frontend/regional.py, inline.py): each kind of repeated block is traced once.

Models as their authors wrote them (transformers' decoders from ``from_config``, the tiny decoder with
its KV cache, small modules in several styles) must give the program a full export gives: the same
outputs always, and the same bytes where the test says so. The cases the issue names (a block that
branches on its own index, hooks, weights shared across blocks, data-dependent control flow, Python
state that differs between instances) must fall back, say why, and still match eager.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import transformers
from torch import nn

import ostinato
from helpers import assert_same
from ostinato.ir import verify
from ostinato.program.writer import flatbuffer_bytes

pytestmark = pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects")

DECODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
HF = {
    "llama": lambda: transformers.LlamaConfig(**DECODER),
    "qwen2": lambda: transformers.Qwen2Config(**DECODER),
    "gemma": lambda: transformers.GemmaConfig(head_dim=16, **DECODER),
    "gpt2": lambda: transformers.GPT2Config(n_embd=64, n_layer=3, n_head=4, n_inner=128, vocab_size=128,
                                            n_positions=64),
}


def hf_model(family: str) -> nn.Module:
    model = transformers.AutoModelForCausalLM.from_config(HF[family](), dtype=torch.float32).eval()
    with torch.no_grad():   # from_config leaves norms at 1 (Gemma's at 0): make every weight matter
        for p in model.parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return model


def export_both(model, args, kwargs=None, **kw):
    regional = ostinato.export(model, args, kwargs, cache=False, **kw)
    full = ostinato.export(model, args, kwargs, cache=False, regional=False, **kw)
    return regional, full


def report(prog) -> dict:
    return prog.export_report["regional"]


@pytest.mark.parametrize("family", list(HF))
def test_transformers_decoder_traced_once_same_bytes(family):
    model = hf_model(family)
    ids = torch.randint(0, 128, (2, 7))
    regional, full = export_both(model, (ids,), {"use_cache": False})
    r = report(regional)
    assert r["fallbacks"] == [] and r["blocks"] == 1, r
    (kind,) = r["kinds"]
    assert kind["instances"] == kind["calls"] == 3 and kind["traced"] == 1
    # Same nodes, names, value ids, weights and order: the same program file.
    assert flatbuffer_bytes(regional) == flatbuffer_bytes(full)
    ids2 = torch.randint(0, 128, (2, 7))
    with torch.no_grad():
        ref = model(ids2, use_cache=False).logits
    assert_same(ostinato.compile(regional)(ids2, use_cache=False).logits, ref)


def test_dynamic_sequence_length_matches_eager():
    model = hf_model("llama")
    ids = torch.randint(0, 128, (1, 9))
    seq = torch.export.Dim("seq", min=2, max=32)
    prog = ostinato.export(model, (ids,), {"use_cache": False}, dynamic_shapes=({1: seq}, None), cache=False)
    assert report(prog)["blocks"] == 1 and report(prog)["fallbacks"] == []
    exe = ostinato.compile(prog)
    for t in (3, 16, 31):
        x = torch.randint(0, 128, (1, t))
        with torch.no_grad():
            ref = model(x, use_cache=False).logits
        assert_same(exe(x, use_cache=False).logits, ref)


def test_tiny_decoder_kv_cache_state_per_layer():
    """Blocks that mutate their own buffers: each layer's cache is its own program state."""
    from examples.tiny_decoder import TinyDecoder, decode_inputs
    model = TinyDecoder(dim=64, layers=4).eval()
    eager = TinyDecoder(dim=64, layers=4).eval()
    eager.load_state_dict(model.state_dict())
    regional, full = export_both(model, decode_inputs(0))
    assert report(regional)["blocks"] == 1
    assert flatbuffer_bytes(regional) == flatbuffer_bytes(full)
    assert sorted(regional.state_init) == sorted(n for n, _ in model.named_buffers() if "cache" in n)
    exe = ostinato.compile(regional)
    for pos in range(4):
        args = decode_inputs(pos)
        args = (torch.randint(0, 256, args[0].shape),) + tuple(args[1:])
        with torch.no_grad():
            ref = eager(*args)
        assert_same(exe(*args), ref)


class Mlp(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.up, self.down = nn.Linear(d, hidden), nn.Linear(hidden, d)
        self.register_buffer("scale", torch.rand(d) + 0.5)

    def forward(self, x, *, gate=None, extra=None):
        h = F.gelu(self.up(x))
        y = self.down(h) * self.scale
        if gate is not None:
            y = y * torch.sigmoid(gate)
        return {"y": x + y, "aux": (h.mean(-1), extra)}


class Mixer(nn.Module):
    """Two kinds of repeated blocks, keyword arguments, None and Python constants in the calls, dict and
    tuple outputs with non-tensor leaves, a block used twice, and an unrepeated head."""

    def __init__(self, d=16):
        super().__init__()
        self.wide = nn.ModuleList([Mlp(d, 4 * d) for _ in range(3)])
        self.narrow = nn.ModuleList([Mlp(d, d) for _ in range(2)])
        self.head = nn.Linear(d, 5)

    def forward(self, x, gate):
        aux = []
        for i, blk in enumerate(self.wide):
            out = blk(x, gate=gate if i % 2 else None, extra="tag")
            x = out["y"]
            aux.append(out["aux"][0])
        for blk in (*self.narrow, self.narrow[0]):
            x = blk(x)["y"]
        return self.head(x), torch.stack(aux, -1)


def test_several_kinds_and_call_styles():
    model = Mixer().eval()
    x, gate = torch.randn(3, 16), torch.randn(3, 16)
    regional, full = export_both(model, (x, gate))
    r = report(regional)
    assert r["fallbacks"] == [] and len(r["kinds"]) == 2, r
    wide = next(k for k in r["kinds"] if k["instances"] == 3)
    narrow = next(k for k in r["kinds"] if k["instances"] == 2)
    # The wide blocks are called with and without a gate: two signatures, each traced once.
    assert wide["traced"] == 2 and narrow["calls"] == 3 and narrow["traced"] == 1
    assert flatbuffer_bytes(regional) == flatbuffer_bytes(full)
    x, gate = torch.randn(3, 16), torch.randn(3, 16)
    assert_same(ostinato.compile(regional)(x, gate), model(x, gate))


# -- fallbacks -------------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, d=16, index=0, scale=1.0):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.index, self.scale = index, scale

    def forward(self, x):
        return x + torch.tanh(self.fc(x)) * self.scale


class ByIndex(Block):
    def forward(self, x):
        y = torch.tanh(self.fc(x))
        return x + (y if self.index % 2 == 0 else y * y)


class DataDependent(Block):
    def forward(self, x, flag):
        y = self.fc(x)
        return x + (y if flag.item() > 0 else -y)   # flag is a constant of the caller's trace


class Stack(nn.Module):
    def __init__(self, blocks, flag=False):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.flag = flag

    def forward(self, x):
        flag = torch.tensor(1)
        for b in self.blocks:
            x = b(x, flag) if self.flag else b(x)
        return x


def _index_model():
    return Stack([ByIndex(index=i) for i in range(4)])


def _state_model():
    return Stack([Block(scale=1.0 + i) for i in range(4)])


def _hook_model():
    m = Stack([Block() for _ in range(4)])
    m.blocks[2].register_forward_hook(lambda mod, inp, out: out * 2)
    return m


def _shared_model():
    m = Stack([Block() for _ in range(4)])
    m.blocks[3].fc.weight = m.blocks[1].fc.weight
    return m


def _data_dependent_model():
    return Stack([DataDependent() for _ in range(4)], flag=True)


FALLBACKS = {
    "own_index": (_index_model, "reads self.index, which differs"),
    "python_state": (_state_model, "reads self.scale, which differs"),
    "hook": (_hook_model, "has hooks"),
    "shared_weights": (_shared_model, "is shared with"),
    "data_dependent": (_data_dependent_model, "cannot be exported alone"),
}


@pytest.mark.parametrize("case", list(FALLBACKS))
def test_fallback_says_why_and_matches_eager(case, caplog):
    make, why = FALLBACKS[case]
    model = make().eval()
    x = torch.randn(2, 16)
    with caplog.at_level("INFO", logger="ostinato"):
        prog = ostinato.export(model, (x,), cache=False)
    r = report(prog)
    assert r["kinds"] == [] and len(r["fallbacks"]) == 1 and why in r["fallbacks"][0], r
    assert any(why in rec.getMessage() for rec in caplog.records)
    x = torch.randn(2, 16)
    with torch.no_grad():
        ref = model(x)
    assert_same(ostinato.compile(prog)(x), ref)


def test_equal_python_state_is_not_a_fallback():
    """The same attribute read with the same value in every instance: traced once."""
    model = Stack([Block(scale=0.5) for _ in range(4)]).eval()
    prog = ostinato.export(model, (torch.randn(2, 16),), cache=False)
    assert report(prog)["blocks"] == 1 and report(prog)["fallbacks"] == []


def test_regional_false_and_trace_strict_are_full_exports():
    model = Stack([Block() for _ in range(3)]).eval()
    x = torch.randn(2, 16)
    off = ostinato.export(model, (x,), cache=False, regional=False)
    assert report(off)["kinds"] == [] and report(off)["fallbacks"] == ["regional=False"]
    strict = ostinato.export(model, (x,), cache=False, trace_strict=True)
    assert report(strict)["kinds"] == [] and "trace_strict" in report(strict)["fallbacks"][0]


def test_alternating_layers_split_into_kinds():
    """Gemma 2 alternates sliding-window and full attention (self.self_attn.sliding_window differs): the
    layers are split into two kinds by what their forward reads, each traced once, same bytes."""
    cfg = transformers.Gemma2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128,
                                    max_position_embeddings=64, sliding_window=4)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    ids = torch.randint(0, 128, (1, 9))
    regional, full = export_both(model, (ids,), {"use_cache": False})
    r = report(regional)
    assert r["fallbacks"] == [] and len(r["kinds"]) == 2 and all(k["traced"] == 1 for k in r["kinds"]), r
    assert "sliding_window" in r["splits"][0]
    assert flatbuffer_bytes(regional) == flatbuffer_bytes(full)
    ids = torch.randint(0, 128, (1, 9))
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits
    assert_same(ostinato.compile(regional)(ids, use_cache=False).logits, ref)


def test_global_module_hooks_turn_regional_export_off():
    model = Stack([Block() for _ in range(3)]).eval()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda mod, inp, out: out)
    try:
        prog = ostinato.export(model, (torch.randn(2, 16),), cache=False)
    finally:
        handle.remove()
    assert report(prog)["kinds"] == [] and "global module hooks" in report(prog)["fallbacks"][0]
    x = torch.randn(2, 16)
    assert_same(ostinato.compile(prog)(x), model(x))


class Features(nn.Module):
    """A transformers backbone called on one input, returning one of its outputs."""

    def __init__(self, model, key):
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x):
        return getattr(self.model(x), self.key)


ENCODERS = {   # (config, model class, output, input)
    "vit": (lambda: transformers.ViTConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                           intermediate_size=128, image_size=32, patch_size=8),
            "ViTModel", "last_hidden_state", lambda: torch.randn(1, 3, 32, 32)),
    "convnext": (lambda: transformers.ConvNextConfig(depths=[1, 3], hidden_sizes=[16, 32], num_stages=2),
                 "ConvNextModel", "pooler_output", lambda: torch.randn(1, 3, 32, 32)),
    "clip_text": (lambda: transformers.CLIPTextConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                                      intermediate_size=128, vocab_size=100,
                                                      max_position_embeddings=16),
                  "CLIPTextModel", "last_hidden_state", lambda: torch.randint(0, 100, (1, 9))),
    # Its feature convolutions run at a new length each (traced per length).
    "wav2vec2": (lambda: transformers.Wav2Vec2Config(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                                     intermediate_size=64, conv_dim=(16,) * 4, conv_kernel=(10, 3, 3, 2),
                                                     conv_stride=(5, 2, 2, 2), num_conv_pos_embeddings=16,
                                                     num_conv_pos_embedding_groups=4),
                 "Wav2Vec2Model", "last_hidden_state", lambda: torch.randn(1, 800)),
}


@pytest.mark.parametrize("name", list(ENCODERS))
def test_transformers_encoders_and_backbones(name):
    make_config, cls, key, make_input = ENCODERS[name]
    model = Features(getattr(transformers, cls)(make_config()), key).eval()
    x = make_input()
    regional, full = export_both(model, (x,))
    r = report(regional)
    # wav2vec2's feature convolutions run at a new length each: one trace per length
    once = [k for k in r["kinds"] if not k["class"].endswith("ConvLayer")]
    assert r["fallbacks"] == [] and once and all(k["traced"] == 1 for k in once), r
    assert all(k["traced"] == k["calls"] for k in r["kinds"] if k not in once), r
    verify(regional.graph, check_shapes=True)      # every value's recorded shape is what its op makes
    assert flatbuffer_bytes(regional) == flatbuffer_bytes(full)      # the same program file
    x = make_input()
    with torch.no_grad():
        ref = model(x)
    assert_same(ostinato.compile(regional)(x), ref)


class SizedBlock(nn.Module):
    """A block whose computation depends on its input's sizes: a view to them and a size read as a
    number (``numeric``)."""

    def __init__(self, numeric: bool):
        super().__init__()
        self.lin, self.numeric = nn.Linear(8, 8), numeric

    def forward(self, x):
        y = self.lin(x)
        if self.numeric:
            return y * y.shape[1]
        return y.reshape(y.shape[0] * y.shape[1], 8).softmax(0).view(y.shape)


class Subsampled(nn.Module):
    """Two instances of one block, the second on half the tokens (LeViT's stages, T5's encoder and
    decoder feed-forward: one kind called at several sizes)."""

    def __init__(self, numeric: bool):
        super().__init__()
        self.a, self.b = SizedBlock(numeric), SizedBlock(numeric)

    def forward(self, x):
        return self.b(self.a(x)[:, ::2])


@pytest.mark.parametrize("numeric", [False, True], ids=["view", "size-as-number"])
def test_one_kind_at_several_sizes_is_traced_per_size(numeric):
    """Each size gets its own trace: the block traced at 4 tokens reused at 2 failed a view at run time,
    or (a size read as a number) answered wrong with no error."""
    torch.manual_seed(0)
    model = Subsampled(numeric).eval()
    regional, full = export_both(model, (torch.randn(2, 4, 8),))
    (kind,) = report(regional)["kinds"]
    assert kind["calls"] == kind["traced"] == 2, kind
    verify(regional.graph, check_shapes=True)
    x = torch.randn(2, 4, 8)
    with torch.no_grad():
        ref = model(x)
    assert_same(ostinato.compile(regional, cache=False)(x), ref)
    assert_same(ostinato.compile(full, cache=False)(x), ref)


class _Processor:
    """diffusers' style: each attention block gets its own processor object, holding nothing (or plain
    settings), whose ``__call__`` does the block's work."""

    def __init__(self, slope=0.5, table=None):
        self.slope, self.table = slope, table

    def __call__(self, block, x):
        y = torch.nn.functional.leaky_relu(block.fc(x), self.slope)
        return y if self.table is None else y * self.table


class WithProcessor(nn.Module):
    def __init__(self, d=16, **processor):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.processor = _Processor(**processor)

    def forward(self, x):
        return x + self.processor(self, x)


@pytest.mark.parametrize("case", ["equal", "settings_differ", "tensors_differ"])
def test_helper_objects_per_instance(case):
    """Equal helper objects (one per block, same class, equal plain attributes) let the blocks be traced
    once; a setting that differs, or a tensor the helper holds (no module's weight: nothing would map it
    per instance), falls back. Every case matches eager."""
    g = torch.Generator().manual_seed(4)
    make = {"equal": lambda i: {}, "settings_differ": lambda i: {"slope": 0.1 * (i + 1)},
            "tensors_differ": lambda i: {"table": torch.rand(16, generator=g) + 0.5}}[case]
    model = Stack([WithProcessor(**make(i)) for i in range(4)]).eval()
    prog = ostinato.export(model, (torch.randn(2, 16, generator=g),), cache=False)
    r = report(prog)
    if case == "equal":
        assert r["blocks"] == 1 and r["fallbacks"] == [] and r["kinds"][0]["traced"] == 1, r
    else:
        assert r["kinds"] == [] and "reads self.processor, which differs" in r["fallbacks"][0], r
    x = torch.randn(2, 16, generator=g)
    with torch.no_grad():
        ref = model(x)
    assert_same(ostinato.compile(prog)(x), ref)


class _BiasCache(nn.Module):
    """timm's LeViT: attention biases cached per device in a plain dict, filled by forward in eval mode."""

    def __init__(self, d=16):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.bias = nn.Parameter(torch.randn(d))
        self.cache: dict = {}
        self.seen: list = []

    def forward(self, x):
        key = str(x.device)
        if key not in self.cache:
            self.cache[key] = self.bias * 2
        self.seen.append(x.shape[0])
        self.last = x.shape[-1]
        return x + torch.tanh(self.fc(x)) * self.cache[key]


@pytest.mark.parametrize("regional", [True, False])
@pytest.mark.parametrize("warm", [True, False])
def test_export_leaves_the_models_python_state_as_it_was(regional, warm):
    """After export the user's model runs eagerly as before: what its forward cached in plain dicts and
    lists during the trace (traced tensors) is gone, attributes it added are removed, and what was there
    before (a cache filled by an earlier eager call) is kept, the same tensor objects."""
    model = Stack([_BiasCache() for _ in range(3)]).eval()
    x = torch.randn(2, 16)
    if warm:
        with torch.no_grad():
            model(x)
    before = [(dict(b.cache), list(b.seen), b.__dict__.get("last")) for b in model.blocks]
    prog = ostinato.export(model, (x,), cache=False, regional=regional)
    for b, (cache, seen, last) in zip(model.blocks, before):
        assert b.cache.keys() == cache.keys() and all(b.cache[k] is cache[k] for k in cache)
        assert b.seen == seen and b.__dict__.get("last") == last
    y = torch.randn(2, 16)
    with torch.no_grad():
        ref = model(y)      # eager works (a traced tensor left in the cache would raise here)
    assert all(type(v) is torch.Tensor for b in model.blocks for v in b.cache.values())
    assert_same(ostinato.compile(prog)(y), ref)
