"""Generate program/fb/ from schema.fbs with flatc (Debian's flatbuffers-compiler).

``python -m ostinato.program.codegen`` rewrites the generated code; ``--check`` exits 1 when it is
stale. The generated files are committed so that running ostinato needs no flatc.
"""
from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA = os.path.join(HERE, "schema.fbs")
OUT = os.path.join(HERE, "fb")


def generate(dest: str) -> list[str]:
    """Run flatc into ``dest``; return the generated file names."""
    flatc = shutil.which("flatc")
    if flatc is None:
        raise RuntimeError("flatc not found; install Debian's flatbuffers-compiler (apt-get install "
                           "flatbuffers-compiler)")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([flatc, "--python", "-o", tmp, SCHEMA], check=True)
        src = os.path.join(tmp, "ostinato", "program", "fb")
        os.makedirs(dest, exist_ok=True)
        names = sorted(f for f in os.listdir(src) if f.endswith(".py"))
        for name in names:
            shutil.copyfile(os.path.join(src, name), os.path.join(dest, name))
    return names


def is_stale() -> list[str]:
    """Generated files that differ from what flatc makes of schema.fbs now (empty when fresh)."""
    with tempfile.TemporaryDirectory() as tmp:
        names = generate(tmp)
        have = sorted(f for f in os.listdir(OUT) if f.endswith(".py")) if os.path.isdir(OUT) else []
        stale = [n for n in names if n not in have or not filecmp.cmp(os.path.join(tmp, n), os.path.join(OUT, n),
                                                                     shallow=False)]
        stale += [n for n in have if n not in names]
    return stale


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--check", action="store_true", help="exit 1 if program/fb/ is stale")
    args = ap.parse_args(argv)
    if args.check:
        stale = is_stale()
        if stale:
            sys.stderr.write(f"program/fb is stale ({', '.join(stale)}); run python -m ostinato.program.codegen\n")
            return 1
        return 0
    for name in os.listdir(OUT) if os.path.isdir(OUT) else []:
        if name.endswith(".py"):
            os.remove(os.path.join(OUT, name))
    generate(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
