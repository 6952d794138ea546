"""What the default pipeline leaves of each decoder layer, on Llama, Qwen2, Gemma, GPT-2 and the tiny decoder.

Each model is exported with 2 and with 3 layers: the difference of the op counts is exactly one layer,
and ops whose count does not grow are built once for all layers (the mask, the rotary tables).
Per layer: one ost.sdpa, no repeat_kv copies, one fused norm per norm, one ost.rope per Q and per K,
one in-place ost.kv_update_ per K and per V. The outputs still equal eager over 8 decode steps
(the 2-layer programs, state included).
"""
from __future__ import annotations

import copy

import pytest
import torch
import transformers

import ostinato
from examples.tiny_decoder import TinyDecoder, decode_inputs as tiny_inputs
from helpers import assert_decode_matches, assert_same
from test_hf_decoders import CONFIGS, DECODER, TOKEN_IDS, VOCAB, decode_inputs, make_wrapper

# Nothing of these may remain: expansion copies of the KV cache, the unfused attention, the mask
# comparison, rotate_half's pieces and the functional cache writes.
GONE = ("aten.repeat_interleave.self_int", "aten.expand", "aten.clone", "aten.scaled_dot_product_attention",
        "aten.le.Tensor", "aten.ge.Tensor", "aten.neg", "aten.slice.Tensor", "aten.index_put",
        "aten.index_put_", "aten.index_copy", "aten.pow.Tensor_Scalar", "aten.rsqrt", "aten.layer_norm")

ROPE_LAYER = {"ost.sdpa": 1, "ost.rope": 2, "ost.kv_update_": 2}
# Each norm that reads a residual sum takes the add in (ost.add_rms_norm): only the first layer's
# input norm, which reads the embedding, stays a plain ost.rms_norm. Gemma's norm (its weight
# multiplied in fp32 as 1 + weight, before the cast back) is taken whole, its weight's cast and
# + 1 included.
ADD_NORMS = {"ost.rms_norm": 0, "ost.add_rms_norm": 2}
PER_LAYER = {
    "llama": {**ROPE_LAYER, **ADD_NORMS, "ost.swiglu": 1},
    "qwen2": {**ROPE_LAYER, **ADD_NORMS, "ost.swiglu": 1},
    "gemma": {**ROPE_LAYER, **ADD_NORMS, "ost.geglu": 1},
    # GPT-2's Conv1D projections: c_fc with its GELU, c_attn and mlp.c_proj whole (ost.linear without an
    # activation); attn.c_proj flattens the heads itself and stays an addmm
    "gpt2": {"ost.sdpa": 1, "ost.kv_update_": 2, "ost.layer_norm": 2, "ost.linear": 3, "aten.addmm": 1},
    "tiny": {**ROPE_LAYER, **ADD_NORMS, "ost.swiglu": 1},
}
# Built once however many layers: position ids, the causal mask's inputs, the rotary tables.
SHARED = {"llama": ("aten.arange.start_step", "aten.cos", "aten.sin", "aten.cat", "aten.unsqueeze"),
          "gpt2": ("aten.arange.start_step", "aten.unsqueeze"),
          "tiny": ("aten.index.Tensor", "aten.unsqueeze")}
SHARED["qwen2"] = SHARED["gemma"] = SHARED["llama"]


def _hf(family: str, layers: int):
    if family == "gpt2":
        config = transformers.GPT2Config(n_embd=64, n_layer=layers, n_head=4, n_inner=128, vocab_size=VOCAB,
                                         n_positions=64, **TOKEN_IDS)
    else:  # rebuilt, not edited: configs derive per-layer lists (layer_types) from the count
        extra = {"head_dim": 16} if family == "gemma" else {}
        config = type(CONFIGS[family]())(**{**DECODER, "num_hidden_layers": layers, **extra})
    return make_wrapper(family, config)


def _export(family: str, layers: int):
    if family == "tiny":
        torch.manual_seed(0)
        model = TinyDecoder(dim=32, layers=layers, heads=4, kv_heads=2, vocab=64, max_seq=16).eval()
        return model, ostinato.export(copy.deepcopy(model), tiny_inputs(0, vocab=64))
    model = _hf(family, layers)
    gen = torch.Generator().manual_seed(1)
    return model, ostinato.export(copy.deepcopy(model), (), decode_inputs(0, gen), trace_strict=True)


@pytest.mark.parametrize("family", list(PER_LAYER))
def test_one_fused_op_of_each_kind_per_layer(family):
    model2, prog2 = _export(family, 2)
    _, prog3 = _export(family, 3)
    c2, c3 = prog2.op_counts(), prog3.op_counts()
    layer = {op: c3.get(op, 0) - c2.get(op, 0) for op in set(c2) | set(c3)}
    for op, n in PER_LAYER[family].items():
        assert layer[op] == n and c2[op] == 2 * n + (1 if op in ("ost.rms_norm", "ost.layer_norm") else 0), \
            f"{family}: {op} per layer {layer[op]}, total {c2.get(op)}"
    assert not set(GONE) & set(c2), f"{family}: left unfused: {sorted(set(GONE) & set(c2))}"
    for op in SHARED[family]:
        assert c2.get(op, 0) == c3.get(op, 0) > 0, f"{family}: {op} is built per layer ({c2.get(op)} → {c3.get(op)})"
    # Only GQA models expand heads: the fused attention reads the caches themselves, not copies.
    n_rep = {node.args[6] for node in prog2.graph.nodes if node.op == "ost.sdpa"}
    assert n_rep == ({1} if family == "gpt2" else {2})

    exe = ostinato.compile(prog2)
    if family == "tiny":
        assert_decode_matches(exe, model2, 8)
        return
    ref = copy.deepcopy(model2)
    gen = torch.Generator().manual_seed(2)
    for s in range(8):
        kwargs = decode_inputs(s, gen)
        with torch.no_grad():
            expected = ref(**kwargs)
        assert_same(exe(**kwargs), expected, msg=f"{family} step {s}")
    for name, buf in ref.named_buffers():
        if name.startswith(("key_cache", "value_cache")):
            assert_same(exe.session.state[name], buf, msg=f"{family} state {name}")
