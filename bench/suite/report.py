"""The suite's outputs: JSON (everything measured, with device, versions and date), a markdown table,
a PNG chart of speed-up over eager per configuration and runner, the geometric means of ostinato
replay's speed-up over each other runner (per category and overall), the regression list (every
configuration where ostinato replay is slower than a runner a user would pick instead), the time to
first output of fresh processes (cold and warm) and the failures, each with the first line of its error."""
from __future__ import annotations

import json
import math
import os
from typing import Any

from .configs import MATRIX, RUNNERS

STARTUP_MODES = ("ostinato_cold", "ostinato_warm", "torch_compile_cold", "torch_compile_warm", "aoti_cold",
                 "aoti_warm", "executorch_cold", "executorch_warm")
MINE = "ostinato_replay"
# The runners a user would pick instead of ostinato: replay slower than any of them is a regression.
PEERS = ("eager", "cuda_graph_eager", "torch_compile", "torch_compile_ro", "aoti", "aoti_cuda_graph",
         "executorch_xnnpack")


def _ms(rec: dict, runner: str) -> float | None:
    cell = rec.get("cells", {}).get(runner)
    return cell["mean_ms"] if cell and cell.get("status") == "ok" else None


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def speedups(doc: dict) -> dict:
    """Ostinato replay's speed-up over each other runner (their step time / replay's), as geometric
    means over the configurations where both ran and were right: per category (in CATEGORIES' order)
    and overall. ``{"categories": {cat: {runner: {geomean, n, min, max}}}, "overall": {runner: ...}}``."""
    from .configs import CATEGORIES
    others = [r for r in RUNNERS if r != MINE]
    ratios: dict[str, dict[str, list[float]]] = {}
    for rec in doc["configs"]:
        mine = _ms(rec, MINE)
        if not mine:
            continue
        cat = rec["config"].get("category", "uncategorised")
        for other in others:
            theirs = _ms(rec, other)
            if theirs:
                ratios.setdefault(cat, {}).setdefault(other, []).append(theirs / mine)

    def stats(xs: list[float]) -> dict:
        return {"geomean": _geomean(xs), "n": len(xs), "min": min(xs), "max": max(xs)}
    order = [c for c in CATEGORIES if c in ratios] + sorted(c for c in ratios if c not in CATEGORIES)
    cats = {c: {r: stats(ratios[c][r]) for r in others if r in ratios[c]} for c in order}
    overall = {}
    for r in others:
        xs = [x for c in order for x in ratios[c].get(r, [])]
        if xs:
            overall[r] = stats(xs)
    return {"categories": cats, "overall": overall}


def regressions(doc: dict) -> list[dict]:
    """Configurations where ostinato replay's trimmed mean is above that of a runner a user would pick
    instead (PEERS: eager, a CUDA graph of eager, torch.compile, AOTInductor, ExecuTorch)."""
    out = []
    for rec in doc["configs"]:
        mine = _ms(rec, MINE)
        if mine is None:
            continue
        for other in PEERS:
            theirs = _ms(rec, other)
            if theirs is not None and mine > theirs:
                out.append({"config": rec["config"]["name"], "slower_than": other, "ostinato_replay_ms": mine,
                            f"{other}_ms": theirs, "ratio": mine / theirs})
    return out


def failures(doc: dict) -> list[dict]:
    """Cells that are wrong or failed, and configurations that could not be built or exported."""
    out = []
    for rec in doc["configs"]:
        name = rec["config"]["name"]
        for key in ("error", "export_error"):
            if key in rec:
                out.append({"config": name, "runner": key, "status": "error", "detail": rec[key]})
        for runner, cell in rec.get("cells", {}).items():
            if cell.get("status") == "wrong":
                out.append({"config": name, "runner": runner, "status": "wrong",
                            "detail": f"max error {float(cell['max_error']):.3g} > tolerance {cell['tolerance']:.3g}"})
            elif cell.get("status") == "error":
                out.append({"config": name, "runner": runner, "status": "error", "detail": cell.get("error")})
        for mode, r in rec.get("startup", {}).items():
            if r.get("status") == "error":
                out.append({"config": name, "runner": mode, "status": "error", "detail": r.get("error")})
    return out


def finish(doc: dict) -> dict:
    doc["speedups"] = speedups(doc)
    doc["regressions"] = regressions(doc)
    doc["failures"] = failures(doc)
    return doc


def merge(docs: list[dict]) -> dict:
    """One document from several parts'. A configuration measured in several parts gets the union of
    their cells and start-up figures, the later part's winning where both have one (a configuration
    too long for one 10-minute part runs its runners in two, e.g. ``--runners aoti,aoti_cuda_graph``
    alone); its ``parts`` lists which parts it came from, each cell's ``part`` says which it was
    measured in. The header is the first part's; every part's header is kept under ``parts``."""
    if not docs:
        raise ValueError("nothing to merge")
    by_name: dict[str, dict] = {}
    for i, d in enumerate(docs):
        for rec in d["configs"]:
            name = rec["config"]["name"]
            if name not in by_name:
                by_name[name] = rec
                continue
            old = by_name[name]
            if "parts" not in old:
                old = dict(old, parts=[_part_of(docs, old)],
                           cells={r: dict(c, part=_part_of(docs, old)) for r, c in old.get("cells", {}).items()})
            cells = dict(old.get("cells", {}), **{r: dict(c, part=i) for r, c in rec.get("cells", {}).items()})
            by_name[name] = dict(rec, cells=cells, startup=dict(old.get("startup", {}), **rec.get("startup", {})),
                                 parts=old["parts"] + [i],
                                 wall_s=(old.get("wall_s") or 0.0) + (rec.get("wall_s") or 0.0))
    head = {k: v for k, v in docs[0].items() if k not in ("configs", "regressions", "failures", "parts", "speedups")}
    parts = [{k: d.get(k) for k in ("date", "device", "versions", "wall_s", "selection")} for d in docs]
    devices = {p["device"] for p in parts}
    order = {c.name: i for i, c in enumerate(MATRIX)}   # the matrix's order, whatever the parts'
    out = dict(head, parts=parts, configs=sorted(by_name.values(),
                                                 key=lambda r: order.get(r["config"]["name"], len(order))))
    out["wall_s"] = sum(p["wall_s"] or 0.0 for p in parts)
    if len(devices) > 1:
        out["warning"] = f"parts ran on different devices ({sorted(devices)}): compare ratios within a part only"
    return finish(out)


def _part_of(docs: list[dict], rec: dict) -> int:
    return next(i for i, d in enumerate(docs) if any(r is rec for r in d["configs"]))


def _cell_text(rec: dict, runner: str) -> str:
    cell = rec.get("cells", {}).get(runner)
    if cell is None:
        return "–"
    if cell.get("status") == "wrong":
        return f"wrong (err {float(cell['max_error']):.2g})"
    if cell.get("status") != "ok":
        return _failed(cell.get("error"))
    eager = _ms(rec, "eager")
    ratio = f" ({eager / cell['mean_ms']:.2f}x)" if eager and runner != "eager" else ""
    return f"{cell['mean_ms']:.3f}{ratio}"


def _start_text(r: dict) -> str:
    """A start-up cell: its seconds, and for a cold ostinato process whose first output did not wait for
    every kernel compile, when they had all landed and what they took (summed over the workers)."""
    text = f"{r['total_s']:.2f}"
    k = r.get("kernels_settled")
    if "all_compiled_s" in r and k:
        text += (f" (kernels all compiled at {r['all_compiled_s']:.2f}: {k.get('kernels_compiled', 0)} compiled, "
                 f"{k.get('kernel_compile_seconds', 0):.1f} s summed)")
    return text


def _failed(error: str | None, width: int = 120) -> str:
    """A failed cell: "failed: " and the first line of its error, cut to ``width`` characters, made safe
    for a markdown table."""
    first = (str(error or "no error recorded").strip().splitlines() or [""])[0]
    if len(first) > width:
        first = first[:width - 3] + "..."
    return "failed: " + first.replace("|", "\\|")


def _mem(rec: dict, runner: str) -> str:
    cell = rec.get("cells", {}).get(runner) or {}
    b = cell.get("peak_mem_bytes")
    return "–" if b is None else f"{b / 2 ** 20:.0f}"


def markdown(doc: dict) -> str:
    runners = [r for r in RUNNERS if any(r in rec.get("cells", {}) for rec in doc["configs"])]
    v = doc["versions"]
    lines = [f"# ostinato bench: {doc['device']}", "",
             f"{doc['date']}; torch {v['torch']}, Python {v['python']}, ostinato {v['ostinato']}, "
             f"transformers {v.get('transformers')}, Triton {v.get('triton')}"
             + (f", CUDA {v['cuda']}" if v.get("cuda") else "")
             + (f", ExecuTorch {v['executorch']}" if v.get("executorch") else "") + ".", "",
             f"Step time in ms: 10% trimmed mean of {doc['method']['trials']} trials after "
             f"{doc['method']['warmups']} warm-ups"
             + (", the runners' trials interleaved" if doc["method"].get("interleaved") else "")
             + " (speed-up over eager in parentheses). Every runner's "
             "outputs are checked against eager before it is timed; a wrong one is shown, not timed.", "",
             "| configuration | " + " | ".join(runners) + " |", "|---|" + "---|" * len(runners)]
    for rec in doc["configs"]:
        lines.append(f"| {rec['config']['name']} | " + " | ".join(_cell_text(rec, r) for r in runners) + " |")
    lines += ["", f"Peak memory (MiB): {doc['method']['memory']}.", "",
              "| configuration | " + " | ".join(runners) + " |", "|---|" + "---|" * len(runners)]
    for rec in doc["configs"]:
        lines.append(f"| {rec['config']['name']} | " + " | ".join(_mem(rec, r) for r in runners) + " |")
    lines += _made_table(doc)
    starts = [rec for rec in doc["configs"] if rec.get("startup")]
    if starts:
        modes = [m for m in STARTUP_MODES if any(m in rec["startup"] for rec in starts)]
        lines += ["", "## Time to first output in a fresh process", "",
                  "Seconds from after `import torch` and the model's construction to the first output (cold: "
                  "empty caches, export, compile or lowering included; warm: ostinato loads its .ost with the "
                  "cache the cold process filled, torch.compile compiles with warm caches, AOTInductor loads its "
                  ".pt2 package, ExecuTorch its .pte; the warm ones build no model).", "",
                  "| configuration | category | " + " | ".join(modes) + " |", "|---|---|" + "---|" * len(modes)]
        for rec in starts:
            row = []
            for m in modes:
                r = rec["startup"].get(m)
                row.append("–" if r is None else _start_text(r) if r.get("status") == "ok"
                           else _failed(r.get("error"), 60))
            lines.append(f"| {rec['config']['name']} | {rec['config'].get('category', '')} | " + " | ".join(row) + " |")
    lines += _speedup_tables(doc)
    lines += ["", "## Regressions (ostinato replay slower than " + ", ".join(PEERS) + ")", ""]
    regs = doc.get("regressions", [])
    lines += [f"- {r['config']}: {r['ostinato_replay_ms']:.3f} ms vs {r['slower_than']} "
              f"{r[r['slower_than'] + '_ms']:.3f} ms ({r['ratio']:.2f}x)" for r in regs] or ["none"]
    lines += ["", "## Failures", ""]
    lines += [f"- {f['config']} / {f['runner']}: {f['status']}: {f['detail']}" for f in doc.get("failures", [])] \
        or ["none"]
    checked = [(rec["config"]["name"], runner, cell) for rec in doc["configs"]
               for runner, cell in rec.get("cells", {}).items() if "float64_error" in cell]
    if checked:
        lines += ["", "## Checked against float64", "",
                  "float32 runners further than the tolerance from eager, judged by their distance from a float64 "
                  "copy's outputs against eager's own (at most 2x: torch's benchmark rule):", ""]
        lines += [f"- {name} / {runner}: {cell['max_error']:.3g} from eager; {cell['float64_check']}"
                  for name, runner, cell in checked]
    slack = [(rec["config"]["name"], runner, cell, rec["config"]["params"].get("row_slack"))
             for rec in doc["configs"] for runner, cell in rec.get("cells", {}).items() if "rows_missed" in cell]
    if slack:
        lines += ["", "## Sequences routed apart", "",
                  "Mixture-of-experts configurations allow a few sequences of the batch to miss the tolerance (a "
                  "near-tie between two experts flips under any difference of rounding) while every other "
                  "sequence meets it:", ""]
        lines += [f"- {name} / {runner}: {cell['max_error']:.3g} from eager; {cell['rows_missed']} sequence(s) "
                  f"beyond the tolerance, {allowed} allowed" for name, runner, cell, allowed in slack]
    lines += ["", "Configurations:", ""]
    lines += [f"- {rec['config']['name']}: {rec.get('description', '')}" for rec in doc["configs"]]
    return "\n".join(lines) + "\n"


def _made_table(doc: dict) -> list[str]:
    """Seconds each tool took to make what it runs, per configuration: ostinato's export, torch.compile's
    first calls, AOTInductor's export + compile + package, ExecuTorch's export + lowering."""
    cols = (("ostinato export", lambda rec: rec.get("export_s")),
            ("torch_compile first call", lambda rec: _cell(rec, "torch_compile", "first_call_s")),
            ("torch_compile_ro first call", lambda rec: _cell(rec, "torch_compile_ro", "first_call_s")),
            ("aoti export + compile", lambda rec: _sum(_cell(rec, "aoti", "export_s") or _cell(rec, "aoti_cuda_graph", "export_s"),
                                                       _cell(rec, "aoti", "compile_s") or _cell(rec, "aoti_cuda_graph", "compile_s"))),
            ("executorch export + lower", lambda rec: _sum(_cell(rec, "executorch_xnnpack", "export_s"),
                                                           _cell(rec, "executorch_xnnpack", "lower_s"))))
    used = [(name, f) for name, f in cols if any(f(rec) is not None for rec in doc["configs"])]
    if not used:
        return []
    lines = ["", "Seconds to make what each runs (in this process or its cold-start process; see the JSON's "
             "compiled_in / lowered_in):", "",
             "| configuration | " + " | ".join(n for n, _ in used) + " |", "|---|" + "---|" * len(used)]
    for rec in doc["configs"]:
        vals = [f(rec) for _, f in used]
        lines.append(f"| {rec['config']['name']} | " + " | ".join("–" if v is None else f"{v:.1f}" for v in vals) + " |")
    return lines


def _cell(rec: dict, runner: str, key: str) -> float | None:
    cell = rec.get("cells", {}).get(runner) or {}
    v = cell.get(key)
    return float(v) if isinstance(v, (int, float)) else None


def _sum(*xs: float | None) -> float | None:
    return None if any(x is None for x in xs) else sum(xs)


def _speedup_tables(doc: dict) -> list[str]:
    sp = doc.get("speedups") or speedups(doc)
    runners = [r for r in RUNNERS if r in sp["overall"]]
    if not runners:
        return []
    lines = ["", "## Ostinato replay against each runner", "",
             "Geometric mean over the configurations where both ran and were right of the runner's step time "
             "divided by ostinato_replay's (above 1: replay is faster), with the number of configurations "
             "and the range.", "",
             "| category | " + " | ".join(f"vs {r}" for r in runners) + " |", "|---|" + "---|" * len(runners)]

    def text(st: dict | None) -> str:
        if not st:
            return "–"
        return f"{st['geomean']:.2f}x (n={st['n']}, {st['min']:.2f}-{st['max']:.2f})"
    for cat, per in sp["categories"].items():
        lines.append(f"| {cat} | " + " | ".join(text(per.get(r)) for r in runners) + " |")
    lines.append("| **overall** | " + " | ".join(text(sp["overall"].get(r)) for r in runners) + " |")
    return lines


def chart(doc: dict, path: str) -> None:
    """Horizontal grouped bars: speed-up over eager (log scale) per configuration and runner."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runners = [r for r in RUNNERS if r != "eager" and any(r in rec.get("cells", {}) for rec in doc["configs"])]
    recs = [rec for rec in doc["configs"] if _ms(rec, "eager")]
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.22 * max(1, len(recs)) * max(1, len(runners)) ** 0.5 * 1.6))
    height = 0.8 / max(1, len(runners))
    for j, runner in enumerate(runners):
        ys, xs = [], []
        for i, rec in enumerate(recs):
            mine = _ms(rec, runner)
            if mine:
                ys.append(i + (j - (len(runners) - 1) / 2) * height)
                xs.append(_ms(rec, "eager") / mine)
        ax.barh(ys, xs, height=height, label=runner)
    ax.set_yticks(range(len(recs)), [rec["config"]["name"] for rec in recs], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    from matplotlib.ticker import FuncFormatter
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}".lstrip("0.")[:1] in ("2", "5") else ""))
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("speed-up over eager (eager step time / runner step time, log scale)")
    ax.set_title(f"ostinato bench: {doc['device']}, torch {doc['versions']['torch']}", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(doc: dict, out_dir: str) -> dict[str, str]:
    """results.json, results.md and speedup.png in ``out_dir``; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    finish(doc)
    paths = {"json": os.path.join(out_dir, "results.json"), "markdown": os.path.join(out_dir, "results.md"),
             "chart": os.path.join(out_dir, "speedup.png")}
    with open(paths["json"], "w") as f:
        json.dump(_finite(doc), f, indent=1, allow_nan=False)
    with open(paths["markdown"], "w") as f:
        f.write(markdown(doc))
    chart(doc, paths["chart"])
    return paths


def _finite(x: Any) -> Any:
    """Strict JSON: a non-finite float (an output with inf or NaN has max error inf) becomes a string."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x
