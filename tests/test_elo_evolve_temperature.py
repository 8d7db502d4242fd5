"""Elo-Evolve's temperature analysis on the real model (notebook 02, part 2): the degradation schedule (the strongest
opponent replaced at the stated step, ratings kept), the fork of a degraded run from its twin, the temperature arms'
opponent sampling, the quality judge's noise ratio set to the paper's, and the temperature / degradation statistics."""
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from replication.run import runner
from replication.core import params as core_params
from replication.core import paper
from replication.lm import elo, grpo, loop, models, tasks, training
from replication.papers.elo_evolve import evolve, judging, temperature
from replication.papers.elo_evolve.params import EloDynamics

NAMES, RATINGS = ("weak", "mid", "strong"), [1300.0, 1500.0, 1700.0]


class RecordingJudge(judging.QualityJudge):
    """A quality judge that records the opponent responses it compares against, step by step."""

    def __init__(self):
        super().__init__(1.0, 1.0)
        self.seen = []

    def p_win(self, questions, answers, a, b):
        self.seen.append(list(b))
        return super().p_win(questions, answers, a, b)


def tiny_run(regime="elo", steps=4, folder=None, degrade_step=None, opponent=None, temperature_=200.0, save_every=1,
             ratings=RATINGS):
    model, tok = models.tiny_model(seed=0)
    torch.manual_seed(0)
    model = models.add_lora(model, r=4, alpha=8)
    problems = tasks.make_level("1d-1step-add", 8, seed=5)
    pool = {name: [f"{name} says {p.answer + i}" for p in problems] for i, name in enumerate(NAMES)}
    judge = RecordingJudge()
    cfg = evolve.EvolveConfig(regime=regime, opponent=opponent, steps=steps, prompts_per_step=3, temperature=temperature_,
                              seed=1, degrade_step=degrade_step, degrade_with=None if degrade_step is None else "weak")
    gcfg = grpo.GRPOConfig(num_generations=2, max_new_tokens=4, lr=1e-2, kl_beta=0.0, save_every=save_every, seed=0)
    rows = evolve.train(model, tok, judge, evolve.ArmSetting("tiny", tuple(problems), progress=False),
                        evolve.Opponents(pool, tuple(ratings)), cfg, gcfg, folder)
    return rows, judge, model


# ---------------------------------------------------------------- the degradation schedule

def test_pool_at_replaces_the_strongest_from_the_stated_step_and_keeps_the_ratings():
    pool = {n: [f"{n}-{i}" for i in range(3)] for n in NAMES}
    ratings = [1500.0, 1300.0, 1700.0]                    # the strongest by rating is the third, named "strong"
    cfg = evolve.EvolveConfig(regime="elo", steps=10, degrade_step=6, degrade_with="weak")
    for t in range(6):
        assert evolve.pool_at(pool, ratings, cfg, t) == (pool, False)
    for t in (6, 9):
        now, degraded = evolve.pool_at(pool, ratings, cfg, t)
        assert degraded and now["strong"] == pool["weak"] and now["weak"] == pool["weak"] and now["mid"] == pool["mid"]
    assert pool["strong"] == ["strong-0", "strong-1", "strong-2"]      # the built pool itself is untouched
    assert ratings == [1500.0, 1300.0, 1700.0]
    assert evolve.strongest(["a", "b", "c"], [1500.0, 1300.0, 1700.0]) == "c"
    plain = evolve.EvolveConfig(regime="elo", steps=10)
    assert all(evolve.pool_at(pool, ratings, plain, t) == (pool, False) for t in range(10))


@pytest.mark.parametrize("bad, match", [({"degrade_step": 10, "degrade_with": "weak"}, "degrade_step"),
                                        ({"degrade_step": 0, "degrade_with": "weak"}, "degrade_step"),
                                        ({"degrade_step": 3, "degrade_with": "nobody"}, "degrade_with"),
                                        ({"regime": "point", "degrade_step": 3, "degrade_with": "weak"}, "point")])
def test_a_bad_degradation_is_named(bad, match):
    with pytest.raises(ValueError, match=match):
        evolve.EvolveConfig(**{"regime": "elo", "steps": 10, **bad}).validate(list(NAMES))


def test_a_degraded_run_meets_the_replacement_from_the_stated_step_with_the_old_rating(tmp_path):
    rows, judge, _ = tiny_run("static", steps=4, degrade_step=2, opponent="strong")
    assert [r["degraded"] for r in rows] == [False, False, True, True]
    for t, seen in enumerate(judge.seen):      # every opponent drawn is "strong"; its replies are weak's from step 2
        assert all(b.startswith("weak says" if t >= 2 else "strong says") for b in seen)
    for r in rows:                             # the Elo update still reads the strongest's own (old) rating
        assert r["opponents"] == ["strong"] * 3
        np.testing.assert_allclose(r["expected"], elo.expected_score(r["rating_before"], [RATINGS[2]] * 6))
        assert r["rating"] == pytest.approx(elo.update(r["rating_before"], r["outcomes"], [RATINGS[2]] * 6, 32.0, "mean"))


def test_the_elo_arm_samples_by_the_fixed_ratings_before_and_after_the_degradation():
    rows, judge, _ = tiny_run("elo", steps=4, degrade_step=2, temperature_=20.0)
    for t, (r, seen) in enumerate(zip(rows, judge.seen)):
        np.testing.assert_allclose(r["probs"], elo.sampling_probs(r["rating_before"], RATINGS, 20.0))
        want = [("weak" if (o == "strong" and t >= 2) else o) for o in r["opponents"] for _ in range(2)]
        assert [b.split(" says ")[0] for b in seen] == want


def test_fork_starts_a_degraded_run_from_its_twin_as_if_trained_from_the_start(tmp_path):
    twin = loop.RunFolder(tmp_path / "twin")
    tiny_run("elo", steps=4, folder=twin, save_every=2)
    forked = loop.RunFolder(tmp_path / "forked")
    assert evolve.fork(twin, forked, 2)
    assert not evolve.fork(twin, forked, 2)                   # it has a checkpoint now: nothing is copied again
    assert [r["step"] for r in forked.rows()] == [0, 1] and forked.copied() == 2   # the twin's steps, not its own
    rows_f, judge_f, model_f = tiny_run("elo", steps=4, folder=forked, degrade_step=2, save_every=2)
    assert len(judge_f.seen) == 2                             # only the steps after the fork were run
    rows_s, _, model_s = tiny_run("elo", steps=4, folder=loop.RunFolder(tmp_path / "straight"), degrade_step=2, save_every=2)
    assert [r["rating"] for r in rows_f] == [r["rating"] for r in rows_s]
    assert [r["opponents"] for r in rows_f] == [r["opponents"] for r in rows_s]
    a, b = training.trainable(model_f), training.trainable(model_s)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not evolve.fork(loop.RunFolder(tmp_path / "empty"), loop.RunFolder(tmp_path / "x"), 2)   # no checkpoint there


def test_degraded_arms_and_their_twins_by_name():
    arms_ = evolve.regimes("mid", [20, 200, 2000], [20, 200], 5, "weak", steps=10)
    assert list(arms_) == ["point", "static-mid", "elo-T20", "elo-T200", "elo-T2000", "elo-T20-degraded", "elo-T200-degraded"]
    d = arms_["elo-T20-degraded"]
    assert (d.temperature, d.degrade_step, d.degrade_with) == (20.0, 5, "weak")
    name, cfg = evolve.degrade_source("elo-T20-degraded", d)
    assert name == "elo-T20" and cfg == arms_["elo-T20"]
    assert evolve.degrade_source("elo-T20", arms_["elo-T20"]) is None
    assert evolve.table1_arms(arms_) == ("point", "static-mid", "elo-T200")
    assert evolve.table1_arms(evolve.regimes("mid", [50], steps=3))[2] == "elo-T50"
    with pytest.raises(ValueError, match="degrade_temperatures"):
        evolve.regimes("mid", [200], [20], 5, "weak")
    # an undegraded arm's run key is the one it had before the degradation fields existed
    key = evolve.run_key("m", arms_["elo-T20"], grpo.GRPOConfig(), 4, {"x": ["r"]}, [1.0])
    assert "degrade_step" not in key["regime"]
    assert evolve.run_key("m", d, grpo.GRPOConfig(), 4, {"x": ["r"]}, [1.0])["regime"]["degrade_step"] == 5


# ---------------------------------------------------------------- the temperature arms' opponent sampling

@pytest.mark.parametrize("T", [20.0, 200.0, 2000.0])
def test_each_temperature_arm_draws_its_opponents_from_its_own_distribution(T):
    cfg = evolve.EvolveConfig(regime="elo", temperature=T, prompts_per_step=20000)
    rng = np.random.default_rng(3)
    idx, probs = evolve.choose(cfg, 1450.0, list(NAMES), RATINGS, rng)
    np.testing.assert_allclose(probs, elo.sampling_probs(1450.0, RATINGS, T))
    np.testing.assert_allclose(np.bincount(idx, minlength=3) / len(idx), probs, atol=0.01)
    if T == 20.0:
            assert probs[1] > 0.99                     # the nearest opponent, mid (50 Elo away; the others 150, 250)
    if T == 2000.0:
        assert probs.max() - probs.min() < 0.1     # nearly uniform


def test_lower_temperatures_concentrate_on_the_nearest_opponent():
    p = {T: elo.sampling_probs(1350.0, RATINGS, T) for T in (20.0, 200.0, 2000.0)}
    assert p[20.0][0] > p[200.0][0] > p[2000.0][0] > 1 / 3


# ---------------------------------------------------------------- the judge's noise ratio

def test_the_quality_judge_noise_is_set_to_the_papers_ratio():
    ratio = paper.value("elo_evolve_noise", statistic="ratio_gap1")
    noise = judging.quality_noise(1.0)
    assert noise["ratio"] == ratio and noise["source"] == "paper"
    assert np.sqrt(2) * noise["sigma_abs"] / noise["sigma_comp"] == pytest.approx(ratio)
    assert judging.quality_noise(0.5)["sigma_abs"] == pytest.approx(ratio * 0.5 / np.sqrt(2))
    assert judging.quality_noise(1.0, 2.0) == {"sigma_comp": 1.0, "sigma_abs": pytest.approx(2 / np.sqrt(2)), "ratio": 2.0,
                                               "source": "set"}
    judge = judging.QualityJudge(noise["sigma_comp"], noise["sigma_abs"])
    back = judging.measured_noise_ratio(judge, n=100000, seed=1)     # read back from the judge's own outcomes
    assert back["ratio"] == pytest.approx(ratio, abs=0.35)
    assert back["p_comparison"] == pytest.approx(0.8413, abs=0.01) and back["p_absolute"] < back["p_comparison"]
    for bad, match in (({"sigma_comp": 0}, "sigma_comp"), ({"abs_noise_ratio": -1.0}, "abs_noise_ratio")):
        with pytest.raises(ValueError, match=match):
            judging.quality_noise(**bad)


# ---------------------------------------------------------------- statistics of the temperature arms

def fake_run(opponents, outcomes, prompts, k=1):
    """Step rows of an Elo run: per step the prompts' opponents, G = 2 outcomes per prompt, expected 0.5."""
    return [{"opponents": o, "outcomes": s, "expected": [0.5] * len(s), "prompts": p, "zero_std_frac": 0.0,
             "rating": 0.0} for o, s, p in zip(opponents, outcomes, prompts)]


def test_exposure_before_and_after_the_degradation_step():
    rows = fake_run([["weak", "strong"], ["strong", "strong"], ["strong", "mid"]],
                    [[0, 0, 1, 1], [1, 1, 0, 1], [1, 1, 0, 0]], [[0, 1], [2, 3], [4, 5]])
    ex = temperature.exposure(rows, NAMES, RATINGS, step=1)
    assert ex["strongest"] == "strong"
    assert ex["drew_strongest_before"] == 0.5 and ex["win_vs_strongest_before"] == 1.0
    assert ex["drew_strongest_after"] == 0.75 and ex["win_vs_strongest_after"] == pytest.approx((1 + 0.5 + 1) / 3)
    whole = temperature.exposure(rows, NAMES, RATINGS)
    assert whole["drew_strongest_before"] == pytest.approx(4 / 6) and np.isnan(whole["drew_strongest_after"])


def test_rating_difference_is_paired_by_seed_and_prompt():
    a = [fake_run([["weak"]] * 2, [[1, 1], [1, 0]], [[0], [1]]), fake_run([["weak"]] * 2, [[1, 1], [1, 1]], [[2], [3]])]
    b = [fake_run([["mid"]] * 2, [[0, 0], [1, 0]], [[0], [1]]), fake_run([["mid"]] * 2, [[0, 1], [1, 1]], [[2], [3]])]
    d = temperature.rating_difference(a, b, k=10.0, n_boot=200)
    # per prompt K x steps x mean(S - E), a - b: seed 0 10 x 2 x [1, 0], seed 1 10 x 2 x [0.5, 0]
    assert d["per_seed"] == pytest.approx([10.0, 5.0]) and d["difference"] == pytest.approx(7.5)
    assert d["n"] == "2 seeds x 2 prompts"
    with pytest.raises(ValueError, match="same prompts"):
        temperature.rating_difference(a, [b[1], b[0]], k=10.0)


def test_degradation_drops_and_their_difference():
    ids = list(range(4))
    tab = lambda c: pd.DataFrame({"id": ids, "correct": c})  # noqa: E731
    rec = lambda n: {"arm": n, "healthy": True, "failed_checks": []}  # noqa: E731
    evals = {"elo-T20": [tab([1, 1, 1, 0])] * 2, "elo-T20-degraded": [tab([0, 0, 1, 0])] * 2,
             "elo-T200": [tab([1, 0, 1, 0])] * 2, "elo-T200-degraded": [tab([1, 0, 1, 0])] * 2}
    records = {n: [rec(n)] * 2 for n in evals}
    records["elo-T200-degraded"] = [rec("elo-T200-degraded"), {"arm": "elo-T200-degraded", "healthy": False,
                                                               "failed_checks": ["learned"]}]
    out = temperature.degradation(evals, records, [20, 200], seed=0)
    assert out["T20"]["difference"] == pytest.approx(-0.5) and out["T200"]["difference"] == 0.0
    dd = out["drop T20 - drop T200"]
    assert dd["difference"] == pytest.approx(-0.5) and dd["per_seed"] == pytest.approx([-0.5, -0.5])
    assert "elo-T200-degraded: learned" in dd["basis"]["health"]


# ---------------------------------------------------------------- the notebook's parameters

def params_with(**changes):
    cell = core_params.cell_values(runner.NOTEBOOKS / "02_elo_dynamics.ipynb")
    return EloDynamics(**{**{k: cell[k] for k in cell if k in EloDynamics.__dataclass_fields__}, **changes}).validate()


def test_the_default_trains_at_the_yardsticks_setting_and_every_degraded_arm_has_its_twin():
    cfg = params_with()
    assert (cfg.level, cfg.shots, cfg.lr) == ("2d-1step-add", 3, 3e-4)     # notebook 00's choice
    assert {float(t) for t in cfg.degrade_temperatures} <= {float(t) for t in cfg.train_temperatures}
    assert replace(cfg, train_temperatures=[200], degrade_temperatures=None).validate()   # the study can be switched off
    assert cfg.graded_judge == "likelihood" and replace(cfg, graded_judge=None).validate()   # and section (k)


@pytest.mark.parametrize("bad, match", [({"degrade_temperatures": [50]}, "degrade_temperatures"),
                                        ({"train_degrade_step": 10}, "train_degrade_step"),
                                        ({"degrade_with": "nobody"}, "degrade_with"),
                                        ({"graded_judge": "quality"}, "graded_judge"),
                                        ({"graded_judge": "nobody"}, "graded_judge")])
def test_bad_temperature_parameters_are_named(bad, match):
    with pytest.raises(ValueError, match=match):
        params_with(**bad)


def test_reward_snr_orders_the_rewards_by_their_noise():
    """The verifier tells a group most, one comparison less, two absolute scores least; less comparison noise (the same
    ratio) tells more; the verifier's signal does not depend on the judge."""
    snr = {}
    for sc in (1.0, 0.5):
        noise = judging.quality_noise(sc)
        t = judging.reward_snr(judging.QualityJudge(sc, noise["sigma_abs"]), 0.3, groups=3000, seed=0).set_index("reward")
        snr[sc] = t["signal / noise"]
        assert t.loc["exact verifier", "signal / noise"] > t.loc["comparison, right opponent", "signal / noise"]
        assert min(t.loc["comparison, right opponent", "signal / noise"], t.loc["comparison, wrong opponent", "signal / noise"]) \
            > 2 * t.loc["absolute score (point)", "signal / noise"]
    assert snr[1.0]["exact verifier"] == snr[0.5]["exact verifier"]
    assert snr[0.5]["comparison, wrong opponent"] > snr[1.0]["comparison, wrong opponent"]
    with pytest.raises(ValueError, match="accuracy"):
        judging.reward_snr(judging.QualityJudge(), 1.5)
