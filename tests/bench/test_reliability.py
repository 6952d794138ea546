"""bench/reliability.py, short: damaged files loaded in worker subprocesses give only clean refusals with
verification on, and the harness itself counts a dying worker as a crash and a silent one as a hang
(and replaces it)."""
from __future__ import annotations

import os
import sys
import textwrap

from bench import reliability


def test_short_fault_run_only_clean_errors(tmp_path):
    out = tmp_path / "faults.json"
    res = reliability.run(files=150, seed=7, timeout=60.0, workers=2, out_path=str(out))
    assert out.exists()
    assert res["loads"] == 450
    for mode, counts in res["by_verify"].items():
        assert sum(counts.values()) == 150, (mode, counts)
        assert counts["crash"] == 0 and counts["hang"] == 0, (mode, counts)
        if mode in ("True", "checksums"):
            assert counts["other_error"] == 0, (mode, counts, res["examples"])
        assert counts["format_error"] > 0
    # verify=False skips the checksums, so more damaged files get through to decoding and load.
    assert res["by_verify"]["False"]["loaded"] > res["by_verify"]["checksums"]["loaded"]
    assert res["good_files_intact_after"] == "4/4"
    assert res["worker_starts"] == 2


def test_harness_counts_crashes_and_hangs(tmp_path):
    """A stand-in worker: crashes on a path ending in 'crash' (SIGSEGV), hangs on 'hang', else answers."""
    script = tmp_path / "stub.py"
    script.write_text(textwrap.dedent("""
        import json, os, signal, sys, time
        print(json.dumps({"ready": os.getpid()}), flush=True)
        for line in sys.stdin:
            path = json.loads(line)["path"]
            if path.endswith("crash"):
                os.kill(os.getpid(), signal.SIGSEGV)
            if path.endswith("hang"):
                time.sleep(60)
            print(json.dumps({"outcome": "format_error", "error": "X", "seconds": 0.0}), flush=True)
    """))
    w = reliability.Worker(dict(os.environ), timeout=1.0, argv=[sys.executable, str(script)])
    try:
        assert w.load("a", True)["outcome"] == "format_error"
        crash = w.load("b.crash", True)
        assert crash["outcome"] == "crash" and crash["returncode"] == -11
        assert w.load("c", True)["outcome"] == "format_error"        # a fresh worker took over
        hang = w.load("d.hang", True)
        assert hang["outcome"] == "hang" and 1.0 <= hang["seconds"] < 5.0
        assert w.load("e", True)["outcome"] == "format_error"
        assert w.starts == 3
    finally:
        w.stop()
