"""Load a .ost program, compile it for a device and call it: outputs' shapes and a timing table.

Inputs are random, built from the program's input specs (dtype, shape, and each dynamic size at
its export example), unless --inputs names a .safetensors file. Its tensors are keyed by the
program's input names (`ostinato inspect FILE` lists them) or by flat position ("0", "1", ...),
e.g. safetensors.torch.save_file({"tokens": t, "pos": p}, "in.safetensors"). Integer inputs
are drawn from a small range (see `ostinato export --help`), which suits token ids and positions.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .. import __version__
from . import write_json
from ..backends import get_backend, parse_mlx
from ..errors import BackendError, InputError, OstinatoError
from ..ir import SymDim, TensorMeta
from ..program import Program, load
from ..replay import compile
from .factory import random_tensor

HELP = "load a .ost program, run it and time it"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a .ost program file (from `ostinato export` or Program.save)")
    p.add_argument("--device", default="cpu",
                   help="cpu (default), cuda or cuda:N, or mlx (Apple GPUs; mlx:cpu / mlx:gpu pick MLX's device)")
    p.add_argument("--replay", action="store_true",
                   help="run the first call step by step, capture the plan on the second and replay it after "
                        "(compile(..., replay=True))")
    p.add_argument("--inputs", metavar="FILE.safetensors",
                   help="input tensors keyed by input name or flat position (default: random inputs)")
    p.add_argument("--steps", type=int, default=10, help="calls to make, the first one included (default 10)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--save-outputs", metavar="FILE.safetensors",
                   help="write the first call's tensor outputs, keyed by flat position (0, 1, ...)")
    p.add_argument("--no-verify", action="store_true", help="skip the sha256 and shape checks on load")
    p.add_argument("--no-cache", action="store_true", help="compile without the compile cache")
    p.add_argument("--json", action="store_true", help="print one JSON object (for machines) and nothing else")


def run_device(device: str) -> tuple[str | torch.device, torch.device]:
    """``--device`` checked: what to compile for, and the torch device a call's tensors live on (the
    CPU for MLX, whose executables take and return CPU tensors)."""
    if parse_mlx(device) is not None:
        try:
            backend = get_backend(device)
        except BackendError as e:
            raise OstinatoError(f"--device {device}: {e}") from e
        return backend.label, backend.device
    dev = check_device(device)
    return dev, dev


def check_device(device: str) -> torch.device:
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise OstinatoError(f"--device {device}: not a device ({e})\nFix: use cpu, cuda or cuda:N") from e
    if dev.type not in ("cpu", "cuda"):
        raise OstinatoError(f"--device {device}: ostinato runs on cpu, cuda and mlx only\nFix: use cpu, cuda, "
                            "cuda:N or mlx")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise OstinatoError(f"--device {device}: torch sees no CUDA device here (torch {torch.__version__})\n"
                            "Fix: run with --device cpu, or on a machine with an NVIDIA GPU and a CUDA build "
                            "of torch")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise OstinatoError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)\n"
                            "Fix: pick an index below that, or plain --device cuda")
    return dev


def _sizes(prog: Program) -> dict[str, int]:
    """Each size symbol's value for random inputs: its export example, else its range's minimum."""
    sizes = {name: max(r.min, 1) for name, r in prog.graph.symbols.items()}
    sizes.update(prog.hints)
    return sizes


def random_leaves(prog: Program, device: torch.device, seed: int) -> list:
    gen = torch.Generator().manual_seed(seed)
    sizes = _sizes(prog)
    leaves: list[Any] = []
    for slot in prog.inputs:
        if slot.kind == "constant":
            leaves.append(slot.value)
            continue
        meta = prog.graph.inputs[slot.index].meta
        if isinstance(meta, TensorMeta):
            shape = tuple(d if isinstance(d, int) else d.evaluate(sizes) for d in meta.shape)
            leaves.append(random_tensor(shape, meta.dtype, gen, device))
        else:
            value = meta.expr.evaluate(sizes) if isinstance(meta.expr, SymDim) else 1
            leaves.append(meta.kind(value))
    return leaves


def file_leaves(prog: Program, path: str, device: torch.device) -> list:
    """The program's flat inputs from a safetensors file (constants keep their exported value)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    try:
        tensors = load_file(path)
    except SafetensorError as e:
        raise InputError(f"--inputs {path}: not a safetensors file ({e})\n"
                         "Fix: write it with safetensors.torch.save_file({name: tensor, ...}, path)") from e
    names = {slot.name: pos for pos, slot in enumerate(prog.inputs)}
    expected = ", ".join(f"{s.name} (or {i})" for i, s in enumerate(prog.inputs) if s.kind != "constant")
    given: dict[int, torch.Tensor] = {}
    for key, t in tensors.items():
        pos = int(key) if key.isdigit() else names.get(key)
        if pos is None or pos >= len(prog.inputs):
            raise InputError(f"--inputs {path}: no input named {key!r}; the program takes {expected}\n"
                             "Fix: key the tensors by those names or positions (`ostinato inspect` lists them)")
        if pos in given:
            raise InputError(f"--inputs {path}: input {pos} ({prog.inputs[pos].name}) is given twice, "
                             "by name and by position\nFix: keep one of the two keys")
        given[pos] = t
    leaves: list[Any] = []
    missing = []
    for pos, slot in enumerate(prog.inputs):
        t = given.get(pos)
        if slot.kind == "constant":
            leaves.append(slot.value if t is None else t.item())
        elif t is None:
            missing.append(f"{slot.name} (or {pos})")
            leaves.append(None)
        elif slot.kind == "scalar":
            leaves.append(t.item())
        else:
            leaves.append(t.to(device))
    if missing:
        raise InputError(f"--inputs {path}: missing input(s) {', '.join(missing)}; the program takes {expected}\n"
                         "Fix: add them to the file, keyed by name or position")
    return leaves


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _output_rows(out: Any) -> list[dict]:
    rows = []
    for path, leaf in pytree.tree_flatten_with_path(out)[0]:
        where = pytree.keystr(path) or "output"
        if isinstance(leaf, torch.Tensor):
            rows.append({"output": where, "dtype": str(leaf.dtype).replace("torch.", ""), "shape": list(leaf.shape)})
        else:
            rows.append({"output": where, "value": repr(leaf)})
    return rows


def run(args: argparse.Namespace) -> int:
    if args.steps < 1:
        raise OstinatoError(f"--steps {args.steps}: need at least one call\nFix: --steps 10")
    target, dev = run_device(args.device)
    t0 = time.perf_counter()
    prog = load(args.file, verify=not args.no_verify)
    t_load = time.perf_counter() - t0
    leaves = file_leaves(prog, args.inputs, dev) if args.inputs else random_leaves(prog, dev, args.seed)
    call_args, call_kwargs = pytree.tree_unflatten(leaves, prog.in_spec)
    t0 = time.perf_counter()
    exe = compile(prog, device=target, replay=args.replay, cache=not args.no_cache)
    t_compile = time.perf_counter() - t0

    times = []
    first = None
    for step in range(args.steps):
        t0 = time.perf_counter()
        try:
            out = exe(*call_args, **call_kwargs)
        except InputError as e:
            if not args.inputs:
                raise
            raise InputError(f"--inputs {args.inputs}: {str(e).strip().splitlines()[0]}\n"
                             "Fix: save tensors of the dtypes and shapes `ostinato inspect` lists") from e
        _sync(dev)
        times.append(time.perf_counter() - t0)
        if step == 0:
            # Replayed outputs are the captured buffers, overwritten by the next call: keep a copy.
            first = pytree.tree_map(lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, out)
    if args.save_outputs:
        from safetensors.torch import save_file
        flat = pytree.tree_leaves(first)
        save_file({str(i): x.contiguous().cpu() for i, x in enumerate(flat) if isinstance(x, torch.Tensor)},
                  args.save_outputs)

    steps = times[1:]
    ms = {"load": t_load * 1e3, "compile": t_compile * 1e3, "first_call": times[0] * 1e3,
          "median_step": statistics.median(steps) * 1e3 if steps else None,
          "min_step": min(steps) * 1e3 if steps else None}
    report = {
        "file": args.file, "model": prog.info.get("model", "?"), "device": exe.backend.label or str(exe.device),
        "replay": args.replay, "plan_source": exe.plan_source, "steps": args.steps,
        "inputs": args.inputs or f"random (seed {args.seed})",
        "outputs": _output_rows(first), "timings_ms": ms,
        "versions": {"ostinato": __version__, "torch": torch.__version__, "python": platform.python_version()},
    }
    if args.json:
        write_json(report)
    else:
        _print_report(report)
    return 0


def _print_report(r: dict) -> None:
    from rich.table import Table

    from .progress import report_console
    console = report_console()
    mode = "replay" if r["replay"] else "step by step"
    console.print(f"{r['file']}: {r['model']} on {r['device']}, {mode}, plan {r['plan_source']}, "
                  f"inputs {r['inputs']}")
    outs = Table("output", "dtype", "shape", box=None, pad_edge=False)
    for o in r["outputs"]:
        if "value" in o:
            outs.add_row(o["output"], "constant", o["value"])
        else:
            outs.add_row(o["output"], o["dtype"], "[" + ", ".join(str(d) for d in o["shape"]) + "]")
    console.print(outs)
    ms = r["timings_ms"]
    first = "first call (step by step; the second captures)" if r["replay"] else "first call"
    timing = Table("", "ms", box=None, pad_edge=False)
    timing.columns[1].justify = "right"
    for label, key in (("load", "load"), ("compile", "compile"), (first, "first_call"),
                       (f"median step (of {r['steps'] - 1})", "median_step"), ("min step", "min_step")):
        if ms[key] is not None:
            timing.add_row(label, f"{ms[key]:.3f}")
    console.print(timing)
