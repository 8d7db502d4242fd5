"""RLPR where the rule verifier fails: the question sets whose references a verifier misses in part and their
grading, reward quality read within question (against hand computations), the spread of a reward within a
question, and r' scored once from the initial policy (the authors' choice) against the per-step variant."""
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from replication.core import config, params, stats
from replication.lm import grpo, models, tasks
from replication.papers.rlpr import answers, reward_quality, rlpr, rlpr_eval, rlpr_runs
from replication.papers.rlpr.params import VARIANTS


# ---- questions whose references the rule verifier misses in part ----

def test_references_in_another_form_are_missed_by_the_verifier_and_accepted_by_the_oracle():
    split = answers.make_questions(200, 0, seed=0, level="2d-1step-add", n_heldout=200, styles=answers.STYLES)
    for qs in split.values():
        share = pd.Series([q.style for q in qs]).value_counts(normalize=True)
        assert set(share.index) == set(answers.STYLES) and share.min() > 0.2   # every form, each a real share
        for q in qs:
            v = int(q.value)
            item = next(w for w in tasks.ITEMS if w in q.question)
            assert q.reference == {"digits": str(v), "words": answers.number_words(v), "unit": f"{v} {item}"}[q.style]
            for form, reply in (("digits", f"{v}"), ("words", answers.number_words(v)), ("unit", f"{v} {item}")):
                got = answers.score_reply(f"So the total is {v}. The answer is {reply}.", q)
                assert got["correct"], (q, reply)                       # the lenient oracle: right in any form
                assert got["verified"] == (form == q.style), (q, reply)  # the rule verifier: only the reference's form
            wrong = answers.score_reply(f"The answer is {v + 1}.", q)
            assert not wrong["correct"] and not wrong["verified"]
    digits_only = answers.make_questions(20, 0, seed=0, level="2d-1step-add", styles=("digits",))["train"]
    assert all(answers.score_reply(f"The answer is {int(q.value)}.", q)["verified"] for q in digits_only)


def test_the_stated_answer_against_the_replys_own_working():
    assert answers.answer_vs_work("12 + 58 = 70. The answer is 18.", 70) == {
        "stated": 18.0, "worked": 70.0, "follows": False, "worked_right": True}
    assert answers.answer_vs_work("9 - 4 = 5. 5 * 3 = 14. The answer is fourteen.", 15) == {
        "stated": 14.0, "worked": 14.0, "follows": True, "worked_right": False}   # the last equation, words parsed
    assert answers.worked_result("The answer is 70. 1 + 1 = 2.") is None        # working after the answer is not working
    assert answers.answer_vs_work("The answer is 70.", 70)["follows"] is None    # no working: neither follows nor not
    assert answers.answer_vs_work("12 + 58 = 70.", 70) == {"stated": None, "worked": None, "follows": None,
                                                             "worked_right": None}   # no answer span


def test_answer_follows_work_per_arm_and_seed_against_a_hand_count():
    qs = [answers.Question(f"q{i}", "arithmetic", "?", str(v), (str(v),), float(v)) for i, v in enumerate((70, 30, 11))]
    def table(replies):
        return pd.DataFrame({"qid": [q.id for q in qs], "reply": replies,
                             "correct": [answers.is_correct(r, q.aliases, q.value) for r, q in zip(replies, qs)]})
    base = table(["60 + 10 = 70. The answer is 70.", "20 + 10 = 31. The answer is 31.", "The answer is 11."])
    drifted = table(["60 + 10 = 70. The answer is 18.", "20 + 10 = 30. The answer is 4.", "5 + 6 = 11. The answer is 11."])
    got = rlpr_eval.answer_follows_work({"base": base, "rlpr": [base, drifted]}, qs, seeds=[7, 8])
    assert got.index.tolist()[1:] == [("rlpr", 7), ("rlpr", 8)]
    assert got.index[0][0] == "base" and pd.isna(got.index[0][1])   # the base model has no training seed
    assert got.loc[("rlpr", 8)].to_dict() == pytest.approx(
        {"accuracy": 1 / 3, "worked_right": 1.0, "follows": 1 / 3, "with_both": 1.0})
    assert got.loc[("rlpr", 7)].to_dict() == pytest.approx(
        {"accuracy": 2 / 3, "worked_right": 1 / 3, "follows": 1.0, "with_both": 2 / 3})


def test_verifier_misses_against_a_hand_count():
    rows = [("q1", "digits", True, True), ("q1", "digits", True, True), ("q1", "digits", False, False),
            ("q2", "words", True, False), ("q2", "words", True, False), ("q2", "words", False, False),
            ("q3", "unit", True, False), ("q3", "unit", False, False)]
    t = pd.DataFrame(rows, columns=["qid", "style", "correct", "verified"])
    m = reward_quality.verifier_misses(t, n_boot=200)
    assert m["missed"]["estimate"] == pytest.approx(3 / 5) and m["correct"]["estimate"] == pytest.approx(5 / 8)
    assert m["missed"]["ci95"][0] <= 0.6 <= m["missed"]["ci95"][1]
    assert m["by_style"]["missed"].to_dict() == pytest.approx({"digits": 0.0, "unit": 1.0, "words": 1.0})
    assert m["by_style"].loc["words", "verifier"] == 0 and m["by_style"].loc["digits", "replies"] == 3
    two = pd.concat([t.assign(draw=0), t.assign(draw=1, verified=t.correct)], ignore_index=True)   # draw 1 misses none
    assert reward_quality.verifier_misses(two, n_boot=100)["missed"]["per_draw"] == pytest.approx([0.6, 0.0])


# ---- reward quality within question ----

def hand_table():
    """q1: right (0.9, 0.5), wrong (0.5, 0.1): of its 4 right-vs-wrong pairs 3 ranked right and 1 tied: 3.5 / 4.
    q2: right (0.2), wrong (0.8, 0.3): 0 / 2. q3: all right, no pair. Within question: (0.875 + 0) / 2."""
    rows = [("q1", 0.9, True), ("q1", 0.5, True), ("q1", 0.5, False), ("q1", 0.1, False),
            ("q2", 0.2, True), ("q2", 0.8, False), ("q2", 0.3, False), ("q3", 0.4, True), ("q3", 0.6, True)]
    t = pd.DataFrame(rows, columns=["qid", "a", "correct"])
    return t.assign(b=t["a"] + t["qid"].map({"q1": 0.0, "q2": 0.5, "q3": -0.3}), kind="arithmetic")   # b: a + a per-question offset


def pairs_ranked_right(scores, right):
    """The share of right-vs-wrong pairs with the right reply scored higher (ties half), counted pair by pair."""
    pos, neg = [s for s, y in zip(scores, right) if y], [s for s, y in zip(scores, right) if not y]
    return np.mean([1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg])


def test_within_question_reward_quality_against_a_hand_computation():
    t = hand_table()
    q = reward_quality.by_question(t, ["a"]).set_index("qid")
    assert q["a"].tolist()[:2] == [pytest.approx(3.5 / 4), 0.0] and np.isnan(q.loc["q3", "a"])
    assert q.loc["q1", "a"] == pytest.approx(pairs_ranked_right(t.a[:4], t.correct[:4]))
    d = reward_quality.within_question(t, "a", n_boot=200)
    assert d["estimate"] == pytest.approx((0.875 + 0.0) / 2) and d["per_draw"] == [pytest.approx(0.4375)]
    assert d["n"] == "1 draw x 2 questions with right and wrong replies (7 replies)"
    assert d["estimate"] == pytest.approx(stats.within_auc(t.a, t.correct, t.qid))
    assert stats.auc(t.a, t.correct) == pytest.approx(pairs_ranked_right(t.a, t.correct)) != pytest.approx(d["estimate"])
    # a per-question offset (as r' is) moves the pooled AUC but not a single within-question pair
    shifted = reward_quality.within_question(t, "b", "a", n_boot=200)
    assert shifted["estimate"] == 0.0 and shifted["ci95"] == [0.0, 0.0]
    assert stats.auc(t.b, t.correct) != pytest.approx(stats.auc(t.a, t.correct))
    two = pd.concat([t.assign(draw=0), t.assign(draw=1, a=-t.a)], ignore_index=True)   # draw 1 ranks every pair wrong
    d2 = reward_quality.within_question(two, "a", n_boot=200)
    assert d2["per_draw"] == pytest.approx([0.4375, (0.125 + 1.0) / 2]) and d2["estimate"] == pytest.approx(np.mean(d2["per_draw"]))
    assert reward_quality.claim_basis(d2, "x")["unit"] == "draw"


def test_spread_within_question_against_a_hand_computation():
    t = pd.DataFrame({"qid": ["q1", "q1", "q2", "q2", "q2"], "correct": [True, False, True, False, False],
                      "a": [0.0, 1.0, 0.2, 0.2, 0.2], "b": [0.0, 0.5, 0.0, 1.0, 0.5]})
    d = reward_quality.spread_difference(t, "a", "b", n_boot=100)
    want = np.mean([np.std([0, 1], ddof=1) - np.std([0, 0.5], ddof=1), 0.0 - np.std([0, 1, 0.5], ddof=1)])
    assert d["estimate"] == pytest.approx(want) and d["spread"]["b"] == pytest.approx(np.mean([np.std([0, .5], ddof=1), 0.5]))
    spread = reward_quality.reward_spread(pd.concat([t.assign(draw=0), t.assign(draw=1)]).assign(
        mean=lambda x: x.a, sequence=lambda x: x.b, geometric=lambda x: x.b))
    assert spread.loc["mean", "within-question std"] == pytest.approx(np.mean([np.std([0, 1], ddof=1), 0.0]))   # per draw


# ---- r' once, from the initial policy ----

def letter_reward(prompts, completions, metadata, log_metric=None, log_extra=None):
    """Fraction of lower-case letters: varies within groups on a random tiny model."""
    return [sum(c.isalpha() and c.islower() for c in x) / max(len(x), 1) for x in completions]


def test_initial_r_prime_is_fixed_while_the_per_step_one_follows_the_policy():
    model, tok = models.tiny_model(seed=0)
    qs = answers.make_questions(3, 0, seed=0, styles=("words",))["train"]
    shots = tasks.worked_examples("1d-1step-add", 1)
    table = rlpr.initial_baseline(model, tok, qs, shots)
    want = rlpr.baseline_probs(model, tok, [q.chat(shots) for q in qs], [q.reference for q in qs])
    assert list(table) == [q.id for q in qs] and all(table[q.id] == pytest.approx(w) for q, w in zip(qs, want))
    table = rlpr.initial_baseline(model, tok, qs)   # below without worked examples: shorter prompts, a faster test
    meta, prompts = [q.meta() for q in qs], [q.chat() for q in qs]
    replies = [f"So. The answer is {int(q.value)}." for q in qs]

    def r_prime(baseline):
        out = {}
        rlpr.Reward(model, tok, baseline=baseline)(prompts, replies, meta, log_metric=lambda k, v: out.setdefault(k, v))
        return out["r_prime"]

    fixed, step = r_prime(table), r_prime("policy")
    assert step == pytest.approx(fixed, abs=1e-6)   # before any step the two are the same numbers
    with torch.no_grad():
        model.lm_head.weight.add_(0.5 * torch.randn_like(model.lm_head.weight))   # the policy moves
    assert r_prime(table) == fixed and r_prime("policy") != pytest.approx(fixed, abs=1e-4)


def test_each_variant_gets_its_r_prime_scored_once(monkeypatch):
    monkeypatch.setattr(models, "load_model", lambda name: models.tiny_model(seed=0))
    seen, calls = [], []
    monkeypatch.setattr(rlpr_runs, "Reward", lambda *a, **k: seen.append((a[2], k["baseline"])) or letter_reward)
    real = rlpr_runs.initial_baseline
    monkeypatch.setattr(rlpr_runs, "initial_baseline", lambda *a, **k: calls.append(1) or real(*a, **k))
    pool, heldout = answers.make_questions(4, 0, seed=0)["train"], answers.make_questions(2, 0, seed=0)["heldout"]
    cfg = grpo.GRPOConfig(num_generations=2, max_new_tokens=4, kl_beta=0.0, seed=3)
    keys = []
    kw = dict(run_folder=lambda name, key: keys.append(key))
    arm = rlpr_runs.ArmSetting(cfg, 2, 2, warmup=(0, 1), lora_r=4, max_new_tokens=4, batch_size=4)
    for v in ("rlpr", "rlpr_per_step_r_prime", "rlvr", "oracle", "rlpr_no_debias"):
        rlpr_runs.run_variant(v, pool, heldout, arm, **kw)
    assert len(calls) == 1   # two steps, one scoring of r': the authors' arm only, before its first step
    (kind, table), *rest = seen
    torch.manual_seed(config.derive_seed(3, "rlpr-lora"))
    fresh, tok = models.tiny_model(seed=0)
    initial = rlpr.initial_baseline(models.add_lora(fresh, r=4, alpha=8), tok, pool)   # the initial policy: base + fresh LoRA
    assert kind == "probability" and list(table) == [q.id for q in pool]
    assert all(table[q] == pytest.approx(initial[q], abs=1e-6) for q in table)
    assert rest == [("probability", "policy"), ("verifier", None), ("oracle", None), ("probability", None)]
    assert [k["r_prime"] for k in keys] == ["initial", "per_step", None, None, None]
    given = {q.id: [0.5] for q in pool}   # the notebook scores it once for every arm and seed and passes it in
    seen.clear()
    rlpr_runs.run_variant("rlpr_no_filter", pool, heldout, replace(arm, steps=1), r_prime=given, **kw)
    assert seen == [("probability", given)] and len(calls) == 1


def test_parameters_know_every_variant_and_keep_part_a_in_the_pool():
    assert rlpr_runs.VARIANTS is VARIANTS   # one table of the arms, read by the parameters and the training
    cell = params.cell_values(config.ROOT / "notebooks" / "03_rlpr_debiasing.ipynb")
    cfg = params.build("03_rlpr_debiasing", cell)
    assert {"rlpr", "rlvr", "oracle"} <= set(cfg.variants) and "rlpr_per_step_r_prime" not in cfg.variants
    assert set(cfg.styles) == set(answers.STYLES)
    params.build("03_rlpr_debiasing", {**cell, "variants": list(VARIANTS)})
    with pytest.raises(ValueError, match="n_arithmetic=300 is not allowed; it must be <= n_train"):
        params.build("03_rlpr_debiasing", {**cell, "n_arithmetic": 300})
