"""Notebook 04's section (d), debate on hard stories: the level reaching the judge's prompt, the debaters' strengths
and their rule, and the whole study of one level over five strengths and two draws on a tiny model (the tournament's
cells are the judge on the kept arguments; the naive and expert verdicts are cached)."""
from dataclasses import replace
import numpy as np
import pytest

from replication.run import settings  # noqa: F401  (registers the notebooks' parameter classes)
from replication.core import config, params
from replication.papers.debate import crossplay, debate, debate_eval, debate_runs, hard_stories, stories

STEM = "04_debate_judge_accuracy"


def test_the_hard_level_puts_the_distractor_in_the_story_the_expert_judge_reads():
    for level, inside in (("present", True), ("absent", False)):
        items = stories.load_stories(20, seed=0, level=level)
        for it in items:
            prompt = debate.judge_prompt(it, "expert")
            assert it["story"] in prompt and (it["distractor"].lower() in it["story"].lower()) == inside
            assert it["story"] not in debate.judge_prompt(it, "naive")


def test_the_defaults_and_the_rule_of_the_strengths():
    cell = params.cell_values(config.NOTEBOOKS / f"{STEM}.ipynb")
    built = params.build(STEM, cell)
    assert built.hard_level == "present" != built.level and built.hard_strengths == [1, 2, 4, 6, 8]
    assert params.build(STEM, {**cell, "hard_level": None}).hard_level is None   # the section can be switched off
    for bad in ([2, 4], [1], [1, 4, 2], [1, 2, 2], [1, 2.5]):
        with pytest.raises(ValueError, match="hard_strengths"):
            params.build(STEM, {**cell, "hard_strengths": bad})
    with pytest.raises(ValueError, match="hard_level='absent' is not allowed"):
        params.build(STEM, {**cell, "hard_level": "absent"})


def test_the_study_of_one_level_over_five_strengths_and_two_draws(tiny):
    model, tok = tiny
    items, store, calls = stories.make_stories(4, seed=1, level="present"), {}, []

    def cache(name, key, make):
        if (name, str(key)) not in store:
            calls.append(name)
            store[(name, str(key))] = make()
        return store[(name, str(key))]

    setting = debate_runs.Setting(model_name="tiny", word_limit=5, best_of=1, temperature=0.7, batch_size=8,
                             reading="likelihood")
    ks = [1, 2, 3, 4, 6]
    out = hard_stories.study(cache, model, tok, items, ks, [0, 1], seed=0, setting=setting)
    assert out["ks"] == ks and sorted(set(calls)) == ["crossplay", "debate-bo6", "judged-expert", "judged-naive"]
    table = out["elo_table"]
    assert table.groupby("draw")["N"].apply(list).tolist() == [ks, ks] and "consultancy accuracy" not in table
    assert np.isfinite(table["aggregate Elo"]).all()
    pool = [v for (n, _), v in store.items() if n == "debate-bo6"][0]          # draw 0's pool (one piece)
    kept = debate.judge(model, tok, items, "debate", debate.best_of_k(pool, 6), batch_size=8)
    assert out["judgments"]["debate"][0]["p_correct"] == pytest.approx(kept["p_correct"], abs=1e-5)
    naive = debate.judge(model, tok, items, "naive", batch_size=8)
    assert out["judgments"]["naive"]["p_correct"] == pytest.approx(naive["p_correct"], abs=1e-6)
    assert set(out["differences"]) == set(hard_stories.PAIRS) and out["differences"]["debate - naive"]["seeds"] == 2
    assert set(out["tournament"]) == set(hard_stories.TOURNAMENT)
    assert out["tournament"]["accuracy_slope"]["n"] == "2 draws x 4 questions"
    made = len(calls)
    again = hard_stories.study(cache, model, tok, items, ks, [0, 1], seed=0, setting=setting)
    assert len(calls) == made, "everything read back from the cache"
    assert again["expert_minus_naive"] == out["expert_minus_naive"]
    with pytest.raises(ValueError, match="hard_strengths"):
        hard_stories.study(cache, model, tok, items, [2, 4], [0], seed=0, setting=setting)
    assert crossplay.debater_table([], None, ks).empty


def test_the_naive_and_expert_verdicts_are_cached_as_judged(tiny):
    model, tok = tiny
    items, store = stories.make_stories(3, seed=2, level="absent"), {}

    def cache(name, key, make):
        return store.setdefault((name, str(key)), make())

    S = debate_runs.Setting(model_name="tiny", word_limit=5, best_of=1, temperature=0.7, batch_size=4,
                       reading="likelihood")
    for kind in ("naive", "expert"):
        direct = debate.judge(model, tok, items, kind, batch_size=4)
        cached = debate_runs.cached_judge(cache, model, tok, items, kind, S)
        assert set(cached) == set(direct) and all(np.array_equal(cached[k], direct[k]) for k in direct)
    assert len(store) == 2
    debate_runs.cached_judge(cache, model, tok, items, "naive", replace(S, reading="letter"))
    assert len(store) == 3, "another reading, another entry"
    with pytest.raises(ValueError, match="kind='debate' is not allowed"):
        debate_runs.cached_judge(cache, model, tok, items, "debate", S)


def test_the_expert_check_grid_judges_each_level_reading_and_kind_once_through_the_cache(tiny):
    """debate_eval.expert_check: one cached judging per (level, reading, kind), the verdicts debate.judge's; a
    second grid reads them all back and judges nothing."""
    model, tok = tiny
    levels = {lv: stories.make_stories(3, seed=2, level=lv) for lv in ("absent", "present")}
    store, made = {}, []

    def cache(name, key, make):
        if (name, str(key)) not in store:
            made.append(name)
            store[(name, str(key))] = make()
        return store[(name, str(key))]

    S = debate_runs.Setting(model_name="tiny", word_limit=5, best_of=2, temperature=0.7, batch_size=4)
    table, out = debate_eval.expert_check(cache, model, tok, levels, S, ("likelihood", "letter"), seed=0)
    assert len(made) == 8 and list(table.index) == [(lv, rd) for lv in levels for rd in ("likelihood", "letter")]
    direct = debate.judge(model, tok, levels["present"], "expert", batch_size=4, reading="letter")
    assert np.array_equal(out["present", "letter", "expert"]["p_correct"], direct["p_correct"])
    again, _ = debate_eval.expert_check(cache, model, tok, levels, S, ("likelihood", "letter"), seed=0)
    assert len(made) == 8 and again.equals(table)
