"""Does torch's own AOTInductor work in this environment? A small MLP is exported, packaged
(``aoti_compile_and_package``), loaded (``aoti_load_package``, threaded and single-threaded) and run,
each stage printed when it ends, with faulthandler on so a crash says where it happened.

    python3 bench/aoti_probe.py cpu
    python3 bench/aoti_probe.py cuda

It uses nothing of ostinato. The suite's ``aoti`` runners failed on every GPU configuration; on the lent
GPU machine (torch 2.11.0+cu130, Python 3.12.3) this probe dies of SIGSEGV inside ``aoti_load_package``
on both devices (docs/benchmarks/suite_gpu_full/aoti_probe_gpu.log), while on torch 2.13.0+cpu
(Python 3.11) it passes: the failure is the environment's AOTInductor, not the suite's harness.
"""
import faulthandler
import os
import sys
import time

import torch
import torch._inductor


def say(msg: str) -> None:
    print(f"[{time.strftime('%X')}] {msg}", flush=True)


def main() -> int:
    faulthandler.enable()
    dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    model = model.to(dev, dtype).eval()
    x = torch.randn(4, 64, device=dev, dtype=dtype)
    say(f"torch {torch.__version__} device {dev}")
    ep = torch.export.export(model, (x,))
    say("exported")
    path = f"/tmp/aoti_probe_{dev}.pt2"
    torch._inductor.aoti_compile_and_package(ep, package_path=path)
    say(f"packaged {os.path.getsize(path)} bytes")
    worst = 0.0
    for single in (False, True):
        fn = torch._inductor.aoti_load_package(path, run_single_threaded=single)
        say(f"loaded single_threaded={single}")
        with torch.no_grad():
            err = (fn(x) - model(x)).abs().max().item()
        say(f"ran: max error {err}")
        worst = max(worst, err)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    return 0 if worst <= tol else 1


if __name__ == "__main__":
    sys.exit(main())
