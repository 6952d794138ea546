"""Building many objects at once (a decoded graph, a cached plan, a whole load or compile) without paying
for the collector.

Decoding a large program makes hundreds of thousands of long-lived objects (nodes, values, argument
lists), and that many new survivors trigger a full collection, which walks every object in the process:
torch's included. Pausing only the decode moved that collection to the checks right after it: measured on
the 2-core VM for a 24-layer Mamba-130m program (9412 nodes, ``bench/gc_pause.py``), one full collection
still took 0.10 s of a 0.19 s load. ``load`` and ``compile`` now run whole inside a pause (0.09 s load),
and no full collection came in the load, the compile or the first call. Nothing is freed later than it
would be anyway: the collector only finds cycles, and it runs again, as usual, once the pause ends.

``paused_gc()`` holds the collector off inside its block and turns it back on after, unless it was already
off (the caller's choice stays; nested pauses keep it off until the outermost ends). The collector is
process-wide: another thread's allocations during a pause are not collected until it ends either.
``OSTINATO_GC_PAUSE=0`` turns the pause off.
"""
from __future__ import annotations

import contextlib
import gc
import os
from typing import Iterator


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic collector inside the block (see the module)."""
    if os.environ.get("OSTINATO_GC_PAUSE", "1") == "0" or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
