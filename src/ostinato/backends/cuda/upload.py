"""Host bytes to the GPU at the link's speed: a loaded program's weights are views of its file's mapped
data segment (pageable memory, most pages not yet faulted in), so ``tensor.to("cuda")`` per weight moves
them through the driver's own small staging buffer one at a time, about 5 GB/s on the lent H200 (0.45 s
of a warm start for Llama-3.2-1B's 2.5 GB, docs/startup.md). Here they go in chunks through a few pinned
buffers: while chunk j crosses the link (a copy on a stream of its own), ATen's CPU copy, spread over
its threads, fills the next buffer from the mapping.

The sizes are measured (``bench/upload_probe.py --steps-only`` on an H200, fresh processes, the file in
the page cache): three 32 MiB buffers cost 40-66 ms to pin, three of 8 MiB 11-17 ms, and a 256 MiB
upload took 112 ms through the first and 19 ms through the second. The mapping's page tables are filled
first, a chunk at a time, by ``madvise(MADV_POPULATE_READ)`` (Linux 5.14+; skipped where refused) instead
of a fault per page inside the copies: 4 GiB took 107 ms that way against 179 ms."""
from __future__ import annotations

import torch

from ...program.format import populate

CHUNK_BYTES = 8 << 20
BUFFERS = 3
# Below this, one copy: the pinned buffers' allocation would cost more than it saves.
MIN_PIPELINED_BYTES = 2 * CHUNK_BYTES


def upload(src: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``src`` (1-d uint8, on the CPU) copied to ``device``; returns once the copy is complete."""
    n = src.numel()
    if n < MIN_PIPELINED_BYTES or src.device.type != "cpu" or src.is_pinned():
        return src.to(device)
    dst = torch.empty(n, dtype=torch.uint8, device=device)
    stream = torch.cuda.Stream(device)
    bufs = [torch.empty(CHUNK_BYTES, dtype=torch.uint8, pin_memory=True) for _ in range(BUFFERS)]
    done: list[torch.cuda.Event | None] = [None] * BUFFERS
    stream.wait_stream(torch.cuda.current_stream(device))      # dst's allocation is ordered before
    with torch.cuda.stream(stream):
        for j, start in enumerate(range(0, n, CHUNK_BYTES)):
            b, size = j % BUFFERS, min(CHUNK_BYTES, n - start)
            if done[b] is not None:
                done[b].synchronize()                           # buffer b's last chunk has crossed
            part = src[start:start + size]
            populate(part.data_ptr(), size)      # chunk by chunk: a file read from disk still streams
            bufs[b][:size].copy_(part)
            dst[start:start + size].copy_(bufs[b][:size], non_blocking=True)
            done[b] = torch.cuda.Event()
            done[b].record(stream)
    stream.synchronize()
    return dst
