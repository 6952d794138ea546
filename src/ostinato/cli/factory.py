"""``MODULE:FACTORY`` on the command line: import a module and call a function that builds a model.

The factory returns ``(model, args)`` or ``(model, args, kwargs)``: the model and example inputs to
export it with. The current directory is importable, as with ``python -m``.
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import torch

from ..errors import ExportError

FIX = ("Fix: FACTORY must be a function taking no arguments that returns (model, args) or "
       "(model, args, kwargs), e.g. examples.tiny_decoder:tiny_llama")


def is_factory_spec(text: str) -> bool:
    """``pkg.mod:fn`` (and not a path that happens to hold a colon, like ``C:\\model.ost``)."""
    mod, sep, fn = text.partition(":")
    return bool(sep) and fn.isidentifier() and all(p.isidentifier() for p in mod.split("."))


def load_factory(spec: str) -> tuple[torch.nn.Module, tuple, dict]:
    mod_name, _, fn_name = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise ExportError(f"cannot import {mod_name} (from {spec}): {e}\n{FIX}") from e
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise ExportError(f"{mod_name} has no function {fn_name}\n{FIX}")
    built: Any = fn()
    if not isinstance(built, tuple) or len(built) not in (2, 3) or not isinstance(built[0], torch.nn.Module):
        raise ExportError(f"{spec} returned {type(built).__name__}, not (model, args[, kwargs])\n{FIX}")
    model, args = built[0], built[1]
    kwargs = built[2] if len(built) == 3 else {}
    return model, args if isinstance(args, tuple) else (args,), dict(kwargs or {})
