"""A replayed executable on a cold kernel cache, on CUDA, in a fresh process (issue #19; run by
test_cold_capture.py on the GPU machine): nothing in this process's kernels, an empty cache directory, two
compile workers, and every compile's answer held back by a gate until the case opens it, so the calls
made while "compiling" are known in advance.

    python tests/replay/cold_case.py decoder|buckets CACHE_DIR

- ``decoder``: a 2-layer tiny decoder (fp32, batch 2, KV caches written with ``index_copy_``); the first
  call while the kernels compile (answered step by step, nothing captured); the second with the gate
  still shut, opened by a timer half a second later: it waits for the compiles and captures; six more
  calls replay. Every output and every KV cache after every call is checked against an eager twin.
- ``buckets``: a row-wise MLP with an RMSNorm that also doubles its input in place, dynamic batch,
  ``buckets={"batch": "pow2"}``: batch 3 uncaptured (real-size output, the input written once), 3 again
  waits (the gate opened by a timer) and captures rung 4; then 5, 3, 5, 6, 3 at rungs 8 and 4 (rung 8's
  first call may go uncaptured too if its shapes need kernels of their own).

The last stdout line is a JSON object: ok, the errors found, the statistics after each call.
"""
from __future__ import annotations

import copy
import json
import os
import sys
import threading
import time
import traceback
from concurrent.futures import Future

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, os.path.join(ROOT, "src")]

TOL = 1e-4      # fp32: Triton kernels against their torch references


class Gate:
    """Holds back every worker compile's answer (runtime.submit_binary) until ``open()``."""

    def __init__(self, runtime):
        self.event = threading.Event()
        self.held: list[Future] = []
        real = runtime.submit_binary

        def submit(*args, **kwargs):
            fut = real(*args, **kwargs)
            if fut is None:
                return None
            out: Future = Future()
            out.set_running_or_notify_cancel()

            def release():
                self.event.wait()
                try:
                    out.set_result(fut.result())
                except BaseException as e:  # noqa: BLE001 - passed on to whoever waits
                    out.set_exception(e)
            threading.Thread(target=release, daemon=True).start()
            self.held.append(out)
            return out
        runtime.submit_binary = submit

    def open(self) -> None:
        self.event.set()
        for fut in list(self.held):
            fut.result(timeout=600)


def check(errors: list, cond: bool, what: str) -> None:
    if not cond:
        errors.append(what)


def close(errors: list, got, want, what: str) -> None:
    if got.shape != want.shape:
        errors.append(f"{what}: shape {list(got.shape)} vs {list(want.shape)}")
        return
    err = (got.float() - want.float()).abs().max().item() / max(1.0, want.float().abs().max().item())
    if not err <= TOL:
        errors.append(f"{what}: error {err:.3g}")


def decoder(res: dict, gate: Gate) -> None:
    import torch
    import ostinato
    from examples.tiny_decoder import TinyDecoder, decode_inputs
    torch.manual_seed(0)
    model = TinyDecoder(dim=64, layers=2, heads=4, kv_heads=2, vocab=128, max_seq=32, batch=2).eval().cuda()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("weight") and p.dim() == 1:
                p.uniform_(0.5, 1.5)
    eager = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    steps = [tuple(t.cuda() for t in decode_inputs(s, 2, 128, gen)) for s in range(8)]
    prog = ostinato.export(copy.deepcopy(model), steps[0])
    exe = ostinato.compile(prog, device="cuda", replay=True)
    errors = res["errors"]
    caches = {n: b for n, b in eager.named_buffers() if n.endswith(("k_cache", "v_cache"))}
    for step, args in enumerate(steps):
        if step == 1:
            opener = threading.Timer(0.5, gate.event.set)
            opener.start()
        t0 = time.perf_counter()
        out = exe(*args)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        with torch.no_grad():
            want = eager(*args)
        close(errors, out, want, f"call {step}")
        for name, buf in caches.items():
            close(errors, exe.session.state[name], buf, f"state {name} after call {step}")
        stats = exe.stats()
        res["stats"].append({k: stats[k] for k in ("uncaptured_calls", "captures", "replays", "plan_misses",
                                                  "kernel_calls_deferred")} | {"seconds": round(seconds, 3)})
        graphs = exe.session.replay.get("graphs", {})
        if step == 0:
            check(errors, stats["kernel_calls_deferred"] > 0, "nothing deferred on the first call: the kernels "
                  "were not cold, the case shows nothing")
            check(errors, (stats["uncaptured_calls"], stats["captures"], len(graphs)) == (1, 0, 0),
                  f"call 0 (compiling): expected uncaptured, got {res['stats'][-1]}, {len(graphs)} graphs")
        else:
            check(errors, (stats["uncaptured_calls"], stats["captures"], stats["replays"], len(graphs))
                  == (1, 1, step - 1, 1), f"call {step}: expected a capture then replays, got {res['stats'][-1]}")
        if step == 1:
            check(errors, seconds >= 0.45, f"call 1 took {seconds:.3f} s: it did not wait for the held compiles")
    check(errors, exe.static_inputs()[0].shape == steps[0][0].shape, "static_inputs after the capture")


def buckets(res: dict, gate: Gate) -> None:
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torch.export import Dim
    import ostinato
    from examples.tiny_decoder import RMSNorm

    class NormMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.norm, self.down = nn.Linear(16, 64), RMSNorm(64), nn.Linear(64, 8)

        def forward(self, x):
            y = self.down(F.gelu(self.norm(self.up(x))))
            x.mul_(2.0)
            return y

    torch.manual_seed(0)
    model = NormMLP().eval().cuda()
    prog = ostinato.export(copy.deepcopy(model), (torch.randn(4, 16, device="cuda"),),
                           dynamic_shapes=({0: Dim("batch", min=1, max=16)},))
    exe = ostinato.compile(prog, device="cuda", replay=True, buckets={"batch": "pow2"})
    errors = res["errors"]
    sizes = (3, 3, 5, 3, 5, 6, 3)
    for step, b in enumerate(sizes):
        if step == 1:
            threading.Timer(0.5, gate.event.set).start()
        x = torch.randn(b, 16, device="cuda")
        x0 = x.clone()
        out = exe(x)
        torch.cuda.synchronize()
        with torch.no_grad():
            want = model(x0.clone())
        close(errors, out, want, f"call {step} (batch {b})")
        close(errors, x, 2 * x0, f"input after call {step} (batch {b})")
        stats = exe.stats()
        res["stats"].append({k: stats[k] for k in ("uncaptured_calls", "captures", "replays", "bucket_hits",
                                                  "kernel_calls_deferred")})
        if step == 0:
            check(errors, stats["kernel_calls_deferred"] > 0, "nothing deferred on the first call: the kernels "
                  "were not cold, the case shows nothing")
            check(errors, stats["uncaptured_calls"] == 1 and stats["captures"] == 0, "call 0: not uncaptured")
        if step == 1:
            check(errors, stats["uncaptured_calls"] == 1 and stats["captures"] == 1, "call 1: no capture")
    stats = exe.stats()
    # rung 4 and rung 8 captured once each; the first call of each rung at most uncaptured; every other
    # call a replay; every call padded (none is 4 or 8) but the uncaptured ones a bucket hit
    got = (stats["uncaptured_calls"], stats["captures"], stats["replays"], stats["bucket_hits"])
    n = stats["uncaptured_calls"]
    check(errors, n in (1, 2) and got == (n, 2, len(sizes) - 2 - n, len(sizes) - n),
          f"counts (uncaptured, captures, replays, bucket hits) {got}")


def main() -> int:
    case, cache_dir = sys.argv[1], sys.argv[2]
    os.environ["OSTINATO_CACHE_DIR"] = cache_dir
    os.environ["OSTINATO_COMPILE_WORKERS"] = "2"
    os.environ.pop("OSTINATO_REDIS_URL", None)
    res: dict = {"case": case, "ok": False, "errors": [], "stats": []}
    try:
        from ostinato.backends.cuda import runtime
        gate = Gate(runtime)
        {"decoder": decoder, "buckets": buckets}[case](res, gate)
        res["ok"] = not res["errors"]
    except Exception as e:  # noqa: BLE001 - the finding is the error itself
        traceback.print_exc()
        res["errors"].append(f"{type(e).__name__}: {str(e).strip()[:500]}")
    print(json.dumps(res), flush=True)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
