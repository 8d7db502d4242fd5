"""Notebook 05's held-out chains side by side (malt_runs.chains): made in spawned workers on a fresh model, read back
here, the same rows as the calls made one after another in this process at one thread."""
import functools
import json

import pytest
import torch

from replication.core import cache, phases
from replication.lm import models, tasks
from replication.papers.malt import known_answers, malt, malt_runs, malt_training


def _stage(model, seed: int) -> dict:
    """A train_stage-like result: every role's adapter with LoRA A drawn for `seed` and B made nonzero, so the
    chains depend on the weights."""
    init = {r: malt_training.adapter_state(model, r) for r in malt.ROLES}
    weights = malt_training.seed_init(init, seed)
    g = torch.Generator().manual_seed(seed)
    for state in weights.values():
        for k, w in state.items():
            if "lora_B" in k:
                state[k] = torch.randn(w.shape, generator=g) * 0.5
    return {"weights": weights}


def _calls(model, problems):
    chain = dict(tokens=(6, 4, 6), temperature=1.0, batch_size=8, shots=(), sampler=None)
    first = known_answers.first_answers(problems, 0)
    return [dict(stage=_stage(model, 1), key={"seed": 1}, name="dpo", problems=problems, k=2, trained=True,
                 **{**chain, "seed": 11}),
            dict(stage=_stage(model, 2), key={"seed": 2}, name="dpo", problems=problems, k=2, trained=True,
                 **{**chain, "seed": 12}),
            dict(stage=_stage(model, 1), **known_answers.chain_call({"seed": 1}, "dpo", problems, first, trained=True,
                                                                   **{**chain, "seed": 11}))]


def _fresh(path):
    model, tok = models.load_model(str(path))
    return malt_training.add_role_adapters(model, r=8, alpha=16), tok


def test_chains_side_by_side_equal_the_chains_made_here_at_one_thread(tmp_path):
    model, tok = models.tiny_model(seed=0)
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    problems = tasks.make_level("1d-1step-add", 3, seed=0)
    here, tok_here = _fresh(tmp_path / "ckpt")
    calls = _calls(here, problems)
    malt_training.load_stage(here, _stage(here, 7))   # the notebook's model carries other weights before
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = tmp_path / "one"
        sequential = malt_runs.chains(functools.partial(cache.cached, one), one, here, tok_here, calls, workers=1)
    finally:
        torch.set_num_threads(before)
    there, tok_there = _fresh(tmp_path / "ckpt")
    two = tmp_path / "two"
    phases.reset()
    side = malt_runs.chains(functools.partial(cache.cached, two), two, there, tok_there, calls, workers=2,
                            model_name=str(tmp_path / "ckpt"), lora_r=8, rollout_dtype="float32")
    assert phases.reused_profile()["entries"] == 0      # read back, not reused: the workers made them in this call
    assert json.dumps(sequential) == json.dumps(side)
    assert len(side[0]) == 6 and len(side[2]) == 6      # 3 questions x k = 2; known: wrong then right first answers
    assert json.dumps(side[0]) != json.dumps(side[1])   # another stage and seed: other chains
    assert [r["g"] for r in side[2]] == [r["g"] for r in sequential[2]] and not side[2][0]["g_correct"]
    phases.reset()
    again = malt_runs.chains(functools.partial(cache.cached, two), two, there, tok_there, calls, workers=2,
                             model_name="no-model-needed: every entry is cached")
    assert json.dumps(again) == json.dumps(side) and phases.reused_profile()["entries"] == 3
    with pytest.raises(ValueError, match="workers=0"):
        malt_runs.chains(None, two, there, tok_there, [], workers=0)


def _sets(shift: int) -> dict:
    """pooling -> (role -> SFT examples, role -> pairs), hand-made; local differs from global for the generator only,
    as the poolings do (the verifier and refiner are then taken from the global arm)."""
    sft = [("say a", "aaaa"), ("say b", "abab")]
    pairs = [("say a", "aaaa", "zzzz"), ("say b", "abab", "zyzy"), ("go", "aaba", "zzyz"), ("hi", "baaa", "yzzz")]
    pairs = pairs[shift:] + pairs[:shift]
    glob = ({r: list(sft) for r in malt.ROLES}, {r: list(pairs) for r in malt.ROLES})
    loc = ({**glob[0], "generator": sft[:1]}, {**glob[1], "generator": pairs[:2]})
    return {"global": glob, "local": loc}


def _alone(sets: tuple) -> tuple:
    """One pooling's (SFT examples, pairs) for the generator alone, as the single-agent control trains."""
    return tuple({r: (items["generator"] if r == "generator" else []) for r in malt.ROLES} for items in sets)


def _control(jobs: dict) -> dict:
    return {s: dict(key={**j["key"], "labels": "own answer"}, name="single", init=j["init"],
                    data=(_alone(j["sets"]["global"]), _alone(j["validation"]["global"])), recipe=j["recipe"])
            for s, j in jobs.items()}


def test_trees_and_arms_side_by_side_equal_those_made_here_at_one_thread(tmp_path):
    from replication.lm import dpo

    model, tok = models.tiny_model(seed=0)
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    problems = tasks.make_level("1d-1step-add", 2, seed=0)
    tree_kw = dict(n=2, tokens=(4, 3, 4), temperature=1.0, batch_size=8)
    keys = {3: {"seed": 3}, 4: {"seed": 4}}

    def seeds(m):
        init = {r: malt_training.adapter_state(m, r) for r in malt.ROLES}
        return {s: dict(key={"seed": s}, init=malt_training.seed_init(init, s), sets=_sets(s - 3), validation=_sets(1),
                        recipe=malt_training.Recipe(
                            dpo.PreferenceConfig(lr=1e-2, epochs=1, batch_size=2, seed=s),
                            dpo.PreferenceConfig(lr=1e-2, epochs=1, batch_size=2, dpo_beta=0.5, seed=s + 10)))
                for s in (3, 4)}

    here, tok_here = _fresh(tmp_path / "ckpt")
    jobs = seeds(here)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = tmp_path / "one"
        cached_one = functools.partial(cache.cached, one)
        trees_here = malt_runs.trees(cached_one, one, here, tok_here, problems, keys, **tree_kw)
        arms_here = malt_runs.train_arms(cached_one, one, here, tok_here, jobs)
        single_here = malt_runs.single_arms(cached_one, one, here, tok_here, _control(jobs))
    finally:
        torch.set_num_threads(before)
    there, tok_there = _fresh(tmp_path / "ckpt")
    two = tmp_path / "two"
    cached_two = functools.partial(cache.cached, two)
    phases.reset()
    trees_there = malt_runs.trees(cached_two, two, there, tok_there, problems, keys, workers=2,
                                  model_name=str(tmp_path / "ckpt"), lora_r=8, **tree_kw)
    arms_there = malt_runs.train_arms(cached_two, two, there, tok_there, jobs, workers=2,
                                      model_name=str(tmp_path / "ckpt"), lora_r=8)
    single_there = malt_runs.single_arms(cached_two, two, there, tok_there, _control(jobs), workers=2,
                                         model_name=str(tmp_path / "ckpt"), lora_r=8)
    assert phases.reused_profile()["entries"] == 0   # made by this call's workers: not counted as reuse
    assert trees_here == trees_there and trees_here[3] != trees_here[4] and len(trees_there[3]["r"]) == 16
    for s in (3, 4):
        for p in malt.POOLINGS:
            a, b = arms_here[s][p], arms_there[s][p]
            assert json.dumps(a["logs"]) == json.dumps(b["logs"]) and a["reused"] == b["reused"]
            for st in ("sft", "dpo"):
                for r in malt.ROLES:
                    wa, wb = a[st]["weights"][r], b[st]["weights"][r]
                    assert all(torch.equal(wa[k], wb[k]) for k in wa)
        assert arms_there[s]["local"]["reused"] == ["verifier", "refiner"]   # the same data as the global arm
    assert json.dumps(arms_there[3]["global"]["logs"]) != json.dumps(arms_there[4]["global"]["logs"])
    for s in (3, 4):   # the single-agent control: only the generator trains
        a, b = single_here[s], single_there[s]
        assert json.dumps(a["logs"]) == json.dumps(b["logs"]) and a["logs"]["generator"]["dpo"]
        assert all(torch.equal(a["dpo"]["weights"][r][k], b["dpo"]["weights"][r][k]) for r in malt.ROLES for k in a["dpo"]["weights"][r])
    assert json.dumps(single_there[3]["logs"]) != json.dumps(single_there[4]["logs"])
    last = single_there[4]["dpo"]["weights"]   # the model ends with the last seed's control arm
    assert all(torch.equal(malt_training.adapter_state(there, r)[k], last[r][k]) for r in malt.ROLES for k in last[r])
    phases.reset()
    assert malt_runs.trees(cached_two, two, there, tok_there, problems, keys, workers=2, model_name="cached", **tree_kw) == trees_there
    malt_runs.train_arms(cached_two, two, there, tok_there, jobs, workers=2, model_name="cached")
    malt_runs.single_arms(cached_two, two, there, tok_there, _control(jobs), workers=2, model_name="cached")
    assert phases.reused_profile()["entries"] == 2 + 2 * 4 + 2 * 2   # two seeds' trees; per seed two arms and the control x (SFT, DPO)
