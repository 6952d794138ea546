"""On the GPU: every family of tests/llm/test_generate.py generates with replay (CUDA graphs of the
decode step and the prefill), and its greedy tokens equal transformers' static-cache ``generate`` on
the same GPU: in fp32 all 24 new tokens; in bf16 the first 32, up to the first step where
transformers' own logits tie at bf16's resolution (random tiny models have top logits within one
bf16 step of each other every few dozen tokens: there the two implementations may pick either, and
the continuations part ways legitimately; the test checks that such a tie is what parted them)."""
from __future__ import annotations

import math

import pytest
import torch

import ostinato
from ostinato.llm import export_causal_lm
from test_generate import CONFIGS, PROMPT, make_model, prompt

pytestmark = [pytest.mark.cuda,
              pytest.mark.filterwarnings("ignore:While compiling, we found certain side effects")]


def bf16_step(x: float) -> float:
    """The spacing of bf16 numbers around ``x`` (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(max(abs(x), 1e-30))) - 7)


@pytest.mark.parametrize("dtype, new", [(torch.float32, 24), (torch.bfloat16, 32)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", list(CONFIGS))
def test_greedy_on_the_gpu_matches_transformers(family, dtype, new):
    model = make_model(family).to(device="cuda", dtype=dtype)
    ids = prompt().cuda()
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=new, do_sample=False, cache_implementation="static", pad_token_id=0,
                             eos_token_id=None, output_logits=True, return_dict_in_generate=True)
    want = ref.sequences[0, PROMPT:].tolist()
    exe = ostinato.compile(export_causal_lm(model, max_cache_len=PROMPT + new), device="cuda", replay=True)
    # each generation's prefill is one call of its shape: the first runs step by step, the second captures
    # (replay's deferred capture), the third replays; decode replays from its third step on
    for _ in range(3):
        got = exe.generate(ids, new, stop=[])[0, PROMPT:].tolist()
        k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if k is None:
            continue
        assert dtype == torch.bfloat16, f"{family} fp32: token {k} differs: ostinato {got} vs transformers {want}"
        logits = ref.logits[k][0].float()
        gap = (logits[want[k]] - logits[got[k]]).item()
        assert gap <= 2 * bf16_step(logits[want[k]].item()), \
            f"{family} bf16: token {k} differs with transformers' logits {gap:.4f} apart (not a tie): {got} vs {want}"
    assert exe.stats()["replays"] >= new
    assert exe.methods["prefill"].stats()["replays"] >= 1
