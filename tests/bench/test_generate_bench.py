"""bench/generate.py on the CPU at a narrow shape: every runner reports, and in fp32 ostinato's greedy
tokens equal transformers' (the GPU run, at real shapes with torch.compile, is not part of CI)."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects")


def test_generate_bench_smoke(tmp_path):
    sys.path.insert(0, ROOT)
    from bench.generate import main
    out = tmp_path / "gen.json"
    assert main(["--device", "cpu", "--dtype", "float32", "--shapes", "llama-mini", "--layers", "1", "--prompt", "8",
                 "--new-tokens", "8", "--runs", "1", "--peers", "hf-eager", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    (row,) = r["shapes"]
    assert set(row["runners"]) == {"ostinato", "hf-eager"} and row["layers"] == 1
    for name, res in row["runners"].items():
        assert res["median"]["ttft_s"] > 0 and res["median"]["decode_tokens_per_s"] > 0, name
        assert res["leading_tokens_equal_to_hf"] == 8, name
