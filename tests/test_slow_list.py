"""tests/slow_tests.txt (the tests CI's command leaves to the GPU check): every id names a test function
that exists, with parameters only where the test takes them, and conftest marks exactly those tests."""
from __future__ import annotations

import ast
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def slow_ids() -> set[str]:
    """The ids of tests/slow_tests.txt, read as tests/conftest.py reads them (it is not importable as a module
    under xdist's workers)."""
    with open(os.path.join(ROOT, "tests", "slow_tests.txt")) as f:
        return {line.split("#", 1)[0].strip() for line in f} - {""}


def _functions(path: str) -> dict[str, bool]:
    """Test functions of a file: name -> whether it is parametrized."""
    with open(os.path.join(ROOT, path)) as f:
        tree = ast.parse(f.read())
    return {n.name: any("parametrize" in ast.unparse(d) for d in n.decorator_list)
            for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")}


def test_every_slow_id_names_a_test():
    ids = slow_ids()
    assert len(ids) > 100
    missing = []
    for node in sorted(ids):
        path, _, name = node.partition("::")
        base, bracket, _ = name.partition("[")
        if not os.path.exists(os.path.join(ROOT, path)):
            missing.append(f"{node}: no file {path}")
            continue
        funcs = _functions(path)
        if base not in funcs:
            missing.append(f"{node}: no test {base} in {path}")
        elif bracket and not funcs[base]:
            missing.append(f"{node}: {base} takes no parameters")
    assert not missing, "stale ids in tests/slow_tests.txt:\n" + "\n".join(missing)


def test_conftest_marks_the_listed_tests_slow():
    """Collecting one file with -m slow gives exactly its listed tests (all their parameters)."""
    path = "tests/program/test_fuzz.py"
    listed = {n for n in slow_ids() if n.startswith(path + "::")}
    assert listed
    p = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "-m", "slow", path], cwd=ROOT, capture_output=True, text=True, timeout=300)
    slow = {line.strip() for line in p.stdout.splitlines() if line.startswith("tests/")}
    assert slow and {n.split("[", 1)[0] for n in slow} == {n.split("[", 1)[0] for n in listed}
    everything = set(_functions(path))
    assert {n.split("::")[1].split("[")[0] for n in slow} < everything     # and not every test of the file
