"""`ostinato generate m.ost`: the tokens equal exe.generate's (which tests/llm checks against
transformers), text in and out through a local tokenizer directory, the timing table, and the errors
as one line plus a hint."""
import json

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM

import ostinato
from ostinato.cli.main import main
from ostinato.llm import export_causal_lm

pytestmark = pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects")
WORDS = ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(61)]


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, vocab_size=len(WORDS), max_position_embeddings=64,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "embed" not in name and "lm_head" not in name:
                p.mul_(10.0)
    prog = export_causal_lm(model, max_cache_len=24)
    path = tmp_path_factory.mktemp("gen") / "lm.ost"
    prog.save(path)
    return str(path), ostinato.compile(prog)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>")
    path = tmp_path_factory.mktemp("tok")
    fast.save_pretrained(path)
    return str(path)


def _json(capsys, argv) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_tokens_match_the_api(lm, capsys):
    path, exe = lm
    r = _json(capsys, ["generate", path, "--prompt-ids", "5,9,11,30", "--max-new-tokens", "12", "--stop", "none",
                       "--runs", "2", "--json"])
    expected = exe.generate(torch.tensor([[5, 9, 11, 30]]), 12, stop=[])[0, 4:].tolist()
    assert r["tokens"] == expected and len(set(expected)) > 1
    assert r["replay"] and r["prompt_tokens"] == 4 and r["family"] == "llama"
    first, later = r["timings"]["first_run"], r["timings"]["later_runs_median"]
    assert first["new_tokens"] == later["new_tokens"] == 12
    assert first["ttft_ms"] > 0 and later["decode_tokens_per_s"] > 0
    # Step by step, the table on stdout.
    assert main(["generate", path, "--prompt-ids", "5,9,11,30", "--max-new-tokens", "12", "--stop", "none",
                 "--no-replay"]) == 0
    out = capsys.readouterr().out
    assert "tokens: " + ",".join(map(str, expected)) in out
    assert "time to first token (ms)" in out and "decode tokens/s" in out and "step by step" in out


def test_text_through_a_tokenizer(lm, tokenizer_dir, capsys):
    path, exe = lm
    r = _json(capsys, ["generate", path, "--prompt", "w3 w40 w7", "--tokenizer", tokenizer_dir,
                       "--max-new-tokens", "6", "--stop", "none", "--json"])
    ids = [WORDS.index(w) for w in ("w3", "w40", "w7")]
    expected = exe.generate(torch.tensor([ids]), 6, stop=[])[0, 3:].tolist()
    assert r["tokens"] == expected
    assert r["text"].split() == [WORDS[t] for t in expected]


@pytest.mark.parametrize("argv, message", [
    (["--prompt-ids", "1,x"], "not a comma-separated list of integers"),
    (["--prompt", "hello"], "--prompt TEXT needs --tokenizer"),
    (["--prompt-ids", "1,2", "--max-new-tokens", "40"], "exceeds the static cache of 24 positions"),
])
def test_errors(lm, capsys, argv, message):
    path, _ = lm
    assert main(["generate", path, *argv]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("ostinato generate: error: ") and message in lines[0]


def test_a_program_that_is_no_lm(tmp_path, capsys):
    path = tmp_path / "lin.ost"
    ostinato.export(torch.nn.Linear(4, 4), (torch.randn(2, 4),)).save(path)
    assert main(["generate", str(path), "--prompt-ids", "1,2"]) == 2
    assert "not a causal-LM program" in capsys.readouterr().err


def test_inspect_lists_the_methods(lm, capsys):
    path, _ = lm
    assert main(["inspect", path]) == 0
    out = capsys.readouterr().out
    assert "methods   2: decode, the graph described here; prefill over the same weights and state" in out
    assert "prefill: ids: int64[1, s" in out and "(prompt) in [2, 24]" in out
    d = _json(capsys, ["inspect", path, "--json"])
    (m,) = d["methods"]
    assert m["name"] == "prefill" and m["inputs"][0]["shape"][0] == 1 and isinstance(m["inputs"][0]["shape"][1], str)
    assert d["inputs"][0]["shape"] == [1, 1] and d["exporter"]["llm"]["max_cache_len"] == 24
