import copy

import numpy as np
import pandas as pd
import pytest
import torch

from replication.lm import judges, tasks, training


@pytest.mark.parametrize("text, score", [("4", 4), ("Score: 5/5", 5), ("I'd say 3.", 3), ("", None), ("seven", None),
                                         ("9", None)])
def test_parse_rating(text, score):
    assert judges.parse_rating(text) == score


@pytest.mark.parametrize("text, choice", [("A", "A"), ("Response B is better.", "B"), ("b.", "B"), ("A or B", None),
                                          ("neither", None), (None, None)])
def test_parse_choice(text, choice):
    assert judges.parse_choice(text) == choice


def test_judge_distributions_on_tiny_model(tiny):
    model, tok = tiny
    probs, scores = judges.absolute(model, tok, ["q1", "q2", "q3"], ["r1", "r2", "r3"], k=5, seed=0, batch_size=2)
    assert probs.shape == (3, 5) and np.allclose(probs.sum(1), 1)
    assert scores.shape == (3, 5) and set(np.unique(scores)) <= {1, 2, 3, 4, 5}
    again = judges.absolute(model, tok, ["q1", "q2", "q3"], ["r1", "r2", "r3"], k=5, seed=0, batch_size=3)
    assert np.allclose(again[0], probs, atol=1e-5) and np.array_equal(again[1], scores)
    df = judges.pairwise(model, tok, ["q"] * 2, ["good", "fine"], ["bad", "poor"], k=4, seed=1)
    assert np.allclose(df["p_better"], (df["p_better_first"] + df["p_better_second"]) / 2)
    assert all(len(w) == 4 for w in df["wins"])
    bias = judges.position_bias(df)
    assert bias["bias"] == pytest.approx(bias["p_says_a"] - 0.5)
    assert bias["p_better_when_first"] == pytest.approx(df["p_better_first"].mean())


def test_quality_corpus_is_graded_and_reproducible():
    corpus = judges.quality_corpus(6, seed=2)
    assert corpus.equals(judges.quality_corpus(6, seed=2))
    assert sorted(corpus["quality"].unique()) == [1, 2, 3, 4, 5] and len(corpus) == 30
    for _, g in corpus.groupby("question_id"):
        by_q = dict(zip(g["quality"], g["response"]))
        answer = next(p.answer for p in tasks.make_level("1d-2step-addsub", 6, seed=2) if p.id == g["question_id"].iloc[0])
        assert tasks.verify(by_q[5], answer, strict=True) and tasks.verify(by_q[4], answer, strict=True)
        assert not tasks.verify(by_q[3], answer) and not tasks.verify(by_q[2], answer)
    pairs = judges.quality_pairs(corpus, per_question=10, seed=0)
    assert len(pairs) == 60 and set(pairs["gap"]) == {1, 2, 3, 4}
    assert (pairs["better_quality"] - pairs["worse_quality"]).equals(pairs["gap"])
    by_text = dict(zip(zip(corpus["question_id"], corpus["response"]), corpus["quality"]))
    assert [by_text[(q, r)] for q, r in zip(pairs["question_id"], pairs["better"])] == list(pairs["better_quality"])


def test_option_tokens_must_differ(tiny):
    _, tok = tiny
    with pytest.raises(ValueError, match="share a first token"):
        judges.option_ids(tok, ("Apple", "Avocado"))


# ---- the likelihood-comparison judge ---------------------------------------------------------------------

def test_response_logps_match_completion_logps(tiny):
    """Shared-prompt scoring gives each reply's log-prob as completion_logps does on its own row, whatever the
    batch size, order or repeats of the input; the mean is the sum over the reply's tokens (+ EOS)."""
    model, tok = tiny
    questions = ["q one", "q one", "q two", "q one"]
    replies = ["short", "a longer reply", "other", "x"]
    scored = judges.response_logps(model, tok, questions, replies, batch_size=2)
    p_ids, p_mask, c_ids, c_mask = training.encode_pairs(tok, questions, replies)
    with torch.no_grad():
        ref = (training.completion_logps(model, p_ids, p_mask, c_ids, c_mask) * c_mask).sum(1).numpy()
    assert np.allclose(scored["sum_logp"], ref, atol=1e-4)
    assert list(scored["n_tokens"]) == [len(tok(r)["input_ids"]) + 1 for r in replies]
    assert np.allclose(scored["mean_logp"], scored["sum_logp"] / scored["n_tokens"])
    again = judges.response_logps(model, tok, questions[::-1] + questions[:1], replies[::-1] + replies[:1], batch_size=16)
    assert np.allclose(again["sum_logp"].to_numpy(), np.r_[ref[::-1], ref[:1]], atol=1e-4)
    instructed = judges.response_logps(model, tok, questions, replies, instruction="Be brief.")
    assert not np.allclose(instructed["sum_logp"], ref, atol=1e-4)  # the instruction is part of the prompt


def _made_to_prefer(tiny, reply, question, steps=40):
    """A copy of the tiny model trained by SFT to give `reply` to `question`."""
    model, tok = tiny
    model = copy.deepcopy(model).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    p_ids, p_mask, c_ids, c_mask = training.encode_pairs(tok, [question], [reply])
    for _ in range(steps):
        loss = -(training.completion_logps(model, p_ids, p_mask, c_ids, c_mask) * c_mask).sum() / c_mask.sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval()


@pytest.mark.parametrize("preferred", ["abab", "cdcd"])
def test_likelihood_judge_picks_the_reply_the_model_was_made_to_prefer(tiny, preferred):
    _, tok = tiny
    other = {"abab": "cdcd", "cdcd": "abab"}[preferred]
    model = _made_to_prefer(tiny, preferred, "which?")
    forward = judges.likelihood_pairwise(model, tok, ["which?"], [preferred], [other])
    backward = judges.likelihood_pairwise(model, tok, ["which?"], [other], [preferred])
    assert forward["win"].tolist() == [1.0] and backward["win"].tolist() == [0.0]
    assert forward["margin"][0] > 0 and forward["shorter"][0] == 0.5


def test_likelihood_judge_is_symmetric_in_the_pair_order(tiny):
    """Each reply is scored alone, so swapping a pair's replies negates the margin and flips win and shorter."""
    model, tok = tiny
    qs = ["q1", "q1", "q2"]
    a, b = ["yes", "the answer is 4", "hello there"], ["no way", "4", "hi"]
    ab = judges.likelihood_pairwise(model, tok, qs, a, b)
    ba = judges.likelihood_pairwise(model, tok, qs, b, a, batch_size=1)
    assert np.allclose(ab["margin"], -ba["margin"], atol=1e-5) and (ab["margin"] != 0).all()
    assert np.array_equal(ab["win"], 1 - ba["win"]) and np.array_equal(ab["shorter"], 1 - ba["shorter"])
    assert ab["shorter"].tolist() == [1.0, 0.0, 0.0]  # by tokens (+ EOS): 'yes' < 'no way'; the tiny tokenizer is bytes


def test_signal_needs_an_interval_above_one_half():
    assert judges.signal([1, 0] * 20)["carries"] is False
    s = judges.signal([1] * 30 + [0] * 10)
    assert s["carries"] is True and s["accuracy"] == 0.75 and s["n"] == 40 and s["ci95"][0] > 0.5


def test_length_check_counts_by_pair_type_and_length():
    pairs = pd.DataFrame({"better_quality": [5, 5, 4, 4], "worse_quality": [4, 4, 3, 3]})
    verdicts = pd.DataFrame({"win": [1.0, 1.0, 0.0, 1.0], "shorter": [0.0, 0.0, 1.0, 0.5]})
    table = judges.length_check(pairs, verdicts).set_index("group")
    assert table.loc["5 vs 4", ["n", "judge", "pick_shorter", "pick_longer"]].tolist() == [2, 1.0, 0.0, 1.0]
    assert table.loc["4 vs 3", ["n", "judge", "pick_shorter", "pick_longer"]].tolist() == [2, 0.5, 0.75, 0.25]
    assert table.loc["longer", "judge"] == 1.0 and table.loc["shorter", "judge"] == 0.0
    assert table.loc["same length", "n"] == 1
    # where lengths differ the judge picked the longer reply 3 times of 3: it never picked the shorter one
    assert table.loc["all pairs", "judge_picks_shorter"] == 0.0 and table.loc["all pairs", "judge"] == 0.75
    lo, hi = table.loc["all pairs", ["judge_lo", "judge_hi"]]
    assert lo < 0.75 < hi
