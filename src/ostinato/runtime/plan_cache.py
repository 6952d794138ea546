"""The lowered plan of a Program, cached by content: a warm compile neither lowers nor plans.

Key: kind ``plan``; content = sha256 of the program's FlatBuffer (graph, metadata, weight layout:
everything but the weight bytes, which lowering never reads); target = backend, device arch and the
shape signature of the inputs; versions as for every key. The value is JSON data describing the
Launches (op name, arguments as slots or typed literals, result slots) and which slots the plan
keeps. It is never code: a cache may be shared and untrusted, so a decoded plan only names ops from
the registry and slots in range, and the runtime generates its function from that data itself.

In one process the generated function is memoized by key as well, so compiling the same program
twice on a device costs only placing the weights.
"""
from __future__ import annotations

import json
import logging
import math
import threading
from collections import OrderedDict
from typing import Any, Callable

import torch

from ..backends.base import Backend, Launch, _Slot, _SlotList
from ..cache import Key, get_cache, make_key
from ..cache.keys import sha256_hex
from ..errors import CacheError
from ..ir import TensorMeta, get_op
from ..ir.bulk import paused_gc
from ..program import Program

log = logging.getLogger("ostinato")

PLAN_FORMAT = 1
_MAX_PLAN_BYTES = 256 << 20


class Uncacheable(Exception):
    """A launch argument has no JSON form (the plan is then compiled and simply not stored)."""


# -- keys -------------------------------------------------------------------------------------------
def program_hash(program: Program) -> str:
    """sha256 of the program's FlatBuffer: from the file header when it was loaded, else computed."""
    cached = getattr(program, "_graph_hash", None)
    if cached is not None:
        return cached
    src = program.source
    if src is not None and getattr(src.header, "fb_sha256", None):
        digest = src.header.fb_sha256.hex()
    else:
        from ..program.writer import flatbuffer_bytes
        digest = sha256_hex(flatbuffer_bytes(program))
    program._graph_hash = digest
    return digest


def shape_signature(program: Program) -> str:
    """Inputs' dtypes and shapes as the plan was made for them (symbols by name and range)."""
    parts = []
    for v in program.graph.inputs:
        m = v.meta
        if isinstance(m, TensorMeta):
            parts.append(f"{str(m.dtype).replace('torch.', '')}[{','.join(str(d) for d in m.shape)}]")
        else:
            parts.append(m.kind.__name__)
    syms = [f"{s.name}:{s.min}..{s.max}" for s in program.graph.symbols.values()]
    return ";".join(parts) + ("|" + ",".join(syms) if syms else "")


def plan_key(program: Program, backend: Backend) -> Key:
    target = dict(backend.target())
    target["device"] = str(backend.device)
    target["shapes"] = shape_signature(program)
    target.update(backend.plan_key_parts())
    return make_key("plan", program_hash(program), target)


# -- encoding ---------------------------------------------------------------------------------------
_MEMORY_FORMATS = {str(f).replace("torch.", ""): f for f in (torch.contiguous_format, torch.preserve_format,
                                                              torch.channels_last, torch.channels_last_3d)}
_LAYOUTS = {"strided": torch.strided}


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise CacheError(f"cached plan names an unknown dtype {name!r}")
    return dt


def _enc(a: Any) -> Any:
    if a is None or isinstance(a, (bool, str)):
        return a
    if isinstance(a, int):
        return a
    if isinstance(a, float):
        return a if math.isfinite(a) else {"float": repr(a)}
    if type(a) is _Slot:
        return {"slot": a.i}
    if type(a) is _SlotList:
        return {"slots": [_enc(x) for x in a.items]}
    if isinstance(a, (list, tuple)):
        return {"list" if isinstance(a, list) else "tuple": [_enc(x) for x in a]}
    if isinstance(a, torch.dtype):
        return {"dtype": str(a).replace("torch.", "")}
    if isinstance(a, torch.device):
        return {"device": True}   # the export device: the backend puts its own in
    if isinstance(a, torch.memory_format):
        return {"memory_format": str(a).replace("torch.", "")}
    if isinstance(a, torch.layout):
        return {"layout": str(a).replace("torch.", "")}
    raise Uncacheable(type(a).__name__)


def _dec(a: Any, backend: Backend, num_slots: int) -> Any:
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    if not isinstance(a, dict) or len(a) != 1:
        raise CacheError(f"cached plan holds a malformed argument {str(a)[:80]}")
    (tag, x), = a.items()
    if tag == "slot":
        if not isinstance(x, int) or isinstance(x, bool) or not 0 <= x < num_slots:
            raise CacheError(f"cached plan names slot {x!r} of {num_slots}")
        return _Slot(x)
    if tag in ("slots", "list", "tuple") and isinstance(x, list):
        items = [_dec(y, backend, num_slots) for y in x]
        return _SlotList(items) if tag == "slots" else items if tag == "list" else tuple(items)
    if tag == "float" and x in ("inf", "-inf", "nan"):
        return float(x)
    if tag == "dtype" and isinstance(x, str):
        return _dtype(x)
    if tag == "device":
        return backend.device
    if tag == "memory_format" and x in _MEMORY_FORMATS:
        return _MEMORY_FORMATS[x]
    if tag == "layout" and x in _LAYOUTS:
        return _LAYOUTS[x]
    raise CacheError(f"cached plan holds an unknown argument {tag}={str(x)[:40]}")


def encode_plan(launches: list[Launch], keep: set[int], num_slots: int) -> bytes:
    rows = [[l.op, l.name, [_enc(a) for a in l.args], {k: _enc(a) for k, a in l.kwargs.items()},
             list(l.outs), l.unpack] for l in launches]
    return json.dumps({"format": PLAN_FORMAT, "num_slots": num_slots, "keep": sorted(keep),
                       "launches": rows}, separators=(",", ":"), allow_nan=False).encode()


def decode_plan(blob: bytes, backend: Backend, num_slots: int) -> tuple[list[Launch], set[int]]:
    """Launches from a cached plan; CacheError when it is malformed or does not fit this program."""
    if len(blob) > _MAX_PLAN_BYTES:
        raise CacheError(f"cached plan is {len(blob)} bytes, over the {_MAX_PLAN_BYTES} limit")
    try:
        d = json.loads(blob)
    except (ValueError, UnicodeDecodeError) as e:
        raise CacheError(f"cached plan is not JSON: {e}") from e
    if not isinstance(d, dict) or d.get("format") != PLAN_FORMAT or d.get("num_slots") != num_slots:
        raise CacheError("cached plan has another format or slot count than this program")
    keep, rows = d.get("keep"), d.get("launches")
    if not isinstance(keep, list) or not isinstance(rows, list) \
            or not all(isinstance(i, int) and 0 <= i < num_slots for i in keep):
        raise CacheError("cached plan has malformed launches or kept slots")
    launches = []
    for row in rows:
        if not isinstance(row, list) or len(row) != 6:
            raise CacheError("cached plan has a malformed launch")
        op, name, args, kwargs, outs, unpack = row
        if not isinstance(op, str) or get_op(op) is None or not isinstance(name, str):
            raise CacheError(f"cached plan names an unknown op {str(op)[:60]!r}")
        if not isinstance(args, list) or not isinstance(kwargs, dict) or not isinstance(outs, list) \
                or not isinstance(unpack, bool) or not all(isinstance(k, str) and k.isidentifier() for k in kwargs) \
                or not all(isinstance(o, int) and -1 <= o < num_slots for o in outs):
            raise CacheError(f"cached plan has a malformed launch of {op}")
        launches.append(Launch.of(backend.kernel(op), op, name, tuple(_dec(a, backend, num_slots) for a in args),
                                  {k: _dec(a, backend, num_slots) for k, a in kwargs.items()}, tuple(outs),
                                  unpack))
    return launches, set(keep)


# -- the in-process memo ----------------------------------------------------------------------------
class _Memo:
    """Plan functions by key digest, most recent last (a plan binds no weights, only kernels)."""

    def __init__(self, capacity: int = 32):
        self.capacity = capacity
        self._items: OrderedDict[str, tuple[list[Launch], Callable]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, digest: str):
        with self._lock:
            item = self._items.get(digest)
            if item is not None:
                self._items.move_to_end(digest)
            return item

    def put(self, digest: str, item) -> None:
        with self._lock:
            self._items[digest] = item
            self._items.move_to_end(digest)
            while len(self._items) > self.capacity:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


memo = _Memo()


def cached_plan(program: Program, backend: Backend, num_slots: int, keep: set[int],
                lower: Callable[[], list[Launch]], build: Callable[[list[Launch], set[int]], Callable]
                ) -> tuple[list[Launch], Callable, str]:
    """The plan's Launches and function, and where they came from: "memory" (this process compiled
    it already), "cache" (decoded from a cache tier), or "compiled" (lowered now, then stored)."""
    try:
        key = plan_key(program, backend)
    except Exception as e:  # noqa: BLE001 - a program the key cannot describe still compiles
        log.debug("ostinato: no plan cache key for %s: %s", program.info.get("model", "program"), e)
        launches = lower()
        return launches, build(launches, keep), "compiled"
    item = memo.get(key.digest)
    if item is not None:
        return item[0], item[1], "memory"
    cache = get_cache()
    blob = cache.get(key)
    if blob is not None:
        try:
            with paused_gc():
                launches, cached_keep = decode_plan(blob, backend, num_slots)
                if cached_keep != keep:
                    raise CacheError("cached plan keeps other slots than this program needs")
                fn = build(launches, keep)
            memo.put(key.digest, (launches, fn))
            return launches, fn, "cache"
        except CacheError as e:
            log.warning("ostinato cache: discarding cached plan %s: %s", key.digest[:12], e)
    launches = lower()
    fn = build(launches, keep)
    memo.put(key.digest, (launches, fn))
    try:
        cache.put(key, encode_plan(launches, keep, num_slots))
    except Uncacheable as e:
        log.debug("ostinato: plan of %s not cached: an argument of type %s has no data form",
                  program.info.get("model", "program"), e)
    return launches, fn, "compiled"
