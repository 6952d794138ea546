"""The ``ostinato`` command: one module per subcommand, each with ``add_arguments`` and ``run``."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from ..errors import OstinatoError

SUBCOMMANDS = {
    "inspect": "ostinato.cli.inspect",
    "cache": "ostinato.cli.cache",
}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ostinato", description="Export, compile and run PyTorch models.")
    ap.add_argument("--verbose", action="store_true", help="show full tracebacks and debug logs")
    sub = ap.add_subparsers(dest="command", required=True)
    for name, module in SUBCOMMANDS.items():
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=mod.HELP, description=mod.__doc__)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(message)s")
    try:
        return int(args._run(args) or 0)
    except (OstinatoError, OSError) as e:
        if args.verbose:
            raise
        first, *rest = str(e).strip().splitlines() or [type(e).__name__]
        sys.stderr.write(f"ostinato {args.command}: error: {first}\n")
        hint = next((line for line in rest if line.strip().startswith("Fix")), "")
        sys.stderr.write(f"  {hint.strip() or 'run with --verbose for details'}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
