"""Elo-Evolve training parts: quality judge, win/loss reward with ties and the length rule, the opponent
cache, the rating fit, length-controlled win rate, and per-prompt opponents wired into GRPO."""
import json

import numpy as np
import pytest
import torch

from replication import elo, evolve, files, grpo, models, tasks, loop, training

GOOD, WRONG, BARE = "So 3 + 4 = 7. The answer is 7.", "The answer is 9.", "seven i think 7"


def test_quality_levels():
    assert evolve.quality(GOOD, 7) == 4.0      # correct and formatted
    assert evolve.quality(BARE, 7) == 3.0      # correct (last number), no format
    assert evolve.quality(WRONG, 7) == 2.0     # formatted, wrong
    assert evolve.quality("no idea", 7) == 1.0


def test_outcomes_win_loss_tie_and_length_rule():
    judge = evolve.QualityJudge(sigma_comp=0.01, sigma_abs=1.0)   # nearly noiseless comparisons
    rng = np.random.default_rng(0)
    q, a = ["q"] * 4, [7] * 4
    policy = [GOOD, WRONG, GOOD, GOOD + " and" * 30]
    opponent = [WRONG, GOOD, GOOD, WRONG]
    s = evolve.outcomes(judge, q, a, policy, opponent, rng, length_margin=20)
    assert s.tolist() == [1.0, 0.0, 0.5, 0.0]  # win, loss, identical = tie, longer by > 20 words = 0
    s = evolve.outcomes(judge, q, a, policy, opponent, rng, length_margin=40)
    assert s[3] == 1.0                         # within the margin the better answer wins again
    with pytest.raises(ValueError, match="length_margin"):
        evolve.outcomes(judge, q, a, policy, opponent, rng, length_margin=-1)


def test_thurstone_win_probability_and_noise():
    judge = evolve.QualityJudge(sigma_comp=1.0, sigma_abs=2.0)
    p = judge.p_win(["q"], [7], [GOOD], [WRONG])[0]
    assert p == pytest.approx(0.97725, abs=1e-4)        # Phi(2 / 1)
    draws = evolve.outcomes(judge, ["q"] * 20000, [7] * 20000, [GOOD] * 20000, [WRONG] * 20000,
                            np.random.default_rng(1))
    assert draws.mean() == pytest.approx(p, abs=0.005)
    scores = judge.scores(["q"] * 20000, [7] * 20000, [GOOD] * 20000, np.random.default_rng(2))
    assert scores.mean() == pytest.approx(4.0, abs=0.05) and scores.std() == pytest.approx(2.0, abs=0.05)
    with pytest.raises(ValueError, match="sigma_comp"):
        evolve.QualityJudge(sigma_comp=0)


def test_fit_ratings_recovers_known_ratings():
    true = np.array([1350.0, 1200.0, 1600.0, 1900.0])
    wins = elo.expected_score(true[:, None], true[None, :])
    np.testing.assert_allclose(evolve.fit_ratings(wins, anchor=0, anchor_rating=1350.0), true, atol=0.5)


def test_lc_win_rate_removes_a_length_effect():
    rng = np.random.default_rng(0)
    d = rng.normal(0, 10, 400)                             # length difference in words
    p = 1 / (1 + np.exp(-(0.0 + 2.0 * np.tanh(d / d.std()))))   # wins driven by length only
    wins = (rng.random(400) < p).astype(float)
    lc = evolve.lc_win_rate(wins, 20 + d, np.full(400, 20.0))
    assert lc["length_coef"] > 1.0
    assert lc["ci95"][0] < 0.5 < lc["ci95"][1]
    wr = evolve.win_rate(wins)
    assert wr["ci95"][0] <= wr["win_rate"] <= wr["ci95"][1]


@pytest.fixture(scope="module")
def tiny_pool_setup():
    model, tok = models.tiny_model(seed=0)
    problems = tasks.make_level("1d-1step-add", 6, seed=3)
    specs = [evolve.OpponentSpec("weak", 1.5, 1), evolve.OpponentSpec("mid", 0.7, 1),
             evolve.OpponentSpec("strong", 0.7, 3)]
    return model, tok, problems, specs


def test_pool_cache_is_reused_and_rebuilt_when_missing_stale_or_corrupt(tmp_path, tiny_pool_setup, monkeypatch):
    model, tok, problems, specs = tiny_pool_setup
    path = tmp_path / "pool.json"
    build = lambda: evolve.cached_pool(path, model, tok, "tiny", problems, specs, 4, 0, progress=False)  # noqa: E731
    pool, status = build()
    assert status == "rebuilt: missing" and set(pool) == {"weak", "mid", "strong"}
    assert all(len(v) == len(problems) for v in pool.values())
    for mid, strong, p in zip(pool["mid"], pool["strong"], problems):   # strong picks from mid's sample + 2
        assert evolve.quality(strong, p.answer) >= evolve.quality(mid, p.answer)

    real_build = evolve.build_pool
    monkeypatch.setattr(evolve, "build_pool", lambda *a, **k: pytest.fail("a valid cache was rebuilt"))
    again, status = build()
    assert status == "ok" and again == pool
    monkeypatch.setattr(evolve, "build_pool", real_build)

    data = files.read_json(path)
    data["pool"]["weak"][0] = "tampered"
    path.write_text(json.dumps(data))
    assert build()[1] == "rebuilt: contents do not match their checksum"
    path.write_text("{not json")
    assert build()[1].startswith("rebuilt: unreadable")
    assert evolve.cached_pool(path, model, tok, "other-model", problems, specs, 4, 0, progress=False)[1] == \
        "rebuilt: built for a different model, prompts or opponents"
    assert files.read_json(path)["key"]["model"] == "other-model"


class RecordingJudge(evolve.QualityJudge):
    """A quality judge that records which opponent responses it was asked to compare against."""

    def __init__(self):
        super().__init__(1.0, 1.0)
        self.seen, self.scored = [], 0

    def p_win(self, questions, answers, a, b):
        self.seen.append(list(b))
        return super().p_win(questions, answers, a, b)

    def scores(self, questions, answers, responses, rng):
        self.scored += len(responses)
        return super().scores(questions, answers, responses, rng)


def run_regime(tmp_path, regime, steps=3, opponent=None, folder=None, temperature=200.0):
    model, tok = models.tiny_model(seed=0)
    model = models.add_lora(model, r=4, alpha=8)
    problems = tasks.make_level("1d-1step-add", 8, seed=5)
    pool = {name: [f"{name} says {p.answer + i}" for p in problems] for i, name in enumerate(("weak", "mid", "strong"))}
    judge = RecordingJudge()
    cfg = evolve.EvolveConfig(regime=regime, opponent=opponent, steps=steps, prompts_per_step=3,
                              temperature=temperature, seed=1)
    gcfg = grpo.GRPOConfig(num_generations=2, max_new_tokens=4, lr=1e-2, beta=0.0, save_every=1)
    rows = evolve.train(model, tok, judge, problems, pool, [1300.0, 1500.0, 1700.0], cfg, gcfg, folder, progress=False)
    return rows, judge, pool, problems, model


def test_elo_regime_draws_an_opponent_per_prompt_and_updates_the_rating(tmp_path):
    rows, judge, pool, problems, _ = run_regime(tmp_path, "elo", steps=4, temperature=50.0)
    assert len(rows) == 4 and len(judge.seen) == 4
    for row, seen in zip(rows, judge.seen):
        assert len(row["opponents"]) == 3
        # every rollout of a prompt is judged against that prompt's opponent's cached response
        names_seen = [b.split(" says ")[0] for b in seen]
        assert names_seen == [n for n in row["opponents"] for _ in range(2)]
        assert np.isclose(sum(row["probs"]), 1.0)
        np.testing.assert_allclose(row["probs"], elo.sampling_probs(row["rating_before"], [1300, 1500, 1700], 50.0))
    assert rows[1]["rating_before"] == rows[0]["rating"]
    assert len({tuple(r["opponents"]) for r in rows}) > 1 or len(set(sum((r["opponents"] for r in rows), []))) > 1


def test_static_and_point_regimes(tmp_path):
    rows, judge, *_ = run_regime(tmp_path, "static", opponent="strong")
    assert all(set(r["opponents"]) == {"strong"} for r in rows)
    assert all(b.startswith("strong says") for seen in judge.seen for b in seen)
    rows, judge, *_ = run_regime(tmp_path, "point")
    assert judge.seen == [] and judge.scored == 3 * 3 * 2
    assert all(r["rating"] == 1350.0 for r in rows)


def test_resume_restores_weights_and_rating(tmp_path):
    straight_rows, *_, straight = run_regime(tmp_path, "elo", steps=4, folder=loop.RunFolder(tmp_path / "a"))
    folder = loop.RunFolder(tmp_path / "b")
    run_regime(tmp_path, "elo", steps=2, folder=folder)
    (folder.path / "done.json").unlink()
    rows, *_, resumed = run_regime(tmp_path, "elo", steps=4, folder=folder)
    assert [r["rating"] for r in rows] == [r["rating"] for r in straight_rows]
    a, b = training.trainable(straight), training.trainable(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("bad, match", [({"regime": "dpo"}, "regime"), ({"regime": "static", "opponent": "x"}, "opponent"),
                                        ({"temperature": 0}, "temperature"), ({"update_rule": "max"}, "update_rule"),
                                        ({"steps": 0}, "steps")])
def test_bad_config_is_named(bad, match):
    with pytest.raises(ValueError, match=match):
        evolve.EvolveConfig(**bad).validate(["weak", "mid"])


def test_a_finished_run_loads_its_final_weights(tmp_path):
    folder = loop.RunFolder(tmp_path / "done")
    *_, trained = run_regime(tmp_path, "static", opponent="mid", steps=2, folder=folder)
    rows, judge, *_, reloaded = run_regime(tmp_path, "static", opponent="mid", steps=2, folder=folder)
    assert judge.seen == [] and len(rows) == 2           # nothing was generated or judged again
    a, b = training.trainable(trained), training.trainable(reloaded)
    assert all(torch.equal(a[k], b[k]) for k in a)
