"""Multi-Agent Evolve's held-out records: the arm record and its health check (arms.health on the solver's reward and
reply length), the paired comparison with a failed check named beside it, the arms over training seeds (accuracy,
the trained judge's agreement, the filter's shares: two-level intervals), the judge summary, and the judge's prefill
in the held-out judge evaluation."""
import numpy as np
import pandas as pd
import pytest

from replication.core import stats, verdicts
from replication.lm import arms, models, tasks
from replication.papers.mae import mae, mae_eval


def _table(correct, tokens=20):
    return pd.DataFrame({"qid": [f"q{i}" for i in range(len(correct))], "correct": correct,
                         "format": [True] * len(correct), "tokens": [tokens] * len(correct)})


def _result(rewards, tokens=20.0):
    return {"rows": [{"iteration": i, "solver_reward": r, "solver_tokens": tokens, "samples": 10, "solver_samples": 6,
                      "seed_answers": 4} for i, r in enumerate(rewards)]}


def test_arm_record_fields_and_health():
    base = _table([True] * 10 + [False] * 10)
    good = mae_eval.arm_record("good", _result([0.2, 0.2, 0.3, 0.5, 0.6, 0.7]), _table([True] * 14 + [False] * 6), base,
                               n_boot=200)
    assert set(arms.RECORD_KEYS) <= set(good) and good["healthy"] and good["failed_checks"] == []
    assert (good["steps"], good["samples"], good["n_heldout"], good["known_answer_samples"]) == (6, 60, 20, 24)
    assert good["accuracy"] == 0.7 and good["interval"][0] < 0.7 < good["interval"][1]
    assert good["vs_base"]["difference"] == pytest.approx(0.2)
    flat = mae_eval.arm_record("flat", _result([0.5] * 6), _table([True] * 14 + [False] * 6), base, n_boot=200)
    assert not flat["healthy"] and flat["failed_checks"] == ["learned"]
    short = mae_eval.arm_record("short", _result([0.2, 0.2, 0.3, 0.5, 0.6, 0.7]), _table([True] * 14 + [False] * 6, tokens=5),
                                base, n_boot=200)
    assert short["failed_checks"] == ["length_ok"]
    worse = mae_eval.arm_record("worse", _result([0.2, 0.2, 0.3, 0.5, 0.6, 0.7]), _table([True] * 2 + [False] * 18), base,
                                n_boot=200)
    assert worse["failed_checks"] == ["accuracy_ok"]
    records = {"base": mae_eval.base_record(base), "good": good, "flat": flat}
    tables = {"base": base, "good": _table([True] * 14 + [False] * 6), "flat": _table([True] * 14 + [False] * 6)}
    assert "interval" in arms.compare("good", "base", tables, records, n_boot=200)["basis"]
    # a failed arm's comparison is measured; the failed check is named beside it (it was "not tested" before seeds)
    flat_basis = arms.compare("flat", "base", tables, records, n_boot=200)["basis"]
    assert "not_tested" not in flat_basis and flat_basis["health"] == "failed health check: flat (learned)"
    assert flat_basis["estimate"] == pytest.approx(0.2) and flat_basis["interval"][0] > 0


def test_a_harm_over_seeds_is_not_reproduced_with_the_failed_check_beside_it():
    """Notebook 06's self-judge arm: held-out accuracy far below the base's in every training seed fails accuracy_ok,
    and that failed check is the outcome itself: the comparison reads 'not reproduced', the check named beside it."""
    rng = np.random.default_rng(0)
    base = _table(rng.random(200) < 0.48)
    rising = _result([0.2, 0.2, 0.3, 0.5, 0.6, 0.7])
    worse = [_table(rng.random(200) < p) for p in (0.22, 0.25, 0.20)]
    records = {"base": mae_eval.base_record(base),
               "self_judge": [mae_eval.arm_record("self_judge", rising, t, base, n_boot=200, seed=s) for s, t in enumerate(worse)]}
    assert all(r["failed_checks"] == ["accuracy_ok"] for r in records["self_judge"])
    c = arms.compare("self_judge", "base", {"base": base, "self_judge": worse}, records, n_boot=500)
    assert c["n"] == "3 seeds x 200 questions" and len(c["basis"]["seed_differences"]) == 3
    row = {"verdict": verdicts.verdict(interval=c["basis"]["interval"], seed_differences=c["basis"]["seed_differences"]),
           "qualifier": verdicts.qualifier(c["basis"]["seed_differences"]), "health": c["basis"]["health"]}
    assert row["verdict"] == "not reproduced" and row["qualifier"] == "0 of 3 seeds on the paper's side"
    assert verdicts.label(row).startswith("not reproduced (0 of 3 seeds on the paper's side); failed health check: "
                                          "self_judge seed 0 (accuracy_ok)")
    # the same harm in one training run reads at most 'inconclusive (one run)', the check still beside it
    one = arms.compare("self_judge", "base", {"base": base, "self_judge": worse[:1]},
                       {**records, "self_judge": records["self_judge"][:1]}, n_boot=500)
    assert one["ci95"][1] < 0 and one["n"] == "1 seed x 200 questions"
    one_row = {"verdict": verdicts.verdict(interval=one["basis"]["interval"], seed_differences=one["basis"]["seed_differences"]),
               "qualifier": verdicts.qualifier(one["basis"]["seed_differences"]), "health": one["basis"]["health"]}
    assert verdicts.label(one_row) == "inconclusive (one run); failed health check: self_judge (accuracy_ok)"


def test_arms_over_training_seeds():
    qid = [f"q{i}" for i in range(6)]
    seeds = [pd.DataFrame({"qid": qid[::-1], "correct": c[::-1]}) for c in ([1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0])]
    acc = mae_eval.accuracy_over_seeds(seeds, n_boot=300, seed=2)
    assert acc["per_seed"] == pytest.approx([1 / 3, 2 / 3]) and acc["accuracy"] == pytest.approx(0.5)
    assert acc["n"] == "2 seeds x 6 questions" and acc["ci95"] == pytest.approx(list(stats.two_level_bootstrap(
        [[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0]], n_boot=300, seed=2, bounds=(0, 1))[1:]))
    assert acc["ci95"] == [0.0, 1.0] and acc["ci95"].clipped == ("low", "high")   # two seeds: the t interval reaches past both
    assert mae_eval.accuracy_over_seeds(seeds[0], n_boot=50)["n"] == "1 seed x 6 questions"  # an untrained arm: one table
    # the trained judge of each seed: agreement above that seed's majority-class baseline, per reply
    judged = [pd.DataFrame({"parse": ["tag"] * 4, "raw_score": [9.0] * 4, "score": s, "correct": c})
              for s, c in (([0.9, 0.9, 0.9, 0.9], [True, True, True, False]), ([0.9, 0.0, 0.9, 0.0], [True, False, True, True]))]
    agree = mae_eval.agreement_over_seeds(judged, n_boot=300)
    assert [s["agreement"] for s in agree["per_seed"]] == [0.75, 0.75]
    assert agree["above_baseline"]["per_seed"] == pytest.approx([0.0, 0.0]) and agree["above_baseline"]["n"] == "2 seeds x 4 questions"
    # the filter's shares over all proposals of each seed
    results = [{"proposals": [{"question": q, "accepted": a} for q, a in p]}
               for p in (((("A?", True), ("B?", False), (None, False), ("C?", True))),
                         ((("A?", False), (None, False), (None, False), ("C?", True))))]
    shares = mae_eval.proposal_shares(results, n_boot=200)
    assert shares["accepted"]["per_seed"] == [0.5, 0.25] and shares["filtered"]["per_seed"] == [0.25, 0.25]
    assert shares["held_question"] == 5 and shares["accepted"]["n"] == "2 seeds x 4 proposals"
    # training curves: iteration (from 1) x seed
    rows = [pd.DataFrame({"iteration": [0, 1], "solver_reward": r}) for r in ([0.1, 0.2], [0.3, 0.5])]
    curves = mae_eval.seed_curves(rows, "solver_reward")
    assert list(curves.index) == [1, 2] and list(curves.columns) == [0, 1] and curves.loc[2, 1] == 0.5
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    mae_eval.seed_lines(ax, curves, "C0", "solver")  # one thin line per seed, then the bold mean
    assert len(ax.lines) == 3 and list(ax.lines[-1].get_ydata()) == pytest.approx([0.2, 0.35])
    plt.close(fig)
    c = {"pair": "a - b", "difference": 0.0625, "ci95": [0.0, 0.284], "per_seed": [0.125, 0.0], "probability_of_improvement": 0.75}
    assert mae_eval.versus(c) == "a - b +0.062 [+0.000, +0.284] (seeds: +0.125, +0.000; P(improvement) 0.75)"
    assert mae_eval.share(shares["accepted"]).startswith("38% [")


def test_judge_summary_counts_tags_and_agreement():
    judged = pd.DataFrame({"parse": ["tag", "tag", "none", "tag"], "raw_score": [9.0, 2.0, None, 9.0],
                           "score": [8 / 9, 1 / 9, 0.5, 8 / 9], "correct": [True, False, False, False]})
    s = mae_eval.judge_summary(judged)
    assert s["tag_count"] == 3 and s["tag_rate"] == 0.75 and s["n"] == 4
    assert s["agreement"] == pytest.approx(2 / 4) and s["top_raw_scores"] == {"9": 2, "2": 1, "none": 1}


def test_heldout_answers_and_judge_eval_prefill():
    model, tok = models.tiny_model(seed=0)
    problems = tasks.make_level("1d-1step-add", 3)
    table = mae_eval.heldout_answers(model, tok, problems, tasks.worked_examples("1d-1step-add", 1), 4, 4)
    assert list(table["qid"]) == [p.id for p in problems]
    cfg = mae.MAEConfig(judge_tokens=4)
    with_prefill = mae_eval.judge_eval(model, tok, table, cfg, prefill=True)
    assert all(t.startswith(mae.SCORE_PREFILL) for t in with_prefill["judgment"])
    free = mae_eval.judge_eval(model, tok, table, cfg, prefill=False)
    assert not any(t.startswith(mae.SCORE_PREFILL) for t in free["judgment"])
    assert {"raw_score", "parse", "score"} <= set(free)
