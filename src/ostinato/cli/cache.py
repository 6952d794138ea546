"""Inspect and move the compile cache: stats, clear, pack/unpack bundles, explain misses."""
from __future__ import annotations

import argparse
import sys

from ..cache import get_cache, load_artifacts, make_key, save_artifacts
from ..cache.disk import DiskTier
from ..cache.keys import current_target
from . import write_json
from ..errors import OstinatoError

HELP = "show, clear, pack, unpack or explain the compile cache"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("stats", help="per-tier counters (hits, misses, puts, evictions, errors, bytes)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    sub.add_parser("clear", help="empty every tier (memory, disk directory, Redis keys)")
    s = sub.add_parser("pack", help="write the memory and disk entries to a bundle FILE")
    s.add_argument("file")
    s = sub.add_parser("unpack", help="load a bundle FILE into the cache (entries for other machines are skipped)")
    s.add_argument("file")
    s.add_argument("--json", action="store_true", help="print the load report as JSON")
    s = sub.add_parser("explain", help="why a key misses: the stored entries of a kind and content that differ")
    s.add_argument("kind", nargs="?", help="entry kind (e.g. plan); omit to explain every stored content")
    s.add_argument("content", nargs="?", help="content hash of the entry")
    s.add_argument("--backend", default="cpu", help="target backend to explain for (default cpu)")
    s.add_argument("--arch", default=None, help="target arch (default: this machine's)")
    s.add_argument("--export", metavar="MODULE:FACTORY",
                   help="why `ostinato export MODULE:FACTORY` would miss the export cache: the stored export "
                        "of the same model class nearest to it and the components that differ (code, "
                        "structure, inputs, dynamic_shapes, options, versions)")
    s.add_argument("--example-inputs", metavar="SPEC", help="with --export: the example inputs, as for export")
    s.add_argument("--seed", type=int, default=0, help="with --export: seed of the random --example-inputs")


def _stats(args: argparse.Namespace) -> int:
    cache = get_cache()
    disk = cache.tier("disk")
    if isinstance(disk, DiskTier):
        disk.refresh_stats()  # a fresh process has counted nothing; show what the directory holds
    st = cache.stats()
    if args.json:
        write_json(st)
        return 0
    cols = ["hits", "misses", "puts", "evictions", "errors", "bytes"]
    sys.stdout.write(f"{'tier':8s}" + "".join(f"{c:>11s}" for c in cols) + "\n")
    for name, counts in st.items():
        sys.stdout.write(f"{name:8s}" + "".join(f"{counts[c]:11d}" for c in cols) + "\n")
    if isinstance(disk, DiskTier):
        sys.stdout.write(f"disk directory: {disk.root}\n")
    return 0


def _explain_export(args: argparse.Namespace) -> int:
    from ..frontend.export import export_cache_key
    from .factory import call_factory, example_inputs
    built = call_factory(args.export)
    ex_args = example_inputs(args.example_inputs, seed=args.seed) if args.example_inputs is not None \
        else built.args
    if ex_args is None:
        raise OstinatoError(f"{args.export} returned a model without example inputs\n"
                            "Fix: pass --example-inputs SPEC, as to ostinato export")
    key, why = export_cache_key(built.model.eval(), ex_args if isinstance(ex_args, tuple) else (ex_args,),
                                built.kwargs or {})
    if key is None:
        sys.stdout.write(f"export {args.export}: not cached: {why}\n")
        return 0
    sys.stdout.write(f"export {args.export}: {get_cache().explain(key).describe()}\n")
    return 0


def _explain(args: argparse.Namespace) -> int:
    if args.export:
        return _explain_export(args)
    cache = get_cache()
    if (args.kind is None) != (args.content is None):
        raise OstinatoError("cache explain takes both KIND and CONTENT, or neither\n"
                            "Fix: ostinato cache explain plan <content hash>")
    groups = [(args.kind, args.content)] if args.kind else cache.groups()
    if not groups:
        sys.stdout.write("the cache is empty\n")
        return 0
    try:
        target = current_target(args.backend)
    except ValueError:
        target = {"backend": args.backend, "arch": args.arch or ""}
    if args.arch:
        target["arch"] = args.arch
    for kind, content in groups:
        ex = cache.explain(make_key(kind, content, target=target))
        sys.stdout.write(f"{kind} {content[:16]}: {ex.describe()}\n")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.action == "stats":
        return _stats(args)
    if args.action == "clear":
        get_cache().clear()
        sys.stdout.write("cache cleared\n")
        return 0
    if args.action == "pack":
        blob = save_artifacts()
        with open(args.file, "wb") as f:
            f.write(blob)
        sys.stdout.write(f"wrote {len(blob)} bytes to {args.file}\n")
        return 0
    if args.action == "unpack":
        with open(args.file, "rb") as f:
            blob = f.read()
        try:
            report = load_artifacts(blob)
        except ValueError as e:
            raise OstinatoError(f"{args.file}: {e}\nFix: pass a file written by `ostinato cache pack`") from None
        if args.json:
            write_json(report.as_dict())
            return 0
        sys.stdout.write(f"loaded {len(report.loaded)} entries, skipped {len(report.skipped)}\n")
        for digest, reason in report.skipped:
            sys.stdout.write(f"  skipped {digest[:12]}: {reason}\n")
        return 0
    if args.action == "explain":
        return _explain(args)
    raise OstinatoError(f"unknown cache action {args.action!r}")
