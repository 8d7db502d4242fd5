"""RLPR pieces: answer location, reference tokens, aggregation, debiasing, the reward's side data, reward
quality over draws of sampled replies, the std filter, the filtered loop on loop.run and the variants over seeds."""
import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import mannwhitneyu

from replication.core import config, stats
from replication.lm import arms, grpo, loop, models, training
from replication.lm.rollout import Recorder
from replication.papers.rlpr import answers, reward_quality, rlpr, rlpr_eval, rlpr_runs, rlpr_training


def merging_tokenizer():
    """Character-level BPE whose one merge '>7' crosses the <answer> tag boundary."""
    from tokenizers import Tokenizer
    from tokenizers import models as tm
    from transformers import PreTrainedTokenizerFast

    chars = [chr(i) for i in range(32, 127)] + ["\n"]
    vocab = {c: i for i, c in enumerate(chars)}
    vocab[">7"] = len(vocab)
    tk = Tokenizer(tm.BPE(vocab=vocab, merges=[(">", "7")]))
    return PreTrainedTokenizerFast(tokenizer_object=tk)


def scored_text(tok, text, reference):
    o, a, b = answers.replace_answer(text, reference)
    enc = tok(o, add_special_tokens=False, return_offsets_mapping=True)
    mask = training.reference_mask(enc["offset_mapping"], a, b)
    return o, "".join(o[s:e] for (s, e), m in zip(enc["offset_mapping"], mask) if m)


# ---- locating the answer and the reference tokens ----

@pytest.mark.parametrize("text, span", [
    ("3 + 4 = 7. The answer is 7.", "7"),
    ("The answer is 12 apples", "12 apples"),
    ("Answer: **Paris**.\nDone.", "Paris"),
    ("I think <answer> seven </answer> and the answer is 3.", "seven"),   # tags win over the phrase
    ("The answer is 3.5. Then the answer is 4.", "4"),                      # the last phrase, decimals kept
])
def test_locate_answer(text, span):
    a, b = answers.locate_answer(text)
    assert text[a:b] == span


@pytest.mark.parametrize("text", ["no answer here 7", "<answer>7", "The answer is .", ""])
def test_missing_answer_is_none(text):
    assert answers.locate_answer(text) is None and answers.replace_answer(text, "7") is None


def test_reference_at_start_and_end_of_the_reply(tiny):
    tok = tiny[1]
    assert scored_text(tok, "<answer>5</answer>", "seven") == ("<answer>seven</answer>", "seven")
    assert scored_text(tok, "The answer is 5", "7 apples") == ("The answer is 7 apples", "7 apples")


def test_repeated_substring_scores_only_the_answer(tiny):
    o, scored = scored_text(tiny[1], "7 + 0 = 7, so 7. The answer is 9.", "7")
    enc = tiny[1](o, add_special_tokens=False, return_offsets_mapping=True)
    a = o.rindex("7")
    mask = training.reference_mask(enc["offset_mapping"], a, a + 1)
    assert scored == "7" and sum(mask) == 1 and enc["offset_mapping"][mask.index(True)] == (a, a + 1)


def test_token_merged_across_the_tag_boundary_is_scored():
    tok = merging_tokenizer()
    o, scored = scored_text(tok, "so <answer>5</answer>", "7")
    ids = tok(o, add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids).count(">7") == 1
    assert scored == ">7"   # the merged token overlaps the reference, so it is scored whole


def test_reference_mask_overlap_rule():
    offsets = [(0, 3), (3, 5), (5, 9), (9, 9), (9, 12)]
    assert training.reference_mask(offsets, 4, 9) == [False, True, True, False, False]


def test_token_probs_match_a_direct_forward_pass(tiny):
    model, tok = tiny
    prompt, reply, ref = "hi", "so the answer is 5.", "42"
    [probs] = rlpr.reply_probs(model, tok, [prompt], [reply], [ref], temperature=0.7)
    o = "so the answer is 42."
    p_ids = tok(models.chat_prompts(tok, [prompt]), add_special_tokens=False)["input_ids"][0]
    c_ids = tok(o, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([p_ids + c_ids])).logits[0] / 0.7
    logp = logits.log_softmax(-1)
    start = o.index("42")  # byte-level tokenizer: one token per character
    want = [float(logp[len(p_ids) + k - 1, c_ids[k]].exp()) for k in (start, start + 1)]
    assert probs == pytest.approx(want, rel=1e-4)


def test_shared_prompts_score_as_separate_passes(tiny):
    model, tok = tiny
    turns = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2. The answer is 2."},
             {"role": "user", "content": "2+2?"}]
    prompts = ["hi", turns, "hi", "a longer prompt here", turns]
    replies = ["so the answer is 5.", "The answer is 9.", "the answer is 77", "no answer", "x. The answer is 3"]
    refs = ["42", "4", "7", "1", "four"]
    together = rlpr.reply_probs(model, tok, prompts, replies, refs, temperature=0.8, batch_size=8)
    alone = [rlpr.reply_probs(model, tok, [p], [c], [r], temperature=0.8)[0] for p, c, r in zip(prompts, replies, refs)]
    assert together[3] is None and alone[3] is None
    for a, b in zip(together, alone):
        assert (a is None) == (b is None) and (a is None or a == pytest.approx(b, rel=1e-4, abs=1e-7))


# ---- aggregation, debiasing, format, verifiers ----

def test_aggregations_against_hand_values():
    p = (0.01, 0.7, 0.9)
    assert rlpr.aggregate(p, "mean") == pytest.approx(1.61 / 3)
    assert rlpr.aggregate(p, "sequence") == pytest.approx(0.0063)
    assert rlpr.aggregate(p, "geometric") == pytest.approx(0.0063 ** (1 / 3))
    assert rlpr.aggregate((0.05, 0.7, 0.9), "sequence") / rlpr.aggregate(p, "sequence") == pytest.approx(5.0)
    assert rlpr.aggregate([], "mean") == 0.0 and rlpr.aggregate(None, "geometric") == 0.0
    with pytest.raises(ValueError, match="aggregation='max'"):
        rlpr.aggregate(p, "max")


def test_debias_clips_to_unit_interval():
    assert rlpr.debias([0.9, 0.2, 1.5, 0.3], [0.1, 0.5, 0.2, 0.3]).tolist() == pytest.approx([0.8, 0.0, 1.0, 0.0])


@pytest.mark.parametrize("text, score", [
    ("work. The answer is 7.", 1.0), ("<answer>7</answer>", 1.0), ("<answer>7</answer><answer>8</answer>", 0.0),
    ("</answer>7<answer>", 0.0), ("The answer is 7. The answer is 7.", 0.0), ("just 7", 0.0),
])
def test_format_score(text, score):
    assert answers.format_score(text) == score


def test_exact_match_and_lenient_oracle():
    assert answers.exact_match("The answer is 7.", "7") and not answers.exact_match("The answer is 7 apples.", "7")
    assert not answers.exact_match("The answer is seven.", "7")
    assert answers.is_correct("The answer is seven apples.", ("7",), 7.0)
    assert answers.is_correct("so twenty-one", ("21",), 21.0) and not answers.is_correct("The answer is 8.", ("7",), 7.0)
    assert answers.is_correct("The answer is the Pacific.", ("pacific ocean", "pacific"))
    assert not answers.is_correct("The answer is Atlantic.", ("pacific",))
    assert [answers.number_words(n) for n in (0, 13, 40, 99, 105)] == ["zero", "thirteen", "forty", "ninety nine", "one hundred five"]
    assert answers.parse_number("one hundred and five degrees") == 105.0
    q = answers.Question("q", "arithmetic", "?", "7 apples", ("7", "seven"), 7.0, "unit")
    assert answers.score_reply("The answer is seven.", q) == {"correct": True, "verified": False, "format": 1.0}


def test_reward_logs_its_side_data_per_completion(tiny):
    model, tok = tiny
    meta = [{"id": "q", "reference": "7", "aliases": ["7"], "value": 7.0}] * 2
    fn = rlpr.Reward(model, tok, baseline={"q": [0.0]}, format_weight=0.1)
    rec = Recorder(2)
    out = fn(["p", "p"], ["no answer at all", "The answer is 3."], meta, log_metric=rec.log_metric, log_extra=rec.log_extra)
    assert out[0] == 0.0 and rec.extras["r"][0] == 0.0 and rec.extras["format"] == [0.0, 1.0]
    assert rec.extras["correct"] == [False, False] and rec.extras["core"][0] == 0.0 and rec.metrics["answer_found"] == 0.5
    assert 0.1 <= out[1] <= 1.0 and not hasattr(fn, "last")
    big = rlpr.Reward(model, tok, baseline={"q": [1.0]})(["p"], ["The answer is 3."], meta[:1])
    assert big == [pytest.approx(0.1)]   # r' = 1 removes everything but the format term
    verifier = rlpr.Reward(model, tok, kind="verifier", format_weight=0.0)
    assert verifier(["p", "p"], ["The answer is 7.", "The answer is seven."], meta) == [1.0, 0.0]
    oracle = rlpr.Reward(model, tok, kind="oracle", format_weight=0.0)   # the lenient oracle: right in any form
    assert oracle(["p"] * 3, ["The answer is 7.", "The answer is seven.", "The answer is 8."], meta + meta[:1]) == [1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="baseline='initial'"):
        rlpr.Reward(model, tok, baseline="initial")


def test_a_new_reward_is_one_function_and_one_table_entry(monkeypatch):
    """Reward picks its core by kind from rlpr.CORES: a new core needs no other edit, and an unknown kind is named."""
    meta = [{"id": "q", "reference": "7", "aliases": ["7"], "value": 7.0}] * 2

    def length_core(reward, prompts, completions, metadata, refs, correct):
        r = np.array([min(len(c.split()) / 10, 1.0) for c in completions])
        return r, r, {"mean_words": float(np.mean([len(c.split()) for c in completions]))}

    monkeypatch.setitem(rlpr.CORES, "length", length_core)
    rec = Recorder(2)
    out = rlpr.Reward(None, None, kind="length", format_weight=0.0)(["p", "p"], ["a b", "The answer is 7."], meta,
                                                                   log_metric=rec.log_metric)
    assert out == [0.2, 0.4] and rec.metrics["mean_words"] == 3.0 and rec.metrics["answer_found"] == 0.5
    monkeypatch.delitem(rlpr.CORES, "length")
    with pytest.raises(ValueError, match="kind='length'"):
        rlpr.Reward(None, None, kind="length")


def test_policy_baseline_is_scored_per_question_under_the_current_model(tiny):
    model, tok = tiny
    meta = [{"id": q, "reference": ref, "aliases": [ref], "value": None} for q, ref in (("a", "7"), ("a", "7"), ("b", "42"))]
    prompts, replies = ["p", "p", "q"], ["x. The answer is 3.", "The answer is 7.", "so the answer is 1."]
    rec = Recorder(3)
    out = rlpr.Reward(model, tok, baseline="policy", format_weight=0.0)(prompts, replies, meta, log_metric=rec.log_metric,
                                                                      log_extra=rec.log_extra)
    rp = [rlpr.aggregate(x) for x in rlpr.baseline_probs(model, tok, ["p", "p", "q"], ["7", "7", "42"])]
    r = [rlpr.aggregate(x) for x in rlpr.reply_probs(model, tok, prompts, replies, ["7", "7", "42"])]
    assert out == pytest.approx(rlpr.debias(r, rp).tolist(), abs=1e-6) and rec.extras["r"] == pytest.approx(r, abs=1e-6)
    assert rec.metrics["r_prime"] == pytest.approx(np.mean(rp), abs=1e-6)
    assert rec.metrics["debiased_nonzero"] == pytest.approx(np.mean(np.array(out) > 0))
    fixed = rlpr.Reward(model, tok, baseline={"a": [0.0], "b": [0.0]}, format_weight=0.0)(prompts, replies, meta)
    assert fixed == pytest.approx(r, abs=1e-6)   # r' = 0 leaves r


def test_reward_side_data_reach_the_rollout_record():
    model, tok = models.tiny_model(seed=0)
    model = models.add_lora(model, r=4, alpha=8)
    reward = rlpr.Reward(model, tok, baseline={"q": [0.2]})
    trainer = grpo.GRPOTrainer(model, tok, reward, grpo.GRPOConfig(num_generations=2, max_new_tokens=4, kl_beta=0.0))
    meta = {"id": "q", "reference": "7", "aliases": ["7"], "value": 7.0}
    batch = trainer.rollout(["a", "b"], [meta, meta])
    assert set(batch.extras) == {"r", "core", "format", "correct"} and all(len(v) == 4 for v in batch.extras.values())
    assert "answer_found" in batch.metrics and "answer_found" in grpo.step_stats(batch)


# ---- statistics used by reward quality (replication.core.stats) ----

def test_auc_matches_mannwhitney():
    rng = np.random.default_rng(0)
    y = rng.random(200) < 0.4
    s = np.round(rng.normal(size=200) + y, 1)   # rounding makes ties
    u = mannwhitneyu(s[y], s[~y]).statistic
    assert stats.auc(s, y) == pytest.approx(u / (y.sum() * (~y).sum()))
    assert math.isnan(stats.auc([0.1, 0.2], [True, True]))
    assert stats.within_auc([1, 2, 1, 2, 5], [0, 1, 1, 0, 1], ["a", "a", "b", "b", "c"]) == pytest.approx(0.5)


def test_roc_curve_area_equals_auc_and_paired_difference():
    rng = np.random.default_rng(1)
    y = rng.random(80) < 0.5
    s = np.round(rng.random(80) + 0.3 * y, 1)
    fpr, tpr = stats.roc_curve(s, y)
    assert fpr[0] == tpr[0] == 0 and fpr[-1] == tpr[-1] == 1
    assert np.trapezoid(tpr, fpr) == pytest.approx(stats.auc(s, y))
    d, lo, hi = stats.paired_bootstrap([1, 1, 0, 1], [0, 1, 0, 0], n_boot=200)
    assert d == 0.5 and lo <= 0.5 <= hi


# ---- reward quality ----

def quality_table(n_q=12, per_q=4, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(n_q):
        for _ in range(per_q):
            correct = bool(rng.random() < 0.5)
            p = [float(np.clip(rng.random() * 0.5 + 0.4 * correct, 0.01, 1)), float(rng.random())]
            rows.append({"qid": f"q{k}", "kind": "arithmetic", "style": ["digits", "words"][k % 2], "reference": "7",
                         "probs": p, "base_probs": [0.1], "answered": True, "correct": correct,
                         "verified": correct and k % 2 == 0, "format": 1.0, "tokens": 5})
    return reward_quality.reward_columns(pd.DataFrame(rows))


def test_reward_columns_debias_per_aggregation():
    t = pd.DataFrame({"probs": [[0.5, 0.8], None], "base_probs": [[0.25, 0.2], [0.1]], "verified": [True, False]})
    out = reward_quality.reward_columns(t)
    assert out["mean"].tolist() == pytest.approx([0.65, 0.0]) and out["base_mean"].tolist() == pytest.approx([0.225, 0.1])
    assert out["mean_debiased"].tolist() == pytest.approx([0.425, 0.0])
    assert out["sequence_debiased"].tolist() == pytest.approx([0.4 - 0.05, 0.0]) and out["verifier"].tolist() == [1.0, 0.0]


def test_auc_table_resamples_questions_and_differences_are_paired():
    R = quality_table()
    table = reward_quality.auc_table(R, n_boot=200, seed=0)
    assert list(table.index) == list(reward_quality.COLUMNS)
    for c in reward_quality.COLUMNS:
        est, lo, hi = stats.bootstrap(stats.auc, R[c], R.correct, groups=R.qid, n_boot=200, seed=0)
        assert table.loc[c, "AUC"] == pytest.approx(est) and (table.loc[c, "ci_low"], table.loc[c, "ci_high"]) == (lo, hi)
        assert table.loc[c, "within-question AUC"] == pytest.approx(stats.within_auc(R[c], R.correct, R.qid))
    same = reward_quality.auc_difference(R, "mean", "mean", n_boot=100)
    assert (same["estimate"], same["ci95"], same["per_draw"]) == (0.0, [0.0, 0.0], [0.0])
    d = reward_quality.auc_difference(R, "mean", "verifier", n_boot=200)
    want = stats.bootstrap(lambda x, z, y: stats.auc(x, y) - stats.auc(z, y), R["mean"], R.verifier, R.correct,
                           groups=R.qid, n_boot=200, seed=0)   # one draw: the question bootstrap, the same resamples
    assert (d["estimate"], *d["ci95"]) == pytest.approx(want) and d["n"] == "1 draw x 12 questions (48 replies)"
    assert reward_quality.claim_basis(d, "x") == {"interval": tuple(d["ci95"]), "estimate": d["estimate"],
                                                  "seed_differences": [d["estimate"]], "unit": "draw"}
    assert reward_quality.claim_basis({"ci95": [np.nan, np.nan]}, "one class") == {"not_tested": "one class"}
    assert set(reward_quality.auc_by_style(R).columns) == {"digits", "words"}
    spread = reward_quality.reward_spread(R)
    assert spread.loc["mean", "overall std"] == pytest.approx(R["mean"].std())


def drawn(tables):
    """Draws of sampled replies stacked as the notebook stacks them (a `draw` column)."""
    return pd.concat([t.assign(draw=i) for i, t in enumerate(tables)], ignore_index=True)


def test_over_draws_is_the_two_level_bootstrap_for_a_mean():
    rng = np.random.default_rng(3)
    x = rng.normal(0.1, 1.0, size=(3, 20)) + rng.normal(0, 0.5, size=(3, 1))   # 3 draws x 20 questions, draw offsets
    table = drawn([pd.DataFrame({"qid": [f"q{j}" for j in range(20)], "x": row}) for row in x])
    d = reward_quality.over_draws(lambda v: float(np.mean(v)), table, ("x",), n_boot=300, seed=5)
    est, lo, hi = stats.two_level_bootstrap(x, n_boot=300, seed=5)
    assert d["estimate"] == pytest.approx(est) and d["ci95"] == pytest.approx([lo, hi])
    assert d["per_draw"] == pytest.approx(x.mean(axis=1).tolist()) and d["n"] == "3 draws x 20 questions (60 replies)"
    one = reward_quality.over_draws(lambda v: float(np.mean(v)), table[table.draw == 0], ("x",), n_boot=300, seed=5)
    assert hi - lo > one["ci95"][1] - one["ci95"][0]   # the draw-to-draw spread widens the interval


def test_reward_quality_rows_rest_on_every_draw():
    a, b = quality_table(seed=0), quality_table(seed=1)
    R = drawn([a, b])
    d = reward_quality.auc_difference(R, "mean", "verifier", n_boot=200, seed=0)
    per = [stats.auc(t["mean"], t.correct) - stats.auc(t.verifier, t.correct) for t in (a, b)]
    assert d["per_draw"] == pytest.approx(per) and d["estimate"] == pytest.approx(np.mean(per)) and d["draws"] == 2
    assert reward_quality.claim_basis(d, "x")["seed_differences"] == pytest.approx(per)   # the verdict sees each draw
    assert reward_quality.difference_text(d).endswith(f"(per draw {per[0]:+.3f}, {per[1]:+.3f})")
    table = reward_quality.auc_table(R, columns=("mean",), n_boot=100)
    assert table.loc["mean", "AUC"] == pytest.approx(np.mean([stats.auc(t["mean"], t.correct) for t in (a, b)]))
    assert table.loc["mean", "AUC draw 1"] == pytest.approx(stats.auc(b["mean"], b.correct))
    one_class = b.assign(correct=True)   # a draw with no AUC is left out, not averaged in as nan
    left = reward_quality.auc_difference(drawn([a, one_class]), "mean", "verifier", n_boot=100)
    assert left["draws"] == 1 and np.isnan(left["per_draw"][1]) and left["estimate"] == pytest.approx(per[0])
    assert left["n"] == "2 draws x 12 questions (96 replies; 1 without a value)"
    assert reward_quality.claim_basis(left, "x")["seed_differences"] == pytest.approx([per[0]])


def test_sample_draws_caches_each_draw_under_its_own_seed(tiny):
    qs = answers.make_questions(2, 0, seed=0)["train"]
    keys = []

    def cache(name, key, make):
        keys.append((name, key))
        return make()

    setting = rlpr_runs.ArmSetting(grpo.GRPOConfig(temperature=1.0), 1, 1, max_new_tokens=4, batch_size=4)
    R = reward_quality.sample_draws(*tiny, qs, 2, [0, 1], setting, cache=cache)
    assert [(name, key["seed"]) for name, key in keys] == [("samples", 0), ("samples", 1)]   # each draw its own entry
    assert keys[0][1] == {**keys[1][1], "seed": 0} and keys[0][1]["questions"] == [q.id for q in qs]
    assert {"model", "samples", "temperature", "max_new_tokens", "batch_size", "shots", "references"} <= set(keys[0][1])
    assert R.draw.tolist() == [0] * 4 + [1] * 4 and {"mean", "mean_debiased", "verifier"} <= set(R.columns)
    assert R[R.draw == 0].reply.tolist() != R[R.draw == 1].reply.tolist()   # another sampling seed, other replies
    alone = reward_quality.sample_replies(*tiny, qs, 2, max_new_tokens=4, batch_size=4, seed=1)
    assert R[R.draw == 1].reply.tolist() == alone.reply.tolist()


def test_sensitivity_to_the_weakest_token():
    assert reward_quality.bump_weakest([0.01, 0.7, 0.9]).tolist() == pytest.approx([0.05, 0.7, 0.9])
    assert reward_quality.bump_weakest([0.5, 0.9]).tolist() == [1.0, 0.9]   # capped at 1
    ex = reward_quality.example_ratios([0.01, 0.7, 0.9], [0.05, 0.7, 0.9])
    assert ex.loc["sequence", "b / a"] == pytest.approx(5.0) and ex.loc["geometric", "b / a"] == pytest.approx(5 ** (1 / 3))
    assert ex.loc["mean", "b / a"] == pytest.approx(1.65 / 1.61)
    ratios = reward_quality.bump_ratios([[0.01, 0.7, 0.9], [0.1, 0.2]])
    assert ratios["sequence"].tolist() == pytest.approx([5.0, 5.0]) and ratios["mean"][1] == pytest.approx(0.7 / 0.3)
    R = pd.DataFrame({"answered": [True, True, False], "probs": [[0.1], [0.1, 0.2], None]})
    assert len(reward_quality.multi_token(R)) == 1
    # the weakest-token row is arithmetic: the product moves at least as much as the mean for any probabilities
    rng = np.random.default_rng(0)
    lists = [list(rng.random(rng.integers(2, 6)) ** 3) for _ in range(300)] + [[0.9, 0.95], [0.3, 0.3, 0.3]]
    assert reward_quality.weakest_token_holds(lists, 5.0) and reward_quality.weakest_token_holds(lists, 1.5)
    assert not reward_quality.weakest_token_holds([], 5.0) and reward_quality.weakest_token_holds([[0.0, 0.5], [0.2, 0.4]])


def test_debiasing_effect_and_per_question_table():
    R = quality_table()
    per_q = reward_quality.per_question(R)
    assert len(per_q) == R.qid.nunique() and per_q.r_prime.is_monotonic_increasing
    effect = reward_quality.debiasing_effect(R, per_q)
    assert math.isnan(effect["corr_rprime_question_accuracy"]["r"])   # r' is the same for every question here
    assert effect["corr_r_correct"]["ci95"][0] <= effect["corr_r_correct"]["r"] <= effect["corr_r_correct"]["ci95"][1]
    assert effect["clipped_share"] == pytest.approx(float((R["mean"] < R["base_mean"]).mean()))


def test_debiasing_correlations_take_the_draw_as_the_unit():
    a, b = quality_table(seed=0), quality_table(seed=1)
    R = drawn([a, b])
    effect = reward_quality.debiasing_effect(R, reward_quality.per_question(R), n_boot=200, seed=0)
    per = [float(np.corrcoef(t["mean"], t.correct)[0, 1]) for t in (a, b)]
    r = effect["corr_r_correct"]
    assert r["per_draw"] == pytest.approx(per) and r["r"] == pytest.approx(np.mean(per))
    want = reward_quality.over_draws(reward_quality.pearson, R, ("mean", "correct"), n_boot=200, seed=0)
    assert r["ci95"] == pytest.approx(want["ci95"]) and r["n"] == "2 draws x 12 questions (96 replies)"


# ---- the std filter ----

def test_std_filter_against_a_hand_worked_sequence():
    f = rlpr_training.StdFilter(factor=0.5, ratio=0.99, warmup_start=1, warmup_end=3)
    assert f.threshold is None and f.keep([0.0, 0.1]).all()
    f.observe(0, 9.0)                      # before the window: ignored
    f.observe(1, 0.2)
    assert f.ema is None
    f.observe(2, 0.4)                      # window closes: ema = mean(0.2, 0.4)
    assert f.ema == pytest.approx(0.3) and f.threshold == pytest.approx(0.15)
    assert f.keep([0.1, 0.149, 0.151, 0.3]).tolist() == [False, False, True, True]
    f.observe(3, 0.5)
    assert f.ema == pytest.approx(0.01 * 0.5 + 0.99 * 0.3)
    g = rlpr_training.StdFilter(warmup_start=1, warmup_end=3)
    g.load(f.state())
    assert g.ema == f.ema
    with pytest.raises(ValueError, match="warmup_end=1"):
        rlpr_training.StdFilter(warmup_start=1, warmup_end=1)


# ---- data ----

def test_questions_are_reproducible_and_match_the_committed_file():
    a, b = answers.make_questions(40, 20, seed=0), answers.make_questions(40, 20, seed=0)
    assert a == b and {q.style for q in a["train"] if q.kind == "arithmetic"} == {"digits", "words", "unit"}
    assert answers.make_questions(40, 20, seed=1) != a
    ids = [q.id for q in a["train"]] + [q.id for q in a["heldout"]]
    assert len(set(ids)) == len(ids) and len(a["heldout"]) == 60
    assert not {q.question for q in a["train"]} & {q.question for q in a["heldout"]}
    committed = pd.read_csv(config.ROOT / "data/generated/rlpr_questions.csv", keep_default_na=False)
    assert committed["seed"].eq(0).all() and list(committed["reference"]) == [q.reference for q in a["train"] + a["heldout"]]
    with pytest.raises(ValueError, match="n_factual=31"):
        answers.make_questions(4, 31)


def test_heldout_size_styles_and_worked_examples():
    from replication.lm import tasks

    split = answers.make_questions(10, 0, seed=0, n_heldout=30, styles=("digits",))
    assert len(split["train"]) == 10 and len(split["heldout"]) == 30 and not split["train"][0].kind == "factual"
    assert {q.style for qs in split.values() for q in qs} == {"digits"}
    assert [q.id for q in split["train"]] == [q.id for q in answers.make_questions(10, 0, seed=0)["train"]]
    assert not {q.question for q in split["train"]} & {q.question for q in split["heldout"]}
    with pytest.raises(ValueError, match="styles=.*roman"):
        answers.make_questions(4, 0, styles=("roman",))
    q, shots = split["train"][0], tasks.worked_examples("1d-1step-add", 2, seed=0)
    turns = q.chat(shots)
    assert q.chat() == q.prompt() and [t["role"] for t in turns] == ["user", "assistant"] * 2 + ["user"]
    assert turns[1]["content"] == shots[0].solution and turns[1]["content"].endswith(f"The answer is {shots[0].answer}.")
    assert turns[0]["content"].endswith(answers.ANSWER_INSTRUCTION) and turns[-1]["content"] == q.prompt()


# ---- the filtered GRPO loop ----

def letter_reward(prompts, completions, metadata, log_metric=None, log_extra=None):
    """Fraction of lower-case letters: varies within groups on a random tiny model."""
    out = [sum(c.isalpha() and c.islower() for c in x) / max(len(x), 1) for x in completions]
    if log_extra is not None:
        log_extra("r", out)
        log_extra("correct", [v > 0.5 for v in out])
    return out


def make_trainer():
    model, tok = models.tiny_model(seed=0)
    model = models.add_lora(model, r=4, alpha=8)
    cfg = grpo.GRPOConfig(num_generations=4, max_new_tokens=6, lr=1e-2, kl_beta=0.0, save_every=2, seed=0)
    return grpo.GRPOTrainer(model, tok, letter_reward, cfg)


def test_filtered_loop_filters_refills_and_resumes(tmp_path):
    pool = answers.make_questions(12, 0, seed=0)["train"]
    filt = lambda: rlpr_training.StdFilter(factor=3.0, warmup_start=0, warmup_end=1)  # noqa: E731  (strict: filters a lot)
    straight = make_trainer()
    rows = rlpr_training.train(straight, pool, 4, 2, loop.RunFolder(tmp_path / "a"), filt(), max_rollouts=2, progress=False)
    assert rows[0]["threshold"] is None and rows[0]["fraction_filtered"] == 0.0
    assert rows[1]["threshold"] == pytest.approx(3.0 * rows[0]["group_std_mean"])
    assert any(r["fraction_filtered"] > 0 for r in rows[1:]) and any(r["rollouts"] == 2 for r in rows[1:])
    assert all(r["train_correct"] is not None and r["r_mean"] is not None for r in rows)
    assert all(r["prompts_updated"] <= 2 for r in rows) and any(r["prompts_updated"] == 0 for r in rows)  # a step with no update
    for r in rows:   # a refill rolls out only as many prompts as were dropped
        assert r["prompts_rolled"] == 2 if r["rollouts"] == 1 else 2 < r["prompts_rolled"] <= 4
        assert 0.0 <= r["zero_std_rolled"] <= 1.0 and r["completion_len"] > 0
    folder = loop.RunFolder(tmp_path / "b")
    first = make_trainer()
    rlpr_training.train(first, pool, 2, 2, folder, filt(), progress=False)
    (folder.path / "done.json").unlink()
    second = make_trainer()
    resumed = rlpr_training.train(second, pool, 4, 2, folder, filt(), progress=False)
    assert [r["reward_mean"] for r in resumed] == [r["reward_mean"] for r in rows]
    assert [r["ema"] for r in resumed] == pytest.approx([r["ema"] for r in rows])   # the EMA resumed with the loop
    a, b = loop.trainable(straight.model), loop.trainable(second.model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    plain = rlpr_training.train(make_trainer(), pool, 2, 2, progress=False)
    assert all(r["fraction_filtered"] == 0.0 and r["rollouts"] == 1 and r["prompts_updated"] == 2 for r in plain)


# ---- held-out answers and the notebook's summaries ----

def step_rows(rewards, lengths=None):
    n = len(rewards)
    return pd.DataFrame({"step": range(n), "reward_mean": rewards, "wall_s": [1.0] * n, "train_correct": [0.5] * n,
                         "grad_norm": [1.0, 3.0] * (n // 2) + [2.0] * (n % 2), "update_std_mean": [0.1] * n,
                         "threshold": [None] + [0.2] * (n - 1), "ema": [None] + [0.4] * (n - 1),
                         "fraction_filtered": [0.0] + [0.5] * (n - 1), "rollouts": [1] + [2] * (n - 1),
                         "prompts_updated": [4] * n, "zero_std_rolled": [0.25] * n, "zero_std_updated": [0.0] * n,
                         "completion_len": lengths or [18.0] * n})


def heldout_table(correct, tokens=12):
    return pd.DataFrame({"qid": [f"q{i}" for i in range(len(correct))], "correct": correct,
                         "verified": [False] * len(correct), "format": [1.0] * len(correct), "tokens": [tokens] * len(correct)})


def test_answer_heldout_and_paired_difference(tiny):
    from replication.lm import tasks

    qs = answers.make_questions(3, 1, seed=0)["heldout"]
    shots = tasks.worked_examples("1d-1step-add", 1)
    table = rlpr_training.answer_heldout(*tiny, qs, max_new_tokens=4, batch_size=2, shots=shots)
    assert list(table.qid) == [q.id for q in qs] and {"correct", "verified", "format", "tokens"} <= set(table.columns)
    base = heldout_table([False, True, False, False])
    better = base.assign(correct=[True, True, True, False])[::-1]   # same questions, another order
    d, lo, hi = stats.paired_bootstrap(*arms.paired(better, base), seed=0)
    assert d == 0.5 and lo <= d <= hi
    with pytest.raises(ValueError, match="same questions"):
        arms.paired(base.iloc[:3], base)


def test_health_check_and_arm_records():
    rng = np.random.default_rng(0)
    base = heldout_table([True] * 40 + [False] * 60)                      # 0.40, Wilson low ~0.31
    rising = step_rows(list(np.linspace(0.2, 0.6, 12) + rng.normal(0, 0.02, 12)))
    good = heldout_table([True] * 60 + [False] * 40)
    h = rlpr_eval.health(rising, good, base, n_boot=200)
    assert h["healthy"] and h["failed"] == [] and h["signal"]["ci95"][0] > 0
    assert h["base_accuracy_low"] == pytest.approx(stats.proportion_ci(40, 100)[1])
    flat = step_rows([0.4, 0.6, 0.5] * 4)                                  # no clear rise over the steps
    assert rlpr_eval.health(flat, good, base, n_boot=200)["failed"] == ["learned"]
    worse = heldout_table([True] * 20 + [False] * 80)
    assert rlpr_eval.health(rising, worse, base, n_boot=200)["failed"] == ["accuracy_ok"]
    short = step_rows(list(np.linspace(0.2, 0.6, 12)), lengths=[18.0] * 6 + [4.0] * 6)
    assert rlpr_eval.health(short, good, base, n_boot=200)["failed"] == ["length_ok"]
    terse = heldout_table([True] * 60 + [False] * 40, tokens=3)
    assert rlpr_eval.health(rising, terse, base, n_boot=200)["failed"] == ["length_ok"]
    first, last = arms.thirds(10)
    assert first.sum() == last.sum() == 3 and first[:3].all() and last[-3:].all()
    assert arms.thirds(2)[0].tolist() == [True, False]

    rec = rlpr_eval.arm_record("rlpr", rising, good, base, group=8, n_boot=200)
    assert {"arm": "rlpr", "steps": 12, "samples": 12 * 4 * 8, "n_heldout": 100, "accuracy": 0.6, "healthy": True}.items() <= rec.items()
    assert rec["interval"] == pytest.approx(list(stats.proportion_ci(60, 100)[1:]))
    assert rec["vs_base"]["difference"] == pytest.approx(0.2) and rec["zero_std_rolled"] == 0.25 and rec["rollouts"] == 23
    assert rec["grad_norm_cv"] == pytest.approx(np.std([1.0, 3.0] * 6, ddof=1) / 2.0)
    records = {"rlpr": rec, "rlvr": rlpr_eval.arm_record("rlvr", flat, good, base, 8, 200),
               "base": rlpr_eval.base_record(base)}
    tables = {"rlpr": good, "rlvr": good, "base": base}
    vs_base = arms.compare("rlpr", "base", tables, records, n_boot=200)
    assert vs_base["pair"] == "rlpr - base" and vs_base["n"] == "1 seed x 100 questions"
    assert vs_base["basis"] == {"interval": list(vs_base["ci95"]), "estimate": pytest.approx(0.2),
                                "seed_differences": [pytest.approx(0.2)], "health": None}
    measured = arms.compare("rlpr", "rlvr", tables, records, n_boot=200)   # a failed arm is still measured
    assert measured["basis"]["health"] == "failed health check: rlvr (learned)" and measured["basis"]["interval"] == [0.0, 0.0]
    seeds = {"rlpr": [good, good.assign(correct=[True] * 50 + [False] * 50)], "rlvr": [good, good], "base": base}
    per_seed = {"rlpr": [rec, rec], "rlvr": [records["rlvr"], rec], "base": records["base"]}
    two = arms.compare("rlpr", "rlvr", seeds, per_seed, n_boot=200)
    assert two["n"] == "2 seeds x 100 questions" and two["per_seed"] == pytest.approx([0.0, -0.1])
    assert two["basis"]["health"] == "failed health check: rlvr seed 0 (learned)"


def test_each_variant_trains_once_per_seed(monkeypatch):
    monkeypatch.setattr(models, "load_model", lambda name: models.tiny_model(seed=0))
    monkeypatch.setattr(rlpr_runs, "Reward", lambda *a, **k: letter_reward)   # varies within groups
    pool, heldout = answers.make_questions(6, 0, seed=0)["train"], answers.make_questions(2, 0, seed=0)["heldout"]
    cfg = grpo.GRPOConfig(num_generations=2, max_new_tokens=4, kl_beta=0.0, seed=7)
    keys = []

    def folder(name, key):
        keys.append(key)
        return None

    arm = rlpr_runs.ArmSetting(cfg, 2, 2, warmup=(0, 1), lora_r=4, max_new_tokens=4, batch_size=4)
    runs = rlpr_runs.run_seeds("rlpr_no_filter", [7, 8], pool, heldout, arm, run_folder=folder)
    first = rlpr_runs.run_variant("rlpr_no_filter", pool, heldout, arm, run_folder=folder)
    assert [k["grpo"]["seed"] for k in keys] == [7, 8, 7] and keys[0] == keys[2]   # seed 0's key: run_variant's own
    assert runs[0][0]["reward_mean"].tolist() == first[0]["reward_mean"].tolist()
    assert runs[0][0]["reward_mean"].tolist() != runs[1][0]["reward_mean"].tolist()   # another seed, other rollouts


def test_run_all_keeps_variants_and_seeds_in_order(monkeypatch):
    monkeypatch.setattr(models, "load_model", lambda name: models.tiny_model(seed=0))
    monkeypatch.setattr(rlpr_runs, "Reward", lambda *a, **k: letter_reward)
    pool, heldout = answers.make_questions(6, 0, seed=0)["train"], answers.make_questions(2, 0, seed=0)["heldout"]
    cfg = grpo.GRPOConfig(num_generations=2, max_new_tokens=4, kl_beta=0.0, seed=7)
    keys = []
    kw = dict(run_folder=lambda name, key: keys.append((name, key["grpo"]["seed"])))
    arm = rlpr_runs.ArmSetting(cfg, 2, 2, warmup=(0, 1), lora_r=4, max_new_tokens=4, batch_size=4)
    both = rlpr_runs.run_all(["rlvr", "rlpr_no_filter"], [7, 8], pool, heldout, arm, workers=1, **kw)
    assert list(both) == ["rlvr", "rlpr_no_filter"] and [len(v) for v in both.values()] == [2, 2]
    assert keys == [("rlvr", 7), ("rlvr", 8), ("rlpr_no_filter", 7), ("rlpr_no_filter", 8)]
    alone = rlpr_runs.run_seeds("rlpr_no_filter", [7, 8], pool, heldout, arm, **kw)
    for (rows, table), (rows_, table_) in zip(both["rlpr_no_filter"], alone):
        assert rows["reward_mean"].tolist() == rows_["reward_mean"].tolist() and table.equals(table_)
    with pytest.raises(ValueError, match="workers=0"):
        rlpr_runs.run_all(["rlvr"], [7], pool, heldout, arm, workers=0, **kw)


def test_filter_summary_per_seed():
    rows = step_rows([0.1, 0.2])
    filt = rlpr_eval.filter_summary({"rlpr": rows}, std_filter_factor=0.5, warmup=(0, 1))
    assert filt["final_threshold"] == [pytest.approx(0.2)] and filt["fraction_filtered"] == 0.5
    assert filt["threshold_by_step"] == [[None, 0.2]] and rlpr_eval.filter_summary({}, 0.5, (0, 1))["fraction_filtered"] is None
    other = rows.assign(fraction_filtered=[0.0, 0.1], ema=[None, 0.6])
    two = rlpr_eval.filter_summary({"rlpr_no_debias": [rows], "rlpr": [rows, other]}, 0.5, (0, 1))
    assert two["variant"] == "rlpr" and two["fraction_filtered_by_seed"] == pytest.approx([0.5, 0.1])
    assert two["fraction_filtered"] == pytest.approx(0.3) and two["final_threshold"] == pytest.approx([0.2, 0.3])
    assert two["rollouts_by_step"] == [[1, 2], [1, 2]]
