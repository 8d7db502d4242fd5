"""The yardstick's pieces: worked examples, few-shot chat turns, the curve table and the sweep's pick."""
import numpy as np
import pandas as pd
import pytest

from replication.core import files, stats
from replication.lm import arms, grpo, tasks
from replication.setup import yardstick


@pytest.mark.parametrize("level", list(tasks.LEVELS))
def test_worked_example_solutions_are_right(level):
    for p in tasks.worked_examples(level, 5, seed=3):
        assert p.solution.endswith(f"The answer is {p.answer}.")
        assert tasks.verify(p.solution, p.answer, strict=True)
        for eq in p.solution.split(". ")[:-1]:                      # every "a op b = c" line holds
            lhs, rhs = eq.rstrip(".").split(" = ")
            assert eval(lhs) == int(rhs)


def test_chat_turns_put_examples_first():
    shots = tasks.worked_examples("1d-1step-add", 2, seed=0)
    q = tasks.make_level("1d-1step-add", 1, seed=1)[0]
    turns = q.chat(shots)
    assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant", "user"]
    assert turns[1]["content"] == shots[0].solution and turns[-1]["content"] == q.prompt()
    assert q.chat(()) == q.prompt()


def row(step, correct):
    return {"step": step, "eval_correct": correct, "eval_strict_correct": correct, "eval_format": 1.0, "eval_tokens": 10.0}


BASE = {k: v for k, v in row(None, [0] * 100 + [1] * 100).items() if k != "step"}


def test_gain_table_and_steps_to_gain_one_seed():
    rows = [{"reward_mean": 0.5, "step": 0}, row(1, [1] * 10 + [0] * 95 + [1] * 95), row(3, [0] * 20 + [1] * 180)]
    table = yardstick.gain_table(BASE, [rows], n_boot=500, seed=0)
    assert table["step"].tolist() == [0, 2, 4] and table["seeds"].tolist() == [1, 1, 1]
    assert table["accuracy"].tolist() == [0.5, 0.525, 0.9]
    assert table["gain_low"].iloc[1] < 0 < table["gain_low"].iloc[2]          # +0.025 is not resolvable, +0.4 is
    assert yardstick.steps_to_gain(table) == 4
    assert yardstick.steps_to_gain(table.iloc[:2]) is None


def test_gain_table_interval_covers_the_seeds():
    """Three seeds whose gains are +0.4, +0.05 and -0.2: the mean gain is resolvable within any one seed's problems
    but not over seeds, so the two-level interval holds 0; each seed's gain and accuracy is in the row."""
    gains = {0: [0] * 20 + [1] * 180, 1: [0] * 90 + [1] * 110, 2: [0] * 140 + [1] * 60}
    runs = [[row(1, c)] for c in gains.values()]
    table = yardstick.gain_table(BASE, runs, n_boot=1000, seed=0)
    last = table.iloc[-1]
    assert last["seeds"] == 3 and last["seed_gains"] == pytest.approx([0.4, 0.05, -0.2])
    assert last["seed_accuracy"] == pytest.approx([0.9, 0.55, 0.3]) and last["accuracy"] == pytest.approx(0.5833333)
    assert last["gain_low"] < 0 < last["gain_high"] and last["gain"] == pytest.approx(0.0833333)
    one_level = stats.paired_bootstrap(np.array(gains[0] + gains[1] + gains[2], float), np.array(BASE["eval_correct"] * 3, float), seed=0)
    assert one_level[1] > 0                                                    # pooling the seeds' problems would call it resolved
    with pytest.raises(ValueError, match="same steps"):
        yardstick.gain_table(BASE, [[row(1, gains[0])], [row(3, gains[1])]])


def test_seed_run_keeps_the_first_seeds_key():
    """The notebook's seed gives the one-run workbook's run key (its cached run is reused); another training seed
    changes the GRPO seed (prompt draws, rollout sampling) and the key."""
    key = {"model": "m", "level": "2d-1step-add", "seed": 0}
    cfg = grpo.GRPOConfig(num_generations=8, lr=1e-4, seed=0)
    same, same_key = yardstick.seed_run(key, cfg, 0)
    assert same == cfg and same_key == {**key, "grpo": str(cfg)}
    assert files.digest(same_key) == files.digest({"model": "m", "level": "2d-1step-add", "seed": 0, "grpo": str(cfg)})
    other, other_key = yardstick.seed_run(key, cfg, 1)
    assert other.seed == 1 and other.lr == cfg.lr and other_key["seed"] == 1 and files.digest(other_key) != files.digest(same_key)
    # at notebook seed 0 (every profile's) the later seeds' keys are as they were before the notebook's seed was
    # recorded; at notebook seed 1 its training seed 1 drew other questions, so it must not read seed 0's seed-1 run
    assert other_key == {**key, "seed": 1, "grpo": str(other)}
    moved = {**key, "seed": 1}
    first, first_key = yardstick.seed_run(moved, cfg, 1)
    assert first == other and first_key["data_seed"] == 1 and files.digest(first_key) != files.digest(other_key)


def test_choose_lr_uses_training_reward_only():
    runs = {1e-5: [{"reward_mean": r, "zero_std_frac": 0.5, "completion_len": 10.0} for r in (0.2, 0.2, 0.3)],
            1e-4: [{"reward_mean": r, "zero_std_frac": 0.5, "completion_len": 10.0} for r in (0.2, 0.5, 0.8)]}
    summary = yardstick.sweep_summary(runs)
    assert summary["heldout_accuracy"].isna().all()
    assert yardstick.choose_lr(summary) == 1e-4
    assert isinstance(summary, pd.DataFrame)


def test_summary_over_seeds_health_and_arm_records():
    evals = [row(1, [1] * 10 + [0] * 95 + [1] * 95), row(3, [0] * 20 + [1] * 180)]
    cfg = {"level": "2d-1step-add", "shots": 3, "temperature": 0.7, "lr": 1e-4, "steps": 4, "prompts_per_step": 4,
           "group_size": 8, "eval_every": 2, "seed": 0, "seeds": [0, 1]}
    def steps(rewards, last=evals[1]):  # the step rows, the evaluations on the second and the fourth
        out = [{"reward_mean": r, "zero_std_frac": 0.25, "step": i} for i, r in enumerate(rewards)]
        out[1].update({k: v for k, v in evals[0].items() if k != "step"})
        out[3].update({k: v for k, v in last.items() if k != "step"})
        return out

    runs = [steps(np.linspace(0.1, 0.8, 6)[[0, 2, 4, 5]]), steps([0.1, 0.3, 0.5, 0.7], row(3, [0] * 40 + [1] * 160))]
    gains = yardstick.gain_table(BASE, runs, n_boot=300, seed=0)
    out, records = yardstick.summary(gains, runs, cfg, BASE, n_boot=300)
    assert out["steps_to_gain"] == 4 and out["gain_excludes_0"] and out["final_accuracy"] == pytest.approx(0.85)
    assert out["n"] == "2 seeds x 200 questions" and out["seed_gains"] == pytest.approx([0.4, 0.3])
    assert out["seed_accuracy"] == pytest.approx([0.9, 0.8]) and out["probability_of_improvement"] == 1.0
    assert out["gain"] == pytest.approx([gains["gain"].iloc[-1], gains["gain_low"].iloc[-1], gains["gain_high"].iloc[-1]])
    assert [r["seed"] for r in records] == [0, 1] and out["health"] is None
    assert {k: records[0][k] for k in ("arm", "steps", "samples", "n_heldout", "accuracy", "healthy")} == {
        "arm": "rlvr lr 0.0001", "steps": 4, "samples": 128, "n_heldout": 200, "accuracy": 0.9, "healthy": True}
    assert tuple(records[0])[:len(arms.RECORD_KEYS)] == arms.RECORD_KEYS
    falling = [runs[0], steps([0.8, 0.6, 0.3, 0.2])]
    out, records = yardstick.summary(yardstick.gain_table(BASE, falling, n_boot=300), falling, cfg, BASE, n_boot=300)
    assert records[0]["healthy"] and not records[1]["healthy"] and records[1]["failed_checks"] == ["learned"]
    assert out["health"] == "failed health check: rlvr lr 0.0001 seed 1 (learned)"   # named beside the gain, still measured
    assert out["gain_excludes_0"]


def test_runs_side_by_side_equal_the_runs_made_here_at_one_thread(tmp_path):
    """train_runs with workers=2 trains the unfinished runs in spawned workers on fresh policies (here the tiny model
    saved as a checkpoint folder) and reads each back: the same rows as the runs made here at one thread; a run that
    continues a finished one (the pick's first seed) continues it; a rerun trains nothing."""
    import json

    import torch

    from replication.core import phases
    from replication.lm import loop, models

    model, tok = models.tiny_model(seed=0)
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    train, heldout = tasks.split("1d-1step-add", 6, 3, seed=0)
    schedule = yardstick.Schedule(train, heldout, (), prompts_per_step=2, eval_every=1, batch_size=4)

    def runs(base, steps, seeds):
        return [dict(policy_seed=s, cfg=grpo.GRPOConfig(num_generations=2, max_new_tokens=4, lr=lr, kl_beta=0.0,
                                                        temperature=1.0, seed=s),
                     steps=steps, folder=loop.RunFolder(base / f"lr{lr:g}-s{s}"), schedule=schedule) for lr, s in seeds]

    def untimed(rows):
        return json.dumps([{k: v for k, v in r.items() if not k.endswith("_s")} for r in rows])

    ckpt = str(tmp_path / "ckpt")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    phases.reset()
    try:
        sweep_here = yardstick.train_runs(ckpt, 4, runs(tmp_path / "one", 2, [(1e-3, 0), (1e-2, 0)]))
        seeds_here = yardstick.train_runs(ckpt, 4, runs(tmp_path / "one", 3, [(1e-2, 0), (1e-2, 1)]))
    finally:
        torch.set_num_threads(before)
    # the pick's first seed continues the sweep's run, whose steps this execution trained: no reuse
    assert phases.reused_profile()["entries"] == 0
    phases.reset()
    sweep_there = yardstick.train_runs(ckpt, 4, runs(tmp_path / "two", 2, [(1e-3, 0), (1e-2, 0)]), workers=2)
    seeds_there = yardstick.train_runs(ckpt, 4, runs(tmp_path / "two", 3, [(1e-2, 0), (1e-2, 1)]), workers=2)
    assert phases.reused_profile()["entries"] == 0       # the same in the workers (they share the execution's token)
    for a, b in zip(sweep_here + seeds_here, sweep_there + seeds_there):
        assert untimed(a) == untimed(b)
    assert [len(r) for r in sweep_there + seeds_there] == [2, 2, 3, 3]
    assert untimed(seeds_there[0][:2]) == untimed(sweep_there[1])   # the pick's first seed continues the sweep's run
    assert all("eval_accuracy" in r for r in seeds_there[1])

    def weights(base, name):   # the run's last checkpoint: the adapter it trained from its policy seed's start
        return loop.RunFolder(base / name).latest()

    for name in ("lr0.001-s0", "lr0.01-s0", "lr0.01-s1"):
        a, b = (torch.load(weights(tmp_path / d, name), weights_only=False)["weights"] for d in ("one", "two"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    s0, s1 = (torch.load(weights(tmp_path / "two", n), weights_only=False)["weights"] for n in ("lr0.01-s0", "lr0.01-s1"))
    assert not all(torch.equal(s0[k], s1[k]) for k in s0)            # each seed its own LoRA start
    phases.reset()
    phases.new_execution()   # a later execution of the notebook
    yardstick.train_runs(ckpt, 4, runs(tmp_path / "two", 3, [(1e-2, 0), (1e-2, 1)]), workers=2)   # finished: read only
    assert phases.reused_profile()["entries"] == 2
    with pytest.raises(ValueError, match="workers=0"):
        yardstick.train_runs(ckpt, 4, [], workers=0)


def test_the_grpo_config_is_built_from_the_notebooks_parameters_as_the_run_folders_key_names_it():
    """yardstick.grpo_config: the notebook's group size, reply length, rollout temperature and dtype and seed, the
    given rate, no KL term; its text (part of each run folder's key, seed_run) is that of the config written out."""
    from types import SimpleNamespace

    P = SimpleNamespace(group_size=8, step_tokens=32, rollout_temperature=0.7, rollout_dtype="auto", seed=0)
    cfg = yardstick.grpo_config(P, 1e-4)
    assert str(cfg) == str(grpo.GRPOConfig(num_generations=8, max_new_tokens=32, lr=1e-4, kl_beta=0.0,
                                           temperature=0.7, rollout_dtype="auto", seed=0))
    assert yardstick.seed_run({"seed": 0}, cfg, 2)[0].seed == 2
