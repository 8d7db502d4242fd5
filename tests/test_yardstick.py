"""The yardstick's pieces: worked examples, few-shot chat turns, the curve table and the sweep's pick."""
import numpy as np
import pandas as pd
import pytest

from replication.lm import arms, tasks
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


def test_curve_table_and_steps_to_gain():
    base = row(None, [0] * 100 + [1] * 100)
    base.pop("step")
    rows = [{"reward_mean": 0.5}, row(1, [1] * 10 + [0] * 95 + [1] * 95), row(3, [0] * 20 + [1] * 180)]
    table = yardstick.curve_table(base, [r for r in rows if "eval_correct" in r], seed=0)
    assert table["step"].tolist() == [0, 2, 4]
    assert table["accuracy"].tolist() == [0.5, 0.525, 0.9]
    assert table["gain_low"].iloc[1] < 0 < table["gain_low"].iloc[2]          # +0.025 is not resolvable, +0.4 is
    assert yardstick.steps_to_gain(table) == 4
    assert yardstick.steps_to_gain(table.iloc[:2]) is None


def test_choose_lr_uses_training_reward_only():
    runs = {1e-5: [{"reward_mean": r, "zero_std_frac": 0.5, "completion_len": 10.0} for r in (0.2, 0.2, 0.3)],
            1e-4: [{"reward_mean": r, "zero_std_frac": 0.5, "completion_len": 10.0} for r in (0.2, 0.5, 0.8)]}
    summary = yardstick.sweep_summary(runs)
    assert summary["heldout_accuracy"].isna().all()
    assert yardstick.choose_lr(summary) == 1e-4
    assert isinstance(summary, pd.DataFrame)


def test_summary_health_and_arm_record():
    base = row(None, [0] * 100 + [1] * 100)
    base.pop("step")
    evals = [row(1, [1] * 10 + [0] * 95 + [1] * 95), row(3, [0] * 20 + [1] * 180)]
    curve = yardstick.curve_table(base, evals, seed=0)
    cfg = {"level": "2d-1step-add", "shots": 3, "temperature": 0.7, "lr": 1e-4, "steps": 4, "prompts_per_step": 4,
           "group_size": 8, "eval_every": 2}
    def steps(rewards):  # the step rows, the evaluations on the second and the fourth
        out = [{"reward_mean": r, "zero_std_frac": 0.25, "step": i} for i, r in enumerate(rewards)]
        out[1].update({k: v for k, v in evals[0].items() if k != "step"})
        out[3].update({k: v for k, v in evals[1].items() if k != "step"})
        return out

    out, arm = yardstick.summary(curve, steps(np.linspace(0.1, 0.8, 6)[[0, 2, 4, 5]]), cfg, base, n_boot=200)
    assert out["steps_to_gain"] == 4 and out["gain_excludes_0"] and out["final_accuracy"] == 0.9
    assert {k: arm[k] for k in ("arm", "steps", "samples", "n_heldout", "accuracy", "healthy")} == {
        "arm": "rlvr lr 0.0001", "steps": 4, "samples": 128, "n_heldout": 200, "accuracy": 0.9, "healthy": True}
    assert tuple(arm)[:len(arms.RECORD_KEYS)] == arms.RECORD_KEYS
    falling = yardstick.summary(curve, steps([0.8, 0.6, 0.3, 0.2]), cfg, base, n_boot=200)[1]
    assert not falling["healthy"] and falling["failed_checks"] == ["learned"]
