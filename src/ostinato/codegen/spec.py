"""A fusion group as plain data: the expression DAG one generated kernel computes.

The spec is JSON (canonical: sorted keys, no spaces), so it is hashed, cached and read back from an
untrusted cache without code: ``GroupSpec.from_json`` checks every field. Its parts:

- ``rank``: the rank of the iteration space (the broadcast of the inputs' shapes at run time);
  ``red``: the dims reduced (sorted; empty for a pointwise group).
- ``inputs``: per tensor input, its dtype, its level ("x": indexed by every dim; "r": one value per
  row, i.e. size 1 in every reduced dim) and ``unsq``, trailing size-1 dims to add before it
  broadcasts (a per-channel vector against NCHW).
- ``scalars``: per host-scalar input, "f" or "i".
- ``ops``: ``[name, dtype, level, *args]`` in topological order; args are indices of earlier ops, except
  for "in"/"scalar" (the input's index) and "const" (the literal).
- ``outputs``: ``[op index, dtype, level, keepdim]``; a row-level output is stored once per row, with
  the reduced dims kept as 1 or dropped. A pointwise group's output of lower rank than the space (its
  leading 1-dims dropped: ``()`` beside ``[1]``) adds its rank as a fifth item.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from .prims import BINARY, DTYPES, REDUCTIONS, UNARY, decode_const

SPEC_VERSION = 1
_OTHER = {"where": 3, "cast": 1}


@dataclass
class GroupSpec:
    rank: int
    red: list[int]
    inputs: list[list]      # [dtype, level, unsq]
    scalars: list[str]
    ops: list[list]         # [name, dtype, level, *args]
    outputs: list[list]     # [op index, dtype, level, keepdim]
    split: list = None      # [dim, groups] or []: that dim of every operand iterates as [groups, size / groups]

    def __post_init__(self):
        if self.split is None:
            self.split = []

    def to_json(self) -> str:
        return json.dumps({"v": SPEC_VERSION, "rank": self.rank, "red": self.red, "inputs": self.inputs,
                           "scalars": self.scalars, "ops": self.ops, "outputs": self.outputs, "split": self.split},
                          sort_keys=True, separators=(",", ":"))

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    @classmethod
    def from_json(cls, text: str) -> "GroupSpec":
        """Parse and check a spec; ValueError naming the first thing wrong."""
        d = json.loads(text)
        if not isinstance(d, dict) or d.get("v") != SPEC_VERSION:
            raise ValueError("fusion spec has another version")
        spec = cls(d["rank"], d["red"], d["inputs"], d["scalars"], d["ops"], d["outputs"], d.get("split", []))
        spec.check()
        return spec

    def check(self) -> None:
        def need(cond, what):
            if not cond:
                raise ValueError(f"fusion spec: {what}")

        need(isinstance(self.rank, int) and 0 <= self.rank <= 8, "rank out of range")
        need(all(isinstance(r, int) and 0 <= r < self.rank for r in self.red) and self.red == sorted(set(self.red)),
             "bad reduced dims")
        for i in self.inputs:
            need(isinstance(i, list) and len(i) == 3 and i[0] in DTYPES and i[1] in ("x", "r")
                 and isinstance(i[2], int) and 0 <= i[2] <= 8, "bad input")
        need(all(s in ("f", "i") for s in self.scalars), "bad scalar")
        need(self.split == [] or (len(self.split) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                              for x in self.split)
                                  and 0 <= self.split[0] < self.rank - 1 and self.split[1] >= 1), "bad split")
        for k, op in enumerate(self.ops):
            need(isinstance(op, list) and len(op) >= 3 and op[1] in DTYPES and op[2] in ("x", "r"), f"bad op {k}")
            name, args = op[0], op[3:]
            if name == "in":
                need(len(args) == 1 and isinstance(args[0], int) and 0 <= args[0] < len(self.inputs), f"op {k}")
            elif name == "scalar":
                need(len(args) == 1 and isinstance(args[0], int) and 0 <= args[0] < len(self.scalars), f"op {k}")
            elif name == "const":
                need(len(args) == 1, f"op {k}")
                decode_const(args[0])
            elif name == "rnumel":
                need(not args and self.red, f"op {k}")
            else:
                arity = 1 if name in UNARY or name in REDUCTIONS else 2 if name in BINARY else _OTHER.get(name)
                need(arity is not None, f"unknown op {name!r}")
                need(len(args) == arity and all(isinstance(a, int) and 0 <= a < k for a in args),
                     f"op {k} ({name}) has bad arguments")
                need(name not in REDUCTIONS or self.red, f"reduction {name} in a pointwise group")
        for o in self.outputs:
            need(isinstance(o, list) and len(o) in (4, 5) and isinstance(o[0], int) and 0 <= o[0] < len(self.ops)
                 and o[1] in DTYPES and o[2] in ("x", "r") and isinstance(o[3], bool), "bad output")
            need(len(o) == 4 or (o[2] == "x" and not self.red and isinstance(o[4], int) and 0 <= o[4] < self.rank),
                 "bad output rank")
        need(bool(self.outputs), "no outputs")

