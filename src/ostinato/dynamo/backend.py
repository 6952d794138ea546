"""``torch.compile(model, backend="ostinato")``: Dynamo's graphs through ostinato.export and compile.

Registered through the ``torch_dynamo_backends`` entry point (pyproject.toml). Dynamo calls the
backend once per graph it captures (several per model at graph breaks, again when it recompiles);
each graph becomes an ostinato Program, lowered for the device of its inputs, replayed on CUDA by
default. A graph ostinato cannot export runs eagerly, with a warning naming the reason.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

import torch

from ..errors import OstinatoError
from . import stats
from ..errors import first_line
from .compiled_graph import CompiledGraph, EagerOnFailure, Settings

log = logging.getLogger("ostinato")

_MODES = {None: {}, "default": {}, "reduce-overhead": {"replay": True}}


def settings_from(options: dict | None, mode: str | None) -> Settings:
    """Settings from torch.compile's ``options`` and ``mode``; OstinatoError naming a bad key or mode."""
    if mode not in _MODES:
        raise OstinatoError(f"torch.compile(backend='ostinato') got mode={mode!r}; it takes "
                            f"{', '.join(repr(m) for m in _MODES if m)} (reduce-overhead turns replay on)")
    known = {f.name for f in dataclasses.fields(Settings)}
    options = dict(options or {})
    unknown = sorted(set(options) - known)
    if unknown:
        raise OstinatoError(f"torch.compile(backend='ostinato') got unknown option(s) {', '.join(unknown)}; "
                            f"it takes {', '.join(sorted(known))}")
    return Settings(**{**_MODES[mode], **options})


def _graph_name(gm: torch.fx.GraphModule) -> str:
    compile_id = gm.meta.get("dynamo_compile_id") if hasattr(gm, "meta") else None
    return f"graph {compile_id}" if compile_id is not None else f"graph {type(gm).__name__}"


def ostinato_backend(gm: torch.fx.GraphModule, example_inputs: list, *, options: dict | None = None,
                     mode: str | None = None) -> Callable[..., Any]:
    """Dynamo backend: returns a callable taking the graph's inputs and returning what ``gm`` returns.

    ``options`` (``torch.compile(..., options={...})``): ``replay`` (default: on for CUDA inputs),
    ``clone_outputs`` (default: when replaying), ``cache`` (ostinato's compile cache),
    ``eager_fallback`` (default True: a graph ostinato cannot export runs eagerly; False raises).
    """
    settings = settings_from(options, mode)
    name = _graph_name(gm)
    stats.count(graphs=1)
    try:
        compiled = CompiledGraph(gm, list(example_inputs), settings, name)
    except Exception as e:   # anything ostinato or torch.export raises: the user's model must still run
        if not settings.eager_fallback:
            raise
        reason = f"{type(e).__name__}: {first_line(e)}"
        log.warning("torch.compile backend: %s runs eagerly: ostinato could not take it (%s). Set "
                    "options={'eager_fallback': False} to see the full error", name, reason)
        stats.record_fallback(name, reason)
        stats.count(eager=1)
        eager = gm.forward

        def run_eagerly(*args):
            stats.count(eager_calls=1)
            return eager(*args)
        return run_eagerly
    stats.count(compiled=1)
    stats.record_graph(compiled)
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
        log.warning("torch.compile backend: %s: ostinato runs inference only; its outputs carry no "
                    "autograd history. Call the model under torch.no_grad() or torch.inference_mode()", name)
    log.info("torch.compile backend: %s on ostinato (%s, replay=%s)", name, compiled.device, compiled.replay)
    return EagerOnFailure(compiled, gm.forward, settings.eager_fallback)
