"""A configuration of the matrix made concrete: the model on its device in its dtype, the inputs of
each step, and how to export it. Builders are seeded, so a fresh process builds the same weights."""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from . import models

INPUT_STEPS = 8   # distinct step inputs, cycled while timing (decode positions 0..7)


@dataclass
class Workload:
    """``model(*args, **kwargs)`` for each ``(args, kwargs)`` of ``steps`` is one timed step."""

    model: nn.Module
    steps: list[tuple[tuple, dict]]
    export_options: dict = field(default_factory=dict)   # extra keywords for ostinato.export
    description: str = ""

    def model_bytes(self) -> int:
        """Bytes of the model's parameters and buffers (each storage once): weights and KV caches."""
        seen, total = set(), 0
        for t in list(self.model.parameters()) + list(self.model.buffers()):
            key = (t.untyped_storage().data_ptr(), t.device)
            if key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
        return total


def strict_export_option() -> dict:
    """torch.export strict (Dynamo) tracing, which HF static-cache wrappers need: the keyword is
    ``trace_strict`` in newer ostinato, ``strict`` before."""
    import ostinato
    params = inspect.signature(ostinato.export).parameters
    return {"trace_strict": True} if "trace_strict" in params else {"strict": True}


def _gen(seed: int = 1) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- builders: (params, device, dtype) -> Workload ----------------------------------------------------

def tiny_decoder(p: dict, device: torch.device, dtype: torch.dtype) -> Workload:
    from examples.tiny_decoder import TinyDecoder, decode_inputs
    torch.manual_seed(0)
    model = TinyDecoder(dim=p["hidden"], layers=p["layers"]).eval().to(device=device, dtype=dtype)
    g = _gen()
    steps = [(tuple(t.to(device) for t in decode_inputs(s, generator=g)), {}) for s in range(INPUT_STEPS)]
    return Workload(model, steps, description=f"TinyDecoder(hidden={p['hidden']}, layers={p['layers']}), decode step")


HF_SHAPES = {
    # Real shapes of the named models (rope scaling left out); "layers" may be overridden by a config.
    "llama-3.2-1b": ("LlamaConfig", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                         num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                                         vocab_size=128256, rope_theta=500000.0, tie_word_embeddings=True)),
    "qwen2.5-0.5b": ("Qwen2Config", dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                         num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                         rope_theta=1000000.0, tie_word_embeddings=True)),
    "gemma-2b": ("GemmaConfig", dict(hidden_size=2048, intermediate_size=16384, num_hidden_layers=18,
                                     num_attention_heads=8, num_key_value_heads=1, head_dim=256,
                                     vocab_size=256000)),
    "llama-4096": ("LlamaConfig", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=8,
                                       num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                       vocab_size=32000, rope_theta=500000.0)),
    # CPU-sized versions of the same families: same head layout ratios, narrow and shallow.
    "llama-mini": ("LlamaConfig", dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                                       num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                                       vocab_size=4096, rope_theta=500000.0, tie_word_embeddings=True)),
    "qwen-mini": ("Qwen2Config", dict(hidden_size=224, intermediate_size=1216, num_hidden_layers=6,
                                      num_attention_heads=14, num_key_value_heads=2, vocab_size=4096,
                                      rope_theta=1000000.0, tie_word_embeddings=True)),
    "gemma-mini": ("GemmaConfig", dict(hidden_size=256, intermediate_size=2048, num_hidden_layers=4,
                                       num_attention_heads=4, num_key_value_heads=1, head_dim=64,
                                       vocab_size=4096)),
    "llama-1024": ("LlamaConfig", dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=2,
                                       num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                                       vocab_size=8192, rope_theta=500000.0)),
    # More decoder families: real shapes (Phi-3-mini and Mistral-7B with fewer layers, given by the
    # configuration), then CPU-sized versions.
    "gemma2-2b": ("Gemma2Config", dict(hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                                       num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                                       vocab_size=256000, sliding_window=4096, query_pre_attn_scalar=256,
                                       attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
    "phi-3-mini": ("Phi3Config", dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                                      num_attention_heads=32, num_key_value_heads=32, vocab_size=32064)),
    "gpt2": ("GPT2Config", dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024)),
    "gpt2-medium": ("GPT2Config", dict(n_embd=1024, n_layer=24, n_head=16, vocab_size=50257, n_positions=1024)),
    # Mistral-7B's layer with a 256-token sliding window (its real window, 4096, would never slide in
    # the suite's caches); the decode configurations start past the window so the mask slides.
    "mistral-7b-sw256": ("MistralConfig", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                               num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                               vocab_size=32000, sliding_window=256)),
    "gemma2-mini": ("Gemma2Config", dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=4096,
                                         sliding_window=64, query_pre_attn_scalar=64, attn_logit_softcapping=50.0,
                                         final_logit_softcapping=30.0)),
    "phi3-tiny": ("Phi3Config", dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                                     num_attention_heads=8, num_key_value_heads=8, vocab_size=4096)),
    "gpt2-mini": ("GPT2Config", dict(n_embd=256, n_layer=4, n_head=4, vocab_size=4096, n_positions=1024)),
    "mistral-mini-sw64": ("MistralConfig", dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                                                num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                                                vocab_size=4096, sliding_window=64)),
    # Families the matrix leaves out, timed by bench/family_decode.py (issue #15): the named models' widths,
    # the depth given there. Falcon-7B is multi-query (one KV head, which transformers' static cache reads
    # from ``num_key_value_heads``) with attention and MLP in parallel; BLOOM has no sdpa (ALiBi biases).
    "falcon-7b": ("FalconConfig", dict(hidden_size=4544, num_attention_heads=71, num_key_value_heads=1,
                                       multi_query=True, new_decoder_architecture=False, parallel_attn=True,
                                       bias=False, num_hidden_layers=32, vocab_size=65024)),
    "gpt-j-6b": ("GPTJConfig", dict(n_embd=4096, n_head=16, rotary_dim=64, n_layer=28, vocab_size=50400)),
    "bloom-560m": ("BloomConfig", dict(hidden_size=1024, n_head=16, n_layer=24, vocab_size=250880)),
    "olmo2-1b": ("Olmo2Config", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                     num_attention_heads=16, num_key_value_heads=16, vocab_size=100352,
                                     rope_theta=500000.0, rms_norm_eps=1e-6)),
    # LayerNorm decoders (a batched step folds their norms: passes/fold_norms.py): StableLM-2-1.6B (a weight
    # and a shift, q/k/v biases, a quarter of each head roped) and OLMo-1B (no weights, in fp32)
    "stablelm-2-1.6b": ("StableLmConfig", dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                                               num_attention_heads=32, num_key_value_heads=32, vocab_size=100352,
                                               partial_rotary_factor=0.25, use_qkv_bias=True)),
    "olmo-1b": ("OlmoConfig", dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                   num_attention_heads=16, num_key_value_heads=16, vocab_size=50304)),
    # biased output projections (a batched step's folds then lag the residual stream by their biases): OPT-1.3B
    # (positions from the cache), StarCoder2-3B (grouped KV heads, GELU(tanh) MLP); GPT-2 medium is above
    "opt-1.3b": ("OPTConfig", dict(hidden_size=2048, ffn_dim=8192, num_hidden_layers=24, num_attention_heads=32,
                                   vocab_size=50272, word_embed_proj_dim=2048)),
    "starcoder2-3b": ("Starcoder2Config", dict(hidden_size=3072, intermediate_size=12288, num_hidden_layers=30,
                                               num_attention_heads=24, num_key_value_heads=2, vocab_size=49152,
                                               sliding_window=4096)),
    # mixture of experts: Mixtral-8x7B's layer (8 experts, 2 per token; transformers' default experts
    # implementation, grouped_mm; head_dim given: transformers 5.17's static cache needs it)
    "mixtral-8x7b": ("MixtralConfig", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                           num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                           vocab_size=32000,
                                           num_local_experts=8, num_experts_per_tok=2, rope_theta=1e6)),
    # Qwen1.5-MoE-A2.7B's layer: 60 experts, 4 per token, not normalized, and a shared expert (5632 wide)
    # scaled by sigmoid(its gate) added to theirs
    "qwen1.5-moe-a2.7b": ("Qwen2MoeConfig", dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
                                                 num_attention_heads=16, num_key_value_heads=16, vocab_size=151936,
                                                 num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408,
                                                 shared_expert_intermediate_size=5632, norm_topk_prob=False,
                                                 decoder_sparse_step=1, mlp_only_layers=[])),
    # many small experts: Qwen3-30B-A3B (8 of 128, 768 wide, normalized; q/k norms) and OLMoE-1B-7B (8 of 64,
    # 1024 wide, not normalized)
    "qwen3-30b-a3b": ("Qwen3MoeConfig", dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
                                             num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                                             vocab_size=151936, num_experts=128, num_experts_per_tok=8,
                                             moe_intermediate_size=768, norm_topk_prob=True, decoder_sparse_step=1,
                                             mlp_only_layers=[])),
    "olmoe-1b-7b": ("OlmoeConfig", dict(hidden_size=2048, intermediate_size=1024, num_hidden_layers=16,
                                        num_attention_heads=16, num_key_value_heads=16, vocab_size=50304,
                                        num_experts=64, num_experts_per_tok=8, norm_topk_prob=False)),
}
_LAYERS_KEY = {"GPT2Config": "n_layer", "GPTJConfig": "n_layer", "BloomConfig": "n_layer"}


def narrow_decoder(cls: str, kw: dict) -> dict:
    """The same architecture at hidden 64, 4 heads (grouped KV kept grouped), vocabulary 512 and a
    window of 8: what ``small_params`` builds to check a builder in seconds."""
    if cls == "GPT2Config":
        return dict(kw, n_embd=64, n_head=4, vocab_size=512)
    if cls == "GPTJConfig":
        return dict(kw, n_embd=64, n_head=4, rotary_dim=8, vocab_size=512)
    if cls == "BloomConfig":
        return dict(kw, hidden_size=64, n_head=4, vocab_size=512)
    heads, kv = kw["num_attention_heads"], kw.get("num_key_value_heads", kw["num_attention_heads"])
    # multi-query stays multi-query where the architecture is written for it (Falcon-7B's attention)
    out = dict(kw, hidden_size=64, intermediate_size=128, num_attention_heads=4, vocab_size=512,
               num_key_value_heads=4 if kv == heads else 1 if cls == "FalconConfig" else 2)
    for key, value in (("head_dim", 16), ("query_pre_attn_scalar", 16), ("sliding_window", 8)):
        if key in out:
            out[key] = value
    return out


# families whose decode step exports only with the positions passed: OPT derives them from the cache's seen
# length (a data-dependent read) unless ``position_ids`` is given
PASS_POSITIONS = ("OPTConfig",)


def positions_wrapper():
    """transformers' static-cache export wrapper, passing ``position_ids`` (the cache positions) to the model
    (OPT's decode step: bench/launch_census.py's too)."""
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    class StaticCacheWithPositions(TorchExportableModuleWithStaticCache):
        def forward(self, input_ids=None, inputs_embeds=None, cache_position=None):
            for layer in self.static_cache.layers:
                if hasattr(layer, "cumulative_length"):
                    layer.cumulative_length.copy_(cache_position[0])
            positions = cache_position.unsqueeze(0).expand(input_ids.shape[0], -1)
            return self.model(input_ids=input_ids, attention_mask=None, position_ids=positions,
                              cache=self.static_cache, use_cache=True).logits

    return StaticCacheWithPositions


def hf_decoder(p: dict, device: torch.device, dtype: torch.dtype) -> Workload:
    """transformers' static-cache export wrapper around a from_config model with random weights, built
    on ``device`` in ``dtype`` (the cache's tensors are not all buffers: ``.to()`` would not move them).
    ``tokens`` > 1 is a prefill of that many tokens at positions 0..tokens-1; 1 is a decode step."""
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache
    cls, shape = HF_SHAPES[p["shape"]]
    shape = dict(shape, **({_LAYERS_KEY.get(cls, "num_hidden_layers"): p["layers"]} if "layers" in p else {}))
    if p.get("narrow"):
        shape = narrow_decoder(cls, shape)
    config = getattr(transformers, cls)(max_position_embeddings=max(4096, p["cache"]), pad_token_id=0,
                                        bos_token_id=1, eos_token_id=2, **shape)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
        with torch.no_grad():   # from_config leaves norms at 1 (Gemma: 0 for its 1+w)
            for name, w in model.named_parameters():
                if w.dim() == 1 and name.endswith("bias"):
                    w.uniform_(-0.2, 0.2)
                elif w.dim() == 1:
                    w.uniform_(-0.5, 0.5) if "gemma" in p["shape"] else w.uniform_(0.5, 1.5)
        model.generation_config = GenerationConfig(use_cache=True, cache_implementation="static")
        wrapper_cls = positions_wrapper() if cls in PASS_POSITIONS else TorchExportableModuleWithStaticCache
        wrapper = wrapper_cls(model, batch_size=p["batch"], max_cache_len=p["cache"], device=device).eval()
    g, t, vocab = _gen(), p["tokens"], shape["vocab_size"]
    steps = []
    start = p.get("start", 0)   # first position: a decode past a sliding window reads a slid mask
    for s in range(INPUT_STEPS if t == 1 else 2):
        ids = torch.randint(0, vocab, (p["batch"], t), generator=g).to(device)
        pos = (torch.tensor([start + s]) if t == 1 else start + torch.arange(t)).to(device)
        steps.append(((), {"input_ids": ids, "cache_position": pos}))
    kind = ("decode step" if t == 1 else f"{t}-token prefill") + (f" from position {start}" if start else "")
    return Workload(wrapper, steps, strict_export_option(),
                    f"{p['shape']} ({cls}, {config.num_hidden_layers} layers, random weights), batch {p['batch']}, "
                    f"{kind}, static cache {p['cache']}")


def unet(p: dict, device: torch.device, dtype: torch.dtype) -> Workload:
    torch.manual_seed(0)
    model = models.UNetStack(ch=p["ch"]).eval().to(device=device, dtype=dtype)
    g, r, b = _gen(), p["res"], p["batch"]
    steps = [((torch.randn(b, 4, r, r, generator=g).to(device, dtype),
               torch.randint(0, 1000, (b,), generator=g).float().to(device)), {}) for _ in range(2)]
    return Workload(model, steps, description=f"UNetStack(ch={p['ch']}), latents {b}x4x{r}x{r}")


def dit(p: dict, device: torch.device, dtype: torch.dtype) -> Workload:
    torch.manual_seed(0)
    model = models.DiTStack(dim=p["dim"], depth=p["depth"], heads=p["heads"], size=p["res"]).eval()
    model = model.to(device=device, dtype=dtype)
    g, r, b = _gen(), p["res"], p["batch"]
    steps = [((torch.randn(b, 4, r, r, generator=g).to(device, dtype),
               torch.randint(0, 1000, (b,), generator=g).float().to(device),
               torch.randint(0, 1000, (b,), generator=g).to(device)), {}) for _ in range(2)]
    return Workload(model, steps, description=f"DiTStack(dim={p['dim']}, depth={p['depth']}, patch 2), "
                                              f"latents {b}x4x{r}x{r} ({(r // 2) ** 2} tokens)")


def resnet(p: dict, device: torch.device, dtype: torch.dtype) -> Workload:
    torch.manual_seed(0)
    model = models.ResNet(width=p["width"]).eval().to(device=device, dtype=dtype)
    g, r, b = _gen(), p["res"], p["batch"]
    steps = [((torch.randn(b, 3, r, r, generator=g).to(device, dtype),), {}) for _ in range(2)]
    return Workload(model, steps, description=f"ResNet-18 layout, width {p['width']}, images {b}x3x{r}x{r}")


class EncoderOutput(nn.Module):
    """A transformers encoder returning its last hidden state as a plain tensor."""

    def __init__(self, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder

    def forward(self, features):
        return self.encoder(features).last_hidden_state


def whisper_encoder(p: dict, device: torch.device, dtype: torch.dtype) -> Workload:
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder
    torch.manual_seed(0)
    config = WhisperConfig(d_model=p["dim"], encoder_layers=p["layers"], encoder_attention_heads=p["heads"],
                           encoder_ffn_dim=4 * p["dim"], decoder_layers=1, decoder_attention_heads=p["heads"],
                           decoder_ffn_dim=4 * p["dim"], num_mel_bins=80, max_source_positions=p["positions"],
                           vocab_size=128, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=3)
    encoder = models.perturb_norms(WhisperEncoder(config)).eval()
    model = EncoderOutput(encoder).eval().to(device=device, dtype=dtype)
    g = _gen()
    steps = [((torch.randn(p["batch"], 80, 2 * p["positions"], generator=g).to(device, dtype),), {})
             for _ in range(2)]
    return Workload(model, steps, description=f"Whisper encoder (d_model {p['dim']}, {p['layers']} layers), "
                                              f"batch {p['batch']}, {2 * p['positions']} mel frames")


def user_decoder(p: dict, device: torch.device, dtype: torch.dtype) -> Workload:
    from .user_models import UserDecoder
    torch.manual_seed(0)
    model = UserDecoder(p["dim"], p["layers"], p["style"]).eval().to(device=device, dtype=dtype)
    g = _gen()
    steps = [((torch.randint(0, 1024, (1, 1), generator=g).to(device), torch.tensor([s], device=device)), {})
             for s in range(INPUT_STEPS)]
    norm = "x * rsqrt(mean(x^2) + eps) * w, index_copy_ KV cache, SwiGLU" if p["style"] == "rms" else \
        "LayerNorm, GELU(tanh), ring-buffer KV cache"
    return Workload(model, steps, description=f"user-written decoder (hidden {p['dim']}, {p['layers']} layers, fused QKV, "
                                              f"{norm}), decode step")


def conv_stack(p: dict, device: torch.device, dtype: torch.dtype) -> Workload:
    from .user_models import ConvStack
    torch.manual_seed(0)
    model = ConvStack(p["ch"], p["blocks"]).eval().to(device=device, dtype=dtype)
    g, r, b = _gen(), p["res"], p["batch"]
    steps = [((torch.randn(b, p["ch"], r, r, generator=g).to(device, dtype),), {}) for _ in range(2)]
    return Workload(model, steps, description=f"{p['blocks']} conv blocks (GroupNorm, SiLU, depthwise conv) and a "
                                              f"pixel shuffle, {b}x{p['ch']}x{r}x{r}")


def _hf_encoder(p: dict, device: torch.device, dtype: torch.dtype) -> Workload:
    from .hf_models import hf_encoder
    return hf_encoder(p, device, dtype)


def _mobilenet_v3(p: dict, device: torch.device, dtype: torch.dtype) -> Workload:
    from .hf_models import mobilenet_v3
    return mobilenet_v3(p, device, dtype)


BUILDERS: dict[str, Callable[[dict, torch.device, torch.dtype], Workload]] = {
    "tiny-decoder": tiny_decoder, "hf-decoder": hf_decoder, "unet": unet, "dit": dit, "resnet": resnet,
    "whisper-encoder": whisper_encoder, "user-decoder": user_decoder, "conv-stack": conv_stack,
    "hf-encoder": _hf_encoder, "mobilenet-v3": _mobilenet_v3,
}


def build(builder: str, params: dict[str, Any], device: str, dtype: str) -> Workload:
    """The workload of builder ``builder``: a BUILDERS key, or ``module:function`` (a builder outside
    the suite, importable in the fresh processes too)."""
    if ":" in builder:
        import importlib
        module, name = builder.split(":")
        fn = getattr(importlib.import_module(module), name)
    else:
        fn = BUILDERS[builder]
    return fn(params, torch.device(device), getattr(torch, dtype))


def small_params(config) -> dict:
    """``config``'s parameters shrunk so its builder runs in about a second on a CPU (tests): batch 1,
    one or two layers, short inputs, and for the transformers models ``narrow`` (hidden 64, small
    vocabulary). Same builder, same model classes and code paths; not the configuration's shapes."""
    from .hf_models import ENCODER_SHAPES, _DEPTH_KEY
    p, b = dict(config.params), config.builder
    if "batch" in p:
        p["batch"] = 1
    if b == "hf-decoder":
        p.update(narrow=True, layers=2, cache=32, tokens=min(p["tokens"], 8))
        if "start" in p:
            p["start"] = 16     # past the narrowed window of 8: the mask still slides
    elif b == "hf-encoder":
        cls, _, _, kind = ENCODER_SHAPES[p["shape"]]
        p["narrow"] = True
        if _DEPTH_KEY.get(cls, "num_hidden_layers") is not None:
            p["layers"] = 1
        if kind == "tokens":
            p["tokens"] = min(p["tokens"], 16)
        elif kind == "audio":
            p["samples"] = min(p["samples"], 3200)
        elif cls not in ("ViTConfig", "CLIPVisionConfig"):   # those two have a position table per patch
            p["res"] = min(p["res"], 64)
    elif b == "mobilenet-v3":
        p["res"] = 64
    else:
        p.update({"tiny-decoder": {"hidden": 32, "layers": 1}, "unet": {"ch": 32, "res": 8},
                  "dit": {"dim": 64, "depth": 1, "heads": 4, "res": 8}, "resnet": {"width": 8, "res": 32},
                  "whisper-encoder": {"dim": 64, "layers": 1, "heads": 4, "positions": 16},
                  "user-decoder": {"dim": 64, "layers": 1}, "conv-stack": {"ch": 32, "blocks": 1, "res": 8}}[b])
    return p
