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
