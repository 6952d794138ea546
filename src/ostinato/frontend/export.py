"""``ostinato.export``: nn.Module → torch.export → core ATen → verified ostinato Program."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import os
import time
from typing import Any, Callable, Sequence

import torch
from torch.utils import _pytree as pytree

from .. import __version__
from ..errors import ExportError, OstinatoError, first_line
from ..ir import SymDim, TensorMeta, verify
from ..ir.fallback import fallback_nodes
from ..passes import DEFAULT_PIPELINE, default_pipeline, run_passes
from ..program import Program
from . import export_cache
from . import regional as regional_mod
from .convert import convert
from ..passes.dce import eliminate_dead_code
from .inline import canonical_order

log = logging.getLogger("ostinato")

# Composite ops kept whole through decomposition: passes pattern-match them and backends run each as
# one library call or fused kernel. Everything else decomposes to torch.export's core ATen set.
KEEP_WHOLE = (
    "scaled_dot_product_attention.default",
    "linear.default",
    "layer_norm.default",
    "rms_norm.default",
    "silu.default",
    "hardswish.default",
    "repeat_interleave.self_int",
    # weight norm (Wav2Vec2's positional conv): its decomposition rounds g / |v| to the dtype before the
    # product, where the kernel rounds once (1 bf16 ulp on a quarter of the weight: 0.03 on Wav2Vec2's
    # output); whole, it runs once, on constants, when compile folds them
    "_weight_norm_interface.default",
)


@functools.lru_cache(maxsize=1)
def decomposition_table() -> dict:
    """torch.export's core-ATen decompositions minus KEEP_WHOLE, plus ``repeat`` as one copy of an
    expanded view (_repeat; built once: it takes ~0.1 s). The code generator makes that copy a generated
    kernel (codegen/schedule.py's strided copies) where torch's repeat runs its generic copy kernel
    (DeBERTa's relative position keys, repeated over the batch)."""
    table = torch.export.default_decompositions()
    for name in KEEP_WHOLE:
        base, overload = name.split(".")
        op = getattr(getattr(torch.ops.aten, base), overload)
        if op in table:
            del table[op]
    table[torch.ops.aten.repeat.default] = _repeat
    return table


def _repeat(x: torch.Tensor, repeats) -> torch.Tensor:
    """``x.repeat(*repeats)`` as views around one copy: x viewed as [1, d0, 1, d1, ...], expanded to
    [r0, d0, r1, d1, ...], copied (dense in that order), viewed as [r0 * d0, r1 * d1, ...]. torch's own
    decomposition expands to [r0, r1, ..., d0, d1, ...] and permutes, a second copy where the permute
    moves sizes above 1."""
    repeats = list(repeats)
    shape = [1] * (len(repeats) - x.dim()) + list(x.shape)
    interleaved = [s for d in shape for s in (1, d)]
    expanded = [s for r, d in zip(repeats, shape) for s in (r, d)]
    tiled = x.reshape(interleaved).expand(expanded).clone(memory_format=torch.contiguous_format)
    return tiled.view([r * d for r, d in zip(repeats, shape)])


_TORCH_STATE = frozenset({"_parameters", "_buffers", "_modules"})


@contextlib.contextmanager
def python_state_kept(model: torch.nn.Module):
    """Every module's Python attributes as they were before, after a trace: a forward that caches a
    value in a plain dict, list or set of its module (timm's LeViT keeps its attention biases per device
    in ``attention_bias_cache``) stored a traced tensor there, a FunctionalTensor, and the user's model
    failed on its next eager call. Attributes rebound are put back, added ones removed, and dicts, lists
    and sets refilled with what they held (in place: other references to them see it too). Parameters,
    buffers and submodules are torch's to restore."""
    saved = []
    for m in model.modules():
        d = m.__dict__
        saved.append((m, dict(d), {k: (v.copy() if type(v) in (dict, set) else list(v))
                                   for k, v in d.items() if type(v) in (dict, list, set) and k not in _TORCH_STATE}))
    try:
        yield
    finally:
        for m, attrs, contents in saved:
            d = m.__dict__
            for k in [k for k in d if k not in attrs and k not in _TORCH_STATE]:
                del d[k]
            for k, v in attrs.items():
                if k not in _TORCH_STATE and d.get(k) is not v:
                    d[k] = v
            for k, old in contents.items():
                v = attrs[k]
                if type(v) is list:
                    v[:] = old
                else:
                    v.clear()
                    v.update(old)


def export(model: torch.nn.Module, args: tuple, kwargs: dict | None = None,
           dynamic_shapes: Any = None, *, strict: bool = False,
           trace_strict: bool = False,
           passes: Sequence[tuple[str, Callable]] | None = None,
           regional: bool = True, cache: bool = True) -> Program:
    """Trace ``model`` with torch.export and return an ostinato Program.

    ``args``/``kwargs`` are example inputs; ``dynamic_shapes`` takes torch.export's ``Dim`` specs and
    makes those sizes symbolic. Ops ostinato has no kernel for (a ``torch.library`` custom op, an ATen
    op outside its table) run through eager torch between ostinato's plans, with one warning per export
    (``ostinato inspect`` lists them); ``strict=True`` refuses them instead. ``trace_strict`` is
    torch.export's ``strict`` (TorchDynamo tracing).
    ``passes`` replaces the default graph pipeline (``ostinato.passes.default_pipeline``: all of
    ``DEFAULT_PIPELINE`` for example tensors on an accelerator, without the rewrites only fused kernels
    profit from for CPU ones); ``[]`` keeps the graph exactly as torch.export gave it.
    ``regional`` traces each kind of repeated block (a decoder's layers) once and instantiates it per
    layer (``frontend/regional.py``), so export time does not grow with depth; a kind whose instances
    cannot be shown interchangeable is traced inline, and the program's ``export_report`` says why.
    ``cache`` reuses the graph of an earlier export of the same code, structure, input specs, options
    and versions (``frontend/export_cache.py``), mapping this model's weights: a new checkpoint of the
    same architecture is not traced again. ``export_report["cache"]`` says whether it hit, and why not.
    Raises ExportError when the model cannot be traced and UnsupportedOpError listing every op that
    cannot run (with ``strict``: every op ostinato lacks), with the model's source line of each.
    """
    if not isinstance(model, torch.nn.Module):
        raise ExportError(f"ostinato.export takes a torch.nn.Module, got {type(model).__name__}; "
                          "wrap a function in an nn.Module whose forward calls it")
    if not isinstance(args, tuple):
        args = (args,)
    kwargs = dict(kwargs or {})
    name = type(model).__name__
    passes = _resolve_passes(passes, args, kwargs)
    t0 = time.perf_counter()
    key, cache_report = None, {"hit": False}
    if cache:
        key, cache_report = _cache_key(model, args, kwargs, dynamic_shapes, strict, trace_strict, passes)
        if key is not None:
            hit = export_cache.lookup(key, model)
            if hit is not None:
                seconds = time.perf_counter() - t0
                hit.timings = {"torch_export": 0.0, "passes": 0.0, "cache": seconds, "total": seconds}
                hit.export_report = {"cache": {"hit": True, "key": key.digest}}
                _warn_fallbacks(name, hit.graph)
                log.info("exported %s from the export cache (%s): %d nodes in %.2fs", name, key.digest[:12],
                         hit.num_nodes, seconds)
                return hit
            cache_report["why"] = export_cache.explain(key)
            log.log(_report_level(), "%s: export cache %s", name, cache_report["why"])
    ep = regions = None
    report = regional_mod.Report(fallbacks=["regional=False"] if not regional else
                                 ["trace_strict: TorchDynamo traces the whole model"] if trace_strict else [])
    if regional and not trace_strict:
        with torch.no_grad(), python_state_kept(model):
            ep, regions, report = regional_mod.trace(model, args, kwargs, dynamic_shapes, decomposition_table(),
                                                     convert, strict)
        for why in report.fallbacks:
            log.log(_report_level(), "%s: regional export: %s", name, why)
    try:
        with torch.no_grad(), python_state_kept(model):
            if ep is None:
                report.traces += 1
                ep = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes,
                                         strict=trace_strict)
                ep = ep.run_decompositions(decomposition_table())
    except OstinatoError:
        raise
    except Exception as e:  # torch raises many types here; the user needs one with a hint
        raise ExportError(
            f"torch.export could not trace {name}: {type(e).__name__}: {first_line(e)}\n"
            "Fix: make forward() traceable (no data-dependent Python control flow, no unsupported "
            "Python objects); for sizes that vary, pass dynamic_shapes with torch.export.Dim; "
            f"or try trace_strict={not trace_strict}, which some models need (transformers' static "
            "caches want trace_strict=True). "
            "The original error is chained below (raise ... from).") from e
    t_export = time.perf_counter() - t0
    graph, weights, state_init, slots = convert(ep, strict=strict, regions=regions)
    if regions is not None or len(passes) > 0:
        # Before values are numbered: a block's outputs its caller ignores (a regional trace has those
        # nodes, a full one does not) and nodes torch.export leaves unused (a full trace has those, a
        # regional one may not) would otherwise shift the numbering of one program against the other.
        eliminate_dead_code(graph)
    canonical_order(graph, model)
    weights = {v.name: weights[v.name] for v in graph.constants if v.name in weights} | weights
    state_init = {v.name: state_init[v.name] for v in graph.state if v.name in state_init} | state_init
    hints = _size_hints(graph, slots, args, kwargs)
    if dynamic_shapes is not None:
        _label_symbols(model, graph, slots, args, kwargs, dynamic_shapes)
    # With regions, each block's shapes were re-derived once when it was converted (inline.Block).
    verify(graph, check_shapes=regions is None, hints=hints)
    exported_nodes = len(graph.nodes)
    graph, pass_report = run_passes(graph, passes)
    graph.assign_slots()
    _warn_fallbacks(name, graph)
    # Node counts are saved (the file says how it was optimized); seconds are not: the same model
    # exported twice must give the same bytes.
    info = {"model": name, "ostinato": __version__, "torch": torch.__version__,
            "passes": [{"pass": "export", "nodes": exported_nodes}]
            + [{"pass": r.name, "nodes": r.nodes} for r in pass_report]}
    guards = size_guards(ep, graph.symbols) if graph.symbols else []
    if guards:
        info["guards"] = guards
    timings = {"torch_export": t_export, "passes": sum(r.seconds for r in pass_report),
               "total": time.perf_counter() - t0,
               **{f"pass.{r.name}": r.seconds for r in pass_report}}
    log.info("exported %s: %d nodes in %.2fs", name, len(graph.nodes), timings["total"])
    prog = Program(graph, weights, state_init, ep.call_spec.in_spec, ep.call_spec.out_spec, slots,
                   hints, info, timings)
    if key is not None:
        why_not = export_cache.store(key, prog, model)
        if why_not:
            cache_report["stored"] = False
            cache_report["why"] = why_not
            log.log(_report_level(), "%s: export not cached: %s", name, why_not)
    prog.export_report = {"regional": report.as_dict(), "cache": cache_report}
    return prog


def export_cache_key(model: torch.nn.Module, args: tuple, kwargs: dict | None = None, dynamic_shapes: Any = None,
                     strict: bool = False, trace_strict: bool = False,
                     passes: Sequence[tuple[str, Callable]] | None = None):
    """The export cache key ``export`` would use with these arguments, or (None, why it is not cached);
    for ``ostinato cache explain --export``."""
    key, report = _cache_key(model, args, dict(kwargs or {}), dynamic_shapes, strict, trace_strict, passes)
    return key, report.get("why", "")


def _resolve_passes(passes, args: tuple, kwargs: dict) -> Sequence[tuple[str, Callable]]:
    """``passes``, or the default pipeline for the devices of the example tensors (passes/manager.py)."""
    return passes if passes is not None else default_pipeline((args, kwargs))


def _cache_key(model, args, kwargs, dynamic_shapes, strict, trace_strict, passes):
    """The export cache key, or None and why (the report the program carries)."""
    from ..passes import GENERIC_PIPELINE
    known = {n for n, _ in DEFAULT_PIPELINE} | {n for n, _ in GENERIC_PIPELINE}
    names = [n for n, _ in _resolve_passes(passes, args, kwargs)]
    if any(n not in known for n in names):
        return None, {"hit": False, "why": "custom passes: not cached"}
    options = {"strict": strict, "trace_strict": trace_strict, "passes": names}
    if "fold_norms" in names:       # (its switches change what it makes of one graph)
        from ..passes.fold_norms import fold_key
        options["fold_norms"] = fold_key()
    try:
        key = export_cache.export_key(model, args, kwargs, dynamic_shapes, options)
    except export_cache.Uncacheable as e:
        log.log(_report_level(), "%s: export not cached: %s", type(model).__name__, e)
        return None, {"hit": False, "why": str(e)}
    return key, {"hit": False, "key": key.digest}


def _report_level() -> int:
    """Regional export's fallbacks are logged with the passes' report: visible with OSTINATO_LOG_PASSES=1."""
    return logging.WARNING if os.environ.get("OSTINATO_LOG_PASSES") == "1" else logging.INFO


def _warn_fallbacks(model_name: str, graph) -> None:
    rows = fallback_nodes(graph)
    if not rows:
        return
    ops = sorted({op[len("fallback."):] for op, _, _, _ in rows})
    sites = "; ".join(f"{op[len('fallback.'):]} at {src or name}" for op, name, src, _ in rows[:8])
    more = f" (and {len(rows) - 8} more)" if len(rows) > 8 else ""
    log.warning("%s: %d node(s) run through eager torch, no ostinato kernel for %s: %s%s. Replay "
                "captures the regions between them; export with strict=True to refuse such ops instead",
                model_name, len(rows), ", ".join(ops), sites, more)


_RELATIONS = {"Equality": "==", "Unequality": "!=", "LessThan": "<=", "StrictLessThan": "<",
              "GreaterThan": ">=", "StrictGreaterThan": ">"}


def size_guards(ep, symbols: dict) -> list[list[str]]:
    """The conditions on the inputs' size symbols that torch.export assumed beyond their ranges (a branch
    on ``x.shape[1] % 4 == 0`` takes one side for every size it accepts), as ``[relation, lhs, rhs]``
    over the program's symbols, for the input checker. torch's own exported program checks these on
    every call; a plan built on one side of such a branch computes wrong results for sizes on the other.
    A condition ostinato cannot read (a boolean combination, a size not an input's) is logged."""
    import sympy

    from ..ir import SymDim
    from ..ir.types import parse_expr
    env = next((n.meta["val"].fake_mode.shape_env for n in ep.graph.nodes if n.op == "placeholder"
                and isinstance(n.meta.get("val"), torch.Tensor) and getattr(n.meta["val"], "fake_mode", None)
                and n.meta["val"].fake_mode.shape_env is not None), None)
    if env is None:
        return []
    out, seen = [], set()
    for g in env.guards:
        try:
            expr = env.simplify(g.expr)
        except Exception:  # noqa: BLE001 - a guard torch cannot simplify is read as recorded
            expr = g.expr
        if expr is True or expr == sympy.true:
            continue
        rel = _RELATIONS.get(type(expr).__name__)
        names = {str(s) for s in getattr(expr, "free_symbols", ())}
        if rel is None or not names or not names <= set(symbols):
            log.info("export: torch.export assumed %s, which ostinato does not check on a call", expr)
            continue
        try:
            guard = [rel, str(SymDim(expr.lhs)), str(SymDim(expr.rhs))]
            for side in guard[1:]:
                parse_expr(side)    # what a program file may hold (Swin's padded sizes grow past it)
        except ValueError:
            log.warning("export: torch.export assumed %s of the input sizes, too long an expression for "
                        "ostinato to record: sizes breaking it are not refused", str(expr)[:200])
            continue
        if _implied_by_ranges(guard, symbols) or _zero_one(guard, symbols) or tuple(guard) in seen:
            continue
        seen.add(tuple(guard))
        out.append(guard)
    return out


def _zero_one(guard: list[str], symbols: dict) -> bool:
    """A size symbol assumed not 0 or 1 (``s0 != 1``, ``s0 >= 2``): torch traces as if sizes were not 0
    or 1 but its exported program does not require it (nor check it), and the graph holds for them."""
    rel, lhs, rhs = guard
    return lhs in symbols and (rel, rhs) in {("!=", "0"), ("!=", "1"), (">=", "1"), (">=", "2"), (">", "0"),
                                             (">", "1")}


def _implied_by_ranges(guard: list[str], symbols: dict) -> bool:
    """A bound of one symbol that its range already holds (``s0 >= 2``, ``s0 <= 64``)."""
    rel, lhs, rhs = guard
    r = symbols.get(lhs)
    if r is None or not rhs.lstrip("-").isdigit():
        return False
    v = int(rhs)
    return (rel == ">=" and r.min >= v) or (rel == ">" and r.min > v) or \
        (rel == "<=" and r.max is not None and r.max <= v) or (rel == "<" and r.max is not None and r.max < v) or \
        (rel == "!=" and (r.min > v or (r.max is not None and r.max < v)))


def _size_hints(graph, slots, args, kwargs) -> dict[str, int]:
    """Each size symbol's value in the example inputs (used to check shapes and in reports)."""
    leaves = pytree.tree_leaves((args, kwargs))
    hints: dict[str, int] = {}
    for slot, leaf in zip(slots, leaves):
        if slot.kind == "constant":
            continue
        v = graph.inputs[slot.index]
        if isinstance(v.meta, TensorMeta):
            for d, size in zip(v.meta.shape, leaf.shape):
                if isinstance(d, SymDim) and d.is_symbol:
                    hints[d.symbols[0]] = int(size)
        elif v.meta.expr is not None and v.meta.expr.is_symbol:
            hints[v.meta.expr.symbols[0]] = int(leaf)
    return hints


def _label_symbols(model, graph, slots, args, kwargs, dynamic_shapes) -> None:
    """Give each size symbol the name of the user's torch.export.Dim, for messages."""
    specs: dict[int, Any] = {}

    def walk(arg, spec):
        if isinstance(arg, torch.Tensor):
            specs[id(arg)] = spec
        elif isinstance(arg, (list, tuple)) and isinstance(spec, (list, tuple)):
            for a, s in zip(arg, spec):
                walk(a, s)
        elif isinstance(arg, dict) and isinstance(spec, dict):
            for k, a in arg.items():
                if k in spec:
                    walk(a, spec[k])

    if isinstance(dynamic_shapes, dict):
        try:
            bound = inspect.signature(model.forward).bind(*args, **kwargs).arguments
        except TypeError:
            return
        walk(dict(bound), dynamic_shapes)
    else:
        walk(tuple(args), tuple(dynamic_shapes))
    leaves = pytree.tree_leaves((args, kwargs))
    for slot, leaf in zip(slots, leaves):
        spec = specs.get(id(leaf))
        if slot.kind != "tensor" or spec is None:
            continue
        per_dim = spec.items() if isinstance(spec, dict) else enumerate(spec)
        meta = graph.inputs[slot.index].meta
        for i, dim in per_dim:
            d = meta.shape[i] if i < meta.rank else None
            label = getattr(dim, "__name__", "")
            if isinstance(d, SymDim) and d.is_symbol and label:
                name = d.symbols[0]
                graph.symbols[name] = dataclasses.replace(graph.symbols[name], label=label)
