"""The explicit capture API: ``g = ostinato.Graph(); with ostinato.graph(g): out = exe(*args)``,
then update the inputs in place and ``g.replay()``; ``out`` is updated in place."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

from ..errors import CaptureError
from ..runtime.executable import capturing
from ..runtime.memory import MemoryReport
from .capture import Captured


class Graph:
    """One captured call of an Executable. The tensors passed to the captured call are its static
    inputs: change them in place (``x.copy_(new)``), or pass new values to ``replay(*args)``.
    On CUDA, ``pool`` (``torch.cuda.graph_pool_handle()``) lets several graphs share memory."""

    def __init__(self, pool=None):
        self.pool = pool
        self.captured: Captured | None = None
        self.replays = 0
        self._arena: dict = {}

    def capture(self, exe, session, leaves: list, bindings: dict[str, int]) -> Any:
        """Called by an Executable inside ``ostinato.graph(self)``: capture that call."""
        if self.captured is not None:
            raise CaptureError("this ostinato.Graph already holds a capture; use a new Graph for each one")
        self.captured = Captured(exe, session, leaves, bindings, holder=self._arena, pool=self.pool)
        exe.capture_reports.append(self.captured.report)
        return self.captured.outputs

    def _need(self) -> Captured:
        if self.captured is None:
            raise CaptureError("this ostinato.Graph holds no capture: call the executable inside "
                               "`with ostinato.graph(g):` first")
        return self.captured

    def replay(self, *args, **kwargs) -> Any:
        """Re-run the captured call; with arguments, copy them into the static inputs first. Returns the
        captured outputs (the same tensors each time, updated in place)."""
        c = self._need()
        if args or kwargs:
            leaves = c.executable.check_inputs(args, kwargs)[0]
            c.load_inputs(leaves)
        self.replays += 1
        return c.replay()

    @property
    def outputs(self) -> Any:
        return self._need().outputs

    @property
    def source(self) -> str:
        """The generated replay function (CPU), for reading."""
        return self._need().source

    def memory_report(self) -> MemoryReport:
        return self._need().report

    def __repr__(self) -> str:
        if self.captured is None:
            return "<ostinato.Graph (empty)>"
        return f"<ostinato.Graph {self.captured.signature or 'static'} replays={self.replays}>"


@contextlib.contextmanager
def graph(g: Graph) -> Iterator[Graph]:
    """Capture the Executable call made inside the block into ``g`` (one call per Graph)."""
    if not isinstance(g, Graph):
        raise TypeError(f"ostinato.graph() takes an ostinato.Graph, not {type(g).__name__}")
    if capturing.target is not None:
        raise CaptureError("ostinato.graph() is already capturing on this thread; captures do not nest")
    capturing.target = g
    try:
        yield g
    finally:
        capturing.target = None
