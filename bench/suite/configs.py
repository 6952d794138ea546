"""The configuration matrix, as data: category, family, builder parameters, device, dtype and an
estimate of what the configuration costs to run, so ``--part K/N`` can split it into runs that each
fit 10 minutes and ``--quick`` fits 8.

Cost estimates (seconds) are ``build`` (model), ``export`` (ostinato.export), ``compile`` (one
torch.compile first call with empty caches) and ``step`` (one eager step). GPU figures come from the
H100 runs in docs/benchmarks (torch.compile's first call: 90 s for the 64-layer, 154 s for the
128-layer hidden-256 decoder; export 25 s for 64 layers) scaled by layer count, and from the H100 quick
run for the other families (reduce-overhead's first call: 20 s for the Llama-3.2-1B shape, 11 s for
DiT-B/2, 9 s for the hidden-4096 decoder); CPU figures from this project's 2-core machines. A run's
JSON records each configuration's real wall time: pass it back with ``--costs`` to split by measured
figures instead.
"""
from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field

CATEGORIES = ("dispatch-heavy", "small-llm", "diffusion", "gpu-bound", "speech-vision", "user-written")
RUNNERS = ("eager", "cuda_graph_eager", "torch_compile", "torch_compile_ro", "ostinato", "ostinato_replay",
           "ostinato_replay_unfused", "ostinato_replay_nolinear", "ostinato_replay_noattention",
           "ostinato_replay_nchw")
# Runners only run when --runners names them (diagnostics: generic fusion, matmul groups or merged decode
# attention off, convolutions left NCHW, for an A/B in one process).
OPTIONAL_RUNNERS = ("ostinato_replay_unfused", "ostinato_replay_nolinear", "ostinato_replay_noattention",
                    "ostinato_replay_nchw")
CUDA_ONLY_RUNNERS = ("cuda_graph_eager",)
PART_BUDGET_S = 540.0      # a part's estimate stays under this: 10-minute runs with start-up to spare
QUICK_BUDGET_S = 420.0     # --quick on one GPU: under 8 minutes with start-up to spare
# --quick measures time to first output (four fresh processes) for these only: they are the costly part.
# and runs torch.compile in reduce-overhead mode only (its default mode would double the compile time).
QUICK_RUNNERS = tuple(r for r in RUNNERS if r != "torch_compile" and r not in OPTIONAL_RUNNERS)
QUICK_STARTUP = ("gpu/tiny-decoder-h128-l32", "cpu/tiny-decoder-h128-l16")


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
                              ("conv-stack-b8-r64", {"ch": 64, "blocks": 4, "batch": 8, "res": 64}, (1, 5, 12, 0.01))):
        out.append(Config(f"gpu/{name}", "user-written", name.rsplit("-", 1)[0] if "conv" in name else "user-decoder",
                          "conv-stack" if "conv" in name else "user-decoder", params, "cuda", "bfloat16", _est(*est)))
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
    return out


MATRIX: tuple[Config, ...] = tuple(_gpu() + _cpu())


def by_name(name: str) -> Config:
    for c in MATRIX:
        if c.name == name:
            return c
    raise KeyError(f"no configuration {name!r} in the matrix")


def runners_for(config: Config, wanted: list[str] | None = None) -> list[str]:
    names = [r for r in RUNNERS if (r not in OPTIONAL_RUNNERS if wanted is None else r in wanted)]
    return [r for r in names if config.device == "cuda" or r not in CUDA_ONLY_RUNNERS]


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
    return total


def _matches(name: str, pattern: str) -> bool:
    """Whether ``name`` matches any comma-separated glob of ``pattern`` (a plain word as a substring)."""
    globs = [g if any(ch in g for ch in "*?[") else f"*{g}*" for g in pattern.split(",") if g]
    return any(fnmatch.fnmatch(name, g) for g in globs)


def wants_startup(config: Config, startup: bool, quick: bool, only: str | None = None) -> bool:
    """Whether the configuration's fresh-process figures are measured: with ``startup``, for the
    quick subset's QUICK_STARTUP under ``quick``, and for the configurations ``only`` matches."""
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
