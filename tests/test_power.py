"""How many seeds a comparison needs (replication.core.power) and the command that plans a ledger's rows
(replication.ledger.seeds): the simulation against statsmodels' and scipy's closed forms, the question part read back from a
recorded interval, and why the rule dropped its every-seed clause (more seeds made 'reproduced' rarer)."""
import json
import math

import numpy as np
import pytest
from scipy.stats import norm
from statsmodels.stats.power import TTestPower

from replication.ledger import seeds as seeds_cli
from replication.core import power, stats


@pytest.mark.parametrize("mean, sd, n", [(0.08, 0.05, 3), (0.05, 0.05, 5), (0.03, 0.06, 10), (0.0, 0.05, 4)])
def test_clearing_no_effect_is_the_one_sided_t_test_power(mean, sd, n):
    """With no question part the interval is the t interval over seeds, so the chance that it lies wholly above no
    effect is the power of a one-sided t test at 2.5% (statsmodels, the noncentral t); at no effect, the chance of a
    'not reproduced' is the same test's size."""
    out = power.verdict_chances(mean, sd, 0.0, n, sims=20000, seed=1)
    ref = TTestPower().power(effect_size=mean / sd, nobs=n, alpha=0.025, alternative="larger")
    assert out["clears"] == pytest.approx(ref, abs=0.012)
    if mean == 0:
        assert out["not reproduced"] == pytest.approx(0.025, abs=0.006)


@pytest.mark.parametrize("mean, sd, n", [(0.08, 0.055, 3), (0.08, 0.055, 20), (-0.1, 0.1, 5)])
def test_every_seed_share_is_the_normal_chance_to_the_power_of_the_seeds(mean, sd, n):
    direction = 1 if mean > 0 else -1
    out = power.verdict_chances(mean, sd, 0.0004, n, direction=direction, sims=20000, seed=2)
    assert out["every_seed"] == pytest.approx(norm.cdf(abs(mean) / sd) ** n, abs=0.012)


def test_chances_add_up_and_two_runs_agree_by_the_sum_of_squares():
    out = power.verdict_chances(0.05, 0.05, 0.0004, 3, sims=3000, seed=0)
    p = [out[k] for k in power.OUTCOMES]
    assert sum(p) == pytest.approx(1.0)
    assert out["same"] == pytest.approx(sum(x * x for x in p))
    assert power.verdict_chances(0.05, 0.05, 0.0004, 3, sims=3000, seed=0) == out   # seeded


def test_more_seeds_make_a_real_lead_more_likely_reproduced():
    """A lead about 1.5 seed SDs wide: at 20 seeds the interval clears no effect almost always and the verdict is
    `reproduced` as often, although a seed falls on the other side in most such runs (every_seed, shown beside it:
    the every-seed clause the rule once had made 'reproduced' rarer at 20 seeds than at 5)."""
    five, twenty = (power.verdict_chances(0.08, 0.055, 0.0004, s, sims=4000, seed=3) for s in (5, 20))
    assert twenty["clears"] > 0.99 and twenty["reproduced"] == pytest.approx(twenty["clears"], abs=0.001)
    assert twenty["reproduced"] > five["reproduced"] and twenty["every_seed"] < 0.5


@pytest.mark.parametrize("seed_sd, question_sd", [(0.05, 0.001), (0.05, 0.03), (0.03, 0.2), (0.0, 0.03)])
def test_the_question_part_is_read_back_from_the_interval(seed_sd, question_sd):
    """An interval made by stats.seeds_and_questions gives back its own question variance among those that fit its
    width, and every value given back reproduces that width."""
    rng = np.random.default_rng(5)
    per_seed = 0.05 + rng.normal(0, seed_sd, 3) if seed_sd else np.full(3, 0.05)
    draws = rng.normal(0, question_sd, 4000)
    lo, hi, _ = stats.seeds_and_questions(per_seed, draws)
    found = power.question_variances(per_seed, (per_seed.mean() + lo, per_seed.mean() + hi))
    assert min(abs(v - draws.var(ddof=1)) for v in found) <= 1e-9 + 1e-6 * draws.var(ddof=1)
    v_seed = per_seed.var(ddof=1) / 3
    for v in found:
        assert stats.joined_half(v_seed, v, 3)[0] == pytest.approx(hi, rel=1e-6)


def test_a_width_can_fit_two_question_parts():
    """At three seeds the half-width falls, then rises, as the question part grows (it adds degrees of freedom
    first), so a width between its lowest point and the seeds-only width fits two question parts."""
    v_seed = 1.0
    halves = [stats.joined_half(v_seed, r, 3)[0] for r in (0.0, 0.75, 10.0)]
    assert halves[1] < halves[0] < halves[2]
    per_seed = np.array([-1.0, 0.0, 1.0]) * math.sqrt(3)   # variance 3, so v_seed = 1
    found = power.question_variances(per_seed, (-3.5, 3.5))
    assert len(found) == 2 and found[0] < 0.75 < found[1]


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="n_seeds"):
        power.verdict_chances(0.1, 0.05, 0.0, 1)
    with pytest.raises(ValueError, match="question_variance"):
        power.verdict_chances(0.1, 0.05, -1.0, 3)
    with pytest.raises(ValueError, match="per_seed"):
        power.question_variances([0.1], (0.0, 0.2))
    lo, hi = power.sd_range(1.0, 3)
    assert lo == pytest.approx(0.5778, abs=1e-3) and hi == pytest.approx(4.4154, abs=1e-3)


def _ledger(tmp_path, claims):
    folder = tmp_path / "metrics"
    folder.mkdir()
    (folder / "03_rlpr_debiasing.json").write_text(json.dumps({"notebook": "03_rlpr_debiasing", "claims": claims}))
    return folder


def _claim(text, interval, diffs, verdict, **kw):
    return {"claim": text, "verdict": verdict, "interval": interval, "seed_differences": diffs,
            "n": "3 seeds x 200 questions", "estimate": float(np.mean(diffs)), "direction": 1, "null": 0.0,
            "effect": None, **kw}


def test_the_command_plans_every_comparison_over_seeds(tmp_path, capsys):
    folder = _ledger(tmp_path, [
        _claim("RLPR beats RLVR [sums; oracle]", [0.010341, 0.169659], [0.045, 0.13, 0.095], "reproduced"),
        _claim("one run", [0.0, 0.2], [0.1], "inconclusive"),
        _claim("mean ranks better than product", [-0.06, 0.072], [0.044, -0.011, -0.015], "inconclusive",
               n="3 draws x 28 questions"),
        {"claim": "arithmetic", "verdict": "reproduced", "interval": None, "seed_differences": None}])
    assert seeds_cli.main([str(folder), "--seeds", "3,10", "--sims", "500"]) == 0
    out = capsys.readouterr().out
    assert "RLPR beats RLVR" in out and "[sums" not in out and "one run" not in out and "arithmetic" not in out
    assert " 3 seeds: R " in out and " 10 seeds: R " in out and " 3 draws: R " in out and "draw SD" in out
    assert "interval clears no effect" in out
    assert seeds_cli.main([str(folder), "--seeds", "3", "--sims", "500", "--markdown"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| notebook | claim | now |") and "3 seeds or draws" in table[0] and len(table) == 4


@pytest.mark.parametrize("args, message", [(["--seeds", "1,3"], "--seeds"), (["--seeds", "x"], "--seeds"),
                                           (["--sims", "5"], "--sims"), (["--only", "09"], "no comparison")])
def test_the_command_names_bad_input(tmp_path, capsys, args, message):
    folder = _ledger(tmp_path, [_claim("a beats b", [0.01, 0.17], [0.045, 0.13, 0.095], "reproduced")])
    assert seeds_cli.main([str(folder), *args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and len(err.strip().splitlines()) == 1


def test_a_two_level_interval_carries_its_question_part():
    """stats.two_level_bootstrap over seeds returns its question part beside the interval (an Estimate, which
    unpacks and pickles as the (estimate, low, high) it is); joined with the seeds' spread it gives the interval's
    width back. One seed's interval is a percentile bootstrap and has none."""
    import pickle

    rng = np.random.default_rng(8)
    d = 0.05 + rng.normal(0, 0.05, (3, 1)) + rng.normal(0, 0.4, (3, 120))
    out = stats.two_level_bootstrap(d, n_boot=800, seed=1)
    est, lo, hi = out
    per_seed = d.mean(axis=1)
    assert stats.joined_half(per_seed.var(ddof=1) / 3, out.question_variance, 3)[0] == pytest.approx((hi - lo) / 2)
    back = pickle.loads(pickle.dumps(out))
    assert tuple(back) == tuple(out) and back.question_variance == out.question_variance
    assert getattr(stats.two_level_bootstrap(d[:1], n_boot=200), "question_variance", None) is None


def test_a_recorded_question_part_settles_the_plan():
    """A row that records its question part (run.claim's question_variance, from arms.compare's basis) is planned
    with that value alone, so each chance is one number, not a range over the parts its width fits."""
    from replication.lm import arms
    import pandas as pd

    rng = np.random.default_rng(9)
    qid = [f"q{i}" for i in range(200)]
    tables = {"a": [pd.DataFrame({"qid": qid, "correct": rng.random(200) < p}) for p in (0.62, 0.70, 0.66)],
              "b": pd.DataFrame({"qid": qid, "correct": rng.random(200) < 0.55})}
    records = {"a": [{"healthy": True}] * 3, "b": {"healthy": True}}
    basis = arms.compare("a", "b", tables, records, n_boot=500)["basis"]
    assert basis["question_variance"] > 0
    claim = {**basis, "interval": list(basis["interval"]), "direction": 1, "null": 0.0, "effect": None}
    plan = power.project(claim, seeds=(3, 5), sims=300)
    assert plan["question_variances"] == [basis["question_variance"]]
    assert all(lo == hi for s in (3, 5) for lo, hi in plan["plans"][s].values())


def test_a_comparison_s_interval_carries_its_question_part_into_the_basis():
    """arms.compare's ci95 is a stats.Interval, so a basis built from it (arms.basis, as notebooks 02 and 05 do)
    keeps the question part; a plain list has none."""
    from replication.lm import arms

    interval = stats.two_level_bootstrap(np.random.default_rng(1).normal(0.1, 0.3, (3, 50)), n_boot=300).interval
    assert isinstance(interval, list) and interval.question_variance > 0
    records = {"a": {"healthy": True}}
    assert arms.basis(interval, records, ["a"])["question_variance"] == interval.question_variance
    assert "question_variance" not in arms.basis(list(interval), records, ["a"])
