"""The benchmark suite from a checkout, without installing ostinato: same options as ``ostinato bench``.

    .venv/bin/python bench/run_suite.py --device cpu --quick --out /tmp/bench
    python3 bench/run_suite.py --device cuda --part 1/13 --out $OUT/part1
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src"), ROOT]

from ostinato.cli import bench  # noqa: E402
from ostinato.errors import OstinatoError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=bench.__doc__)
    bench.add_arguments(ap)
    args = ap.parse_args(argv)
    try:
        return bench.run(args)
    except OstinatoError as e:
        first, *rest = str(e).splitlines()
        sys.stderr.write(f"run_suite: error: {first}\n" + "".join(f"  {line}\n" for line in rest))
        return 2


if __name__ == "__main__":
    sys.exit(main())
