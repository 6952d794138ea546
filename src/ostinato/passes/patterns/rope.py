"""``ost.rope``: placeholder, being written."""
from __future__ import annotations

from ...ir import Graph


def fuse_rope(g: Graph) -> Graph:
    return g
