"""The suite at full breadth (issue #16): the matrix's counts and families, every configuration's
builder at small sizes, the peers' runners (AOTInductor, ExecuTorch) recorded when they fail and
measured when they work, and the report's geometric means, regressions and failed cells."""
from __future__ import annotations

import json
import math
import os

import pytest
import torch
from torch import nn

from bench.suite import configs, measure, report, workloads
from bench.suite.configs import Config
from bench.suite.run import run_suite

FAST = {"trial_seconds": 0.002}

# Configuration names of the matrix before issue #16: results are compared across runs by name.
OLD_NAMES = {f"gpu/tiny-decoder-h{h}-l{n}" for h in (128, 256) for n in (32, 64, 128)} | {
    f"gpu/{s}-{k}" for s in ("llama-3.2-1b", "qwen2.5-0.5b", "gemma-2b") for k in ("decode", "prefill128")} | {
    "gpu/unet-r32", "gpu/unet-r64", "gpu/dit-b2-r32", "gpu/dit-b2-r64", "gpu/llama-4096-decode-b1",
    "gpu/llama-4096-decode-b32", "gpu/llama-4096-prefill2048", "gpu/whisper-base-encoder",
    "gpu/whisper-small-encoder", "gpu/resnet18-b1", "gpu/resnet18-b32", "gpu/user-decoder-h128-l64",
    "gpu/user-decoder-h4096-l4", "gpu/user-decoder-ln-h512-l16", "gpu/conv-stack-b8-r64"} | {
    f"cpu/tiny-decoder-h{h}-l{n}" for h in (128, 256) for n in (16, 32)} | {
    f"cpu/{s}-{k}" for s in ("llama-mini", "qwen-mini", "gemma-mini") for k in ("decode", "prefill128")} | {
    "cpu/unet-r16", "cpu/unet-r32", "cpu/dit-r16", "cpu/dit-r32", "cpu/llama-1024-decode-b1",
    "cpu/llama-1024-decode-b8", "cpu/llama-1024-prefill256", "cpu/whisper-tiny-encoder", "cpu/resnet-w32-b1",
    "cpu/resnet-w32-b4", "cpu/user-decoder-h128-l16", "cpu/conv-stack-b1-r32"}

# Issue #16's families (and the ones before it), on both devices.
FAMILIES = {"tiny-decoder", "llama-3.2-1b", "qwen2.5-0.5b", "gemma-2b", "gemma2", "phi-3", "gpt2", "opt", "mistral-sw",
            "llama-4096", "bert", "roberta", "deberta-v2", "t5-encoder", "clip-text", "vit", "convnext", "resnet",
            "resnet-50", "mobilenetv3", "efficientnet", "clip-vision", "unet", "dit", "whisper-encoder", "wav2vec2",
            "mamba", "user-decoder", "conv-stack"}


def test_matrix_is_wide_and_keeps_its_old_names():
    gpu, cpu = configs.select("cuda"), configs.select("cpu")
    assert len(gpu) >= 40 and len(cpu) >= 25
    assert OLD_NAMES <= {c.name for c in configs.MATRIX}, OLD_NAMES - {c.name for c in configs.MATRIX}
    assert len(OLD_NAMES) == 49   # 27 GPU, 22 CPU
    for device, sel in (("cuda", gpu), ("cpu", cpu)):
        assert {c.family for c in sel} == FAMILIES, (device, {c.family for c in sel} ^ FAMILIES)
        assert {c.category for c in sel} == set(configs.CATEGORIES), device
        for fam in FAMILIES:
            sizes = {json.dumps(c.params, sort_keys=True) for c in sel if c.family == fam}
            assert len(sizes) >= 2, (device, fam, sizes)
        for c in sel:
            assert set(c.est) >= {"build", "export", "compile", "step"} and all(v > 0 for v in c.est.values()), c.name
            assert c.builder in workloads.BUILDERS, c.name


def test_mistral_configurations_slide_their_window():
    """A sliding window only matters past it: the decode starts beyond the window, the prefill is longer."""
    mistral = [c for c in configs.MATRIX if c.family == "mistral-sw"]
    assert len(mistral) == 4
    for c in mistral:
        window = workloads.HF_SHAPES[c.params["shape"]][1]["sliding_window"]
        p = c.params
        reach = p.get("start", 0) + p["tokens"]
        assert reach > window and reach <= p["cache"], c.name


def test_every_configuration_builds_at_small_size_and_runs_eagerly():
    """Each configuration's own builder, with workloads.small_params (same classes, narrow sizes), on
    the CPU in float32: it builds, its first step runs, and the output is finite."""
    for c in configs.MATRIX:
        p = workloads.small_params(c)
        assert set(p) >= set(c.params) - {"narrow"}, c.name
        wl = workloads.build(c.builder, p, "cpu", "float32")
        assert len(wl.steps) >= 2 and wl.description, c.name
        out = measure.call(wl.model, wl.steps[0])
        leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        assert leaves and all(torch.isfinite(t).all() for t in leaves), c.name


def _distinct_builders() -> list[Config]:
    seen, out = set(), []
    for c in configs.MATRIX:
        key = (c.builder, c.params.get("shape"), c.params.get("arch"), c.params.get("tokens", 0) > 1,
               "start" in c.params)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("config", _distinct_builders(), ids=lambda c: c.name)
def test_every_builder_exports_and_matches_eager(config):
    """Each distinct builder and shape of the matrix (small params) through ostinato.export, compiled
    for the CPU, replayed: the same output as eager (the GPU configurations' builders too, in float32)."""
    import ostinato
    wl = workloads.build(config.builder, workloads.small_params(config), "cpu", "float32")
    initial = {n: b.detach().clone() for n, b in wl.model.named_buffers()}
    refs = [measure.snapshot(measure.call(wl.model, wl.steps[i])) for i in range(2)]
    with torch.no_grad():
        for n, b in wl.model.named_buffers():
            b.copy_(initial[n])
    args, kwargs = wl.steps[0]
    exe = ostinato.compile(ostinato.export(wl.model, args, kwargs, **wl.export_options), device="cpu", replay=True)
    for i in range(2):
        assert measure.max_error(measure.snapshot(measure.call(exe, wl.steps[i])), refs[i]) <= 1e-4, (config.name, i)


def test_runners_by_device_and_estimates_count_the_peers():
    gpu, cpu = configs.by_name("gpu/bert-base-b1-s128"), configs.by_name("cpu/bert-mini-b1-s64")
    assert {"aoti", "aoti_cuda_graph", "cuda_graph_eager"} <= set(configs.runners_for(gpu))
    assert "executorch_xnnpack" not in configs.runners_for(gpu)
    assert {"aoti", "executorch_xnnpack"} <= set(configs.runners_for(cpu))
    assert not {"aoti_cuda_graph", "cuda_graph_eager"} & set(configs.runners_for(cpu))
    assert not {"aoti", "aoti_cuda_graph", "torch_compile"} & set(configs.QUICK_RUNNERS)
    base = ["eager", "ostinato_replay"]
    for c in (gpu, cpu):
        peer = configs.peer_seconds(c)
        assert configs.estimate_seconds(c, base + ["aoti"], False) == pytest.approx(
            configs.estimate_seconds(c, base, False) + peer["aoti"] + 10 + c.est["build"]
            + 8 * c.est["step"] + max(0.5, 10 * c.est["step"]) + 1)
    with_et = configs.estimate_seconds(cpu, base + ["executorch_xnnpack"], True)
    assert with_et > configs.estimate_seconds(cpu, base, True) + configs.peer_seconds(cpu)["lower"]


def test_startup_representatives_cover_every_category_once_per_device():
    reps = [configs.by_name(n) for n in configs.STARTUP_REPRESENTATIVES]
    for device in ("cuda", "cpu"):
        cats = [c.category for c in reps if c.device == device]
        assert sorted(cats) == sorted(configs.CATEGORIES), device
    rep, other = configs.by_name("gpu/resnet50-b1"), configs.by_name("gpu/resnet50-b32")
    assert configs.wants_startup(rep, True, False, "representative")
    assert not configs.wants_startup(other, True, False, "representative")
    assert not configs.wants_startup(rep, False, False, "representative")


# ---- peers' runners: failures recorded, results measured ------------------------------------------------

class DataDependent(nn.Module):
    """Branches on a tensor's value: torch.export (AOTInductor's and ExecuTorch's first step) refuses it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x) if x.sum() > 0 else -self.lin(x)


def _data_dependent(p, device, dtype):
    steps = [((torch.rand(2, 8) + 0.1,), {}) for _ in range(2)]
    return workloads.Workload(DataDependent().eval(), steps, description="a branch on x.sum() > 0")


def test_failing_peers_are_recorded_with_their_error(tmp_path):
    """The peers make their files in fresh processes (a crash there fails the cell, not the run); an
    export error there becomes the cell's error, its first line, and the runner is not retried here."""
    cfg = Config("cpu/test-data-dependent", "user-written", "test", "tests.bench.test_suite_matrix:_data_dependent",
                 {}, "cpu", "float32", configs._est(0.1, 1, 5, 0.001))
    doc = run_suite([cfg], ["eager", "aoti", "executorch_xnnpack"], with_startup=False, workdir=str(tmp_path),
                    timing=FAST)
    cells = doc["configs"][0]["cells"]
    assert cells["eager"]["status"] == "ok"
    for name in ("aoti", "executorch_xnnpack"):
        assert cells[name]["status"] == "error" and "mean_ms" not in cells[name], cells[name]
        assert "\n" not in cells[name]["error"] and len(cells[name]["error"]) <= 340
    # torch.export's own words for a data-dependent branch, first line only, from the cold process
    assert cells["aoti"]["error"].startswith("RuntimeError: AOTInductor package failed in the cold-start process: ")
    assert "data-dependent" in cells["aoti"]["error"].lower(), cells["aoti"]["error"]
    assert "ExecuTorch program failed in the cold-start process" in cells["executorch_xnnpack"]["error"]
    st = doc["configs"][0]["startup"]
    assert set(st) == {"aoti_cold", "aoti_warm", "executorch_cold", "executorch_warm"}   # no ostinato, no start-up asked
    assert st["aoti_warm"]["error"] == "no .pt2 package: the cold process failed"
    paths = report.write(doc, str(tmp_path / "out"))
    saved = json.loads(open(paths["json"]).read())
    assert {f["runner"] for f in saved["failures"]} == {"aoti", "executorch_xnnpack", "aoti_cold", "aoti_warm",
                                                        "executorch_cold", "executorch_warm"}
    row = next(line for line in open(paths["markdown"]).read().splitlines()
               if line.startswith("| cpu/test-data-dependent |"))
    assert row.count("failed: ") == 2 and cells["aoti"]["error"][:40] in row


@pytest.mark.slow
def test_peers_measured_and_started_in_fresh_processes(tmp_path):
    """AOTInductor and ExecuTorch on a small CPU configuration: checked against eager, timed, and their
    cold (export, compile or lower, save, load, first output) and warm (load, first output) processes;
    the in-process runners load the files the cold processes made."""
    cfg = Config("cpu/test-mobilenet", "vision", "mobilenetv3", "mobilenet-v3", {"arch": "small", "batch": 1, "res": 32},
                 "cpu", "float32", configs._est(0.1, 1, 5, 0.001))
    doc = run_suite([cfg], ["eager", "aoti", "executorch_xnnpack"], with_startup=True, workdir=str(tmp_path),
                    timing=FAST)
    rec = doc["configs"][0]
    for name, made in (("aoti", "compile_s"), ("executorch_xnnpack", "lower_s")):
        cell = rec["cells"][name]
        assert cell["status"] == "ok", cell
        assert 0 <= cell["max_error"] <= measure.TOLERANCE["float32"] and cell["mean_ms"] > 0
        assert cell[made] > 0 and cell["export_s"] > 0
        assert "cold-start" in cell.get("compiled_in", cell.get("lowered_in", ""))
    st = rec["startup"]
    for peer in ("aoti", "executorch"):
        cold, warm = st[f"{peer}_cold"], st[f"{peer}_warm"]
        assert cold["status"] == "ok" and warm["status"] == "ok", st
        assert 0 < cold["export_s"] < cold["total_s"] < cold["process_s"]
        assert 0 < warm["load_s"] <= warm["total_s"] < warm["process_s"]
    assert rec["cells"]["executorch_xnnpack"]["delegate_calls"] >= 1   # XNNPACK took part of the graph
    work = tmp_path / "cpu_test-mobilenet"
    assert (work / "model.ost").exists()                                  # ostinato's, kept as before
    assert not any((work / f).exists() for f in ("model.pt2", "model.pte", "inprocess"))   # each holds the weights
    text = report.markdown(report.finish(doc))
    assert "| aoti_cold | aoti_warm | executorch_cold | executorch_warm |" in text


# ---- the report on synthetic records ----------------------------------------------------------------------

def _rec(name: str, category: str, cells: dict) -> dict:
    out = {}
    for runner, v in cells.items():
        out[runner] = {"status": "ok", "mean_ms": v} if isinstance(v, float) else v
    return {"config": {"name": name, "category": category}, "cells": out}


def _doc(recs: list[dict]) -> dict:
    return {"device": "test", "date": "2026-01-01", "versions": {"torch": "x", "python": "3", "ostinato": "0"},
            "method": {"trials": 10, "warmups": 5, "memory": "none"}, "wall_s": 1.0, "configs": recs}


def test_geometric_means_per_category_and_overall():
    doc = report.finish(_doc([
        _rec("a", "encoder", {"eager": 2.0, "aoti": 0.5, "ostinato_replay": 1.0}),
        _rec("b", "encoder", {"eager": 8.0, "aoti": 2.0, "ostinato_replay": 1.0}),
        _rec("c", "vision", {"eager": 3.0, "aoti": {"status": "error", "error": "RuntimeError: boom"},
                             "ostinato_replay": 1.5}),
        _rec("d", "vision", {"eager": 1.0, "ostinato_replay": {"status": "wrong", "max_error": 1.0, "tolerance": 1e-4}}),
    ]))
    sp = doc["speedups"]
    enc = sp["categories"]["encoder"]
    assert enc["eager"]["geomean"] == pytest.approx(4.0)              # sqrt(2 * 8)
    assert enc["aoti"]["geomean"] == pytest.approx(1.0)               # sqrt(0.5 * 2)
    assert (enc["aoti"]["min"], enc["aoti"]["max"], enc["aoti"]["n"]) == (0.5, 2.0, 2)
    vis = sp["categories"]["vision"]
    assert vis["eager"] == {"geomean": pytest.approx(2.0), "n": 1, "min": 2.0, "max": 2.0}   # d: replay wrong
    assert "aoti" not in vis                                           # c: aoti failed
    assert sp["overall"]["eager"]["geomean"] == pytest.approx((2 * 8 * 2) ** (1 / 3))
    assert sp["overall"]["eager"]["n"] == 3 and sp["overall"]["aoti"]["n"] == 2
    assert list(sp["categories"]) == ["encoder", "vision"]            # CATEGORIES' order
    text = report.markdown(doc)
    assert "| encoder | 4.00x (n=2, 2.00-8.00) | 1.00x (n=2, 0.50-2.00) |" in text
    assert "| **overall** | 3.17x (n=3, 2.00-8.00) | 1.00x (n=2, 0.50-2.00) |" in text


def test_regressions_against_every_peer():
    doc = report.finish(_doc([
        _rec("vs_aoti", "vision", {"eager": 5.0, "aoti": 1.0, "aoti_cuda_graph": 2.5, "ostinato_replay": 2.0}),
        _rec("vs_et", "vision", {"eager": 5.0, "executorch_xnnpack": 1.6, "ostinato_replay": 2.0}),
        _rec("fine", "vision", {"eager": 5.0, "aoti": 3.0, "torch_compile": 2.1, "ostinato_replay": 2.0}),
    ]))
    got = {(r["config"], r["slower_than"]): r["ratio"] for r in doc["regressions"]}
    assert got == {("vs_aoti", "aoti"): pytest.approx(2.0), ("vs_et", "executorch_xnnpack"): pytest.approx(1.25)}
    assert "- vs_et: 2.000 ms vs executorch_xnnpack 1.600 ms (1.25x)" in report.markdown(doc)


def test_failed_cells_show_the_first_line_of_their_error():
    long = "RuntimeError: " + "x" * 200
    doc = report.finish(_doc([_rec("broken", "vision", {
        "eager": 1.0, "ostinato_replay": 0.5,
        "aoti": {"status": "error", "error": "RuntimeError: package crashed | at load\nsecond line"},
        "executorch_xnnpack": {"status": "error", "error": long}})]))
    doc["configs"][0]["startup"] = {"aoti_cold": {"status": "error", "error": "CalledProcessError: g++ failed"},
                                    "aoti_warm": {"status": "error", "error": "no .pt2 package: the cold process failed"},
                                    "ostinato_cold": {"status": "ok", "total_s": 1.25}}
    text = report.markdown(doc)
    row = next(line for line in text.splitlines() if line.startswith("| broken | 1.000 |"))
    assert "failed: RuntimeError: package crashed \\| at load |" in row and "second line" not in row
    assert "failed: RuntimeError: " + "x" * 103 + "... |" in row          # the line cut at 120 characters
    start = next(line for line in text.splitlines() if line.startswith("| broken | vision |"))
    assert start == ("| broken | vision | 1.25 | failed: CalledProcessError: g++ failed | "
                     "failed: no .pt2 package: the cold process failed |")
    assert {(f["runner"], f["status"]) for f in doc["failures"]} >= {("aoti", "error"), ("executorch_xnnpack", "error")}


def test_cold_start_cell_reports_the_deferred_kernel_compiles():
    """A cold ostinato process whose first output ran while compiles were in flight shows when they had all
    landed and their summed seconds; one without them (a CPU run) shows its seconds alone."""
    doc = report.finish(_doc([_rec("gpu-ish", "small-llm", {"eager": 2.0, "ostinato_replay": 1.0}),
                              _rec("cpu-ish", "small-llm", {"eager": 2.0, "ostinato_replay": 1.0})]))
    settled = {"kernels_compiled": 8, "kernel_compile_seconds": 21.25, "kernel_compiles_in_flight": 0}
    doc["configs"][0]["startup"] = {"ostinato_cold": {"status": "ok", "total_s": 7.125, "all_compiled_s": 19.5,
                                                      "kernels_settled": settled}}
    doc["configs"][1]["startup"] = {"ostinato_cold": {"status": "ok", "total_s": 1.5}}
    rows = {line.split(" | ")[0][2:]: line for line in report.markdown(doc).splitlines()
            if line.endswith("|") and " | small-llm | " in line}
    assert rows["gpu-ish"] == ("| gpu-ish | small-llm | 7.12 (kernels all compiled at 19.50: 8 compiled, "
                               "21.2 s summed) |")
    assert rows["cpu-ish"] == "| cpu-ish | small-llm | 1.50 |"


def test_merge_recomputes_the_means():
    a = _doc([_rec("one", "encoder", {"eager": 4.0, "ostinato_replay": 1.0})])
    b = _doc([_rec("two", "encoder", {"eager": 1.0, "ostinato_replay": 1.0})])
    merged = report.merge([report.finish(a), report.finish(b)])
    assert merged["speedups"]["categories"]["encoder"]["eager"]["geomean"] == pytest.approx(2.0)
    assert math.isclose(merged["speedups"]["overall"]["eager"]["max"], 4.0)


def test_merge_joins_the_runners_of_one_configuration_run_in_two_parts():
    """A configuration too long for one part runs its runners in two: the merge keeps both's cells."""
    a = _doc([_rec("long", "dispatch-heavy", {"eager": 6.0, "ostinato_replay": 2.0, "aoti": 9.0}),
              _rec("short", "dispatch-heavy", {"eager": 1.0, "ostinato_replay": 0.5})])
    b = _doc([_rec("long", "dispatch-heavy", {"aoti": 3.0, "aoti_cuda_graph": 1.0})])
    b["configs"][0]["startup"] = {"aoti_cold": {"status": "ok", "total_s": 100.0}}
    merged = report.merge([a, b])
    rec = next(r for r in merged["configs"] if r["config"]["name"] == "long")
    assert {r: (c["mean_ms"], c["part"]) for r, c in rec["cells"].items()} == {
        "eager": (6.0, 0), "ostinato_replay": (2.0, 0), "aoti": (3.0, 1), "aoti_cuda_graph": (1.0, 1)}
    assert rec["parts"] == [0, 1] and rec["startup"]["aoti_cold"]["total_s"] == 100.0
    short = next(r for r in merged["configs"] if r["config"]["name"] == "short")
    assert "parts" not in short and "part" not in short["cells"]["eager"]
    assert {(r["config"], r["slower_than"]) for r in merged["regressions"]} == {("long", "aoti_cuda_graph")}


def test_reduce_overhead_cell_comes_from_the_cold_process(tmp_path, monkeypatch):
    """With start-up figures, torch.compile reduce-overhead's cell is the cold process's (its compile is
    paid once), and the peers' cold and warm processes are asked for with the others."""
    from bench.suite import runners, startup
    asked = {}

    def fake_startup(cfg, workdir, steps, ref, timing, torch_compile, log, peers=(), ostinato=True):
        asked.update(torch_compile=torch_compile, peers=peers, ostinato=ostinato)
        return {"torch_compile_cold": {"status": "ok", "total_s": 9.0,
                                       "cell": {"status": "ok", "mean_ms": 1.5, "min_ms": 1.4, "max_ms": 1.6,
                                                "first_call_s": 8.0}}}
    made = []
    real = runners.make_runner

    def spy(name, *args, **kwargs):
        made.append(name)
        return real(name, *args, **kwargs)
    monkeypatch.setattr(startup, "measure_startup", fake_startup)
    monkeypatch.setattr(runners, "make_runner", spy)
    tiny = Config("cpu/test-tiny", "dispatch-heavy", "tiny-decoder", "tiny-decoder", {"hidden": 32, "layers": 1},
                  "cpu", "float32", configs._est(0.1, 1, 5, 0.001))
    doc = run_suite([tiny], ["eager", "torch_compile_ro"], with_startup=True, workdir=str(tmp_path), timing=FAST)
    cell = doc["configs"][0]["cells"]["torch_compile_ro"]
    assert cell["mean_ms"] == 1.5 and "cold-start" in cell["measured_in"]
    assert made == ["eager"] and asked == {"torch_compile": True, "peers": (), "ostinato": True}
