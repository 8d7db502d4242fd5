import numpy as np
import pytest
from scipy import stats as st

from replication.core import fmt
from replication.lm import judges
from replication.papers.elo_evolve import noise


def simulate(n=4000, a=0.8, b=1.0, sigma=0.5, k=5, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.integers(1, 6, n).astype(float)
    item = a * q + b + rng.normal(0, sigma, n)
    scores = np.clip(item[:, None] + rng.normal(0, 0.3, (n, k)), 1, 5 + 10)  # within-item noise, averaged out
    return q, item, scores


def test_absolute_fit_recovers_known_parameters():
    q, item, _ = simulate()
    fit = noise.fit_absolute(q, item, scale=(-50, 50))
    assert fit["slope_a"] == pytest.approx(0.8, abs=0.02)
    assert fit["intercept_b"] == pytest.approx(1.0, abs=0.06)
    assert fit["sigma_residual"] == pytest.approx(0.5, abs=0.02)
    assert fit["slope_a_ci95"][0] < 0.8 < fit["slope_a_ci95"][1]
    assert fit["sigma_abs_eff"] == pytest.approx(np.sqrt(2) * fit["sigma_residual"] / fit["slope_a"])


def test_paper_statistics_reproduce_to_rounding():
    assert noise.sigma_abs_eff(0.028, 0.707) == pytest.approx(35.65, abs=0.1)
    for gap, acc, sigma in [(1, 0.551, 7.85), (2, 0.635, 5.80), (3, 0.644, 8.13), (4, 0.562, 25.53)]:
        assert noise.thurstone_sigma(acc, gap) == pytest.approx(sigma, rel=0.02)


def test_pairwise_fit_recovers_sigma_and_pools():
    rng = np.random.default_rng(1)
    gaps = rng.integers(1, 5, 20000).astype(float)
    wins = (rng.random(20000) < st.norm.cdf(gaps / 3.0)).astype(float)
    fit = noise.fit_pairwise(gaps, wins)
    assert fit["sigma_pooled"] == pytest.approx(3.0, rel=0.05)
    for gap, d in fit["per_gap"].items():
        assert d["sigma_comp_ci95"][0] < 3.0 < d["sigma_comp_ci95"][1]
    assert fit["lr_test"]["df"] == 3 and fit["lr_test"]["p_value"] > 0.001


def test_lr_test_rejects_different_sigmas():
    rng = np.random.default_rng(2)
    gaps = np.repeat([1.0, 4.0], 5000)
    sigma = np.where(gaps == 1, 1.0, 20.0)
    wins = (rng.random(len(gaps)) < st.norm.cdf(gaps / sigma)).astype(float)
    assert noise.fit_pairwise(gaps, wins)["lr_test"]["p_value"] < 1e-6


def test_edge_cases():
    # accuracy <= 0.5 in a gap: no signal, sigma is infinite, and the interval's upper end too
    fit = noise.fit_pairwise([1, 1, 1, 1, 2, 2, 2, 2], [1, 0, 0, 1, 1, 1, 1, 0])
    assert fit["per_gap"][1.0]["sigma_comp"] == np.inf and fit["per_gap"][2.0]["sigma_comp"] < np.inf
    # one gap missing is fine; the test has fewer degrees of freedom
    assert noise.fit_pairwise([1, 1, 3, 3, 3], [1, 0, 1, 1, 0])["lr_test"]["df"] == 1
    # a slope of zero (or below): infinite effective noise
    assert noise.sigma_abs_eff(0.0, 0.7) == np.inf and noise.sigma_abs_eff(-0.1, 0.7) == np.inf
    flat = noise.fit_absolute([1, 2, 3, 4, 5, 1, 2, 3, 4, 5], [3, 3, 3, 3, 3, 3, 3, 3, 3, 3])
    assert flat["slope_a"] == pytest.approx(0.0, abs=1e-12) and flat["sigma_abs_eff"] == np.inf


@pytest.mark.parametrize("call, message", [
    (lambda: noise.fit_absolute([], []), "empty"),
    (lambda: noise.fit_absolute([1, 2, 3], [1, 2]), "must match"),
    (lambda: noise.fit_absolute([1, 2, 3], [1, 2, 7]), "scale"),
    (lambda: noise.fit_pairwise([1, 2], [1]), "same length"),
    (lambda: noise.fit_pairwise([1, 2], [1, 2]), "0/1"),
    (lambda: noise.bootstrap_ratio([1, 2, 3], [1, 2, 3], [2, 2], [1, 0], n_boot=5), "gap=1.0 has no pairs"),
    (lambda: noise.bootstrap_ratio([1, 2, 3], [1, 2, 3], [1, 1], [1, 0], groups=[0]), "same length"),
])
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_bootstrap_interval_covers_the_ratio():
    rng = np.random.default_rng(3)
    q = rng.integers(1, 6, 1000).astype(float)
    scores = np.clip(np.round(0.5 * q[:, None] + 1.5 + rng.normal(0, 0.6, (1000, 5))), 1, 5)
    gaps = rng.integers(1, 5, 1000).astype(float)
    wins = (rng.random(1000) < st.norm.cdf(gaps / 2.0)).astype(float)
    out = noise.bootstrap_ratio(q, scores, gaps, wins, n_boot=300, seed=0)
    point = noise.fit_absolute(q, scores)["sigma_abs_eff"] / noise.fit_pairwise(gaps, wins)["per_gap"][1.0]["sigma_comp"]
    lo, hi = out["ci95"]["ratio"]
    assert lo < point < hi and len(out["ratio"]) == 300
    again = noise.bootstrap_ratio(q, scores, gaps, wins, n_boot=300, seed=0)
    assert np.array_equal(out["ratio"], again["ratio"])


def test_bootstrap_resamples_whole_pairs():
    # k identical verdicts per pair: resampling verdicts one by one would make the interval k times too sure
    rng = np.random.default_rng(4)
    q = np.repeat([1.0, 2.0, 3.0, 4.0, 5.0], 40)
    scores = q[:, None] + rng.normal(0, 0.5, (len(q), 3))
    k, n_pairs = 10, 60
    pair_wins = (rng.random(n_pairs) < 0.7).astype(float)
    gaps, wins = np.ones(n_pairs * k), np.repeat(pair_wins, k)
    loose = noise.bootstrap_ratio(q, scores, gaps, wins, n_boot=300, seed=0, scale=(-50, 50),
                                  groups=np.repeat(np.arange(n_pairs), k))["ci95"]["sigma_comp"]
    tight = noise.bootstrap_ratio(q, scores, gaps, wins, n_boot=300, seed=0, scale=(-50, 50))["ci95"]["sigma_comp"]
    assert loose[1] - loose[0] > 2 * (tight[1] - tight[0])


def test_interval_of_undefined_draws_is_uninformative():
    assert noise._ci([np.nan, np.nan]) == [0.0, np.inf]
    assert noise._ci([1.0, np.inf, np.inf, np.inf])[1] == np.inf


def test_paper_statistics_reproduce_within_their_rounding():
    from replication.core import paper

    stats = paper.table("elo_evolve_noise").set_index("statistic")["value"]
    repro = noise.reproduce_paper(stats, paper.table("elo_evolve_noise_by_gap"))
    assert repro["within"].all(), repro
    assert list(repro.index[:4]) == [f"sigma_comp gap {g}" for g in (1, 2, 3, 4)]
    # the tolerance is the rounding, not a blanket percentage: a small error in the third digit is caught
    assert (repro["tolerance"] < 0.05 * repro["paper"]).all()


def test_rounding_helpers():
    assert noise.half_unit([0.551, 0.635]) == pytest.approx(0.0005)
    assert noise.half_unit([7.85, 5.8, 25.53]) == pytest.approx(0.005)
    assert noise.half_unit(1086) == pytest.approx(0.5)
    v, tol = noise.rounding_band(lambda a, b: a * b, [2.0, 3.0], [0.1, 0.1])
    assert v == 6.0 and tol == pytest.approx(2.1 * 3.1 - 6)


def test_slope_interval_from_statistics():
    lo, hi = noise.slope_ci_from_stats(0.5, 0.7, 1000)
    se = 0.7 / (np.sqrt(2) * np.sqrt(1000))  # sd of 1..5 is sqrt(2)
    assert (hi - lo) / 2 == pytest.approx(1.959964 * se, rel=1e-5) and (lo + hi) / 2 == pytest.approx(0.5)


def test_coverage_band_and_calibration_run():
    lo, hi = noise.coverage_band(200)
    assert lo < 0.95 < hi <= 1 and noise.coverage_band(10)[1] == 1.0
    truth = {**noise.CALIBRATION, "sigma_within2": 0.9}
    cov = noise.coverage(3, truth, 300, 300, n_boot=20, seed=0)
    assert len(cov) == 3 and {"a_covered", "sigma_comp_covered", "ratio_covered"} <= set(cov)
    assert cov.equals(noise.coverage(3, truth, 300, 300, n_boot=20, seed=0))


def test_formatting_and_tables():
    assert fmt.number(np.inf) == "inf" and fmt.number(1.234) == "1.23" and fmt.ci([0.5, np.inf]) == "[0.50, inf]"
    assert fmt.number(-np.inf) == "-inf" and fmt.number(np.nan) == "nan" and fmt.ci([np.nan, 0.5]) == "[nan, 0.50]"
    from replication.core import paper

    fit = noise.fit_pairwise([1, 1, 1, 2, 2], [1, 1, 0, 1, 0])
    table = noise.by_gap_table(paper.table("elo_evolve_noise_by_gap"), {"fit": fit})
    assert list(table["source"]).count("paper") == 4 and list(table["source"]).count("fit") == 2
    rng = np.random.default_rng(0)
    q = np.repeat([1.0, 2.0, 3.0, 4.0, 5.0], 10)
    s = np.clip(np.round(q[:, None] + rng.normal(0, 1, (50, 3))), 1, 5)
    g, w = np.repeat([1.0, 2.0], 20), (rng.random(40) < 0.7).astype(float)
    out = noise.judge_summary(noise.fit_absolute(q, s), noise.fit_pairwise(g, w), noise.bootstrap_ratio(q, s, g, w, n_boot=20))
    assert set(out["sigma_comp"]) == {"1", "2"} and out["n_verdicts_gap1"] == 20 and len(out["ratio_ci95"]) == 2


def test_paper_csv_reproduces_with_the_estimators():
    import pandas as pd

    from replication.core import config

    by_gap = pd.read_csv(config.ROOT / "data/paper/elo_evolve_noise_by_gap.csv")
    stats = pd.read_csv(config.ROOT / "data/paper/elo_evolve_noise.csv").set_index("statistic")["value"]
    assert by_gap["source"].notna().all()
    got = noise.thurstone_sigma(by_gap["accuracy"].to_numpy(), by_gap["gap"].to_numpy())
    assert np.allclose(got, by_gap["sigma_comp"], rtol=0.02)
    assert noise.sigma_abs_eff(stats["slope_a"], stats["sigma_residual"]) == pytest.approx(stats["sigma_abs_eff"], rel=0.01)


def test_redraws_are_the_judges_own_draws(tiny):
    from replication.lm import judges

    model, tok = tiny
    probs, scores = judges.absolute(model, tok, ["q1", "q2", "q3"], ["r1", "r2", "r3"], k=5, seed=7, batch_size=3)
    assert np.array_equal(judges.sample_scores(probs, 5, 7), scores)
    df = judges.pairwise(model, tok, ["q"] * 2, ["good", "fine"], ["bad", "poor"], k=4, seed=3)
    assert np.array_equal(judges.sample_wins(df["p_better"], 4, 3), np.stack(df["wins"]))


def test_redraw_ratios_refit_each_draw_of_the_sampled_judgments():
    rng = np.random.default_rng(0)
    q = np.repeat(np.arange(1, 6), 20).astype(float)
    probs = np.array([np.exp(-0.8 * (np.arange(1, 6) - x) ** 2) for x in q])   # scores centred on the quality
    gaps, wins = np.tile([1.0, 2.0], 50), (rng.random(100) < 0.8).astype(float)
    out = noise.redraw_ratios(q, probs, 5, [11, 12, 13], gaps, wins=wins, n_boot=100, boot_seed=1)
    first = noise.fit_absolute(q, judges.sample_scores(probs, 5, 11))["sigma_abs_eff"]
    want = first / noise.fit_pairwise(gaps, wins)["per_gap"][1.0]["sigma_comp"]
    assert out.loc[0, "ratio"] == pytest.approx(want) and len(out) == 3
    assert out["sigma_comp"].nunique() == 1 and out["sigma_abs_eff"].nunique() == 3   # the comparisons stay, the scores vary
    assert (out["ratio_lo"] <= out["ratio"]).all() and (out["ratio"] <= out["ratio_hi"]).all()
    p_better = np.full(100, 0.8)
    sampled = noise.redraw_ratios(q, probs, 5, [11, 12], gaps, p_better=p_better, verdict_seeds=[21, 22], n_boot=100)
    assert sampled["sigma_comp"].nunique() == 2                                         # the verdicts are drawn again too
