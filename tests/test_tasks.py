import re

import pytest

from replication.lm import tasks


def test_generator_is_deterministic_and_seeded():
    a = tasks.make_problems(20, seed=3, digits=2, steps=2, ops=("+", "-"))
    b = tasks.make_problems(20, seed=3, digits=2, steps=2, ops=("+", "-"))
    c = tasks.make_problems(20, seed=4, digits=2, steps=2, ops=("+", "-"))
    assert a == b
    assert [p.question for p in a] != [p.question for p in c]
    assert len({p.id for p in a}) == 20


@pytest.mark.parametrize("level", list(tasks.LEVELS))
def test_answers_follow_the_story(level):
    for p in tasks.make_level(level, 50, seed=1):
        value = int(re.search(r"has (\d+)", p.question).group(1))
        for verb, b in re.findall(r"(gets|gives away|becomes) (\d+)", p.question):
            value = value + int(b) if verb == "gets" else value - int(b) if verb == "gives away" else value * int(b)
        assert value == p.answer >= 0
        assert p.question.count("Then") == p.steps - 1


def test_difficulty_knobs():
    ps = tasks.make_problems(30, digits=2, steps=1)
    first = [int(re.search(r"has (\d+)", p.question).group(1)) for p in ps]
    assert all(10 <= x <= 99 for x in first)
    assert all("times" in p.question for p in tasks.make_problems(5, steps=1, ops=("*",)))


@pytest.mark.parametrize("kwargs, message", [
    ({"n": 0}, "n=0"), ({"n": -2}, "n=-2"), ({"n": 3, "digits": 0}, "digits=0"),
    ({"n": 3, "ops": ("/",)}, "ops="), ({"n": 3, "steps": 0}, "steps=0"),
])
def test_bad_knobs_name_the_parameter(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        tasks.make_problems(**kwargs)


@pytest.mark.parametrize("text, lenient, strict", [
    ("Mia has 7. The answer is 12.", 12, 12),
    ("<answer>12</answer>", 12, 12),
    ("<answer> -5 </answer> and then 7", -5, -5),
    ("The answer is -3", -3, -3),
    ("first <answer>4</answer> then <answer>9</answer>", 9, 9),
    ("Answer: 1,200 apples", 1200, 1200),
    ("She has 3 + 4 = 7 apples.", 7, None),
    ("<answer>12", 12, None),
    ("<answer>twelve</answer>", None, None),
    ("no number here", None, None),
    ("", None, None),
    ("The answer is 2.5.", 2.5, 2.5),
])
def test_extract_answer(text, lenient, strict):
    assert tasks.extract_answer(text) == lenient
    assert tasks.extract_answer(text, strict=True) == strict


def test_verifier_edges():
    assert tasks.verify("The answer is 12.", 12)
    assert tasks.verify("The answer is 12.0", 12)
    assert not tasks.verify("The answer is 13.", 12)
    assert not tasks.verify("", 12)
    assert not tasks.verify(None, 12)
    assert tasks.verify("so 12", 12) and not tasks.verify("so 12", 12, strict=True)
    assert tasks.verify("The answer is -4", -4)
    assert tasks.has_format("The answer is 3.") and not tasks.has_format("3")


def test_every_level_has_words_a_reader_knows():
    """The ledger's task column names a level in words (`2d-1step-add` reads 'two-digit sums'), one entry per level."""
    assert set(tasks.LEVEL_WORDS) == set(tasks.LEVELS)
    assert tasks.LEVEL_WORDS["2d-1step-add"] == "two-digit sums"
    assert not any(re.search(r"\d", words) for words in tasks.LEVEL_WORDS.values())
