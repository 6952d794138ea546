"""``MODULE:FACTORY`` on the command line, and the example inputs a factory may leave out.

The factory is a function (or class) taking no arguments that returns a model alone, ``(model, args)``
or ``(model, args, kwargs)``: the model and example inputs to export it with. The current directory
is importable, as with ``python -m``. Example inputs given on the command line are a SPEC such as
``2x16:float32,1:int64`` (see ``parse_input_spec``).
"""
from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ExportError, OstinatoError, first_line

FIX = ("Fix: FACTORY must be a function taking no arguments that returns a model, (model, args) or "
       "(model, args, kwargs), e.g. examples.tiny_decoder:tiny_llama")

# Random integers of example inputs are drawn from [0, INT_HIGH): small enough to index any embedding
# table, KV cache or position buffer a model is likely to hold, so token ids and positions just work.
INT_HIGH = 8

SPEC_HELP = (
    "comma-separated tensors, each SIZES[:DTYPE]: SIZES is x-separated (2x16), empty for a 0-d "
    "tensor; DTYPE is a torch dtype name (float32, float16, bfloat16, int64, int32, bool, ...), "
    f"float32 by default. Floats are standard normal, integers uniform in [0, {INT_HIGH}), bools fair "
    "coins. Example: \"2x16:float32,1:int64\"")


@dataclass
class FactoryResult:
    model: torch.nn.Module
    args: tuple | None          # None when the factory returned the model alone
    kwargs: dict


def is_factory_spec(text: str) -> bool:
    """``pkg.mod:fn`` (and not a path that happens to hold a colon, like ``C:\\model.ost``)."""
    mod, sep, fn = text.partition(":")
    return bool(sep) and fn.isidentifier() and all(p.isidentifier() for p in mod.split("."))


def call_factory(spec: str) -> FactoryResult:
    """Import ``MODULE``, call ``FACTORY()``; the result's ``args`` is None if it gave a model alone."""
    if not is_factory_spec(spec):
        raise ExportError(f"{spec!r} is not MODULE:FACTORY (a dotted module, a colon, a function name)\n{FIX}")
    mod_name, _, fn_name = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise ExportError(f"cannot import {mod_name} (from {spec}): {e}\n"
                          "Fix: run from the directory that holds the module (the current directory "
                          "is importable), or install its package") from e
    except Exception as e:  # a module that fails while importing: the user's code, any exception
        raise ExportError(f"importing {mod_name} raised {type(e).__name__}: {first_line(e)}\n"
                          "Fix: fix the module (run with --verbose for the traceback)") from e
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise ExportError(f"{mod_name} has no function {fn_name}\n{FIX}")
    try:
        built: Any = fn()
    except Exception as e:
        raise ExportError(f"{spec}() raised {type(e).__name__}: {first_line(e)}\n"
                          "Fix: FACTORY must run with no arguments (run with --verbose for the traceback)") from e
    if isinstance(built, torch.nn.Module):
        return FactoryResult(built, None, {})
    if not isinstance(built, tuple) or len(built) not in (2, 3) or not isinstance(built[0], torch.nn.Module):
        raise ExportError(f"{spec} returned {type(built).__name__}, not (model, args[, kwargs]) "
                          f"or a model alone\n{FIX}")
    args = built[1] if isinstance(built[1], tuple) else (built[1],)
    kwargs = built[2] if len(built) == 3 else {}
    return FactoryResult(built[0], args, dict(kwargs or {}))


def load_factory(spec: str) -> tuple[torch.nn.Module, tuple, dict]:
    """``(model, args, kwargs)`` from a factory that must give example inputs itself."""
    r = call_factory(spec)
    if r.args is None:
        raise ExportError(f"{spec} returned a model without example inputs\n"
                          "Fix: return (model, args) from the factory (or, with `ostinato export`, "
                          "pass --example-inputs)")
    return r.model, r.args, r.kwargs


def _dtype(name: str, item: str) -> torch.dtype:
    dt = getattr(torch, name.strip(), None)
    if not isinstance(dt, torch.dtype):
        raise OstinatoError(f"--example-inputs: unknown dtype {name!r} in {item!r}\n"
                            "Fix: use a torch dtype name: float32, float16, bfloat16, int64, int32, bool, ...")
    return dt


def parse_input_spec(spec: str) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """``"2x16:float32,1:int64"`` → ``[((2, 16), float32), ((1,), int64)]``."""
    out = []
    for item in spec.split(","):
        sizes, _, dtype = item.strip().partition(":")
        dt = _dtype(dtype, item) if dtype.strip() else torch.float32
        sizes = sizes.strip()
        try:
            shape = tuple(int(s) for s in sizes.split("x")) if sizes else ()
        except ValueError:
            shape = None
        if shape is None or any(s < 0 for s in shape):
            raise OstinatoError(f"--example-inputs: bad sizes {sizes!r} in {item.strip()!r}\n"
                                "Fix: sizes are non-negative integers joined by x, e.g. "
                                "--example-inputs \"2x16:float32,1:int64\"")
        out.append((shape, dt))
    return out


def random_tensor(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator,
                  device: str | torch.device = "cpu") -> torch.Tensor:
    """Random values of ``dtype`` (see SPEC_HELP for the ranges), made on the CPU then moved."""
    if dtype == torch.bool:
        t = torch.randint(0, 2, shape, generator=generator).bool()
    elif dtype.is_floating_point or dtype.is_complex:
        t = torch.randn(shape, generator=generator).to(dtype)
    else:
        t = torch.randint(0, INT_HIGH, shape, generator=generator).to(dtype)
    return t.to(device)


def example_inputs(spec: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(random_tensor(shape, dt, gen) for shape, dt in parse_input_spec(spec))
