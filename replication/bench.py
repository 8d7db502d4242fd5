"""Benchmark (not a test): one full GRPO step, our trainer vs TRL's GRPOTrainer, on the same config.

    python -m replication bench grpo [--reps 3] [--model smollm2-135m-instruct]
"""
import argparse
import statistics
import tempfile
import time

import torch

from . import grpo, models, tasks

PROMPTS = 4
G = 8
MAX_NEW_TOKENS = 48
BETA = 0.04
LORA_R = 16


def matmul_peak(n: int = 1024, reps: int = 10) -> float:
    """Achieved fp32 FLOP/s of a square matmul on this machine (the best of `reps`)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def length_reward(completions):
    """A cheap deterministic reward (shorter is better) so reward time does not matter."""
    return [1.0 / (1.0 + len(c)) for c in completions]


def ours(model_name: str, prompts, reps: int) -> dict:
    """Step times of replication.grpo on the benchmark config, with the split of the step."""
    model, tok = models.load_model(model_name)
    model = models.add_lora(model, r=LORA_R, alpha=2 * LORA_R)
    cfg = grpo.GRPOConfig(num_generations=G, max_new_tokens=MAX_NEW_TOKENS, beta=BETA, lr=1e-5, temperature=1.0)
    trainer = grpo.GRPOTrainer(model, tok, lambda p, c, m, **log: length_reward(c), cfg)
    n_params = sum(p.numel() for p in model.parameters())
    rows = []
    for step in range(reps + 1):  # the first step warms up and is not counted
        t0 = time.perf_counter()
        row = trainer.step(prompts, step=step)
        row["step_s"] = time.perf_counter() - t0
        rows.append(row)
    rows = rows[1:]
    return {"step_s": [r["step_s"] for r in rows], "tokens": [r["completion_len"] * len(prompts) * G for r in rows],
            "split": {k: statistics.mean(r[f"{k}_s"] for r in rows) for k in ("generation", "scoring", "backward")},
            "n_params": n_params, "seq_len": statistics.mean(r["completion_len"] for r in rows),
            "prompt_len": max(len(tok(t, add_special_tokens=False)["input_ids"]) for t in models.chat_prompts(tok, prompts))}


def trl(model_name: str, prompts, reps: int) -> dict:
    """Step times of TRL's GRPOTrainer on the same config (LoRA through peft_config)."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    model, tok = models.load_model(model_name)
    times, lengths = [], []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths.append(logs["completions/mean_length"])

    ds = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in prompts] * (reps + 1)})
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, per_device_train_batch_size=len(prompts) * G, num_generations=G,
                          max_completion_length=MAX_NEW_TOKENS, beta=BETA, learning_rate=1e-5, temperature=1.0,
                          loss_type="grpo", epsilon=0.2,
                          max_steps=reps + 1, logging_steps=1, report_to=[], use_cpu=True, bf16=False,
                          save_strategy="no", seed=0, dataloader_num_workers=0, disable_tqdm=True)
        lora = LoraConfig(r=LORA_R, lora_alpha=2 * LORA_R, target_modules=list(models.LORA_TARGETS),
                          task_type="CAUSAL_LM")
        reward = lambda completions, **kw: length_reward([c[0]["content"] for c in completions])  # noqa: E731
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds,
                              processing_class=tok, peft_config=lora, callbacks=[Clock()])
        trainer.train()
    return {"step_s": times[1:], "seq_len": statistics.mean(lengths[1:]) if len(lengths) > 1 else float("nan")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m replication bench")
    ap.add_argument("what", choices=["grpo"])
    ap.add_argument("--reps", type=int, default=3, help="timed steps per trainer (after one warm-up step)")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error(f"--reps {args.reps} is not allowed; it must be >= 1")
    torch.manual_seed(0)
    prompts = [p.prompt() for p in tasks.make_level("2d-1step-add", PROMPTS, seed=0)]
    print(f"config: {PROMPTS} prompts x G={G}, {MAX_NEW_TOKENS} new tokens, beta={BETA}, LoRA r={LORA_R} "
          f"(attention + MLP), fp32, {torch.get_num_threads()} threads, {args.reps} timed steps each")
    peak = matmul_peak()
    a = ours(args.model, prompts, args.reps)
    b = trl(args.model, prompts, args.reps)
    ours_s, trl_s = statistics.median(a["step_s"]), statistics.median(b["step_s"])
    tokens = statistics.mean(a["tokens"])
    # update FLOPs: forward (2N) + backward through frozen weights (2N) per token of prompt + completion,
    # ignoring attention and LoRA terms; the policy and reference scoring forwards are in 'scoring'.
    seq_tokens = len(prompts) * G * (a["seq_len"] + a["prompt_len"])
    update_flops = 4 * a["n_params"] * seq_tokens / a["split"]["backward"]
    print("\n| trainer | median step (s) | steps (s) | mean completion length |")
    print("|---|---|---|---|")
    print(f"| replication.grpo | {ours_s:.1f} | {', '.join(f'{x:.1f}' for x in a['step_s'])} | {a['seq_len']:.1f} |")
    print(f"| TRL 1.16 GRPOTrainer | {trl_s:.1f} | {', '.join(f'{x:.1f}' for x in b['step_s'])} | {b['seq_len']:.1f} |")
    print(f"\nratio (TRL step / our step): {trl_s / ours_s:.2f}x")
    print(f"our completion tokens/s (whole step): {tokens / ours_s:.1f}")
    print("our step split (s): " + ", ".join(f"{k} {v:.1f}" for k, v in a["split"].items()))
    print(f"update achieved ~{update_flops / 1e9:.1f} GFLOP/s vs matmul peak {peak / 1e9:.1f} GFLOP/s "
          f"({100 * update_flops / peak:.0f}%)")
    return 0
