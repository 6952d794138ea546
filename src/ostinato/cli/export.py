"""Export a model to a .ost program file.

MODULE:FACTORY names a function (or class) that takes no arguments and returns a model alone, or
(model, args) or (model, args, kwargs) with example inputs. The current directory is importable:
from the repository's root, examples.tiny_decoder:tiny_llama_4_layers works as is. A model
returned alone needs --example-inputs; a factory's own example args are replaced by --example-inputs
when it is given (its kwargs are kept).
"""
from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import os
import re
import sys

import torch

from .. import passes as ost_passes
from ..errors import ExportError, OstinatoError, UnsupportedOpError, first_line
from ..frontend import export
from .factory import SPEC_HELP, call_factory, example_inputs
from .progress import Stages

HELP = "export MODULE:FACTORY to a .ost program file"

DYNAMIC_HELP = (
    "make a size dynamic: ARG.DIM=MIN:MAX[:NAME], ARG being an example input's position (0, 1, ...) or "
    "a keyword argument's name and DIM the dimension; MAX may be left empty for no upper bound. Dims "
    "given the same NAME are one torch.export.Dim (sizes that must stay equal). Repeatable: "
    "--dynamic 0.0=1:64:batch --dynamic 1.0=1:64:batch")

PIPELINES = {"default": ost_passes.DEFAULT_PIPELINE, "generic": ost_passes.GENERIC_PIPELINE, "none": []}

_DYNAMIC_RE = re.compile(r"^(?P<arg>\d+|[A-Za-z_]\w*)\.(?P<dim>\d+)=(?P<min>\d+):(?P<max>\d*)"
                         r"(?::(?P<name>[A-Za-z_]\w*))?$")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("factory", metavar="MODULE:FACTORY", help="e.g. examples.tiny_decoder:tiny_llama")
    p.add_argument("-o", "--output", help="program file to write (default: FACTORY.ost)")
    p.add_argument("--example-inputs", metavar="SPEC", help="random example inputs: " + SPEC_HELP)
    p.add_argument("--dynamic", metavar="ARG.DIM=MIN:MAX[:NAME]", action="append", default=[],
                   help=DYNAMIC_HELP)
    p.add_argument("--passes", choices=sorted(PIPELINES), default="default",
                   help="graph passes: default (with the fused patterns), generic (without them) or none")
    p.add_argument("--trace-strict", action="store_true",
                   help="trace with torch.export's strict mode (TorchDynamo), which some models need")
    p.add_argument("--strict", action="store_true",
                   help="refuse ops ostinato does not support instead of running them with eager torch")
    p.add_argument("--seed", type=int, default=0, help="seed of the random --example-inputs (default 0)")
    p.add_argument("--device", metavar="DEVICE",
                   help="move the model and its example inputs to DEVICE (e.g. cuda) before tracing; the "
                        "default passes are those for where the example inputs are (a small matrix-vector "
                        "product becomes a fusible sum only for an accelerator). Default: where the factory "
                        "put them (--example-inputs are made on the CPU)")
    p.add_argument("--no-regional", action="store_true",
                   help="trace every block (regional export traces each kind of repeated block once)")
    p.add_argument("--no-cache", action="store_true",
                   help="do not read or write the export cache (the graph of an earlier export of the same "
                        "code, structure and input specs; see `ostinato cache explain --export`)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress display (it shows only on a terminal)")


def _bad_dynamic(text: str, why: str, fix: str) -> OstinatoError:
    return OstinatoError(f"--dynamic {text}: {why}\nFix: {fix}")


def dynamic_shapes(texts: list[str], model: torch.nn.Module, args: tuple, kwargs: dict):
    """torch.export ``dynamic_shapes`` from ``--dynamic`` texts (None when there are none)."""
    if not texts:
        return None
    dims: dict[str, tuple[torch.export.Dim, int, int | None]] = {}
    per_input: dict[int | str, dict[int, torch.export.Dim]] = {}
    for text in texts:
        m = _DYNAMIC_RE.match(text.strip())
        if m is None:
            raise _bad_dynamic(text, "not ARG.DIM=MIN:MAX[:NAME]", "e.g. --dynamic 0.1=1:64 (input 0, dim 1, "
                               "sizes 1 to 64) or --dynamic 0.0=1:8:batch")
        arg = int(m["arg"]) if m["arg"].isdigit() else m["arg"]
        dim, lo, hi = int(m["dim"]), int(m["min"]), int(m["max"]) if m["max"] else None
        if isinstance(arg, int):
            if arg >= len(args):
                raise _bad_dynamic(text, f"there are {len(args)} example args (0 to {len(args) - 1})",
                                   "use an input's position in the example args")
            x = args[arg]
        else:
            if arg not in kwargs:
                raise _bad_dynamic(text, f"no keyword argument {arg!r} in the example inputs "
                                   f"(keywords: {', '.join(kwargs) or 'none'})", "use an input's position or keyword")
            x = kwargs[arg]
        if not isinstance(x, torch.Tensor):
            raise _bad_dynamic(text, f"input {arg} is a {type(x).__name__}, not a tensor",
                               "only tensor sizes can be dynamic")
        if dim >= x.dim():
            raise _bad_dynamic(text, f"input {arg} has {x.dim()} dims (shape {list(x.shape)})",
                               f"use a dim from 0 to {x.dim() - 1}")
        if hi is not None and hi < lo:
            raise _bad_dynamic(text, f"MIN {lo} is above MAX {hi}", "give MIN <= MAX")
        size = x.shape[dim]
        if size < lo or (hi is not None and size > hi):
            raise _bad_dynamic(text, f"the example size of input {arg} dim {dim} is {size}, outside the range",
                               "widen the range or change the example inputs")
        name = m["name"] or (f"arg{arg}_dim{dim}" if isinstance(arg, int) else f"{arg}_dim{dim}")
        if name in dims:
            d, lo0, hi0 = dims[name]
            if (lo0, hi0) != (lo, hi):
                raise _bad_dynamic(text, f"{name} was given another range before ({lo0}:{'' if hi0 is None else hi0})",
                                   "give every use of a NAME the same MIN:MAX")
        else:
            d = torch.export.Dim(name, min=lo, max=hi) if hi is not None else torch.export.Dim(name, min=lo)
            dims[name] = (d, lo, hi)
        per_input.setdefault(arg, {})[dim] = d
    if not kwargs and all(isinstance(k, int) for k in per_input):
        return tuple(per_input.get(i) for i in range(len(args)))
    # Keywords involved: torch.export wants a dict keyed by forward's parameter names.
    bound = inspect.signature(model.forward).bind(*args, **kwargs).arguments
    names = list(bound)
    return {n: per_input.get(i, per_input.get(n)) for i, n in enumerate(names)}


def _cli_wording(e: ExportError, args: argparse.Namespace) -> ExportError:
    """The same failure, with a fix in command-line flags instead of export()'s keywords."""
    if isinstance(e, UnsupportedOpError):
        if not args.strict:
            return e
        return UnsupportedOpError(e.ops, "Fix: rewrite those lines with supported ops, register a "
                                  "decomposition for the op, or drop --strict to run such ops through "
                                  "eager torch between ostinato's plans")
    if e.__cause__ is None or isinstance(e.__cause__, OstinatoError):
        return e
    first = str(e).strip().splitlines()[0]
    return ExportError(f"{first}\nFix: make forward() traceable (no data-dependent Python control flow); "
                       "mark sizes that vary with --dynamic; or retry "
                       f"{'without' if args.trace_strict else 'with'} --trace-strict "
                       "(--verbose shows torch's error)")


def _on_device(name: str, model: torch.nn.Module, ex_args: tuple, ex_kwargs):
    """The model and its example inputs moved to device ``name`` (--device)."""
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise OstinatoError(f"--device {name}: not a device torch knows ({first_line(e)})\n"
                            "Fix: pass cpu, cuda or cuda:N") from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise OstinatoError(f"--device {name}: this machine has no CUDA device torch can use\n"
                            "Fix: export on a machine with the GPU, or leave --device out (a program "
                            "exported on the CPU compiles for CUDA too, without the accelerator-only passes)")
    move = lambda x: x.to(device) if isinstance(x, torch.Tensor) else x  # noqa: E731
    return (model.to(device), torch.utils._pytree.tree_map(move, ex_args),
            None if ex_kwargs is None else torch.utils._pytree.tree_map(move, ex_kwargs))


def _pipeline(name: str, ex_args, ex_kwargs) -> list:
    """The named pipeline; "default" as ``export`` picks it for where the example tensors are."""
    return ost_passes.default_pipeline((ex_args, ex_kwargs)) if name == "default" else PIPELINES[name]


def _tracked(pipeline, stages: Stages) -> list:
    """The pipeline with each pass reporting to ``stages``; the first pass ends torch.export's stage."""
    out = []
    for i, (name, fn) in enumerate(pipeline):
        def run_pass(graph, _fn=fn, _i=i, _name=name):
            if _i == 0:
                stages.begin("passes", total=len(pipeline))
            graph = _fn(graph)
            stages.advance(_name)
            return graph
        out.append((name, run_pass))
    return out


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def run(args: argparse.Namespace) -> int:
    fn_name = args.factory.partition(":")[2]
    output = args.output or f"{fn_name}.ost"
    with Stages(enabled=not args.quiet and sys.stderr.isatty()) as stages:
        stages.begin("build model")
        built = call_factory(args.factory)
        if args.example_inputs is not None:
            ex_args = example_inputs(args.example_inputs, seed=args.seed)
        elif built.args is not None:
            ex_args = built.args
        else:
            raise ExportError(f"{args.factory} returned a model without example inputs\n"
                              "Fix: pass --example-inputs SPEC (e.g. \"2x16:float32\"), or return "
                              "(model, args) from the factory")
        model, ex_kwargs = built.model.eval(), built.kwargs
        if args.device is not None:
            model, ex_args, ex_kwargs = _on_device(args.device, model, ex_args, ex_kwargs)
        dyn = dynamic_shapes(args.dynamic, model, ex_args, ex_kwargs)
        stages.begin("trace (torch.export)")
        # torch.export prints a failed trace's partial graph to stderr, which would bury the one-line
        # error: held back, and passed on only if the export succeeds (or with --verbose, as it comes).
        held = io.StringIO()
        try:
            with contextlib.redirect_stderr(sys.stderr if args.verbose else held):
                prog = export(model, ex_args, ex_kwargs, dynamic_shapes=dyn,
                              passes=_tracked(_pipeline(args.passes, ex_args, ex_kwargs), stages),
                              trace_strict=args.trace_strict, strict=args.strict,
                              regional=not args.no_regional, cache=not args.no_cache)
        except ExportError as e:
            better = _cli_wording(e, args)
            if better is e:
                raise
            raise better from e
        sys.stderr.write(held.getvalue())
        if prog.export_report.get("cache", {}).get("hit"):
            stages.begin("passes: none, the export cache held the graph")
        stages.begin("save")
        prog.save(output)
    exported = prog.info["passes"][0]["nodes"] if prog.info.get("passes") else prog.num_nodes
    t = prog.timings
    head = (f"wrote {output}: {prog.info.get('model', 'model')}, {prog.num_nodes} nodes (torch.export gave "
            f"{exported}), {_mib(os.path.getsize(output))}; ")
    save = f"save {stages.seconds.get('save', 0):.2f} s"
    if prog.export_report.get("cache", {}).get("hit"):
        sys.stdout.write(f"{head}export cache hit {t.get('cache', 0):.2f} s (weights mapped, no trace), {save}\n")
        return 0
    sys.stdout.write(f"{head}trace {t.get('torch_export', 0):.2f} s{_regional_note(prog)}, "
                     f"passes {t.get('passes', 0):.2f} s, {save}\n")
    return 0


def _regional_note(prog) -> str:
    """`` (regional: LlamaDecoderLayer x16 traced once)``, and each fallback's reason."""
    r = prog.export_report.get("regional") or {}
    kinds = [f"{k['class'].rsplit('.', 1)[-1]} x{k['calls']} traced {k['traced']}x" for k in r.get("kinds", [])]
    parts = ([f"regional: {', '.join(kinds)}"] if kinds else []) + \
        [f"traced inline: {why}" for why in r.get("fallbacks", []) if why != "regional=False"]
    return f" ({'; '.join(parts)})" if parts else ""
