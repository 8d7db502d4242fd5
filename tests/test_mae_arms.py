"""Multi-Agent Evolve's added arms and checks: the likelihood self-judge (its score, its arm in the loop, its signal),
the SFT-on-seed-questions baseline, the quality filter's known-quality questions and its signal, and the trace of
the loop's seed-question samples (the replayed draws, the base on the same questions, every iteration's adapter)."""
import copy
import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import torch

from replication.core import verdicts
from replication.lm import judges, loop, models, tasks, training
from replication.papers.mae import mae, mae_filter, mae_likelihood, mae_runs, mae_sft, mae_trace


# ---- the likelihood judge ----------------------------------------------------------------------------------------

def test_likelihood_score_is_the_models_mean_token_probability_of_the_reply(tiny):
    """s = exp(mean log-prob per token) of the reply (+ EOS) after the question and the answer instruction, computed
    here by one plain forward pass per reply; no answer enters it."""
    model, tok = tiny
    questions, replies = ["Ann has 2 cats. How many?", "Bo has 3.", "Ann has 2 cats. How many?"], ["2", "The answer is 3.", ""]
    got = mae_likelihood.scores(model, tok, questions, replies)
    p_ids, p_mask, c_ids, c_mask = training.encode_pairs(tok, [f"{q}\n{tasks.INSTRUCTION}" for q in questions], replies)
    with torch.no_grad():
        lp = training.completion_logps(model, p_ids, p_mask, c_ids, c_mask) * c_mask
    assert np.allclose(got, torch.exp(lp.sum(1) / c_mask.sum(1)).numpy(), atol=1e-5)
    assert all(0 < s <= 1 for s in got) and mae_likelihood.scores(model, tok, [], []) == []


def _made_to_prefer(tiny, question, reply, steps=40):
    model, tok = tiny
    model = copy.deepcopy(model).train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    p_ids, p_mask, c_ids, c_mask = training.encode_pairs(tok, [f"{question}\n{tasks.INSTRUCTION}"], [reply])
    for _ in range(steps):
        (-(training.completion_logps(model, p_ids, p_mask, c_ids, c_mask) * c_mask).sum() / c_mask.sum()).backward()
        opt.step()
        opt.zero_grad()
    return model.eval()


@pytest.mark.parametrize("preferred", ["The answer is 7.", "The answer is 9."])
def test_likelihood_judge_scores_the_reply_the_model_believes_higher(tiny, preferred):
    """A model made to give one reply scores it above the other, whichever it is: the score follows the model's
    belief, not the reference answer (7 here, never passed)."""
    q = "Cy has 3 pens. Cy gets 4 more pens. How many pens does Cy have now?"
    other = {"The answer is 7.": "The answer is 9.", "The answer is 9.": "The answer is 7."}[preferred]
    model = _made_to_prefer(tiny, q, preferred)
    s = mae_likelihood.scores(model, tiny[1], [q, q], [preferred, other])
    assert s[0] > s[1] and s[0] > 0.5


def _perturbed_adapter(model, cfg, name):
    """A fresh adapter whose LoRA B weights are random, so the adapted model differs from the base."""
    model = mae.new_adapter(model, name, cfg)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, w in loop.trainable(model).items():
            if "lora_B" in n:
                w.copy_(torch.randn(w.shape, generator=g) * 0.5)
    return model


def test_likelihood_judge_is_the_frozen_base_model(tiny):
    """With an adapter trained (here: perturbed), the judge still reads the base model: its scores equal the plain
    model's and differ from the adapted model's likelihood, so training the policy cannot move its own judge."""
    base, tok = tiny
    questions, replies = ["Ann has 2 cats. How many?"] * 2, ["The answer is 2.", "The answer is 5."]
    expected = mae_likelihood.scores(base, tok, questions, replies)
    model = _perturbed_adapter(copy.deepcopy(base), mae.MAEConfig(lora_r=4), "policy")
    assert mae_likelihood.scores(model, tok, questions, replies) == pytest.approx(expected, abs=1e-6)
    adapted = np.exp(judges.response_logps(model, tok, questions, replies, instruction=tasks.INSTRUCTION)["mean_logp"])
    assert np.abs(np.log(adapted) - np.log(expected)).max() > 0.05  # the adapter moves the likelihood; the judge not
    assert mae_likelihood.scorer(model, tok)(questions, replies) == pytest.approx(expected, abs=1e-6)


def test_likelihood_signal_over_seeds():
    qid = [f"q{i}" for i in range(40)]
    right = np.arange(40) % 2 == 0
    good = pd.DataFrame({"qid": qid, "correct": right, "score": np.where(right, 0.8, 0.3)})
    blind = good.assign(score=0.5)
    out = mae_likelihood.signal([good, good], n_boot=200)
    assert out["auc"] == 1.0 and out["ci95"] == [1.0, 1.0] and out["per_seed"] == [1.0, 1.0]
    assert out["n"] == "2 seeds x 40 questions" and out["mean_score_right"] == pytest.approx([0.8, 0.8])
    assert mae_likelihood.signal([blind], n_boot=200)["auc"] == 0.5


def _solver_replies(monkeypatch, seeds):
    """The solver answers seed questions alternately right and wrong (the rest of the loop samples as it is)."""
    answer = {p.question: p.answer for p in seeds}
    real = mae._generate

    def generate(model, tok, prompts, *args, **kw):
        gen = real(model, tok, prompts, *args, **kw)
        users = [p if isinstance(p, str) else p[-1]["content"] for p in prompts]
        if all(tasks.INSTRUCTION in u and "Grade this" not in u for u in users):
            qs = [u.split("\n")[0] for u in users for _ in range(kw.get("repeats", 1))]
            gen["texts"] = [f"The answer is {answer[q] + k % 2}." if q in answer else "no idea" for k, q in enumerate(qs)]
        return gen

    monkeypatch.setattr(mae, "_generate", generate)


def test_likelihood_arm_judges_answers_by_the_models_likelihood(monkeypatch):
    seeds = tasks.make_level("1d-1step-add", 4)
    _solver_replies(monkeypatch, seeds)
    model, tok = models.tiny_model(seed=0)
    cfg = mae.MAEConfig(iterations=1, proposals=2, n_solve=2, pool_solve=3, question_tokens=6, answer_tokens=6,
                        judge_tokens=6, judge="likelihood")
    base_model = copy.deepcopy(model)
    model = _perturbed_adapter(model, cfg, "lik")  # the policy differs from the base: the judge must read the base
    pool = mae.QuestionPool.from_problems(seeds)
    out = mae.iteration(model, tok, torch.optim.SGD([torch.zeros(1)], lr=0.0), pool, cfg, 0)
    v, row = out["verified"], out["row"]
    questions = mae_trace.solved_seed_questions({"pool": pool.items, "rows": [row]}, cfg)[0]
    answer = {p.question: p.answer for p in seeds}
    replies = [f"The answer is {answer[q] + k % 2}." for k, q in enumerate(x for x in questions for _ in range(2))]
    expected = mae_likelihood.scores(base_model, tok, [q for q in questions for _ in range(2)], replies)
    assert [x["score"] for x in v] == pytest.approx(expected, abs=1e-6) and len(set(expected)) > 1
    assert row["judgments"] == cfg.proposals - row["no_question"]  # the prompted judge rates questions only
    with pytest.raises(ValueError, match="judge='likelihood' needs score_answers"):
        mae.collect(mae.sampler(model, tok, cfg), mae.QuestionPool.from_problems(seeds), cfg, 0)
    assert mae.run_key("m", seeds, cfg) != mae.run_key("m", seeds, dataclasses.replace(cfg, judge="self"))


# ---- the SFT baseline --------------------------------------------------------------------------------------------

def test_sft_examples_are_the_solver_prompt_and_the_worked_solution():
    problems, shots = tasks.make_level("2d-1step-add", 3), tasks.worked_examples("2d-1step-add", 2)
    ex = mae_sft.examples(problems, shots)
    assert [c for _, c in ex] == [p.solution for p in problems] and ex[0][0] == mae.solve_prompt(problems[0].question, shots)
    assert ex[0][1].endswith(f"The answer is {problems[0].answer}.")


def test_sft_trains_a_fresh_adapter_and_its_loss_falls():
    model, tok = models.tiny_model(seed=0)
    problems = tasks.make_level("1d-1step-add", 8)
    cfg = mae_sft.sft_config(lr=1e-2, epochs=3, seed=0, batch_size=4)
    model, rows = mae_sft.train(model, tok, "sft", problems, (), cfg, lora_r=4)
    assert len(rows) == 6 and rows[-1]["loss"] < rows[0]["loss"]
    assert any(float(w.detach().abs().sum()) > 0 for n, w in loop.trainable(model).items() if "lora_B" in n)
    assert mae_sft.loss_signal(rows, n_boot=200)["change"] > 0
    with pytest.raises(ValueError, match="epochs=0"):
        mae_sft.sft_config(lr=1e-2, epochs=0, seed=0)


def test_the_sft_arm_of_a_training_seed_trains_its_adapter_and_answers_the_heldout_with_the_notebooks_settings():
    """mae_sft.run_arm: the adapter sft_seed<seed> (rank params.lora_r) trained as mae_sft.train trains it, then the
    held-out answers with params' reply length, batch and seed."""
    from types import SimpleNamespace

    from replication.papers.mae import mae_eval

    problems, heldout = tasks.make_level("1d-1step-add", 8), tasks.make_level("1d-1step-add", 3, seed=5)
    P = SimpleNamespace(lora_r=4, eval_tokens=6, batch_size=4, seed=3)
    cfg = mae_sft.sft_config(lr=1e-2, epochs=1, seed=2, batch_size=4)
    model, tok = models.tiny_model(seed=0)
    out = mae_sft.run_arm(model, tok, P, cfg, problems, (), heldout)
    assert "sft_seed2" in model.peft_config and model.peft_config["sft_seed2"].r == 4
    again, tok2 = models.tiny_model(seed=0)
    again, rows = mae_sft.train(again, tok2, "sft_seed2", problems, (), cfg, 4)
    table = mae_eval.heldout_answers(again, tok2, heldout, (), 6, 4, 3)
    assert [r["loss"] for r in out["rows"]] == [r["loss"] for r in rows]
    assert out["table"] == table.to_dict("records") and len(out["table"]) == 3


def test_sft_record_reads_the_loss_fall_as_its_health_signal():
    table = pd.DataFrame({"qid": ["a", "b", "c", "d"], "correct": [True, True, False, True], "format": [True] * 4,
                          "tokens": [12] * 4})
    base = table.assign(correct=[True, False, False, True])
    falling = [{"loss": x} for x in (2.0, 1.8, 1.5, 1.0, 0.6, 0.4)]
    rec = mae_sft.record("sft", falling, table, base, n_examples=48, n_boot=200)
    assert rec["healthy"] and (rec["steps"], rec["samples"]) == (6, 48) and rec["accuracy"] == 0.75
    flat = mae_sft.record("sft", [{"loss": 1.0}] * 6, table, base, n_examples=48, n_boot=200)
    assert flat["failed_checks"] == ["learned"] and flat["health"]["signal"]["signal"] == "training loss fall"


# ---- the quality filter's signal ---------------------------------------------------------------------------------

def test_question_corpus_degrades_each_problem_three_ways():
    problems = tasks.make_level("2d-1step-add", 5)
    corpus = mae_filter.question_corpus(problems, seed=0)
    assert len(corpus) == 20 and corpus.groupby("problem").size().eq(4).all()
    assert list(corpus["kind"].unique()) == ["well_posed", *mae_filter.DEGRADATIONS]
    for p, g in zip(problems, (corpus[corpus["problem"] == p.id].set_index("kind") for p in problems)):
        assert g.loc["well_posed", "question"] == p.question and g.loc["well_posed", "well_posed"]
        start = int(p.question.split(" has ")[1].split()[0])
        assert "has some" in g.loc["unsolvable", "question"] and f"has {start} " not in g.loc["unsolvable", "question"]
        given = int(g.loc["contradictory", "question"].split("gives away ")[1].split()[0])
        assert given > p.answer >= start  # more given away than there ever was
        assert sorted(g.loc["shuffled", "question"].rstrip("?").split()) == sorted(p.question.replace("?", "").replace(".", "").split())
    assert corpus.equals(mae_filter.question_corpus(problems, seed=0))


def _rated(quality_good, quality_bad, n=10):
    rows = []
    for i in range(n):
        rows.append({"problem": f"p{i}", "kind": "well_posed", "well_posed": True, "quality": quality_good})
        rows += [{"problem": f"p{i}", "kind": k, "well_posed": False, "quality": quality_bad} for k in mae_filter.DEGRADATIONS]
    df = pd.DataFrame(rows)
    return df.assign(passes=df["quality"].map(mae.passes_filter))


def test_filter_signal_reads_the_pass_gap_and_the_auc():
    sharp = mae_filter.signal([_rated(0.9, 0.2), _rated(0.8, 0.1)], n_boot=200)
    assert sharp["gap"] == 1.0 and sharp["auc"] == 1.0 and sharp["n"] == "2 seeds x 10 problems"
    assert sharp["pass_well_posed"] == [1.0, 1.0] and sharp["pass_degraded"] == [0.0, 0.0]
    blind = mae_filter.signal([_rated(0.9, 0.9)] * 2, n_boot=200)  # a judge that passes everything: no signal
    assert blind["gap"] == 0.0 and blind["auc"] == 0.5 and blind["pass_degraded"] == [1.0, 1.0]
    assert verdicts.verdict(interval=blind["gap_ci95"], seed_differences=blind["gap_per_judge"]) == "inconclusive"
    assert verdicts.verdict(interval=[0.2, 0.6], seed_differences=sharp["gap_per_judge"]) == "reproduced"


def test_rate_questions_as_the_loop_judges_them(tiny):
    model, tok = tiny
    corpus = mae_filter.question_corpus(tasks.make_level("1d-1step-add", 2))
    rated = mae_filter.rate_questions(model, tok, corpus, mae.MAEConfig(judge_tokens=4), batch_size=4)
    assert all(t.startswith(mae.SCORE_PREFILL) for t in rated["judgment"]) and rated["quality"].between(0, 1).all()
    assert rated["passes"].tolist() == [mae.passes_filter(q) for q in rated["quality"]]


# ---- the trace of the loop's seed-question samples ---------------------------------------------------------------

def test_replayed_draws_are_the_questions_the_loop_solved(monkeypatch, tmp_path):
    """solved_seed_questions replays mae.collect's pool draws: the seed questions in every solver batch the loop
    sampled, in order, and as many as its verified answers; keep=None keeps every iteration's checkpoint."""
    seeds = tasks.make_level("1d-1step-add", 6)
    seen, real = [], mae._generate

    def generate(model, tok, prompts, *args, **kw):
        users = [p if isinstance(p, str) else p[-1]["content"] for p in prompts]
        if all(tasks.INSTRUCTION in u and "Grade this" not in u for u in users):
            seen.append([u.split("\n")[0] for u in users])
        return real(model, tok, prompts, *args, **kw)

    monkeypatch.setattr(mae, "_generate", generate)
    model, tok = models.tiny_model(seed=0)
    cfg = mae.MAEConfig(iterations=3, proposals=3, n_solve=2, pool_solve=4, question_tokens=10, answer_tokens=6,
                        judge_tokens=6, lr=1e-2, score_rule="last_number")
    model, out = mae.run_arm(model, tok, "trace", seeds, cfg, loop.RunFolder(tmp_path / "run"), progress=False, keep=None)
    replayed = mae_trace.solved_seed_questions(out, cfg)
    known = {p.question for p in seeds}
    assert replayed == [[q for q in batch if q in known] for batch in seen]
    assert [len(q) * cfg.n_solve for q in replayed] == [r["seed_answers"] for r in out["rows"]]
    assert mae_trace.has_every_checkpoint(tmp_path / "run", 3) and sorted(mae_trace.checkpoints(tmp_path / "run")) == [1, 2, 3]
    timed = [{**r, "generation_s": r.get("generation_s", 0) + 1.0} for r in out["rows"]]  # wall times aside: the same run
    assert mae_trace.same_rows(timed, out["rows"]) and not mae_trace.same_rows(out["rows"][:-1], out["rows"])
    assert not mae_trace.same_rows([{**out["rows"][0], "loss": -1.0}, *out["rows"][1:]], out["rows"])
    rates = pd.DataFrame({"question": [p.question for p in seeds], "rate": np.linspace(0, 1, 6)})
    table = mae_trace.against_base(out, cfg, rates)
    rate = rates.set_index("question")["rate"]
    assert table["base_same_questions"].tolist() == pytest.approx([rate.loc[q].mean() for q in replayed])
    assert table["difference"].tolist() == pytest.approx((table["loop"] - table["base_same_questions"]).tolist())
    # a trace of every iteration's adapter: iteration 0 is the base model, the last is the final adapter
    final = {k: w.clone() for k, w in loop.trainable(model).items()}
    problems = seeds[:2]
    tr = mae_trace.trace(model, tok, tmp_path / "run", problems, (), 6, 0.7, batch_size=4)
    assert sorted(tr["iteration"].unique()) == [0, 1, 2, 3] and len(tr) == 4 * 2 * len(problems)
    assert all(torch.equal(final[k], w) for k, w in loop.trainable(model).items())
    with model.disable_adapter():
        base = tasks.evaluate(model, tok, problems, 6, 4, prompts=[mae.solve_prompt(p.question) for p in problems], progress=False)
    assert tr[(tr["iteration"] == 0) & (tr["decoding"] == "greedy")]["correct"].tolist() == base["correct"].tolist()
    with pytest.raises(ValueError, match="does not match"):
        mae_trace.against_base({**out, "verified": out["verified"][1:]}, cfg, rates)


# ---- arm runs side by side ---------------------------------------------------------------------------------------

def test_arm_runs_side_by_side_equal_the_runs_made_here_at_one_thread(tmp_path):
    """run_arms with workers=2 trains each run in a spawned worker on a freshly loaded model (here the tiny model saved
    as a checkpoint folder) and reads it back onto the notebook's model: the same rows and adapter weights as the
    runs made one after another in this process at one thread, on a model that already carries other adapters."""
    from replication.core import phases

    model, tok = models.tiny_model(seed=0)
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    seeds = tasks.make_level("1d-1step-add", 6)
    cfgs = [mae.MAEConfig(iterations=2, proposals=2, n_solve=2, pool_solve=2, question_tokens=8, answer_tokens=6,
                          judge_tokens=6, lr=1e-2, score_rule="last_number", seed=s) for s in (0, 1, 0)]
    names = ["one", "two", "three"]

    def runs(base):
        return [(n, seeds, c, loop.RunFolder(base / n)) for n, c in zip(names, cfgs)]

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        here, tok_here = models.load_model(str(tmp_path / "ckpt"))
        here, sequential = mae_runs.run_arms(here, tok_here, str(tmp_path / "ckpt"), runs(tmp_path / "one"), workers=1)
    finally:
        torch.set_num_threads(before)
    phases.reset()
    there, tok_there = models.load_model(str(tmp_path / "ckpt"))
    there, parallel_ = mae_runs.run_arms(there, tok_there, str(tmp_path / "ckpt"), runs(tmp_path / "two"), workers=2)
    assert phases.reused_profile()["entries"] == 0   # read back, not reused: the workers made them in this call
    for a, b in zip(sequential, parallel_):
        assert json.dumps(_untimed(a["rows"])) == json.dumps(_untimed(b["rows"])) and a["pool"] == b["pool"]
    assert json.dumps(_untimed(sequential[0]["rows"])) != json.dumps(_untimed(sequential[1]["rows"]))   # seeds differ
    for n in names:
        here.set_adapter(n)
        there.set_adapter(n)
        wa, wb = loop.trainable(here), loop.trainable(there)
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    again, tok_again = models.load_model(str(tmp_path / "ckpt"))
    phases.reset()
    phases.new_execution()   # a later execution of the notebook
    mae_runs.run_arms(again, tok_again, str(tmp_path / "ckpt"), runs(tmp_path / "two"), workers=2)   # a rerun: all cached
    assert phases.reused_profile()["entries"] == 3
    with pytest.raises(ValueError, match="workers=0"):
        mae_runs.run_arms(again, tok_again, "m", [], workers=0)


def _untimed(rows):
    return [{k: v for k, v in r.items() if not k.endswith("_s")} for r in rows]
