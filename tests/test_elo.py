import numpy as np
import pytest
from scipy import stats as st

from replication.lm import elo


def test_expected_score_by_hand():
    assert elo.expected_score(1500, 1500) == pytest.approx(0.5)
    assert elo.expected_score(1350, 1400) == pytest.approx(1 / (1 + 10 ** (50 / 400)))
    assert elo.expected_score(2000, 1600) == pytest.approx(10 / 11)


def test_update_sum_and_mean():
    e = 1 / (1 + 10 ** (50 / 400))
    assert elo.update(1350, [1, 0], [1400, 1400], k=32, rule="sum") == pytest.approx(1350 + 32 * (1 - 2 * e))
    assert elo.update(1350, [1, 0], [1400, 1400], k=32, rule="mean") == pytest.approx(1350 + 16 * (1 - 2 * e))
    # the paper's summed update over a batch of 128 wins moves the rating by thousands of points
    assert elo.update(1350, np.ones(128), np.full(128, 1400), k=32) - 1350 > 2000


def test_sampling_probs_match_the_paper_check():
    p = elo.sampling_probs(1350, [1400, 1700, 2000], 200)
    assert p == pytest.approx([0.786, 0.175, 0.039], abs=1e-3)
    assert elo.sampling_probs(1350, [1400, 1700, 2000], 2000).max() < 0.4
    assert elo.sampling_probs(1e6, [1400, 1700, 2000], 1e-3) == pytest.approx([0, 0, 1])  # stable at extremes


def test_sampling_frequencies_match_probabilities():
    rng = np.random.default_rng(0)
    pool = [1400, 1700, 2000]
    idx = elo.sample_opponents(1650, pool, 200, 20000, rng)
    observed = np.bincount(idx, minlength=3)
    expected = elo.sampling_probs(1650, pool, 200) * 20000
    assert st.chisquare(observed, expected).pvalue > 0.01


@pytest.mark.parametrize("call, message", [
    (lambda: elo.sampling_probs(1350, [1400], 0), "temperature=0"),
    (lambda: elo.sampling_probs(1350, [], 200), "empty"),
    (lambda: elo.update(1350, [1], [1400], k=-1), "k=-1"),
    (lambda: elo.update(1350, [1], [1400], rule="median"), "rule='median'"),
    (lambda: elo.update(1350, [], [], k=32), "non-empty"),
    (lambda: elo.sample_opponents(1350, [1400], 200, 0, np.random.default_rng(0)), "n=0"),
])
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_simulation_is_seeded_and_learns_with_curriculum():
    a = elo.simulate(200, steps=100, batch=16, seed=3)
    b = elo.simulate(200, steps=100, batch=16, seed=3)
    assert np.array_equal(a["rating"], b["rating"]) and np.array_equal(a["probs"], b["probs"])
    assert a["skill"][-1] > a["skill"][0] and np.all(np.diff(a["skill"]) >= 0)
    assert np.allclose(a["probs"].sum(1), 1)
    # the summed update with many matches per step swings far more than the mean
    s = elo.simulate(200, steps=50, batch=16, rule="sum", seed=0)
    assert np.max(np.abs(np.diff(s["rating"]))) > 10 * np.max(np.abs(np.diff(a["rating"])))


def test_degraded_opponent_stalls_learning_at_low_temperature():
    kw = dict(steps=400, batch=64, eta=5.0, seed=1)
    plain = elo.simulate(20, **kw)
    degraded = elo.simulate(20, degrade_step=150, degrade_to=1000.0, **kw)
    assert degraded["skill"][-1] < plain["skill"][-1]


def test_fit_ratings_recovers_known_ratings():
    true = np.array([1350.0, 1200.0, 1600.0, 1900.0])
    wins = elo.expected_score(true[:, None], true[None, :])
    np.testing.assert_allclose(elo.fit_ratings(wins, anchor=0, anchor_rating=1350.0), true, atol=0.5)
    np.testing.assert_allclose(elo.fit_ratings(wins, anchor=2, anchor_rating=1600.0), true, atol=0.5)


def test_paper_setting_reads_fig2():
    s = elo.paper_setting()
    assert len(s["names"]) == len(s["pool"]) == 3 and s["pool"] == sorted(s["pool"])
    assert s["start"] < min(s["pool"]) and s["k"] > 0 and s["batch"] >= 1
    assert len(elo.paper_values("start_prob", 200)) == 3 and len(elo.paper_values("final_elo")) == 3
    with pytest.raises(ValueError, match="quantity"):
        elo.paper_values("final_elo", 7)


def test_simulate_seeds_are_derived_and_shared_across_settings():
    a = elo.simulate_seeds(200, 2, seed=0, steps=20, batch=8)
    b = elo.simulate_seeds(200, 2, seed=0, steps=20, batch=8)
    assert np.array_equal(a[0]["rating"], b[0]["rating"]) and not np.array_equal(a[0]["rating"], a[1]["rating"])
    d = elo.simulate_seeds(200, 2, seed=0, steps=20, batch=8, degrade_step=10, degrade_to=1000.0)
    assert np.array_equal(a[0]["rating"][:10], d[0]["rating"][:10])    # the same run until the opponent degrades


def test_summaries_of_simulated_runs():
    sims = elo.simulate_seeds(2000, 3, seed=0, steps=60, batch=16)
    s = elo.summarize(sims, window=3)
    lo, hi = s["final_elo_ci95"]
    assert lo <= s["final_elo_mean"] <= hi
    assert s["final_elo_mean"] == pytest.approx(np.mean([x["rating"][-1] for x in sims]))
    assert 0.25 < s["prob_range"][0] <= s["prob_range"][1] < 0.45 and 0 <= s["max_window_change"] < 0.2
    deg = elo.degradation_summary(elo.simulate_seeds(20, 2, seed=0, steps=60, batch=16, eta=5.0, degrade_step=30,
                                                     degrade_to=1000.0), 30, before=20)
    assert deg["relative_rate_after"] == pytest.approx(deg["skill_gain_per_step_after"] / deg["skill_gain_per_step_before"])
    with pytest.raises(ValueError, match="degrade_step"):
        elo.degradation_summary(sims, 60)
    sweep = elo.temperature_sweep([20, 2000], 2, 0, 30, 1000.0, steps=60, batch=16)
    assert list(sweep["T"]) == [20, 2000] and {"final_elo", "final_skill", "final_skill_degraded", "mixed_share"} <= set(sweep)


def test_plot_sampling_draws_one_bar_per_opponent():
    import matplotlib

    matplotlib.use("Agg")
    fig = elo.plot_sampling([1400, 1700, 2000], ["a", "b", "c"], 200.0, 1350.0, show=False)
    heights = [p.get_height() for p in fig.axes[0].patches]
    np.testing.assert_allclose(heights, elo.sampling_probs(1350.0, [1400, 1700, 2000], 200.0))


def test_fit_ratings_accepts_an_integer_anchor():
    wins = np.array([[0.5, 0.2], [0.8, 0.5]])
    assert np.allclose(elo.fit_ratings(wins, anchor=0, anchor_rating=1350), elo.fit_ratings(wins, anchor=0, anchor_rating=1350.0))
    assert elo.fit_ratings(wins, anchor=0, anchor_rating=1350)[1] > 1500
