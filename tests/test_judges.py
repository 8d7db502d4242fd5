import numpy as np
import pytest

from replication import judges, tasks


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


def test_option_tokens_must_differ(tiny):
    _, tok = tiny
    with pytest.raises(ValueError, match="share a first token"):
        judges.option_ids(tok, ("Apple", "Avocado"))
