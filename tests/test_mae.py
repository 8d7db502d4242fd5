"""Multi-Agent Evolve: the reward formulas, the filter, per-role whitening, the judge's `<score>` prefill, the
verifier-judge arm, the loop, and the statistics the notebook takes from replication.core.stats (agreement at MAE's cut).
The score rules: test_mae_scores.py; the held-out records and health: test_mae_eval.py."""
import dataclasses
import json
import random

import numpy as np
import pytest
import torch
from scipy.stats import mannwhitneyu

from replication.core import fmt, stats
from replication.lm import arms, loop, models, tasks
from replication.papers.mae import mae, mae_eval, mae_scores


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


def test_a_training_seed_changes_the_run_and_the_first_keeps_its_key():
    """Notebook 06 trains each arm once per training seed (arms.training_seeds), the seed being MAEConfig.seed: the
    first training seed is the one-run config, so its run folder and held-out cache keys stay; another seed changes
    the adapter's initialisation and the rollouts (sampling and pool draws)."""
    from types import SimpleNamespace

    params = SimpleNamespace(iterations=1, seed=0, seeds=3)  # the notebook's `seeds` is not a loop setting
    cfg = mae.MAEConfig.from_params(params)
    questions = tasks.make_level("1d-1step-add", 4)
    per_seed = [dataclasses.replace(cfg, seed=s) for s in arms.training_seeds(params.seed, params.seeds)]
    assert mae.run_key("m", questions, per_seed[0]) == mae.run_key("m", questions, cfg)
    assert len({json.dumps(mae.run_key("m", questions, c)) for c in per_seed}) == 3
    init = [loop.trainable(mae.new_adapter(models.tiny_model(seed=0)[0], "arm", mae.MAEConfig(seed=s))) for s in (0, 0, 1)]
    lora_a = [torch.cat([w.flatten() for n, w in sorted(x.items()) if "lora_A" in n]) for x in init]
    assert torch.equal(lora_a[0], lora_a[1]) and not torch.equal(lora_a[0], lora_a[2])
    runs = [_loop(None, f"s{s}", 1, seed=s)[1] for s in (0, 0, 1)]
    assert _results(runs[0]["proposals"]) == _results(runs[1]["proposals"])
    assert _results(runs[0]["proposals"]) != _results(runs[2]["proposals"])


def test_every_training_seed_is_trained_on_the_evaluated_worked_examples():
    """The held-out evaluation prompts with the notebook seed's worked examples: a later training seed must train
    on the same ones (shots_seed), not on examples drawn from its own seed; the first seed keeps its old key."""
    cfg = mae.MAEConfig(shots=3, seed_level="2d-1step-add", seed=0)
    evaluated = tasks.worked_examples("2d-1step-add", 3, 0)
    later = dataclasses.replace(cfg, seed=2, shots_seed=0)
    assert [p.id for p in mae.worked_examples(later)] == [p.id for p in evaluated]
    assert [p.id for p in mae.worked_examples(dataclasses.replace(cfg, seed=2))] != [p.id for p in evaluated]
    questions = tasks.make_level("1d-1step-add", 4)
    assert mae.run_key("m", questions, dataclasses.replace(cfg, shots_seed=0)) == mae.run_key("m", questions, cfg)
    assert mae.run_key("m", questions, later) != mae.run_key("m", questions, dataclasses.replace(cfg, seed=2))
    with pytest.raises(ValueError, match="shots_seed"):
        dataclasses.replace(cfg, shots_seed=-1).validate()


def test_summaries_and_keys():
    import pandas as pd

    after = pd.DataFrame({"correct": [True, True, True, False], "format": [True] * 4})
    acc = mae_eval.accuracy(after)
    assert acc["accuracy"] == 0.75 and acc["n"] == 4 and acc["format"] == 1.0 and acc["ci95"][0] < 0.75 < acc["ci95"][1]
    assert fmt.accuracy(acc).startswith("75.0% [")
    rows = [{"iteration": i, "pool_size": 4 + i, "accepted": 1, "filtered": 1, "no_question": 0, "proposer_reward": 0.5,
             "proposer_difficulty": 0.2, "solver_reward": 0.4, "judge_format": 0.0} for i in range(3)]
    props = [{"iteration": i, "accepted": a, "quality": q} for i in range(3) for a, q in ((True, 0.8), (False, 0.1))]
    assert mae_eval.pool_summary(pd.DataFrame(rows), 4) == {"initial": 4, "final": 6, "accepted": 3, "filtered": 3, "no_question": 0}
    arm = mae_eval.arm_summary({"rows": rows, "proposals": props}, iterations=2)
    assert arm["iterations"] == 2 and arm["pool_final"] == 5 and arm["mean_quality_accepted"] == pytest.approx(0.8)
    assert arm["filtered"] == 2 and arm["solver_reward"] == pytest.approx(0.4)
    seeds = tasks.make_level("1d-1step-add", 2)
    cfg = mae.MAEConfig(iterations=2)
    assert mae.run_key("m", seeds, cfg) != mae.run_key("m", seeds, mae.MAEConfig(iterations=3))
    assert mae.run_key("m", seeds, cfg) != mae.run_key("m", seeds, mae.MAEConfig(iterations=2, judge="verifier"))
    assert mae.solve_prompt(seeds[0].question) == seeds[0].prompt()  # the loop's solver prompt is the task's prompt
    shots = tasks.worked_examples("1d-1step-add", 2)
    turns = mae.solve_prompt(seeds[0].question, shots)
    assert turns == seeds[0].chat(shots) and len(turns) == 5  # the worked examples lead, as in the yardstick


def test_loop_config_from_notebook_parameters():
    from types import SimpleNamespace

    params = SimpleNamespace(iterations=3, proposals=2, lr=1e-3, model="x", seed=5, batch_size=4)
    cfg = mae.MAEConfig.from_params(params, use_filter=False)
    assert (cfg.iterations, cfg.proposals, cfg.lr, cfg.seed, cfg.use_filter) == (3, 2, 1e-3, 5, False)
    with pytest.raises(ValueError, match="proposals=0"):
        mae.MAEConfig.from_params(params, proposals=0)


def test_paper_tables():
    table = mae_eval.paper_table()
    assert "Overall" in table.columns and ("with reference", "MAE (half reference)") in table.index
    settings = mae_eval.settings_table(mae.MAEConfig())
    assert list(settings.columns) == ["value", "ours", "meaning", "source"] and settings.loc["n_solve", "ours"] == 2


def _recording_sample(monkeypatch):
    """Record every templated text the loop samples from (models.sample), calling the real sampler."""
    seen, real = [], models.sample

    def sample(model, tok, texts, *args, **kw):
        seen.extend(texts)
        return real(model, tok, texts, *args, **kw)

    monkeypatch.setattr(models, "sample", sample)
    return seen


def test_judge_turns_open_with_the_score_tag(monkeypatch):
    seen = _recording_sample(monkeypatch)
    _, out = _loop(None, "p", 1, score_rule="self_judge")
    tok = models.tiny_tokenizer()
    turn = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True)
    opening = turn[turn.rindex("<|im_start|>"):]  # the assistant turn's header
    judges = [t for t in seen if "Grade this answer" in t or "Rate this math problem" in t]
    proposers = [t for t in seen if "You write math word problems" in t]
    solvers = [t for t in seen if tasks.INSTRUCTION in t and t not in judges]
    assert judges and proposers and solvers
    assert all(t.endswith(opening + mae.SCORE_PREFILL) for t in judges)       # the judge's next tokens are the score
    assert all(t.endswith(opening + mae.QUESTION_PREFILL) for t in proposers)
    assert not any(t.endswith(mae.SCORE_PREFILL) or t.endswith(mae.QUESTION_PREFILL) for t in solvers)
    # the judge's reply is read, and its format rewarded, on the prefill and what followed it
    assert mae.judge_reward(mae.SCORE_PREFILL + "7</score> clear") == 1.0 and mae.judge_reward("7</score>") == 0.0
    assert mae_scores.parse_score(mae.SCORE_PREFILL + "7</score>") == pytest.approx(6 / 9)


def test_judge_replies_hold_the_prefill_and_its_ids_are_in_the_prompt():
    model, tok = models.tiny_model(seed=0)
    cfg = mae.MAEConfig(judge_tokens=6)
    torch.manual_seed(0)
    out = mae.judge_replies(model, tok, ["Grade this.", "Rate this."], cfg)
    assert all(t.startswith(mae.SCORE_PREFILL) for t in out["texts"])
    p_ids, p_mask, c_ids, c_mask = out["ids"]
    prompt_end = tok.decode(p_ids[0][p_mask[0].bool()][-len(tok(mae.SCORE_PREFILL)["input_ids"]):])
    assert prompt_end == mae.SCORE_PREFILL  # trained on as the prompt, not as the judge's own tokens
    assert out["texts"][0] == mae.SCORE_PREFILL + tok.decode(c_ids[0][c_mask[0].bool()], skip_special_tokens=True)


def test_verifier_scores():
    assert mae.verifier_scores(["so the answer is 5.", "The answer is 4.", "The answer is 5."], [5, 5, None]) == [1.0, 0.0, None]
    with pytest.raises(ValueError, match="judge='oracle'"):
        mae.MAEConfig(judge="oracle").validate()


def test_verifier_judge_arm_rewards_the_solver_with_the_exact_verifier(monkeypatch):
    """Answers to seed questions: alternately right and wrong (the rest of the loop as is). Under the verifier judge
    each answer's judge score is tasks.verify of it, and the solver's reward 0.5 verify + 0.5 format; the model
    writes no answer judgment."""
    seeds = tasks.make_level("1d-1step-add", 4)
    answer = {p.question: p.answer for p in seeds}
    real = mae._generate

    def generate(model, tok, prompts, *args, **kw):
        gen = real(model, tok, prompts, *args, **kw)
        users = [p if isinstance(p, str) else p[-1]["content"] for p in prompts]
        if all(tasks.INSTRUCTION in u and "Grade this" not in u for u in users):  # the solver's turn
            reps = kw.get("repeats", 1)
            qs = [u.split("\n")[0] for u in users for _ in range(reps)]
            gen["texts"] = [f"The answer is {answer[q] + k % 2}." if q in answer else "no idea" for k, q in enumerate(qs)]
        return gen

    monkeypatch.setattr(mae, "_generate", generate)
    model, tok = models.tiny_model(seed=0)
    for judge in ("verifier", "self"):
        cfg = mae.MAEConfig(iterations=1, proposals=2, n_solve=2, pool_solve=3, question_tokens=6, answer_tokens=6,
                            judge_tokens=6, judge=judge)
        model = mae.new_adapter(model, judge, cfg)
        out = mae.iteration(model, tok, torch.optim.SGD([torch.zeros(1)], lr=0.0),
                            mae.QuestionPool.from_problems(seeds), cfg, 0)
        v, row = out["verified"], out["row"]
        assert len(v) == 6 and row["seed_accuracy"] == 0.5
        if judge == "verifier":
            assert [x["score"] for x in v] == [float(x["correct"]) for x in v] == [1.0, 0.0] * 3
            assert row["solver_judge"] == pytest.approx(0.5) and row["solver_reward"] == pytest.approx(0.75)
            assert row["judgments"] == cfg.proposals - row["no_question"]  # question ratings only
        else:  # the tiny model never closes a score tag: every answer scores the neutral 0.5 whatever the verifier says
            assert {x["score"] for x in v} == {0.5}


def test_micro_batches_do_not_change_the_update():
    weights = []
    for micro in (1, 64):
        model, out = _loop(None, f"m{micro}", 1, micro_batch=micro)
        assert out["rows"][0]["grad_norm"] > 0
        weights.append({k: w.detach().clone() for k, w in loop.trainable(model).items()})
    assert all(torch.allclose(weights[0][k], weights[1][k], atol=1e-6) for k in weights[0])
