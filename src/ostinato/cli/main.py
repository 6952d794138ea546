"""The ``ostinato`` command: one module per subcommand, each with ``add_arguments`` and ``run``."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from ..errors import OstinatoError, ProgramFormatError

SUBCOMMANDS = {
    "inspect": "ostinato.cli.inspect",
    "cache": "ostinato.cli.cache",
    "export": "ostinato.cli.export",
    "run": "ostinato.cli.run",
    "bench": "ostinato.cli.bench",
    "generate": "ostinato.cli.generate",
}

# The hint for errors whose message carries no "Fix:" line of its own.
DEFAULT_HINTS = (
    (FileNotFoundError, "Fix: check the path (a relative one starts from the current directory)"),
    (ProgramFormatError, "Fix: pass a program file written by `ostinato export` or Program.save; "
                         "re-export the model if the file is damaged or from another version"),
)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ostinato", description="Export, compile and run PyTorch models.")
    ap.add_argument("--verbose", action="store_true", help="show full tracebacks and debug logs")
    sub = ap.add_subparsers(dest="command", required=True)
    for name, module in SUBCOMMANDS.items():
        mod = importlib.import_module(module)
        p = sub.add_parser(name, help=mod.HELP, description=mod.__doc__)
        mod.add_arguments(p)
        # Also after the subcommand (`ostinato run m.ost --verbose`); SUPPRESS keeps the top-level value.
        p.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        p.set_defaults(_run=mod.run)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(message)s")
    # torch's own warnings (graph dumps of a failed trace) would bury the one-line error; --verbose keeps them.
    torch_log = logging.getLogger("torch")
    torch_level = torch_log.level
    if not args.verbose:
        torch_log.setLevel(logging.ERROR)
    try:
        return int(args._run(args) or 0)
    except (OstinatoError, OSError) as e:
        if args.verbose:
            raise
        first, *rest = str(e).strip().splitlines() or [type(e).__name__]
        hint = next((line[line.index("Fix:"):] for line in rest if "Fix:" in line), "")
        if not hint and "Fix:" in first:       # a one-line message with its fix at the end
            first, hint = first[:first.index("Fix:")].rstrip(" .;"), first[first.index("Fix:"):]
        sys.stderr.write(f"ostinato {args.command}: error: {first}\n")
        default = next((h for kind, h in DEFAULT_HINTS if isinstance(e, kind)), "run with --verbose for details")
        sys.stderr.write(f"  {hint.strip() or default}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"ostinato {args.command}: interrupted\n")
        return 130
    except Exception as e:  # not one of ours: still one line, but say it may be a bug
        if args.verbose:
            raise
        first = (str(e).strip().splitlines() or [""])[0]
        sys.stderr.write(f"ostinato {args.command}: error: {type(e).__name__}: {first}\n"
                         "  unexpected: run with --verbose for the traceback, and report it if ostinato is at fault\n")
        return 1
    finally:
        torch_log.setLevel(torch_level)


if __name__ == "__main__":
    sys.exit(main())
