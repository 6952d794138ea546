"""Issue #17's case, in one process: a 24-layer decoder (hidden 896, 14 heads, FFN 4864, vocab 32000,
context 512, bf16, fused QKV, ``index_copy_`` KV cache) run by up to three CUDA-graph users, set up in a
given order: ``ost`` (ostinato, ``replay=True``, called once), ``graph`` (a ``torch.cuda.CUDAGraph`` of
the eager model, warmed up on a side stream and captured with ``torch.cuda.graph``) and ``ro``
(``torch.compile(mode="reduce-overhead")``, first call); ``eager`` (the model run eagerly, no graph: it
shows whether someone else's graph writes into memory it does not own). Then every runner decodes ``--steps`` more
positions in turn and each output is checked against an eager twin stepping in lockstep.

    python tests/replay/mixed_case.py ost,graph,ro [--no-own-workspace] [--steps 32]

The last stdout line is a JSON object: ok, the error (a CUDA error is caught and named), the worst
error per runner. ``--no-own-workspace`` turns off the capture's cuBLAS-workspace clearing
(``replay/cuda_graph.py``) to show what it prevents; without ``ost`` in the order, the case runs without
ostinato at all. Run in a fresh process per case (test_mixed_cuda.py): a fault poisons the context.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, os.path.join(ROOT, "src")]

import torch  # noqa: E402

TOL = 5e-2    # bf16, relative to max(1, max |ref|): the suite's tolerance for this model


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / max(1.0, ref.float().abs().max().item())).item()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("order", help="comma-separated runners in set-up order: ost, graph, ro")
    ap.add_argument("--no-own-workspace", action="store_true")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--no-cudnn-sdp", action="store_true", help="turn torch's cuDNN attention off")
    ap.add_argument("--graph-warmup", choices=["side", "current"], default="side",
                    help="the stream the CUDA graph of eager warms up on")
    args = ap.parse_args()
    order = args.order.split(",")
    assert set(order) <= {"ost", "graph", "graph2", "ro", "eager"} and order, order
    if args.no_cudnn_sdp:
        torch.backends.cuda.enable_cudnn_sdp(False)
    res: dict = {"order": order, "own_workspace": not args.no_own_workspace, "ok": False, "max_error": {}}
    try:
        run(order, args, res)
        res["ok"] = all(e <= TOL for e in res["max_error"].values())
    except Exception as e:  # noqa: BLE001 - the finding is the error itself
        traceback.print_exc()
        res["error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
    print(json.dumps(res), flush=True)
    return 0 if res["ok"] else 1


def run(order: list[str], args, res: dict) -> None:
    from bench.suite.user_models import UserDecoder
    dev = "cuda"
    torch.manual_seed(0)
    base = UserDecoder(896, args.layers, "rms", vocab=32000, cache_len=512, heads=14, ffn=4864)
    base = base.to(dev, torch.bfloat16).eval()
    ids = torch.randint(0, 32000, (args.steps + 1, 1, 1), device=dev)
    pos = torch.arange(args.steps + 1, device=dev).view(-1, 1)
    ref = copy.deepcopy(base)
    runners: dict = {}
    with torch.no_grad():
        ref(ids[0], pos[0])                 # every runner's set-up writes position 0 (idempotent)
        for name in order:
            model = copy.deepcopy(base)
            if name == "ost":
                import ostinato
                from ostinato.replay import cuda_graph
                cuda_graph.OWN_CUBLAS_WORKSPACE = not args.no_own_workspace
                exe = ostinato.compile(ostinato.export(model, (ids[0], pos[0])), device=dev, replay=True)
                exe(ids[0], pos[0])
                runners["ost"] = exe
            elif name.startswith("graph"):     # graph2: a second user graph, of its own copy
                static_ids, static_pos = ids[0].clone(), pos[0].clone()
                side = torch.cuda.Stream() if args.graph_warmup == "side" else torch.cuda.current_stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(3):
                        model(static_ids, static_pos)
                torch.cuda.current_stream().wait_stream(side)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    static_out = model(static_ids, static_pos)

                # the closure keeps the model alive: the graph reads its weights and writes its caches
                def replay(i, p, g=g, si=static_ids, sp=static_pos, so=static_out, model=model):
                    si.copy_(i)
                    sp.copy_(p)
                    g.replay()
                    return so
                runners[name] = replay
            elif name == "eager":           # no graph at all: a victim, never a culprit
                model(ids[0], pos[0])
                runners["eager"] = model
            else:
                fn = torch.compile(model, mode="reduce-overhead")
                fn(ids[0], pos[0])
                runners["ro"] = lambda i, p, fn=fn: fn(i, p)
            torch.cuda.synchronize()
        worst = {name: 0.0 for name in order}
        for step in range(1, args.steps + 1):
            want = ref(ids[step], pos[step])
            for name in order[step % len(order):] + order[:step % len(order)]:
                got = runners[name](ids[step], pos[step]).clone()
                worst[name] = max(worst[name], rel_error(got, want))
            torch.cuda.synchronize()
        res["max_error"] = worst


if __name__ == "__main__":
    sys.exit(main())
