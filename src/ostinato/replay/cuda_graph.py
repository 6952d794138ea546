"""Capturing a Plan into a CUDA graph (through torch.cuda.CUDAGraph).

The Plan's generated function runs once on a side stream to warm up (library handles, lazy kernel
loads; the state is saved before and restored after, so the warm-up leaves no trace), then once
under capture on that stream into the memory pool of the session: temporaries are freed after their last use inside
the capture, so the caching allocator reuses their blocks there, as the CPU tape's arena does. The
graph is replayed once at the end, which is this call's result.
"""
from __future__ import annotations

import torch

from .tape import check_capturable


def capture_cuda_graph(exe, env0: list, state: dict[str, torch.Tensor], mutations: list, pool):
    """(replay function, the static environment, peak bytes the capture allocated) for one call."""
    check_capturable(exe, exe.launches)
    device = exe.device
    current = torch.cuda.current_stream(device)
    snapshot = {name: t.clone() for name, t in state.items()}
    side = torch.cuda.Stream(device=device)
    side.wait_stream(current)
    with torch.cuda.stream(side), torch.no_grad():
        exe._plan(list(env0))
    current.wait_stream(side)
    with torch.no_grad():
        for name, t in snapshot.items():
            state[name].copy_(t)
    del snapshot
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    env = list(env0)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    # Captured on the warm-up's stream: what the warm-up created per stream (cuBLAS's workspace) is
    # reused, not allocated again inside the pool.
    with torch.cuda.graph(graph, pool=pool, stream=side), torch.no_grad():
        exe._plan(env)
        for target, slot in mutations:
            new = env[slot]
            if new is not target:
                target.copy_(new)
    peak = torch.cuda.max_memory_allocated(device) - before
    graph.replay()
    return graph.replay, env, peak
