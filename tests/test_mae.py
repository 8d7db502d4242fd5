"""Multi-Agent Evolve: the reward formulas, the filter, per-role whitening, the loop, and the statistics the
notebook takes from replication.stats (agreement at MAE's cut, McNemar). The score rules: test_mae_scores.py."""
import json
import random

import numpy as np
import pytest
import torch
from scipy.stats import mannwhitneyu

from replication import loop, mae, mae_scores, models, stats, tasks


def test_tags_and_question_extraction():
    assert mae.has_tag("a <score>3</score>", "score") and not mae.has_tag("<score> </score>", "score")
    assert not mae.has_tag("<score>3", "score")
    assert mae.extract_question("Ann has 2 cats. How many?</question> more") == ("Ann has 2 cats. How many?", True)
    assert mae.extract_question("Ann has 2 cats. How many does she have?\nSolution: 2") == \
        ("Ann has 2 cats. How many does she have?", False)
    assert mae.extract_question("Ann has 2 cats. How many?", strict=True) == (None, False)
    assert mae.extract_question("no question mark here at all") == (None, False)
    assert mae.extract_question("") == (None, False)


def test_rewards_against_hand_values():
    # above the threshold: (q + d + f) / 3
    assert mae.proposer_reward(0.8, 0.5, True) == pytest.approx((0.8 + 0.5 + 1) / 3)
    assert mae.proposer_reward(0.9, 0.3, False) == pytest.approx(0.4)
    # below it: the difficulty term is dropped
    assert mae.proposer_reward(0.6, 0.9, True) == pytest.approx((0.6 + 1) / 3)
    assert mae.proposer_reward(0.7, 0.9, False) == pytest.approx((0.7 + 0.9) / 3)  # threshold itself counts
    assert mae.proposer_reward(0.9, 0.9, True, valid=False) == 0.0                 # no question: 0
    assert mae.difficulty([1.0, 0.5, 0.0, 0.25, 0.75]) == pytest.approx(0.5)
    assert mae.solver_reward(0.6, True) == pytest.approx(0.8) and mae.solver_reward(0.6, False) == pytest.approx(0.3)
    assert mae.judge_reward("fine <score>8</score>") == 1.0 and mae.judge_reward("I give it 8") == 0.0


def test_quality_filter_threshold():
    assert mae.passes_filter(0.7) and mae.passes_filter(1.0) and not mae.passes_filter(0.69999)
    # raw score 7.3 is the smallest that passes: (7.3 - 1) / 9 = 0.7
    assert mae.passes_filter(mae_scores.parse_score("<score>7.3</score>"))
    assert not mae.passes_filter(mae_scores.parse_score("<score>7</score>"))
    assert not mae.passes_filter(mae_scores.parse_score("This is a clear problem, 10 of 10."))  # untagged: 0.5
    assert mae.passes_filter(0.5, threshold=0.5)


def _whitened(x, m):
    mean = (x * m).sum() / m.sum()
    return (x - mean) / torch.sqrt(((x - mean) ** 2 * m).sum() / m.sum() + 1e-8) * m


def test_role_advantages_whiten_within_each_role():
    g = torch.Generator().manual_seed(0)
    masks = [torch.ones(3, 4), torch.tensor([[1, 1, 0], [1, 1, 1]]), torch.tensor([[1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])]
    rewards = [torch.rand(3, generator=g), torch.tensor([0.2, 0.9]), torch.tensor([1.0, 0.0])]
    roles = ["proposer", "judge", "judge"]
    adv = mae.role_advantages(rewards, masks, roles)
    assert [a.shape for a in adv] == [m.shape for m in masks]
    # proposer: gamma = 1 returns are the reward at every token; whitened on its own
    ret = rewards[0][:, None].expand(3, 4)
    assert torch.allclose(adv[0], _whitened(ret, masks[0]), atol=1e-5)
    # the two judge chunks are whitened together (token-weighted), padding stays 0
    m = torch.nn.functional.pad(masks[1].float(), (0, 2))
    x = torch.cat([rewards[1][:, None] * m, rewards[2][:, None] * masks[2]])
    ref = _whitened(x, torch.cat([m, masks[2].float()]))
    assert torch.allclose(torch.cat([torch.nn.functional.pad(adv[1], (0, 2)), adv[2]]), ref, atol=1e-5)
    # shifting one role's rewards leaves the other role's advantages unchanged
    shifted = mae.role_advantages([rewards[0] + 5, rewards[1], rewards[2]], masks, roles)
    assert torch.allclose(shifted[0], adv[0], atol=1e-5) and torch.allclose(shifted[2], adv[2])
    # a role whose rewards are all equal gets zero advantage
    flat = mae.role_advantages([torch.full((3,), 0.3)], masks[:1], ["solver"])
    assert torch.count_nonzero(flat[0]) == 0


def test_agreement_at_mae_cut_matches_scipy_and_hand_counts():
    scores = [0.9, 0.1, 0.5, 0.2, 0.8, 0.0]
    correct = [True, False, True, True, False, False]
    out = stats.agreement(scores, correct, cut=mae.AGREEMENT_CUT)
    # says correct (>= 1/3, a raw 4 of 10): T F T F T F vs T F T T F F -> 4 of 6 agree
    assert mae.AGREEMENT_CUT == pytest.approx(mae_scores.parse_score("<score>4</score>"))
    assert out["agreement"] == pytest.approx(4 / 6) and out["n"] == 6 and out["majority_baseline"] == 0.5
    pos, neg = [0.9, 0.5, 0.2], [0.1, 0.8, 0.0]
    wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg)
    assert out["auc"] == pytest.approx(wins / 9) == pytest.approx(mannwhitneyu(pos, neg).statistic / 9)
    assert out["ci95"][0] < 4 / 6 < out["ci95"][1]
    assert np.isnan(stats.agreement([0.5, 0.6], [True, True], cut=mae.AGREEMENT_CUT)["auc"])


def test_pool_and_config_validation():
    pool = mae.QuestionPool.from_problems(tasks.make_level("1d-1step-add", 3))
    pool.add("What is 2 + 2?", 0.9, iteration=0)
    assert len(pool) == 4 and pool.items[-1]["source"] == "proposed" and pool.items[0]["answer"] is not None
    assert len(pool.sample(random.Random(0), 5)) == 5
    for bad, msg in [({"reference_ratio": 1.5}, "reference_ratio=1.5"), ({"proposals": 0}, "proposals=0"),
                     ({"pool_solve": 0}, "pool_solve=0"), ({"quality_threshold": -0.1}, "quality_threshold=-0.1")]:
        with pytest.raises(ValueError, match=msg):
            mae.MAEConfig(**bad).validate()


def _results(rows):
    """Rows without wall times, as text (NaN compares equal)."""
    return json.dumps([{k: v for k, v in r.items() if not k.endswith("_s")} for r in rows])


def _loop(tmp_path, name, iterations, score_rule="last_number", **kw):
    """The loop on the tiny model; by default with the last-number rule, which reads the numbers the tiny model
    writes, so rewards differ and the update is not zero (it never writes a tag: the self-judge gives all 0.5)."""
    model, tok = models.tiny_model(seed=0)
    cfg = mae.MAEConfig(iterations=iterations, proposals=3, n_solve=2, pool_solve=2, question_tokens=10,
                        answer_tokens=10, judge_tokens=10, lr=1e-2, score_rule=score_rule, **kw)
    folder = loop.RunFolder(tmp_path / name) if tmp_path else None
    return mae.run_arm(model, tok, "main", tasks.make_level("1d-1step-add", 4), cfg, folder, progress=False)


def test_loop_reads_judge_replies_by_its_rule():
    # the tiny model never writes a score tag: the self-judge rule (MAEConfig's default) gives every judgment 0.5 and
    # no gradient; the last-number fallback reads the numbers it happens to write
    own = _loop(None, "s", 1, score_rule="self_judge")[1]["rows"][0]
    last = _loop(None, "l", 1)[1]["rows"][0]
    assert (own["judge_unparsed"], own["judge_fallback"], own["solver_judge"], own["grad_norm"]) == (1.0, 0.0, 0.5, 0.0)
    assert last["judge_fallback"] > 0 and last["solver_judge"] != 0.5


def test_loop_updates_the_model_and_resumes_exactly(tmp_path):
    model, out = _loop(tmp_path, "a", 3)
    assert [r["iteration"] for r in out["rows"]] == [r["step"] for r in out["rows"]] == [0, 1, 2]
    assert all(0 <= r["solver_reward"] <= 1 and 0 <= r["proposer_reward"] <= 1 for r in out["rows"])
    assert any(r["grad_norm"] > 0 for r in out["rows"])
    assert out["rows"][-1]["pool_size"] == len(out["pool"]) >= 4
    assert len(out["proposals"]) == 3 * 3 and {p["iteration"] for p in out["proposals"]} == {0, 1, 2}
    weights = loop.trainable(model)
    assert any(float(w.detach().abs().sum()) > 0 for n, w in weights.items() if "lora_B" in n)  # B starts at 0
    # the loop state (pool, proposals, verified answers) is in the checkpoint, beside the weights
    ckpt = torch.load(loop.RunFolder(tmp_path / "a").latest(), weights_only=False)
    assert ckpt["step"] == 3 and ckpt["extra"]["pool"] == out["pool"] and ckpt["extra"]["verified"] == out["verified"]
    # interrupted after 2 iterations, then resumed: the same rows, state and weights
    _, first = _loop(tmp_path, "b", 2)
    (tmp_path / "b" / "done.json").unlink()
    resumed_model, resumed = _loop(tmp_path, "b", 3)
    assert _results(resumed["rows"]) == _results(out["rows"])
    assert resumed["pool"] == out["pool"] and _results(resumed["proposals"]) == _results(out["proposals"])
    b = loop.trainable(resumed_model)
    assert all(torch.equal(weights[k], b[k]) for k in weights)
    assert len(list((tmp_path / "b" / "checkpoints").glob("*.pt"))) == 1  # only the latest is kept
    # a finished run is read back: its rows and state, and its final weights loaded into a fresh adapter
    again_model, again = _loop(tmp_path, "a", 3)
    assert _results(again["rows"]) == _results(out["rows"]) and again["pool"] == out["pool"]
    c = loop.trainable(again_model)
    assert all(torch.equal(weights[k], c[k]) for k in weights)


def test_mcnemar_on_paired_outcomes_is_exact():
    from scipy.stats import binomtest

    before = [1, 1, 0, 0, 0, 0, 1, 0]
    after = [1, 0, 1, 1, 1, 0, 1, 1]
    out = stats.mcnemar(before, after)
    assert (out["gained"], out["lost"]) == (4, 1) and out["change"] == pytest.approx(3 / 8)
    assert out["p_value"] == pytest.approx(binomtest(4, 5, 0.5).pvalue) == pytest.approx(0.375)
    assert stats.mcnemar([1, 0], [1, 0])["p_value"] == 1.0


def test_summaries_and_keys():
    import pandas as pd

    before = pd.DataFrame({"correct": [True, False, False, False], "format": [True, True, False, True]})
    after = pd.DataFrame({"correct": [True, True, True, False], "format": [True] * 4})
    acc = mae.accuracy(after)
    assert acc["accuracy"] == 0.75 and acc["n"] == 4 and acc["format"] == 1.0 and acc["ci95"][0] < 0.75 < acc["ci95"][1]
    assert mae.fmt_accuracy(acc).startswith("75.0% [")
    rows = [{"iteration": i, "pool_size": 4 + i, "accepted": 1, "filtered": 1, "no_question": 0, "proposer_reward": 0.5,
             "proposer_difficulty": 0.2, "solver_reward": 0.4, "judge_format": 0.0} for i in range(3)]
    props = [{"iteration": i, "accepted": a, "quality": q} for i in range(3) for a, q in ((True, 0.8), (False, 0.1))]
    assert mae.pool_summary(pd.DataFrame(rows), 4) == {"initial": 4, "final": 6, "accepted": 3, "filtered": 3, "no_question": 0}
    arm = mae.arm_summary({"rows": rows, "proposals": props}, after, before, iterations=2)
    assert arm["iterations"] == 2 and arm["pool_final"] == 5 and arm["mean_quality_accepted"] == pytest.approx(0.8)
    assert arm["paired_change_vs_before"]["gained"] == 2 and arm["solver_accuracy_after"]["accuracy"] == 0.75
    assert mae.arm_summary({"rows": rows, "proposals": props}, None, before, 3)["solver_accuracy_after"] is None
    seeds = tasks.make_level("1d-1step-add", 2)
    cfg = mae.MAEConfig(iterations=2)
    assert mae.run_key("m", seeds, cfg) != mae.run_key("m", seeds, mae.MAEConfig(iterations=3))
    assert mae.solve_prompts(seeds)[0].startswith(seeds[0].question) and tasks.INSTRUCTION in mae.solve_prompts(seeds)[0]


def test_loop_config_from_notebook_parameters():
    from types import SimpleNamespace

    params = SimpleNamespace(iterations=3, proposals=2, lr=1e-3, model="x", seed=5, batch_size=4)
    cfg = mae.MAEConfig.from_params(params, use_filter=False)
    assert (cfg.iterations, cfg.proposals, cfg.lr, cfg.seed, cfg.use_filter) == (3, 2, 1e-3, 5, False)
    with pytest.raises(ValueError, match="proposals=0"):
        mae.MAEConfig.from_params(params, proposals=0)


def test_paper_tables():
    table = mae.paper_table()
    assert "Overall" in table.columns and ("with reference", "MAE (half reference)") in table.index
    settings = mae.settings_table(mae.MAEConfig())
    assert list(settings.columns) == ["value", "ours", "meaning", "source"] and settings.loc["n_solve", "ours"] == 2
