"""``export_causal_lm``: a transformers causal LM, as it comes, to one Program with two entry points.

The root graph is ``decode(ids [B, 1], pos [1])``; the method ``prefill(ids [B, T], pos [1])`` (T from 2
to the cache length, one symbolic size) is a second graph over the same weights and the same state: the
static KV cache that transformers' own export recipe (``TorchExportableModuleWithStaticCache``) builds
and registers as buffers, which ostinato turns into program state. ``pos`` is the position of the
first token; both return the logits of the last token only, ``[B, 1, vocab]`` (the LM head runs on
one row per sequence, as ``logits_to_keep=1`` asks of the model).
"""
from __future__ import annotations

import contextlib
import logging
import re
from typing import Any

import torch
from torch import nn

from ..errors import ExportError, OstinatoError, UnsupportedOpError, first_line
from ..program import Program

log = logging.getLogger("ostinato")

INSTALL = "pip install 'transformers>=4.50,<6'"
# Families whose greedy generation is checked token for token against transformers (tests/llm/).
TESTED_FAMILIES = ("llama", "qwen2", "mistral", "gemma", "gemma2", "phi3", "gpt2", "opt")


def require_transformers():
    try:
        import transformers
    except ImportError as e:
        raise OstinatoError(f"ostinato.llm needs transformers, which is not installed: {INSTALL}") from e
    return transformers


class CausalLMStep(nn.Module):
    """``(ids [B, T], pos [1]) -> logits [B, 1, V]``: one step of the model over its static cache.

    Written after transformers' ``TorchExportableModuleWithStaticCache.forward``, which it wraps for the
    cache (made and registered as buffers there), adding the position arithmetic (positions
    ``pos .. pos+T-1``) and ``logits_to_keep=1``."""

    def __init__(self, cached: nn.Module, max_cache_len: int, full_mask: bool = False):
        super().__init__()
        self.lm = cached
        self.max_cache_len = max_cache_len
        # An all-ones padding mask over the whole cache instead of none: older transformers (5.17's OPT)
        # size a missing mask by the cache's fill level, a data-dependent size torch.export refuses.
        self.full_mask = full_mask

    def forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cache = self.lm.static_cache
        positions = pos + torch.arange(ids.shape[1], dtype=pos.dtype, device=pos.device)
        for layer in cache.layers:   # the recipe's reset: the cache's fill level is the first position
            layer.cumulative_length.copy_(positions[0])
        # Positions given explicitly: some families (OPT) derive them from the cache's fill level, which
        # a static cache can only count from its data (a data-dependent size torch.export refuses).
        mask = torch.ones(ids.shape[0], self.max_cache_len, dtype=torch.long, device=ids.device) \
            if self.full_mask else None
        out = self.lm.model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True,
                            cache_position=positions, position_ids=positions[None].expand(ids.shape[0], -1),
                            logits_to_keep=1)
        return out.logits


@contextlib.contextmanager
def _static_cache_config(model: nn.Module):
    """The model's configs set for a static cache while the recipe wraps it, restored after."""
    gen, cfg = model.generation_config, model.config
    saved = (gen.use_cache, gen.cache_implementation, cfg.use_cache)
    gen.use_cache, gen.cache_implementation, cfg.use_cache = True, "static", True
    try:
        yield
    finally:
        gen.use_cache, gen.cache_implementation, cfg.use_cache = saved


def _family(model: nn.Module) -> str:
    cfg = getattr(model, "config", None)
    return f"{getattr(cfg, 'model_type', '?')} ({type(model).__name__})"


_SITE = re.compile(r'File "([^"]+)", line (\d+), in (\w+)')


def blocking_site(e: BaseException) -> str:
    """Where an export failure points: the op ostinato lacks, or the innermost model source line the
    tracer names (transformers' modeling files before torch's own)."""
    if isinstance(e, UnsupportedOpError):
        return first_line(e)
    seen, texts = set(), []
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        texts.append(str(e))
        e = e.__cause__ or e.__context__
    sites = [m for t in texts for m in _SITE.finditer(t)]
    model_sites = [m for m in sites if "/transformers/" in m.group(1)] or sites
    if model_sites:
        f, line, fn = model_sites[-1].groups()
        return f"{fn}() at {f.split('site-packages/')[-1]}:{line}: {first_line(_innermost(texts))}"
    return first_line(_innermost(texts))


def _innermost(texts: list[str]) -> Any:
    return texts[-1] if texts else "unknown error"


def _eos_ids(model: nn.Module) -> list[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(x) for x in (eos if isinstance(eos, (list, tuple)) else [eos])]


def _first_set(*values):
    for v in values:
        if v is not None:
            return int(v[0] if isinstance(v, (list, tuple)) else v)
    return None


def export_causal_lm(model: nn.Module, max_cache_len: int, batch: int = 1, dtype: torch.dtype | None = None,
                     dynamic_prefill: bool = True) -> Program:
    """Export a transformers causal LM (``AutoModelForCausalLM``: default config, ``use_cache`` on) to
    one Program: ``decode(ids [batch, 1], pos [1])`` is its graph, ``prefill(ids [batch, T], pos [1])``
    its method ``"prefill"`` (T from 2 to ``max_cache_len`` with ``dynamic_prefill``); both share the
    weights and a static KV cache of ``max_cache_len`` positions (program state, owned by sessions).
    ``pos`` is the first token's position; both return the last token's logits ``[batch, 1, vocab]``.

    ``dtype`` casts the model first (in place, as ``model.to(dtype)`` does). Without
    ``dynamic_prefill`` there is no prefill graph and ``generate`` runs the prompt through decode, one
    token per step. A model that cannot be exported raises ExportError naming its family and what
    blocks it (the op ostinato lacks, or the model's source line torch.export stopped at).
    """
    require_transformers()
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache
    from ..frontend import export

    family = _family(model)
    if not hasattr(model, "generation_config") or not hasattr(model, "get_output_embeddings") \
            or model.get_output_embeddings() is None:
        raise ExportError(f"export_causal_lm takes a transformers causal LM (AutoModelForCausalLM); "
                          f"{family} has no LM head")
    if max_cache_len < 1 or batch < 1:
        raise OstinatoError(f"export_causal_lm: max_cache_len ({max_cache_len}) and batch ({batch}) must be >= 1")
    limit = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
    if limit is not None and max_cache_len > limit:
        raise OstinatoError(f"export_causal_lm: max_cache_len {max_cache_len} exceeds {family}'s "
                            f"max_position_embeddings ({limit}); pass max_cache_len <= {limit}")
    if dtype is not None:
        model.to(dtype)
    model.eval()
    device = next(model.parameters()).device
    try:
        with _static_cache_config(model):
            cached = TorchExportableModuleWithStaticCache(model, batch_size=batch, max_cache_len=max_cache_len,
                                                          device=device)
    except Exception as e:  # noqa: BLE001 - the recipe asserts and raises several types
        raise ExportError(f"{family}: transformers' static-cache recipe refuses the model: "
                          f"{type(e).__name__}: {first_line(e)}") from e
    step = CausalLMStep(cached, max_cache_len).eval()
    pos = torch.zeros(1, dtype=torch.long, device=device)
    vocab = model.get_output_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)

    def ids(t: int) -> torch.Tensor:
        return torch.randint(0, vocab, (batch, t), generator=gen).to(device)

    def traced(args: tuple, dynamic_shapes) -> Program:
        # Traced with SDPA's math kernel: the graph torch.export records depends on the layout of the
        # attention kernel it saw (a CUDA fp32 kernel's output lets ``.reshape`` become a bare view, which
        # other kernels' outputs do not allow); math's is the layout every backend can reproduce.
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel([SDPBackend.MATH]):
            return export(step, args, dynamic_shapes=dynamic_shapes, trace_strict=True)

    def run_export(what: str, args: tuple, dynamic_shapes=None) -> Program:
        try:
            return traced(args, dynamic_shapes)
        except OstinatoError as e:
            if step.full_mask or "data-dependent" not in str(e.__cause__ or e):
                raise ExportError(f"{family}: the {what} graph cannot be exported: {blocking_site(e)}") from e
            first = e
        log.info("%s: %s export with no attention mask failed on a data-dependent size; retrying with an "
                 "all-ones mask over the cache", family, what)
        step.full_mask = True
        try:
            return traced(args, dynamic_shapes)
        except OstinatoError as e:
            raise ExportError(f"{family}: the {what} graph cannot be exported: {blocking_site(first)} (and with "
                              f"an all-ones attention mask: {blocking_site(e)})") from e

    decode = run_export("decode", (ids(1), pos))
    cache_names = sorted(n for n in decode.state_init if n.startswith(("lm.key_cache", "lm.value_cache")))
    if not cache_names:
        raise ExportError(f"{family}: the exported decode step holds no KV cache as state "
                          f"(state: {sorted(decode.state_init)[:6]})")
    if dynamic_prefill and max_cache_len >= 2:
        t = torch.export.Dim("prompt", min=2, max=max_cache_len)
        prefill = run_export("prefill", (ids(min(max_cache_len, 5)), pos), ({1: t}, None))
        if set(prefill.state_init) != set(decode.state_init):
            raise ExportError(f"{family}: prefill and decode disagree on the state: "
                              f"{sorted(set(prefill.state_init) ^ set(decode.state_init))[:6]}")
        for name, w in prefill.weights.items():
            have = decode.weights.setdefault(name, w)
            if have is not w and not (have.shape == w.shape and torch.equal(have, w)):
                raise ExportError(f"{family}: prefill and decode hold different tensors named {name!r}")
        prefill.weights, prefill.state_init = decode.weights, decode.state_init
        decode.methods["prefill"] = prefill
    cfg = model.config
    decode.info["llm"] = {
        "family": getattr(cfg, "model_type", ""), "model": type(model).__name__, "batch": batch,
        "max_cache_len": max_cache_len, "vocab_size": int(vocab), "dtype": str(model.dtype).replace("torch.", ""),
        "eos_token_ids": _eos_ids(model),
        "pad_token_id": _first_set(getattr(model.generation_config, "pad_token_id", None),
                                   getattr(cfg, "pad_token_id", None)),
        "methods": {"decode": "ids [batch, 1], pos [1] -> logits [batch, 1, vocab]",
                    **({"prefill": "ids [batch, T], pos [1] -> logits [batch, 1, vocab]"}
                       if "prefill" in decode.methods else {})},
    }
    decode.info["model"] = type(model).__name__
    log.info("exported %s for generation: decode %d nodes%s, %d cache buffers of %d positions", family,
             decode.num_nodes, f", prefill {decode.methods['prefill'].num_nodes} nodes"
             if "prefill" in decode.methods else "", len(cache_names), max_cache_len)
    return decode
