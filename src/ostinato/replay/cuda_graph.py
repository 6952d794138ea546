"""Capturing a Plan into CUDA graphs (through torch.cuda.CUDAGraph).

The Plan's generated function runs once on a side stream to warm up (library handles, lazy kernel
loads; the state and the inputs the plan writes in place are saved before and restored after, so the
warm-up leaves no trace), then under
capture on that stream into the memory pool of the session: temporaries are freed after their last use inside
the capture, so the caching allocator reuses their blocks there, as the CPU tape's arena does.

A cold kernel cache: the first warm-up submits every missing kernel to the compile workers at once
(its ops run their torch references meanwhile). What then depends on ``wait``:

- ``wait=True`` (the default; ``capture_buckets``, ``ostinato.graph``): wait for those compiles, warm
  up again (which loads them) and capture;
- ``wait=False`` (a call of ``compile(..., replay=True)``, ``runner.py``): give the capture up and raise
  ``CompilesInFlight``, the warm-up's state writes undone like any warm-up's; the caller answers the
  call step by step and captures on the next call, which waits for the compiles (as torch.compile's
  CUDA-graph trees warm up eagerly and record later), so a cold first output does not wait for them.

A plan with ops run through eager torch (``fallback.*``: they may do host work a graph cannot hold) is
captured region by region (``regions.py``): one graph per region, all in the same pool, replayed in
capture order with those ops run eagerly between them. Without such ops it is one region, one graph.
Each graph is replayed once right after its capture, which makes this call's result.

cuBLAS keeps one workspace per (handle, stream), made on first use and reused by every later matmul on
that stream, captured ones included: a graph captured on a stream whose workspace was made outside its
pool (by the warm-up, or by anyone who used a stream of torch's pool before) holds a pointer into memory
it does not own. torch.compile(mode="reduce-overhead") clears every workspace when it warms up or
records (``torch._C._cuda_clearCublasWorkspaces``), the block goes back to the caching allocator, and
the next replay of such a graph writes into another tensor or, once the block is returned to the driver,
faults (issue #17). So a capture clears the workspaces before it begins, as torch.compile does: the
workspace its matmuls use is then allocated inside the capture, from the session's pool, which no one
else allocates from and which lives as long as the graphs. It clears them again at the end, so that no
eager matmul on that stream uses the pool's block afterwards.
"""
from __future__ import annotations

import torch

from ..backends.cuda.compile_workers import wait_for_compiles
from ..backends.cuda.kernels.split_k import owned_scratch, recording_scratch, reserve_scratch, zero_counters
from ..backends.cuda.runtime import KernelLibrary, awaiting_compiles
from ..backends.cuda.warm import join_all
from .capture import CompilesInFlight
from .regions import capture_steps, chain, write_back
from .tape import restore_buffers, snapshot_buffers

# The capture clears cuBLAS's workspaces around itself (see the module's note). A switch only for the
# test that shows what goes wrong without it (tests/replay/mixed_case.py).
OWN_CUBLAS_WORKSPACE = True


def clear_cublas_workspaces() -> None:
    """Drop cuBLAS's per-stream workspaces (the next matmul on a stream allocates a new one)."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if OWN_CUBLAS_WORKSPACE and clear is not None:
        clear()


def capture_cuda_graph(exe, env0: list, state: dict[str, torch.Tensor], mutations: list, pool, *,
                       wait: bool = True):
    """(replay function, the static environment, peak bytes the capture allocated) for one call.

    ``wait=False``: raise CompilesInFlight instead of waiting when the warm-up ran op references while
    kernels compiled in workers (nothing captured; the state is as it was before the call)."""
    device = exe.device
    join_all()                  # a warm-up thread a load started (for another device, say) cannot meet it
    current = torch.cuda.current_stream(device)
    snapshot = snapshot_buffers(state, mutations)      # the state, and inputs written in place
    side = torch.cuda.Stream(device=device)

    def warm_up() -> None:
        side.wait_stream(current)
        with torch.cuda.stream(side), torch.no_grad():
            exe._plan(list(env0))
        current.wait_stream(side)
        restore_buffers(snapshot)

    # A cold cache: the first warm-up submits every missing kernel to the compile workers at once (its
    # ops run their references meanwhile), then a second one, once they are all done, loads them: the
    # capture must find every binary loaded, and the compiles ran in parallel rather than one by one.
    # Without ``wait`` the capture is given up instead (the warm-up restored the state already).
    # The last warm-up records the split-K scratch its launches take: the capture's pairs are made
    # before it begins, outside the graph's pool (kernels/split_k.split_scratch says why).
    deferred = KernelLibrary.counts["deferred"]
    with recording_scratch() as scratch:
        warm_up()
    if KernelLibrary.counts["deferred"] != deferred:
        if not wait:
            raise CompilesInFlight(KernelLibrary.counts["deferred"] - deferred)
        wait_for_compiles()
        with awaiting_compiles(), recording_scratch() as scratch:
            warm_up()
    del snapshot
    reserve = reserve_scratch(scratch, device)
    torch.cuda.synchronize(device)
    graphs: list[torch.cuda.CUDAGraph] = []

    def capture_region(segment, env: list, writes: list):
        graph = torch.cuda.CUDAGraph()
        # Captured on the warm-up's stream (its lazy loads are done; cuBLAS's workspace was cleared
        # above, so the first matmul allocates it inside the pool). capture_begin/end directly, not the
        # torch.cuda.graph context: its gc.collect() and empty_cache() cost ~0.1 s per capture in a
        # process that imported torch, and empty_cache() would hand the warm-up's blocks back to the
        # driver only for the capture to allocate them again.
        torch.cuda.synchronize(device)
        with torch.cuda.stream(side), owned_scratch(reserve) as held:
            graph.capture_begin(pool)
            try:
                segment.run(env)
                write_back(env, writes)
            finally:
                graph.capture_end()
        # split-K pairs of this graph's own (made before the capture, outside the pool), zeroed here
        # before the first replay (each launch leaves them at zero), kept as long as the graph: no other
        # graph or stream shares them
        zero_counters(held)
        graph.replay()
        graphs.append(graph)
        if not held:
            return graph.replay

        def replay(graph=graph, held=held) -> None:    # (held: alive as long as the replay is)
            graph.replay()
        return replay

    env = list(env0)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    clear_cublas_workspaces()
    side.wait_stream(current)
    try:
        with torch.cuda.stream(side), torch.no_grad():
            steps = capture_steps(exe.segments, env, capture_region, mutations)
    finally:
        current.wait_stream(side)
        torch.cuda.synchronize(device)
        clear_cublas_workspaces()
    peak = torch.cuda.max_memory_allocated(device) - before
    return (chain(steps) if steps else (lambda: None)), env, peak
