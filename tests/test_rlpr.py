"""RLPR pieces: answer location, reference tokens, aggregation, debiasing, the std filter and the filtered loop."""
import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import mannwhitneyu

from replication import config, grpo, models, rlpr, loop, training


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
    o, a, b = rlpr.replace_answer(text, reference)
    enc = tok(o, add_special_tokens=False, return_offsets_mapping=True)
    mask = rlpr.reference_mask(enc["offset_mapping"], a, b)
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
    a, b = rlpr.locate_answer(text)
    assert text[a:b] == span


@pytest.mark.parametrize("text", ["no answer here 7", "<answer>7", "The answer is .", ""])
def test_missing_answer_is_none(text):
    assert rlpr.locate_answer(text) is None and rlpr.replace_answer(text, "7") is None


def test_reference_at_start_and_end_of_the_reply(tiny):
    tok = tiny[1]
    assert scored_text(tok, "<answer>5</answer>", "seven") == ("<answer>seven</answer>", "seven")
    assert scored_text(tok, "The answer is 5", "7 apples") == ("The answer is 7 apples", "7 apples")


def test_repeated_substring_scores_only_the_answer(tiny):
    o, scored = scored_text(tiny[1], "7 + 0 = 7, so 7. The answer is 9.", "7")
    enc = tiny[1](o, add_special_tokens=False, return_offsets_mapping=True)
    a = o.rindex("7")
    mask = rlpr.reference_mask(enc["offset_mapping"], a, a + 1)
    assert scored == "7" and sum(mask) == 1 and enc["offset_mapping"][mask.index(True)] == (a, a + 1)


def test_token_merged_across_the_tag_boundary_is_scored():
    tok = merging_tokenizer()
    o, scored = scored_text(tok, "so <answer>5</answer>", "7")
    ids = tok(o, add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids).count(">7") == 1
    assert scored == ">7"   # the merged token overlaps the reference, so it is scored whole


def test_reference_mask_overlap_rule():
    offsets = [(0, 3), (3, 5), (5, 9), (9, 9), (9, 12)]
    assert rlpr.reference_mask(offsets, 4, 9) == [False, True, True, False, False]


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
    assert rlpr.format_score(text) == score


def test_exact_match_and_lenient_oracle():
    assert rlpr.exact_match("The answer is 7.", "7") and not rlpr.exact_match("The answer is 7 apples.", "7")
    assert not rlpr.exact_match("The answer is seven.", "7")
    assert rlpr.is_correct("The answer is seven apples.", ("7",), 7.0)
    assert rlpr.is_correct("so twenty-one", ("21",), 21.0) and not rlpr.is_correct("The answer is 8.", ("7",), 7.0)
    assert rlpr.is_correct("The answer is the Pacific.", ("pacific ocean", "pacific"))
    assert not rlpr.is_correct("The answer is Atlantic.", ("pacific",))
    assert [rlpr.number_words(n) for n in (0, 13, 40, 99, 105)] == ["zero", "thirteen", "forty", "ninety nine", "one hundred five"]
    assert rlpr.parse_number("one hundred and five degrees") == 105.0


def test_reward_missing_answer_scores_zero(tiny):
    model, tok = tiny
    meta = [{"id": "q", "reference": "7", "aliases": ["7"], "value": 7.0}] * 2
    fn = rlpr.Reward(model, tok, baseline={"q": [0.0]}, format_weight=0.1)
    out = fn(["p", "p"], ["no answer at all", "The answer is 3."], meta)
    assert out[0] == 0.0 and fn.last["r"][0] == 0.0 and fn.last["format"] == [0.0, 1.0]
    assert 0.1 <= out[1] <= 1.0
    big = rlpr.Reward(model, tok, baseline={"q": [1.0]})(["p"], ["The answer is 3."], meta[:1])
    assert big == [pytest.approx(0.1)]   # r' = 1 removes everything but the format term
    verifier = rlpr.Reward(model, tok, kind="verifier", format_weight=0.0)
    assert verifier(["p", "p"], ["The answer is 7.", "The answer is seven."], meta) == [1.0, 0.0]


# ---- AUC ----

def test_auc_matches_mannwhitney():
    rng = np.random.default_rng(0)
    y = rng.random(200) < 0.4
    s = np.round(rng.normal(size=200) + y, 1)   # rounding makes ties
    u = mannwhitneyu(s[y], s[~y]).statistic
    assert rlpr.auc(s, y) == pytest.approx(u / (y.sum() * (~y).sum()))
    assert math.isnan(rlpr.auc([0.1, 0.2], [True, True]))
    assert rlpr.within_auc([1, 2, 1, 2, 5], [0, 1, 1, 0, 1], ["a", "a", "b", "b", "c"]) == pytest.approx(0.5)


# ---- the std filter ----

def test_std_filter_against_a_hand_worked_sequence():
    f = rlpr.StdFilter(beta=0.5, ratio=0.99, warmup_start=1, warmup_end=3)
    assert f.threshold is None and f.keep([0.0, 0.1]).all()
    f.observe(0, 9.0)                      # before the window: ignored
    f.observe(1, 0.2)
    assert f.ema is None
    f.observe(2, 0.4)                      # window closes: ema = mean(0.2, 0.4)
    assert f.ema == pytest.approx(0.3) and f.threshold == pytest.approx(0.15)
    assert f.keep([0.1, 0.149, 0.151, 0.3]).tolist() == [False, False, True, True]
    f.observe(3, 0.5)
    assert f.ema == pytest.approx(0.01 * 0.5 + 0.99 * 0.3)
    g = rlpr.StdFilter(warmup_start=1, warmup_end=3)
    g.load(f.state())
    assert g.ema == f.ema
    with pytest.raises(ValueError, match="warmup_end=1"):
        rlpr.StdFilter(warmup_start=1, warmup_end=1)


# ---- data ----

def test_questions_are_reproducible_and_match_the_committed_file():
    a, b = rlpr.make_questions(40, 20, seed=0), rlpr.make_questions(40, 20, seed=0)
    assert a == b and {q.style for q in a["train"] if q.kind == "arithmetic"} == {"digits", "words", "unit"}
    ids = [q.id for q in a["train"]] + [q.id for q in a["heldout"]]
    assert len(set(ids)) == len(ids)
    assert not {q.question for q in a["train"]} & {q.question for q in a["heldout"]}
    committed = pd.read_csv(config.ROOT / "data/generated/rlpr_questions.csv", keep_default_na=False)
    assert committed["seed"].eq(0).all() and list(committed["reference"]) == [q.reference for q in a["train"] + a["heldout"]]
    with pytest.raises(ValueError, match="n_factual=31"):
        rlpr.make_questions(4, 31)


# ---- the filtered GRPO loop ----

class LetterReward:
    """Fraction of lower-case letters: varies within groups on a random tiny model."""

    last = {}

    def __call__(self, prompts, completions, metadata):
        out = [sum(c.isalpha() and c.islower() for c in x) / max(len(x), 1) for x in completions]
        self.last = {"r": out, "correct": [v > 0.5 for v in out]}
        return out


def make_trainer():
    model, tok = models.tiny_model(seed=0)
    model = models.add_lora(model, r=4, alpha=8)
    cfg = grpo.GRPOConfig(num_generations=4, max_new_tokens=6, lr=1e-2, beta=0.0, save_every=2, seed=0)
    return grpo.GRPOTrainer(model, tok, LetterReward(), cfg)


def test_merge_repads_batches():
    trainer = make_trainer()
    qs = rlpr.make_questions(4, 0, seed=0)["train"]
    torch.manual_seed(0)
    b1 = trainer.rollout(["a"], [qs[0].meta()])
    b2 = trainer.rollout(["a much longer prompt here"], [qs[1].meta()])
    m = rlpr._merge([b1, b2], trainer.tok.pad_token_id)
    for k, b in enumerate([b1, b2]):
        for i in range(4):
            row = 4 * k + i
            assert m["prompt_ids"][row][m["prompt_mask"][row].bool()].tolist() == b["prompt_ids"][i][b["prompt_mask"][i].bool()].tolist()
            assert m["completion_ids"][row][m["completion_mask"][row].bool()].tolist() == b["completion_ids"][i][b["completion_mask"][i].bool()].tolist()
    trainer.update(m)   # the merged batch is a valid update batch


def test_filtered_loop_filters_refills_and_resumes(tmp_path):
    pool = rlpr.make_questions(12, 0, seed=0)["train"]
    filt = lambda: rlpr.StdFilter(beta=1.5, warmup_start=0, warmup_end=1)  # noqa: E731  (strict: filters a lot)
    straight = make_trainer()
    rows = rlpr.train(straight, pool, 4, 2, loop.RunFolder(tmp_path / "a"), filt(), max_rollouts=2, progress=False)
    assert rows[0]["threshold"] is None and rows[0]["fraction_filtered"] == 0.0
    assert rows[1]["threshold"] == pytest.approx(1.5 * rows[0]["group_std_mean"])
    assert any(r["fraction_filtered"] > 0 for r in rows[1:]) and any(r["rollouts"] == 2 for r in rows[1:])
    folder = loop.RunFolder(tmp_path / "b")
    first = make_trainer()
    rlpr.train(first, pool, 2, 2, folder, filt(), progress=False)
    (folder.path / "done.json").unlink()
    second = make_trainer()
    resumed = rlpr.train(second, pool, 4, 2, folder, filt(), progress=False)
    assert [r["reward_mean"] for r in resumed] == [r["reward_mean"] for r in rows]
    a, b = training.trainable(straight.model), training.trainable(second.model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    plain = rlpr.train(make_trainer(), pool, 2, 2, progress=False)
    assert all(r["fraction_filtered"] == 0.0 and r["rollouts"] == 1 for r in plain)


def test_roc_curve_area_equals_auc_and_paired_difference():
    rng = np.random.default_rng(1)
    y = rng.random(80) < 0.5
    s = np.round(rng.random(80) + 0.3 * y, 1)
    fpr, tpr = rlpr.roc_curve(s, y)
    assert fpr[0] == tpr[0] == 0 and fpr[-1] == tpr[-1] == 1
    assert np.trapezoid(tpr, fpr) == pytest.approx(rlpr.auc(s, y))
    d = rlpr.paired_difference([1, 1, 0, 1], [0, 1, 0, 0], n_boot=200)
    assert d["difference"] == 0.5 and d["ci95"][0] <= 0.5 <= d["ci95"][1]


def test_reward_columns_debias_per_aggregation():
    t = pd.DataFrame({"probs": [[0.5, 0.8], None], "base_probs": [[0.25, 0.2], [0.1]], "verified": [True, False]})
    out = rlpr.reward_columns(t)
    assert out["mean"].tolist() == pytest.approx([0.65, 0.0]) and out["base_mean"].tolist() == pytest.approx([0.225, 0.1])
    assert out["mean_debiased"].tolist() == pytest.approx([0.425, 0.0])
    assert out["sequence_debiased"].tolist() == pytest.approx([0.4 - 0.05, 0.0]) and out["verifier"].tolist() == [1.0, 0.0]
