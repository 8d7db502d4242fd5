import numpy as np
import pytest
from scipy import stats as st

from replication import elo


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
