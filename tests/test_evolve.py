"""Elo-Evolve training parts: quality judge, win/loss reward with ties and the length rule, the reward's
side data, the opponent pool through the one cache, length-controlled win rate, the held-out comparisons,
and per-prompt opponents wired into GRPO on the resumable loop."""
import dataclasses
import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from replication.core import cache, paper, stats
from replication.lm import arms, elo, grpo, loop, models, tasks, training
from replication.papers.elo_evolve import evolve, evolve_eval, judging

GOOD, WRONG, BARE = "So 3 + 4 = 7. The answer is 7.", "The answer is 9.", "seven i think 7"


def test_correct_is_the_quality():
    assert judging.correct(GOOD, 7) == 1.0 and judging.correct(BARE, 7) == 1.0     # format does not count
    assert judging.correct(WRONG, 7) == 0.0 and judging.correct("no idea", 7) == 0.0


def test_outcomes_win_loss_tie_and_length_rule():
    judge = judging.QualityJudge(sigma_comp=0.01, sigma_abs=1.0)   # nearly noiseless comparisons
    rng = np.random.default_rng(0)
    q, a = ["q"] * 5, [7] * 5
    policy = [GOOD, WRONG, GOOD, GOOD + " and" * 30, BARE]
    opponent = [WRONG, GOOD, GOOD, WRONG, GOOD]
    s = judging.outcomes(judge, q, a, policy, opponent, rng, length_margin=20)
    # win, loss, identical = tie, longer by > 20 words = 0, equally correct but unformatted = tie (format cannot win)
    assert s.tolist() == [1.0, 0.0, 0.5, 0.0, 0.5]
    s = judging.outcomes(judge, q, a, policy, opponent, rng, length_margin=40)
    assert s[3] == 1.0                         # within the margin the better answer wins again
    with pytest.raises(ValueError, match="length_margin"):
        judging.outcomes(judge, q, a, policy, opponent, rng, length_margin=-1)


def test_thurstone_win_probability_and_noise():
    judge = judging.QualityJudge(sigma_comp=1.0, sigma_abs=2.0)
    p = judge.p_win(["q"], [7], [GOOD], [WRONG])[0]
    assert p == pytest.approx(0.84134, abs=1e-4)        # Phi(1 / 1): right vs wrong
    draws = judging.outcomes(judge, ["q"] * 20000, [7] * 20000, [GOOD] * 20000, [WRONG] * 20000,
                            np.random.default_rng(1))
    assert draws.mean() == pytest.approx(p, abs=0.01)
    scores = judge.scores(["q"] * 20000, [7] * 20000, [GOOD] * 20000, np.random.default_rng(2))
    assert scores.mean() == pytest.approx(1.0, abs=0.05) and scores.std() == pytest.approx(2.0, abs=0.05)
    with pytest.raises(ValueError, match="sigma_comp"):
        judging.QualityJudge(sigma_comp=0)


@pytest.mark.parametrize("reply, want", [("So 3 + 4 = 7. The answer is 7.", "So 3 + 4 = 7. The answer is 7."),
                                         ("So 3 + 4 = 7.", "So 3 + 4 = 7. The answer is 7."),
                                         ("So 3 + 4 = 7 (the answer is 7).", "So 3 + 4 = 7 The answer is 7."),
                                         ("Answer: 7", "The answer is 7."), ("no idea", None)])
def test_canonical_states_every_answer_one_way(reply, want):
    assert judging.canonical(reply) == want


@pytest.fixture(scope="module")
def tiny():
    return models.tiny_model(seed=0)


def test_likelihood_judge_is_reference_free_deterministic_and_blind_to_format(tiny):
    model, tok = tiny
    shots = tasks.worked_examples("1d-1step-add", 1, seed=0)
    judge = judging.LikelihoodJudge(model, tok, shots=shots)
    qs = ["Mia has 3 apples. Mia gets 4 more apples. How many apples does Mia have now?"] * 4
    a = ["3 + 4 = 7. The answer is 7.", "3 + 4 = 7.", "The answer is 9.", "no idea"]
    b = ["3 + 4 = 7. Answer: 7", "3 + 4 = 7. The answer is 7.", "The answer is 9.", "no number"]
    p = judge.p_win(qs, [7] * 4, a, b)
    assert p[0] == p[1] == p[2] == p[3] == 0.5          # the same reply up to how the answer is stated: a tie
    p_right = judge.p_win(qs[:1], [7], ["The answer is 7."], ["The answer is 8."])[0]
    assert p_right in (0.0, 1.0)
    assert judge.p_win(qs[:1], [123], ["The answer is 7."], ["The answer is 8."])[0] == p_right   # never sees the truth
    assert judge.p_win(qs[:1], [7], ["The answer is 7."], ["no idea"])[0] == 1.0               # no number loses
    n = len(judge.memo)
    judge.p_win(qs[:1], [7], ["The answer is 8."], ["The answer is 7."])
    assert len(judge.memo) == n                          # scored once
    s = judge.scores(qs[:2], [7, 7], ["The answer is 7.", "no idea"])
    assert s[1] == -10.0 and s[0] > -10.0


@pytest.mark.parametrize("k", [0, 2])
def test_likelihood_judge_scores_match_a_direct_computation(tiny, k):
    model, tok = tiny   # with shots, the worked examples' cache is computed once and shared by every question
    judge = judging.LikelihoodJudge(model, tok, shots=tasks.worked_examples("1d-1step-add", k, seed=1))
    q, reply = "Leo has 2 coins. Leo gets 5 more coins. How many coins does Leo have now?", "2 + 5 = 7. The answer is 7."
    ids = training.encode_pairs(tok, [judge.prompt(q)], [reply])
    with torch.no_grad():
        lp = training.completion_logps(model, *ids)
    want = float((lp * ids[3]).sum() / ids[3].sum())
    got = judge.judge_scores([q, q, "Another question?"], [reply, "2 + 5 = 7. The answer is 8.", reply])
    assert got[0] == pytest.approx(want, abs=1e-4) and got[0] != got[1] and got[2] != got[0]
    assert (judge._prefix() is not None) == (k > 0)


def test_judge_accuracy_on_right_wrong_pairs():
    problems = tasks.make_level("1d-1step-add", 3, seed=2)
    players = {"a": [f"The answer is {p.answer}." for p in problems], "b": [f"The answer is {p.answer + 1}." for p in problems],
               "c": ["no idea"] * 3}
    out = evolve_eval.judge_accuracy(judging.QualityJudge(0.01, 1.0), problems, players)
    assert out["n"] == 3 and out["accuracy"] == pytest.approx(1.0) and out["problems"] == 3   # 'no idea' states no number


def test_lc_win_rate_removes_a_length_effect():
    rng = np.random.default_rng(0)
    d = rng.normal(0, 10, 400)                             # length difference in words
    p = 1 / (1 + np.exp(-(0.0 + 2.0 * np.tanh(d / d.std()))))   # wins driven by length only
    wins = (rng.random(400) < p).astype(float)
    lc = stats.lc_win_rate(wins, 20 + d, np.full(400, 20.0))
    assert lc["length_coef"] > 1.0
    assert lc["ci95"][0] < 0.5 < lc["ci95"][1]
    wr = stats.win_rate(wins)
    assert wr["ci95"][0] <= wr["win_rate"] <= wr["ci95"][1]


@pytest.mark.parametrize("wins", [[0.0] * 8, [1.0] * 8, [0, 0, 0, 0, 1, 1, 1, 1]])
def test_lc_win_rate_of_a_separated_sample_is_a_probability(wins):
    # no wins, all wins, or wins by length alone: the GLM separates, its intercept's bounds run to about +-3e4;
    # a smoke run of 02 on a CPU without bf16 instructions stopped here with 'math range error'
    lc = stats.lc_win_rate(np.asarray(wins, float), np.arange(8) * 3.0, np.full(8, 10.0))
    assert all(0.0 <= v <= 1.0 for v in [lc["lc_win_rate"], *lc["ci95"]])
    assert lc["ci95"][0] <= lc["lc_win_rate"] <= lc["ci95"][1]


def test_arena_reports_side_data_through_the_logging_callables():
    judge = judging.QualityJudge(sigma_comp=0.01, sigma_abs=1.0)
    meta = [{"question": "q", "answer": 7, "opponent_response": WRONG}] * 2
    metrics, extras = {}, {}
    arena = evolve.Arena(judge, "static")
    rewards = arena(["p", "p"], [GOOD, WRONG], meta, log_metric=metrics.__setitem__, log_extra=extras.__setitem__)
    assert rewards == [1.0, 0.5] and extras == {"outcome": [1.0, 0.5]}
    assert "rollout_quality" not in metrics and metrics["rollout_accuracy"] == 0.5
    assert metrics["rollout_format_rate"] == 1.0 and metrics["rollout_words"] == 7.0
    assert not hasattr(arena, "last") and not hasattr(arena, "rollouts")
    extras.clear()
    scores = evolve.Arena(judge, "point")(["p", "p"], [GOOD, WRONG], meta, log_metric=metrics.__setitem__,
                                          log_extra=extras.__setitem__)
    assert len(scores) == 2 and extras == {}             # absolute scores: no outcomes for the Elo update


@pytest.fixture(scope="module")
def tiny_pool_setup():
    model, tok = models.tiny_model(seed=0)
    problems = tasks.make_level("1d-1step-add", 6, seed=3)
    specs = [evolve.OpponentSpec("weak", 1.5, 1), evolve.OpponentSpec("mid", 0.7, 1),
             evolve.OpponentSpec("strong", 0.7, 3)]
    return model, tok, problems, specs


def test_pool_through_the_one_cache(tmp_path, tiny_pool_setup):
    model, tok, problems, specs = tiny_pool_setup
    made = []

    def get(model_name="tiny"):
        key = evolve.pool_key(model_name, problems, specs, 4, 0)
        make = lambda: made.append(1) or evolve.build_pool(model, tok, problems, specs, 4, 0, progress=False)  # noqa: E731
        return cache.cached(tmp_path, "evolve_pool", key, make, log=None), key

    pool, key = get()
    assert set(pool) == {"weak", "mid", "strong"} and list(pool) == ["weak", "mid", "strong"]
    assert all(len(v) == len(problems) for v in pool.values())
    for mid, strong, p in zip(pool["mid"], pool["strong"], problems):   # strong picks from mid's sample + 2
        assert judging.correct(strong, p.answer) >= judging.correct(mid, p.answer)
    assert get()[0] == pool and len(made) == 1                       # reused, not rebuilt
    value = cache.path_for(tmp_path, "evolve_pool", key) / "value.json"
    value.write_text(json.dumps({**pool, "weak": ["tampered"] * len(problems)}))
    assert get()[0] == pool and len(made) == 2                       # checksum failed: rebuilt
    get("other-model")
    assert len(made) == 3                                            # another model: another entry
    with pytest.raises(ValueError, match="unique"):
        evolve.build_pool(model, tok, problems, specs + specs[:1], 4, 0, progress=False)


def test_pool_opponents_with_worked_examples_and_greedy(tiny_pool_setup):
    model, tok, problems, _ = tiny_pool_setup
    specs = evolve.opponent_specs({"greedy": [0.0, 1], "shots": [0.7, 2, 1]}, 0.7, 1)
    pool = evolve.build_pool(model, tok, problems, specs, 4, 0, level="1d-1step-add", progress=False)
    assert pool["greedy"] == evolve.build_pool(model, tok, problems, specs[:1], 4, 0, progress=False)["greedy"]
    for a, b, p in zip(pool["shots"], pool[evolve.START_PLAYER], problems):   # best of 2 includes the anchor's sample
        assert a == b or judging.correct(a, p.answer)
    with pytest.raises(ValueError, match="level"):
        evolve.build_pool(model, tok, problems, specs, 4, 0, progress=False)


def test_opponent_specs_end_with_the_anchor():
    specs = evolve.opponent_specs({"weak": [1.5, 1], "strong": [0.7, 4, 2]}, 0.8, 3)
    assert [s.name for s in specs] == ["weak", "strong", evolve.START_PLAYER]
    assert specs[1].best_of == 4 and specs[1].shots == 2 and specs[0].shots == 0
    assert specs[-1].temperature == 0.8 and specs[-1].shots == 3


def fake_eval(p_win, words, ref_words=None, correct=None):
    n = len(p_win)
    return pd.DataFrame({"id": [f"p{i}" for i in range(n)], "p_win": p_win, "words": words,
                         "ref_words": ref_words if ref_words is not None else [10] * n,
                         "correct": correct if correct is not None else (np.asarray(p_win) > 0.5).astype(float)})


def test_compare_pairs_by_seed_and_a_failed_arm_is_still_judged():
    rng = np.random.default_rng(0)
    n = 60
    evals = {"point": fake_eval(rng.uniform(0.0, 0.4, n), [10] * n), "static": fake_eval(rng.uniform(0.3, 0.7, n), [10] * n),
             "elo": fake_eval(rng.uniform(0.6, 1.0, n), [10] * n)}
    records = {k: {"healthy": True, "failed_checks": []} for k in ("point", "static", "elo")}
    out = evolve_eval.compare(evals, records, [("static", "point"), ("elo", "static")], "p_win", seed=0)
    for k in ("static - point", "elo - static"):
        est, (lo, hi) = out[k]["difference"], out[k]["ci95"]
        assert 0 < lo <= est <= hi and out[k]["n"] == "1 seed x 60 questions"
        assert evolve_eval.part(out[k])["verdict"] == "inconclusive"            # one training run: at most inconclusive
    assert out["elo - static"]["difference"] == pytest.approx(evals["elo"]["p_win"].mean() - evals["static"]["p_win"].mean())
    # three training seeds per arm, paired by seed and question
    seeded = {k: [fake_eval(np.clip(v["p_win"] + d, 0, 1), [10] * n) for d in (0.0, 0.02, -0.02)] for k, v in evals.items()}
    recs = {k: [r] * 3 for k, r in records.items()}
    out = evolve_eval.compare(seeded, recs, [("elo", "static")], "p_win", seed=0)["elo - static"]
    assert out["n"] == "3 seeds x 60 questions" and len(out["per_seed"]) == 3 and out["probability_of_improvement"] == 1.0
    assert evolve_eval.part(out)["verdict"] == "reproduced" and evolve_eval.part(out)["interval"] == pytest.approx(list(out["ci95"]), abs=1e-6)
    assert "seeds +" in evolve_eval.describe({"elo - static": out})
    # a failed health check is named beside the verdict, never 'not tested'
    recs["static"] = [records["static"], {"healthy": False, "failed_checks": ["learned"]}, records["static"]]
    out = evolve_eval.compare(seeded, recs, [("static", "point")], "correct", seed=0)["static - point"]
    assert out["failed"] == ["static"] and out["basis"]["health"] == "failed health check: static seed 1 (learned)"
    assert set(out["basis"]) == {"interval", "estimate", "seed_differences", "health", "question_variance"}
    assert evolve_eval.part(out)["verdict"] in ("reproduced", "inconclusive", "not reproduced")
    assert "static failed health" in evolve_eval.describe({"static - point": out})


def test_lc_win_rates_per_seed_with_the_two_level_interval():
    rng = np.random.default_rng(0)
    n = 60
    a = [fake_eval(rng.uniform(0.5, 1.0, n), [10] * n) for _ in range(3)]
    b = [fake_eval(rng.uniform(0.0, 0.5, n), [10] * n) for _ in range(3)]
    out = evolve_eval.lc_win_rates(a, b, n_boot=200, seed=0)
    # equal lengths: each seed's LC win rate is its plain win rate, so the difference is the win-rate gap per seed
    want = [x["p_win"].mean() - y["p_win"].mean() for x, y in zip(a, b)]
    assert out["per_seed"] == pytest.approx(want, abs=1e-9) and out["estimate"] == pytest.approx(np.mean(want), abs=1e-9)
    assert 0 < out["ci95"][0] <= out["estimate"] <= out["ci95"][1] and out["n"] == "3 seeds x 60 questions"
    # the seed level widens the interval: seeds that disagree give a wider interval than identical seeds
    spread = [fake_eval(np.clip(x["p_win"] + d, 0, 1), [10] * n) for x, d in zip(a, (-0.2, 0.0, 0.2))]
    same = [a[1]] * 3
    lo_s, hi_s = evolve_eval.lc_win_rates(spread, b[1], n_boot=100, seed=1)["ci95"]
    lo_1, hi_1 = evolve_eval.lc_win_rates(same, b[1], n_boot=100, seed=1)["ci95"]
    assert hi_s - lo_s > 1.5 * (hi_1 - lo_1)
    # one table for b (the base model) is paired with every seed of a; rows are matched by id
    shuffled = b[0].sample(frac=1.0, random_state=0)
    assert evolve_eval.lc_win_rates(a, shuffled, n_boot=10)["per_seed"] == pytest.approx(
        evolve_eval.lc_win_rates(a, [b[0]] * 3, n_boot=10)["per_seed"])
    with pytest.raises(ValueError, match="seeds"):
        evolve_eval.lc_win_rates(a, b[:2])
    # lengths that differ: each seed's value is stats.lc_win_rate's GLM estimate
    long = [fake_eval(x["p_win"], rng.integers(5, 30, n)) for x in a]
    want = [stats.lc_win_rate(x["p_win"], x["words"], x["ref_words"])["lc_win_rate"] for x in long]
    assert evolve_eval.lc_win_rates(long, n_boot=10)["per_seed"] == pytest.approx(want)


def test_arm_summary_over_seeds():
    n = 40
    tables = [fake_eval(np.r_[np.ones(k), np.zeros(n - k)], [10] * n).assign(format=1.0) for k in (20, 24, 28)]
    s = evolve_eval.arm_summary(tables, n_boot=200)
    assert s["accuracy_seeds"] == pytest.approx([0.5, 0.6, 0.7]) and s["accuracy"] == pytest.approx(0.6)
    assert s["accuracy_ci95"][0] < 0.6 < s["accuracy_ci95"][1] and s["seeds"] == 3
    assert s["lc_win_rate_seeds"] == pytest.approx([0.5, 0.6, 0.7]) and s["win_rate"] == pytest.approx(0.6)
    one = evolve_eval.arm_summary(tables[0], n_boot=200)
    assert one["seeds"] == 1 and one["accuracy_seeds"] == [0.5]


def elo_rows(outcomes, k=32.0, rating=1350.0):
    rows, opp = [], np.array([1300.0, 1300.0, 1500.0, 1500.0])
    for t, s in enumerate(outcomes):
        rows.append({"step": t, "opponents": ["a", "b"], "outcomes": s, "expected": elo.expected_score(rating, opp).tolist(),
                     "rating_before": rating})
        rating = elo.update(rating, s, opp, k, "mean")
        rows[-1]["rating"] = rating
    return rows


def test_rating_rise_is_the_mean_rule_sum_over_seeds():
    rows = elo_rows([[1.0, 1.0, 0.0, 1.0]] * 3)
    rise = evolve_eval.rating_rise(rows, k=32.0, n_boot=200)
    assert rise["rise"] == pytest.approx(rows[-1]["rating"] - 1350.0) and rise["n"] == "1 seed x 6 prompts"
    assert rise["ci95"][0] <= rise["rise"] <= rise["ci95"][1]
    runs = [rows, elo_rows([[1.0, 0.0, 0.0, 1.0]] * 3), elo_rows([[1.0, 1.0, 1.0, 1.0]] * 3)]
    rise = evolve_eval.rating_rise(runs, k=32.0, n_boot=200)
    assert rise["per_seed"] == pytest.approx([r[-1]["rating"] - 1350.0 for r in runs])
    assert rise["rise"] == pytest.approx(np.mean(rise["per_seed"])) and rise["n"] == "3 seeds x 6 prompts"
    with pytest.raises(ValueError, match="same number"):
        evolve_eval.rating_rise([rows, rows[:2]], k=32.0)


def test_rating_lag_matches_the_update():
    lag = evolve_eval.rating_lag(32.0)
    assert 20 < lag < 23
    r, skill = 1350.0, 1355.0   # outcomes at the policy's skill against an opponent rated like the policy
    r1 = elo.update(r, [elo.expected_score(skill, 1350.0)], [1350.0], 32.0, "mean")
    assert (r1 - r) / (skill - r) == pytest.approx(1 / lag, rel=0.01)   # a step closes 1/lag of the gap
    with pytest.raises(ValueError, match="k="):
        evolve_eval.rating_lag(0)


@pytest.mark.parametrize("rule, want", [("middle", "b"), ("strongest", "c"), ("weakest", "a"), ("nearest", "a")])
def test_static_choice_by_a_rule_fixed_before_training(rule, want):
    assert evolve_eval.static_choice(["c", "a", "b"], [1800.0, 1300.0, 1500.0], rule, start=1350.0) == want
    with pytest.raises(ValueError, match="static_rule"):
        evolve_eval.static_choice(["a"], [1.0], "best")


def test_paper_role():
    assert evolve_eval.paper_role("elo") == "elo" and evolve_eval.paper_role("point") == "point"
    assert evolve_eval.paper_role("static", "middle") == "static-mid" and evolve_eval.paper_role("static", "nearest") is None


def heldout(correct, tokens):
    return pd.DataFrame({"id": [f"p{i}" for i in range(len(correct))], "correct": correct, "tokens": tokens})


def test_health_checks_and_the_arm_record():
    base = heldout([1.0] * 80 + [0.0] * 120, [20.0] * 200)                   # 0.40, Wilson low ~0.33
    rows = [{"reward_mean": r, "zero_std_frac": 0.25, "samples": 32, "rating_before": 1350.0 + 10 * i,
             "rating": 1360.0 + 10 * i, "completion_len": 18.0} for i, r in enumerate([0.2, 0.3, 0.4, 0.5, 0.6, 0.7])]
    good = heldout([1.0] * 120 + [0.0] * 80, [18.0] * 200)
    check = evolve_eval.health(rows, good, base, "static", n_boot=200)
    assert check["healthy"] and check["signal"]["change"] == pytest.approx(0.4) and check["signal"]["ci95"][0] > 0
    assert evolve_eval.health(rows, good, base, "elo")["signal"]["change"] == pytest.approx(60.0)
    collapsed = heldout([1.0] * 10 + [0.0] * 190, [4.0] * 200)
    bad = evolve_eval.health(rows[::-1], collapsed, base, "point", n_boot=200)
    assert not bad["healthy"] and bad["failed"] == ["learned", "accuracy_ok", "length_ok"]
    summary = {"win_rate": 0.6, "lc_win_rate": 0.6, "mean_words": 18.0}
    rec = evolve_eval.arm_record("static-mid", rows, good, summary, check)
    assert rec["samples"] == 192 and rec["steps"] == 6 and rec["n_heldout"] == 200 and rec["healthy"]
    assert rec["interval"] == pytest.approx(list(stats.proportion_ci(120, 200)[1:])) and rec["zero_gradient_share"] == 0.25
    assert set(arms.RECORD_KEYS) <= set(rec)


def test_sampling_movement():
    rows = [{"probs": [0.8, 0.15, 0.05]}, {"probs": [0.4, 0.4, 0.2]}, {"probs": [0.1, 0.3, 0.6]}]
    m = evolve_eval.sampling_movement(rows, ["a", "b", "c"])
    assert m["largest_change"] == pytest.approx(0.7) and m["first"]["a"] == 0.8 and m["largest_range"] == pytest.approx(0.7)


def test_results_table_and_the_papers_tables():
    r = {"win_rate": 0.6, "win_rate_ci95": [0.5, 0.7], "lc_win_rate": 0.55, "lc_win_rate_ci95": [0.4, 0.7],
         "accuracy": 0.5, "accuracy_ci95": [0.3, 0.7], "accuracy_seeds": [0.45, 0.55], "format_rate": 1.0, "mean_words": 12.0}
    rec = {"steps": 3, "samples": 96, "zero_gradient_share": 0.5, "healthy": True, "failed_checks": []}
    bad = {**rec, "healthy": False, "failed_checks": ["length_ok"]}
    table = evolve_eval.results_table({"base": r, "point": r, "static-mid": r, "elo-T200": r},
                                      {"point": [rec, rec], "static-mid": [rec, bad], "elo-T200": rec},
                                      {"base": "base", "point": "point", "static-mid": "static-mid", "elo-T200": "elo"})
    at = evolve_eval.paper_table1(500)
    assert table.loc[3, "paper WR/LC @500"] == f"{at.loc['elo', 'alpacaeval_wr']:.2f} / {at.loc['elo', 'alpacaeval_lc']:.2f}"
    assert table.loc[0, "win rate"] == "0.600 [0.500, 0.700]" and table.loc[2, "samples"] == 96
    assert table.loc[1, "accuracy by seed"] == "0.450 / 0.550" and table.loc[1, "health"] == "healthy"
    assert table.loc[2, "health"] == "failed: static-mid seed 1 (length_ok)"
    both = evolve_eval.paper_tables("alpacaeval_wr")
    assert set(both["table"]) == {"table1", "table2"} and len(both[both["table"] == "table2"]) == 4
    t2 = paper.table("elo_evolve_table2")
    assert set(t2["regime"]) == {"base", "static-weaker", "static-same-size", "static-other-family"}
    assert len(t2) == 3 + 3 * 3 * 3 and t2["source"].str.contains("Table 2").all()


def test_judge_heldout_with_given_replies():
    problems = tasks.make_level("1d-1step-add", 4, seed=1)
    good = [f"The answer is {p.answer}." for p in problems]
    df, summary = evolve_eval.judge_heldout(None, None, evolve_eval.VerifierJudge(), problems, ["no idea"] * 4, replies=good)
    assert summary["n"] == 4 and summary["accuracy"] == 1.0 and summary["win_rate"] == pytest.approx(1.0)
    assert list(df["p_win"]) == pytest.approx([1.0] * 4)
    p = evolve_eval.VerifierJudge().p_win(["q"] * 3, [7] * 3, [GOOD, BARE, WRONG], [WRONG, GOOD, "no"])
    assert p.tolist() == [1.0, 0.5, 0.5]                 # the verifier: format does not count


class RecordingJudge(judging.QualityJudge):
    """A quality judge that records which opponent responses it was asked to compare against."""

    def __init__(self):
        super().__init__(1.0, 1.0)
        self.seen, self.scored = [], 0

    def p_win(self, questions, answers, a, b):
        self.seen.append(list(b))
        return super().p_win(questions, answers, a, b)

    def scores(self, questions, answers, responses, rng):
        self.scored += len(responses)
        return super().scores(questions, answers, responses, rng)


def run_regime(tmp_path, regime, steps=3, opponent=None, folder=None, temperature=200.0, seed=None):
    model, tok = models.tiny_model(seed=0)
    model = models.add_lora(model, r=4, alpha=8)
    problems = tasks.make_level("1d-1step-add", 8, seed=5)
    pool = {name: [f"{name} says {p.answer + i}" for p in problems] for i, name in enumerate(("weak", "mid", "strong"))}
    judge = RecordingJudge()
    cfg = evolve.EvolveConfig(regime=regime, opponent=opponent, steps=steps, prompts_per_step=3,
                              temperature=temperature, seed=1 if seed is None else seed)
    gcfg = grpo.GRPOConfig(num_generations=2, max_new_tokens=4, lr=1e-2, kl_beta=0.0, save_every=1,
                           seed=0 if seed is None else seed)
    rows = evolve.train(model, tok, judge, evolve.ArmSetting("tiny", tuple(problems), progress=False),
                        evolve.Opponents(pool, (1300.0, 1500.0, 1700.0)), cfg, gcfg, folder)
    return rows, judge, pool, problems, model


def test_steps_log_the_rollouts_side_data_and_the_matches(tmp_path):
    rows, *_ = run_regime(tmp_path, "elo", steps=2)
    for r in rows:
        assert {"rollout_accuracy", "rollout_format_rate", "rollout_words", "samples"} <= set(r)
        assert len(r["outcomes"]) == len(r["expected"]) == 3 * 2 and r["win_rate"] == pytest.approx(np.mean(r["outcomes"]))
        opp_r = np.repeat([dict(zip(("weak", "mid", "strong"), (1300.0, 1500.0, 1700.0)))[o] for o in r["opponents"]], 2)
        np.testing.assert_allclose(r["expected"], elo.expected_score(r["rating_before"], opp_r))
        assert r["rating"] == pytest.approx(elo.update(r["rating_before"], r["outcomes"], opp_r, 32.0, "mean"))


def test_elo_regime_draws_an_opponent_per_prompt_and_updates_the_rating(tmp_path):
    rows, judge, pool, problems, _ = run_regime(tmp_path, "elo", steps=4, temperature=200.0)
    assert len(rows) == 4 and len(judge.seen) == 4
    for row, seen in zip(rows, judge.seen):
        assert len(row["opponents"]) == 3
        # every rollout of a prompt is judged against that prompt's opponent's cached response
        names_seen = [b.split(" says ")[0] for b in seen]
        assert names_seen == [n for n in row["opponents"] for _ in range(2)]
        assert np.isclose(sum(row["probs"]), 1.0)
        np.testing.assert_allclose(row["probs"], elo.sampling_probs(row["rating_before"], [1300, 1500, 1700], 200.0))
    assert rows[1]["rating_before"] == rows[0]["rating"]
    assert len({tuple(r["opponents"]) for r in rows}) > 1 or len(set(sum((r["opponents"] for r in rows), []))) > 1


def test_static_and_point_regimes(tmp_path):
    rows, judge, *_ = run_regime(tmp_path, "static", opponent="strong")
    assert all(set(r["opponents"]) == {"strong"} for r in rows)
    assert all(b.startswith("strong says") for seen in judge.seen for b in seen)
    rows, judge, *_ = run_regime(tmp_path, "point")
    assert judge.seen == [] and judge.scored == 3 * 3 * 2
    assert all(r["rating"] == 1350.0 for r in rows)


def test_resume_restores_weights_and_rating(tmp_path):
    straight_rows, *_, straight = run_regime(tmp_path, "elo", steps=4, folder=loop.RunFolder(tmp_path / "a"))
    folder = loop.RunFolder(tmp_path / "b")
    run_regime(tmp_path, "elo", steps=2, folder=folder)
    rows, *_, resumed = run_regime(tmp_path, "elo", steps=4, folder=folder)   # goes on from step 2
    assert [r["rating"] for r in rows] == [r["rating"] for r in straight_rows]
    a, b = training.trainable(straight), training.trainable(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("bad, match", [({"regime": "dpo"}, "regime"), ({"regime": "static", "opponent": "x"}, "opponent"),
                                        ({"temperature": 0}, "temperature"), ({"update_rule": "max"}, "update_rule"),
                                        ({"steps": 0}, "steps")])
def test_bad_config_is_named(bad, match):
    with pytest.raises(ValueError, match=match):
        evolve.EvolveConfig(**bad).validate(["weak", "mid"])


def test_a_finished_run_loads_its_final_weights(tmp_path):
    folder = loop.RunFolder(tmp_path / "done")
    *_, trained = run_regime(tmp_path, "static", opponent="mid", steps=2, folder=folder)
    rows, judge, *_, reloaded = run_regime(tmp_path, "static", opponent="mid", steps=2, folder=folder)
    assert judge.seen == [] and len(rows) == 2           # nothing was generated or judged again
    a, b = training.trainable(trained), training.trainable(reloaded)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_training_seed_changes_the_draws_and_the_run_folder(tmp_path):
    """Training seed s sets the prompts and opponents drawn per step and the rollouts (EvolveConfig.seed and
    GRPOConfig.seed); the run's key, and so its folder and held-out cache, differ by seed."""
    a, *_ = run_regime(tmp_path, "elo", steps=3, seed=0)
    b, *_ = run_regime(tmp_path, "elo", steps=3, seed=1)
    assert [r["opponents"] for r in a] != [r["opponents"] for r in b] or [r["outcomes"] for r in a] != [r["outcomes"] for r in b]
    again, *_ = run_regime(tmp_path, "elo", steps=3, seed=0)
    assert [r["rating"] for r in again] == [r["rating"] for r in a]
    cfg, gcfg = evolve.EvolveConfig(regime="point"), grpo.GRPOConfig()
    key = lambda s: evolve.run_key("m", replace(cfg, seed=s), replace(gcfg, seed=s), 4, {"x": ["r"]}, [1.0])  # noqa: E731
    assert key(0) == evolve.run_key("m", cfg, gcfg, 4, {"x": ["r"]}, [1.0]) and key(0) != key(1)
    rec = evolve_eval.arm_record("point", [{"samples": 4, "zero_std_frac": 0.0}], heldout([1.0, 0.0], [5.0, 5.0]),
                                 {"win_rate": 0.5, "lc_win_rate": 0.5, "mean_words": 5.0}, None, training_seed=1)
    assert rec["training_seed"] == 1


def test_training_seeds_and_simulation_seeds_are_two_parameters():
    from replication.run import runner
    from replication.core import params as core_params
    from replication.papers.elo_evolve.params import EloDynamics

    fields = {f.name for f in dataclasses.fields(EloDynamics)}
    assert {"seeds", "sim_seeds"} <= fields and "n_seeds" not in fields
    cell = core_params.cell_values(runner.NOTEBOOKS / "02_elo_dynamics.ipynb")
    seeds = {p: core_params.profile_values("02_elo_dynamics", p, runner.NOTEBOOKS).get("seeds", cell["seeds"])
             for p in ("smoke", "default", "gpu", "paper")}
    assert seeds == {"smoke": 1, "default": 3, "gpu": 5, "paper": 5}
