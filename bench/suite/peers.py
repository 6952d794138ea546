"""The ahead-of-time peers a user weighs against ostinato: AOTInductor (``torch.export`` then
``torch._inductor.aoti_compile_and_package``: a .pt2 package holding compiled kernels and the weights)
and, on the CPU, ExecuTorch with XNNPACK (``torch.export`` then ``to_edge_transform_and_lower`` with
the XnnpackPartitioner and ``to_executorch``: a .pte program run by ExecuTorch's runtime bindings).

Both give a file that a fresh process loads without the model's Python code, so each has a start-up
story: cold (export, compile or lower, save, load, first output) and warm (load the file, first output),
measured by bench/suite/child.py. The in-process runners load what the cold process saved when it ran,
so a configuration pays AOTInductor's compile once. The suite runs the peers' cold and warm processes
for every configuration with a peer runner, start-up figures asked for or not: a package that crashes
when loaded (AOTInductor's did on an H200, issue #16) fails its cell, not the run. Before the first
AOTInductor cold process of a run, ``startup.aoti_probe`` packages and loads a small MLP in a fresh process;
where that dies too (the lent GPU machine's torch 2.11), every configuration's AOTInductor cells fail with
the probe's error and no cold process is spent on them (OSTINATO_SUITE_AOTI_PROBE=0: no probe). Called
without those records (``make_runner`` on its own), the runners make their file in this process.

Both keep their own copies of the model's weights and mutable buffers (KV caches), so their memory
figure counts the weights twice (the eager model's and theirs).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

AOTI_FILE, PTE_FILE, PTE_SPEC_FILE = "model.pt2", "model.pte", "model.pte.json"


@dataclass
class Context:
    """What the peers' runners need beyond the model: where their files go, the workload's export
    options, the start-up records (a cold process may have made the file already) and what a runner
    made that another may reuse (the AOTInductor package of ``aoti`` for ``aoti_cuda_graph``)."""

    workdir: str
    export_options: dict = field(default_factory=dict)
    startup: dict = field(default_factory=dict)
    made: dict = field(default_factory=dict)


def torch_export(model: torch.nn.Module, step: tuple[tuple, dict], export_options: dict):
    """``torch.export.export`` as ostinato's export runs it for this workload (strict tracing where the
    workload asks for it: transformers' static-cache wrappers)."""
    args, kwargs = step
    strict = bool(export_options.get("trace_strict", export_options.get("strict", False)))
    with torch.no_grad():
        return torch.export.export(model, tuple(args), dict(kwargs), strict=strict)


# ---- AOTInductor -----------------------------------------------------------------------------------------

def aoti_package(model: torch.nn.Module, step: tuple[tuple, dict], export_options: dict, path: str) -> dict:
    """Export and compile ``model`` into the AOTInductor package ``path``: the seconds of each."""
    import torch._inductor
    t0 = time.perf_counter()
    ep = torch_export(model, step, export_options)
    t1 = time.perf_counter()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    torch._inductor.aoti_compile_and_package(ep, package_path=path)
    t2 = time.perf_counter()
    return {"export_s": t1 - t0, "compile_s": t2 - t1, "package_bytes": os.path.getsize(path)}


def aoti_load(path: str, single_threaded: bool = False) -> Callable:
    """The loaded package as a callable of the model's ``(*args, **kwargs)``. ``single_threaded`` drops
    the runner's thread synchronisation, which a CUDA graph capture needs."""
    import torch._inductor
    return torch._inductor.aoti_load_package(path, run_single_threaded=single_threaded)


def aoti_runner(ctx: Context, model: torch.nn.Module, example: tuple[tuple, dict], device: torch.device,
                cuda_graph: bool) -> Callable:
    """``aoti`` (the package called step by step) or ``aoti_cuda_graph`` (one step of it captured in a
    CUDA graph and replayed). The package is the cold process's when it made one, else compiled here
    once for both runners."""
    info = _aoti_made(ctx, model, example)
    fn = aoti_load(info["path"], single_threaded=cuda_graph)
    if cuda_graph:
        if device.type != "cuda":
            raise ValueError("aoti_cuda_graph needs a CUDA device")
        from .runners import cuda_graph_of
        fn = cuda_graph_of(fn, example)
    return _with_info(fn, {k: v for k, v in info.items() if k != "path"})


def _from_fresh_processes(ctx: Context, peer: str, what: str) -> bool:
    """Whether this peer's file comes from its cold-start process: True when that process made it and
    the warm one loaded it and gave a first output; a RuntimeError with the first line of the failing
    process's error when either failed (the file is not loaded here: a crash would end the whole run);
    False when no fresh process ran for it (this process makes the file)."""
    cold, warm = ctx.startup.get(f"{peer}_cold"), ctx.startup.get(f"{peer}_warm")
    if cold is None:
        return False
    if cold.get("status") != "ok":
        raise RuntimeError(f"{what} failed in the cold-start process: {cold.get('error')}")
    if warm is not None and warm.get("status") != "ok":
        raise RuntimeError(f"loading the {what} failed in a fresh process: {warm.get('error')}")
    return True


def _aoti_made(ctx: Context, model, example) -> dict:
    if "aoti" in ctx.made:
        return ctx.made["aoti"]
    cold = ctx.startup.get("aoti_cold") or {}
    path = os.path.join(ctx.workdir, AOTI_FILE)
    if _from_fresh_processes(ctx, "aoti", "AOTInductor package"):
        info = {"path": path, "export_s": cold["export_s"], "compile_s": cold["compile_s"],
                "package_bytes": os.path.getsize(path), "compiled_in": "the cold-start process (empty caches)"}
    else:
        path = os.path.join(ctx.workdir, "inprocess", AOTI_FILE)
        info = dict(aoti_package(model, example, ctx.export_options, path), path=path, compiled_in="this process")
    ctx.made["aoti"] = info
    return info


# ---- ExecuTorch (XNNPACK) -----------------------------------------------------------------------------------

EXECUTORCH_DIR = "executorch-peer"   # under the virtual environment (scripts/setup.sh installs it there)


def executorch_versions() -> dict[str, str | None]:
    """executorch's and torchao's versions from their metadata, without importing them (seconds)."""
    import sys
    from importlib import metadata
    path = os.environ.get("OSTINATO_EXECUTORCH_PATH") or os.path.join(sys.prefix, EXECUTORCH_DIR)
    out: dict[str, str | None] = {}
    for dist in ("executorch", "torchao"):
        found = list(metadata.distributions(name=dist)) or list(metadata.distributions(name=dist, path=[path]))
        out[dist] = found[0].version if found else None
    return out


def _executorch_importable() -> None:
    """Put scripts/setup.sh's executorch directory (or OSTINATO_EXECUTORCH_PATH) on sys.path. It is kept
    out of site-packages because executorch needs torchao, which transformers would then import at
    every model build; transformers caches whether torchao is there at its first model build, before
    this runs, so the models built later in this process do not import it either."""
    import sys
    try:
        import executorch  # noqa: F401  (installed by the user in site-packages)
        return
    except ImportError:
        pass
    path = os.environ.get("OSTINATO_EXECUTORCH_PATH") or os.path.join(sys.prefix, EXECUTORCH_DIR)
    if not os.path.isdir(path):
        raise ImportError(f"no executorch: neither importable nor installed in {path} (scripts/setup.sh "
                          f"installs it there; OSTINATO_EXECUTORCH_PATH names another directory)")
    if path not in sys.path:
        sys.path.append(path)


def executorch_lower(model: torch.nn.Module, step: tuple[tuple, dict], export_options: dict, path: str) -> dict:
    """Export, lower to XNNPACK and serialise ``model`` to the .pte ``path`` (its input and output
    pytree specs beside it, for a process that has no model): the seconds of each stage."""
    _executorch_importable()
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    t0 = time.perf_counter()
    ep = torch_export(model, step, export_options)
    t1 = time.perf_counter()
    program = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
    t2 = time.perf_counter()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "wb") as f:
        f.write(program.buffer)
    with open(path[:-len(".pte")] + ".pte.json", "w") as f:
        json.dump({"in_spec": pytree.treespec_dumps(ep.call_spec.in_spec),
                   "out_spec": pytree.treespec_dumps(ep.call_spec.out_spec)}, f)
    delegated = sum(1 for n in program.exported_program().graph.nodes
                    if n.op == "call_function" and "executorch_call_delegate" in str(n.target))
    return {"export_s": t1 - t0, "lower_s": t2 - t1, "pte_bytes": os.path.getsize(path),
            "delegate_calls": delegated}


def executorch_load(path: str) -> Callable:
    """The .pte's forward method through ExecuTorch's runtime bindings, as a callable of the model's
    ``(*args, **kwargs)`` returning the model's pytree."""
    from torch.fx import _pytree as fx_pytree
    _executorch_importable()
    from executorch.runtime import Runtime
    with open(path[:-len(".pte")] + ".pte.json") as f:
        specs = json.load(f)
    in_spec, out_spec = pytree.treespec_loads(specs["in_spec"]), pytree.treespec_loads(specs["out_spec"])
    method = Runtime.get().load_program(path).load_method("forward")

    def step(*args, **kwargs):
        flat = fx_pytree.tree_flatten_spec((args, kwargs), in_spec)
        return pytree.tree_unflatten(list(method.execute(flat)), out_spec)
    step.method = method
    return step


def executorch_runner(ctx: Context, model: torch.nn.Module, example: tuple[tuple, dict],
                      device: torch.device) -> Callable:
    if device.type != "cpu":
        raise ValueError("executorch_xnnpack runs on the CPU only")
    cold = ctx.startup.get("executorch_cold") or {}
    path = os.path.join(ctx.workdir, PTE_FILE)
    if _from_fresh_processes(ctx, "executorch", "ExecuTorch program"):
        info = {k: cold[k] for k in ("export_s", "lower_s", "pte_bytes", "delegate_calls") if k in cold}
        info["lowered_in"] = "the cold-start process"
    else:
        path = os.path.join(ctx.workdir, "inprocess", PTE_FILE)
        info = dict(executorch_lower(model, example, ctx.export_options, path), lowered_in="this process")
    return _with_info(executorch_load(path), info)


def remove_files(workdir: str) -> None:
    """Delete the peers' files of a configuration once its runners are done (each holds the weights)."""
    import shutil
    for name in (AOTI_FILE, PTE_FILE, PTE_SPEC_FILE):
        for path in (os.path.join(workdir, name), os.path.join(workdir, "inprocess", name)):
            if os.path.exists(path):
                os.remove(path)
    shutil.rmtree(os.path.join(workdir, "inprocess"), ignore_errors=True)


def _with_info(fn: Callable, info: dict[str, Any]) -> Callable:
    """``fn`` carrying figures for its cell (bench/suite/measure.py copies ``suite_info`` into it)."""
    def call(*args, **kwargs):
        return fn(*args, **kwargs)
    call.suite_info, call.inner = info, fn
    return call
