"""Notebook 02's arm runs side by side (evolve_runs.train_arms): trained and judged in spawned workers on a fresh
model, the degraded arm forked from its twin between the two waves, read back here in order: the same rows as the
runs made one after another in this process at one thread."""
import functools
import json

import pytest
import torch

from replication.core import cache, phases
from replication.lm import grpo, loop, models, tasks
from replication.papers.elo_evolve import evolve, evolve_eval, evolve_runs, judging

TIMES = ("wall_s", "wall_time_s", "tokens_per_s")


def _plain(trained) -> str:
    """The runs' rows, summaries and held-out rows without their timings."""
    def strip(rows):
        return [{k: v for k, v in r.items() if k not in TIMES and not k.endswith("_s")} for r in rows]
    return json.dumps([(strip(rows), {k: v for k, v in summary.items() if k not in TIMES}, ev)
                       for rows, summary, ev, _ in trained], default=str)


def _setup(tmp_path):
    model, tok = models.tiny_model(seed=0)
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    problems = tasks.make_level("1d-1step-add", 6, seed=5)
    heldout = tasks.make_level("1d-1step-add", 4, seed=9)
    pool = {name: [f"{name} says {p.answer + i}" for p in problems] for i, name in enumerate(("weak", "mid", "strong"))}
    regimes = evolve.regimes("mid", [200.0], [200.0], degrade_step=1, degrade_with="weak", k=160.0, steps=2,
                             prompts_per_step=2, seed=0)
    gcfg = grpo.GRPOConfig(num_generations=2, max_new_tokens=4, lr=1e-2, kl_beta=0.0, save_every=1, seed=0)
    args = dict(kind="quality", level="1d-1step-add", judge_shots=0, seed=0, sigma_comp=0.5, sigma_abs=1.0)
    return str(tmp_path / "ckpt"), problems, heldout, pool, regimes, gcfg, args


def _train(base, name, workers, setup):
    model_name, problems, heldout, pool, regimes, gcfg, args = setup
    folder = base / name
    ratings = [1300.0, 1500.0, 1700.0]
    setting = evolve.ArmSetting(model_name, tuple(problems), heldout=tuple(heldout), reference=("5",) * len(heldout),
                                eval_judge=evolve_eval.VerifierJudge(), lora_r=4)
    opponents = evolve.Opponents(pool, tuple(ratings))
    runs = evolve_runs.arm_runs(lambda arm, key: loop.RunFolder.keyed(folder / "training", arm, key), regimes, [0, 1],
                                gcfg, setting, opponents, {"judge": "quality"})
    judge = judging.make_judge(base=None, **args)
    return evolve_runs.train_arms(runs, setting, judge, args, opponents, functools.partial(cache.cached, folder / "cache"),
                                  folder / "cache", workers), runs


def test_arm_runs_side_by_side_equal_the_runs_made_here_at_one_thread(tmp_path):
    setup = _setup(tmp_path)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sequential, runs = _train(tmp_path, "one", 1, setup)
    finally:
        torch.set_num_threads(before)
    assert [r["name"] for r in runs] == ["point", "point", "static-mid", "static-mid", "elo-T200", "elo-T200",
                                         "elo-T200-degraded", "elo-T200-degraded"]
    assert runs[6]["twin"].path == runs[4]["folder"].path and runs[4]["twin"] is None   # seed 0's degraded arm and its twin
    phases.reset()
    side, runs2 = _train(tmp_path, "two", 2, setup)
    assert phases.reused_profile()["entries"] == 0        # read back, not reused: the workers made them in this call
    assert _plain(side) == _plain(sequential)
    assert all(seconds > 0 for *_, seconds in side)       # the workers' seconds of training and judging
    assert _plain(side[4:5]) != _plain(side[5:6])         # another training seed: another run
    degraded, twin = side[6][0], side[4][0]
    assert degraded[0] == twin[0] and degraded[1]["degraded"] and not twin[1]["degraded"]   # forked after step 1
    assert runs2[6]["folder"].done
    phases.reset()
    phases.new_execution()                                # a later execution of the notebook
    again, _ = _train(tmp_path, "two", 2, setup)          # all finished and judged: nothing for a worker to do
    assert _plain(again) == _plain(side) and phases.reused_profile()["entries"] == 2 * len(side)   # run and judging
    with pytest.raises(ValueError, match="workers=0"):
        evolve_runs.train_arms([], evolve.ArmSetting("tiny", ()), None, setup[-1], evolve.Opponents({}, ()), None,
                               tmp_path, workers=0)


def test_notebook_02s_grpo_config_comes_from_its_parameters_in_one_place():
    """kl_beta None is the paper's KL coefficient; every other field is the parameter of the same meaning."""
    from replication.run import settings  # noqa: F401
    from replication.core import config, paper, params

    cell = params.cell_values(config.ROOT / "notebooks" / "02_elo_dynamics.ipynb")
    P = params.build("02_elo_dynamics", {**cell, "lr": 1e-4, "group_size": 6})
    g = evolve_runs.grpo_config(P)
    assert g.kl_beta == paper.value("elo_evolve_temperature", quantity="kl_beta") and cell["kl_beta"] is None
    assert (g.lr, g.num_generations, g.save_every, g.seed) == (1e-4, 6, P.train_degrade_step, P.seed)
    assert evolve_runs.grpo_config(params.build("02_elo_dynamics", {**cell, "kl_beta": 0.2})).kl_beta == 0.2
