"""Where a configuration's step time goes, kernel by kernel: ostinato's plan run step by step and
torch.compile's default mode (no CUDA graphs, so the profiler sees every kernel), under torch.profiler.

    python bench/profile_kernels.py --configs unet-r64,resnet18-b32 --out prof.json [--steps 10]
        [--variants auto,nchw:OSTINATO_CONV_LAYOUT=nchw,nosplit:OSTINATO_SPLIT_REDUCTION=0]
    python bench/profile_kernels.py --families stablelm-2-1.6b --batch 32 --no-inductor \
        --variants fold,nofold:OSTINATO_FOLD_NORMS=0

Prints per runner the top kernels by GPU time per step, and writes them as JSON. GPU time only: the
launch overhead that replay removes is not in these figures (bench/run_suite.py measures step times).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from bench.suite import configs, measure, workloads  # noqa: E402


def _profile(fn, step, steps: int) -> dict:
    for _ in range(3):
        measure.call(fn, step)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            measure.call(fn, step)
        torch.cuda.synchronize()
    per: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name][0] += e.device_time_total / 1000 / steps
            per[e.name][1] += 1 / steps
    rows = sorted(({"kernel": k[:120], "ms": round(v[0], 4), "calls": round(v[1], 2)} for k, v in per.items()),
                  key=lambda r: -r["ms"])
    return {"total_ms": round(sum(r["ms"] for r in rows), 4), "kernels": round(sum(r["calls"] for r in rows), 1),
            "top": rows[:30]}


def _variants(text: str) -> list[tuple[str, dict]]:
    """``name[:VAR=VALUE[+VAR=VALUE...]]``, comma-separated: ostinato compiled under each environment."""
    out = []
    for item in filter(None, text.split(",")):
        name, _, env = item.partition(":")
        out.append((name, dict(kv.split("=", 1) for kv in filter(None, env.split("+")))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="", help="comma-separated name fragments of GPU configurations")
    ap.add_argument("--families", default="", help="bench/family_decode.py's families instead (its --batch, --layers)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default="")
    ap.add_argument("--no-inductor", action="store_true", help="profile ostinato only")
    ap.add_argument("--variants", default="auto,nchw:OSTINATO_CONV_LAYOUT=nchw",
                    help="ostinato variants, name[:VAR=VALUE[+VAR=VALUE]] comma-separated")
    a = ap.parse_args()
    import ostinato
    from ostinato.backends.cuda.kernels.fused import forget_plans
    from ostinato.backends.cuda.runtime import awaiting_compiles
    report = {}
    if bool(a.configs) == bool(a.families):
        ap.error("give --configs or --families")
    if a.families:
        from bench.family_decode import family_configs
        selected = family_configs("cuda", a.families.split(","), a.layers, batch=a.batch)
    else:
        selected = configs.select("cuda", a.configs)
    for cfg in selected:
        wl = workloads.build(cfg.builder, cfg.params, cfg.device, cfg.dtype)
        args, kwargs = wl.steps[0]
        rec = {}
        for name, env in _variants(a.variants):
            old = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            try:
                # exported under the variant too (a switch of the pass pipeline: OSTINATO_FOLD_NORMS)
                prog = ostinato.export(wl.model, args, kwargs, **wl.export_options)
                forget_plans()     # generated kernels plan their launches anew under this environment
                exe = ostinato.compile(prog, device="cuda")
                with awaiting_compiles():   # every kernel compiled before the profile (no torch references)
                    measure.call(exe, wl.steps[0])
                rec[f"ostinato_{name}"] = _profile(exe, wl.steps[0], a.steps)
                print(f"== {cfg.name} ostinato_{name}: {rec[f'ostinato_{name}']['total_ms']:.3f} ms GPU", flush=True)
            except Exception as e:  # noqa: BLE001 - a variant that fails is reported; the others still run
                rec[f"ostinato_{name}"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
                print(f"== {cfg.name} ostinato_{name} failed: {rec[f'ostinato_{name}']['error']}", flush=True)
            finally:
                for k, v in old.items():
                    os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        if not a.no_inductor:
            torch._dynamo.reset()
            rec["inductor_default"] = _profile(torch.compile(wl.model), wl.steps[0], a.steps)
        report[cfg.name] = rec
        if a.out:   # after every configuration: a run cut short keeps what it measured
            with open(a.out, "w") as f:
                json.dump(report, f, indent=1)
        for runner, r in rec.items():
            if "error" in r:
                continue
            print(f"== {cfg.name} {runner}: {r['total_ms']:.3f} ms GPU, {r['kernels']} kernels per step")
            for row in r["top"][:12]:
                print(f"   {row['ms']:8.4f} ms  x{row['calls']:<5} {row['kernel'][:100]}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
