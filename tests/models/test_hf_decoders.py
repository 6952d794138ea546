"""Hugging Face decoder-only LMs (random weights, tiny configs) with a static KV cache as program state.

Each model is wrapped in transformers' own export recipe, TorchExportableModuleWithStaticCache, which
builds a StaticCache and registers its key/value/cumulative-length tensors as module buffers; ostinato
turns those buffers into program state. 8 successive single-token decode steps are compared with the
eager wrapper (a deep copy, so both caches evolve independently), then the caches themselves.

The export uses ``trace_strict=True`` (torch.export's strict mode), as transformers' recipe does
(TorchExportableModuleForDecoderOnlyLM.export defaults to strict). In non-strict mode torch.export does not see that the StaticCache layers' tensors
are the registered buffers (the layers hold the tensors directly), lifts them as constants with in-place
index_copy_ on them, and torch's own run_decompositions then fails with "expected compiled_fn to be
GraphModule" -- with or without ostinato's decomposition table.
"""
from __future__ import annotations

import copy

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

import ostinato
from helpers import BACKENDS, assert_same, host

# transformers' output capturing is a global dynamo reports as a side effect; harmless here.
pytestmark = pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects")

VOCAB, MAX_CACHE, BATCH, STEPS = 128, 16, 2, 8
TOKEN_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
DECODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, **TOKEN_IDS)

CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**DECODER),
    "qwen2": lambda: transformers.Qwen2Config(**DECODER),
    "gemma": lambda: transformers.GemmaConfig(head_dim=16, **DECODER),
    # GPT-2 has no grouped KV heads: 4 heads, 4 KV heads.
    "gpt2": lambda: transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_inner=128, vocab_size=VOCAB,
                                            n_positions=64, **TOKEN_IDS),
    # A window of 4 keys over 8 steps: the window slides (an explicit mask the attention must read).
    "mistral": lambda: transformers.MistralConfig(sliding_window=4, **DECODER),
    # Phi-3: packed QKV and gate/up projections.
    "phi3": lambda: transformers.Phi3Config(**DECODER),
    # Gemma 2: soft-capped attention scores and logits, a sliding window on every other layer.
    "gemma2": lambda: transformers.Gemma2Config(head_dim=16, sliding_window=4, **DECODER),
    # Qwen 3 and Gemma 3: an RMSNorm over each head of q and k before the rope (Gemma 3's after the
    # transpose, with 1 + w; Qwen 3's before it); Gemma 3 alternates sliding and full layers.
    "qwen3": lambda: transformers.Qwen3Config(head_dim=16, **DECODER),
    "gemma3": lambda: transformers.Gemma3TextConfig(head_dim=16, sliding_window=4,
                                                    layer_types=["sliding_attention", "full_attention"], **DECODER),
    # GPT-NeoX (a quarter of each head rotated) and Phi-2 (half): partial rotary embeddings.
    "gpt_neox": lambda: transformers.GPTNeoXConfig(**{k: v for k, v in DECODER.items() if k != "num_key_value_heads"}),
    "phi": lambda: transformers.PhiConfig(**DECODER),
    # OLMo 2: an RMSNorm of the whole q and k projections (every head at once, in fp32 between casts) before
    # the view into heads, norms after the attention and the MLP (post-norm).
    "olmo2": lambda: transformers.Olmo2Config(**DECODER),
    # Falcon-7B's form: one fused QKV projection written as ``x @ W.T`` (matmuls, not aten.linear), split by
    # constant list indexes (``qkv[..., [-2], :]``), one KV head broadcast over the query heads by sdpa (no
    # repeat_kv), attention and MLP side by side over one LayerNorm.
    "falcon": lambda: _falcon(),
    # GPT-J: an interleaved (rotate-every-two) rope over the first 8 dims of each head, done on [B, S, H, D]
    # rows before the transpose to the head-major cache.
    "gptj": lambda: transformers.GPTJConfig(n_embd=64, n_layer=2, n_head=4, n_inner=128, rotary_dim=8,
                                            vocab_size=VOCAB, n_positions=64, **TOKEN_IDS),
    # BLOOM (eager attention: transformers has no other for it): ALiBi added by ``alibi.baddbmm(q, k^T)``
    # over [B*H]-flattened heads (fp32 casts around it), the causal mask on top; one fused QKV projection.
    "bloom": lambda: transformers.BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=VOCAB, **TOKEN_IDS),
}


def _falcon():
    config = transformers.FalconConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, vocab_size=VOCAB,
                                       max_position_embeddings=64, **TOKEN_IDS)
    assert config.multi_query and config.parallel_attn and not config.new_decoder_architecture
    config.num_key_value_heads = 1      # the static cache's size: FalconConfig names no KV heads
    return config
EXPECTED_CLASS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "gemma": "GemmaForCausalLM",
                  "gpt2": "GPT2LMHeadModel", "mistral": "MistralForCausalLM", "phi3": "Phi3ForCausalLM",
                  "gemma2": "Gemma2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "gemma3": "Gemma3ForCausalLM",
                  "gpt_neox": "GPTNeoXForCausalLM", "phi": "PhiForCausalLM",
                  "olmo2": "Olmo2ForCausalLM", "falcon": "FalconForCausalLM",
                  "gptj": "GPTJForCausalLM", "bloom": "BloomForCausalLM"}


def make_wrapper(family: str, config=None, device: str = "cpu",
                 dtype: torch.dtype = torch.float32) -> TorchExportableModuleWithStaticCache:
    """The wrapped model (same weights for the same family and config); its static cache is made on
    ``device`` in ``dtype`` (the cache's tensors are not all buffers, so ``.to()`` after wrapping
    would not move them)."""
    torch.manual_seed(0)
    config = CONFIGS[family]() if config is None else config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    assert type(model).__name__ == EXPECTED_CLASS[family]
    # from_config's init leaves norm weights at 1 (0 for Gemma's 1+w); make every weight non-trivial.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.uniform_(-0.5, 0.5) if name.endswith("bias") or family.startswith("gemma") else p.uniform_(0.5, 1.5)
    model = model.to(device=device, dtype=dtype)
    model.generation_config = GenerationConfig(use_cache=True, cache_implementation="static")
    return TorchExportableModuleWithStaticCache(model, batch_size=BATCH, max_cache_len=MAX_CACHE).eval()


def decode_inputs(pos: int, gen: torch.Generator) -> dict:
    return {"input_ids": torch.randint(0, VOCAB, (BATCH, 1), generator=gen),
            "cache_position": torch.tensor([pos])}


@pytest.mark.parametrize("device", BACKENDS)
@pytest.mark.parametrize("family", list(CONFIGS))
def test_decode_with_static_cache(family, device):
    wrapper = make_wrapper(family)
    ref = copy.deepcopy(wrapper)
    gen = torch.Generator().manual_seed(1)
    prog = ostinato.export(wrapper, (), decode_inputs(0, gen), trace_strict=True)
    cache_names = [n for n, _ in wrapper.named_buffers() if n.startswith(("key_cache", "value_cache"))]
    assert cache_names and set(cache_names) <= set(prog.state_init), \
        f"KV caches are not program state: state={sorted(prog.state_init)}"
    exe = ostinato.compile(prog, device=device)

    logits = []
    for s in range(STEPS):
        kwargs = decode_inputs(s, gen)
        with torch.no_grad():
            expected = ref(**kwargs)
        out = exe(**kwargs)
        # fp32, default tolerance 1e-5: observed differences are <= ~1e-7.
        assert_same(out, expected, msg=f"{family} step {s}")
        logits.append(expected)

    ref_buffers = dict(ref.named_buffers())
    for name in cache_names:
        assert_same(host(exe.session.state[name]), ref_buffers[name], msg=f"{family} state {name}")
        assert ref_buffers[name][:, :, :STEPS].abs().sum() > 0, f"{name} was never written"
    assert not torch.equal(logits[0], logits[-1])
