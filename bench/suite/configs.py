"""The configuration matrix, as data: category, family, builder parameters, device, dtype and an
estimate of what the configuration costs to run, so ``--part K/N`` can split it into runs that each
fit 10 minutes and ``--quick`` fits 8.

Cost estimates (seconds) are ``build`` (model), ``export`` (ostinato.export), ``compile`` (one
torch.compile first call with empty caches) and ``step`` (one eager step). GPU figures come from the
H100 runs in docs/benchmarks (torch.compile's first call: 90 s for the 64-layer, 154 s for the
128-layer hidden-256 decoder; export 25 s for 64 layers) scaled by layer count, and from the H100 quick
run for the other families (reduce-overhead's first call: 20 s for the Llama-3.2-1B shape, 11 s for
DiT-B/2, 9 s for the hidden-4096 decoder); CPU figures from this project's 2-core machines. Optional
``aoti`` and ``lower`` override ``peer_seconds``'s guesses for AOTInductor's package and ExecuTorch's
lowering (about 1.3x torch.compile's first call; 1.5x the export; on this CPU BERT-mini took 16 s and
8 s, Mamba-mini 49 s and 50 s). A run's JSON records each configuration's real wall time: pass it back
with ``--costs`` to split by measured figures instead.
"""
from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field, replace

CATEGORIES = ("dispatch-heavy", "small-llm", "diffusion", "gpu-bound", "speech-vision", "user-written", "encoder",
              "vision", "state-space")
RUNNERS = ("eager", "cuda_graph_eager", "torch_compile", "torch_compile_ro", "ostinato", "ostinato_replay",
           "ostinato_replay_unfused", "ostinato_replay_nolinear", "ostinato_replay_noattention",
           "ostinato_replay_nchw", "aoti", "aoti_cuda_graph", "executorch_xnnpack", "ostinato_mlx",
           "ostinato_mlx_replay")
# Runners only run when --runners names them (diagnostics: generic fusion, matmul groups or merged decode
# attention off, convolutions left NCHW, for an A/B in one process).
OPTIONAL_RUNNERS = ("ostinato_replay_unfused", "ostinato_replay_nolinear", "ostinato_replay_noattention",
                    "ostinato_replay_nchw", "ostinato_mlx", "ostinato_mlx_replay")
CUDA_ONLY_RUNNERS = ("cuda_graph_eager", "aoti_cuda_graph")
# XNNPACK is ExecuTorch's CPU backend; MLX's executables take CPU tensors (on Linux MLX runs on the CPU).
CPU_ONLY_RUNNERS = ("executorch_xnnpack", "ostinato_mlx", "ostinato_mlx_replay")
PART_BUDGET_S = 540.0      # a part's estimate stays under this: 10-minute runs with start-up to spare
QUICK_BUDGET_S = 420.0     # --quick on one GPU: under 8 minutes with start-up to spare
# --quick measures time to first output (four fresh processes) for these only: they are the costly part.
# and runs torch.compile in reduce-overhead mode only (its default mode would double the compile time);
# it leaves AOTInductor out too (1-2 minutes of compile per model on a GPU would not fit 8 minutes).
QUICK_RUNNERS = tuple(r for r in RUNNERS if r not in ("torch_compile", "aoti", "aoti_cuda_graph")
                      and r not in OPTIONAL_RUNNERS)
QUICK_STARTUP = ("gpu/tiny-decoder-h128-l32", "cpu/tiny-decoder-h128-l16")
# One configuration per category and device whose fresh-process figures a run measures with
# ``--startup-configs representative`` (every runner's cold and warm start for each category, at a
# fraction of measuring them for the whole matrix).
STARTUP_REPRESENTATIVES = (
    "gpu/tiny-decoder-h128-l32", "gpu/llama-3.2-1b-decode", "gpu/dit-b2-r32", "gpu/llama-4096-decode-b1",
    "gpu/whisper-base-encoder", "gpu/user-decoder-ln-h512-l16", "gpu/bert-base-b1-s128", "gpu/resnet50-b1",
    "gpu/mamba-130m-b1-t32",
    "cpu/tiny-decoder-h128-l16", "cpu/llama-mini-decode", "cpu/dit-r16", "cpu/llama-1024-decode-b1",
    "cpu/whisper-tiny-encoder", "cpu/user-decoder-h128-l16", "cpu/bert-mini-b1-s64", "cpu/mobilenetv3-small-b1",
    "cpu/mamba-mini-b1-t32",
)


@dataclass(frozen=True)
class Config:
    name: str
    category: str
    family: str
    builder: str            # workloads.BUILDERS key
    params: dict
    device: str             # "cpu" | "cuda"
    dtype: str
    est: dict = field(default_factory=dict)   # build, export, compile, step (seconds)
    quick: bool = False

    def as_dict(self) -> dict:
        return {"name": self.name, "category": self.category, "family": self.family, "builder": self.builder,
                "params": self.params, "device": self.device, "dtype": self.dtype}


def _est(build: float, export: float, compile: float, step: float) -> dict:
    return {"build": build, "export": export, "compile": compile, "step": step}


def _hf_configs(device: str, dtype: str, dec: tuple, family: dict, one: tuple, extra: dict | None = None) -> list:
    """transformers models: ``dec`` (name, shape, params, est) decoder steps through the static-cache
    builder, ``family`` naming each shape's family; ``one`` (name, category, family, shape, params, est)
    single forwards. ``extra``: estimate keys added per family."""
    prefix = "gpu" if device == "cuda" else "cpu"
    out = [Config(f"{prefix}/{name}", "small-llm", family[shape], "hf-decoder", {"shape": shape, "batch": 1, **params},
                  device, dtype, _est(*est)) for name, shape, params, est in dec]
    out += [Config(f"{prefix}/{name}", cat, fam, "hf-encoder", {"shape": shape, **params}, device, dtype,
                   dict(_est(*est), **(extra or {}).get(fam, {}))) for name, cat, fam, shape, params, est in one]
    return out


def _gpu() -> list[Config]:
    out = []
    for hidden in (128, 256):
        for layers in (32, 64, 128):
            scale = layers / 64   # H100: compile 90 s at 64 layers/h128, 154 s at 128 layers/h256
            out.append(Config(f"gpu/tiny-decoder-h{hidden}-l{layers}", "dispatch-heavy", "tiny-decoder",
                              "tiny-decoder", {"hidden": hidden, "layers": layers}, "cuda", "bfloat16",
                              _est(2, 25 * scale, 90 * scale * (0.86 if hidden == 256 else 1.0), 0.06 * scale),
                              quick=(hidden, layers) == (128, 32)))
    for shape, layers in (("llama-3.2-1b", 16), ("qwen2.5-0.5b", 24), ("gemma-2b", 18)):
        for tokens in (1, 128):
            kind = "decode" if tokens == 1 else "prefill128"
            out.append(Config(f"gpu/{shape}-{kind}", "small-llm", shape, "hf-decoder",
                              {"shape": shape, "batch": 1, "tokens": tokens, "cache": 256}, "cuda", "bfloat16",
                              _est(8, 5 + layers / 2, 10 + 0.6 * layers, 0.03),
                              quick=(shape, tokens) == ("llama-3.2-1b", 1)))
    for res in (32, 64):
        out.append(Config(f"gpu/unet-r{res}", "diffusion", "unet", "unet", {"ch": 128, "res": res, "batch": 2},
                          "cuda", "bfloat16", _est(2, 6, 12, 0.01 * (res / 32) ** 2)))
        out.append(Config(f"gpu/dit-b2-r{res}", "diffusion", "dit", "dit",
                          {"dim": 768, "depth": 12, "heads": 12, "res": res, "batch": 2}, "cuda", "bfloat16",
                          _est(2, 6, 12, 0.01 * (res / 32) ** 2), quick=res == 32))
    for batch, tokens, cache in ((1, 1, 512), (32, 1, 512), (1, 2048, 2048)):
        kind = f"decode-b{batch}" if tokens == 1 else "prefill2048"
        out.append(Config(f"gpu/llama-4096-{kind}", "gpu-bound", "llama-4096", "hf-decoder",
                          {"shape": "llama-4096", "batch": batch, "tokens": tokens, "cache": cache}, "cuda",
                          "bfloat16", _est(10, 8, 10, 0.3 if tokens > 1 else 0.02), quick=kind == "decode-b32"))
    for dim, layers, heads, name in ((512, 6, 8, "base"), (768, 12, 12, "small")):
        out.append(Config(f"gpu/whisper-{name}-encoder", "speech-vision", "whisper-encoder", "whisper-encoder",
                          {"dim": dim, "layers": layers, "heads": heads, "positions": 1500, "batch": 1},
                          "cuda", "bfloat16", _est(3, 4 + layers / 2, 8 + layers, 0.02)))
    for batch in (1, 32):
        out.append(Config(f"gpu/resnet18-b{batch}", "speech-vision", "resnet", "resnet",
                          {"width": 64, "res": 224, "batch": batch}, "cuda", "bfloat16",
                          _est(2, 5, 10, 0.005 * batch ** 0.5)))
    # Written as users write them (bench/suite/user_models.py), never seen by the hand patterns: issue #15's probes.
    for name, params, est in (("user-decoder-h128-l64", {"dim": 128, "layers": 64, "style": "rms"}, (2, 25, 90, 0.06)),
                              ("user-decoder-h4096-l4", {"dim": 4096, "layers": 4, "style": "rms"}, (4, 6, 15, 0.02)),
                              ("user-decoder-ln-h512-l16", {"dim": 512, "layers": 16, "style": "ln"}, (2, 8, 25, 0.02)),
                              ("conv-stack-b8-r64", {"ch": 64, "blocks": 4, "batch": 8, "res": 64}, (1, 5, 12, 0.01)),
                              ("conv-stack-b1-r64", {"ch": 64, "blocks": 4, "batch": 1, "res": 64}, (1, 5, 12, 0.005))):
        out.append(Config(f"gpu/{name}", "user-written", "conv-stack" if "conv" in name else "user-decoder",
                          "conv-stack" if "conv" in name else "user-decoder", params, "cuda", "bfloat16", _est(*est)))
    return out + _gpu_families()


def _gpu_families() -> list[Config]:
    """Issue #16's families at real shapes (two sizes, or batch 1 and a larger batch, each). Estimates:
    the decoders by the formula of the small LLMs above (per layer); the single-forward encoders and
    vision backbones from the H100's Whisper and ResNet figures, by parameter count."""
    out = []
    dec = (  # name, shape, params, (build, export, compile, step)
        ("gemma2-2b-decode", "gemma2-2b", {"tokens": 1, "cache": 256}, (10, 18, 26, 0.03)),
        ("gemma2-2b-prefill128", "gemma2-2b", {"tokens": 128, "cache": 256}, (10, 18, 26, 0.05)),
        ("phi-3-mini-l16-decode", "phi-3-mini", {"layers": 16, "tokens": 1, "cache": 256}, (10, 13, 20, 0.03)),
        ("phi-3-mini-l16-prefill128", "phi-3-mini", {"layers": 16, "tokens": 128, "cache": 256}, (10, 13, 20, 0.05)),
        ("gpt2-decode", "gpt2", {"tokens": 1, "cache": 256}, (4, 11, 17, 0.02)),
        ("gpt2-medium-decode", "gpt2-medium", {"tokens": 1, "cache": 256}, (5, 17, 24, 0.03)),
        # past the 256-token window: the decode's mask slides; the prefill's 512 tokens are longer than it
        ("mistral-7b-l4-sw256-decode", "mistral-7b-sw256", {"layers": 4, "tokens": 1, "cache": 1024, "start": 512},
         (8, 7, 12, 0.02)),
        ("mistral-7b-l4-sw256-prefill512", "mistral-7b-sw256", {"layers": 4, "tokens": 512, "cache": 1024},
         (8, 7, 12, 0.05)),
    )
    family = {"gemma2-2b": "gemma2", "phi-3-mini": "phi-3", "gpt2": "gpt2", "gpt2-medium": "gpt2",
              "mistral-7b-sw256": "mistral-sw"}
    one = (  # name, category, family, shape, params, (build, export, compile, step)
        ("opt-125m-forward-s128", "small-llm", "opt", "opt-125m", {"batch": 1, "tokens": 128}, (4, 6, 14, 0.01)),
        ("opt-350m-forward-s128", "small-llm", "opt", "opt-350m", {"batch": 1, "tokens": 128}, (5, 10, 22, 0.02)),
        ("bert-base-b1-s128", "encoder", "bert", "bert-base", {"batch": 1, "tokens": 128}, (3, 6, 15, 0.01)),
        ("bert-base-b32-s128", "encoder", "bert", "bert-base", {"batch": 32, "tokens": 128}, (3, 6, 15, 0.03)),
        ("roberta-base-b1-s128", "encoder", "roberta", "roberta-base", {"batch": 1, "tokens": 128}, (3, 6, 15, 0.01)),
        ("roberta-base-b32-s128", "encoder", "roberta", "roberta-base", {"batch": 32, "tokens": 128}, (3, 6, 15, 0.03)),
        ("deberta-v3-base-b1-s128", "encoder", "deberta-v2", "deberta-v3-base", {"batch": 1, "tokens": 128},
         (4, 10, 25, 0.02)),
        ("deberta-v3-base-b32-s128", "encoder", "deberta-v2", "deberta-v3-base", {"batch": 32, "tokens": 128},
         (4, 10, 25, 0.06)),
        ("t5-base-encoder-b1-s128", "encoder", "t5-encoder", "t5-base-encoder", {"batch": 1, "tokens": 128},
         (3, 6, 15, 0.01)),
        ("t5-base-encoder-b32-s128", "encoder", "t5-encoder", "t5-base-encoder", {"batch": 32, "tokens": 128},
         (3, 6, 15, 0.03)),
        ("clip-text-b32-b1", "encoder", "clip-text", "clip-text-b32", {"batch": 1, "tokens": 77}, (3, 6, 15, 0.01)),
        ("clip-text-b32-b32", "encoder", "clip-text", "clip-text-b32", {"batch": 32, "tokens": 77}, (3, 6, 15, 0.02)),
        ("vit-b16-b1", "vision", "vit", "vit-b16", {"batch": 1, "res": 224}, (3, 6, 15, 0.01)),
        ("vit-b16-b32", "vision", "vit", "vit-b16", {"batch": 32, "res": 224}, (3, 6, 15, 0.05)),
        ("convnext-tiny-b1", "vision", "convnext", "convnext-tiny", {"batch": 1, "res": 224}, (3, 6, 15, 0.01)),
        ("convnext-tiny-b32", "vision", "convnext", "convnext-tiny", {"batch": 32, "res": 224}, (3, 6, 15, 0.04)),
        ("resnet50-b1", "vision", "resnet-50", "resnet-50", {"batch": 1, "res": 224}, (3, 7, 15, 0.01)),
        ("resnet50-b32", "vision", "resnet-50", "resnet-50", {"batch": 32, "res": 224}, (3, 7, 15, 0.03)),
        ("efficientnet-b0-b1", "vision", "efficientnet", "efficientnet-b0", {"batch": 1, "res": 224}, (3, 8, 20, 0.01)),
        ("efficientnet-b0-b32", "vision", "efficientnet", "efficientnet-b0", {"batch": 32, "res": 224},
         (3, 8, 20, 0.03)),
        ("clip-vision-b32-b1", "vision", "clip-vision", "clip-vision-b32", {"batch": 1, "res": 224}, (3, 6, 15, 0.01)),
        ("clip-vision-b32-b32", "vision", "clip-vision", "clip-vision-b32", {"batch": 32, "res": 224},
         (3, 6, 15, 0.03)),
        ("wav2vec2-base-b1-1s", "speech-vision", "wav2vec2", "wav2vec2-base", {"batch": 1, "samples": 16000},
         (3, 6, 15, 0.01)),
        ("wav2vec2-base-b8-1s", "speech-vision", "wav2vec2", "wav2vec2-base", {"batch": 8, "samples": 16000},
         (3, 6, 15, 0.03)),
        # the scan over 32 tokens is unrolled by export: ~13k nodes for 24 layers
        ("mamba-130m-b1-t32", "state-space", "mamba", "mamba-130m", {"batch": 1, "tokens": 32}, (4, 60, 120, 0.05)),
        ("mamba-130m-b8-t32", "state-space", "mamba", "mamba-130m", {"batch": 8, "tokens": 32}, (4, 60, 120, 0.06)),
    )
    out += _hf_configs("cuda", "bfloat16", dec, family, one)
    # Mamba runs in fp32: in bf16 its eager reference (transformers' sequential scan, no mamba_ssm) is
    # off its own fp32 logits by up to 14.8 (CPU; logits within +-13.8), so no runner can be checked
    # against it (H100: reduce-overhead's output 1.30 from it, ostinato's 0.52, tolerance 0.05).
    out = [replace(c, dtype="float32") if c.family == "mamba" else c for c in out]
    for arch, batch in (("large", 1), ("large", 32)):
        out.append(Config(f"gpu/mobilenetv3-{arch}-b{batch}", "vision", "mobilenetv3", "mobilenet-v3",
                          {"arch": arch, "batch": batch, "res": 224}, "cuda", "bfloat16",
                          _est(2, 6, 15, 0.01 if batch == 1 else 0.02)))
    return out


def _cpu() -> list[Config]:
    out = []
    for hidden in (128, 256):
        for layers in (16, 32):
            scale = layers / 64 * (1.3 if hidden == 256 else 1.0)
            out.append(Config(f"cpu/tiny-decoder-h{hidden}-l{layers}", "dispatch-heavy", "tiny-decoder",
                              "tiny-decoder", {"hidden": hidden, "layers": layers}, "cpu", "float32",
                              _est(0.5, 13 * scale, 60 * scale, 0.014 * scale),
                              quick=(hidden, layers) == (128, 16)))
    for shape, family in (("llama-mini", "llama-3.2-1b"), ("qwen-mini", "qwen2.5-0.5b"), ("gemma-mini", "gemma-2b")):
        for tokens in (1, 128):
            kind = "decode" if tokens == 1 else "prefill128"
            out.append(Config(f"cpu/{shape}-{kind}", "small-llm", family, "hf-decoder",
                              {"shape": shape, "batch": 1, "tokens": tokens, "cache": 256}, "cpu", "float32",
                              _est(1, 8, 30, 0.005 if tokens == 1 else 0.05),
                              quick=(shape, tokens) == ("llama-mini", 1)))
    for res in (16, 32):
        out.append(Config(f"cpu/unet-r{res}", "diffusion", "unet", "unet", {"ch": 64, "res": res, "batch": 1},
                          "cpu", "float32", _est(0.5, 6, 30, 0.01 * (res / 16) ** 2)))
        out.append(Config(f"cpu/dit-r{res}", "diffusion", "dit", "dit",
                          {"dim": 256, "depth": 6, "heads": 4, "res": res, "batch": 1}, "cpu", "float32",
                          _est(0.5, 6, 30, 0.005 * (res / 16) ** 2), quick=res == 16))
    for batch, tokens, cache in ((1, 1, 256), (8, 1, 256), (1, 256, 256)):
        kind = f"decode-b{batch}" if tokens == 1 else "prefill256"
        out.append(Config(f"cpu/llama-1024-{kind}", "gpu-bound", "llama-4096", "hf-decoder",
                          {"shape": "llama-1024", "batch": batch, "tokens": tokens, "cache": cache}, "cpu",
                          "float32", _est(1, 6, 25, 0.1 if tokens > 1 else 0.01)))
    out.append(Config("cpu/whisper-tiny-encoder", "speech-vision", "whisper-encoder", "whisper-encoder",
                      {"dim": 384, "layers": 4, "heads": 6, "positions": 250, "batch": 1}, "cpu", "float32",
                      _est(0.5, 6, 25, 0.03), quick=True))
    for batch in (1, 4):
        out.append(Config(f"cpu/resnet-w32-b{batch}", "speech-vision", "resnet", "resnet",
                          {"width": 32, "res": 112, "batch": batch}, "cpu", "float32",
                          _est(0.5, 5, 25, 0.01 * batch)))
    out.append(Config("cpu/user-decoder-h128-l16", "user-written", "user-decoder", "user-decoder",
                      {"dim": 128, "layers": 16, "style": "rms"}, "cpu", "float32", _est(0.5, 10, 40, 0.01)))
    out.append(Config("cpu/conv-stack-b1-r32", "user-written", "conv-stack", "conv-stack",
                      {"ch": 64, "blocks": 4, "batch": 1, "res": 32}, "cpu", "float32", _est(0.5, 5, 25, 0.01)))
    # second sizes of the families above that had one on the CPU
    out.append(Config("cpu/whisper-base-encoder", "speech-vision", "whisper-encoder", "whisper-encoder",
                      {"dim": 512, "layers": 6, "heads": 8, "positions": 250, "batch": 1}, "cpu", "float32",
                      _est(0.5, 8, 30, 0.06)))
    out.append(Config("cpu/user-decoder-ln-h256-l8", "user-written", "user-decoder", "user-decoder",
                      {"dim": 256, "layers": 8, "style": "ln"}, "cpu", "float32", _est(0.5, 6, 30, 0.008)))
    out.append(Config("cpu/conv-stack-b4-r32", "user-written", "conv-stack", "conv-stack",
                      {"ch": 64, "blocks": 4, "batch": 4, "res": 32}, "cpu", "float32", _est(0.5, 5, 25, 0.03)))
    return out + _cpu_families()


def _cpu_families() -> list[Config]:
    """The same families at sizes this CPU runs (two each). Estimates from single runs on this
    project's 2-core machines (eager and ostinato; torch.compile's first call like the minis above)."""
    out = []
    dec = (  # name, shape, params, (build, export, compile, step)
        ("gemma2-mini-decode", "gemma2-mini", {"tokens": 1, "cache": 128}, (1, 5, 30, 0.005)),
        ("gemma2-mini-prefill64", "gemma2-mini", {"tokens": 64, "cache": 128}, (1, 5, 30, 0.02)),
        ("phi3-tiny-decode", "phi3-tiny", {"tokens": 1, "cache": 128}, (1, 4, 25, 0.004)),
        ("phi3-tiny-prefill64", "phi3-tiny", {"tokens": 64, "cache": 128}, (1, 4, 25, 0.015)),
        ("gpt2-mini-decode", "gpt2-mini", {"tokens": 1, "cache": 128}, (1, 4, 25, 0.004)),
        ("gpt2-decode", "gpt2", {"tokens": 1, "cache": 128}, (3, 10, 40, 0.02)),
        # a 64-token window: the decode starts past it, the 128-token prefill is longer than it
        ("mistral-mini-sw64-decode", "mistral-mini-sw64", {"tokens": 1, "cache": 256, "start": 96}, (1, 4, 25, 0.005)),
        ("mistral-mini-sw64-prefill128", "mistral-mini-sw64", {"tokens": 128, "cache": 256}, (1, 4, 25, 0.03)),
    )
    family = {"gemma2-mini": "gemma2", "phi3-tiny": "phi-3", "gpt2-mini": "gpt2", "gpt2": "gpt2",
              "mistral-mini-sw64": "mistral-sw"}
    one = (  # name, category, family, shape, params, (build, export, compile, step)
        ("opt-mini-forward-s64", "small-llm", "opt", "opt-mini", {"batch": 1, "tokens": 64}, (1, 3, 20, 0.01)),
        ("opt-125m-forward-s32", "small-llm", "opt", "opt-125m", {"batch": 1, "tokens": 32}, (3, 6, 30, 0.04)),
        ("bert-mini-b1-s64", "encoder", "bert", "bert-mini", {"batch": 1, "tokens": 64}, (1, 3, 20, 0.005)),
        ("bert-base-b1-s64", "encoder", "bert", "bert-base", {"batch": 1, "tokens": 64}, (2, 6, 30, 0.04)),
        ("roberta-mini-b1-s64", "encoder", "roberta", "roberta-mini", {"batch": 1, "tokens": 64}, (1, 3, 20, 0.005)),
        ("roberta-mini-b4-s64", "encoder", "roberta", "roberta-mini", {"batch": 4, "tokens": 64}, (1, 3, 20, 0.015)),
        ("deberta-v3-mini-b1-s64", "encoder", "deberta-v2", "deberta-v3-mini", {"batch": 1, "tokens": 64},
         (1, 4, 30, 0.01)),
        ("deberta-v3-mini-b4-s64", "encoder", "deberta-v2", "deberta-v3-mini", {"batch": 4, "tokens": 64},
         (1, 4, 30, 0.03)),
        ("t5-small-encoder-b1-s64", "encoder", "t5-encoder", "t5-small-encoder", {"batch": 1, "tokens": 64},
         (1, 3, 20, 0.01)),
        ("t5-small-encoder-b4-s64", "encoder", "t5-encoder", "t5-small-encoder", {"batch": 4, "tokens": 64},
         (1, 3, 20, 0.04)),
        ("clip-text-mini-b1", "encoder", "clip-text", "clip-text-mini", {"batch": 1, "tokens": 77}, (1, 3, 20, 0.005)),
        ("clip-text-mini-b4", "encoder", "clip-text", "clip-text-mini", {"batch": 4, "tokens": 77}, (1, 3, 20, 0.02)),
        ("vit-mini-b1-r112", "vision", "vit", "vit-mini", {"batch": 1, "res": 112}, (1, 3, 20, 0.003)),
        ("vit-mini-b4-r112", "vision", "vit", "vit-mini", {"batch": 4, "res": 112}, (1, 3, 20, 0.01)),
        ("convnext-mini-b1-r112", "vision", "convnext", "convnext-mini", {"batch": 1, "res": 112}, (1, 3, 20, 0.005)),
        ("convnext-mini-b4-r112", "vision", "convnext", "convnext-mini", {"batch": 4, "res": 112}, (1, 3, 20, 0.02)),
        ("resnet50-b1-r112", "vision", "resnet-50", "resnet-50", {"batch": 1, "res": 112}, (2, 6, 35, 0.03)),
        ("resnet50-b4-r112", "vision", "resnet-50", "resnet-50", {"batch": 4, "res": 112}, (2, 6, 35, 0.1)),
        ("efficientnet-b0-b1-r112", "vision", "efficientnet", "efficientnet-b0", {"batch": 1, "res": 112},
         (1, 6, 35, 0.01)),
        ("efficientnet-b0-b4-r112", "vision", "efficientnet", "efficientnet-b0", {"batch": 4, "res": 112},
         (1, 6, 35, 0.04)),
        ("clip-vision-mini-b1-r112", "vision", "clip-vision", "clip-vision-mini", {"batch": 1, "res": 112},
         (1, 3, 20, 0.004)),
        ("clip-vision-mini-b4-r112", "vision", "clip-vision", "clip-vision-mini", {"batch": 4, "res": 112},
         (1, 3, 20, 0.015)),
        ("wav2vec2-mini-b1-0.5s", "speech-vision", "wav2vec2", "wav2vec2-mini", {"batch": 1, "samples": 8000},
         (1, 3, 20, 0.01)),
        ("wav2vec2-mini-b4-0.5s", "speech-vision", "wav2vec2", "wav2vec2-mini", {"batch": 4, "samples": 8000},
         (1, 3, 20, 0.04)),
        ("mamba-mini-b1-t32", "state-space", "mamba", "mamba-mini", {"batch": 1, "tokens": 32}, (1, 6, 40, 0.01)),
        ("mamba-mini-b4-t32", "state-space", "mamba", "mamba-mini", {"batch": 4, "tokens": 32}, (1, 6, 40, 0.015)),
    )
    # Mamba's unrolled scan: ExecuTorch's lowering took 50 s and AOTInductor's compile 49 s for 4 layers
    out += _hf_configs("cpu", "float32", dec, family, one, {"mamba": {"lower": 50.0, "aoti": 55.0}})
    for arch in ("small", "large"):
        out.append(Config(f"cpu/mobilenetv3-{arch}-b1", "vision", "mobilenetv3", "mobilenet-v3",
                          {"arch": arch, "batch": 1, "res": 224}, "cpu", "float32",
                          _est(0.5, 5, 30, 0.005 if arch == "small" else 0.012)))
    return out


MATRIX: tuple[Config, ...] = tuple(_gpu() + _cpu())


def by_name(name: str) -> Config:
    for c in MATRIX:
        if c.name == name:
            return c
    raise KeyError(f"no configuration {name!r} in the matrix")


def runners_for(config: Config, wanted: list[str] | None = None) -> list[str]:
    names = [r for r in RUNNERS if (r not in OPTIONAL_RUNNERS if wanted is None else r in wanted)]
    skip = CPU_ONLY_RUNNERS if config.device == "cuda" else CUDA_ONLY_RUNNERS
    return [r for r in names if r not in skip]


def peer_seconds(config: Config) -> dict[str, float]:
    """Estimated seconds to make the peers' files: AOTInductor's export + compile + package (``aoti``;
    H100: 117 s for the 64-layer tiny decoder on an H200, issue #16; about torch.compile's first call
    plus the weights written out) and ExecuTorch's export + lowering (``lower``; CPU only)."""
    e = config.est
    # On the GPU its cold process has a large fixed cost besides the model's compile: 105 and 136 s for
    # Phi-3 (16 layers) and Gemma-2B prefills on an H100 (docs/benchmarks/suite_gpu_full), ~25 s of
    # which is torch.compile's own first call.
    fixed = 95 if config.device == "cuda" else 0
    aoti = e.get("aoti", 1.3 * e["compile"] + 5 + e["build"] + fixed)
    return {"aoti": aoti, "lower": e.get("lower", 1.5 * e["export"] + 3)}


def estimate_seconds(config: Config, runners: list[str], startup: bool, measured: dict | None = None) -> float:
    """Seconds the configuration is expected to take: a measured wall time when ``measured`` has one,
    else the estimate. With startup, ostinato cold and warm and torch.compile cold and warm run in
    fresh processes (~5 s of imports each); torch.compile's cold process also times reduce-overhead's
    steps, so that runner is not compiled again in this process."""
    if measured and config.name in measured:
        return float(measured[config.name])
    e = config.est
    runners = runners_for(config, runners)
    timing = 8 * e["step"] + max(0.5, 10 * e["step"]) + 1          # checks and warm-ups, trials, set-up
    total = e["build"] + len(runners) * timing
    if any(r.startswith("ostinato") for r in runners):
        total += e["export"]
    tc = [r for r in runners if r.startswith("torch_compile")]
    total += e["compile"] * len([r for r in tc if not (startup and r == "torch_compile_ro")])
    if startup:
        total += 10 + e["build"] + e["export"]                         # ostinato cold (exports) and warm
        if tc:
            total += 10 + 2 * e["build"] + 1.15 * e["compile"] + timing  # torch.compile cold and warm
    # The peers make their file once, in their cold fresh process (always run: bench/suite/peers.py),
    # then load it in a warm one: the making, two processes' imports and the cold one's model build.
    peer = peer_seconds(config)
    if any(r in runners for r in ("aoti", "aoti_cuda_graph")):
        total += peer["aoti"] + 10 + e["build"]
    if "executorch_xnnpack" in runners:
        total += peer["lower"] + 12 + e["build"]
    return total


def _matches(name: str, pattern: str) -> bool:
    """Whether ``name`` matches any comma-separated glob of ``pattern`` (a plain word as a substring)."""
    globs = [g if any(ch in g for ch in "*?[") else f"*{g}*" for g in pattern.split(",") if g]
    return any(fnmatch.fnmatch(name, g) for g in globs)


def wants_startup(config: Config, startup: bool, quick: bool, only: str | None = None) -> bool:
    """Whether the configuration's fresh-process figures are measured: with ``startup``, for the
    quick subset's QUICK_STARTUP under ``quick``, and for the configurations ``only`` matches
    ("representative": STARTUP_REPRESENTATIVES, one per category)."""
    if only == "representative":
        return startup and config.name in STARTUP_REPRESENTATIVES
    if not startup or (only and not _matches(config.name, only)):
        return False
    return not quick or config.name in QUICK_STARTUP


def load_measured(paths: list[str]) -> dict[str, float]:
    """Configuration name -> wall seconds, from earlier runs' JSON (``--costs``)."""
    out: dict[str, float] = {}
    for path in paths:
        with open(path) as f:
            for rec in json.load(f)["configs"]:
                if rec.get("wall_s"):
                    out[rec["config"]["name"]] = rec["wall_s"]
    return out


def select(device: str | None = None, pattern: str | None = None, quick: bool = False) -> list[Config]:
    """Configurations of ``device`` (all when None) whose name matches any comma-separated glob of
    ``pattern`` (a plain word matches as a substring); ``quick`` keeps the representative subset."""
    out = [c for c in MATRIX if device is None or c.device == device]
    if quick:
        out = [c for c in out if c.quick]
    if pattern:
        out = [c for c in out if _matches(c.name, pattern)]
    return out


def split_parts(configs: list[Config], parts: int, cost) -> list[list[Config]]:
    """``parts`` groups covering ``configs`` exactly once, balanced by ``cost(config)``: longest first,
    each to the currently lightest part; within a part, matrix order. Deterministic."""
    if parts < 1:
        raise ValueError("the number of parts must be at least 1")
    loads, groups = [0.0] * parts, [[] for _ in range(parts)]
    for c in sorted(configs, key=lambda c: (-cost(c), c.name)):
        i = min(range(parts), key=lambda k: (loads[k], k))
        loads[i] += cost(c)
        groups[i].append(c)
    order = {c.name: i for i, c in enumerate(configs)}
    return [sorted(g, key=lambda c: order[c.name]) for g in groups]


def parts_needed(configs: list[Config], cost, budget: float = PART_BUDGET_S) -> int:
    """The fewest parts whose every estimate stays under ``budget`` (a configuration longer than the
    budget gets a part of its own)."""
    for n in range(1, len(configs) + 1):
        if all(sum(cost(c) for c in g) <= budget or len(g) == 1 for g in split_parts(configs, n, cost)):
            return n
    return max(1, len(configs))
