"""bench/family_decode.py on the CPU, narrowed (--small): each family the suite's matrix leaves out
(Falcon-7B's multi-query parallel block, GPT-J's interleaved partial rotary, BLOOM's ALiBi, OLMo 2's
whole-row q/k norms) builds through the suite's hf-decoder builder, and ostinato's replay passes the
suite's check against eager (a wrong runner is recorded as failed, not timed)."""
from __future__ import annotations

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects")


def test_family_decode_runs_every_family_and_replay_matches_eager(tmp_path):
    sys.path.insert(0, ROOT)
    from bench import family_decode
    out = tmp_path / "fam"
    assert family_decode.main(["--device", "cpu", "--small", "--runners", "eager,ostinato_replay",
                               "--workdir", str(tmp_path / "work"), "--out", str(out)]) == 0
    doc = json.loads((out / "results.json").read_text())
    names = [r["config"]["name"] for r in doc["configs"]]
    assert names == [f"cpu/{f}-l{n}-decode-small" for f, n in family_decode.FAMILIES.items()]
    for rec in doc["configs"]:
        # the narrowed model: 2 layers, hidden 64, whatever the family's depth keyword is called
        assert rec["config"]["params"]["layers"] == 2 and rec["config"]["params"]["narrow"], rec["config"]
        for runner in ("eager", "ostinato_replay"):
            cell = rec["cells"][runner]
            assert cell["status"] == "ok", (rec["config"]["name"], runner, cell.get("error"))
            assert cell["mean_ms"] > 0
        assert rec["cells"]["ostinato_replay"]["max_error"] <= 1e-4, rec["config"]["name"]
    assert not (out / "results.partial.json").exists()


def test_family_decode_refuses_unknown_families():
    sys.path.insert(0, ROOT)
    from bench import family_decode
    with pytest.raises(SystemExit, match="unknown families.*falcon-7b"):
        family_decode.family_configs("cpu", ["falcon-7b", "mpt"])
