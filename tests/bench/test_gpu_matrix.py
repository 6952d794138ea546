"""scripts/gpu_matrix.sh's bookkeeping across calls (no GPU: the warm-up is marked done and the budget leaves
no time to time anything): which configurations are still untimed, what each call copies out, and the
merge once every configuration has a result."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import ROOT

MATRIX = os.path.join(ROOT, "docs", "benchmarks", "fusion_matrix_gpu_1129_h200_673833e", "results.json")


def _call(state, out):
    env = dict(os.environ, STATE=str(state), OUT=str(out), BUDGET="10", PYTHON=sys.executable)
    p = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_matrix.sh")], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_untimed_configurations_are_counted_then_merged(tmp_path):
    with open(MATRIX) as f:
        whole = json.load(f)
    state, out = tmp_path / "state", tmp_path / "out"
    (state / "timed" / "run0").mkdir(parents=True)
    (state / "warm.done").touch()
    part = dict(whole, configs=whole["configs"][:5], partial=True)
    (state / "timed" / "run0" / "results.partial.json").write_text(json.dumps(part))
    text = _call(state, out)
    assert f"matrix: {len(whole['configs']) - 5} configurations left" in text, text
    assert json.loads((out / "run0_results.partial.json").read_text())["configs"] == part["configs"]
    assert not (out / "matrix").exists()
    # a later run holds the rest: the merge takes both runs' configurations, each once
    (state / "timed" / "run1").mkdir()
    rest = dict(whole, configs=whole["configs"][5:])
    (state / "timed" / "run1" / "results.json").write_text(json.dumps(rest))
    text = _call(state, out)
    assert "matrix: complete" in text, text
    merged = json.loads((out / "matrix" / "results.json").read_text())
    assert sorted(c["config"]["name"] for c in merged["configs"]) == sorted(c["config"]["name"] for c in whole["configs"])
