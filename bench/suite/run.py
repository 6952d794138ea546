"""Running configurations: build the workload, take eager's reference outputs, export once, measure
the fresh-process start-up figures, then every runner in turn from the model's initial state."""
from __future__ import annotations

import gc
import os
import platform
import sys
import tempfile
import time
from typing import Any, Callable

import torch

from . import configs, measure, peers, runners, startup, workloads
from .configs import Config


def log(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def run_config(cfg: Config, runner_names: list[str], with_startup: bool, workdir: str,
               timing: dict | None = None, extra_runners: dict[str, Callable] | None = None) -> dict[str, Any]:
    """One configuration's record: its cells (runner -> result), start-up figures and wall time.
    ``extra_runners`` maps more names to ``make(model, program, device, example)`` (tests use it)."""
    t_start = time.perf_counter()
    timing = timing or {}
    device = torch.device(cfg.device)
    rec: dict[str, Any] = {"config": cfg.as_dict(), "cells": {}, "startup": {}}
    try:
        wl = workloads.build(cfg.builder, cfg.params, cfg.device, cfg.dtype)
    except Exception as e:
        rec.update(error=f"build failed: {measure.describe_error(e)}", wall_s=time.perf_counter() - t_start)
        return rec
    rec["description"], rec["model_bytes"] = wl.description, wl.model_bytes()
    restore = measure.restorer(wl.model)     # every runner starts from the model's initial caches
    try:   # a model whose own eager steps fail (a library version's bug) fails its row, not the run
        ref = measure.Reference([measure.snapshot(measure.call(wl.model, wl.steps[i % len(wl.steps)]))
                                 for i in range(measure.CHECK_STEPS)], measure.tolerance(cfg.dtype, cfg.device),
                                measure.float64_reference(wl.model, wl.steps, restore) if cfg.dtype == "float32" else None,
                                row_slack=int(cfg.params.get("row_slack", 0)))
    except Exception as e:
        rec.update(error=f"eager reference failed: {measure.describe_error(e)}", wall_s=time.perf_counter() - t_start)
        del wl, restore
        gc.collect()
        return rec
    restore()
    program = None
    if any(r.startswith("ostinato") for r in runner_names):
        import ostinato
        t0 = time.perf_counter()
        try:
            args, kwargs = wl.steps[0]
            program = ostinato.export(wl.model, args, kwargs, **wl.export_options)
            rec["export_s"] = time.perf_counter() - t0
            rec["nodes"] = program.num_nodes
        except Exception as e:
            rec["export_error"] = measure.describe_error(e)
        restore()
    tc_in_child = False
    cfg_dir = os.path.join(workdir, cfg.name.replace("/", "_"))
    if with_startup:
        tc = any(r.startswith("torch_compile") for r in runner_names)
        rec["startup"] = startup.measure_startup(cfg, cfg_dir, wl.steps, ref, timing, tc, log,
                                                 startup.peer_modes(runner_names))
        cold = rec["startup"].get("torch_compile_cold", {})
        if "torch_compile_ro" in runner_names and "cell" in cold:
            cell = dict(cold["cell"], measured_in="the cold-start process (first call with empty caches)")
            rec["cells"]["torch_compile_ro"] = cell
            tc_in_child = True
    elif startup.peer_modes(runner_names):
        # AOTInductor's package and ExecuTorch's program are always made, loaded and first run in
        # fresh processes before this one loads them: a package that crashes (as AOTInductor's did on
        # an H200) fails its cell instead of the whole run.
        rec["startup"] = startup.measure_startup(cfg, cfg_dir, wl.steps, ref, timing, False, log,
                                                 startup.peer_modes(runner_names), ostinato=False)
    # Every runner is built, checked and warmed up first; then their trials are interleaved, so the
    # ratios of one configuration are taken over the same stretch of the machine's time.
    live: dict[str, Callable] = {}
    context = peers.Context(cfg_dir, wl.export_options, rec["startup"])
    for name in runner_names:
        if name == "torch_compile_ro" and tc_in_child:
            log(f"    {name}: {_summary(rec['cells'][name])}")
            continue
        restore()
        if extra_runners and name in extra_runners:
            make = lambda: extra_runners[name](wl.model, program, device, wl.steps[0])   # noqa: E731
        else:
            make = lambda: runners.make_runner(name, wl.model, program, device, wl.steps[0], context)   # noqa: E731
        log(f"    {name} ...")
        cell, fn = measure.prepare_cell(make, wl.steps, None if name == "eager" else ref, device,
                                        rec["model_bytes"], **{k: v for k, v in timing.items() if k == "warmups"})
        rec["cells"][name] = cell
        if fn is None:
            log(f"    {name}: {_summary(cell)}")
        else:
            live[name] = fn
    if live:
        t0 = time.perf_counter()
        try:
            timed = measure.time_interleaved(live, wl.steps, device,
                                             **{k: v for k, v in timing.items() if k in ("trials", "trial_seconds")})
        except Exception as e:   # noqa: BLE001 - a runner failing while timed fails the timed cells, not the suite
            timed = {name: {"status": "error", "error": measure.describe_error(e)} for name in live}
        share = (time.perf_counter() - t0) / len(live)
        for name in live:
            cell = rec["cells"][name]
            cell.update(timed[name])
            cell["wall_s"] = cell.get("wall_s", 0.0) + share
            log(f"    {name}: {_summary(cell)}")
    live.clear()
    context.made.clear()
    for name in runner_names:
        runners.release(name)
    peers.remove_files(cfg_dir)   # a package holds the weights: GBs per configuration on the GPU
    del wl, program, restore
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    rec["wall_s"] = time.perf_counter() - t_start
    return rec


def _summary(cell: dict) -> str:
    if cell.get("status") == "ok":
        made = ", ".join(f"{k} {cell[k]:.1f} s" for k in ("export_s", "compile_s", "lower_s") if k in cell)
        return (f"{cell['mean_ms']:.3f} ms/step (min {cell['min_ms']:.3f}, max {cell['max_ms']:.3f}), "
                f"first call {cell['first_call_s']:.2f} s"
                + (f", {cell['kernels_per_step']} kernels/step" if "kernels_per_step" in cell else "")
                + (f" ({made})" if made else ""))
    if cell.get("status") == "wrong":
        return f"WRONG: max error {cell['max_error']:.3g} > {cell['tolerance']:.3g}, not timed"
    return f"error: {cell.get('error')}"


def environment(device: str) -> dict[str, Any]:
    """Device name and versions, for the report's header."""
    import ostinato
    versions = {"ostinato": ostinato.__version__, "torch": torch.__version__, "python": platform.python_version()}
    for mod in ("transformers", "triton"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:
            versions[mod] = None
    versions.update(peers.executorch_versions())
    env: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host": platform.node(),
                           "platform": platform.platform(), "versions": versions, "device_type": device,
                           "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
                           "torch_threads": torch.get_num_threads()}
    if device == "cuda":
        env["device"] = torch.cuda.get_device_name(0)
        versions["cuda"] = torch.version.cuda
    else:
        env["device"] = f"CPU ({env['cpu']}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"
    return env


def run_suite(selected: list[Config], runner_names: list[str] | None, with_startup: bool, quick: bool = False,
              workdir: str | None = None, timing: dict | None = None,
              extra_runners: dict | None = None, startup_only: str | None = None,
              checkpoint: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Every selected configuration, in order; the suite's JSON document (without the report parts).
    ``checkpoint`` receives the document after each configuration (so a run cut short keeps what it
    measured); ``startup_only`` limits the fresh-process figures to the configurations it matches."""
    workdir = workdir or tempfile.mkdtemp(prefix="ostinato-bench-")
    # This process's own compile caches are private to the run (the fresh processes get their own).
    os.environ.setdefault("OSTINATO_CACHE_DIR", os.path.join(workdir, "ostinato-cache"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(workdir, "inductor"))
    os.environ.pop("OSTINATO_REDIS_URL", None)
    device = selected[0].device if selected else "cpu"
    doc: dict[str, Any] = {"suite": "ostinato bench", **environment(device),
                           "method": {"warmups": measure.WARMUPS, "trials": measure.TRIALS, "trim": measure.TRIM, "interleaved": True,
                                      "trial_seconds": (timing or {}).get("trial_seconds", measure.TRIAL_SECONDS),
                                      "check_steps": measure.CHECK_STEPS, "tolerance": {**measure.TOLERANCE, "float32 on cuda": measure.CUDA_FP32_TOLERANCE},
                                      "memory": measure.MEMORY_METRIC[device],
                                      "runners": runners.DESCRIPTIONS},
                           "configs": []}
    t0 = time.perf_counter()
    for i, cfg in enumerate(selected):
        names = configs.runners_for(cfg, runner_names)
        if extra_runners:
            names += [n for n in extra_runners if n not in names]
        log(f"[{i + 1}/{len(selected)}] {cfg.name} ({cfg.category}, {cfg.dtype}): {', '.join(names)}")
        rec = run_config(cfg, names, configs.wants_startup(cfg, with_startup, quick, startup_only), workdir, timing,
                         extra_runners)
        log(f"    done in {rec['wall_s']:.1f} s")
        doc["configs"].append(rec)
        if checkpoint is not None:
            checkpoint(doc)
    doc["wall_s"] = time.perf_counter() - t0
    return doc
