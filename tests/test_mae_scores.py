"""Multi-Agent Evolve's judge scores under the authors' rules (ulab-uiuc/Multi-agent-evolve, reward_managers.py):
the trained model as judge (`self_judge`, release cf2ea62), an external judge (`external_judge`, cf2ea62) and the
later last-number fallback (`last_number`, d71c00b)."""
import pytest

from replication.papers.mae import mae, mae_scores

SELF, EXTERNAL, LAST = mae_scores.SCORE_RULES

# (reply, raw number and where it came from under each rule: self_judge, external_judge, last_number)
READS = [
    ("good. <score>8</score>", (8.0, "tag"), (8.0, "tag"), (8.0, "tag")),               # tagged integer
    ("<SCORE> 7.5 </Score>", (7.5, "tag"), (7.5, "tag"), (7.5, "tag")),                 # float; the tag's case
    ("<score>9/10</score>", (0.9, "tag"), (0.9, "tag"), (0.9, "tag")),                  # a fraction is its value
    ("<score>3/5</score> later 9", (0.6, "tag"), (0.6, "tag"), (0.6, "tag")),           # the tag wins
    ("<score>6.5 or 7</score>", (6.5, "tag"), (6.5, "tag"), (6.5, "tag")),              # float before integer
    ("<score>-3</score>", (3.0, "tag"), (3.0, "tag"), (3.0, "tag")),                    # digits only: no sign
    ("<score>none</score> <score>\n4\n</score>", (4.0, "tag"), (4.0, "tag"), (4.0, "tag")),  # first tag with a number
    ("<score>7/0</score>", (None, "none"), (7.0, "fallback"), (None, "none")),          # zero denominator: no tag value
    ("I give it 7", (None, "none"), (7.0, "fallback"), (7.0, "fallback")),              # untagged
    ("Step 2 gives 3, so 7", (None, "none"), (2.0, "fallback"), (7.0, "fallback")),     # first 1-10 vs last number
    ("<score>high</score> 12 of 10", (None, "none"), (10.0, "fallback"), (10.0, "fallback")),
    ("the answer is 12", (None, "none"), (None, "none"), (12.0, "fallback")),           # external: 1-10 only
    ("7.5 out of 3/4", (None, "none"), (7.0, "fallback"), (0.75, "fallback")),
    ("no numbers at all", (None, "none"), (None, "none"), (None, "none")),
    (None, (None, "none"), (None, "none"), (None, "none")),
]


@pytest.mark.parametrize("text, reads", [(t, rest) for t, *rest in READS])
def test_read_score_under_each_rule(text, reads):
    for rule, want in zip(mae_scores.SCORE_RULES, reads):
        raw, source = mae_scores.read_score(text, rule)
        assert (source, raw) == (want[1], pytest.approx(want[0]) if want[0] is not None else None), rule


# (reply, normalised score under self_judge, external_judge, last_number; None: the judgment gives no score)
SCORES = [
    ("<score>1</score>", 0.0, 0.0, 0.0), ("<score>10</score>", 1.0, 1.0, 1.0),
    ("<score>5.5</score>", 0.5, 0.5, 0.5), ("<score>4</score>", 1 / 3, 1 / 3, 1 / 3),
    ("<score>9/10</score>", 0.0, 0.9, 0.0),        # 0.9 normalised as 1-10 clips to 0; external keeps it
    ("<score>0.8</score>", 0.0, 0.8, 0.0),
    ("<score>25</score>", 1.0, 1.0, 1.0),          # out of range: clipped
    ("<score>0</score>", 0.0, 0.0, 0.0),
    ("<score>10.5</score>", 1.0, 1.0, 1.0),
    ("I give it 7", None, 2 / 3, 2 / 3),           # untagged
    ("the answer is 12", None, 0.0, 1.0),          # untagged, out of range
    ("nothing", None, 0.0, None),
]


@pytest.mark.parametrize("text, scores", [(t, rest) for t, *rest in SCORES])
def test_normalised_scores_under_each_rule(text, scores):
    for rule, want in zip(mae_scores.SCORE_RULES, scores):
        got = mae_scores.score(text, rule)
        assert got == (pytest.approx(want) if want is not None else None), rule
        assert mae_scores.parse_score(text, rule) == pytest.approx(0.5 if want is None else want), rule


def test_self_judge_is_the_default_and_rules_are_checked():
    assert mae_scores.parse_score("I give it 9") == 0.5 and mae_scores.read_score("I give it 9") == (None, "none")
    assert mae.MAEConfig().score_rule == SELF
    with pytest.raises(ValueError, match="rule"):
        mae_scores.read_score("<score>8</score>", "tags")
    with pytest.raises(ValueError, match="score_rule"):
        mae.MAEConfig(score_rule="last").validate()


def test_a_question_mean_skips_judgments_without_a_score():
    # the authors average the judgments of a question that gave a score; 0.5 when none did
    assert mae_scores.mean_score([1.0, None, 0.5]) == pytest.approx(0.75) and mae_scores.mean_score([None]) == 0.5
    assert mae.difficulty([1.0, None]) == pytest.approx(0.0) and mae.difficulty([None, None]) == pytest.approx(0.5)
    assert mae.difficulty([mae_scores.score(t, EXTERNAL) for t in ("<score>10</score>", "nothing")]) == pytest.approx(0.5)
