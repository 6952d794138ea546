"""bench/launch_census.py on two families at batch 1 (sdpa): the per-layer count it takes from two
depths agrees with the launch list itself (the distance between attentions, the rows the deeper
export adds), Llama's and GPT-2's layers are 5 launches as test_attention_group asserts, both match
eager, and a family that fails is recorded rather than raised."""
from __future__ import annotations

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects")


def _census():
    sys.path.insert(0, ROOT)
    from bench import launch_census
    return launch_census


def test_census_counts_are_consistent(tmp_path, capsys):
    lc = _census()
    out = tmp_path / "census.json"
    assert lc.main(["--families", "llama,gpt2", "--attn", "sdpa", "--batches", "1", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| llama | sdpa | 1 | 5 |" in table and "| gpt2 | sdpa | 1 | 5 |" in table, table
    results = {r["family"]: r for r in json.loads(out.read_text())["results"]}
    for family, r in results.items():
        assert r["error"] is None, r
        shallow, deep = r["depths"]
        totals = r["launches_total"]
        assert r["per_layer"] == 5, r
        assert totals[str(deep)] - totals[str(shallow)] == r["per_layer"] * (deep - shallow), r
        assert sum(r["per_layer_launches"].values()) == r["per_layer"], r      # the added rows add up
        assert r["attention_per_layer"] == 1 and r["attention_strides"] == [5], r
        assert r["fp32_ok"] and r["bf16_max_diff"] < 0.05, r
    llama = results["llama"]
    assert llama["per_layer_launches"]["ost.decode_attention_"] == 1
    assert llama["unfused_per_layer"] == {}, llama      # every launch of a Llama layer is fused


def test_per_layer_rows_and_failures(monkeypatch):
    lc = _census()
    row = lambda kind, *ops: {"kind": kind, "ops": list(ops) or [kind]}   # noqa: E731
    shallow = [row("fused", "aten.copy", "aten.add.Tensor"), row("aten.mm"), row("ost.rope")]
    deep = [row("fused", "aten.copy", "aten.copy", "aten.add.Tensor"), row("aten.mm"), row("ost.rope"),
            row("aten.mm"), row("ost.rope"), row("aten.mm"), row("ost.rope")]
    # the bookkeeping group taking one more copy per layer keeps its key: only the layers' rows remain
    assert lc.per_layer_rows(shallow, deep, 2) == {"aten.mm": 1.0, "ost.rope": 1.0}
    assert [k for k in ("aten.mm", "ost.rope", "fused[aten.linear]") if lc.is_unfused(k)] == ["aten.mm"]
    monkeypatch.setitem(lc.FAMILIES, "nonesuch", ("NoSuchConfig", dict, "num_hidden_layers", (2, 3)))
    r = lc.census_one("nonesuch", "sdpa", 1)
    assert r["error"].startswith("build L=2: AttributeError") and r.get("per_layer") is None, r
    assert "FAILED" in lc.markdown([r])
