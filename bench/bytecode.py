"""Fresh processes with Python's bytecode cache warm, as on any machine that has run Python before.

Where site-packages hold no ``__pycache__`` and cannot get one (a read-only image, or
``PYTHONDONTWRITEBYTECODE``), every fresh process compiles each imported module from source: on the lent
GPU machines ~4.5 s of an export's 11 s went to ``compile()`` of torch's, sympy's and ostinato's modules
(scripts/profile_export.py), and torch.compile's first call pays more (it imports Inductor). A user's
machine has those caches after its first run. ``prime(env, folder)`` points the children's cache at
``folder`` (``PYTHONPYCACHEPREFIX``), lets them write it, and fills it with one process importing what
the measured ones import, so the clocks measure the work, not the bytecode compiler.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

IMPORTS = ("torch", "torch.export", "torch._dynamo", "torch._inductor.compile_fx", "transformers",
           "transformers.models.llama.modeling_llama", "ostinato", "ostinato.frontend", "ostinato.llm",
           "ostinato.backends.cuda.ops", "triton", "triton.compiler", "sympy")


def prime(env: dict, folder: str, extra: tuple[str, ...] = ()) -> dict:
    """``env`` made to use (and write) the bytecode cache in ``folder``, which one process fills; what it
    did: seconds, modules it could not import."""
    os.makedirs(folder, exist_ok=True)
    env["PYTHONPYCACHEPREFIX"] = folder
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    code = ("import importlib, json, sys\nmissing = []\n"
            f"for m in {list(IMPORTS + tuple(extra))!r}:\n"
            "    try:\n        importlib.import_module(m)\n"
            "    except Exception as e:\n        missing.append(f'{m}: {type(e).__name__}')\n"
            "print(json.dumps(missing))\n")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    missing = p.stdout.strip().splitlines()[-1] if p.returncode == 0 and p.stdout.strip() else p.stderr[-500:]
    return {"folder": folder, "seconds": round(time.perf_counter() - t0, 2), "missing": missing}
