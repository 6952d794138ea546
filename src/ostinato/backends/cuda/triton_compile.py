"""Compiling one Triton kernel specialization to a cubin, with nothing of ostinato imported.

``compile_function`` is what ``binaries.compile_binary`` runs in-process. Run as a script
(``python -P triton_compile.py``), the same code serves compile requests from the parent on stdin, one
JSON line each, and answers each with a JSON line and the cubin's bytes: the worker processes of
``compile_workers``. A worker imports Triton (~0.3 s), never torch or ostinato (~2 s), and loads kernel
sources from their files by path.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from typing import Any, Sequence

# Launch-type letters of torch's static launcher, by Triton scalar type.
LAUNCH_TYPE = {"i1": "i", "i8": "b", "i16": "h", "i32": "i", "i64": "l", "u8": "B", "u16": "H", "u32": "I",
               "u64": "K", "fp16": "f", "bf16": "f", "fp32": "f", "fp64": "d"}
# Specialization keys that are compile options, not constexprs of the kernel.
_OPTIONS = ("num_warps", "num_stages")


class CompileError(Exception):
    """A specialization that does not compile; the message names the kernel and the reason."""


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def load_function(path: str, kernel: str):
    """The ``@triton.jit`` function ``kernel`` of the source file ``path`` (imported once per path)."""
    name = "ostinato_kernel_source_" + os.path.splitext(os.path.basename(path))[0]
    mod = sys.modules.get(name)
    if mod is None or getattr(mod, "__file__", None) != path:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod     # Triton's JIT looks its function's module up by name
        spec.loader.exec_module(mod)
    return getattr(mod, kernel)


def compile_function(fn, kernel: str, arg_types: Sequence[str], constexprs: dict[str, Any],
                     arch: int) -> tuple[dict[str, Any], bytes]:
    """({name, num_warps, shared, arg_types: launch letters}, cubin) of one specialization of ``fn`` for
    ``sm_<arch>``. ``arg_types`` holds one Triton type per runtime parameter (``*bf16``, ``i32``,
    ``fp32``), with ``:D`` where the value is 16-divisible (a pointer 16-byte aligned, an int a multiple
    of 16), or ``:1`` for an int equal to 1, compiled in as a constant and not passed at launch: the
    specializations Triton's JIT would make. Raises CompileError."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    runtime = [p.name for p in fn.params if not p.is_constexpr]
    if len(runtime) != len(arg_types):
        raise CompileError(f"Triton kernel {kernel} takes {len(runtime)} runtime arguments "
                           f"({', '.join(runtime)}), got {len(arg_types)}")
    missing = [p.name for p in fn.params if p.is_constexpr and p.name not in constexprs and p.name not in _OPTIONS]
    if missing:
        raise CompileError(f"Triton kernel {kernel}: no value for constexpr {', '.join(missing)}")
    signature, attrs, constexprs = {}, {}, dict(constexprs)
    options = {k: constexprs.pop(k) for k in _OPTIONS if k in constexprs}
    for p in fn.params:
        if p.is_constexpr:
            signature[p.name] = "constexpr"
    for name, ty in zip(runtime, arg_types):
        base, _, hint = ty.partition(":")
        signature[name] = base
        if hint == "D":
            attrs[(fn.arg_names.index(name),)] = [["tt.divisibility", 16]]
        elif hint == "1":
            signature[name] = "constexpr"
            constexprs[name] = 1
    signature = {p.name: signature[p.name] for p in fn.params}
    try:
        compiled = triton.compile(ASTSource(fn, signature, dict(constexprs), attrs),
                                  target=GPUTarget("cuda", arch, 32), options=options)
    except Exception as e:  # noqa: BLE001 - re-raised naming the kernel
        spec = ", ".join(f"{k}={v}" for k, v in constexprs.items())
        raise CompileError(f"Triton kernel {kernel} [{spec}] for sm_{arch} failed to compile: "
                           f"{type(e).__name__}: {_first_line(e)}") from e
    md = compiled.metadata
    if getattr(md, "num_ctas", 1) != 1:
        raise CompileError(f"Triton kernel {kernel}: num_ctas {md.num_ctas} is not supported")
    letters = "".join("O" if t.startswith("*") else LAUNCH_TYPE[t.partition(":")[0]]
                      for t in arg_types if not t.endswith(":1"))
    for scratch in ("global_scratch_size", "profile_scratch_size"):
        if hasattr(md, scratch):
            if getattr(md, scratch) > 0:   # the launcher would have to allocate it: not for these kernels
                raise CompileError(f"Triton kernel {kernel} needs {scratch}={getattr(md, scratch)}")
            letters += "O"      # the parameter exists; a null pointer fills it
    meta = {"name": md.name, "num_warps": int(md.num_warps), "shared": int(md.shared), "arg_types": letters}
    return meta, compiled.asm["cubin"]


def serve(requests, answers) -> None:
    """Answer compile requests until ``requests`` ends: per JSON line ``{path, kernel, arg_types,
    constexprs, arch}``, one JSON line ``{ok, meta | error, seconds, nbytes}`` and ``nbytes`` of cubin."""
    for line in requests:
        if not line.strip():
            continue
        t0 = time.perf_counter()
        cubin = b""
        try:
            req = json.loads(line)
            fn = load_function(req["path"], req["kernel"])
            meta, cubin = compile_function(fn, req["kernel"], req["arg_types"], req["constexprs"], req["arch"])
            head = {"ok": True, "meta": meta}
        except Exception as e:  # noqa: BLE001 - every failure is an answer; the parent raises it
            head = {"ok": False, "error": str(e) if isinstance(e, CompileError)
                    else f"{type(e).__name__}: {_first_line(e)}"}
        head.update(seconds=time.perf_counter() - t0, nbytes=len(cubin))
        try:
            answers.write(json.dumps(head).encode() + b"\n" + cubin)
            answers.flush()
        except BrokenPipeError:     # the parent has gone (it exited, or gave up waiting): nobody to answer
            return


def main() -> None:
    # Answers go to a private copy of stdout; whatever Triton or a kernel's module prints goes to stderr.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
