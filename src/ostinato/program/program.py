"""Program: an exported, verified IR graph with its weights, initial state and calling convention."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..ir import Graph


@dataclass(frozen=True)
class InputSlot:
    """One leaf of the flattened (args, kwargs): a graph input, or a constant baked in at export."""

    name: str
    kind: str                 # "tensor" | "scalar" | "constant"
    index: int = -1           # position in graph.inputs for tensor and scalar slots
    value: Any = None         # the exported value for constant slots


@dataclass
class Program:
    graph: Graph
    weights: dict[str, torch.Tensor]          # constants by name (Value.name); shared, never copied
    state_init: dict[str, torch.Tensor]       # initial value of each state buffer, by name
    in_spec: pytree.TreeSpec
    out_spec: pytree.TreeSpec
    inputs: list[InputSlot]
    hints: dict[str, int] = field(default_factory=dict)   # example size of each symbol
    info: dict[str, Any] = field(default_factory=dict)    # model name, exporter versions (saved)
    timings: dict[str, float] = field(default_factory=dict)  # seconds spent exporting or loading (not saved)
    source: Any = None  # reader.FileInfo of the file it was loaded from, if any
    # Named entry points besides this graph (a causal LM's "prefill"; this graph is its "decode"): each a
    # Program over the same weights and state_init dicts, saved in the same file (schema: Method).
    methods: dict[str, "Program"] = field(default_factory=dict)
    # How export made it (regional export's kinds and fallbacks, the export cache's hit or miss); not saved.
    export_report: dict[str, Any] = field(default_factory=dict)

    @property
    def num_nodes(self) -> int:
        return len(self.graph.nodes)

    def op_counts(self) -> dict[str, int]:
        return self.graph.op_counts()

    def save(self, path) -> None:
        """Write the program file (atomically: a temporary file, then a rename)."""
        from .writer import save
        save(self, path)

    def __str__(self) -> str:
        model = self.info.get("model", "model")
        nbytes = sum(t.numel() * t.element_size() for t in self.weights.values())
        head = (f"ostinato.Program {model}: {self.num_nodes} nodes, {len(self.weights)} weights "
                f"({nbytes / 2**20:.2f} MiB), {len(self.state_init)} state buffers")
        body = str(self.graph)
        for name, method in self.methods.items():
            body += f"\n\nmethod {name}: {method.num_nodes} nodes\n{method.graph}"
        return head + "\n" + body

    def __repr__(self) -> str:
        return f"<ostinato.Program {self.info.get('model', '')} nodes={self.num_nodes}>"


def spec_structure(spec: pytree.TreeSpec) -> str:
    """A pytree spec drawn with * for each leaf: ``((*, *), {'mask': *})``."""
    return str(pytree.tree_unflatten(["*"] * spec.num_leaves, spec)).replace("'*'", "*")
