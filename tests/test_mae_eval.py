"""Multi-Agent Evolve's held-out records: the arm record and its health check (rlpr_training.health on the solver's
reward and reply length), the paired comparison gated by health, the judge summary, and the judge's prefill in the
held-out judge evaluation."""
import pandas as pd
import pytest

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
    assert "learned" in arms.compare("flat", "base", tables, records, n_boot=200)["basis"]["not_tested"]


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
