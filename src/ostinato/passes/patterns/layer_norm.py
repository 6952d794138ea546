"""``ost.layer_norm``: placeholder, being written."""
from __future__ import annotations

from ...ir import Graph


def fuse_layer_norm(g: Graph) -> Graph:
    return g
