"""Single-forward workloads from transformers' own model classes (``from_config``, random weights, no
downloads): text encoders, vision backbones, speech encoders, CLIP's two towers and Mamba. Each is
wrapped to return one plain tensor (its last hidden state, pooled output or logits), so every runner,
ostinato's, AOTInductor's and ExecuTorch's alike, gives the same pytree.

Shapes are the named models' real ones (``*-mini`` and the like are CPU-sized versions of the same
family); ``layers`` in a configuration's parameters overrides the depth."""
from __future__ import annotations

import torch
from torch import nn

from . import models

# name -> (config class, model class, config keywords, input kind). Input kinds: "tokens" (input ids
# [B, tokens]), "pixels" ([B, 3, res, res]), "audio" (raw 16 kHz samples [B, samples]).
ENCODER_SHAPES: dict[str, tuple[str, str, dict, str]] = {
    # text encoders
    "bert-base": ("BertConfig", "BertModel", dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                                   intermediate_size=3072, vocab_size=30522), "tokens"),
    "bert-large": ("BertConfig", "BertModel", dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                                    intermediate_size=4096, vocab_size=30522), "tokens"),
    "bert-mini": ("BertConfig", "BertModel", dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                                   intermediate_size=1024, vocab_size=30522), "tokens"),
    "roberta-base": ("RobertaConfig", "RobertaModel", dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                                           intermediate_size=3072, vocab_size=50265,
                                                           max_position_embeddings=514, pad_token_id=1), "tokens"),
    "roberta-mini": ("RobertaConfig", "RobertaModel", dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                                           intermediate_size=1024, vocab_size=50265,
                                                           max_position_embeddings=514, pad_token_id=1), "tokens"),
    # DeBERTa-v3-base's disentangled attention (relative positions, shared keys, log buckets)
    "deberta-v3-base": ("DebertaV2Config", "DebertaV2Model",
                        dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                             vocab_size=128100, relative_attention=True, position_buckets=256,
                             norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
                             max_relative_positions=-1, position_biased_input=False, layer_norm_eps=1e-7),
                        "tokens"),
    "deberta-v3-mini": ("DebertaV2Config", "DebertaV2Model",
                        dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
                             vocab_size=128100, relative_attention=True, position_buckets=256,
                             norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
                             max_relative_positions=-1, position_biased_input=False, layer_norm_eps=1e-7),
                        "tokens"),
    "t5-base-encoder": ("T5Config", "T5EncoderModel", dict(d_model=768, d_ff=3072, d_kv=64, num_layers=12, num_heads=12,
                                                           vocab_size=32128), "tokens"),
    "t5-small-encoder": ("T5Config", "T5EncoderModel", dict(d_model=512, d_ff=2048, d_kv=64, num_layers=6, num_heads=8,
                                                            vocab_size=32128), "tokens"),
    # vision
    "vit-b16": ("ViTConfig", "ViTModel", dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                              intermediate_size=3072, image_size=224, patch_size=16), "pixels"),
    "vit-s16": ("ViTConfig", "ViTModel", dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6,
                                              intermediate_size=1536, image_size=224, patch_size=16), "pixels"),
    "vit-mini": ("ViTConfig", "ViTModel", dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=3,
                                               intermediate_size=768, image_size=112, patch_size=16), "pixels"),
    "convnext-tiny": ("ConvNextConfig", "ConvNextModel", dict(depths=[3, 3, 9, 3], hidden_sizes=[96, 192, 384, 768]),
                      "pixels"),
    "convnext-mini": ("ConvNextConfig", "ConvNextModel", dict(depths=[1, 1, 3, 1], hidden_sizes=[32, 64, 128, 256]),
                      "pixels"),
    "resnet-50": ("ResNetConfig", "ResNetModel", dict(depths=[3, 4, 6, 3], hidden_sizes=[256, 512, 1024, 2048],
                                                      layer_type="bottleneck"), "pixels"),
    "efficientnet-b0": ("EfficientNetConfig", "EfficientNetModel", dict(width_coefficient=1.0, depth_coefficient=1.0,
                                                                        image_size=224, hidden_dim=1280), "pixels"),
    # speech
    "wav2vec2-base": ("Wav2Vec2Config", "Wav2Vec2Model", dict(hidden_size=768, num_hidden_layers=12,
                                                              num_attention_heads=12, intermediate_size=3072), "audio"),
    "wav2vec2-mini": ("Wav2Vec2Config", "Wav2Vec2Model", dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                                              intermediate_size=1024,
                                                              conv_dim=(128,) * 7, num_conv_pos_embeddings=64), "audio"),
    # CLIP's towers (ViT-B/32's)
    "clip-text-b32": ("CLIPTextConfig", "CLIPTextModel", dict(hidden_size=512, num_hidden_layers=12, num_attention_heads=8,
                                                              intermediate_size=2048, vocab_size=49408,
                                                              max_position_embeddings=77), "tokens"),
    "clip-text-mini": ("CLIPTextConfig", "CLIPTextModel", dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                                               intermediate_size=1024, vocab_size=49408,
                                                               max_position_embeddings=77), "tokens"),
    "clip-vision-b32": ("CLIPVisionConfig", "CLIPVisionModel", dict(hidden_size=768, num_hidden_layers=12,
                                                                    num_attention_heads=12, intermediate_size=3072,
                                                                    image_size=224, patch_size=32), "pixels"),
    "clip-vision-mini": ("CLIPVisionConfig", "CLIPVisionModel", dict(hidden_size=256, num_hidden_layers=4,
                                                                     num_attention_heads=4, intermediate_size=1024,
                                                                     image_size=112, patch_size=16), "pixels"),
    # OPT as a whole-sequence forward (logits, no cache). Its decode step with transformers' static-cache
    # export recipe does not export here (torch 2.13, transformers 5.23): OPT derives its positions from
    # the cache's seen length (past_key_values.get_seq_length(), a tensor read), and torch.export stops at
    # "Could not guard on data-dependent expression u2 > 1" in sdpa_attention_forward.
    "opt-125m": ("OPTConfig", "OPTForCausalLM", dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                                     ffn_dim=3072, vocab_size=50272, word_embed_proj_dim=768), "tokens"),
    # OPT-350m: embeddings projected 512 -> 1024 and back, layer norm after attention and MLP
    "opt-350m": ("OPTConfig", "OPTForCausalLM", dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                                     ffn_dim=4096, vocab_size=50272, word_embed_proj_dim=512,
                                                     do_layer_norm_before=False), "tokens"),
    "opt-mini": ("OPTConfig", "OPTForCausalLM", dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                                     ffn_dim=1024, vocab_size=4096, word_embed_proj_dim=256), "tokens"),
    # state-space LM (transformers' torch path: a sequential scan over the tokens, unrolled by export)
    "mamba-130m": ("MambaConfig", "MambaForCausalLM", dict(hidden_size=768, num_hidden_layers=24, state_size=16,
                                                           expand=2, vocab_size=50280), "tokens"),
    "mamba-370m": ("MambaConfig", "MambaForCausalLM", dict(hidden_size=1024, num_hidden_layers=48, state_size=16,
                                                           expand=2, vocab_size=50280), "tokens"),
    "mamba-mini": ("MambaConfig", "MambaForCausalLM", dict(hidden_size=256, num_hidden_layers=4, state_size=16,
                                                           expand=2, vocab_size=4096), "tokens"),
}
_DEPTH_KEY = {"T5Config": "num_layers", "ConvNextConfig": None, "ResNetConfig": None, "EfficientNetConfig": None}


class FirstTensor(nn.Module):
    """A transformers model called on one input, returning its ``key`` output (a plain tensor)."""

    def __init__(self, model: nn.Module, key: str, **call_kwargs):
        super().__init__()
        self.model, self.key, self.call_kwargs = model, key, call_kwargs

    def forward(self, x):
        return getattr(self.model(x, **self.call_kwargs), self.key)


def perturb_all_norms(model: nn.Module) -> nn.Module:
    """Non-trivial affine parameters in every norm (transformers' own classes too: T5LayerNorm,
    ConvNextLayerNorm), and random BatchNorm statistics: from_config leaves them at 1 and 0."""
    with torch.no_grad():
        for m in model.modules():
            if "Norm" not in type(m).__name__:
                continue
            w, b = getattr(m, "weight", None), getattr(m, "bias", None)
            if isinstance(w, torch.Tensor) and w.dim() == 1:
                w.uniform_(0.5, 1.5)
            if isinstance(b, torch.Tensor) and b.dim() == 1:
                b.uniform_(-0.2, 0.2)
            if isinstance(getattr(m, "running_var", None), torch.Tensor):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    return model


def narrow(cls: str, kw: dict) -> dict:
    """The same architecture at hidden 64, 4 heads, vocabulary 512 (convnets: narrow stages of one
    block; EfficientNet-B0 as it is): what ``workloads.small_params`` builds to check a builder."""
    kw = dict(kw)
    if cls == "T5Config":
        kw.update(d_model=64, d_ff=128, d_kv=16, num_heads=4, vocab_size=512)
    elif cls == "ConvNextConfig":
        kw.update(depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 64, 128])
    elif cls == "ResNetConfig":
        kw.update(depths=[1, 1, 1, 1], hidden_sizes=[32, 64, 128, 256], embedding_size=16)
    elif cls == "MambaConfig":
        kw.update(hidden_size=64, vocab_size=512)
    elif cls == "OPTConfig":
        projected = kw["word_embed_proj_dim"] != kw["hidden_size"]
        kw.update(hidden_size=64, num_attention_heads=4, ffn_dim=128, vocab_size=512,
                  word_embed_proj_dim=32 if projected else 64)
    elif cls != "EfficientNetConfig":
        kw.update(hidden_size=64, num_attention_heads=4, intermediate_size=128)
        if "vocab_size" in kw:
            kw["vocab_size"] = 512
        if cls == "CLIPTextConfig":   # its bos and eos ids (49406, 49407) inside the small vocabulary
            kw.update(bos_token_id=510, eos_token_id=511)
        if cls == "Wav2Vec2Config":
            kw.update(conv_dim=(32,) * 7, num_conv_pos_embeddings=16)
    return kw


def hf_config(shape: str, layers: int | None = None, narrowed: bool = False):
    import transformers
    cls, _, kw, _ = ENCODER_SHAPES[shape]
    kw = narrow(cls, kw) if narrowed else dict(kw)
    if layers is not None:
        key = _DEPTH_KEY.get(cls, "num_hidden_layers")
        if key is None:
            raise ValueError(f"{shape}: its depth is a list of stages; give a shape of its own, not 'layers'")
        kw[key] = layers
    return getattr(transformers, cls)(**kw)


def encoder_inputs(shape: str, p: dict, config, g: torch.Generator) -> torch.Tensor:
    kind = ENCODER_SHAPES[shape][3]
    b = p["batch"]
    if kind == "tokens":
        # ids >= 3 (no pad, bos or eos: CLIP's text tower pools at the first eos id)
        return torch.randint(3, config.vocab_size, (b, p["tokens"]), generator=g)
    if kind == "pixels":
        return torch.randn(b, 3, p["res"], p["res"], generator=g)
    return torch.randn(b, p["samples"], generator=g)


def hf_encoder(p: dict, device: torch.device, dtype: torch.dtype):
    """One forward of a transformers encoder / backbone / LM over a whole input (no cache)."""
    import transformers
    from .workloads import Workload, _gen
    shape = p["shape"]
    _, model_cls, _, kind = ENCODER_SHAPES[shape]
    config = hf_config(shape, p.get("layers"), p.get("narrow", False))
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config)
    perturb_all_norms(model)
    if model_cls in ("MambaForCausalLM", "OPTForCausalLM"):
        wrapped = FirstTensor(model, "logits", use_cache=False)
    elif model_cls in ("ResNetModel", "ConvNextModel", "EfficientNetModel"):
        wrapped = FirstTensor(model, "pooler_output")      # the backbones' pooled features
    else:
        wrapped = FirstTensor(model, "last_hidden_state")
    wrapped = wrapped.eval().to(device=device, dtype=dtype)
    g = _gen()
    steps = []
    for _ in range(2):
        x = encoder_inputs(shape, p, config, g)
        steps.append(((x.to(device, dtype) if x.is_floating_point() else x.to(device),), {}))
    what = {"tokens": f"{p.get('tokens')} tokens", "pixels": f"images 3x{p.get('res')}x{p.get('res')}",
            "audio": f"{p.get('samples')} audio samples"}[kind]
    return Workload(wrapped, steps, description=f"{shape} ({model_cls}, {_depth(config)} layers, random weights), "
                                                f"batch {p['batch']}, {what}")


def _depth(config) -> str:
    if type(config).__name__ == "EfficientNetConfig":
        return f"width x{config.width_coefficient}, depth x{config.depth_coefficient},"
    depths = getattr(config, "depths", None)
    if depths:
        return "+".join(map(str, depths))
    for key in ("num_hidden_layers", "num_layers"):
        if isinstance(getattr(config, key, None), int):
            return str(getattr(config, key))
    return "?"


def mobilenet_v3(p: dict, device: torch.device, dtype: torch.dtype):
    from .workloads import Workload, _gen
    torch.manual_seed(0)
    model = models.MobileNetV3(p["arch"]).eval().to(device=device, dtype=dtype)
    g, r, b = _gen(), p["res"], p["batch"]
    steps = [((torch.randn(b, 3, r, r, generator=g).to(device, dtype),), {}) for _ in range(2)]
    return Workload(model, steps, description=f"MobileNetV3-{p['arch'].capitalize()} (torchvision's layout), "
                                              f"images {b}x3x{r}x{r}")
