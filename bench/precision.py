"""Which runner is closest to the exact result? For a suite configuration, each runner's outputs (the
suite's first CHECK_STEPS steps, from the model's initial state) against three references: eager as the
suite runs it (torch's defaults: cuDNN convolutions in TF32 on CUDA), eager with TF32 off everywhere,
and eager on a float64 copy of the model and its floating inputs. Errors are the suite's metric,
max |out - ref| / max(1, max |ref|). A runner the suite calls wrong because it is further than the
tolerance from TF32 eager, yet as close to float64 as eager is, is not less accurate than eager.

    PYTHONPATH=src python bench/precision.py gpu/mamba-130m-b8-t32 [--runners eager_exact,ostinato_replay,torch_compile_ro] --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from bench.suite import configs, measure, runners, workloads  # noqa: E402


def outputs(fn, steps, restore) -> list:
    restore()
    outs = [measure.snapshot(measure.call(fn, steps[i % len(steps)])) for i in range(measure.CHECK_STEPS)]
    restore()
    return outs


def worst(outs: list, refs: list) -> float:
    return max(measure.max_error(o, r) for o, r in zip(outs, refs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", help="a suite configuration's name, e.g. gpu/mamba-130m-b8-t32")
    ap.add_argument("--runners", default="ostinato_replay,torch_compile_ro")
    ap.add_argument("--json")
    a = ap.parse_args()
    cfg = configs.by_name(a.config)
    wl = workloads.build(cfg.builder, cfg.params, cfg.device, cfg.dtype)
    restore = measure.restorer(wl.model)

    refs = {"eager (torch defaults)": outputs(wl.model, wl.steps, restore)}
    with measure.no_tf32():
        refs["eager, TF32 off"] = outputs(wl.model, wl.steps, restore)
    refs["float64"] = measure.float64_outputs(wl.model, wl.steps)
    restore()
    results = {name: {r: worst(outs, ref) for r, ref in refs.items()} for name, outs in refs.items()}
    program = None
    if any(r.startswith("ostinato") for r in a.runners.split(",")):
        import ostinato
        args, kwargs = wl.steps[0]
        program = ostinato.export(wl.model, args, kwargs, **wl.export_options)
        restore()
    device = torch.device(cfg.device)
    for name in a.runners.split(","):
        fn = runners.make_runner(name, wl.model, program, device, wl.steps[0])
        outs = outputs(fn, wl.steps, restore)
        results[name] = {r: worst(outs, ref) for r, ref in refs.items()}
        runners.release(name)
    report = {"config": cfg.name, "dtype": cfg.dtype, "torch": torch.__version__,
              "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
              "tolerance": measure.tolerance(cfg.dtype, cfg.device), "errors": results}
    width = max(map(len, results))
    print(f"{cfg.name} ({cfg.dtype}): max error against", " | ".join(refs))
    for name, errs in results.items():
        print(f"  {name:<{width}}  " + "  ".join(f"{e:10.3g}" for e in errs.values()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
