"""One fresh-process measurement of time to first output (bench/startup.py's method, for any
configuration of the matrix): ``python -m bench.suite.child MODE CONFIG WORKDIR``; the last line of
stdout is a JSON object.

Clocks start after ``import torch``, CUDA initialisation and building the model (a fresh process of a
user has those too, whichever tool it uses); ``import ostinato`` and torch.compile's imports are inside
them. Modes:
  ostinato_cold        export, save the .ost to WORKDIR, compile(replay=True), first output; then, where
                       kernel compiles were still in flight, the wait for them (``all_compiled_s``) and
                       a second call, which takes up their binaries (``kernels_settled``: their count and
                       summed seconds)
  ostinato_cold_step   export, compile(replay=False), first output (ops whose kernels still compile in
                       worker processes run their torch references), then the time until every compile
                       is done and the step's kernels run, each output's error against eager
  ostinato_warm        load the .ost (verify="checksums") with the cache the cold process filled,
                       compile(replay=True), first output; no model is built
  torch_compile_cold   torch.compile(mode="reduce-overhead") first call with empty caches, then the
                       steady-state cell of that runner (outputs checked, trials), so its compile is
                       paid once per configuration
  torch_compile_warm   the same first call with the caches the cold process filled
  aoti_cold            torch.export, aoti_compile_and_package to WORKDIR/model.pt2 (empty caches),
                       aoti_load_package, first output
  aoti_warm            aoti_load_package of that file, first output; no model is built
  executorch_cold      torch.export, to_edge_transform_and_lower (XNNPACK), to_executorch, the .pte
                       saved to WORKDIR/model.pte, loaded by executorch.runtime, first output
  executorch_warm      the .pte loaded, first output; no model is built
The configuration, step inputs and eager's reference outputs come from WORKDIR/io.pt, the cache
directories from the environment the parent sets (bench/suite/startup.py).
"""
from __future__ import annotations

import json
import os
import sys
import time


def main(mode: str, name: str, workdir: str) -> dict:
    import torch
    from bench.suite import measure, workloads
    io = torch.load(os.path.join(workdir, "io.pt"), weights_only=True)
    cfg = io["config"]
    assert cfg["name"] == name, f"{workdir} holds {cfg['name']}, not {name}"
    device = torch.device(cfg["device"])
    if device.type == "cuda":
        torch.cuda.init()
        torch.empty(1, device=device)
        torch.cuda.synchronize()
    from torch.utils import _pytree as pytree
    to_dev = lambda x: x.to(device) if isinstance(x, torch.Tensor) else x   # noqa: E731
    steps = [(tuple(a), dict(kw)) for a, kw in pytree.tree_map(to_dev, io["steps"])]
    path = os.path.join(workdir, "model.ost")
    out: dict = {"mode": mode}
    if mode == "ostinato_warm":
        t0 = time.perf_counter()
        import ostinato
        prog = ostinato.load(path, verify="checksums")
        out["load_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        exe = ostinato.compile(prog, device=device, replay=True)
        out["compile_s"] = time.perf_counter() - t1
        _first_output(exe, steps[0], device, out, t0)
        out["phases"] = {**prog.timings, **{f"compile_{k}": v for k, v in exe.compile_timings.items()}}
        out["cache"] = ostinato.cache.stats()
        return out
    if mode in ("aoti_warm", "executorch_warm"):
        t0 = time.perf_counter()
        from bench.suite import peers
        if mode == "aoti_warm":
            fn = peers.aoti_load(os.path.join(workdir, peers.AOTI_FILE))
        else:
            fn = peers.executorch_load(os.path.join(workdir, peers.PTE_FILE))
        out["load_s"] = time.perf_counter() - t0
        return _first_output(fn, steps[0], device, out, t0)
    wl = workloads.build(cfg["builder"], cfg["params"], cfg["device"], cfg["dtype"])
    if mode in ("aoti_cold", "executorch_cold"):
        t0 = time.perf_counter()
        from bench.suite import peers
        if mode == "aoti_cold":
            path = os.path.join(workdir, peers.AOTI_FILE)
            out.update(peers.aoti_package(wl.model, wl.steps[0], wl.export_options, path))
            t1 = time.perf_counter()
            fn = peers.aoti_load(path)
        else:
            path = os.path.join(workdir, peers.PTE_FILE)
            out.update(peers.executorch_lower(wl.model, wl.steps[0], wl.export_options, path))
            t1 = time.perf_counter()
            fn = peers.executorch_load(path)
        out["load_s"] = time.perf_counter() - t1
        return _first_output(fn, steps[0], device, out, t0)
    if mode in ("ostinato_cold", "ostinato_cold_step"):
        t0 = time.perf_counter()
        import ostinato
        args, kwargs = wl.steps[0]
        prog = ostinato.export(wl.model, args, kwargs, **wl.export_options)
        out["export_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        prog.save(path)
        save_s = time.perf_counter() - t1
        exe = ostinato.compile(prog, device=device, replay=mode == "ostinato_cold")
        t2 = time.perf_counter()
        first = measure.call(exe, steps[0])
        measure.sync(device)
        out["first_output_s"] = time.perf_counter() - t2
        out["total_s"] = time.perf_counter() - t0 - save_s
        if mode == "ostinato_cold_step":
            ref = measure.Reference(pytree.tree_map(to_dev, io["refs"]), io["tolerance"])
            out["first_error"] = measure.max_error(measure.snapshot(first), ref.outputs[0])
            out["deferred_first_call"] = exe.stats().get("kernel_calls_deferred", 0)
            from ostinato.backends.cuda.compile_workers import wait_for_compiles
            wait_for_compiles()
            out["all_compiled_s"] = time.perf_counter() - t0 - save_s
            if len(ref.outputs) > 1:     # the next check step (from the state the first left)
                later = measure.call(exe, steps[1 % len(steps)])      # every kernel loaded now
                measure.sync(device)
                out["compiled_error"] = measure.max_error(later, ref.outputs[1])
        out["kernels"] = {k: v for k, v in exe.stats().items() if k.startswith("kernel")}
        if mode == "ostinato_cold" and out["kernels"].get("kernel_compiles_in_flight"):
            # the first output did not wait for the deferred compiles: their time, once they have landed
            # (summed over the workers, and the wall time from the export's start until the last landed)
            from ostinato.backends.cuda.compile_workers import wait_for_compiles
            wait_for_compiles()
            out["all_compiled_s"] = time.perf_counter() - t0 - save_s
            # a landed binary is counted (with its compile's seconds) where a call first takes it up
            measure.call(exe, steps[1 % len(steps)])
            measure.sync(device)
            out["kernels_settled"] = {k: v for k, v in exe.stats().items() if k.startswith("kernel")}
        return out
    if mode in ("torch_compile_cold", "torch_compile_warm"):
        def make():
            import torch._dynamo  # noqa: F401  (inside the clock: a user's process pays it)
            return torch.compile(wl.model, mode="reduce-overhead")
        if mode == "torch_compile_warm":
            t0 = time.perf_counter()
            fn = make()
            measure.call(fn, steps[0])
            measure.sync(device)
            out["total_s"] = time.perf_counter() - t0
            return out
        # as the parent's: a float32 runner's miss judged against float64
        exact = measure.float64_reference(wl.model, steps, measure.restorer(wl.model))
        ref = measure.Reference(pytree.tree_map(to_dev, io["refs"]), io["tolerance"],
                                exact if cfg["dtype"] == "float32" else None,
                                row_slack=int(cfg["params"].get("row_slack", 0)))
        cell = measure.measure_cell(make, steps, ref, device, wl.model_bytes(), **io["timing"])
        out["cell"] = cell
        if "first_call_s" in cell:
            out["total_s"] = cell["build_s"] + cell["first_call_s"]
        else:
            out["error"] = cell.get("error", "no first output")
        return out
    raise SystemExit(f"unknown mode {mode!r}")


def _first_output(fn, step, device, out: dict, t0: float) -> dict:
    """``out`` with the first call's time (``first_output_s``) and the total since ``t0``."""
    from bench.suite import measure
    t1 = time.perf_counter()
    measure.call(fn, step)
    measure.sync(device)
    out["first_output_s"] = time.perf_counter() - t1
    out["total_s"] = time.perf_counter() - t0
    return out


if __name__ == "__main__":
    try:
        result = main(*sys.argv[1:4])
    except Exception as e:   # noqa: BLE001 - the parent records the first line of the error
        from bench.suite.measure import describe_error
        result = {"mode": sys.argv[1], "error": describe_error(e)}
    sys.stdout.write("\n" + json.dumps(result) + "\n")
