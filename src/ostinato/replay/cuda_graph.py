"""Capturing a Plan into CUDA graphs (through torch.cuda.CUDAGraph).

The Plan's generated function runs once on a side stream to warm up (library handles, lazy kernel
loads; the state is saved before and restored after, so the warm-up leaves no trace), then under
capture on that stream into the memory pool of the session: temporaries are freed after their last use inside
the capture, so the caching allocator reuses their blocks there, as the CPU tape's arena does.

A plan with ops run through eager torch (``fallback.*``: they may do host work a graph cannot hold) is
captured region by region (``regions.py``): one graph per region, all in the same pool, replayed in
capture order with those ops run eagerly between them. Without such ops it is one region, one graph.
Each graph is replayed once right after its capture, which makes this call's result.
"""
from __future__ import annotations

import torch

from .regions import capture_steps, chain, write_back
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
    graphs: list[torch.cuda.CUDAGraph] = []

    def capture_region(segment, env: list, writes: list):
        graph = torch.cuda.CUDAGraph()
        # Captured on the warm-up's stream: what the warm-up created per stream (cuBLAS's workspace)
        # is reused, not allocated again inside the pool. capture_begin/end directly, not the
        # torch.cuda.graph context: its gc.collect() and empty_cache() cost ~0.1 s per capture in a
        # process that imported torch, and empty_cache() would hand the warm-up's blocks back to the
        # driver only for the capture to allocate them again.
        torch.cuda.synchronize(device)
        with torch.cuda.stream(side):
            graph.capture_begin(pool)
            try:
                segment.run(env)
                write_back(env, writes)
            finally:
                graph.capture_end()
        graph.replay()
        graphs.append(graph)
        return graph.replay

    env = list(env0)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    side.wait_stream(current)
    with torch.cuda.stream(side), torch.no_grad():
        steps = capture_steps(exe.segments, env, capture_region, mutations)
    current.wait_stream(side)
    peak = torch.cuda.max_memory_allocated(device) - before
    return (chain(steps) if steps else (lambda: None)), env, peak
