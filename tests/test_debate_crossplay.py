"""The real cross-play tournament of notebook 04 on stored arguments: best-of-k picks from one pool, every debater
pair judged once per distinct pair of arguments in both orders, the round robin and the authors' Elo fits, the
claims' statistics over draws then questions (synthetic preferences and a tiny model)."""
import re
from dataclasses import asdict, replace

import numpy as np
import pytest

from replication.run import settings  # noqa: F401  (registers the notebooks' parameter classes)
from replication.core import config, params, stats, verdicts
from replication.lm import elo
from replication.papers.debate import crossplay, debate, debate_runs, debate_sim, stories

STEM = "04_debate_judge_accuracy"
SETTING = debate_runs.Setting(model_name="m", word_limit=5, best_of=4, temperature=0.7, batch_size=8)


def test_ladder_and_its_parameter_check():
    assert crossplay.ladder(8) == [1, 2, 4, 8] and crossplay.ladder(2) == [1, 2] and crossplay.ladder(16)[-1] == 16
    for bad in (1, 3, 6):
        with pytest.raises(ValueError, match=f"best_of={bad}"):
            crossplay.ladder(bad)
    cell = params.cell_values(config.NOTEBOOKS / f"{STEM}.ipynb")
    assert params.build(STEM, cell).best_of == cell["best_of"]
    with pytest.raises(ValueError, match="best_of=6 is not allowed: .* power of two"):
        params.build(STEM, {**cell, "best_of": 6})
    with pytest.raises(ValueError, match="rounds=2 is not allowed"):
        params.build(STEM, {**cell, "rounds": 2})


def _turn(item, side, scores, name=None):
    """A stored argument of a one-round pool: candidate texts '<side><item>-<i>', their scores and P(correct) per order."""
    tag = name or ("c" if side in (0, "correct") else "d")
    return {"item": item, "round": 1, "side": side, "candidates": len(scores), "scores": list(scores),
            "options": [f"{tag}{item}-{i}" for i in range(len(scores))], "words_each": [3] * len(scores),
            "orders": [[s, s] for s in scores]}


ITEMS = [{"id": f"q{k}", "story": "s", "question": "Which?", "correct": "alpha", "distractor": "beta"} for k in range(3)]
SCORES = {(0, 0): [0.1, 0.9, 0.2, 0.3], (0, 1): [0.5, 0.4, 0.8, 0.6],   # (item, side) -> candidate scores
          (1, 0): [0.7, 0.2, 0.3, 0.9], (1, 1): [0.3, 0.3, 0.3, 0.3],
          (2, 0): [0.2, 0.1, 0.6, 0.6], (2, 1): [0.1, 0.2, 0.3, 0.4]}


def _pool():
    args = [_turn(q, s, SCORES[q, s]) for q in range(3) for s in (0, 1)]
    return {"items": ITEMS, "transcripts": [[[None, None]] for _ in ITEMS], "arguments": args, "tokens": 0}


def test_best_of_k_picks_the_preferred_of_the_first_k():
    pool = _pool()
    idx = crossplay.picks(pool, [1, 2, 4])
    # bo-1: the first candidate; bo-2, bo-4: the highest score among the first k (ties: the first of equals)
    assert idx[0, 0].tolist() == [0, 1, 1] and idx[0, 1].tolist() == [0, 0, 2]
    assert idx[1, 0].tolist() == [0, 0, 3] and idx[1, 1].tolist() == [0, 0, 0] and idx[2, 0].tolist() == [0, 0, 2]
    assert debate.best_of_k(pool, 4)[0] == [["c0-1", "d0-2"]] and crossplay.picked_words(pool, 2) == [3] * 6
    with pytest.raises(ValueError, match="k=8 is not allowed"):
        crossplay.picks(pool, [8])


def _position_biased_judge(seen):
    """Stand-in for debate.answer_logprobs on debate transcripts: the correct answer is 1 nat more likely for each
    of its debater's candidate index (c<q>-<i>: i) minus the distractor's (d<q>-<j>: j), plus 0.5 nat to the answer
    whose debater speaks first (a position bias that both orders cancel)."""
    def fake(model, tok, prompts, answers, batch_size=16):
        out = []
        for prompt, ans in zip(prompts, answers):
            seen.append(prompt)
            i, j = (int(re.search(rf"{t}\d+-(\d+)", prompt).group(1)) for t in ("c", "d"))
            correct_first = prompt.index('"alpha"') < prompt.index('"beta"')
            lead = 0.5 if (ans == "alpha") == correct_first else 0.0
            out.append((i - j if ans == "alpha" else 0.0) + lead)
        return np.array(out)
    return fake


def test_cross_play_judges_each_distinct_pair_once_in_both_orders(monkeypatch):
    seen, store = [], {}
    monkeypatch.setattr(debate, "answer_logprobs", _position_biased_judge(seen))

    def cache(name, key, make):
        if (name, str(key)) not in store:
            store[(name, str(key))] = make()
        return store[(name, str(key))]

    pool, ks = _pool(), [1, 2, 4]
    play = crossplay.cross_play(cache, None, None, pool, ks, SETTING, chunk=2)
    idx = crossplay.picks(pool, ks)
    distinct = sum(len({(int(idx[q, 0, a]), int(idx[q, 1, b])) for a in range(3) for b in range(3)}) for q in range(3))
    assert play["pairs_judged"] == distinct < 27 and len(seen) == distinct * 2 * 2, "each distinct pair: 2 orders x 2 answers"
    assert len(store) == 2 and {n for n, _ in store} == {"crossplay"}, "one cached piece per chunk of stories"
    sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    for q in range(3):
        for a in range(3):
            for b in range(3):
                gap = idx[q, 0, a] - idx[q, 1, b]   # debater a's pick for the correct side, b's for the distractor
                assert play["first"][q, a, b] == pytest.approx(sig(gap + 0.5)) and play["second"][q, a, b] == pytest.approx(sig(gap - 0.5))
                c = crossplay.cell(play, a, b)
                assert c["p_correct"][q] == pytest.approx((sig(gap + 0.5) + sig(gap - 0.5)) / 2)
    again = crossplay.cross_play(cache, None, None, pool, ks, SETTING, chunk=2)
    assert len(seen) == distinct * 4 and np.array_equal(again["first"], play["first"]), "the cached verdicts, no judging"


def test_consultants_read_the_ratings_of_their_picks():
    args = [_turn(q, side, [0.2 + 0.1 * i + 0.05 * q for i in range(4)], name=f"{side[0]}")
            for q in range(2) for side in ("correct", "distractor")]
    for k, a in enumerate(args):
        a["item"] = k
        a["orders"] = [[s, s + 0.01] for s in a["scores"]]
    cons = crossplay.consultants({"items": [{}] * 4, "arguments": args}, [1, 4])
    assert cons["first"].shape == (4, 2) and cons["first"][:, 0] == pytest.approx([a["scores"][0] for a in args])
    assert cons["second"][:, 1] == pytest.approx([a["scores"][3] + 0.01 for a in args])
    assert crossplay.consultant(cons, 1)["p_correct"] == pytest.approx([a["scores"][3] + 0.005 for a in args])


def test_side_elo_of_the_round_robin_recovers_known_ratings():
    ec, ei = np.array([1500.0, 1560, 1640, 1750]), np.array([1480.0, 1490, 1510, 1520])
    w = elo.expected_score(ec[:, None], ei[None, :])          # w[a, b]: a for the correct answer beats b
    s = crossplay.elo_stats(w[None])
    shift = np.r_[ec, ei].mean() - 1500
    assert np.allclose(s["correct"], ec - shift, atol=0.5) and np.allclose(s["incorrect"], ei - shift, atol=0.5)
    gap = ec - ei
    assert s["gap_mean"] == pytest.approx(gap.mean(), abs=1) and s["gap_slope"] == pytest.approx(crossplay.slope(s["aggregate"], gap), abs=1e-3)
    assert s["gap_slope"] > 0 and np.argsort(s["aggregate"]).tolist() == [0, 1, 2, 3]
    w2 = w.copy()
    np.fill_diagonal(w2, 0.0)   # self-play verdicts enter the accuracy, never the Elo fit (no self-play, as the authors)
    s2 = crossplay.elo_stats(w2[None])
    assert np.allclose(s2["aggregate"], s["aggregate"]) and s2["self_play"] == pytest.approx([0.0] * 4)
    matches = debate_sim.round_robin(4, lambda i, j: (w[i, j], 1 - w[j, i]))
    assert len(matches) == 6 and all(m["i"] < m["j"] for m in matches), "every pair once, both assignments in it"


def _hits(rng, n, ks, truth, persuasion):
    """Per-story hits of a tournament: P(the judge picks the correct side) rises with the correct debater's k
    by truth * log2(k) and falls with the incorrect debater's by persuasion * log2(k)."""
    lk = np.log2(ks)
    p = np.clip(0.6 + truth * lk[:, None] - persuasion * lk[None, :], 0.01, 0.99)
    return (rng.random((n, len(ks), len(ks))) < p).astype(float)


def test_claim_statistics_read_a_truth_advantage_and_its_absence():
    rng, ks = np.random.default_rng(0), [1, 2, 4, 8]
    truth = [_hits(rng, 400, ks, 0.08, 0.02) for _ in range(3)]   # stronger debaters help the truth more
    s = crossplay.elo_stats(truth[0])
    assert s["gap_mean"] > 0 and s["gap_slope"] > 0 and s["accuracy_slope"] > 0
    both = crossplay.over_draws(["gap_slope", "accuracy_slope"], truth, seed=0, n_boot=200)
    res = both["gap_slope"]
    assert res["ci95"][0] > 0 and res["n"] == "3 draws x 400 questions" and len(res["per_draw"]) == 3
    assert res["per_draw"][0] == pytest.approx(s["gap_slope"]) and res["basis"]["unit"] == "draw"
    assert verdicts.verdict(interval=res["basis"]["interval"], seed_differences=res["basis"]["seed_differences"]) == "reproduced"
    want = stats.nested_bootstrap(lambda h: crossplay.elo_stats(h)["gap_slope"], [[h] for h in truth],
                                  [np.arange(400)] * 3, n_boot=200, seed=config.derive_seed(0, "crossplay"))
    assert res["estimate"] == pytest.approx(want[0]) and res["ci95"] == pytest.approx(list(want[1:]))
    assert both["accuracy_slope"]["ci95"][0] > 0, "every statistic from the same resamples, each refit once"
    null = [_hits(rng, 400, ks, 0.05, 0.05) for _ in range(3)]     # persuasion helps both sides alike
    gap = crossplay.over_draws(["gap_mean"], null, seed=0, n_boot=200)["gap_mean"]
    assert gap["ci95"][0] < 150 and abs(np.mean(gap["per_draw"]) - crossplay.elo_stats(null[0])["gap_mean"]) < 100
    flat = crossplay.over_draws(["consultancy_slope"], [np.ones((20, 2, 3))] * 2, seed=0, n_boot=50)["consultancy_slope"]
    assert set(flat["basis"]) == {"not_tested"} and "did not vary" in flat["basis"]["not_tested"], "a slope on equal win rates"
    one = crossplay.over_draws(["gap_slope"], truth[:1], seed=0, n_boot=100)["gap_slope"]
    assert one["n"] == "1 draw x 400 questions"
    assert verdicts.verdict(interval=one["basis"]["interval"], seed_differences=one["basis"]["seed_differences"]) == "inconclusive"


def test_consultancy_statistics():
    # consultants k = 1, 2, 4: the correct one always believed, the incorrect one believed more as k rises
    h = np.zeros((10, 2, 3))
    h[:, 0] = 1.0
    h[:, 1] = np.array([1.0, 0.6, 0.2])      # judge right against the incorrect consultant
    c = crossplay.consultancy_stats(h)
    assert c["accuracy"] == pytest.approx([1.0, 0.8, 0.6]) and c["win_rate"] == pytest.approx([0.5, 0.7, 0.9])
    assert c["accuracy_slope"] == pytest.approx(-1.0)
    # P(correct) of both consultants of each question in a row: the incorrect one convinces more as k rises
    p = np.tile([[0.9, 0.9, 0.9], [0.8, 0.4, 0.1]], (10, 1))
    h = crossplay.consultancy_hits({"first": p, "second": p})
    assert h.shape == (10, 2, 3) and h[:, 0].mean(0) == pytest.approx([1.0] * 3) and h[:, 1].mean(0) == pytest.approx([1.0, 0.0, 0.0])


def test_pool_pieces_argue_with_their_own_seeds(monkeypatch):
    calls = []

    def fake(cache, model, tok, items, kind, setting, seed):
        calls.append({**asdict(setting), "seed": seed})
        out = {"items": items, "transcripts": [[["a", "b"]] for _ in items], "tokens": 2, "seconds": 1.0,
               "arguments": [{"item": k, "side": s} for k in range(len(items)) for s in (0, 1)]}
        return out

    monkeypatch.setattr(debate_runs, "cached_protocol", fake)
    items = stories.make_stories(5)
    out = crossplay.pool(None, None, None, items, "debate", replace(SETTING, best_of=4, rounds=3), 3, chunk=2)
    assert [c["seed"] for c in calls] == [crossplay.piece_seed(3, c) for c in range(3)] and len({c["seed"] for c in calls}) == 3
    assert all(c["rounds"] == 1 and c["best_of"] == 4 for c in calls) and crossplay.pieces(5, 2) == [(0, 2), (2, 4), (4, 5)]
    assert out["items"] == items and [a["item"] for a in out["arguments"]] == [k for k in range(5) for _ in (0, 1)]
    assert out["tokens"] == 6 and out["seconds"] == 3.0


def test_tournament_on_a_tiny_model(tiny):
    """Stored arguments of a tiny model: the tournament's self-play cell of the largest N is the judge on the kept
    transcripts, and each consultant's verdict is the judge on its picked argument."""
    model, tok = tiny
    items, store = stories.make_stories(3), {}

    def cache(name, key, make):
        if (name, str(key)) not in store:
            store[(name, str(key))] = make()
        return store[(name, str(key))]

    S = debate_runs.Setting(model_name="tiny", word_limit=5, best_of=4, temperature=0.7, batch_size=8, reading="likelihood")
    deb = crossplay.pool(cache, model, tok, items, "debate", S, 0, chunk=2)
    cons = crossplay.pool(cache, model, tok, items, "consultancy", S, 0, chunk=2)
    ks = crossplay.ladder(4)
    play = crossplay.cross_play(cache, model, tok, deb, ks, S, chunk=2)
    kept = debate.judge(model, tok, deb["items"], "debate", debate.best_of_k(deb, 4), batch_size=8)
    assert crossplay.cell(play, 2, 2)["p_correct"] == pytest.approx(kept["p_correct"], abs=1e-5)
    first = debate.judge(model, tok, deb["items"], "debate", debate.best_of_k(deb, 1), batch_size=8)
    assert crossplay.cell(play, 0, 0)["p_correct"] == pytest.approx(first["p_correct"], abs=1e-5)
    c = crossplay.consultants(cons, ks)
    for x, k in enumerate(ks):
        j = debate.judge(model, tok, cons["items"], "consultancy", debate.best_of_k(cons, k), batch_size=8)
        assert crossplay.consultant(c, x)["p_correct"] == pytest.approx(j["p_correct"], abs=1e-5)
    table = crossplay.debater_table([play], [c], ks)
    assert table["N"].tolist() == ks and np.isfinite(table["aggregate Elo"]).all()
    records = crossplay.ladder_records([play], [deb], ks, [0])
    assert list(records) == [f"debate-best-of-{k} (self-play)" for k in ks] and all(r[0]["healthy"] for r in records.values())


def _saved_tiny(tmp_path, best_of: int) -> tuple:
    """Three stories, a Setting naming the tiny model saved as a checkpoint (what a worker loads), and that
    checkpoint loaded here."""
    from replication.lm import models

    model, tok = models.tiny_model(seed=0)
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    S = debate_runs.Setting(model_name=str(tmp_path / "ckpt"), word_limit=5, best_of=best_of, temperature=0.7,
                            batch_size=4)
    return (stories.make_stories(3), S, *models.load_model(str(tmp_path / "ckpt")))


def test_pool_pieces_made_side_by_side_equal_those_made_here_at_one_thread(tmp_path):
    """crossplay.pools with workers=2 makes the pieces not in the cache in worker processes (one thread each), then
    reads every piece here: the same arguments as pools made here at one thread, and reading them is not reuse."""
    import functools

    import torch

    from replication.core import cache, phases

    items, S, here, tok_here = _saved_tiny(tmp_path, best_of=2)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = tmp_path / "one"
        made_here = crossplay.pools(functools.partial(cache.cached, one), one, here, tok_here, items,
                                    ("debate", "consultancy"), S, [0, 1], chunk=2)
    finally:
        torch.set_num_threads(before)
    two = tmp_path / "two"
    phases.reset()
    made_there = crossplay.pools(functools.partial(cache.cached, two), two, here, tok_here, items,
                                 ("debate", "consultancy"), S, [0, 1], workers=2, chunk=2)
    assert phases.reused_profile()["entries"] == 0, "made by this call's workers: not counted as reuse"
    for k in ("debate", "consultancy"):
        for a, b in zip(made_here[k], made_there[k]):
            assert a["transcripts"] == b["transcripts"] and a["arguments"] == b["arguments"]
    assert made_there["debate"][0]["transcripts"] != made_there["debate"][1]["transcripts"], "draws differ"
    assert len(list(two.glob("*-bo2-*"))) == 8   # 2 kinds x 2 draws x 2 pieces, each its own entry
    again = crossplay.pools(functools.partial(cache.cached, two), two, here, tok_here, items, ("debate",), S,
                            [0], workers=2, chunk=2)
    assert again["debate"][0]["transcripts"] == made_there["debate"][0]["transcripts"]


def test_tournament_pieces_judged_side_by_side_equal_those_judged_here_at_one_thread(tmp_path):
    """crossplay.plays with workers=2 judges the tournament's pieces not in the cache in worker processes (one thread
    each), then reads every piece here: the same verdicts as cross_play at one thread, under the same cache keys,
    and reading them is not reuse."""
    import functools

    import torch

    from replication.core import cache, phases

    items, S, here, tok_here = _saved_tiny(tmp_path, best_of=4)
    ks = crossplay.ladder(4)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = tmp_path / "one"
        outs = crossplay.pools(functools.partial(cache.cached, one), one, here, tok_here, items, ("debate",), S,
                               [0, 1], chunk=2)["debate"]
        judged_here = [crossplay.cross_play(functools.partial(cache.cached, one), here, tok_here, o, ks, S, chunk=2)
                       for o in outs]
    finally:
        torch.set_num_threads(before)
    two = tmp_path / "two"
    phases.reset()
    judged_there = crossplay.plays(functools.partial(cache.cached, two), two, here, tok_here, outs, ks, S,
                                   workers=2, chunk=2)
    assert phases.reused_profile()["entries"] == 0, "judged by this call's workers: not counted as reuse"
    for a, b in zip(judged_here, judged_there):
        assert np.array_equal(a["first"], b["first"]) and np.array_equal(a["second"], b["second"])
        assert a["pairs_judged"] == b["pairs_judged"] and a["ks"] == b["ks"]
    assert sorted(p.name for p in one.glob("crossplay-*")) == sorted(p.name for p in two.glob("crossplay-*"))
    assert len(list(two.glob("crossplay-*"))) == 4   # 2 draws x 2 pieces, each its own entry
    phases.reset()
    again = crossplay.plays(functools.partial(cache.cached, two), two, here, tok_here, outs, ks, S, workers=2, chunk=2)
    assert phases.reused_profile()["entries"] == 4 and np.array_equal(again[1]["first"], judged_there[1]["first"])
