"""Show what a program file holds: schema, sizes, exporter, inputs, outputs, state, weights, ops, and
the ops that run through eager torch because ostinato has no kernel for them (the fallback).

``--passes`` shows the node count after each graph pass: for a .ost file, the counts its exporter
recorded; for ``MODULE:FACTORY``, a fresh export of the model the factory builds, with each pass's time.

``--launches`` lists the kernels one step launches on ``--device`` (cuda by default), worked out without
the device: on CUDA the scheduler's fusion groups become one generated kernel each (unless
OSTINATO_FUSION=0); on CPU every node with device work is its own launch.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import write_json
from ..errors import ExportError, MissingOpError, OstinatoError, ProgramFormatError
from ..ir import TensorMeta, Value
from ..ir.fallback import fallback_nodes
from ..program import load, spec_structure
from .factory import is_factory_spec, load_factory

HELP = "describe a .ost program file"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a .ost program file (or MODULE:FACTORY with --passes)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--passes", action="store_true",
                      help="show the node count (and, exporting MODULE:FACTORY, the time) after each pass")
    mode.add_argument("--launches", action="store_true",
                      help="list the kernels one step launches (fused groups and their ops), no GPU needed")
    p.add_argument("--device", choices=("cuda", "cpu", "mlx"), default=None,
                   help="with --launches: the device whose lowering to show (default cuda); the launches "
                        "a backend runs through torch (costing copies and a sync each) are marked")
    p.add_argument("--json", action="store_true", help="print one JSON object (for machines)")
    p.add_argument("--no-verify", action="store_true", help="skip the sha256 checks of the file's segments")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import MODULE first (repeatable): the module that registers the program's custom "
                        "ops (torch.library), which run through eager torch")


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def import_modules(names: list[str]) -> None:
    """Import the modules that register a program's custom ops (the current directory is importable)."""
    if names and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ExportError(f"cannot import {name} (from --import): {e}\nFix: name a module importable "
                              "from the current directory or the Python path") from e


def _load(path: str, verify: bool):
    try:
        return load(path, verify=verify)
    except MissingOpError as e:
        first = str(e).splitlines()[0]
        raise MissingOpError(f"{first}\nFix: pass --import MODULE, naming the module that registers it "
                             "(its torch.library.custom_op)") from e


def describe(path: str, verify: bool = True) -> dict:
    prog = _load(path, verify)
    src = prog.source
    g = prog.graph

    def spec(v: Value) -> dict:
        if isinstance(v.meta, TensorMeta):
            return {"name": v.name, "dtype": str(v.meta.dtype).replace("torch.", ""),
                    "shape": [d if isinstance(d, int) else str(d) for d in v.meta.shape]}
        return {"name": v.name, "type": v.meta.kind.__name__}

    ptrs, weight_bytes = set(), 0
    for t in prog.weights.values():
        key = (t.data_ptr(), t.numel() * t.element_size())
        if key not in ptrs:
            ptrs.add(key)
            weight_bytes += key[1]
    outputs = [spec(o) if isinstance(o, Value) else {"constant": repr(o)} for o in g.outputs]
    return {
        "file": path,
        "schema_version": src.header.schema,
        "sizes": {"file": src.size, "flatbuffer": src.header.fb_size, "data": src.header.data_size,
                  "weights_raw": sum(t.numel() * t.element_size() for t in prog.weights.values()),
                  "weights_stored": weight_bytes,
                  "state_raw": sum(t.numel() * t.element_size() for t in prog.state_init.values())},
        "exporter": prog.info,
        "symbols": [{"name": s.name, "label": s.label, "min": s.min, "max": s.max} for s in g.symbols.values()],
        "inputs": [spec(v) for v in g.inputs],
        "input_structure": spec_structure(prog.in_spec),
        "outputs": outputs,
        "state": [spec(v) for v in g.state],
        "weights": len(prog.weights),
        "nodes": len(g.nodes),
        "ops": dict(sorted(prog.op_counts().items(), key=lambda kv: (-kv[1], kv[0]))),
        "fallback": [{"op": op, "node": node, "source": source, "reason": reason}
                     for op, node, source, reason in fallback_nodes(g)],
        # Entry points besides the graph above (an LM's prefill): each over the same weights and state.
        "methods": [{"name": name, "inputs": [spec(v) for v in m.graph.inputs],
                     "input_structure": spec_structure(m.in_spec),
                     "outputs": [spec(o) if isinstance(o, Value) else {"constant": repr(o)} for o in m.graph.outputs],
                     "symbols": [{"name": x.name, "label": x.label, "min": x.min, "max": x.max}
                                 for x in m.graph.symbols.values()],
                     "nodes": len(m.graph.nodes), "fallback": len(fallback_nodes(m.graph))}
                    for name, m in prog.methods.items()],
    }


def _shape(s: dict) -> str:
    if "constant" in s:
        return f"constant {s['constant']}"
    if "type" in s:
        return f"{s['name']}: {s['type']}"
    return f"{s['name']}: {s['dtype']}[{', '.join(str(d) for d in s['shape'])}]"


def pass_table(target: str, verify: bool = True) -> dict:
    """The pass report of a program file, or of exporting ``MODULE:FACTORY`` now (with times)."""
    if is_factory_spec(target) and not os.path.exists(target):
        from ..frontend import export
        model, fargs, fkwargs = load_factory(target)
        prog = export(model, fargs, fkwargs, cache=False)   # measured now: not from the export cache
        rows = [dict(r) for r in prog.info["passes"]]
        rows[0]["ms"] = prog.timings["torch_export"] * 1e3
        for r in rows[1:]:
            r["ms"] = prog.timings[f"pass.{r['pass']}"] * 1e3
        return {"model": prog.info["model"], "source": target, "passes": rows,
                "regional": prog.export_report.get("regional")}
    prog = _load(target, verify)
    rows = prog.info.get("passes")
    if not rows:
        raise ProgramFormatError(f"{target} records no pass report (exported by ostinato "
                                 f"{prog.info.get('ostinato', '?')})\nFix: re-export it, or run "
                                 "`ostinato inspect --passes MODULE:FACTORY` on the model itself")
    return {"model": prog.info.get("model", "?"), "source": target, "passes": rows}


def _print_passes(t: dict) -> None:
    timed = "ms" in t["passes"][0]
    lines = [f"{t['model']} ({t['source']}): node count after each pass"
             + ("" if timed else " (times are not saved in the file; pass MODULE:FACTORY to measure them)")]
    lines.append(f"  {'pass':<18}{'nodes':>8}{'change':>9}" + (f"{'ms':>10}" if timed else ""))
    prev = None
    for r in t["passes"]:
        change = "" if prev is None else f"{r['nodes'] - prev:+d}"
        lines.append(f"  {r['pass']:<18}{r['nodes']:>8}{change:>9}" + (f"{r['ms']:>10.2f}" if timed else ""))
        prev = r["nodes"]
    regional = t.get("regional") or {}
    for k in regional.get("kinds", []):
        lines.append(f"  regional export: {k['class']}: {k['instances']} instances, {k['calls']} calls, "
                     f"traced {k['traced']}x")
    for why in regional.get("fallbacks", []):
        lines.append(f"  regional export: traced inline: {why}")
    sys.stdout.write("\n".join(lines) + "\n")


def launch_report(path: str, device: str, verify: bool = True) -> dict:
    """The launches of one step of a program file on ``device`` (see ostinato.codegen.report)."""
    from ..codegen import fusion_enabled
    from ..codegen.report import fuses, launch_table, summarize
    prog = _load(path, verify)
    rows = launch_table(prog.graph, device)
    summary = summarize(prog.graph, rows)
    _mark_through_torch(prog.graph, device, rows, summary)
    summary["fusion"] = fuses(device)
    summary["fusion_off_by_env"] = device == "cuda" and not fusion_enabled()
    return {"file": path, "model": prog.info.get("model", "?"), "device": device,
            "launches": rows, "summary": summary}


def _mark_through_torch(graph, device: str, rows: list[dict], summary: dict) -> None:
    """Each row's ``through_torch`` reason (empty when the backend runs it itself), where the device's
    backend can be built here (a CUDA backend needs a GPU: then fallback ops alone are marked)."""
    from ..backends import Backend, get_backend
    from ..errors import BackendError
    try:
        backend = get_backend(device)
    except BackendError:
        backend = None
    nodes = {n.name: n for n in graph.nodes}
    for row in rows:
        node = nodes.get(row["name"]) if row["kind"] != "fused" else None
        if node is None:
            row["through_torch"] = ""
        else:
            row["through_torch"] = backend.through_torch(node) if backend else Backend.through_torch(None, node)
    summary["through_torch"] = sum(1 for r in rows if r["through_torch"])


def _short(op: str) -> str:
    """``aten.mul.Tensor`` → ``mul``; ``ost.linear`` stays whole (not an ATen op)."""
    return op.split(".")[1] if op.startswith("aten.") else op


def _print_launches(r: dict) -> None:
    from rich.table import Table

    from .progress import report_console
    console = report_console()
    s = r["summary"]
    why = ("fusion on" if s["fusion"] else
           "fusion off: OSTINATO_FUSION=0" if s["fusion_off_by_env"] else "cpu: no generated kernels")
    console.print(f"{r['file']}: {r['model']}, launches of one step on {r['device']} ({why})")
    t = Table("#", "kernel", "ops absorbed", "bytes moved", "group / node", box=None, pad_edge=False)
    t.columns[0].justify = t.columns[3].justify = "right"
    for row in r["launches"]:
        fused = row["kind"] == "fused"
        kernel = row["kernel"] if fused else row["kind"]
        ops = f"{row['op_count']}: " + ", ".join(_short(o) for o in row["ops"]) if fused else "-"
        size = "symbolic" if row["bytes"] is None else _human(row["bytes"])
        t.add_row(str(row["index"]), kernel, ops, size, row["name"])
    console.print(t)
    total = "" if s["bytes"] is None else f"; {_human(s['bytes'])} moved"
    console.print(f"{s['launches']} launches per step ({s['fused_kernels']} generated fused kernels absorbing "
                  f"{s['ops_absorbed']} ops; {s['skipped']} of {s['nodes']} nodes without device work "
                  f"skipped{total})")
    bridged = [row for row in r["launches"] if row.get("through_torch")]
    if bridged:
        console.print(f"{len(bridged)} launch(es) run through torch on {r['device']} (inputs copied out and "
                      "results copied back, a sync each):")
        for row in bridged:
            console.print(f"  #{row['index']} {row['kind']} ({row['name']}): {row['through_torch']}")


def run(args: argparse.Namespace) -> int:
    import_modules(args.imports)
    if args.device is not None and not args.launches:
        raise OstinatoError("--device applies to --launches only\nFix: add --launches, or drop --device")
    if args.launches:
        r = launch_report(args.file, args.device or "cuda", verify=not args.no_verify)
        if args.json:
            write_json({"device": r["device"], "launches": r["launches"], "summary": r["summary"]})
        else:
            _print_launches(r)
        return 0
    if args.passes:
        t = pass_table(args.file, verify=not args.no_verify)
        if args.json:
            write_json(t)
        else:
            _print_passes(t)
        return 0
    d = describe(args.file, verify=not args.no_verify)
    if args.json:
        write_json(d)
        return 0
    s, e = d["sizes"], d["exporter"]
    lines = [
        f"{d['file']}: ostinato program, schema v{d['schema_version']}",
        f"  size      {_human(s['file'])}: FlatBuffer {_human(s['flatbuffer'])}, data {_human(s['data'])} "
        f"(weights {_human(s['weights_raw'])} raw, {_human(s['weights_stored'])} stored; "
        f"state {_human(s['state_raw'])})",
        f"  exporter  {e.get('model', '?')} by ostinato {e.get('ostinato', '?')}, torch {e.get('torch', '?')}",
    ]
    if d["symbols"]:
        lines.append("  symbols   " + ", ".join(
            f"{x['name']}{' (' + x['label'] + ')' if x['label'] else ''} in [{x['min']}, "
            f"{'inf' if x['max'] is None else x['max']}]" for x in d["symbols"]))
    lines.append("  inputs    " + "; ".join(_shape(x) for x in d["inputs"]) + f"  as {d['input_structure']}")
    lines.append("  outputs   " + "; ".join(_shape(x) for x in d["outputs"]))
    if d["state"]:
        lines.append("  state     " + "; ".join(_shape(x) for x in d["state"]))
    lines.append(f"  weights   {d['weights']} tensors")
    if d["methods"]:
        root = "decode" if "llm" in e else "(root)"
        lines.append(f"  methods   {len(d['methods']) + 1}: {root}, the graph described here; "
                     + ", ".join(m["name"] for m in d["methods"]) + " over the same weights and state")
        for m in d["methods"]:
            syms = ", ".join(f"{x['name']}{' (' + x['label'] + ')' if x['label'] else ''} in [{x['min']}, "
                             f"{'inf' if x['max'] is None else x['max']}]" for x in m["symbols"])
            lines.append(f"    {m['name']}: " + "; ".join(_shape(x) for x in m["inputs"])
                         + f" -> " + "; ".join(_shape(x) for x in m["outputs"])
                         + f"  ({m['nodes']} nodes{', ' + syms if syms else ''}"
                         + (f", {m['fallback']} through eager torch" if m["fallback"] else "") + ")")
    lines.append(f"  ops       {d['nodes']} nodes, {len(d['ops'])} distinct:")
    for op, n in d["ops"].items():
        lines.append(f"    {n:6d}  {op}")
    if d["fallback"]:
        lines.append(f"  fallback  {len(d['fallback'])} node(s) run through eager torch (no ostinato kernel):")
        for f in d["fallback"]:
            lines.append(f"    {f['op']}  node {f['node']}  at {f['source'] or 'unknown source'}")
            lines.append(f"      {f['reason']}")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0
