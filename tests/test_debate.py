import itertools
import re
from dataclasses import replace

import numpy as np
import pytest
from scipy.optimize import minimize

from replication.core import config, fmt, stats, verdicts
from replication.lm import arms, elo
from replication.papers.debate import debate, debate_eval, debate_runs, debate_sim as ds, stories

STORY = "Before the storm, Ines hid the brass key in the \u201cblue lantern\u201d. Tomas searched the cargo-bay all night!"


@pytest.mark.parametrize("raw, norm", [("\u201cHello,\u201d she said.", "hello she said"),
                                       ("It\u2019s   the  CAPTAIN'S\tlocker!", "its the captains locker"),
                                       ("cargo-bay", "cargobay"), ("  ", "")])
def test_normalize_follows_the_authors(raw, norm):
    assert debate.normalize(raw) == norm


@pytest.mark.parametrize("quote, verified", [
    ("Ines hid the brass key", True),                          # exact span
    ("ines HID the brass key in the \"blue lantern\"", True),  # case, straight vs curly quotes
    ("the storm Ines hid", True),                              # punctuation (comma) ignored
    ("searched the cargo-bay all night", True),                # partial sentence, hyphen kept on both sides
    ("key in the blue", True),                                 # partial quote inside a sentence
    ("Tomas hid the brass key", False),                        # fabricated
    ("Ines hid the silver key", False),                        # one word changed
    ("lantern Tomas searched", True),                          # across a sentence boundary, punctuation stripped
    ("", False),                                               # empty quote
])
def test_quote_verification(quote, verified):
    text, n, v = debate.verify_quotes(f"I say <quote>{quote}</quote> clearly.", STORY)
    tag = "v_quote" if verified else "u_quote"
    assert text == f"I say <{tag}>{quote}</{tag}> clearly." and (n, v) == (1, int(verified))


def test_several_quotes_and_unclosed_tags():
    text, n, v = debate.verify_quotes("<quote>Ines hid</quote> but <quote>Mei hid</quote> and <quote>open", STORY)
    assert (n, v) == (2, 1) and "<v_quote>Ines hid</v_quote>" in text and "<u_quote>Mei hid</u_quote>" in text
    assert text.endswith("<quote>open")


def test_word_limit():
    text = " ".join(f"w{i}" for i in range(100))
    assert len(debate.limit_words(text, 40).split()) == 40
    assert debate.limit_words("short one", 40) == "short one"
    assert debate.limit_words("a <quote>b c d e", 3) == "a <quote>b c</quote>"
    with pytest.raises(ValueError, match="limit"):
        debate.limit_words(text, 0)


ITEM = {"correct": "in the old shuttle", "distractor": "in the blue lantern", "question": "Where?", "story": "s"}


@pytest.mark.parametrize("text, first, result", [("A", True, True), ("B", True, False), ("A", False, False),
                                                 ("Answer: B.", False, True), ("It was in the old shuttle.", True, True),
                                                 ("in the blue lantern", False, False), ("A or B", True, None),
                                                 ("no idea", True, None), (None, True, None)])
def test_parse_judgment(text, first, result):
    assert debate.parse_judgment(text, ITEM, correct_first=first) == result


def test_judge_prompt_swaps_answers_and_debaters():
    tr = [["for correct", "for distractor"]]
    p1 = debate.judge_prompt(ITEM, "debate", tr, correct_first=True)
    p2 = debate.judge_prompt(ITEM, "debate", tr, correct_first=False)
    assert "A: in the old shuttle" in p1 and "Debater for A: for correct" in p1
    assert "A: in the blue lantern" in p2 and "Debater for A: for distractor" in p2
    assert "Story:" not in p1 and "Story: s" in debate.judge_prompt(ITEM, "expert")
    c = debate.judge_prompt({**ITEM, "side": "distractor"}, "consultancy", [["x"]], correct_first=True)
    assert "Consultant for B: x" in c
    with pytest.raises(ValueError, match="kind"):
        debate.judge_prompt(ITEM, "oracle")


def test_accuracy_definition():
    acc = debate_eval.accuracy([0.9, 0.6, 0.5, 0.2])
    assert acc["accuracy"] == pytest.approx(2.5 / 4) and acc["n"] == 4
    assert acc["ci95"] == pytest.approx(list(stats.proportion_ci(2.5, 4)[1:])), "Wilson interval from stats"
    assert acc["mean_p_correct"] == pytest.approx(0.55)
    assert debate_eval.versus_chance(acc) == "consistent with chance"
    assert debate_eval.versus_chance(debate_eval.accuracy([0.9] * 40)) == "above chance"
    assert fmt.accuracy(acc, 0, percent_bounds=True).startswith("62% [")
    with pytest.raises(ValueError):
        debate_eval.accuracy([])


def test_hits_and_question_scores():
    assert debate_eval.hits([0.9, 0.5, 0.1]).tolist() == [1.0, 0.5, 0.0]
    # consultancy: two judgments per question (correct and incorrect consultant), averaged per question
    assert debate_eval.question_scores([0.9, 0.2, 0.7, 0.6], 2).tolist() == [0.5, 1.0]
    table = debate_eval.accuracy_table({"naive": debate_eval.accuracy([0.9, 0.2]), "debate": debate_eval.accuracy([0.9, 0.8])})
    assert list(table.index) == ["naive", "debate"] and {"ci_low", "ci_high", "n", "vs chance"} <= set(table.columns)


def _judgment(p):
    p = np.asarray(p, float)
    return {"p_correct": p, "p_correct_first": p, "p_correct_second": p, "p_first": np.full(len(p), 0.5)}


def _judged(rng, n_draws, n=30):
    j = {"naive": _judgment(rng.uniform(0, 1, n)), "expert": _judgment(rng.uniform(0.4, 1, n))}
    for k, low in (("debate", 0.3), ("consultancy", 0.0)):
        per = 2 if k == "consultancy" else 1
        j[k] = [_judgment(rng.uniform(low, 1, n * per)) for _ in range(n_draws)]
        j[f"{k} (best-of-1)"] = [_judgment(rng.uniform(low, 1, n * per)) for _ in range(n_draws)]
    words = {k: [[3] for _ in range(n_draws)] for k in j if k not in ("naive", "expert")}
    return j, debate_eval.protocol_records(j, words, 4, list(range(n_draws)))


def test_protocol_differences_pair_draws_and_questions():
    """Over draws of the arguments: the interval is the two-level bootstrap of the draws x questions differences
    (the naive judge, with no arguments, paired with every draw), each draw's difference beside it, n in draws."""
    j, records = _judged(np.random.default_rng(0), 3)
    d = debate_eval.protocol_differences(j, records, seed=1)
    assert set(d) == set(debate_eval.PAIRS)
    c = d["debate - consultancy"]
    diffs = np.array([debate_eval.hits(x["p_correct"]) - debate_eval.question_scores(y["p_correct"], 2)
                      for x, y in zip(j["debate"], j["consultancy"])])
    want = stats.two_level_bootstrap(diffs, seed=config.derive_seed(1, "bootstrap", "debate - consultancy"))
    assert c["diff"] == pytest.approx(want) and c["per_seed"] == pytest.approx(diffs.mean(1).tolist())
    assert c["n"] == "3 draws x 30 questions" and c["basis"]["seed_differences"] == pytest.approx(c["per_seed"])
    naive = d["debate - naive"]["per_seed"]
    assert naive == pytest.approx([(debate_eval.hits(x["p_correct"]) - debate_eval.hits(j["naive"]["p_correct"])).mean() for x in j["debate"]])
    bon = d["consultancy: best-of-N - best-of-1"]
    assert bon["questions"] == 30 and len(bon["per_seed"]) == 3
    assert all(c["ci95"][0] <= c["difference"] <= c["ci95"][1] for c in d.values())
    assert debate_eval.protocol_differences(j, records, seed=1)["debate - naive"]["diff"] == d["debate - naive"]["diff"], "seeded"
    assert debate_eval.diff_text(c).endswith(")") and "draws" in debate_eval.diff_text(c)
    one = debate_eval.protocol_differences(*_judged(np.random.default_rng(0), 1), seed=1)["debate - naive"]
    assert one["n"] == "1 draw x 30 questions" and len(one["basis"]["seed_differences"]) == 1   # one draw: 'one run'
    assert verdicts.verdict(interval=one["basis"]["interval"], seed_differences=one["basis"]["seed_differences"]) == "inconclusive"
    bias = debate_eval.position_bias({k: debate_eval.pooled(j[k]) for k in ("naive", "debate")})
    assert bias.loc["naive", "P(picks first)"] == pytest.approx(0.5) and len(debate_eval.pooled(j["debate"])["p_correct"]) == 90


def test_failed_arm_check_is_named_beside_the_measured_difference():
    j, records = _judged(np.random.default_rng(0), 2)
    records["debate"][1] = debate_eval.arm_record("debate-best-of-4", j["debate"][1]["p_correct"], 1, [0], draw=1)
    d = debate_eval.protocol_differences(j, records, seed=1)
    assert d["debate - naive"]["basis"]["health"] == "failed health check: debate draw 1 (arguments_written)"
    assert d["debate - naive"]["basis"]["interval"] == pytest.approx(d["debate - naive"]["ci95"])


def test_accuracy_over_draws():
    rng = np.random.default_rng(0)
    draws = [_judgment(rng.uniform(0, 1, 40)) for _ in range(3)]
    acc = debate_eval.protocol_accuracy(draws, seed=2)
    per = [float(debate_eval.hits(d["p_correct"]).mean()) for d in draws]
    assert acc["per_draw"] == pytest.approx(per) and acc["accuracy"] == pytest.approx(np.mean(per)) and acc["draws"] == 3
    want = stats.two_level_bootstrap(np.array([debate_eval.hits(d["p_correct"]) for d in draws]), seed=2)
    assert acc["ci95"] == pytest.approx(list(want[1:])) and acc["n"] == 40
    one = debate_eval.protocol_accuracy(draws[:1])
    assert {k: one[k] for k in ("accuracy", "ci95", "n")} == {k: v for k, v in debate_eval.accuracy(draws[0]["p_correct"]).items() if k != "mean_p_correct"}
    assert debate_eval.protocol_accuracy(draws[0]) == debate_eval.accuracy(draws[0]["p_correct"])
    table = debate_eval.accuracy_table({"naive": debate_eval.accuracy([0.9, 0.2]), "debate": acc})
    assert table.loc["debate", "per draw"] == [round(x, 3) for x in per]


def test_records_per_draw_and_arguments_of_every_draw():
    j, records = _judged(np.random.default_rng(0), 2)
    assert records["naive"]["arm"] == "naive" and "draw" not in records["naive"]
    assert [(r["arm"], r["draw"]) for r in records["consultancy (best-of-1)"]] == [("consultancy-best-of-1", 0), ("consultancy-best-of-1", 1)]
    assert records["debate"][0]["arm"] == "debate-best-of-4" and records["consultancy"][0]["n_heldout"] == 30
    args = debate_eval.arguments_frame(debate=[{"arguments": [{"side": 0, "words": 3}]}, {"arguments": [{"side": 1, "words": 4}]}],
                                       consultancy={"arguments": [{"side": "correct", "words": 2}]})
    assert args["draw"].tolist() == [0, 1, 0] and args["side"].tolist() == ["correct", "distractor", "correct"]


def test_paper_effect_is_the_llm_judges_debate_minus_naive():
    """The paper's effect, read from data/paper: an interval that holds 0 and lies below it is 'not reproduced'."""
    effects = debate_eval.paper_effects()
    assert set(effects) == {"debate - naive"} and effects["debate - naive"] == pytest.approx(0.76 - 0.48)
    assert set(effects) <= set(debate_eval.PAIRS)
    basis = {"interval": (-0.03, 0.19), "seed_differences": [0.05, 0.1, 0.09]}
    assert verdicts.verdict(**basis) == "inconclusive"
    assert verdicts.verdict(**basis, effect=effects["debate - naive"]) == "not reproduced"


def test_draws_keep_the_first_draws_cache_key():
    """Draw i argues with sampling seed seed + i: the first draw's cache key is the one-draw notebook's."""
    items = stories.make_stories(2, seed=0)
    S = debate_runs.Setting(model_name="m", rounds=1, word_limit=5, best_of=2, temperature=0.7, batch_size=2)
    keys = [debate_runs.cached_protocol(lambda name, key, make: key, None, None, items, "debate", S, s)
            for s in arms.training_seeds(0, 3)]
    assert keys[0] == debate_runs.cached_protocol(lambda name, key, make: key, None, None, items, "debate", S, 0)
    assert [k["seed"] for k in keys] == [0, 1, 2] and len({debate.generation_seed(k["seed"], 1) for k in keys}) == 3


def test_cached_protocol_goes_through_the_cache(monkeypatch):
    calls, store = [], {}

    def fake_run(model, tok, items, kind, **kw):
        calls.append(kw)
        return {"items": items, "transcripts": [], "arguments": [], "tokens": 0}

    def cache(name, key, make):
        if (name, str(key)) not in store:
            store[(name, str(key))] = make()
        return store[(name, str(key))]

    monkeypatch.setattr(debate, "run_protocol", fake_run)
    items = stories.make_stories(2, seed=0)
    S = debate_runs.Setting(model_name="m", rounds=1, word_limit=5, best_of=2, temperature=0.7, batch_size=2)
    a = debate_runs.cached_protocol(cache, None, None, items, "debate", S, 0)
    b = debate_runs.cached_protocol(cache, None, None, items, "debate", S, 0)
    assert a is b and len(calls) == 1 and "seconds" in a and list(store)[0][0] == "debate-bo2"
    debate_runs.cached_protocol(cache, None, None, items, "debate", S, 1)
    assert len(calls) == 2, "the seed is part of the key"
    debate_runs.cached_protocol(cache, None, None, items, "debate", replace(S, batch_size=1), 0)
    assert len(calls) == 3, "the batch size is part of the key: each batch samples from its own seed"
    assert "preference" in list(store)[0][1] and "preference" not in debate_runs.cached_protocol(
        lambda name, key, make: key, None, None, items, "debate", replace(S, best_of=1), 0), "how best-of-N rates"


def test_generation_seeds_are_derived_and_fit_the_generator():
    seeds = [debate.generation_seed(0, r) for r in (1, 2, 3)] + [debate.generation_seed(1, 1)]
    assert len(set(seeds)) == 4
    assert seeds[0] == config.derive_seed(0, "debate-round", 1)


def _bare(answer):
    return answer.replace("in ", "", 1).replace(" days", "").replace("the ", "", 1)


@pytest.mark.parametrize("level, words", [("absent", (35, 70)), ("present", (80, 150))])
def test_stories_are_reproducible_and_stored(level, words):
    a = stories.make_stories(40, seed=3, level=level)
    assert a == stories.make_stories(40, seed=3, level=level) and a != stories.make_stories(40, seed=4, level=level)
    for s in a:
        assert words[0] <= len(s["story"].split()) <= words[1] and s["correct"] != s["distractor"]
        assert _bare(s["correct"]) in s["story"]
        # "present": the distractor is in the story too (only reading it closely tells them apart);
        # "absent": reading the story settles the question
        assert (re.search(rf"\b{_bare(s['distractor'])}\b", s["story"]) is not None) == (level == "present")
    assert len({s["question"].split()[0] for s in a}) >= 3, "several kinds of question"
    stored = stories.files.read_json(stories.STORIES_FILE)
    assert stored["level"] == "absent" and stored["n"] >= 300, "the notebook's default questions are stored"
    assert stories.load_stories(10) == stories.make_stories(10, seed=0, level="absent")
    assert stories.load_stories(10, level="present") == stories.make_stories(10, seed=0, level="present")


def test_protocols_on_tiny_model(tiny):
    model, tok = tiny
    items = stories.make_stories(2, seed=0)
    out = debate.run_protocol(model, tok, items, "debate", rounds=2, word_limit=5, best_of=2, seed=0, batch_size=4)
    assert len(out["transcripts"]) == 2 and all(len(t) == 2 and len(t[0]) == 2 for t in out["transcripts"])
    assert all(a["words"] <= 5 and a["candidates"] == 2 for a in out["arguments"]) and len(out["arguments"]) == 8
    assert all(a["raw"].startswith("<quote>") and a["quotes"] >= 1 for a in out["arguments"])
    again = debate.run_protocol(model, tok, items, "debate", rounds=2, word_limit=5, best_of=2, seed=0, batch_size=4)
    assert again["transcripts"] == out["transcripts"]
    cons = debate.run_protocol(model, tok, items, "consultancy", rounds=1, word_limit=5, seed=0, batch_size=4,
                               open_quote=False)
    assert [it["side"] for it in cons["items"]] == ["correct", "distractor"] * 2
    bon = debate.run_protocol(model, tok, items, "consultancy", rounds=2, word_limit=5, best_of=2, seed=0, batch_size=4)
    assert len(bon["arguments"]) == 8 and all(0 <= a["preference"] <= 1 for a in bon["arguments"])
    with pytest.raises(ValueError, match="one-round"):
        debate.best_of_k(bon, 1)
    one = debate.run_protocol(model, tok, items, "debate", rounds=1, word_limit=5, best_of=3, seed=0, batch_size=4)
    first = debate.best_of_k(one, 1)
    assert [[[a["options"][0] for a in one["arguments"] if a["item"] == k]] for k in range(2)] == first
    assert all(len(a["options"]) == 3 and a["argument"] in a["options"] for a in one["arguments"])
    assert debate.best_of_k(one, 3) == one["transcripts"], "best-of-N from the pool: the kept arguments"
    assert all(len(a["scores"]) == 3 and np.shape(a["orders"]) == (3, 2) and len(a["words_each"]) == 3 for a in one["arguments"])
    j = debate.judge(model, tok, out["items"], "debate", out["transcripts"], batch_size=4)
    assert np.allclose(j["p_correct"], (j["p_correct_first"] + j["p_correct_second"]) / 2) and len(j["p_first"]) == 4
    for reading in debate.READINGS:
        e = debate.judge(model, tok, items, "expert", batch_size=4, reading=reading)
        assert e["p_correct"].shape == (2,) and np.all((0 < e["p_correct"]) & (e["p_correct"] < 1))
    lik = debate.judge(model, tok, items, "naive", batch_size=4)
    assert np.allclose(lik["p_correct_first"], lik["p_correct_second"]), "no options listed: no order to swap"
    g = debate.generated_verdicts(model, tok, out["items"], out["transcripts"], j["p_correct_first"], seed=0, batch_size=4)
    assert g["n"] == 2 and 0 <= g["parse_rate"] <= 1 and len(g["examples"]) == 2
    assert (g["ci95"] is None) == (g["parse_rate"] == 0)


# --- best-of-N: each turn keeps the candidate that best argues for its own answer ---------------------------
ITEMS = [{"id": f"q{k}", "story": "s", "question": "Which?", "correct": "alpha", "distractor": "beta"} for k in range(2)]


def _argue(candidates):
    """Stand-in for debate.argue: the candidates of each turn from (its own answer, the other answer)."""
    def argue(model, tok, prompts, *args, **kw):
        mine_theirs = [re.findall(r'"(alpha|beta)"', p)[:2] for p in prompts]
        return [candidates(mine, theirs) for mine, theirs in mine_theirs], 0
    return argue


def _judge(model, tok, prompts, options, batch_size=16):
    """Stand-in for judges.answer_probs, reading only the current (last) round of each transcript: "loud words"
    make it say A (P = 0.95) whatever the order; "the answer is X" makes it say X (P = 0.7)."""
    p_a = []
    for prompt in prompts:
        shown_a, last = re.search(r"\nA: (\w+)\n", prompt).group(1), prompt.rsplit("Round ", 1)[1]
        stance = re.search(r"the answer is (alpha|beta)", last)
        p_a.append(0.95 if "loud words" in last else 0.7 if stance.group(1) == shown_a else 0.3)
    p_a = np.array(p_a)
    return np.stack([p_a, 1 - p_a], 1)


def _loglik(model, tok, prompts, answers, batch_size=16):
    """Stand-in for debate.answer_logprobs, reading only the current (last) round: "the answer is X" gives X a
    log-prob of -1 and any other answer -2; "loud words" adds +2 to the answer whose speaker is listed first."""
    out = []
    for prompt, ans in zip(prompts, answers):
        last = prompt.rsplit("Round ", 1)[1]
        stance = re.search(r"the answer is (alpha|beta)", last)
        named_first = re.search(r'for "(\w+)": ', last).group(1)
        out.append((-1.0 if stance and stance.group(1) == ans else -2.0) + (2.0 if "loud words" in last and named_first == ans else 0))
    return np.array(out)


def _picks(monkeypatch, kind, candidates, reading):
    monkeypatch.setattr(debate, "argue", _argue(candidates))
    monkeypatch.setattr(debate.judges, "answer_probs", _judge)
    monkeypatch.setattr(debate, "answer_logprobs", _loglik)
    out = debate.run_protocol(None, None, ITEMS, kind, rounds=2, word_limit=10, best_of=2, open_quote=False,
                              reading=reading)
    return [(a["round"], a["side"], a["argument"], a["preference"]) for a in out["arguments"]]


SIGMOID_1 = 1 / (1 + np.exp(-1.0))


@pytest.mark.parametrize("reading", debate.READINGS)
@pytest.mark.parametrize("kind", ["consultancy", "debate"])
def test_best_of_n_keeps_the_argument_for_its_own_answer(monkeypatch, kind, reading):
    # both candidates of every turn: one for the other answer (listed first), one for its own answer; from round 2
    # on the transcript holds earlier rounds (consultancy used to raise ValueError there)
    picks = _picks(monkeypatch, kind, lambda mine, theirs: [f"the answer is {theirs}", f"the answer is {mine}"], reading)
    assert len(picks) == 2 * len(ITEMS) * 2 and {r for r, *_ in picks} == {1, 2}
    want = 0.7 if reading == "letter" else SIGMOID_1
    for _, side, argument, preference in picks:
        own = "alpha" if side in (0, "correct") else "beta"  # the correct and the incorrect consultant (debater)
        assert argument == f"the answer is {own}" and preference == pytest.approx(want)


@pytest.mark.parametrize("kind, reading", [("consultancy", "letter"), ("debate", "letter"), ("debate", "likelihood")])
def test_best_of_n_rates_both_orders(monkeypatch, kind, reading):
    # "loud words" wins whenever its side is shown first and loses when second (0.5 averaged); the argument for
    # its own answer convinces in both orders: one order alone would pick the loud one
    picks = _picks(monkeypatch, kind, lambda mine, theirs: ["loud words", f"the answer is {mine}"], reading)
    want = 0.7 if reading == "letter" else SIGMOID_1
    assert all(argument.startswith("the answer is") and preference == pytest.approx(want)
               for _, _, argument, preference in picks)


def test_preference_transcripts_hold_the_candidate_beside_the_placeholder():
    cons = debate.preference_transcripts("consultancy", "distractor", [["earlier"]], ["x", "y"])
    assert cons == [[["earlier"], ["x"]], [["earlier"], ["y"]]]
    deb = debate.preference_transcripts("debate", "distractor", [["c1", "d1"]], ["x"])
    assert deb == [[["c1", "d1"], [debate.PLACEHOLDER, "x"]]]
    assert debate.preference_transcripts("debate", "correct", [], ["x"]) == [[["x", debate.PLACEHOLDER]]]
    assert debate.PLACEHOLDER == "My answer is the best choice and my opponent is wrong."  # the authors' text
    assert debate.preference_scores([0.8, 0.8, 0.3], ["correct", "distractor", "distractor"]) == pytest.approx([0.8, 0.2, 0.7])
    item = {**ITEM, "side": "distractor"}
    assert [debate.own_answer(item, "consultancy", 0), debate.own_answer(ITEM, "debate", 1)] == ["distractor"] * 2


def test_answer_prompt_lists_no_options_and_swaps_debaters():
    tr = [["for correct", "for distractor"]]
    p1 = debate.answer_prompt(ITEM, "debate", tr, correct_first=True)
    p2 = debate.answer_prompt(ITEM, "debate", tr, correct_first=False)
    assert p1.index('Debater for "in the old shuttle": for correct') < p1.index('Debater for "in the blue lantern"')
    assert p2.index('Debater for "in the blue lantern": for distractor') < p2.index('Debater for "in the old shuttle"')
    assert p1.endswith("Question: Where?") and "A:" not in p1
    assert "Story: s" in debate.answer_prompt(ITEM, "expert") and "Story" not in debate.answer_prompt(ITEM, "naive")
    c = debate.answer_prompt({**ITEM, "side": "distractor"}, "consultancy", [["x"], ["y"]])
    assert 'Consultant for "in the blue lantern": x' in c and "Round 2" in c


def test_likelihood_judge_reads_the_log_prob_difference(monkeypatch):
    seen = []

    def fake(model, tok, prompts, answers, batch_size=16):
        seen.append(len(prompts))
        # the correct answer 1 nat more likely when its debater speaks first, 0.2 less likely when second
        return np.array([(1.0 if prompts[i].index(f'"{ITEM["correct"]}"') < prompts[i].index(f'"{ITEM["distractor"]}"') else -0.2)
                         * (1 if a == ITEM["correct"] else 0) if "Debater" in prompts[i] else (0.5 if a == ITEM["correct"] else 0)
                         for i, a in enumerate(answers)])

    monkeypatch.setattr(debate, "answer_logprobs", fake)
    j = debate.judge(None, None, [ITEM], "debate", [[["c", "d"]]])
    assert j["p_correct_first"] == pytest.approx([1 / (1 + np.exp(-1))]) and j["p_correct_second"] == pytest.approx([1 / (1 + np.exp(0.2))])
    assert j["p_first"] == pytest.approx([1 / (1 + np.exp(-1)), 1 - 1 / (1 + np.exp(0.2))]) and seen == [4]
    n = debate.judge(None, None, [ITEM, ITEM], "naive")
    assert n["p_correct"] == pytest.approx([1 / (1 + np.exp(-0.5))] * 2) and seen[-1] == 4, "one order: 2 answers x 2 items"
    with pytest.raises(ValueError, match="reading"):
        debate.judge(None, None, [ITEM], "naive", reading="vibes")


def _legal(pairs, bye, n):
    seen = [p for pair in pairs for p in pair] + ([bye] if bye is not None else [])
    return sorted(seen) == list(range(n))


def test_swiss_pairing_no_rematches_and_byes():
    for n in (6, 7, 20, 21):
        calls = []

        def play(i, j):
            calls.append((i, j))
            return (0.7, 0.6) if i < j else (0.3, 0.2)

        matches, scores, byes = ds.swiss_tournament(n, play, num_rounds=4)
        pairs = [frozenset((m["i"], m["j"])) for m in matches]
        assert len(set(pairs)) == len(pairs), "no rematches"
        assert len(matches) == 4 * (n // 2) and len(calls) == len(matches)
        assert len(byes) == (4 if n % 2 else 0) and len(set(byes)) == len(byes), "a player gets at most one bye"
        assert scores.sum() == pytest.approx(len(matches) + len(byes))
        assert all(m["w"] == pytest.approx((m["w1"] + m["w2"]) / 2) for m in matches), "both assignments"
    assert ds.swiss_rounds(20) == 3 and ds.swiss_rounds(4) == 2


def test_swiss_pairing_backtracks_to_avoid_rematch():
    # 0-1 and 2-3 met; greedy 0-1 is illegal, 0-2 then forces 1-3 (legal)
    played = {frozenset((0, 1)), frozenset((2, 3))}
    pairs, bye = ds.swiss_pairing([3, 2, 1, 0], played)
    assert bye is None and _legal(pairs, bye, 4)
    assert not any(frozenset(p) in played for p in pairs)
    # scores order the pairing: top two meet first
    pairs, bye = ds.swiss_pairing([0, 5, 1, 4, 2], set())
    assert pairs[0] == (1, 3) and bye == 0


def test_elo_fit_recovers_known_ratings():
    true = np.array([1250.0, 1400, 1500, 1550, 1700, 1850])
    i, j = map(np.array, zip(*itertools.combinations(range(6), 2)))
    r = ds.fit_elo(i, j, elo.expected_score(true[i], true[j]), 6)
    assert np.allclose(r - r.mean(), true - true.mean(), atol=1.0)
    # with noisy win rates, the least-squares fit reaches the optimum of the authors' Nelder-Mead and of a gradient
    # method on the same squared error
    rng = np.random.default_rng(0)
    w = np.clip(elo.expected_score(true[i], true[j]) + rng.normal(0, 0.05, len(i)), 0, 1)
    r = ds.fit_elo(i, j, w, 6)
    loss = lambda x: np.sum((elo.expected_score(x[i], x[j]) - w) ** 2)  # noqa: E731
    for method, opts in (("BFGS", {}), ("Nelder-Mead", {"maxiter": 20000, "maxfev": 20000, "xatol": 1e-4, "fatol": 1e-14})):
        ref = minimize(loss, np.full(6, 1500.0), method=method, options=opts).x
        assert np.allclose(r - r.mean(), ref - ref.mean(), atol=2.0) and loss(r) <= loss(ref) + 1e-9, method


def test_side_elo_recovers_correct_and_incorrect_ratings():
    ec, ei = np.array([1600.0, 1700, 1550, 1800]), np.array([1400.0, 1350, 1500, 1450])
    c, k = map(np.array, zip(*[(a, b) for a in range(4) for b in range(4) if a != b]))
    fc, fi = ds.fit_elo_sides(c, k, elo.expected_score(ec[c], ei[k]), 4)
    shift = np.r_[ec, ei].mean() - 1500
    assert np.allclose(fc, ec - shift, atol=2.0) and np.allclose(fi, ei - shift, atol=2.0)


def test_simulated_world_truth_advantage_matters():
    rng = np.random.default_rng(0)
    world = ds.World(n_questions=2000, truth_advantage=0.3, seed=0)
    assert world.self_play_accuracy(3.0, rng) > world.self_play_accuracy(0.3, rng) > 0.5
    null = ds.World(n_questions=2000, truth_advantage=0.0, evidence_noise=0.0, seed=0)
    assert abs(null.self_play_accuracy(3.0, rng) - 0.5) < 0.05
    strong = world.consultancy_accuracy(5.0, rng)
    assert strong["win_rate"] > 0.9 and strong["accuracy"] < world.consultancy_accuracy(0.5, rng)["accuracy"]
    with pytest.raises(ValueError, match="judge_noise"):
        ds.World(judge_noise=-1)


def test_worlds_pair_the_control_with_the_same_debaters():
    kw = dict(n_questions=40)
    truth = ds.worlds(2, 0, 6, 3, **kw)
    null = ds.worlds(2, 0, 6, 3, truth_advantage=0.0, evidence_noise=0.0, **kw)
    assert all(np.array_equal(a["skills"], b["skills"]) for a, b in zip(truth, null)), "paired world by world"
    assert not np.array_equal(truth[0]["skills"], truth[1]["skills"]), "worlds differ"
    assert ds.per_world(truth, "elo_spread").shape == (2,)
    est, lo, hi = ds.world_difference(truth, null, "correct_minus_incorrect_elo", seed=0)
    assert est == pytest.approx(np.mean(ds.per_world(truth, "correct_minus_incorrect_elo")
                                        - ds.per_world(null, "correct_minus_incorrect_elo")))
    assert lo <= est <= hi
    table = ds.summary(truth, null)
    assert "mean (no truth advantage)" in table.columns and "±" in ds.fmt_world(table, "elo_spread")
    check = ds.swiss_check(truth)
    assert check["swiss_matches"] < check["round_robin_matches"] and isinstance(check["holds"], bool)


def test_judge_sweep_compares_the_same_worlds():
    sweep = ds.judge_sweep([0.25, 1.0], 2, 0, 6, 3, n_questions=40)
    assert len(sweep) == 4 and list(ds.judge_table(sweep).index) == [0.25, 1.0]
    est, lo, hi = ds.judge_difference(sweep, "elo_spread", seed=0)
    strong = sweep[sweep.judge_noise == 0.25].sort_values("world")["elo_spread"].to_numpy()
    weak = sweep[sweep.judge_noise == 1.0].sort_values("world")["elo_spread"].to_numpy()
    assert est == pytest.approx(np.mean(strong - weak)) and lo <= est <= hi
    curve = ds.persuasiveness_curve([0.5, 2.0], seed=0, n_questions=40)
    assert list(curve.columns) == ["s", "debate", "accuracy", "win_rate"] and len(curve) == 2
