"""The one trained-arm module: the health rule (each check failing on its own), the record, the paired comparison and
its basis; the one held-out evaluation's scorer hook and the one verifier reward."""
import numpy as np
import pandas as pd
import pytest

from replication.core import stats
from replication.lm import arms, tasks


def test_learned_reads_the_interval_when_there_is_one():
    right, wrong = [1.0] * 60 + [0.0] * 40, [1.0] * 40 + [0.0] * 60
    tokens = [10.0] * 100
    rising = {"signal": "s", "change": 0.3, "ci95": [0.1, 0.5]}
    unsure = {"signal": "s", "change": 0.3, "ci95": [-0.1, 0.5]}   # a positive change whose interval holds 0
    assert arms.health(rising, right, wrong, tokens, tokens)["healthy"]
    assert arms.health(unsure, right, wrong, tokens, tokens)["failed"] == ["learned"]
    assert arms.health({"signal": "s", "change": 5.0, "ci95": None}, right, wrong, tokens, tokens)["learned"]
    assert arms.health({"signal": "s", "change": 0.0, "ci95": None}, right, wrong, tokens, tokens)["failed"] == ["learned"]


def test_accuracy_and_length_checks():
    signal = {"signal": "s", "change": 1.0, "ci95": None}
    base = [1.0] * 40 + [0.0] * 60                                        # Wilson low ~0.31
    h = arms.health(signal, [1.0] * 30 + [0.0] * 70, base, [10.0] * 100, [10.0] * 100)
    assert h["failed"] == ["accuracy_ok"] and h["base_accuracy_low"] == pytest.approx(stats.proportion_ci(40, 100)[1])
    h = arms.health(signal, base, base, [3.0] * 100, [10.0] * 100)
    assert h["failed"] == ["length_ok"] and h["heldout_length_ratio"] == pytest.approx(0.3)
    h = arms.health(signal, base, base, [10.0] * 100, [10.0] * 100, train_tokens=[20.0] * 6 + [6.0] * 6)
    assert h["failed"] == ["length_ok"] and h["train_length_ratio"] == pytest.approx(0.3)
    # half the base's length (a concise answer, notebook 02) is not a collapse; a third is the line
    assert arms.health(signal, base, base, [5.0] * 100, [10.0] * 100)["healthy"] and arms.MIN_LENGTH_RATIO == 1 / 3
    with pytest.raises(ValueError, match="min_length_ratio"):
        arms.health(signal, base, base, [6.0], [10.0], min_length_ratio=2.0)


def test_reward_rise_and_loss_fall_signals():
    r = np.linspace(0.2, 0.8, 12)
    rise = arms.reward_rise(r, n_boot=200, seed=0)
    assert rise["change"] == pytest.approx(r[-4:].mean() - r[:4].mean()) and rise["ci95"][0] > 0
    assert (rise["first"], rise["last"]) == (pytest.approx(r[:4].mean()), pytest.approx(r[-4:].mean()))
    flat = arms.reward_rise([0.5, 0.4, 0.6] * 4, n_boot=200, seed=0)
    assert flat["ci95"][0] <= 0 <= flat["ci95"][1]
    fall = arms.loss_fall({"generator": [1.0, 0.7, 0.9], "verifier": [0.5, 0.6], "refiner": []})
    assert fall["change"] == pytest.approx(0.3) and fall["by_role"] == {"generator": pytest.approx(0.3), "verifier": 0.0,
                                                                        "refiner": 0.0}
    assert arms.loss_fall({"generator": [1.0, 1.1]})["change"] == 0 < arms.loss_fall({"generator": [1.0, 0.9]})["change"]
    first, last = arms.thirds(10)
    assert first.sum() == last.sum() == 3 and arms.thirds(2)[0].tolist() == [True, False]


def test_record_has_one_key_set_and_an_untrained_arm_is_healthy():
    base = arms.record("base", [1, 0, 1, 1])
    assert tuple(base)[:len(arms.RECORD_KEYS)] == arms.RECORD_KEYS and base["healthy"] and base["health"] is None
    check = arms.health({"signal": "s", "change": -1.0, "ci95": None}, [1, 1], [1, 0], [5.0, 5.0], [5.0, 5.0])
    rec = arms.record("arm", [1, 1], steps=3, samples=24, check=check, extra=7)
    assert (rec["steps"], rec["samples"], rec["n_heldout"], rec["accuracy"]) == (3, 24, 2, 1.0)
    assert not rec["healthy"] and rec["failed_checks"] == ["learned"] and rec["extra"] == 7
    assert set(rec["health"]) == {"signal", "base_accuracy_low", "heldout_length_ratio", "train_length_ratio", *arms.CHECKS}


def test_compare_pairs_by_question_and_reports_failed_arms_beside_the_measurement():
    base = pd.DataFrame({"qid": ["a", "b", "c", "d"], "correct": [0, 1, 0, 0]})
    better = pd.DataFrame({"qid": ["d", "c", "b", "a"], "correct": [0, 1, 1, 1]})   # same questions, other order
    records = {"base": arms.record("base", base["correct"]), "better": arms.record("better", better["correct"])}
    out = arms.compare("better", "base", {"base": base, "better": better}, records, n_boot=200)
    assert out["difference"] == 0.5 and out["failed"] == [] and out["n"] == "1 seed x 4 questions"
    assert out["basis"] == {"interval": out["ci95"], "estimate": 0.5, "seed_differences": [0.5], "health": None}
    records["better"] = {**records["better"], "healthy": False, "failed_checks": ["length_ok"]}
    out = arms.compare("better", "base", {"base": base, "better": better}, records, n_boot=200)
    # the old rule turned this into not_tested; now the measurement stands and the failed check is named beside it
    assert out["basis"]["health"] == "failed health check: better (length_ok)" and "interval" in out["basis"]
    assert "not_tested" not in out["basis"] and out["failed"] == ["better"]
    with pytest.raises(ValueError, match="same questions"):
        arms.paired(base.iloc[:3], base)


def test_compare_over_seeds_pairs_by_seed_and_question():
    qid = list("abcdefgh")
    base = pd.DataFrame({"qid": qid, "correct": [0, 0, 0, 0, 1, 1, 0, 0]})
    arm = [pd.DataFrame({"qid": qid, "correct": c}) for c in ([1, 1, 0, 0, 1, 1, 0, 0], [1, 0, 0, 0, 1, 1, 1, 1],
                                                                  [1, 1, 1, 0, 1, 1, 0, 0])]
    other = [pd.DataFrame({"qid": qid[::-1], "correct": c[::-1]}) for c in ([0] * 8, [1] * 8, [0, 1] * 4)]
    rec = lambda t, ok=True: {**arms.record("x", t["correct"]), "healthy": ok, "failed_checks": [] if ok else ["learned"]}  # noqa: E731
    records = {"base": rec(base), "arm": [rec(t) for t in arm], "other": [rec(other[0]), rec(other[1], False), rec(other[2])]}
    tables = {"base": base, "arm": arm, "other": other}
    out = arms.compare("arm", "base", tables, records, n_boot=300, seed=1)
    assert out["per_seed"] == pytest.approx([0.25, 0.375, 0.375]) and out["difference"] == pytest.approx(np.mean([0.25, 0.375, 0.375]))
    assert out["n"] == "3 seeds x 8 questions" and out["probability_of_improvement"] == 1.0
    diffs = np.array([t["correct"].to_numpy() - base["correct"].to_numpy() for t in arm], float)
    assert out["ci95"] == pytest.approx(list(stats.two_level_bootstrap(diffs, n_boot=300, seed=1)[1:]))
    vs = arms.compare("arm", "other", tables, records, n_boot=300)
    assert vs["per_seed"] == pytest.approx([0.5, 0.625 - 1.0, 0.625 - 0.5]) and vs["failed"] == ["other"]
    assert vs["basis"]["health"] == "failed health check: other seed 1 (learned)"
    assert vs["probability_of_improvement"] == pytest.approx(np.mean([[a > b or (a == b) * 0.5 for b in (0, 1, 0.5)]
                                                                      for a in (0.5, 0.625, 0.625)]))
    with pytest.raises(ValueError, match="pair the same training seeds"):
        arms.compare("arm", "other", {**tables, "other": other[:2]}, records)
    assert arms.training_seeds(4, 3) == [4, 5, 6]
    with pytest.raises(ValueError, match="seeds"):
        arms.training_seeds(0, 0)


def test_token_lengths_count_the_tokenizer_tokens(tiny):
    _, tok = tiny
    texts = ["The answer is 7.", "", "3 + 4 = 7"]
    assert arms.token_lengths(tok, texts).tolist() == [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]


def test_evaluate_takes_a_scorer_and_columns(tiny):
    problems = tasks.make_level("1d-1step-add", 3, seed=0)
    plain = tasks.evaluate(*tiny, problems, max_new_tokens=3, batch_size=2, progress=False)
    scored = tasks.evaluate(*tiny, problems, max_new_tokens=3, batch_size=2, progress=False,
                            score=lambda text, p: {"correct": len(text) > 0}, columns=lambda p: {"qid": p.id})
    assert list(scored.columns) == ["qid", "reply", "correct", "tokens"]
    assert scored["reply"].tolist() == plain["reply"].tolist() and scored["tokens"].tolist() == plain["tokens"].tolist()
    assert {"extracted", "correct", "correct_strict", "format"} <= set(plain.columns)


def test_the_one_verifier_reward():
    logged = {}
    got = tasks.verifier_reward(None, ["The answer is 7.", "it is 7", "The answer is 8."], [{"answer": 7}] * 3,
                                log_metric=lambda k, v: logged.__setitem__(k, v))
    assert got == [1.0, 1.0, 0.0] and logged == {"rollout_strict": pytest.approx(1 / 3), "rollout_format": pytest.approx(2 / 3)}
