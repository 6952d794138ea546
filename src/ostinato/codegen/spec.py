"""A fusion group as plain data: the expression DAG one generated kernel computes.

The spec is JSON (canonical: sorted keys, no spaces), so it is hashed, cached and read back from an
untrusted cache without code: ``GroupSpec.from_json`` checks every field. Its parts:

- ``rank``: the rank of the iteration space (the broadcast of the inputs' shapes at run time);
  ``red``: the dims reduced (sorted; empty for a pointwise group).
- ``inputs``: per tensor input, its dtype, its level ("x": indexed by every dim; "r": one value per
  row, i.e. size 1 in every reduced dim) and ``unsq``, trailing size-1 dims to add before it
  broadcasts (a per-channel vector against NCHW). Level "g" (no split groups): an input read
  by ``gather`` ops alone, with a fourth item, the space dim it is gathered along; its other dims
  follow the space (right-aligned, as torch.gather's input follows its index), and it takes no part
  in the space's broadcast.
- ``scalars``: per host-scalar input, "f" or "i".
- ``ops``: ``[name, dtype, level, *args]`` in topological order; args are indices of earlier ops, except
  for "in"/"scalar" (the input's index), "const" (the literal) and "gather" (``[k, i]``: input k, a
  "g" input, read where the space's coordinates are, with its gathered dim's coordinate replaced by
  op i's value, an integer; torch.gather).
- ``outputs``: ``[op index, dtype, level, keepdim]``; a row-level output is stored once per row, with
  the reduced dims kept as 1 or dropped. A pointwise group's output of lower rank than the space (its
  leading 1-dims dropped: ``()`` beside ``[1]``) adds its rank as a fifth item.
"""
from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass

from .prims import BINARY, DTYPES, REDUCTIONS, UNARY, decode_const

INTS = ("i64", "i32", "i16", "i8", "u8")

SPEC_VERSION = 1
MAX_RANK = 8        # of a group's iteration space


def _need(kind: str, cond, what: str) -> None:
    if not cond:
        raise ValueError(f"{kind}: {what}")

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

    def to_dict(self) -> dict:
        return {"v": SPEC_VERSION, "rank": self.rank, "red": self.red, "inputs": self.inputs,
                "scalars": self.scalars, "ops": self.ops, "outputs": self.outputs, "split": self.split}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    @classmethod
    def from_json(cls, text: str) -> "GroupSpec":
        """Parse and check a spec; ValueError naming the first thing wrong."""
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, d) -> "GroupSpec":
        if not isinstance(d, dict) or d.get("v") != SPEC_VERSION:
            raise ValueError("fusion spec has another version")
        spec = cls(d["rank"], d["red"], d["inputs"], d["scalars"], d["ops"], d["outputs"], d.get("split", []))
        spec.check()
        return spec

    def check(self) -> None:
        need = functools.partial(_need, "fusion spec")
        need(isinstance(self.rank, int) and 0 <= self.rank <= MAX_RANK, "rank out of range")
        need(all(isinstance(r, int) and 0 <= r < self.rank for r in self.red) and self.red == sorted(set(self.red)),
             "bad reduced dims")
        for i in self.inputs:
            need(isinstance(i, list) and len(i) == 3 and i[0] in DTYPES and i[1] in ("x", "r")
                 and isinstance(i[2], int) and 0 <= i[2] <= 8
                 or isinstance(i, list) and len(i) == 4 and i[0] in DTYPES and i[0] != "bool" and i[1] == "g"
                 and i[2] == 0 and isinstance(i[3], int) and not isinstance(i[3], bool) and 0 <= i[3] < self.rank
                 and not self.split, "bad input")
        need(all(s in ("f", "i") for s in self.scalars), "bad scalar")
        need(self.split == [] or (len(self.split) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                              for x in self.split)
                                  and 0 <= self.split[0] < self.rank - 1 and self.split[1] >= 1), "bad split")
        for k, op in enumerate(self.ops):
            need(isinstance(op, list) and len(op) >= 3 and op[1] in DTYPES and op[2] in ("x", "r"), f"bad op {k}")
            name, args = op[0], op[3:]
            if name == "in":
                need(len(args) == 1 and isinstance(args[0], int) and 0 <= args[0] < len(self.inputs)
                     and self.inputs[args[0]][1] != "g", f"op {k}")
            elif name == "gather":
                need(len(args) == 2 and all(isinstance(a, int) and not isinstance(a, bool) for a in args)
                     and 0 <= args[0] < len(self.inputs) and self.inputs[args[0]][1] == "g"
                     and op[1] == self.inputs[args[0]][0] and op[2] == "x"
                     and 0 <= args[1] < k and self.ops[args[1]][1] in INTS, f"op {k} (gather) has bad arguments")
            elif name == "scalar":
                need(len(args) == 1 and isinstance(args[0], int) and 0 <= args[0] < len(self.scalars), f"op {k}")
            elif name == "const":
                need(len(args) == 1, f"op {k}")
                decode_const(args[0])
            elif name == "rnumel":
                need(not args and self.red, f"op {k}")
            elif name == "rindex":      # the coordinate along the one reduced dim, the last
                need(not args and self.red == [self.rank - 1] and not self.split and op[2] == "x"
                     and op[1] in INTS, f"op {k} (rindex)")
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



@dataclass
class LinearSpec:
    """A matmul group: a projection ``y_g = A @ W_g.T (+ b_g)`` over the weight slices ``g`` (one
    ``aten.linear``, or the packed siblings of an ``ost.multi_linear``) with its neighbours in one kernel.

    - ``pro``: the prologue, a group over ``[..., K]`` reducing K (a norm) or none (pointwise; ``red``
      then still names K, for addressing); its output ``a`` is A (never stored unless ``pro_store``
      says so: other readers), the other outputs are values read outside, stored once.
    - ``w``: the rows of each weight slice; ``bias``: whether each slice has a bias; ``dt``: the
      projection's dtype (its result rounds to it, as cuBLAS's does).
    - ``mm_store``: per slice, whether the projection's result itself is an output (read outside the
      epilogue); without an epilogue every slice is, as views of one ``[..., sum(w)]`` buffer.
    - ``epi``: the epilogue, a pointwise group over ``[..., N]`` (``red`` names N, for addressing) whose
      input ``acc[g]`` is slice g's result; every slice then has N rows.

    A launch's tensors: the prologue's inputs, the weights, the biases, the epilogue's inputs other than
    ``acc``; then the host scalars of the prologue and of the epilogue. Its outputs: the stored prologue
    outputs, the stored slices, the epilogue's outputs.
    """
    pro: GroupSpec
    a: int
    pro_store: list[bool]
    w: list[int]
    bias: bool
    dt: str
    mm_store: list[bool]
    epi: GroupSpec | None = None
    acc: list[int] | None = None
    wt: bool = False        # one weight stored [K, N] (GPT-2's Conv1D), read transposed
    # the slices are consecutive row blocks of one weight (and one bias) passed once: a packed gate/up
    # projection whose ``[..., :n]`` and ``[..., n:]`` halves the epilogue gates (Phi-3's gate_up_proj)
    one_weight: bool = False

    def __post_init__(self):
        if self.acc is None:
            self.acc = []

    def to_json(self) -> str:
        d = {"v": SPEC_VERSION, "kind": "linear", "pro": self.pro.to_dict(), "a": self.a,
             "pro_store": self.pro_store, "w": self.w, "bias": self.bias, "dt": self.dt,
             "mm_store": self.mm_store, "epi": self.epi.to_dict() if self.epi else None, "acc": self.acc}
        for flag in ("wt", "one_weight"):   # only when set: the digests of other groups stay what they were
            if getattr(self, flag):
                d[flag] = True
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()

    @property
    def n_tensors(self) -> int:
        epi = len(self.epi.inputs) - len(self.acc) if self.epi else 0
        return len(self.pro.inputs) + self.n_weights * (2 if self.bias else 1) + epi

    @property
    def n_weights(self) -> int:
        """The weight tensors a launch passes (as many biases when ``bias``)."""
        return 1 if self.one_weight else len(self.w)

    @property
    def n_outputs(self) -> int:
        return sum(self.pro_store) + sum(self.mm_store) + (len(self.epi.outputs) if self.epi else 0)

    @classmethod
    def from_dict(cls, d) -> "LinearSpec":
        if not isinstance(d, dict) or d.get("v") != SPEC_VERSION or d.get("kind") != "linear":
            raise ValueError("linear spec has another version")
        spec = cls(GroupSpec.from_dict(d["pro"]), d["a"], d["pro_store"], d["w"], d["bias"], d["dt"], d["mm_store"],
                   GroupSpec.from_dict(d["epi"]) if d["epi"] is not None else None, d["acc"], d.get("wt", False),
                   d.get("one_weight", False))
        spec.check()
        return spec

    def check(self) -> None:
        need = functools.partial(_need, "linear spec")
        pro, epi = self.pro, self.epi
        need(pro.rank >= 2 and pro.red == [pro.rank - 1] and not pro.split, "the prologue must walk [..., K]")
        need(isinstance(self.a, int) and 0 <= self.a < len(pro.outputs) and pro.outputs[self.a][2] == "x",
             "A must be a full-size prologue output")
        need(all(i[1] != "g" for part in (pro, epi) if part is not None for i in part.inputs),
             "no gather in a matmul group's prologue or epilogue")
        need(isinstance(self.pro_store, list) and len(self.pro_store) == len(pro.outputs)
             and all(isinstance(s, bool) for s in self.pro_store), "bad pro_store")
        need(isinstance(self.w, list) and self.w and all(isinstance(n, int) and not isinstance(n, bool) and n > 0
                                                         for n in self.w), "bad weight rows")
        need(isinstance(self.bias, bool) and self.dt in ("f16", "bf16", "f32"), "bad bias or dtype")
        need(isinstance(self.mm_store, list) and len(self.mm_store) == len(self.w)
             and all(isinstance(s, bool) for s in self.mm_store), "bad mm_store")
        need(isinstance(self.wt, bool) and (not self.wt or len(self.w) == 1), "a transposed weight is one slice")
        need(isinstance(self.one_weight, bool) and (not self.one_weight or (self.epi is not None and not self.wt)),
             "slices of one weight need an epilogue reading them")
        if epi is None:
            need(self.acc == [] and all(self.mm_store), "without an epilogue every slice is stored")
            return
        need(epi.rank >= 2 and epi.red == [epi.rank - 1] and not epi.split
             and not any(op[0] in REDUCTIONS for op in epi.ops), "the epilogue must be pointwise over [..., N]")
        need(isinstance(self.acc, list) and len(self.acc) == len(self.w) and len(set(self.acc)) == len(self.acc)
             and all(isinstance(i, int) and 0 <= i < len(epi.inputs) and epi.inputs[i][0] == self.dt
                     and epi.inputs[i][1] == "x" and epi.inputs[i][2] == 0 for i in self.acc),
             "every slice must be a full-size epilogue input of the projection's dtype")
        need(len(set(self.w)) == 1, "the slices an epilogue reads must have one size")


def parse_spec(text: str) -> "GroupSpec | LinearSpec":
    """A group's spec from its JSON, of either kind; ValueError naming the first thing wrong."""
    d = json.loads(text)
    if isinstance(d, dict) and d.get("kind") == "linear":
        return LinearSpec.from_dict(d)
    return GroupSpec.from_dict(d)


def gathered_statistics(spec: GroupSpec) -> tuple[int, ...] | None:
    """The gathered inputs (their indices) the reductions of ``spec`` read, all of them sums, through no
    loaded input of the group's row (ost.row_scale's statistic over a row narrower than the group's, and its
    shift, passes/fold_norms.py), each gathered along the last dim; else None. Past the widest one's width
    the gathered values are 0, so a sum walks only that width, and a split row would launch more kernels
    for partial sums of a few thousand elements."""
    ops = spec.ops
    reductions = [i for i, op in enumerate(ops) if op[0] in REDUCTIONS]
    if not reductions or any(ops[i][0] != "sum" for i in reductions):
        return None
    found: set[int] = set()
    for i in reductions:
        stack, seen = [ops[i][3]], set()
        while stack:
            j = stack.pop()
            if j in seen:
                continue
            seen.add(j)
            name, _, level, *args = ops[j]
            if name == "in" and level == "x":
                return None
            if name == "gather":
                found.add(args[0])
                stack.append(args[1])
            elif name not in ("in", "scalar", "const", "rnumel", "rindex") and name not in REDUCTIONS:
                stack.extend(args)
    if not found or any(spec.inputs[k][3] != spec.rank - 1 for k in found):
        return None
    return tuple(sorted(found))
