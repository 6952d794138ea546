"""``ost.linear``: placeholder, being written."""
from __future__ import annotations

from ...ir import Graph


def fuse_linear(g: Graph) -> Graph:
    return g
