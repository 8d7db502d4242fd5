"""The RLVR yardstick: does plain GRPO with the exact verifier teach this model anything, and in how many steps?

Every paper notebook's training cites it: the steps it needs for a resolvable held-out gain are the training
length the comparisons use. Three pieces:

- `sampling_table`: for candidate prompt formats (task level x number of worked examples), how often the base
  model is right under the rollout sampling, and the share of GRPO groups whose G rewards are all equal (no
  gradient). GRPO learns only from mixed groups, so a setting is chosen where most groups are mixed.
- `train_curve`: a GRPO run (exact-verifier reward) on the one resumable loop whose step function also answers
  the held-out problems greedily every `eval_every` steps; the answers are part of the step's row, so an
  interrupted run resumes with its earlier evaluations intact.
- `curve_table`: held-out accuracy (lenient and strict, Wilson 95%) by step, reply length, and the paired gain
  over the base model on the same problems with its bootstrap interval.
"""
import random

import numpy as np
import pandas as pd

from replication.core import config, stats
from replication.lm import arms, grpo, loop, models, tasks


def prompts_for(problems, shots) -> list:
    """Each problem as chat turns after the worked examples (Problem.chat)."""
    return [p.chat(shots) for p in problems]


def sampling_table(model, tok, candidates: dict, group_size: int, temperature: float, max_new_tokens: int,
                   top_p: float = 1.0, batch_size: int = 32, seed: int = 0) -> pd.DataFrame:
    """One row per candidate {name: (problems, shots)}: accuracy of G sampled replies per problem (Wilson 95%),
    strict accuracy, format rate, mean reply tokens, and the share of problems whose G replies are all right or
    all wrong (a GRPO group with no gradient)."""
    config.check_int("group_size", group_size, minimum=2)
    rows = []
    for name, (problems, shots) in candidates.items():
        gen = models.generate(model, tok, prompts_for(problems, shots), max_new_tokens=max_new_tokens,
                              temperature=temperature, top_p=top_p, repeats=group_size, batch_size=batch_size,
                              seed=config.derive_seed(seed, "sampling-table", name))
        answers = [p.answer for p in problems for _ in range(group_size)]
        right = np.array([tasks.verify(t, a) for t, a in zip(gen.texts, answers)], float).reshape(-1, group_size)
        acc, lo, hi = stats.proportion_ci(int(right.sum()), right.size)
        rows.append({"setting": name, "shots": len(shots), "problems": len(problems), "replies": right.size,
                     "accuracy": acc, "ci_low": lo, "ci_high": hi,
                     "strict": float(np.mean([tasks.verify(t, a, strict=True) for t, a in zip(gen.texts, answers)])),
                     "format": float(np.mean([tasks.has_format(t) for t in gen.texts])),
                     "tokens": gen.num_tokens / right.size,
                     "zero_gradient_groups": float(np.mean((right.min(1) == right.max(1)))),
                     "seconds": gen.seconds})
    return pd.DataFrame(rows)


def heldout_row(model, tok, heldout, shots, max_new_tokens: int, batch_size: int, seed: int) -> dict:
    """Greedy answers to the held-out problems (tasks.evaluate): accuracy, strict accuracy, format rate, mean
    reply tokens, and the per-problem correctness (for paired comparisons)."""
    df = tasks.evaluate(model, tok, heldout, max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed,
                        prompts=prompts_for(heldout, shots), progress=False)
    return {"eval_accuracy": float(df["correct"].mean()), "eval_strict": float(df["correct_strict"].mean()),
            "eval_format": float(df["format"].mean()), "eval_tokens": float(df["tokens"].mean()),
            "eval_correct": df["correct"].astype(int).tolist(), "eval_strict_correct": df["correct_strict"].astype(int).tolist()}


def train_curve(model, tok, train, heldout, shots, cfg: grpo.GRPOConfig, steps: int, prompts_per_step: int,
                eval_every: int, folder: loop.RunFolder = None, batch_size: int = 32, progress: bool = True) -> list:
    """GRPO with the exact verifier for `steps` steps, `prompts_per_step` training problems a step (drawn with a
    seed derived from cfg.seed and the step), held-out greedy answers after every `eval_every`-th step (and the
    last). Resumable (loop.run); calling it again with more steps continues the same run. Returns the rows."""
    config.check_int("steps", steps)
    config.check_int("eval_every", eval_every)
    config.check_range("prompts_per_step", prompts_per_step, 1, len(train))
    trainer = grpo.GRPOTrainer(model, tok, tasks.verifier_reward, cfg)

    def step_fn(step, state):
        batch = random.Random(config.derive_seed(cfg.seed, "yardstick-draw", step)).sample(train, prompts_per_step)
        row = trainer.step(prompts_for(batch, shots), [{"answer": p.answer} for p in batch], step=step)
        if (step + 1) % eval_every == 0:
            row.update(heldout_row(trainer.model, tok, heldout, shots, cfg.max_new_tokens, batch_size, cfg.seed))
        return row

    rows, _ = loop.run(step_fn, steps, model, trainer.optimizer, folder, save_every=eval_every, desc=f"grpo lr {cfg.lr:g}",
                       postfix=lambda r: {"reward": f"{r['reward_mean']:.2f}", "held-out": f"{r.get('eval_accuracy', float('nan')):.2f}"},
                       progress=progress)
    return rows


def curve_table(base: dict, rows: list, seed: int = 0) -> pd.DataFrame:
    """Held-out accuracy by step (step 0: the base model), lenient and strict with Wilson 95% intervals, format
    rate, reply tokens, and the paired gain over the base model on the same problems (stats.paired_bootstrap)."""
    points = [{"step": 0, **base}] + [{**r, "step": r["step"] + 1} for r in rows if "eval_correct" in r]
    out = []
    for r in points:
        n = len(r["eval_correct"])
        acc, lo, hi = stats.proportion_ci(int(sum(r["eval_correct"])), n)
        s, slo, shi = stats.proportion_ci(int(sum(r["eval_strict_correct"])), n)
        d, dlo, dhi = stats.paired_bootstrap(np.asarray(r["eval_correct"], float), np.asarray(base["eval_correct"], float),
                                             seed=config.derive_seed(seed, "yardstick-gain", r["step"]))
        out.append({"step": r["step"], "n": n, "accuracy": acc, "ci_low": lo, "ci_high": hi, "strict": s,
                    "strict_low": slo, "strict_high": shi, "format": r["eval_format"], "tokens": r["eval_tokens"],
                    "gain": d, "gain_low": dlo, "gain_high": dhi})
    return pd.DataFrame(out)


def steps_to_gain(table: pd.DataFrame):
    """The first evaluated step whose paired gain over the base model has a 95% interval above 0 (None if none)."""
    hit = table[(table["step"] > 0) & (table["gain_low"] > 0)]
    return int(hit["step"].iloc[0]) if len(hit) else None


def summary(curve: pd.DataFrame, rows: list, cfg: dict, base: dict, n_boot: int = 1000) -> tuple:
    """The yardstick's outcome and its arm record (arms.record), with the one health check (arms.health): the
    training reward's rise, the final held-out accuracy against the base model's (base: heldout_row of the base
    model), reply lengths. cfg: level, shots, temperature, lr, steps, prompts_per_step, group_size, eval_every."""
    steps, last, k = pd.DataFrame(rows), curve.iloc[-1], cfg["eval_every"]
    final = [r for r in rows if "eval_correct" in r][-1]
    lengths = {"reward_first": float(steps["reward_mean"][:k].mean()), "reward_last": float(steps["reward_mean"][-k:].mean()),
               "tokens_base": float(curve["tokens"].iloc[0]), "tokens_last": float(last["tokens"])}
    out = {**{n: cfg[n] for n in ("level", "shots", "temperature", "lr", "steps", "prompts_per_step", "group_size")},
           "n_heldout": int(last["n"]), "base_accuracy": float(curve["accuracy"].iloc[0]), "final_accuracy": float(last["accuracy"]),
           "gain": [float(last["gain"]), float(last["gain_low"]), float(last["gain_high"])],
           "gain_excludes_0": bool(last["gain_low"] > 0 or last["gain_high"] < 0), "steps_to_gain": steps_to_gain(curve),
           "zero_gradient_groups": float(steps["zero_std_frac"].mean()), **lengths}
    check = arms.health(arms.reward_rise(steps["reward_mean"], n_boot=n_boot, seed=config.derive_seed(cfg.get("seed", 0), "health")),
                        final["eval_correct"], base["eval_correct"], [final["eval_tokens"]], [base["eval_tokens"]],
                        train_tokens=steps["completion_len"] if "completion_len" in steps else None)
    arm = arms.record(f"rlvr lr {cfg['lr']:g}", final["eval_correct"], cfg["steps"],
                      cfg["steps"] * cfg["prompts_per_step"] * cfg["group_size"], check)
    return out, arm


def fresh_policy(model_name: str, lora_r: int, seed: int):
    """The base model with a new LoRA adapter whose initialisation is seeded, the same for every run of a sweep."""
    import torch

    model, tok = models.load_model(model_name)
    torch.manual_seed(config.derive_seed(seed, "yardstick-lora"))
    return models.add_lora(model, r=lora_r, alpha=2 * lora_r), tok


def choose_lr(summary: pd.DataFrame) -> float:
    """The sweep's pick, by a rule fixed in advance that does not look at held-out data: the learning rate with
    the highest training reward over the last third of its steps."""
    return float(summary.loc[summary["reward_last"].idxmax(), "lr"])


def sweep_summary(runs: dict) -> pd.DataFrame:
    """One row per learning rate {lr: rows}: training reward over the first and last third of its steps, the
    share of zero-gradient groups, reply tokens, and its last held-out accuracy."""
    out = []
    for lr, rows in runs.items():
        r = pd.DataFrame(rows)
        third = max(1, len(r) // 3)
        last = r.dropna(subset=["eval_accuracy"]).iloc[-1] if "eval_accuracy" in r else None
        out.append({"lr": lr, "steps": len(r), "reward_first": float(r["reward_mean"][:third].mean()),
                    "reward_last": float(r["reward_mean"][-third:].mean()), "zero_gradient_groups": float(r["zero_std_frac"].mean()),
                    "tokens_last": float(r["completion_len"][-third:].mean()),
                    "heldout_accuracy": None if last is None else float(last["eval_accuracy"])})
    return pd.DataFrame(out)
