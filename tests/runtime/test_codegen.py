"""runtime/codegen.py: a plan's first runs loop over its launches, later ones call the generated
function; both leave the same values in the environment (only the kept slots written, the inputs read),
on random launch lists with unpacked results, unused results, keyword and list arguments."""
from __future__ import annotations

import random

import pytest
import torch

from ostinato.backends.base import Launch, _Slot, _SlotList
from ostinato.runtime import codegen


def _random_plan(rng: random.Random, inputs: int, steps: int):
    """Launches over ``inputs`` leading slots: adds, scaled sums of a list, a split into two results
    (one sometimes unused); and the slots kept (some produced, one input)."""
    launches, live, nxt = [], list(range(inputs)), inputs
    for i in range(steps):
        kind = rng.choice(("add", "sum", "split"))
        a, b = rng.choice(live), rng.choice(live)
        if kind == "add":
            launches.append(Launch.of(torch.add, "aten.add", f"add{i}", (_Slot(a), _Slot(b)),
                                      {"alpha": rng.choice((1, 2.5))}, (nxt,), False))
            live.append(nxt)
            nxt += 1
        elif kind == "sum":
            items = _SlotList([_Slot(rng.choice(live)) for _ in range(rng.randint(1, 3))] + [torch.ones(4)])
            launches.append(Launch.of(lambda xs, scale: sum(xs) * scale, "ost.sum", f"sum{i}", (items,),
                                      {"scale": rng.random()}, (nxt,), False))
            live.append(nxt)
            nxt += 1
        else:
            second = nxt + 1 if rng.random() < 0.7 else -1
            launches.append(Launch.of(lambda x: (x * 2, x - 1), "ost.split", f"split{i}", (_Slot(a),), {},
                                      (nxt, second), True))
            live += [s for s in (nxt, second) if s >= 0]
            nxt += 2
    produced = [o for launch in launches for o in launch.outs if o >= 0]
    keep = set(rng.sample(produced, k=min(3, len(produced)))) | {produced[-1], 0}
    return launches, keep, nxt


@pytest.mark.parametrize("seed", range(6))
def test_interpreted_and_generated_runs_leave_the_same_environment(seed, monkeypatch):
    rng = random.Random(seed)
    launches, keep, slots = _random_plan(rng, inputs=3, steps=rng.randint(4, 20))
    monkeypatch.setattr(codegen, "INTERPRETED_RUNS", 2)
    plan = codegen.compile_launches(launches, keep)
    envs = []
    for run in range(4):
        env = [torch.randn(4, generator=torch.Generator().manual_seed(seed * 10 + j)) if j < 3 else None
               for j in range(slots)]
        ins = [t.clone() for t in env[:3]]
        plan(env)
        assert all(torch.equal(a, b) for a, b in zip(env[:3], ins))          # inputs untouched
        # only kept slots written: every other produced slot is still empty
        assert [j for j in range(3, slots) if env[j] is not None] == sorted(k for k in keep if k >= 3)
        envs.append(env)
        assert (plan._fn is not None) == (run >= 2), run                     # generated from the third run
    for j in sorted(keep):
        for env in envs[1:]:
            torch.testing.assert_close(env[j], envs[0][j], rtol=0, atol=0)
    assert plan.source.startswith("def plan(env):")


def _env(slots: int) -> list:
    return [torch.randn(4) if j < 2 else None for j in range(slots)]


@pytest.mark.parametrize("runs", [0, 2], ids=["generated", "interpreted"])
def test_unused_results_and_bad_unpacking_behave_alike(runs, monkeypatch):
    """A launch whose only result is unused runs for its effect in both forms; a launch that returns
    fewer results than it unpacks raises in both (nothing written to the environment); a slot listed
    twice among the results is released once."""
    monkeypatch.setattr(codegen, "INTERPRETED_RUNS", runs)
    calls = []
    side = Launch.of(lambda x: calls.append(x.clone()), "ost.effect", "effect", (_Slot(0),), {}, (-1,), False)
    add = Launch.of(torch.add, "aten.add", "add", (_Slot(0), _Slot(1)), {}, (2,), False)
    twice = Launch.of(lambda x: (x, x + 1), "ost.pair", "pair", (_Slot(2),), {}, (3, 3), True)
    out = Launch.of(torch.neg, "aten.neg", "neg", (_Slot(3),), {}, (4,), False)
    env = _env(5)
    codegen.compile_launches([side, add, twice, out], {4})(env)
    assert len(calls) == 1 and torch.equal(calls[0], env[0])
    assert env[2] is None and env[3] is None
    torch.testing.assert_close(env[4], -(env[0] + env[1] + 1))
    short = Launch.of(lambda x: (x,), "ost.one", "one", (_Slot(0),), {}, (2, 3), True)
    env = _env(4)
    with pytest.raises(ValueError):
        codegen.compile_launches([short], {2, 3})(env)
    assert env[2] is None and env[3] is None
