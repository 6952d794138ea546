"""The decoded program, cached: a warm ``load`` skips the FlatBuffer walk.

Python's FlatBuffers accessors cost a function call per field: decoding a 64-layer decoder's 4,500
nodes takes ~0.3 s, most of a warm start. The decoded graph (values, nodes, slots, specs, the tensor
table) is stored once as JSON in ostinato's cache, keyed by the FlatBuffer's sha256 from the file's
header, and a later load builds the same objects from it (json's C parser: ~10x faster). The file's
weights are still mapped from the file itself; only the FlatBuffer's decoding is skipped. A malformed
entry is a miss, never an error, and the graph still passes the structural verifier after it.

A second, one-byte entry (kind ``shapes-verified``, same key content) records that the program with
this FlatBuffer passed ``load(verify=True)``'s shape re-derivation under this ostinato and torch
(both in the key): a later ``verify=True`` load of the same bytes, proven the same by their sha256,
checks the checksums and the structure and skips re-deriving the shapes (~1 s of torch imports in a
fresh process, and a fake-tensor run of every op).
"""
from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import torch

from ..cache import Key, cached_value, get_cache, make_key
from ..ir import Graph, Node, ScalarMeta, SymbolRange, SymDim, TensorMeta, Value
from ..ir.bulk import paused_gc
from ..ir.types import DTYPES_BY_NAME, dtype_name
from .program import InputSlot

log = logging.getLogger("ostinato")

KIND = "program-ir"
VERIFIED_KIND = "shapes-verified"
CODEC = 1   # bumped when the JSON form changes
_SCALARS = {"int": int, "float": float, "bool": bool}


def ir_key(fb_sha256: bytes) -> Key:
    return make_key(KIND, f"{fb_sha256.hex()}:{CODEC}", {"backend": "any", "arch": "any"})


# -- arguments: JSON with tagged objects for what JSON lacks ------------------------------------
def _enc(a: Any) -> Any:
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    if isinstance(a, Value):
        return {"v": a.id}
    if isinstance(a, list):
        return [_enc(x) for x in a]
    if isinstance(a, tuple):
        return {"t": [_enc(x) for x in a]}
    if isinstance(a, dict):
        return {"d": {k: _enc(x) for k, x in a.items()}}
    if isinstance(a, torch.dtype):
        return {"dt": dtype_name(a)}
    if isinstance(a, torch.device):
        return {"dev": str(a)}
    if isinstance(a, torch.layout):
        return {"lay": str(a).replace("torch.", "")}
    if isinstance(a, torch.memory_format):
        return {"mf": str(a).replace("torch.", "")}
    raise TypeError(f"no JSON form for an argument of type {type(a).__name__}")


def _torch_attr(name: str, kind: type):
    obj = getattr(torch, name, None) if name.isidentifier() else None
    if not isinstance(obj, kind):
        raise ValueError(f"unknown {kind.__name__} {name!r}")
    return obj


def _dec(a: Any, values: dict[int, Value]) -> Any:
    if not isinstance(a, (dict, list)):
        return a
    if isinstance(a, list):
        return [_dec(x, values) for x in a]
    (tag, x), = a.items()
    if tag == "v":
        return values[x]
    if tag == "t":
        return tuple(_dec(y, values) for y in x)
    if tag == "d":
        return {k: _dec(y, values) for k, y in x.items()}
    if tag == "dt":
        return DTYPES_BY_NAME[x]
    if tag == "dev":
        return torch.device(x)
    if tag == "lay":
        return _torch_attr(x, torch.layout)
    if tag == "mf":
        return _torch_attr(x, torch.memory_format)
    raise ValueError(f"unknown argument tag {tag!r}")


def _dim(d) -> Any:
    return d if isinstance(d, int) else str(d.expr)


# -- the whole decoded program --------------------------------------------------------------------
def encode(graph: Graph, extra: dict, tensors: list) -> bytes:
    values = {}
    for v in graph.constants + graph.inputs + graph.state + graph.temps():
        m = v.meta
        if isinstance(m, TensorMeta):
            meta = ["T", dtype_name(m.dtype), [_dim(d) for d in m.shape]]
        else:
            meta = ["S", m.kind.__name__, None if m.expr is None else str(m.expr.expr)]
        values[v.id] = [v.id, v.name, v.role, meta]
    doc = {
        "symbols": [[s.name, s.min, s.max, s.label] for s in graph.symbols.values()],
        "values": list(values.values()),
        "constants": [v.id for v in graph.constants], "inputs": [v.id for v in graph.inputs],
        "state": [v.id for v in graph.state],
        "nodes": [[n.op, n.name, n.source, _enc(list(n.args)), _enc(n.kwargs),
                   [None if o is None else o.id for o in n.outputs]] for n in graph.nodes],
        "outputs": _enc(graph.outputs),
        "mutations": [[t.id, n.id] for t, n in graph.mutations],
        "next_id": graph._next_id,
        "slots": [[s.name, s.kind, s.index, _enc(s.value)] for s in extra["slots"]],
        "hints": extra["hints"], "in_spec": extra["in_spec"], "out_spec": extra["out_spec"],
        "info": extra["info"], "schema_version": extra["schema_version"],
        "tensors": [list(t) for t in tensors],
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def decode(blob: bytes) -> tuple[Graph, dict, list]:
    with paused_gc():
        return _decode(json.loads(blob))


def _decode(doc: dict) -> tuple[Graph, dict, list]:
    g = Graph()
    for name, lo, hi, label in doc["symbols"]:
        g.symbols[name] = SymbolRange(name, lo, hi, label)
    values: dict[int, Value] = {}
    exprs: dict[str, SymDim] = {}

    def sym(text: str) -> SymDim:
        d = exprs.get(text)
        if d is None:
            d = exprs[text] = SymDim(text)
        return d

    for vid, name, role, meta in doc["values"]:
        if meta[0] == "T":
            m = TensorMeta(DTYPES_BY_NAME[meta[1]], tuple(d if isinstance(d, int) else sym(d) for d in meta[2]))
        else:
            m = ScalarMeta(_SCALARS[meta[1]], None if meta[2] is None else sym(meta[2]))
        values[vid] = Value(vid, name, m, role)
    g.constants = [values[i] for i in doc["constants"]]
    g.inputs = [values[i] for i in doc["inputs"]]
    g.state = [values[i] for i in doc["state"]]
    for op, name, source, args, kwargs, outs in doc["nodes"]:
        node = Node(op, tuple(_dec(args, values)), _dec(kwargs, values), name, source)
        for vid in outs:
            if vid is None:
                node.outputs.append(None)
            else:
                v = values[vid]
                if v.producer is not None:
                    raise ValueError(f"value {vid} produced twice")
                v.producer = node
                node.outputs.append(v)
        g.nodes.append(node)
    g.outputs = _dec(doc["outputs"], values)
    g.mutations = [(values[t], values[n]) for t, n in doc["mutations"]]
    g._next_id = int(doc["next_id"])
    slots = [InputSlot(name, kind, index, _dec(value, {})) for name, kind, index, value in doc["slots"]]
    extra = {"hints": {str(k): int(v) for k, v in doc["hints"].items()}, "slots": slots,
             "in_spec": doc["in_spec"], "out_spec": doc["out_spec"], "info": doc["info"],
             "schema_version": doc["schema_version"]}
    tensors = [tuple(t) for t in doc["tensors"]]
    return g, extra, tensors


def cached_decode(fb_sha256: bytes) -> tuple[Graph, dict, list] | None:
    """The decoded program of the FlatBuffer with this sha256, if a cache tier holds it (a malformed entry
    is a miss: the file is decoded instead)."""
    return cached_value(ir_key(fb_sha256), decode, "decoded program")


def store_decoded(fb_sha256: bytes, graph: Graph, extra: dict, tensors: list) -> None:
    try:
        get_cache().put(ir_key(fb_sha256), encode(graph, extra, tensors))
    except Exception as e:  # noqa: BLE001 - caching is an optimization; a failure only costs time
        log.debug("ostinato: decoded program not cached: %s: %s", type(e).__name__, e)


def _verified_key(fb_sha256: bytes) -> Key:
    return make_key(VERIFIED_KIND, f"{fb_sha256.hex()}:{CODEC}", {"backend": "any", "arch": "any"})


def shapes_verified(fb_sha256: bytes) -> bool:
    """Whether the program with this FlatBuffer already passed the shape re-derivation here."""
    try:
        return get_cache().get(_verified_key(fb_sha256)) == b"1"
    except Exception as e:  # noqa: BLE001 - a cache that cannot answer: verify again
        log.debug("ostinato: shapes-verified cache unavailable: %s", e)
        return False


def mark_shapes_verified(fb_sha256: bytes) -> None:
    try:
        get_cache().put(_verified_key(fb_sha256), b"1")
    except Exception as e:  # noqa: BLE001 - caching is an optimization
        log.debug("ostinato: shapes-verified mark not cached: %s: %s", type(e).__name__, e)


# A data segment whose sha256 a load checked here, recorded against the file's identity: a later load of
# the same unchanged file skips re-hashing its weights (1.4 s for Llama-3.2-1B's 2.5 GB at the 1.8 GB/s
# one core hashes). The identity is the device, inode, size, and modification and status-change times
# in nanoseconds: writing the file changes both times, and the status-change time cannot be set back
# (os.utime sets the other two and moves it forward). The cache keeps the record on this machine's tiers
# only (memory, disk), never Redis nor bundles: another machine's inode numbers name other files.
DATA_VERIFIED_KIND = "data-verified"   # one of cache.keys.MACHINE_LOCAL_KINDS
# File times come from a coarse clock (a kernel tick, 1-10 ms; whole seconds on some network and FUSE
# file systems), so a write in the same tick as the file's last change leaves both times as they were.
# A file changed less than this long before the check is therefore not recorded (git's "racily clean"
# rule): its next load hashes it again. save() has just written its file, so it cannot record it then: the
# saving process checks its saved files as a load would once the window has passed, at its exit
# (reader.check_saved), so the first load in another process does not hash them.
RACY_NS = 100_000_000
RACY_WHOLE_SECONDS_NS = 2_000_000_000


def racy_window_ns(st: os.stat_result) -> int:
    """The racy window of the file ``st`` (its stat): RACY_WHOLE_SECONDS_NS where its times are whole seconds."""
    whole_seconds = st.st_mtime_ns % 1_000_000_000 == 0 and st.st_ctime_ns % 1_000_000_000 == 0
    return RACY_WHOLE_SECONDS_NS if whole_seconds else RACY_NS


def racy_wait_ns(st: os.stat_result, now_ns: int | None = None) -> int:
    """How long from ``now_ns`` (default: now) until the file ``st`` (its stat) changed long enough ago to
    be recorded (0: it has)."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    return max(0, max(st.st_mtime_ns, st.st_ctime_ns) + racy_window_ns(st) - now_ns)


def _data_key(st: os.stat_result, data_sha256: bytes) -> Key:
    ident = f"{data_sha256.hex()}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
    return make_key(DATA_VERIFIED_KIND, ident, {"backend": "any", "arch": "any"})


def data_verified(st: os.stat_result, data_sha256: bytes) -> bool:
    """Whether this file (``st``: its fstat), unchanged since, had a data segment of this sha256 here."""
    try:
        return get_cache().get(_data_key(st, data_sha256)) == b"1"
    except Exception as e:  # noqa: BLE001 - a cache that cannot answer: hash again
        log.debug("ostinato: data-verified cache unavailable: %s", e)
        return False


def mark_data_verified(st: os.stat_result, data_sha256: bytes, checked_at_ns: int | None = None) -> bool:
    """Record that the file ``st`` (its fstat before the check) has a data segment of this sha256: unless
    it changed too recently before ``checked_at_ns`` (``time.time_ns()`` when the hash began reading it;
    default: now) for its times to tell a later change from this one. A write the hash did not see came
    after that moment, so in a later tick of the file clock than the file's last change: its times moved.
    Returns whether it recorded it."""
    if racy_wait_ns(st, checked_at_ns) > 0:
        return False
    try:
        get_cache().put(_data_key(st, data_sha256), b"1")
        return True
    except Exception as e:  # noqa: BLE001 - caching is an optimization
        log.debug("ostinato: data-verified mark not cached: %s: %s", type(e).__name__, e)
        return False
