"""ostinato.llm: export_causal_lm on transformers models as they come (default config, use_cache on),
and generation over the program, token for token against transformers' own ``generate`` with a static
cache (greedy, fp32, CPU). Tiny ``from_config`` models with random weights; every 1-D weight is
perturbed so that norms and biases are not the identity (a kernel that ignores them would pass
otherwise), and the layers' weights are scaled up so that greedy continuations do not collapse to one
repeated token."""
from __future__ import annotations

import sys

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM

import ostinato
from ostinato.errors import ExportError, InputError, OstinatoError
from ostinato.llm import export_causal_lm, sample, stream
from ostinato.llm.export import blocking_site

pytestmark = pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects")

VOCAB, CACHE, PROMPT, NEW = 96, 32, 7, 16
TOKENS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
DEC = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
           vocab_size=VOCAB, max_position_embeddings=64, **TOKENS)
# Sliding windows of 8 < prompt + new tokens: the windows slide during the test.
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**DEC),
    "qwen2": lambda: transformers.Qwen2Config(**DEC),
    "mistral": lambda: transformers.MistralConfig(sliding_window=8, **DEC),
    "gemma": lambda: transformers.GemmaConfig(head_dim=16, **DEC),
    "gemma2": lambda: transformers.Gemma2Config(head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
                                                attn_logit_softcapping=5.0, final_logit_softcapping=3.0, **DEC),
    "phi3": lambda: transformers.Phi3Config(**DEC),
    "gpt2": lambda: transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_inner=128, vocab_size=VOCAB,
                                            n_positions=64, **TOKENS),
    "opt": lambda: transformers.OPTConfig(hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
                                          word_embed_proj_dim=64, vocab_size=VOCAB, max_position_embeddings=64,
                                          **TOKENS),
}


def make_model(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[family]()).eval()
    assert model.config.use_cache
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:   # norms at 1 (Gemma: 0 for its 1+w) and biases at 0 after from_config
                p.uniform_(-0.5, 0.5) if name.endswith("bias") or "gemma" in family else p.uniform_(0.5, 1.5)
            elif not any(k in name for k in ("embed", "wte", "wpe", "lm_head")):
                # from_config's std 0.02 leaves the layers a small correction to the (tied) embeddings, and
                # greedy search then repeats one token; stronger layers make the continuation vary.
                p.mul_(10.0)
    return model


def reference(model, ids, new=NEW, **kw) -> torch.Tensor:
    """transformers' greedy generation with a static cache."""
    kw.setdefault("eos_token_id", None)
    with torch.no_grad():
        return model.generate(ids, max_new_tokens=new, do_sample=False, cache_implementation="static",
                              pad_token_id=0, **kw)


@pytest.fixture(scope="module")
def llama():
    model = make_model("llama")
    return model, export_causal_lm(model, max_cache_len=CACHE)


def prompt(batch: int = 1, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, PROMPT), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", list(CONFIGS))
def test_greedy_matches_transformers(family):
    model = make_model(family)
    prog = export_causal_lm(model, max_cache_len=CACHE)
    assert list(prog.methods) == ["prefill"] and prog.info["llm"]["family"] == model.config.model_type
    caches = [n for n in prog.state_init if "key_cache" in n or "value_cache" in n]
    assert len(caches) == 2 * 2 and all(prog.state_init[n].shape[2] == CACHE for n in caches)
    exe = ostinato.compile(prog)
    ids = prompt()
    out = exe.generate(ids, NEW, stop=[])
    ref = reference(model, ids)
    assert out.tolist() == ref.tolist(), f"{family}: ostinato {out.tolist()} vs transformers {ref.tolist()}"
    assert len(set(out[0, PROMPT:].tolist())) >= 3, f"{family}: degenerate continuation {out.tolist()}"
    # Again, over the cache the first generation left behind: stale positions are never read.
    assert exe.generate(ids, NEW, stop=[]).tolist() == ref.tolist()


def test_save_load_replay_and_batch(llama, tmp_path):
    model, prog = llama
    path = tmp_path / "llama.ost"
    prog.save(path)
    loaded = ostinato.load(path)
    assert list(loaded.methods) == ["prefill"]
    assert loaded.methods["prefill"].weights is loaded.weights
    assert {v.name for v in loaded.methods["prefill"].graph.constants} == {v.name for v in loaded.graph.constants}
    from ostinato.program.writer import to_bytes
    assert to_bytes(loaded) == path.read_bytes()   # same bytes after a round trip
    assert to_bytes(export_causal_lm(model, max_cache_len=CACHE)) == path.read_bytes()   # and exported again
    exe = ostinato.compile(loaded, replay=True)
    ids = prompt()
    ref = reference(model, ids)
    for _ in range(2):   # the second generation replays both captures over a used cache
        assert exe.generate(ids, NEW, stop=[]).tolist() == ref.tolist()
    stats = exe.stats()
    assert stats["captures"] == 1 and stats["replays"] >= 2 * (NEW - 1) - 1
    assert exe.methods["prefill"].stats()["captures"] == 1
    # The weights are placed (and the sibling projections packed) once for both entry points.
    pre = exe.methods["prefill"]
    by_name = {v.name: pre._template[v.slot] for v in pre.program.graph.constants}
    for v in exe.program.graph.constants:
        assert exe._template[v.slot].data_ptr() == by_name[v.name].data_ptr(), v.name
    from ostinato.ir.fused_ops import _packed_rows
    from ostinato.runtime.packing import _groups
    packed = [g for g in _groups(exe.program.graph) if _packed_rows([exe._template[v.slot] for v in g]) is not None]
    assert len(packed) >= 2   # q, k, v of both layers at least, in one buffer each, shared
    # Packed in place: the file lays each group out in one run and the loaded weights are views of one
    # mapping, so packing copied nothing.
    assert all(exe._template[v.slot].data_ptr() == loaded.weights[v.name].data_ptr() for g in packed for v in g)


def test_batch_two():
    model = make_model("qwen2")
    exe = ostinato.compile(export_causal_lm(model, max_cache_len=CACHE, batch=2))
    ids = prompt(batch=2)
    assert exe.generate(ids, NEW, stop=[]).tolist() == reference(model, ids).tolist()
    with pytest.raises(InputError, match="batch 2"):
        exe.generate(ids[:1], 4)


def test_stop_tokens_end_like_transformers(llama):
    model, prog = llama
    exe = ostinato.compile(prog)
    ids = prompt()
    free = exe.generate(ids, NEW, stop=[])[0, PROMPT:].tolist()
    stop = free[5]
    out = exe.generate(ids, NEW, stop=stop, sync_every=2)
    ref = reference(model, ids, eos_token_id=stop)
    assert out.tolist() == ref.tolist() and out.shape[1] == PROMPT + free.index(stop) + 1
    assert [int(t) for t in stream(exe, ids, NEW, stop=[stop])] == free[:free.index(stop) + 1]


def test_no_prefill_method_and_streaming(llama):
    model, _ = llama
    prog = export_causal_lm(model, max_cache_len=CACHE, dynamic_prefill=False)
    assert prog.methods == {} and "prefill" not in prog.info["llm"]["methods"]
    exe = ostinato.compile(prog)
    ids = prompt(seed=3)
    ref = reference(model, ids)
    seen = []
    stats = {}
    out = exe.generate(ids, NEW, stop=[], callback=lambda step, tok: seen.append((step, int(tok))), stats=stats)
    assert out.tolist() == ref.tolist()
    assert seen == list(enumerate(ref[0, PROMPT:].tolist()))
    assert stats["new_tokens"] == NEW and stats["prompt_tokens"] == PROMPT and stats["ttft_s"] > 0


def test_sampling(llama):
    _, prog = llama
    exe = ostinato.compile(prog)
    ids = prompt()
    a = exe.generate(ids, NEW, temperature=1.0, seed=5, stop=[])
    b = exe.generate(ids, NEW, temperature=1.0, seed=5, stop=[])
    c = exe.generate(ids, NEW, temperature=1.0, seed=6, stop=[])
    assert a.tolist() == b.tolist() and a.tolist() != c.tolist()
    assert exe.generate(ids, NEW, temperature=0.7, top_k=1, seed=1, stop=[]).tolist() == \
        exe.generate(ids, NEW, stop=[]).tolist()
    logits = torch.randn(4, 50)
    assert torch.equal(sample(logits, 1.0, top_p=1e-6, generator=torch.Generator().manual_seed(0)), logits.argmax(-1))
    top3 = logits.topk(3).indices
    picks = sample(logits.repeat(50, 1), 2.0, top_k=3, generator=torch.Generator().manual_seed(0)).view(50, 4)
    assert all(int(p) in top3[j].tolist() for row in picks for j, p in enumerate(row))


def test_errors(llama, monkeypatch):
    _, prog = llama
    exe = ostinato.compile(prog)
    with pytest.raises(InputError, match="exceeds the static cache of 32"):
        exe.generate(prompt(), CACHE)
    bert = transformers.BertModel(transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                                          intermediate_size=64, vocab_size=64))
    with pytest.raises(ExportError, match=r"bert \(BertModel\) has no LM head"):
        export_causal_lm(bert, 16)
    with pytest.raises(OstinatoError, match="max_position_embeddings"):
        export_causal_lm(llama[0], 1000)
    plain = ostinato.compile(ostinato.export(torch.nn.Linear(4, 4), (torch.randn(2, 4),)))
    with pytest.raises(OstinatoError, match="export_causal_lm"):
        plain.generate(torch.tensor([[1, 2]]), 2)
    with pytest.raises(OstinatoError, match="no method 'prefill'"):
        plain.method("prefill")
    try:   # an export failure names the model's source line it stopped at
        raise RuntimeError("Could not guard\n  File \"/x/site-packages/transformers/models/opt/modeling_opt.py\", "
                           "line 99, in forward\n    y = f(x)") from ValueError("inner cause")
    except RuntimeError as e:
        assert blocking_site(e).startswith("forward() at transformers/models/opt/modeling_opt.py:99")
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(OstinatoError, match=r"pip install 'transformers>=4\.50"):
        export_causal_lm(llama[0], 16)


def test_readme_example_runs_and_matches_transformers():
    """The README's five lines, as written; their default stop (the model's EOS) ends like transformers."""
    import os
    import re
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    blocks = [b for b in re.findall(r"```python\n(.*?)```", open(os.path.join(root, "README.md")).read(), re.S)
              if "export_causal_lm" in b]
    assert len(blocks) == 1
    ns: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), ns)
    tokens, model = ns["tokens"], ns["model"]
    with torch.no_grad():
        ref = model.generate(torch.tensor([[1, 5, 9]]), max_new_tokens=16, do_sample=False,
                             cache_implementation="static")
    assert tokens.tolist() == ref.tolist() and 3 < tokens.shape[1] <= 19


def test_all_ones_mask_path(llama, monkeypatch):
    """The export's fallback for transformers versions that size a missing mask by the cache's fill
    level (5.17's OPT): an all-ones mask over the cache gives the same tokens."""
    import ostinato.llm.export as lm_export
    model, _ = llama

    class WithMask(lm_export.CausalLMStep):
        def __init__(self, cached, max_cache_len, full_mask=False):
            super().__init__(cached, max_cache_len, full_mask=True)

    monkeypatch.setattr(lm_export, "CausalLMStep", WithMask)
    exe = ostinato.compile(export_causal_lm(model, max_cache_len=CACHE))
    ids = prompt(seed=4)
    assert exe.generate(ids, NEW, stop=[]).tolist() == reference(model, ids).tolist()
