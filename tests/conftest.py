import atexit
import os
import shutil
import sys
import tempfile

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (ROOT, os.path.join(ROOT, "src"), os.path.join(ROOT, "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)

HAS_CUDA = torch.cuda.is_available()

# ostinato.compile reads and writes the compile cache: never the user's, and no Redis unless a test
# starts its own. One directory per process (xdist workers included), removed at exit.
_CACHE_DIR = tempfile.mkdtemp(prefix="ostinato-test-cache-")
os.environ["OSTINATO_CACHE_DIR"] = _CACHE_DIR
os.environ.pop("OSTINATO_REDIS_URL", None)
atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="no CUDA device on this machine")
    for item in items:
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    """Totals of the OpInfo sweep (tests/ops/test_opinfo.py), summed from each test's "opinfo" property;
    report properties travel back from xdist workers, so this works with -n too. Printed after
    pytest's short test summary (outermost wrapper), so the line is the last but one of the run."""
    yield
    totals: dict[str, int] = {}
    cases = 0
    for reports in terminalreporter.stats.values():
        for rep in reports:
            if getattr(rep, "when", None) != "call":
                continue
            counts = dict(getattr(rep, "user_properties", ()) or ()).get("opinfo")
            if not counts:
                continue
            cases += 1
            for k, v in counts.items():
                totals[k] = totals.get(k, 0) + v
    if cases:
        terminalreporter.write_sep("=", "OpInfo sweep")
        terminalreporter.write_line(
            f"OpInfo sweep: {totals.get('passed', 0)} samples passed, "
            f"{totals.get('not_exportable', 0)} not exportable by torch.export, "
            f"{totals.get('failed', 0)} failed, {totals.get('skipped', 0)} skipped (skip list), "
            f"{totals.get('op_skipped', 0)} ops skipped; {cases} OpInfo entries")
