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
try:
    import mlx.core  # noqa: F401
    HAS_MLX, _MLX_MISSING = True, ""
except ImportError as _e:  # MLX has no wheel for this platform (or was not installed)
    HAS_MLX, _MLX_MISSING = False, str(_e)
# scripts/test.sh sets this where MLX installs (Linux, macOS): its tests must run there, never skip.
REQUIRE_MLX = os.environ.get("OSTINATO_REQUIRE_MLX") == "1"

# ostinato.compile reads and writes the compile cache: never the user's, and no Redis unless a test
# starts its own. One directory per process (xdist workers included), removed at exit.
_CACHE_DIR = tempfile.mkdtemp(prefix="ostinato-test-cache-")
os.environ["OSTINATO_CACHE_DIR"] = _CACHE_DIR
os.environ.pop("OSTINATO_REDIS_URL", None)
atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)
# Replay's tests count captures, replays and static buffers from a shape's first call on: they run with
# the capture on the first call. The default (the first call step by step, the capture on the second) is
# tested with this unset (tests/replay/test_capture_call.py).
os.environ["OSTINATO_CAPTURE_CALL"] = "1"
# save() leaves its file to be hashed at the saving process's exit (program/reader.check_saved): off in
# the tests and the processes they start, on in tests/program/test_data_verified.py, which checks it.
os.environ["OSTINATO_CHECK_SAVED"] = "0"


# Under compute-sanitizer (scripts/gpu_reliability.py) torch's cuDNN attention reads past an
# exactly-sized mask (reproduced there without ostinato) and the kernel's fault ends the process; the
# sanitizer runs set this so torch's SDPA (references, fallbacks) takes its other kernels and every
# kernel of ostinato's is still checked.
if HAS_CUDA and os.environ.get("OSTINATO_TEST_NO_CUDNN_SDPA") == "1":
    torch.backends.cuda.enable_cudnn_sdp(False)


def pytest_configure(config):
    if REQUIRE_MLX and not HAS_MLX:
        raise pytest.UsageError(f"OSTINATO_REQUIRE_MLX=1 but MLX does not import ({_MLX_MISSING}); install it "
                                "with pip install 'mlx[cpu]' (Linux) or pip install mlx (macOS)")


def slow_ids(path: str | None = None) -> set[str]:
    """The test ids of tests/slow_tests.txt (comments and blank lines dropped)."""
    path = path or os.path.join(os.path.dirname(os.path.abspath(__file__)), "slow_tests.txt")
    with open(path) as f:
        return {line.split("#", 1)[0].strip() for line in f} - {""}


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="no CUDA device on this machine")
    skip_mlx = pytest.mark.skip(reason=f"MLX is not installed here ({_MLX_MISSING})")
    slow = slow_ids()
    for item in items:
        # ids relative to the repository (tests/...), with and without their parameters
        node = item.nodeid if item.nodeid.startswith("tests/") else "tests/" + item.nodeid
        if node in slow or node.split("[", 1)[0] in slow:
            item.add_marker(pytest.mark.slow)
        if "cuda" in item.keywords and not HAS_CUDA:
            item.add_marker(skip)
        if "mlx" in item.keywords and not HAS_MLX:
            item.add_marker(skip_mlx)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _no_exit_check_of_saved_files():
    """Files a test noted for the exit check (with OSTINATO_CHECK_SAVED=1) are forgotten after it."""
    yield
    from ostinato.program import reader
    reader._saved.clear()


@pytest.fixture(autouse=True)
def _no_aoti_probe_by_default(monkeypatch):
    """The benchmark suite's AOTInductor probe (bench/suite/startup.aoti_probe) compiles a package in a fresh
    process: off in the tests unless one turns it on (tests/bench/test_suite.py's probe tests do)."""
    monkeypatch.setenv("OSTINATO_SUITE_AOTI_PROBE", "0")


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
