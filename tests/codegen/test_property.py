"""Property tests of generic fusion: random programs of pointwise ops and last-dim reductions
(property_cases.py's recipes) fuse, and their fused groups compute what eager computes.

- In process (fast): hypothesis draws recipes; each group runs its torch reference (ReferenceFusionBackend).
- In Triton's interpreter: a subprocess (TRITON_INTERPRET=1 must be set before Triton is imported) runs
  seeded recipes of the same builder through the generated Triton kernels (InterpretedFusionBackend).

Canaries show the checks can fail: a wrong expansion (sigmoid written as tanh) and a scheduler that
fuses nothing are both caught.
"""
from __future__ import annotations

import collections
import importlib
import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import property_cases as pc  # noqa: E402
from fusion_backend import ReferenceFusionBackend  # noqa: E402

N_INTERPRETED = 50          # seeded recipes through the generated kernels (about 0.2 s each)


class _HypothesisChooser(pc.Chooser):
    def __init__(self, draw):
        self.draw = draw

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def choice(self, seq):
        return self.draw(st.sampled_from(list(seq)))


@st.composite
def recipes(draw):
    return pc.build_recipe(_HypothesisChooser(draw))


@settings(max_examples=50, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(recipes())
def test_random_recipes_fuse_and_match_eager(recipe):
    """Exported with the generic pipeline: a fusion group wherever one step reads another's full-shaped
    value, and every output within 1e-4 of eager (the recipe is printed on failure)."""
    pc.check(recipe, ReferenceFusionBackend())


def test_generator_covers_every_op():
    """The seeded builder (the interpreter run's) draws every op, both input sorts, reductions read
    later, and mostly programs that must fuse: the property tests are not vacuous."""
    seen, fusing, reductions = collections.Counter(), 0, 0
    recipes = [pc.build_recipe(pc.RandomChooser(seed)) for seed in range(300)]
    for r in recipes:
        assert 3 <= len(r.steps) <= 10 and r.outputs and r.live() >= set(range(r.n_in, r.n_in + len(r.steps)))
        assert all(o >= r.n_in for o in r.outputs)
        seen.update((s[0], s[1]) for s in r.steps)
        seen.update(("param", p) for _, p in r.inputs)
        seen.update(("input", k) for k, _ in r.inputs)
        fusing += r.expects_fusion()
        for j, s in enumerate(r.steps):
            if s[0] == "reduce":
                reductions += 1
                v = r.n_in + j
                assert v in r.outputs or any(v in pc.operands(t) for t in r.steps[j + 1:])
    expected = {("unary", k) for k in pc.UNARY} | {("binary", k) for k in pc.BINARY} | \
        {("scalar", k) for k in pc.SCALAR} | {("reduce", k) for k in pc.REDUCE} | \
        {("param", True), ("param", False)} | {("input", k) for k in pc.INPUT_KINDS}
    assert expected <= set(seen), expected - set(seen)
    assert fusing > 0.5 * len(recipes) and reductions > 0.3 * len(recipes)


def test_canaries_pass_unpatched():
    assert pc.check(pc.CANARY, ReferenceFusionBackend()) >= 1
    assert pc.check(pc.GELU_ERF, ReferenceFusionBackend()) == 1


def test_wrong_expansion_is_caught():
    with pc.wrong_sigmoid(), pytest.raises(AssertionError, match="leaf"):
        pc.check(pc.CANARY, ReferenceFusionBackend())


def test_missing_fusion_is_caught(monkeypatch):
    """A scheduler that takes no node leaves every op unfused: check() says so."""
    monkeypatch.setattr(importlib.import_module("ostinato.codegen.schedule"), "HANDLERS", {})
    assert pc.CANARY.expects_fusion()
    with pytest.raises(AssertionError, match="no fusion group"):
        pc.check(pc.CANARY, ReferenceFusionBackend())


@pytest.fixture(scope="module")
def interpreted() -> dict:
    """property_cases.py's results in a subprocess with TRITON_INTERPRET=1 (Triton's own @triton.jit
    helpers are made interpreted when it is imported)."""
    pytest.importorskip("triton", reason="Triton is a dev dependency: pip install -e '.[dev]'")
    env = dict(os.environ, TRITON_INTERPRET="1")
    p = subprocess.run([sys.executable, os.path.join(HERE, "property_cases.py"), str(N_INTERPRETED)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_interpreted_random_recipes(interpreted):
    """Seeded recipes through the generated Triton kernels match eager."""
    cases = {k: v for k, v in interpreted.items() if k.startswith("seed")}
    assert len(cases) == N_INTERPRETED
    failed = {k: v for k, v in cases.items() if v != "ok"}
    assert not failed, "\n\n".join(f"{k}: {v}" for k, v in failed.items())


def test_interpreted_wrong_expansion_is_caught(interpreted):
    """The interpreter run compares the kernels' results: a wrong expansion fails there too."""
    assert interpreted["canary_wrong_expansion"] == "caught", interpreted["canary_wrong_expansion"]


def test_interpreted_gelu_erf(interpreted):
    """Minimal recipe: v1 = F.gelu(x0); return 2.0 * v1 (one fusion group) in the interpreter."""
    assert interpreted["gelu_erf"] == "ok", interpreted["gelu_erf"]
