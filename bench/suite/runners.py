"""The runners a user would pick, each made from the shared model (or its ostinato Program) into a
callable taking one step's ``(*args, **kwargs)``. They share the model's weights and caches, so each
one's memory figure counts the model once."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

DESCRIPTIONS = {
    "eager": "torch eager under torch.no_grad()",
    "cuda_graph_eager": "eager's step captured once as a torch.cuda.CUDAGraph, inputs copied into static ones",
    "torch_compile": "torch.compile(model) (default mode)",
    "torch_compile_ro": "torch.compile(model, mode='reduce-overhead')",
    "ostinato": "ostinato.compile(program, device), step by step",
    "ostinato_replay": "ostinato.compile(program, device, replay=True): captured once, replayed",
    "ostinato_replay_unfused": "ostinato_replay with generic fusion off (OSTINATO_FUSION=0): the A/B of codegen",
    "ostinato_replay_nolinear": "ostinato_replay with matmul groups off (OSTINATO_FUSE_LINEAR=0): projections "
                                "through cuBLAS, the A/B of the generated GEMV kernels",
    "ostinato_replay_noattention": "ostinato_replay with merged decode attention off (OSTINATO_FUSE_ATTENTION=0): "
                                   "rope, cache writes and attention as launches of their own",
    "ostinato_replay_nchw": "ostinato_replay with fp16/bf16 convolutions left in their input's layout "
                            "(OSTINATO_CONV_LAYOUT=nchw): the A/B of running them channels-last",
    "ostinato_mlx": "ostinato.compile(program, device='mlx'), step by step: MLX's default device (Metal on a "
                    "Mac; on Linux MLX's CPU build, so its figures are CPU figures, not Metal ones)",
    "ostinato_mlx_replay": "ostinato.compile(program, device='mlx', replay=True): the plan compiled with "
                           "mx.compile per shape (on Linux MLX's CPU build)",
    "aoti": "AOTInductor: torch.export, torch._inductor.aoti_compile_and_package (.pt2), aoti_load_package, "
            "called step by step (the cell's export_s and compile_s: what making the package took)",
    "aoti_cuda_graph": "the same AOTInductor package (loaded run_single_threaded) with one step captured as a "
                       "torch.cuda.CUDAGraph, inputs copied into static ones",
    "executorch_xnnpack": "ExecuTorch: torch.export, to_edge_transform_and_lower(XnnpackPartitioner), "
                          "to_executorch (.pte), run by executorch.runtime (the cell's export_s and lower_s)",
}
PEERS = ("aoti", "aoti_cuda_graph", "executorch_xnnpack")
# runner -> (environment variable, value) it compiles under
_SWITCHED = {"ostinato_replay_unfused": ("OSTINATO_FUSION", "0"), "ostinato_replay_nolinear": ("OSTINATO_FUSE_LINEAR", "0"),
             "ostinato_replay_noattention": ("OSTINATO_FUSE_ATTENTION", "0"),
             "ostinato_replay_nchw": ("OSTINATO_CONV_LAYOUT", "nchw")}


def cuda_graph_of(model: nn.Module, example: tuple[tuple, dict]) -> Callable:
    """bench/replay.py's CUDA graph of eager, with keyword inputs too: warm-up on a side stream, capture
    one step, then copy each call's inputs into the captured ones and replay. The model's KV caches are
    updated in place by the graph itself."""
    args, kwargs = example
    static_args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
    static_kwargs = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            model(*static_args, **static_kwargs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = model(*static_args, **static_kwargs)

    def step(*args, **kwargs):
        for s, a in zip(static_args, args):
            if isinstance(s, torch.Tensor):
                s.copy_(a)
        for k, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                static_kwargs[k].copy_(v)
        graph.replay()
        return out
    step.graph, step.model = graph, model   # the graph reads the model's tensors: keep them alive with it
    return step


def _torch_compile(model: nn.Module, mode: str | None) -> Callable:
    torch._dynamo.reset()    # no guards or graphs left from another runner of the same module
    return torch.compile(model, mode=mode)


def make_runner(name: str, model: nn.Module, program, device: torch.device,
                example: tuple[tuple, dict], context=None) -> Callable:
    """The runner ``name`` (one of DESCRIPTIONS); ``program`` is the model's ostinato Program;
    ``context`` (a peers.Context) is where the AOTInductor and ExecuTorch runners keep their files."""
    import ostinato
    if name in PEERS:
        from . import peers
        if context is None:
            import tempfile
            context = peers.Context(tempfile.mkdtemp(prefix="ostinato-bench-peer-"))
        if name == "executorch_xnnpack":
            return peers.executorch_runner(context, model, example, device)
        return peers.aoti_runner(context, model, example, device, cuda_graph=name == "aoti_cuda_graph")
    if name == "eager":
        return model
    if name == "cuda_graph_eager":
        if device.type != "cuda":
            raise ValueError("cuda_graph_eager needs a CUDA device")
        return cuda_graph_of(model, example)
    if name == "torch_compile":
        return _torch_compile(model, None)
    if name == "torch_compile_ro":
        return _torch_compile(model, "reduce-overhead")
    if name in ("ostinato", "ostinato_replay"):
        if program is None:
            raise RuntimeError("no ostinato Program: the export failed (see export_error)")
        return ostinato.compile(program, device=device, replay=name == "ostinato_replay")
    if name in ("ostinato_mlx", "ostinato_mlx_replay"):
        if program is None:
            raise RuntimeError("no ostinato Program: the export failed (see export_error)")
        # MLX takes and returns CPU tensors: the cell's inputs stay on the CPU (CPU_ONLY_RUNNERS).
        return ostinato.compile(program, device="mlx", replay=name == "ostinato_mlx_replay")
    if name in _SWITCHED:
        import os
        var, value = _SWITCHED[name]
        old = os.environ.get(var)
        os.environ[var] = value
        try:
            return ostinato.compile(program, device=device, replay=True)
        finally:
            os.environ.pop(var) if old is None else os.environ.__setitem__(var, old)
    raise ValueError(f"unknown runner {name!r}; runners: {', '.join(DESCRIPTIONS)}")


def release(name: str) -> None:
    """Drop what a runner left in torch's global state (compiled graphs, CUDA graph trees)."""
    if name.startswith("torch_compile"):
        torch._dynamo.reset()
