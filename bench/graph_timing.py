"""Timing CUDA graphs against each other: the graphs' replays interleaved round by round, so a drift of
the GPU's clocks or of the machine reaches every one alike (used by the probes in this folder)."""
from __future__ import annotations

import torch


def interleaved_graph_times(graphs: dict, reps: int, rounds: int) -> dict[str, list[float]]:
    """Per graph, one figure per round: milliseconds per replay, the mean over ``reps`` replays after one
    untimed replay, measured with CUDA events."""
    times: dict[str, list[float]] = {k: [] for k in graphs}
    for _ in range(rounds):
        for name, graph in graphs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            graph.replay()
            start.record()
            for _ in range(reps):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end) / reps)
    return times
