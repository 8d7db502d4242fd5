"""Independent runs side by side (replication.lm.parallel): the same results as one after another at one thread,
in job order, with a failing job named."""
import pytest
import torch

from replication.lm import grpo, models, parallel

LETTERS = set("abcdefghijklmnopqrstuvwxyz")


def letter_reward(prompts, completions, metadata, **log):
    return [sum(ch in LETTERS for ch in c) / max(len(c), 1) for c in completions]


def tiny_run(seed: int, steps: int = 3) -> dict:
    """A seeded GRPO run on a tiny model (its LoRA init, sampling and updates all from `seed`)."""
    torch.manual_seed(seed)
    model, tok = models.tiny_model(seed=0)
    model = models.add_lora(model, r=8, alpha=16)
    cfg = grpo.GRPOConfig(seed=seed, num_generations=4, max_new_tokens=6, lr=2e-2, kl_beta=0.0)
    trainer = grpo.GRPOTrainer(model, tok, letter_reward, cfg)
    rows = trainer.train(lambda step: (["write", "go"], [{}] * 2), steps, progress=False)
    lora = {k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k}
    return {"rewards": [r["reward_mean"] for r in rows], "threads": torch.get_num_threads(), "lora": lora}


def failing(seed: int):
    if seed == 1:
        raise ValueError(f"seed={seed} is not allowed")
    return seed


def test_parallel_runs_equal_sequential_ones_at_one_thread():
    jobs = [{"seed": s} for s in (0, 1, 2)]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sequential = parallel.run_jobs(tiny_run, jobs, workers=1)
    finally:
        torch.set_num_threads(before)
    side_by_side = parallel.run_jobs(tiny_run, jobs, workers=2)
    assert [r["threads"] for r in side_by_side] == [1, 1, 1]          # each worker keeps to one thread
    for a, b in zip(sequential, side_by_side):                        # the same runs, in job order
        assert a["rewards"] == b["rewards"]
        assert all(torch.equal(a["lora"][k], b["lora"][k]) for k in a["lora"])
    assert sequential[0]["rewards"] != sequential[1]["rewards"]       # the seeds differ: the check can fail


def test_a_failing_job_is_named_and_bad_workers_refused():
    with pytest.raises(RuntimeError, match=r"parallel job 1 of 2 \(failing\) failed: ValueError: seed=1"):
        parallel.run_jobs(failing, [{"seed": 0}, {"seed": 1}], workers=2)
    assert parallel.run_jobs(failing, [{"seed": 0}, {"seed": 2}], workers=2) == [0, 2]
    with pytest.raises(ValueError, match="workers=0"):
        parallel.run_jobs(failing, [], workers=0)
