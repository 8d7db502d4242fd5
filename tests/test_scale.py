"""The TRL path (replication.scale) against the workbook's own rewards, advantages and loss on one batch of the tiny
model, and `python -m replication train` on one process and on two (gloo)."""
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from replication.core import config
from replication.lm import elo, grpo, models, tasks, training
from replication.papers.elo_evolve import evolve, judging
from replication.papers.rlpr import answers, rlpr, rlpr_training

trl = pytest.importorskip("trl")
trl_grpo = pytest.importorskip("replication.scale.trl_grpo")
G, TOKENS, SEED = 4, 8, 0
ELO_SEED = 4  # its opponents of the three prompts: right, long wrong, right (mixed outcomes)


def same_length(items, key, n):
    """n items whose key has the most common length (equal-length prompts: no padding, which TRL and the workbook
    position differently)."""
    length = Counter(len(key(x)) for x in items).most_common(1)[0][0]
    out = [x for x in items if len(key(x)) == length][:n]
    assert len(out) == n
    return out


def trainer_for(reward, ds, out, loss_type="grpo", beta=0.04, cls=None, **kw):
    """A TRL trainer on the tiny model, its LoRA weights moved off zero (so the policy differs from the reference)."""
    from datasets import Dataset
    from peft import LoraConfig

    model, tok = models.tiny_model(seed=SEED)
    args = trl.GRPOConfig(output_dir=str(out), per_device_train_batch_size=len(ds["prompt"]) * G,
                          num_generations=G, max_completion_length=TOKENS, beta=beta, loss_type=loss_type,
                          learning_rate=1e-3, temperature=1.0, use_cpu=True, report_to="none", seed=SEED,
                          save_strategy="no", disable_tqdm=True, bf16=False)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=list(models.LORA_TARGETS), task_type="CAUSAL_LM")
    trainer = (cls or trl.GRPOTrainer)(model=model, reward_funcs=[reward], args=args, train_dataset=Dataset.from_dict(ds),
                                       processing_class=tok, peft_config=lora, **kw)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    trainer.current_gradient_accumulation_steps = 1
    return trainer, tok


def one_batch(trainer, ds, seed=0):
    """TRL's rollout of every prompt G times (RepeatSampler's order) and its loss: (outputs, texts, loss)."""
    rows = [{k: ds[k][i] for k in ds} for i in range(len(ds["prompt"])) for _ in range(G)]
    torch.manual_seed(seed)
    trainer.model.train()
    out = trainer._generate_and_score_completions(rows)
    loss = trainer.compute_loss(trainer.model, out)
    texts = trainer.processing_class.batch_decode(out["completion_ids"], skip_special_tokens=True)
    return out, texts, loss


def workbook_loss(trainer, out, advantages, rows=None, loss_type="grpo", beta=0.04):
    """grpo.grpo_loss on the same tokens, log-probs by training.grouped_logps, the reference with adapters off."""
    model = trainer.model
    rows = slice(None) if rows is None else rows
    p, pm, c, cm = (out[k][rows] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask"))
    logps = training.grouped_logps(model, p, pm, c, cm, G, 1.0)
    with torch.no_grad(), model.disable_adapter():
        ref = training.grouped_logps(model, p, pm, c, cm, G, 1.0)
    loss, _ = grpo.grpo_loss(logps, logps.detach(), ref, advantages, cm, beta, 0.2, 0.2, loss_type, TOKENS, True)
    return loss


def elo_setup():
    problems = same_length(tasks.make_level("1d-1step-add", 40, seed=SEED), lambda p: p.question, 3)
    pool = {"right": [f"The answer is {p.answer}." for p in problems], "short wrong": ["0"] * 3,
            "long wrong": ["Let me think about it: the answer is 1."] * 3}
    ratings = [1350.0, 1600.0, 1100.0]
    reward = trl_grpo.EloReward(judging.QualityJudge(sigma_comp=3.0), pool, ratings, temperature=300.0, k=32.0, update_rule="mean",
                             start_rating=1350.0, length_margin=0, seed=ELO_SEED)
    ds = {"prompt": [trl_grpo.chat(p.prompt()) for p in problems], "index": [0, 1, 2],
          "question": [p.question for p in problems], "answer": [p.answer for p in problems]}
    return problems, pool, ratings, reward, ds


def test_elo_evolve_rewards_advantages_loss_and_rating_match_the_workbook(tmp_path):
    problems, pool, ratings, reward, ds = elo_setup()
    trainer, tok = trainer_for(reward, ds, tmp_path)
    out, texts, loss = one_batch(trainer, ds)
    got = torch.tensor(trainer._logs["rewards"]["elo_evolve"])
    opponents = list(trainer._logs["extra"]["opponent"])
    # the workbook's reward: evolve.Arena with the same opponents and the judge's noise seeded alike
    arena = evolve.Arena(judging.QualityJudge(sigma_comp=3.0), "elo", length_margin=0)
    arena.rng = np.random.default_rng(config.derive_seed(ELO_SEED, "judge", 0, 0))
    meta = [{"question": problems[j].question, "answer": problems[j].answer,
             "opponent_response": pool[o][j]} for j, o in zip(np.repeat(range(3), G), opponents)]
    want = torch.tensor(arena(None, texts, meta), dtype=torch.float32)
    assert got.std() > 0, "the batch must hold mixed outcomes"
    assert torch.allclose(got, want, atol=1e-6, rtol=0)
    adv, _ = grpo.group_advantages(want, G)
    assert adv.abs().sum() > 0
    assert torch.allclose(out["advantages"], adv, atol=1e-6, rtol=0)
    ours = workbook_loss(trainer, out, adv)
    assert abs(float(loss.detach()) - float(ours.detach())) < 1e-6 and abs(float(loss.detach())) > 1e-4
    # one rating update over the step's matches, as evolve.train makes it
    opp_r = np.array(ratings)[[list(pool).index(o) for o in opponents]]
    assert reward.rating == pytest.approx(elo.update(1350.0, want.numpy(), opp_r, 32.0, "mean"), abs=1e-9)
    assert reward.rating != 1350.0


def test_elo_opponents_follow_the_temperature_rule_and_state_round_trips():
    _, pool, ratings, reward, _ = elo_setup()
    p = elo.sampling_probs(1350.0, ratings, 300.0)
    assert p.min() > 0.1
    assert np.allclose(reward.probs(), p)
    draws = np.bincount(reward.opponents(range(4000), step=3), minlength=3) / 4000
    assert np.abs(draws - p).max() < 0.03
    assert reward.opponents([5, 5, 7], 3) == reward.opponents([5, 5, 7], 3) and \
        reward.opponents([5], 3)[0] == reward.opponents([5, 7], 3)[0]
    reward.rating, reward.calls = 1402.5, 7
    other = trl_grpo.EloReward(judging.QualityJudge(), pool, ratings, 100.0)
    other.load_state_dict(json.loads(json.dumps(reward.state_dict())))
    assert (other.rating, other.calls) == (1402.5, 7)
    with pytest.raises(ValueError, match="update_rule"):
        trl_grpo.EloReward(judging.QualityJudge(), pool, ratings, update_rule="max")


def rlpr_setup(model, tok):
    qs = answers.make_questions(40, 0, seed=SEED, n_heldout=0)["train"]
    qs = same_length(qs, lambda q: q.question, 3)
    base = rlpr.baseline_probs(model, tok, [q.prompt() for q in qs], [q.reference for q in qs])
    ds = {"prompt": [trl_grpo.chat(q.prompt()) for q in qs], "id": [q.id for q in qs],
          "reference": [q.reference for q in qs], "aliases": [list(q.aliases) for q in qs],
          "value": [q.value for q in qs]}
    return qs, {q.id: p for q, p in zip(qs, base)}, ds


@pytest.mark.parametrize("drop", [False, True])
def test_rlpr_rewards_filter_advantages_and_loss_match_the_workbook(drop, tmp_path):
    model, tok = models.tiny_model(seed=SEED)
    qs, table, ds = rlpr_setup(model, tok)
    reward = rlpr.Reward(None, tok, "probability", baseline=table, format_weight=0.1)
    filt = rlpr_training.StdFilter(factor=0.5, ratio=0.99, warmup_start=0, warmup_end=1)
    trainer, _ = trainer_for(trl_grpo.RLPRReward(reward), ds, tmp_path, loss_type="bnpo", cls=trl_grpo.RLPRTrainer, std_filter=filt)
    # the tiny random model never states an answer (reward 0): its decoded replies end with one, in both paths
    decode = trainer.processing_class.batch_decode
    trainer.processing_class.batch_decode = lambda *a, **k: [t + " The answer is 5." for t in decode(*a, **k)]
    if drop:  # a threshold between the groups' stds, from a first look at the same (seeded) rollout
        first, _, _ = one_batch(trainer, ds)
        stds = np.sort(torch.tensor(trainer._logs["rewards"]["rlpr"]).view(-1, G).std(1).numpy())
        filt.load({"ema": float(stds[0] + stds[1]) / 2 / 0.5})
        trainer._logs["rewards"]["rlpr"].clear()
    threshold = filt.threshold
    out, texts, loss = one_batch(trainer, ds)
    # the workbook's reward, scored by the same policy, and its filter
    meta = [q.meta() for q in qs for _ in range(G)]
    want = torch.tensor(rlpr.Reward(trainer.model, tok, "probability", baseline=table, format_weight=0.1)(
        [q.prompt() for q in qs for _ in range(G)], texts, meta), dtype=torch.float32)
    keep = rlpr_training.StdFilter(0.5, 0.99, 0, 1)
    keep.load({"ema": None if threshold is None else threshold / 0.5})
    kept = keep.keep(want.view(-1, G).std(1).numpy())
    assert kept.sum() == (2 if drop else 3) and (want.view(-1, G).std(1) > 0).sum() >= 2
    got = torch.tensor(trainer._logs["rewards"]["rlpr"])
    rows = torch.from_numpy(kept).repeat_interleave(G)
    assert torch.isnan(got[~rows]).all() and torch.allclose(got[rows], want[rows], atol=1e-6, rtol=0)
    adv, _ = grpo.group_advantages(want[rows], G)
    assert torch.allclose(out["advantages"][rows], adv, atol=1e-6, rtol=0) and (out["advantages"][~rows] == 0).all()
    assert (out["completion_mask"][~rows] == 0).all()
    ours = workbook_loss(trainer, out, adv, rows=rows, loss_type="bnpo")
    assert abs(float(loss.detach()) - float(ours.detach())) < 1e-6 and abs(float(loss.detach())) > 1e-4
    assert filt.ema is not None and trainer.state_dict()["filter"]["ema"] == filt.ema


def test_bad_config_names_the_parameter(tmp_path):
    from replication.scale import configs

    path = tmp_path / "c.yaml"
    for text, name in (("trl: {learning_rat: 1.0}", "trl.learning_rat"), ("elo-evolve: {temp: 1}", "elo-evolve.temp"),
                       ("optimizer: {}", "config section"), ("rlpr: {}", "config section"),
                       ("lora: {rank: 8}", "lora.rank"), ("elo-evolve: {judge: oracle}", "elo-evolve.judge")):
        path.write_text(text)
        with pytest.raises(ValueError, match=name.replace(".", r"\.")):
            configs.read_config("elo-evolve", path)
    with pytest.raises(ValueError, match="method"):
        configs.read_config("ppo", path)
    path.write_text("rlpr: {baseline: fixed}")
    with pytest.raises(ValueError, match=r"rlpr\.baseline"):
        configs.read_config("rlpr", path)


def test_resume_refuses_a_run_started_with_other_settings(tmp_path, capsys):
    """resume=true carries on only the run output_dir was started with: other settings are one line naming them,
    before any model is built; a longer run (trl.max_steps) or other saving may resume; resume=false starts over."""
    from replication.scale import configs, train

    out = tmp_path / "run"
    cfg = (config.ROOT / "configs" / "tiny" / "rlpr.yaml").read_text().replace("runs/scale/tiny-rlpr", str(out))
    (tmp_path / "tiny.yaml").write_text(cfg)
    args = ["rlpr", "--config", str(tmp_path / "tiny.yaml")]
    started = configs.read_config("rlpr", tmp_path / "tiny.yaml")
    train.start(started)  # what a first run records
    assert train.changed_settings(out, started) == []
    longer = configs.read_config("rlpr", tmp_path / "tiny.yaml", ["resume=true", "trl.max_steps=9"])
    assert train.changed_settings(out, longer) == []
    assert train.main(args + ["--set=resume=true", "--set=seed=1", "--set=lora.r=2"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "resume=true is not allowed" in err and "(lora.r, seed)" in err
    assert train.changed_settings(tmp_path / "empty", started) == [], "nothing recorded: nothing to compare"
    assert not (tmp_path / "empty").exists()


@pytest.mark.parametrize("method", ["elo-evolve", "rlpr"])
def test_paper_configs_hold_the_papers_settings(method, tmp_path):
    from replication.scale import configs

    path = config.ROOT / "configs" / "paper" / f"{method.replace('-', '_')}.yaml"
    cfg = configs.read_config(method, path, ["trl.gradient_accumulation_steps=64"])
    t = cfg["trl"]
    assert t["gradient_accumulation_steps"] == 64 and t["num_generations"] == 8 and t["learning_rate"] == 1e-6
    if method == "elo-evolve":
        assert (t["beta"], t["max_completion_length"], cfg[method]["k"], cfg[method]["length_margin"]) == (0.001, 4096, 32.0, 300)
        assert sorted(cfg[method]["ratings"].values()) == [1400, 1700, 2000]
    else:
        assert (t["beta"], t["epsilon_high"], cfg[method]["format_weight"], cfg[method]["baseline"]) == (0.0, 0.27, 0.1, "initial")
    with pytest.raises(ValueError, match="--set"):
        configs.read_config(method, path, ["trl.beta"])


def run(cmd, method, out, tmp_path, sets=()):
    """Run the train command on the method's tiny config with output_dir `out` and --set overrides; (seconds,
    rank records)."""
    name = method.replace("-", "_")
    cfg = (config.ROOT / "configs" / "tiny" / f"{name}.yaml").read_text().replace(f"runs/scale/tiny-{method}", str(out))
    (tmp_path / "tiny.yaml").write_text(cfg)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(config.ROOT)}
    t0 = time.perf_counter()
    done = subprocess.run(cmd + ["-m", "replication", "train", method, "--config", str(tmp_path / "tiny.yaml"),
                                 *[f"--set={x}" for x in sets]],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return time.perf_counter() - t0, [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


PART = {"elo-evolve": "elo", "rlpr": "rlpr", "mae": "mae"}


@pytest.mark.parametrize("method", list(PART))
def test_train_command_runs_two_steps_on_one_process(method, tmp_path):
    _, records = run([sys.executable], method, tmp_path / "one", tmp_path)
    assert len(records) == 1 and records[0]["steps"] == 2
    assert [p.name for p in (tmp_path / "one").glob("checkpoint-*")] == ["checkpoint-2"]
    saved = json.loads((tmp_path / "one" / "checkpoint-2" / trl_grpo.STATE_FILE).read_text())
    assert saved[PART[method]] == records[0]["state"][PART[method]]
    if method == "elo-evolve":
        assert records[0]["state"]["elo"]["calls"] == 2
        # resumed from checkpoint-2 for two more steps: the rating carries on from the checkpoint's
        _, again = run([sys.executable], method, tmp_path / "one", tmp_path,
                       ["resume=true", "trl.max_steps=4", "trl.save_steps=4"])
        assert again[0]["steps"] == 4 and again[0]["state"]["elo"]["calls"] == 4
        rows = [r for r in again[0]["log"] if "elo/rating" in r]  # the checkpoint's two rows, then two more
        assert len(rows) == 4 and rows[1]["elo/rating"] == pytest.approx(records[0]["state"]["elo"]["rating"])
    elif method == "rlpr":
        assert records[0]["state"]["rlpr"]["filter"]["ema"] is not None
    else:  # two iterations on the seed pool (the tiny model's proposals are no questions: the pool stays the seeds)
        assert records[0]["state"]["mae"]["iterations"] == 2 and len(records[0]["state"]["mae"]["pool"]) == 8


@pytest.mark.parametrize("method", list(PART))
def test_train_command_on_two_processes_agrees_across_ranks(method, tmp_path):
    """accelerate launch on two CPU processes (gloo): each rank sees other prompts, and the adapter, the reward's or
    filter's state (MAE: the question pool) and the checkpoint agree. (accelerate 1.15's --cpu starts one process
    without an MPI hostfile; --multi_gpu on a machine without GPUs starts two on gloo.) The tiny model never states an
    answer or writes a tag, so RLPR's and MAE's rewards are constant and their steps move nothing; Elo-Evolve's do."""
    accelerate = str(Path(sys.executable).parent / "accelerate")
    seconds, records = run([accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                            "--mixed_precision", "no", "--dynamo_backend", "no"], method, tmp_path / "two", tmp_path)
    assert [r["process"] for r in records] == [0, 1] and {r["processes"] for r in records} == {2}
    assert {r["backend"] for r in records} == {"gloo"}
    if method != "mae":  # MAE draws its questions from the pool (with replacement), not from TRL's sampler
        assert records[0]["seen"] and records[1]["seen"] and not set(records[0]["seen"]) & set(records[1]["seen"])
    assert records[0]["adapter_sha256"] == records[1]["adapter_sha256"]
    assert records[0]["state"] == records[1]["state"]
    assert [p.name for p in (tmp_path / "two").glob("checkpoint-*")] == ["checkpoint-2"]
    if method == "elo-evolve":
        assert records[0]["state"]["elo"]["calls"] == 2
        assert any(row.get("grad_norm", 0) > 0 for row in records[0]["log"]), "the steps must move the adapter"
    print(f"two-process {method} run: {seconds:.1f} s")


def test_missing_pool_file_is_made_from_the_opponent_models(tmp_path):
    from replication.scale import configs, train

    path, pool = tmp_path / "c.yaml", tmp_path / "pool.json"
    text = ("model: tiny\ndata: {{level: 1d-1step-add, n_train: 3}}\ntrl: {{temperature: 1.0}}\nelo-evolve: {{pool_file: "
            f"{pool}, pool_tokens: 4, ratings: {{{{a: 1400, b: 1600}}}}, opponent_models: {{{{a: tiny{{}}}}}}}}}}")
    path.write_text(text.format(""))
    cfg = configs.read_config("elo-evolve", path)
    with pytest.raises(ValueError, match=r"elo-evolve\.opponent_models.*missing: b"):
        train.elo_pieces(cfg, *reversed(train.load(cfg)))
    path.write_text(text.format(", b: tiny"))
    cfg = configs.read_config("elo-evolve", path)
    _, reward, _ = train.elo_pieces(cfg, *reversed(train.load(cfg)))
    made = json.loads(pool.read_text())
    assert sorted(made) == ["a", "b"] and all(len(v) == 3 and all(isinstance(x, str) for x in v) for v in made.values())
    assert reward.pool == made and list(reward.ratings) == [1400.0, 1600.0]
    assert json.loads(train.pool_key_file(pool).read_text()) == train.pool_key(cfg)
    # made with other settings (the problems' seed): made again, not read stale
    pool.write_text(json.dumps({"a": ["x"] * 3, "b": ["y"] * 3}))
    assert train.elo_pieces(cfg, *reversed(train.load(cfg)))[1].pool["a"] == ["x"] * 3   # the same settings: read
    other = {**cfg, "seed": 1}
    assert train.pool_made_for_other(pool, other)
    assert train.elo_pieces(other, *reversed(train.load(other)))[1].pool["a"] != ["x"] * 3
    assert json.loads(train.pool_key_file(pool).read_text())["seed"] == 1
    train.pool_key_file(pool).unlink()   # a file without a key file is the user's: read as it is
    pool.write_text(json.dumps({"a": ["x"] * 3, "b": ["y"] * 3}))
    assert train.elo_pieces(cfg, *reversed(train.load(cfg)))[1].pool["a"] == ["x"] * 3


@pytest.mark.parametrize("method", ["elo-evolve", "rlpr", "mae", "malt"])
def test_each_paper_config_matches_its_notebooks_paper_profile_and_is_named_there(method):
    """The notebook's paper profile and the paper config name the same model and learning rate, and the notebook
    says which command runs its experiment at the paper's scale."""
    import nbformat

    from replication.run import runner
    from replication.core import params
    from replication.scale import configs

    stem = configs.NOTEBOOKS[method]
    path = f"configs/paper/{method.replace('-', '_')}.yaml"
    cfg = configs.read_config(method, config.ROOT / path)
    profile = {**params.cell_values(runner.NOTEBOOKS / f"{stem}.ipynb"), **params.profile_values(stem, "paper", runner.NOTEBOOKS)}
    assert cfg["model"] == profile["model"]
    lr = {"malt": ("dpo", "dpo_lr")}.get(method, ("trl", "lr"))
    assert cfg[lr[0]]["learning_rate"] == profile[lr[1]]
    nb = nbformat.read(runner.NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    text = "".join(c.source for c in nb.cells if c.cell_type == "markdown")
    assert f"python -m replication train {method} --config {path}" in text
