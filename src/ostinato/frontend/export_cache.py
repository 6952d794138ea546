"""The export cache: the exported graph (without weights), keyed by what it depends on.

A new checkpoint of the same architecture gives the same graph: only the weights differ. The key's
components, each a sha256, are what a graph depends on; ``Cache.explain`` (``ostinato cache explain
--export``) names the ones that differ from the nearest stored export of the same model class:

- ``target.code``: the model's code: the qualname of every module class in the model and the source
  file of each (and of the functions and classes their ``forward`` methods name, one level down);
- ``target.structure``: module paths and classes, every parameter's and buffer's name, shape, stride,
  dtype and device, which of them are one tensor, every plain attribute of every module (a config, an
  ``eps``), and the bytes of tensors kept as plain attributes (they are baked into the graph);
- ``target.inputs`` and ``target.dynamic_shapes``: the example inputs' pytree, shapes, strides, dtypes
  and devices (their values are not traced) and the ``Dim`` specs;
- ``target.options``: ``strict``, ``trace_strict`` and the names of the passes;
- versions: ostinato's, torch's, Triton's and CUDA's, and each package's the model's code comes from.

The value is JSON (never pickle): the IR graph as ``program/ir_cache`` encodes it, its calling
convention, and where each constant comes from: a tensor of the model by its path, or, for a constant
the forward creates, its bytes. A hit maps the model's current tensors by name. Anything the key cannot
describe (a module attribute of an unknown type) turns the cache off for that export, with the reason
in ``Program.export_report``.
"""
from __future__ import annotations

import base64
import builtins
import enum
import functools
import hashlib
import importlib.metadata
import inspect
import json
import logging
import os
import sys
import sysconfig
import types
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..cache import Key, cached_value, get_cache, make_key
from ..cache.keys import current_versions
from ..ir.types import DTYPES_BY_NAME, dtype_name
from ..program import InputSlot, Program
from ..program import ir_cache

log = logging.getLogger("ostinato")

KIND = "export"
CODEC = 1
_TORCH_DIR = os.path.dirname(torch.__file__)
_STDLIB = sysconfig.get_paths()["stdlib"]
_MODULE_INTERNALS = frozenset({
    "_parameters", "_buffers", "_modules", "_non_persistent_buffers_set", "_backward_pre_hooks",
    "_backward_hooks", "_is_full_backward_hook", "_forward_hooks", "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called", "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs",
    "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks", "_compiled_call_impl"})
# Constants a forward creates are stored in the entry; past this, the export is not cached.
MAX_INLINE_BYTES = 1 << 20


class Uncacheable(Exception):
    """Internal: the key cannot describe this model or these inputs; the export is not cached."""


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


# -- code -------------------------------------------------------------------------------------------
def _is_library(path: str | None) -> bool:
    return not path or path.startswith(_TORCH_DIR) or path.startswith(_STDLIB)


@functools.lru_cache(maxsize=1024)
def _file_sha(path: str, mtime_ns: int, size: int) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _source_file(obj) -> str | None:
    """The file ``obj`` is defined in (None for libraries and builtins); Uncacheable when it has none
    to read: defined in ``python -c``, stdin, a notebook cell or exec'd code, whose edits no key sees."""
    try:
        path = inspect.getsourcefile(obj)
    except TypeError:     # a builtin, or a class whose module is missing (exec'd without __name__)
        if getattr(builtins, getattr(obj, "__qualname__", ""), None) is obj or not isinstance(obj, type):
            return None
        path = None
    except OSError:
        path = None
    if path is None or not os.path.isfile(path):
        module_file = getattr(inspect.getmodule(obj), "__file__", None)
        if module_file and _is_library(module_file):
            return None
        raise Uncacheable(f"{getattr(obj, '__qualname__', obj)!s} has no source file to key its code by "
                          "(defined in a notebook cell, stdin or exec'd code)")
    return None if _is_library(path) else path


def _referenced(fn, seen: set) -> list:
    """Functions and classes ``fn``'s code names as globals (nested code objects included)."""
    out = []
    code = getattr(fn, "__code__", None)
    if code is None or id(code) in seen:
        return out
    seen.add(id(code))
    g = getattr(fn, "__globals__", {})
    stack = [code]
    while stack:
        c = stack.pop()
        for name in c.co_names:
            obj = g.get(name)
            if isinstance(obj, (types.FunctionType, type)):
                out.append(obj)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return out


def code_component(model: nn.Module) -> tuple[str, dict[str, str]]:
    """sha256 of the model's code, and the versions of the packages it comes from."""
    classes: dict[str, type] = {}
    for m in model.modules():
        for cls in type(m).__mro__:
            if cls is nn.Module or cls is object:
                break
            classes.setdefault(f"{cls.__module__}.{cls.__qualname__}", cls)
    files: set[str] = set()
    seen: set = set()
    captured = []
    for name, cls in sorted(classes.items()):
        path = _source_file(cls)
        if path:
            files.add(path)
        captured += _captured(name, cls)
        fwd = cls.__dict__.get("forward")
        for obj in _referenced(fwd, seen) if fwd is not None else ():
            path = _source_file(obj)
            if path:
                files.add(path)
            for inner in _referenced(obj, seen) if isinstance(obj, types.FunctionType) else ():
                path = _source_file(inner)
                if path:
                    files.add(path)
    modules = {os.path.abspath(getattr(mod, "__file__", "") or ""): name
               for name, mod in list(sys.modules.items()) if getattr(mod, "__file__", None)}
    digests, versions = [], {}
    for path in sorted(files):
        st = os.stat(path)
        name = modules.get(os.path.abspath(path), os.path.basename(path))
        digests.append([name, _file_sha(path, st.st_mtime_ns, st.st_size)])
        top = name.split(".")[0]
        try:
            versions[f"pkg.{top}"] = importlib.metadata.version(top)
        except (importlib.metadata.PackageNotFoundError, ValueError):
            pass
    # Files are named by module (a path differs between machines; a module name does not).
    return _sha([sorted(classes), sorted(digests), captured]), versions


def _captured(name: str, cls: type) -> list:
    """The values a class's methods capture from an enclosing function (a class made by a factory or in
    a loop): one source file, different graphs. ``__class__`` (zero-argument ``super()``) is the class."""
    out = []
    for attr, fn in sorted(vars(cls).items()):
        fn = getattr(fn, "__func__", fn)      # staticmethod / classmethod
        cells = _cells(fn, 0)
        if cells:
            out.append([name, attr, cells])
    return out


def _cells(fn, depth: int) -> dict:
    """A function's captured values, keyed: plain data as ``_plain`` has it, a captured function (a
    decorator's wrapped one) by its code and its own captured values, anything else by its type only
    (a decorator's registry or generator: not what a graph is traced from)."""
    if not isinstance(fn, types.FunctionType) or not fn.__closure__ or depth > 3:
        return {}
    cells = {}
    for var, cell in zip(fn.__code__.co_freevars, fn.__closure__):
        try:
            x = cell.cell_contents
        except ValueError:     # a cell not yet filled
            x = None
        if var == "__class__" or x is fn:
            continue
        if isinstance(x, types.FunctionType):
            cells[var] = ["fn", x.__qualname__, _code(x.__code__), _cells(x, depth + 1)]
            continue
        try:
            cells[var] = _plain(x, var)
        except (Uncacheable, RecursionError, TypeError, ValueError):
            cells[var] = ["opaque", f"{type(x).__module__}.{type(x).__qualname__}"]
    return cells


# -- structure --------------------------------------------------------------------------------------
def _plain(v: Any, where: str, depth: int = 0) -> Any:
    """A canonical JSON form of a module attribute, or Uncacheable."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(v)
    if isinstance(v, enum.Enum):
        return f"{type(v).__qualname__}.{v.name}"
    if isinstance(v, (slice, range)):       # an index a forward traces with (no __dict__ to key by)
        return [type(v).__name__, _plain([v.start, v.stop, v.step], where, depth + 1)]
    if v is Ellipsis:
        return "..."
    if type(v).__module__ == "numpy" and callable(getattr(v, "item", None)) and getattr(v, "ndim", None) == 0:
        return ["numpy", type(v).__name__, _plain(v.item(), where, depth + 1)]     # a numpy scalar
    if depth > 6:
        raise Uncacheable(f"{where} nests too deeply")
    if isinstance(v, (tuple, list)):
        return [type(v).__name__, [_plain(x, where, depth + 1) for x in v]]
    if isinstance(v, (set, frozenset)):
        return ["set", sorted(json.dumps(_plain(x, where, depth + 1), sort_keys=True) for x in v)]
    if isinstance(v, dict):
        return ["dict", sorted([str(k), _plain(x, f"{where}[{k!r}]", depth + 1)] for k, x in v.items())]
    if isinstance(v, torch.Tensor):
        t = v.detach().cpu().contiguous()
        return ["tensor", dtype_name(t.dtype), list(t.shape),
                hashlib.sha256(t.reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()]
    if isinstance(v, (types.FunctionType, types.BuiltinFunctionType, type, types.MethodType,
                      functools.partial)):
        if isinstance(v, functools.partial):
            return ["partial", _plain(v.func, where, depth + 1), _plain(v.args, where, depth + 1),
                    _plain(v.keywords, where, depth + 1)]
        if isinstance(v, types.MethodType):
            return ["method", _plain(v.__func__, where, depth + 1), type(v.__self__).__qualname__]
        if isinstance(v, types.FunctionType):
            # a name does not tell two lambdas (or two closures of one factory) apart: their code,
            # defaults and captured values do
            cells = []
            for c in v.__closure__ or ():
                try:
                    x = c.cell_contents
                except ValueError:     # a cell not yet filled
                    x = None
                cells.append(None if x is v else x)
            return ["fn", v.__module__, v.__qualname__, _code(v.__code__),
                    _plain([v.__defaults__, v.__kwdefaults__, cells], where, depth + 1)]
        return ["fn", getattr(v, "__module__", ""), getattr(v, "__qualname__", repr(v))]
    if isinstance(v, nn.Module):
        return ["module", type(v).__qualname__]   # a module held outside _modules: its class only
    if _is_hf_config(v):       # transformers' configs (one object shared by many modules)
        hit = _CONFIGS.get(id(v))
        if hit is None or hit[0] is not v:
            try:
                private = _config_private(v)
            except (RecursionError, TypeError, ValueError) as e:
                raise Uncacheable(f"{where}: its transformers config's settings: {type(e).__name__}: {e}") from e
            hit = _CONFIGS[id(v)] = (v, ["config", type(v).__qualname__, _plain(v.to_dict(), where, depth + 1),
                                         _plain(private, where, depth + 1)])
        return hit[1]
    if hasattr(v, "__dict__") and not isinstance(v, types.ModuleType):
        return ["object", f"{type(v).__module__}.{type(v).__qualname__}",
                _plain({k: x for k, x in vars(v).items()}, where, depth + 1)]
    raise Uncacheable(f"{where} is a {type(v).__name__}, which the export cache's key cannot describe")


# A transformers config's private attributes that decide what its modules compute (to_dict() leaves them
# out). Named, not every private attribute: others are metadata, some different in every process
# (GenerationConfig's _original_object_hash is a str hash, randomised per process).
_CONFIG_SETTINGS = frozenset({"_output_attentions"})


def _is_hf_config(v) -> bool:
    return callable(getattr(v, "to_dict", None)) and type(v).__module__.split(".")[0] == "transformers"


def _config_private(config) -> dict:
    """What a transformers config's ``to_dict()`` leaves out and its modules read: its private settings
    (transformers 5's ``_attn_implementation_internal``, ``_experts_implementation_internal``: any
    ``*_implementation_internal``; ``_output_attentions``), and its nested configs' (a text and a vision
    config). An sdpa model and the same model after ``set_attn_implementation("eager")`` have equal
    ``to_dict()``s and different graphs."""
    out: dict = {}
    for k, x in sorted(vars(config).items()):
        if _is_hf_config(x):
            sub = _config_private(x)
            if sub:
                out[k] = sub
        elif (k in _CONFIG_SETTINGS or k.endswith("_implementation_internal")) and (
                x is None or isinstance(x, (bool, int, float, str, dict))):
            out[k] = x
    return out


def _code(code: types.CodeType) -> str:
    """A digest of a function's code object: bytecode, names and constants (nested code included)."""
    consts = [_code(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts]
    return _sha([code.co_code.hex(), list(code.co_names), consts, code.co_argcount, code.co_kwonlyargcount])


_CONFIGS: dict[int, tuple[Any, Any]] = {}   # per structure_component call


def structure_component(model: nn.Module) -> str:
    _CONFIGS.clear()
    try:
        return _structure(model)
    finally:
        _CONFIGS.clear()


def _structure(model: nn.Module) -> str:
    tree, attrs = [], []
    for path, m in model.named_modules(remove_duplicate=False):
        if isinstance(m, torch.fx.GraphModule):
            raise Uncacheable(f"{path or 'the model'} is a torch.fx.GraphModule (generated code)")
        tree.append([path, f"{type(m).__module__}.{type(m).__qualname__}"])
        for k, v in m.__dict__.items():
            if k not in _MODULE_INTERNALS:
                attrs.append([path, k, _plain(v, f"{path or type(model).__name__}.{k}")])
    owners: dict[int, list[str]] = {}
    tensors = []
    for kind, items in (("p", model.named_parameters(remove_duplicate=False)),
                        ("b", model.named_buffers(remove_duplicate=False))):
        for name, t in items:
            owners.setdefault(id(t), []).append(name)
            tensors.append([kind, name, list(t.shape), list(t.stride()), dtype_name(t.dtype), t.device.type])
    persistent = [[p, sorted(m._non_persistent_buffers_set)] for p, m in model.named_modules()
                  if m._non_persistent_buffers_set]
    tied = sorted(sorted(v) for v in owners.values() if len(v) > 1)
    return _sha([tree, tensors, tied, persistent, attrs])


def inputs_component(args: tuple, kwargs: dict) -> str:
    leaves, spec = pytree.tree_flatten((args, kwargs))
    out = []
    for i, x in enumerate(leaves):
        if isinstance(x, torch.Tensor):
            out.append(["t", list(x.shape), list(x.stride()), dtype_name(x.dtype), x.device.type])
        else:
            out.append(["v", _plain(x, f"example input {i}")])
    return _sha([str(spec), out])


def _dims(spec: Any) -> Any:
    if spec is None or isinstance(spec, (int, str, bool)):
        return spec
    if isinstance(spec, (tuple, list)):
        return [_dims(s) for s in spec]
    if isinstance(spec, dict):
        return {str(k): _dims(s) for k, s in spec.items()}
    name = getattr(spec, "__name__", None)
    if name is not None:
        return ["dim", name, getattr(spec, "min", None), getattr(spec, "max", None), str(spec)]
    return ["other", str(spec)]


@functools.lru_cache(maxsize=1)
def _own_code() -> str:
    """A digest of the ostinato code an exported graph comes from (the front end, the passes, the IR and
    the program format): a working tree whose passes changed must not serve graphs the old passes made,
    though ``ostinato.__version__`` stays the same between releases."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parts = []
    for sub in ("frontend", "passes", "ir", "program"):
        for dirpath, dirnames, files in sorted(os.walk(os.path.join(root, sub))):
            dirnames.sort()
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(dirpath, name)
                    with open(path, "rb") as f:
                        parts.append([os.path.relpath(path, root), hashlib.sha256(f.read()).hexdigest()])
    return _sha(parts)


def export_key(model: nn.Module, args: tuple, kwargs: dict, dynamic_shapes: Any, options: dict) -> Key:
    """The export cache key of ``model`` with these inputs and options; raises Uncacheable."""
    code, pkgs = code_component(model)
    target = {"backend": "any", "arch": "any", "code": code, "structure": structure_component(model),
              "inputs": inputs_component(args, kwargs), "dynamic_shapes": _sha(_dims(dynamic_shapes)),
              "options": _sha(options)}
    # All of current_versions (triton and CUDA too, though a graph does not depend on them): bundles load
    # only entries made under this process's versions.
    versions = {**current_versions(), "codec": str(CODEC), "ostinato.export_code": _own_code(), **pkgs}
    cls = type(model)
    return make_key(KIND, f"{cls.__module__}.{cls.__qualname__}", target, versions)


# -- values -----------------------------------------------------------------------------------------
def _model_tensor(model: nn.Module, name: str) -> torch.Tensor | None:
    obj: Any = model
    for part in name.split("."):
        obj = getattr(obj, part, None) if not isinstance(obj, nn.ModuleList) or not part.isdigit() \
            else (obj[int(part)] if int(part) < len(obj) else None)
        if obj is None:
            return None
    return obj if isinstance(obj, torch.Tensor) else None


def encode_program(prog: Program, model: nn.Module) -> bytes:
    """The entry's JSON; raises Uncacheable."""
    sources = {}
    inline_bytes = 0
    for role, tensors in (("w", prog.weights), ("s", prog.state_init)):
        for name, t in tensors.items():
            own = _model_tensor(model, name)
            if own is not None and own.shape == t.shape and own.dtype == t.dtype \
                    and own.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() \
                    and own.storage_offset() == t.storage_offset() and own.stride() == t.stride():
                sources[name] = [role, "model"]
                continue
            data = t.detach().cpu().contiguous()
            raw = data.reshape(-1).view(torch.uint8).numpy().tobytes()
            inline_bytes += len(raw)
            if inline_bytes > MAX_INLINE_BYTES:
                raise Uncacheable(f"constant {name!r} is not a tensor of the model and the forward's own "
                                  f"constants exceed {MAX_INLINE_BYTES} bytes")
            sources[name] = [role, "bytes", dtype_name(data.dtype), list(data.shape),
                             base64.b64encode(raw).decode("ascii")]
    extra = {"slots": prog.inputs, "hints": prog.hints, "in_spec": pytree.treespec_dumps(prog.in_spec),
             "out_spec": pytree.treespec_dumps(prog.out_spec), "info": prog.info, "schema_version": 0}
    try:
        graph = ir_cache.encode(prog.graph, extra, [])
    except TypeError as e:
        raise Uncacheable(str(e)) from None
    doc = {"codec": CODEC, "graph": base64.b64encode(graph).decode("ascii"), "sources": sources,
           "order": [list(prog.weights), list(prog.state_init)]}
    return json.dumps(doc, separators=(",", ":")).encode()


def decode_program(blob: bytes, model: nn.Module) -> Program:
    """A Program from an entry and the model's tensors; raises ValueError when they do not fit."""
    doc = json.loads(blob)
    if doc.get("codec") != CODEC:
        raise ValueError(f"entry codec {doc.get('codec')!r}")
    graph, extra, _ = ir_cache.decode(base64.b64decode(doc["graph"]))
    tensors: dict[str, torch.Tensor] = {}
    for name, src in doc["sources"].items():
        if src[1] == "model":
            t = _model_tensor(model, name)
            if t is None:
                raise ValueError(f"the model has no tensor {name!r}")
            tensors[name] = t.detach()
        else:
            _, _, dt, shape, data = src
            raw = bytearray(base64.b64decode(data))
            tensors[name] = torch.frombuffer(raw, dtype=torch.uint8).view(DTYPES_BY_NAME[dt]).reshape(shape) \
                if raw else torch.empty(shape, dtype=DTYPES_BY_NAME[dt])
    weights = {n: tensors[n] for n in doc["order"][0]}
    state = {n: tensors[n] for n in doc["order"][1]}
    for v in graph.constants + graph.state:
        t = weights.get(v.name) if v.role == "constant" else state.get(v.name)
        if t is None or tuple(t.shape) != tuple(v.meta.shape) or t.dtype != v.meta.dtype:
            raise ValueError(f"tensor {v.name!r} does not match the cached graph")
    graph.assign_slots()
    slots = [s if isinstance(s, InputSlot) else InputSlot(*s) for s in extra["slots"]]
    return Program(graph, weights, state, pytree.treespec_loads(extra["in_spec"]),
                   pytree.treespec_loads(extra["out_spec"]), slots, extra["hints"], extra["info"])


def lookup(key: Key, model: nn.Module) -> Program | None:
    """The cached program of ``key`` with ``model``'s weights mapped in; None on a miss (a malformed entry
    is one: the model is exported instead)."""
    return cached_value(key, lambda blob: decode_program(blob, model), "export cache entry")


def store(key: Key, prog: Program, model: nn.Module) -> str | None:
    """Put ``prog``'s graph under ``key``; the reason when it cannot be cached."""
    try:
        blob = encode_program(prog, model)
    except Uncacheable as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - e.g. a pytree spec torch cannot serialize (an unregistered namedtuple)
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    try:
        get_cache().put(key, blob)
    except Exception as e:  # noqa: BLE001 - caching is an optimization
        log.debug("ostinato: export not cached: %s: %s", type(e).__name__, e)
        return f"the cache refused the entry ({type(e).__name__})"
    return None


def explain(key: Key) -> str:
    return get_cache().explain(key).describe()
