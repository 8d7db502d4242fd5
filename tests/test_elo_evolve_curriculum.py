"""Elo-Evolve's curriculum where it can show (notebook 02, section (k)): a graded judge's win probability depends on
the opponent while the quality judge's learning signal does not, the noise ratio measured on right/wrong pairs, the
mixed-outcome share per group, per step and between two arms paired by seed and step, and the pool's judging made
once and read back."""
import functools

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from replication.core import cache
from replication.lm import tasks
from replication.papers.elo_evolve import curriculum, evolve, evolve_runs, judging

Q = "What is 3 + 4?"
RIGHT, RIGHT_PLAIN, WRONG, WRONG_ODD = ("So 3 + 4 = 7. The answer is 7.", "The answer is 7.", "The answer is 8.",
                                        "3 times 4 is 12. The answer is 12.")


def graded(scores: dict):
    """A likelihood judge whose scores are given (its memo filled), so no model runs: reply -> score."""
    judge = judging.LikelihoodJudge(None, None)
    judge.memo = {(Q, judging.canonical(r)): s for r, s in scores.items()}
    return judge


def test_a_graded_judge_wins_less_against_a_stronger_opponent_and_the_quality_judge_teaches_the_same():
    # the policy's replies: right and likely, right but less likely, wrong and likely, wrong and unlikely
    policy = [RIGHT, RIGHT_PLAIN, WRONG, WRONG_ODD]
    judge = graded({RIGHT: -0.2, RIGHT_PLAIN: -0.6, WRONG: -0.9, WRONG_ODD: -2.0,
                    "So 7. The answer is 7.": -0.4,       # the strong opponent: right and likely
                    "maybe 5. The answer is 5.": -1.5})   # the weak one: wrong and unlikely
    n = len(policy)
    strong = judge.p_win([Q] * n, [7] * n, policy, ["So 7. The answer is 7."] * n)
    weak = judge.p_win([Q] * n, [7] * n, policy, ["maybe 5. The answer is 5."] * n)
    assert strong.tolist() == [1, 0, 0, 0] and weak.tolist() == [1, 1, 1, 0]
    assert strong.mean() < weak.mean()                   # the stronger opponent lowers the win probability
    assert strong[1] == 0 and weak[1] == 1               # the same right reply loses to one and beats the other
    right = np.array([tasks.verify(r, 7) for r in policy])
    quality = judging.QualityJudge(sigma_comp=0.5, sigma_abs=1.6)
    q_gap = {}
    for name, opp in (("right", RIGHT), ("wrong", WRONG)):
        p = quality.p_win([Q] * n, [7] * n, policy, [opp] * n)
        q_gap[name] = p[right].mean() - p[~right].mean()
    assert q_gap["right"] == pytest.approx(q_gap["wrong"])   # the same signal against every opponent
    assert q_gap["right"] == pytest.approx(sps.norm.cdf(2.0) - 0.5)


def problems(n):
    return [tasks.Problem(id=f"p{i}", question=Q, answer=7, digits=1, steps=1, ops="+") for i in range(n)]


def test_the_noise_ratio_of_a_deterministic_judge_is_one_and_the_quality_judges_reads_back():
    judge = graded({RIGHT: -0.2, WRONG: -0.5, RIGHT_PLAIN: -0.9, WRONG_ODD: -2.0})
    players = {"a": [RIGHT, RIGHT_PLAIN], "b": [WRONG, WRONG], "c": [WRONG_ODD, RIGHT]}
    r = judging.pair_noise_ratio(judge, problems(2), players)
    # problem 0: RIGHT against WRONG and WRONG_ODD (both won); problem 1: RIGHT_PLAIN (lost) and RIGHT (won) against
    # WRONG: 3 of 4 pairs ranked right, by one comparison and by two scores alike
    assert r["n"] == 4 and r["p_comparison"] == r["p_absolute"] == 0.75 and r["ratio"] == pytest.approx(1.0)
    noise = judging.quality_noise(0.5, 4.54)
    quality = judging.QualityJudge(noise["sigma_comp"], noise["sigma_abs"])
    many = {f"r{i}": [RIGHT] * 200 for i in range(5)} | {f"w{i}": [WRONG] * 200 for i in range(5)}
    q = judging.pair_noise_ratio(quality, problems(200), many, seed=1)
    assert q["n"] == 5000 and q["ratio"] == pytest.approx(4.54, rel=0.15)
    assert judging.pair_noise_ratio(judge, problems(1), {"a": [RIGHT]})["n"] == 0


def rows(zero_std, opponents, outcomes, prompts):
    return [{"step": t, "zero_std_frac": z, "opponents": o, "outcomes": s, "win_rate": float(np.mean(s)),
             "prompts": p} for t, (z, o, s, p) in enumerate(zip(zero_std, opponents, outcomes, prompts))]


def test_the_mixed_outcome_share_is_counted_per_group_and_per_opponent():
    run = rows([0.5, 0.0], [["strong", "weak"], ["strong", "strong"]],
               [[1, 0, 1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 0, 0, 0]], [[0, 1], [2, 3]])
    table = curriculum.by_opponent({"elo": [run]}, ["weak", "strong"], group_size=4).set_index("opponent")
    assert table.loc["strong", "prompts"] == 3 and table.loc["strong", "mixed"] == 1.0
    assert table.loc["weak", "prompts"] == 1 and table.loc["weak", "mixed"] == 0.0
    assert table.loc["weak", "win_rate"] == 1.0 and table.loc["strong", "win_rate"] == pytest.approx(7 / 12)
    steps = curriculum.steps_table({"elo": [pd.DataFrame(run)]}, ["weak", "strong"])
    assert steps["mixed"].tolist() == [0.5, 1.0] and steps["drew_strong"].tolist() == [0.5, 1.0]
    point = curriculum.steps_table({"point": [[{"step": 0, "zero_std_frac": 0.25}]]}, ["weak"])
    assert point["mixed"].tolist() == [0.75] and np.isnan(point.loc[0, "win_rate"])
    with pytest.raises(ValueError, match="group_size"):
        curriculum.by_opponent({"elo": [run]}, ["weak", "strong"], group_size=0)


def test_the_mixed_share_difference_pairs_seeds_and_steps_inside_its_range():
    prompts = [[0, 1], [2, 3], [4, 5]]
    a = [rows([0.0, 0.5, 0.0], [[]] * 3, [[1]] * 3, prompts), rows([0.5, 0.0, 0.0], [[]] * 3, [[1]] * 3, prompts)]
    b = [rows([1.0, 1.0, 0.5], [[]] * 3, [[1]] * 3, prompts), rows([1.0, 0.5, 1.0], [[]] * 3, [[1]] * 3, prompts)]
    d = curriculum.mixed_difference(a, b, seed=0)
    assert d["per_seed"] == pytest.approx([2 / 3, 2 / 3]) and d["difference"] == pytest.approx(2 / 3)
    assert -1 <= d["ci95"][0] <= d["difference"] <= d["ci95"][1] <= 1 and d["n"] == "2 seeds x 3 steps"
    with pytest.raises(ValueError, match="same prompts"):
        curriculum.mixed_difference(a, [rows([0.0] * 3, [[]] * 3, [[1]] * 3, [[9, 9]] * 3)] * 2)
    with pytest.raises(ValueError, match="seeds"):
        curriculum.mixed_difference(a, b[:1])



def test_the_pools_judging_is_made_once_then_read_and_rates_the_pool_as_judging_now(tmp_path):
    scores = {RIGHT: -0.2, WRONG: -0.5, RIGHT_PLAIN: -0.9, WRONG_ODD: -2.0}
    players = {"a": [RIGHT, RIGHT_PLAIN, WRONG], "b": [WRONG, WRONG_ODD, WRONG_ODD], "c": [RIGHT_PLAIN, RIGHT, RIGHT],
               evolve.START_PLAYER: [WRONG, RIGHT, RIGHT_PLAIN]}
    probs, settings = problems(3), {"kind": "likelihood", "seed": 0, "model": "m"}
    cached = functools.partial(cache.cached, tmp_path, log=None)
    unloaded = judging.LikelihoodJudge(None, None)   # no model: any reply it had to score would raise
    made = evolve_runs.judged_pool(graded(scores), settings, probs, players, cached)
    read = evolve_runs.judged_pool(unloaded, settings, probs, players, cached)
    assert read == made and len(list(tmp_path.glob("evolve_judged_pool-*"))) == 1
    now = evolve_runs.rate_pool(graded(scores), probs, players, ["a", "b", "c"], 1000.0, "middle")
    later = evolve_runs.rate_pool(unloaded, probs, players, ["a", "b", "c"], 1000.0, "middle", read)
    assert np.array_equal(later["wins"], now["wins"]) and np.array_equal(later["ratings"], now["ratings"])
    assert later["judge_check"] == now["judge_check"] and later["static_opponent"] == now["static_opponent"]
    assert read["noise"] == judging.pair_noise_ratio(graded(scores), probs, players)
    with pytest.raises(Exception):   # another pool is another entry: judged now, by the model it lacks
        evolve_runs.judged_pool(unloaded, settings, probs, {**players, "b": [WRONG] * 3}, cached)
