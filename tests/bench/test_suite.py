"""The benchmark suite (bench/suite): the matrix, the statistics, a tiny CPU configuration end to end
(eager, ostinato with and without replay; torch.compile is left out: too slow for a test), wrong
runners reported and not timed, regressions, parts, merging and the command line."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from bench.suite import configs, measure, report
from bench.suite.configs import Config
from bench.suite.run import run_suite

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = Config("cpu/test-tiny-decoder", "dispatch-heavy", "tiny-decoder", "tiny-decoder",
              {"hidden": 32, "layers": 2}, "cpu", "float32", configs._est(0.1, 1, 5, 0.001))
FAST = {"trial_seconds": 0.002}


def test_matrix_covers_every_category_and_family():
    assert len(configs.MATRIX) >= 40
    assert len({c.name for c in configs.MATRIX}) == len(configs.MATRIX)
    for device in ("cuda", "cpu"):
        mine = configs.select(device)
        assert {c.category for c in mine} == set(configs.CATEGORIES), device
        assert {c.family for c in mine} >= {"tiny-decoder", "llama-3.2-1b", "qwen2.5-0.5b", "gemma-2b", "unet",
                                            "dit", "llama-4096", "whisper-encoder", "resnet"}, device
    gpu = configs.select("cuda")
    tiny = {(c.params["hidden"], c.params["layers"]) for c in gpu if c.family == "tiny-decoder"}
    assert tiny == {(h, n) for h in (128, 256) for n in (32, 64, 128)}
    for fam in ("llama-3.2-1b", "qwen2.5-0.5b", "gemma-2b"):
        assert sorted(c.params["tokens"] for c in gpu if c.family == fam) == [1, 128], fam
    for fam in ("unet", "dit"):
        assert len({c.params["res"] for c in gpu if c.family == fam}) == 2, fam
    wide = [c.params for c in gpu if c.family == "llama-4096"]
    assert {(p["batch"], p["tokens"]) for p in wide} == {(1, 1), (32, 1), (1, 2048)}
    # bf16 on the GPU except Mamba (its bf16 eager reference is off its fp32 one by more than any check)
    assert all(c.dtype == ("float32" if c.family == "mamba" else "bfloat16") for c in gpu)
    assert {c.family for c in gpu if c.dtype == "float32"} == {"mamba"}
    assert all(c.dtype == "float32" for c in configs.select("cpu"))


def test_trimmed_stats_on_known_numbers():
    st = measure.trimmed_stats([10, 1, 2, 3, 4, 5, 6, 7, 8, 100])
    # 10% of 10 trials: the lowest (1) and the highest (100) are dropped before the mean.
    assert st["mean"] == pytest.approx((2 + 3 + 4 + 5 + 6 + 7 + 8 + 10) / 8)
    assert (st["min"], st["max"], st["n"], st["trimmed"]) == (1, 100, 10, 2)
    assert measure.trimmed_stats([3.0, 5.0])["mean"] == 4.0    # too few to trim
    with pytest.raises(ValueError):
        measure.trimmed_stats([])


def test_max_error_scales_by_reference_and_rejects_mismatches():
    ref = torch.tensor([10.0, -20.0])
    assert measure.max_error(ref + torch.tensor([0.0, 2.0]), ref) == pytest.approx(0.1)
    assert measure.max_error(torch.tensor([0.5]), torch.tensor([0.25])) == pytest.approx(0.25)
    assert measure.max_error(torch.zeros(3), torch.zeros(2)) == float("inf")
    assert measure.max_error(torch.tensor([float("nan")]), torch.tensor([1.0])) == float("inf")
    assert measure.max_error((torch.tensor([1, 2]),), (torch.tensor([1, 3]),)) == float("inf")


def _wrong_runner(model, program, device, example):
    def step(*args, **kwargs):
        return model(*args, **kwargs) + 1e-2   # close, but far above fp32's tolerance
    return step


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    doc = run_suite([TINY], ["eager", "ostinato", "ostinato_replay"], with_startup=False,
                    workdir=str(tmp_path_factory.mktemp("work")), timing=FAST,
                    extra_runners={"wrong_by_design": _wrong_runner})
    out = tmp_path_factory.mktemp("out")
    return doc, report.write(doc, str(out))


def test_tiny_config_end_to_end(tiny_run):
    doc, paths = tiny_run
    with open(paths["json"]) as f:
        saved = json.loads(f.read(), parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert saved["device_type"] == "cpu" and saved["versions"]["torch"] == torch.__version__
    assert saved["date"] and saved["method"]["trials"] == 10 and saved["method"]["warmups"] == 5
    rec, = saved["configs"]
    assert rec["config"]["name"] == TINY.name and rec["wall_s"] > 0 and rec["nodes"] > 0
    for name in ("eager", "ostinato", "ostinato_replay"):
        cell = rec["cells"][name]
        assert cell["status"] == "ok", cell
        assert len(cell["trials_ms"]) == 10
        assert cell["min_ms"] <= cell["mean_ms"] <= cell["max_ms"]
        assert cell["min_ms"] == min(cell["trials_ms"]) and cell["wall_s"] > 0
        assert cell["peak_mem_bytes"] >= rec["model_bytes"] > 0
    for name in ("ostinato", "ostinato_replay"):   # checked against eager before timing
        assert 0 <= rec["cells"][name]["max_error"] <= measure.TOLERANCE["float32"]
    text = open(paths["markdown"]).read()
    assert "| configuration | eager | ostinato | ostinato_replay |" in text
    row = next(line for line in text.splitlines() if line.startswith(f"| {TINY.name} |"))
    assert f"{rec['cells']['eager']['mean_ms']:.3f}" in row and "x)" in row
    with open(paths["chart"], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image
    h, w, _ = matplotlib.image.imread(paths["chart"]).shape
    assert w > 500 and h > 100


def test_wrong_runner_is_reported_and_not_timed(tiny_run):
    doc, paths = tiny_run
    cell = doc["configs"][0]["cells"]["wrong_by_design"]
    assert cell["status"] == "wrong" and cell["max_error"] > cell["tolerance"]
    assert "mean_ms" not in cell and "trials_ms" not in cell
    assert {"config": TINY.name, "runner": "wrong_by_design", "status": "wrong"}.items() <= \
        next(f for f in doc["failures"] if f["runner"] == "wrong_by_design").items()


def test_failing_runner_is_recorded_not_raised(tmp_path):
    def broken(model, program, device, example):
        raise RuntimeError("capture failed: host sync in op aten.nonzero")
    doc = run_suite([TINY], ["eager"], with_startup=False, workdir=str(tmp_path), timing=FAST,
                    extra_runners={"broken": broken})
    cell = doc["configs"][0]["cells"]["broken"]
    assert cell["status"] == "error" and "host sync in op aten.nonzero" in cell["error"]
    assert doc["configs"][0]["cells"]["eager"]["status"] == "ok"


class _RaisesOnSecondStep(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        if self.calls.item() > 1:
            raise RuntimeError("The expanded size of the tensor (256) must match the existing size (2)")
        return x * 2


def broken_eager_builder(params, device, dtype):
    """A workload whose model's own second eager step fails (transformers 5.17's BLOOM over a static cache)."""
    from bench.suite.workloads import Workload
    return Workload(_RaisesOnSecondStep(), [((torch.randn(3),), {}) for _ in range(2)], description="raises")


def test_a_model_whose_eager_steps_fail_fails_its_row_not_the_run(tmp_path):
    bad = Config("cpu/test-broken-eager", "user-written", "test", "tests.bench.test_suite:broken_eager_builder",
                 {}, "cpu", "float32", configs._est(0.1, 1, 1, 0.001))
    doc = run_suite([bad, TINY], ["eager", "ostinato_replay"], with_startup=False, workdir=str(tmp_path),
                    timing=FAST)
    first, second = doc["configs"]
    assert first["error"].startswith("eager reference failed:") and "expanded size" in first["error"]
    assert first["cells"] == {}
    assert second["cells"]["ostinato_replay"]["status"] == "ok"     # the run went on
    failures = report.finish(doc)["failures"]
    assert any(f["config"] == "cpu/test-broken-eager" and "expanded size" in f["detail"] for f in failures)
    assert "cpu/test-broken-eager" in report.markdown(doc)


def _doc(rows: dict[str, dict[str, float]]) -> dict:
    return {"device": "test", "date": "2026-01-01", "versions": {"torch": "x", "python": "3", "ostinato": "0"},
            "method": {"trials": 10, "warmups": 5, "memory": "none"}, "wall_s": 1.0,
            "configs": [{"config": {"name": name}, "cells": {r: {"status": "ok", "mean_ms": ms} for r, ms in cells.items()}}
                        for name, cells in rows.items()]}


def test_regressions_flag_replay_slower_than_eager_or_reduce_overhead():
    doc = report.finish(_doc({"fast": {"eager": 10.0, "torch_compile_ro": 2.0, "ostinato_replay": 1.5},
                              "slow_vs_ro": {"eager": 10.0, "torch_compile_ro": 2.0, "ostinato_replay": 2.5},
                              "slow_vs_eager": {"eager": 1.0, "ostinato_replay": 1.2}}))
    got = {(r["config"], r["slower_than"]) for r in doc["regressions"]}
    assert got == {("slow_vs_ro", "torch_compile_ro"), ("slow_vs_eager", "eager")}
    r = next(r for r in doc["regressions"] if r["config"] == "slow_vs_ro")
    assert r["ratio"] == pytest.approx(1.25)
    assert "- slow_vs_ro: 2.500 ms vs torch_compile_ro 2.000 ms (1.25x)" in report.markdown(doc)


def test_parts_cover_the_matrix_exactly_once():
    for device in ("cuda", "cpu"):
        sel = configs.select(device)
        cost = lambda c: configs.estimate_seconds(c, list(configs.RUNNERS), True)   # noqa: E731
        for n in (1, 2, 3, 7, len(sel)):
            parts = configs.split_parts(sel, n, cost)
            names = [c.name for p in parts for c in p]
            assert sorted(names) == sorted(c.name for c in sel) and len(names) == len(set(names))
        n = configs.parts_needed(sel, cost)
        for p in configs.split_parts(sel, n, cost):
            assert len(p) == 1 or sum(map(cost, p)) <= configs.PART_BUDGET_S
    quick = configs.select("cuda", quick=True)
    assert {c.category for c in quick} >= {"dispatch-heavy", "small-llm", "diffusion", "gpu-bound"}
    est = sum(configs.estimate_seconds(c, list(configs.QUICK_RUNNERS), configs.wants_startup(c, True, True))
              for c in quick)
    assert est <= configs.QUICK_BUDGET_S


def test_measured_costs_replace_estimates(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"configs": [{"config": {"name": "gpu/resnet18-b1"}, "wall_s": 12.5}]}))
    measured = configs.load_measured([str(path)])
    c = configs.by_name("gpu/resnet18-b1")
    assert configs.estimate_seconds(c, list(configs.RUNNERS), True, measured) == 12.5
    assert configs.estimate_seconds(c, list(configs.RUNNERS), True) != 12.5


def test_merge_parts(tmp_path):
    a = _doc({"one": {"eager": 1.0, "ostinato_replay": 2.0}})
    b = _doc({"two": {"eager": 4.0, "ostinato_replay": 1.0}})
    merged = report.merge([a, b])
    assert [r["config"]["name"] for r in merged["configs"]] == ["one", "two"]
    assert [r["config"] for r in merged["regressions"]] == ["one"]
    assert len(merged["parts"]) == 2 and merged["wall_s"] == 2.0
    for i, d in enumerate((a, b)):
        (tmp_path / f"p{i}").mkdir()
        report.write(d, str(tmp_path / f"p{i}"))
    from ostinato.cli.main import main
    assert main(["bench", "--merge", str(tmp_path / "p0" / "results.json"), str(tmp_path / "p1" / "results.json"),
                 "--out", str(tmp_path / "merged")]) == 0
    got = json.loads((tmp_path / "merged" / "results.json").read_text())
    assert [r["config"]["name"] for r in got["configs"]] == ["one", "two"]
    assert "| two | 4.000 | 1.000 (4.00x) |" in (tmp_path / "merged" / "results.md").read_text()


def test_cli_help_list_and_bad_part(capsys):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    p = subprocess.run([sys.executable, "-m", "ostinato", "bench", "--help"], capture_output=True, text=True,
                       env=env, cwd="/")
    assert p.returncode == 0, p.stderr
    for opt in ("--device", "--quick", "--part", "--configs", "--runners", "--no-startup", "--out", "--merge"):
        assert opt in p.stdout
    from ostinato.cli.main import main
    assert main(["bench", "--device", "cpu", "--list", "--part", "2/4"]) == 0
    listed = capsys.readouterr().out
    assert "cpu/" in listed and "gpu/" not in listed
    assert main(["bench", "--device", "cpu", "--part", "5/4"]) == 2
    assert "--part 5/4" in capsys.readouterr().err


def test_startup_in_fresh_processes(tmp_path):
    """ostinato cold (export, save, compile, first output) and warm (load the .ost, the cache the cold
    process filled) in their own processes; no torch.compile runner, so no torch.compile processes."""
    doc = run_suite([TINY], ["eager", "ostinato_replay"], with_startup=True, workdir=str(tmp_path), timing=FAST)
    st = doc["configs"][0]["startup"]
    assert set(st) == {"ostinato_cold", "ostinato_warm"}
    cold, warm = st["ostinato_cold"], st["ostinato_warm"]
    assert cold["status"] == "ok" and warm["status"] == "ok", st
    assert 0 < cold["export_s"] < cold["total_s"] < cold["process_s"]
    assert 0 < warm["load_s"] < warm["total_s"] < warm["process_s"]
    assert (tmp_path / "cpu_test-tiny-decoder" / "model.ost").stat().st_size > 0
    assert warm["cache"]["disk"]["hits"] >= 1, warm["cache"]   # the plan came from the cold process's cache


def test_fp32_tolerance_is_wider_on_cuda_only():
    """On CUDA an fp32 check allows 1e-3 (correct runners differ by more there), on the CPU 1e-4; the other
    dtypes are the same on both."""
    assert measure.tolerance("float32", "cpu") == 1e-4 and measure.tolerance("float32", "cuda") == 1e-3
    for dt in ("bfloat16", "float16"):
        assert measure.tolerance(dt, "cuda") == measure.tolerance(dt, "cpu") == measure.TOLERANCE[dt]


def test_float32_runner_judged_against_float64_when_eager_is_off_too():
    """A float32 runner further than the tolerance from eager is right when it is at most 2x as far from
    the float64 outputs as eager is (an ill-conditioned model: Mamba's scan), and wrong beyond; a
    reference without float64 outputs, or one whose float64 run fails, keeps the plain check."""
    g = torch.Generator().manual_seed(0)
    exact = torch.rand(4, 8, generator=g, dtype=torch.float64) - 0.5     # |ref| < 1: errors unscaled
    noise = torch.randn(4, 8, generator=g, dtype=torch.float64).sign() * 1e-3
    eager = (exact + noise).float()
    steps = [((), {})]

    def cell_of(out, exact_fn):
        ref = measure.Reference([eager], 1e-4, exact_fn)
        cell, fn = measure.prepare_cell(lambda: (lambda: out), steps, ref, torch.device("cpu"), 0, warmups=1)
        return cell, fn

    calls = []

    def exact_fn():
        calls.append(1)
        return [exact]
    near = (exact - 0.5 * noise).float()          # 1.5e-3 from eager, 0.5e-3 from float64: right
    cell, fn = cell_of(near, exact_fn)
    assert fn is not None and cell["max_error"] > 1e-4
    assert cell["float64_error"] == pytest.approx(5e-4, rel=1e-3)
    assert cell["eager_float64_error"] == pytest.approx(1e-3, rel=1e-3)
    far = (exact - 2.5 * noise).float()           # 2.5e-3 from float64, more than twice eager's 1e-3: wrong
    cell, fn = cell_of(far, exact_fn)
    assert fn is None and cell["status"] == "wrong" and cell["float64_check"].startswith("wrong")
    cell, fn = cell_of(near, None)
    assert fn is None and cell["status"] == "wrong" and "float64_error" not in cell

    def broken():
        raise RuntimeError("index_copy_(): self and source expected to have the same dtype")
    cell, fn = cell_of(near, broken)
    assert fn is None and "float64 reference failed" in cell["float64_check"] and "same dtype" in cell["float64_check"]
    cell, fn = cell_of(eager, exact_fn)           # within the tolerance: float64 never computed
    assert fn is not None and "float64_check" not in cell
    assert len(calls) == 2                        # one Reference each time it was needed

    # tensor by tensor: eager exact on the first output and 1e-3 off on the second cannot excuse a
    # runner 1.8e-3 off on the first
    a, b = exact, exact.flip(0)
    ref = measure.Reference([(a.float(), (b + noise).float())], 1e-4, lambda: [(a, b)])
    cell, fn = measure.prepare_cell(lambda: (lambda: ((a + 1.8 * noise).float(), b.float())), steps, ref,
                                    torch.device("cpu"), 0, warmups=1)
    assert fn is None and cell["status"] == "wrong" and cell["float64_check"].startswith("wrong")
    cell, fn = measure.prepare_cell(lambda: (lambda: (a.float(), (b - 0.5 * noise).float())), steps, ref,
                                    torch.device("cpu"), 0, warmups=1)
    assert fn is not None and cell["float64_check"].startswith("right")


def test_row_slack_allows_only_that_many_sequences_apart():
    """A mixture of experts' configuration may route a few sequences apart: a runner whose rows all meet
    the tolerance but ``row_slack`` of them is right (the count recorded); one more row apart, or a small
    error spread over every row, is wrong; without slack the plain check holds."""
    g = torch.Generator().manual_seed(1)
    eager = [torch.randn(8, 1, 32, generator=g, dtype=torch.bfloat16) for _ in range(2)]
    steps = [((), {})]

    def cell_of(outs, slack):
        it = iter([outs[0]] + outs * 4)       # the first call's output, then the check steps'
        ref = measure.Reference(eager, 5e-2, row_slack=slack)
        return measure.prepare_cell(lambda: (lambda: next(it)), steps, ref, torch.device("cpu"), 0, warmups=1)

    def apart(rows, step=0, by=1.0):
        outs = [e.clone() for e in eager]
        outs[step][rows] += by
        return outs
    cell, fn = cell_of(apart([3]), 1)
    assert fn is not None and cell["rows_missed"] == 1 and cell["max_error"] > 5e-2
    cell, fn = cell_of([apart([3])[0], apart([3], 1)[1]], 1)    # the same sequence in both steps: one
    assert fn is not None and cell["rows_missed"] == 1
    cell, fn = cell_of([apart([3])[0], apart([5], 1)[1]], 1)    # two sequences
    assert fn is None and cell["status"] == "wrong" and cell["rows_missed"] == 2
    cell, fn = cell_of(apart([3]), 0)
    assert fn is None and cell["status"] == "wrong" and "rows_missed" not in cell
    cell, fn = cell_of(apart(slice(None), by=0.3), 2)            # every row off: no slack excuses it
    assert fn is None and cell["rows_missed"] == 8
    assert measure.rows_missed([eager[0][:4]], [eager[0]], 5e-2) == math.inf          # another shape
    nan = eager[0].clone()
    nan[2, 0, 0] = float("nan")
    cell, fn = cell_of([nan, eager[1]], 4)                                   # a row not finite: never excused
    assert fn is None and cell["rows_missed"] == math.inf
    ids = torch.arange(8)
    assert measure.rows_missed([(eager[0], ids + 1)], [(eager[0], ids)], 5e-2) == math.inf   # integers differ
    assert measure.rows_missed([(eager[0],)], [(eager[0], ids)], 5e-2) == math.inf          # a result missing
    assert measure.rows_missed([torch.tensor(3.0)], [torch.tensor(1.0)], 5e-2) == math.inf


def test_float64_outputs_of_a_copy_leave_the_model_alone(monkeypatch):
    # as torch.backends.disable_global_flags() (torch's OpInfo tests) leaves it: flags only through flags()
    monkeypatch.setitem(torch.backends.flags_frozen.__globals__, "__allow_nonbracketed_mutation_flag", False)
    assert torch.backends.flags_frozen()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()).eval()
    x = torch.randn(2, 8)
    outs = measure.float64_outputs(model, [((x,), {})], n=2)
    assert len(outs) == 2 and outs[0].dtype == torch.float64
    assert next(model.parameters()).dtype == torch.float32
    torch.testing.assert_close(outs[0].float(), model(x).detach(), rtol=1e-5, atol=1e-6)


def test_a_crashed_child_is_reported_where_it_died(monkeypatch, tmp_path):
    """A fresh process that dies of a signal (as AOTInductor's cold process does on the lent GPU) is
    reported with faulthandler's innermost frames, which the suite's environment turns on, and the tail
    of its stderr is kept for the JSON."""
    from bench.suite import startup
    crash = "import ctypes\nimport sys\ndef deepest():\n    ctypes.string_at(0)\ndef outer():\n    deepest()\n" \
            "print('about to crash', file=sys.stderr)\nouter()\n"
    real = subprocess.run
    monkeypatch.setattr(startup.subprocess, "run", lambda cmd, **kw: real([sys.executable, "-c", crash], **kw))
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")    # as startup._env makes it
    res = startup.run_child("aoti_cold", TINY, str(tmp_path), env)
    assert res["status"] == "error" and res["returncode"] < 0, res
    assert res["error"] == "the process died of SIGSEGV in string_at (__init__.py:{0}) < deepest (<string>:4) " \
                           "< outer (<string>:6)".format(res["error"].split("__init__.py:")[1].split(")")[0]), res
    assert "about to crash" in res["stderr_tail"] and len(res["stderr_tail"]) <= startup.STDERR_LINES
    # without faulthandler's report: the last line of stderr, as before
    res = startup.run_child("aoti_cold", TINY, str(tmp_path), dict(env, PYTHONFAULTHANDLER=""))
    assert res["error"] == "the process died of SIGSEGV; its last words: about to crash", res
    assert startup.crash_site("Current thread 0x1 (most recent call first):\n  <no Python frame>\n") is None
    assert startup._env()["PYTHONFAULTHANDLER"] == "1"


def test_a_failed_aoti_probe_fails_every_aoti_cell_without_a_cold_process(monkeypatch, tmp_path):
    """Where AOTInductor cannot load even a small MLP's package (bench/aoti_probe.py dies in a fresh
    process, as on the lent GPU), a configuration's AOTInductor cold and warm cells say so and no cold
    process runs for it; the probe runs once per device; OSTINATO_SUITE_AOTI_PROBE=0 turns it off."""
    from bench.suite import startup
    crash = "import ctypes\nctypes.string_at(0)\n"
    real, probes = subprocess.run, []

    def fake_run(cmd, **kw):     # the probe crashes; a child would be a real run: record it instead
        assert cmd[1].endswith("aoti_probe.py"), cmd
        probes.append(cmd[2])
        return real([sys.executable, "-c", crash], **kw)

    ran = []
    monkeypatch.setattr(startup.subprocess, "run", fake_run)
    monkeypatch.setattr(startup, "run_child", lambda mode, *a, **k: ran.append(mode) or {"status": "ok", "total_s": 1.0})
    monkeypatch.setattr(startup, "write_io", lambda *a, **k: None)
    monkeypatch.setattr(startup, "_PROBES", {})
    monkeypatch.setenv("OSTINATO_SUITE_AOTI_PROBE", "1")
    for _ in range(2):
        out = startup.measure_startup(TINY, str(tmp_path / "cfg"), [], None, {}, torch_compile=False,
                                      log=lambda s: None, peers=("aoti",), ostinato=False)
        assert out["aoti_cold"]["status"] == "error" and out["aoti_cold"]["returncode"] < 0
        assert out["aoti_cold"]["error"].startswith(
            f"not run: AOTInductor fails in this environment: bench/aoti_probe.py {TINY.device} (a small MLP): "
            "the process died of SIGSEGV"), out["aoti_cold"]
        assert out["aoti_warm"]["error"] == "no .pt2 package: the cold process failed"
    assert probes == [TINY.device] and ran == []
    monkeypatch.setenv("OSTINATO_SUITE_AOTI_PROBE", "0")
    out = startup.measure_startup(TINY, str(tmp_path / "cfg"), [], None, {}, torch_compile=False,
                                  log=lambda s: None, peers=("aoti",), ostinato=False)
    assert ran == ["aoti_cold", "aoti_warm"] and out["aoti_cold"]["status"] == "ok"


def test_the_aoti_probe_passes_where_aotinductor_works(monkeypatch, tmp_path):
    """The real probe, in a fresh process, on this machine's CPU: AOTInductor packages, loads and runs a
    small MLP here (torch 2.13), so the gate lets every configuration run its own cold process."""
    from bench.suite import startup
    monkeypatch.setattr(startup, "_PROBES", {})
    monkeypatch.setenv("OSTINATO_SUITE_AOTI_PROBE", "1")
    assert startup.aoti_probe("cpu", str(tmp_path)) is None
    assert startup._PROBES == {"cpu": None}
