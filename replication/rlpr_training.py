"""RLPR training: the adaptive std filter, the filtered GRPO step on the one loop, the four variants and
their held-out answers, and the summaries notebook 03 reports.

One step: draw `batch_prompts` questions, roll out G replies each (GRPOTrainer.collect), keep the prompts
whose group reward std passes the filter and, while the kept prompts fall short of the batch, roll out a
fresh draw (up to max_rollouts); update on the kept prompts; feed the step's mean group std to the filter.
The filter's EMA lives in the loop state, so a resumed run carries on with it.
"""
import random
from dataclasses import asdict

import numpy as np
import pandas as pd
import torch

from . import answers, config, grpo, loop, models, stats
from .rlpr import Reward

# variant -> (reward kind, debiased, std filter)
VARIANTS = {"rlpr": ("probability", True, True), "rlvr": ("verifier", False, False),
            "rlpr_no_debias": ("probability", False, True), "rlpr_no_filter": ("probability", True, False)}


class StdFilter:
    """Keep prompts whose group reward std >= beta * EMA of the per-step mean group std.

    Steps [warmup_start, warmup_end) (0-based) are only observed; the EMA starts at their mean, then
    ema = (1 - ratio) * step_std + ratio * ema after each step (the threshold of a step uses the EMA before it)."""

    def __init__(self, beta: float = 0.5, ratio: float = 0.99, warmup_start: int = 5, warmup_end: int = 10):
        config.check_range("beta", beta, 0.0, 10.0)
        config.check_range("ratio", ratio, 0.0, 1.0)
        config.check_int("warmup_start", warmup_start, minimum=0)
        config.check_int("warmup_end", warmup_end, minimum=warmup_start + 1)
        self.beta, self.ratio, self.warmup = beta, ratio, (warmup_start, warmup_end)
        self.ema, self.seen = None, []

    @property
    def threshold(self):
        return None if self.ema is None else self.beta * self.ema

    def keep(self, stds):
        """Boolean mask of the prompts to keep (all of them before the EMA exists)."""
        stds = np.asarray(stds, dtype=np.float64)
        return np.ones(len(stds), dtype=bool) if self.ema is None else stds >= self.threshold

    def observe(self, step: int, step_std: float) -> None:
        """Feed one step's mean group std."""
        if self.ema is None:
            if self.warmup[0] <= step < self.warmup[1]:
                self.seen.append(float(step_std))
            if step >= self.warmup[1] - 1 and self.seen:
                self.ema = float(np.mean(self.seen))
        else:
            self.ema = (1 - self.ratio) * float(step_std) + self.ratio * self.ema

    def state(self) -> dict:
        return {"ema": self.ema, "seen": list(self.seen)}

    def load(self, state: dict) -> None:
        self.ema, self.seen = state.get("ema"), list(state.get("seen", []))


# ---- the filtered GRPO step ------------------------------------------------------------------------

def filtered_step(trainer, pool, batch_prompts: int, std_filter: StdFilter = None, max_rollouts: int = 2):
    """step_fn(step, state) -> row for loop.run: one GRPO step on questions drawn from pool, with the std
    filter as GRPOTrainer.collect's keep hook (its state in state["filter"]). Draws and sampling are seeded
    by config.derive_seed(seed, "rlpr-draw", step, attempt), so every variant sees the same draws."""
    config.check_int("batch_prompts", batch_prompts)
    config.check_int("max_rollouts", max_rollouts)
    G, seed = trainer.cfg.num_generations, trainer.cfg.seed

    def step_fn(step, state):
        masks = []
        if std_filter is not None:
            std_filter.load(state.get("filter") or {})
        threshold = std_filter.threshold if std_filter else None

        def draw(attempt):
            s = config.derive_seed(seed, "rlpr-draw", step, attempt)
            qs = random.Random(s).sample(pool, batch_prompts)
            torch.manual_seed(s)
            return [q.prompt() for q in qs], [q.meta() for q in qs]

        def keep(rollout):
            masks.append(std_filter.keep(rollout.group_std().numpy()))
            return masks[-1]

        trainer.timer.seconds.clear()
        kept, made = trainer.collect(draw, batch_prompts, keep=keep if std_filter else None,
                                     max_rollouts=max_rollouts if std_filter else 1)
        stds = np.concatenate([r.group_std().numpy() for r in made])
        extra = lambda name: [x for r in made for x in r.extras.get(name, [])]  # noqa: E731
        correct, raw = extra("correct"), extra("r")
        update = {}
        if kept is not None:
            update = {**trainer.update(kept), "update_std_mean": float(kept.group_std().mean())}
        n_kept = int(sum(m.sum() for m in masks)) if std_filter else len(stds)
        if std_filter is not None:
            std_filter.observe(step, float(stds.mean()))
            state["filter"] = std_filter.state()
        metrics = {k: float(np.mean([r.metrics[k] for r in made if k in r.metrics])) for k in made[0].metrics}
        return {"reward_mean": float(torch.cat([r.rewards for r in made]).mean()), "group_std_mean": float(stds.mean()),
                "train_correct": float(np.mean(correct)) if correct else None,
                "r_mean": float(np.mean(raw)) if raw else None, "threshold": threshold,
                "ema": std_filter.ema if std_filter else None, "rollouts": len(made),
                "fraction_filtered": 1 - n_kept / len(stds), "prompts_updated": 0 if kept is None else len(kept) // G,
                **metrics, **update, "wall_s": sum(trainer.timer.seconds.values())}

    return step_fn


def train(trainer, pool, num_steps: int, batch_prompts: int, folder: loop.RunFolder = None,
          std_filter: StdFilter = None, max_rollouts: int = 2, progress: bool = True) -> list:
    """num_steps filtered GRPO steps on loop.run (resumable from folder, the filter's EMA included).
    Without a std filter every prompt is kept and each step makes one rollout. Returns one row per step."""
    state = {"filter": std_filter.state()} if std_filter is not None else {}
    rows, _ = loop.run(filtered_step(trainer, pool, batch_prompts, std_filter, max_rollouts), num_steps,
                       trainer.model, trainer.optimizer, folder, state=state, save_every=trainer.cfg.save_every,
                       desc="rlpr", postfix=lambda r: {"reward": f"{r['reward_mean']:.3f}"},
                       summary={"config": asdict(trainer.cfg)}, progress=progress)
    return rows


# ---- variants and held-out answers -----------------------------------------------------------------

def answer_heldout(model, tok, questions, max_new_tokens: int = 48, batch_size: int = 16, seed: int = 0) -> pd.DataFrame:
    """Greedy replies to the questions, scored by the lenient oracle, the exact-match verifier and the format term."""
    gen = models.generate(model, tok, [q.prompt() for q in questions], max_new_tokens=max_new_tokens,
                          temperature=0.0, seed=seed, batch_size=batch_size)
    return pd.DataFrame([{"qid": q.id, "kind": q.kind, "style": q.style, "reply": t, **answers.score_reply(t, q)}
                         for q, t in zip(questions, gen.texts)])


def run_variant(name: str, pool, heldout, baseline: dict, cfg, steps: int, batch_prompts: int, run_folder=None,
                cache=None, model_name: str = "smollm2-135m-instruct", format_weight: float = 0.1, beta: float = 0.5,
                ema_ratio: float = 0.99, warmup=(0, 2), max_rollouts: int = 2, lora_r: int = 16,
                eval_tokens: int = 48, batch_size: int = 16, progress: bool = True):
    """Train one variant (VARIANTS) with LoRA GRPO from the base model, then answer the held-out questions greedily.
    Every variant starts from the same adapter (seeded by config.derive_seed(cfg.seed, "rlpr-lora")), whatever ran
    or was cached before it.

    run_folder(name, key) -> loop.RunFolder and cache(name, key, make) are the notebook's run.run_folder and
    run.cached (None: no folder, no cache); both are keyed by every setting. Returns (step rows, held-out table)."""
    config.check_choice("variant", name, tuple(VARIANTS))
    kind, debiased, filtered = VARIANTS[name]
    key = {"variant": name, "grpo": asdict(cfg), "steps": steps, "batch_prompts": batch_prompts, "model": model_name,
           "format_weight": format_weight, "beta": beta, "ema_ratio": ema_ratio, "warmup": list(warmup),
           "max_rollouts": max_rollouts, "lora_r": lora_r, "pool": [q.id for q in pool],
           "heldout": [q.id for q in heldout], "eval_tokens": eval_tokens, "lora_init": "rlpr-lora"}
    model, tok = models.load_model(model_name)
    torch.manual_seed(config.derive_seed(cfg.seed, "rlpr-lora"))  # LoRA A's init draws from torch's global RNG
    model = models.add_lora(model, r=lora_r, alpha=2 * lora_r)
    reward = Reward(model, tok, kind, baseline=baseline if debiased else None, format_weight=format_weight,
                    temperature=cfg.temperature, batch_size=batch_size, system=cfg.system)
    trainer = grpo.GRPOTrainer(model, tok, reward, cfg)
    filt = StdFilter(beta, ema_ratio, warmup_start=warmup[0], warmup_end=warmup[1]) if filtered else None
    folder = run_folder(name, key) if run_folder is not None else None
    rows = train(trainer, pool, steps, batch_prompts, folder, filt, max_rollouts, progress)
    make = lambda: answer_heldout(trainer.model, tok, heldout, eval_tokens, batch_size, seed=cfg.seed)  # noqa: E731
    table = make() if cache is None else cache(f"heldout-{name}", key, make)
    return pd.DataFrame(rows), table


# ---- what the notebook reports ---------------------------------------------------------------------

def heldout_summary(table: pd.DataFrame) -> dict:
    """Held-out accuracy (lenient oracle) with its Wilson 95% interval, verifier pass rate and format rate."""
    p, lo, hi = stats.proportion_ci(int(table["correct"].sum()), len(table))
    return {"heldout_accuracy": p, "heldout_accuracy_ci95": [lo, hi],
            "heldout_verifier_pass": float(table["verified"].mean()), "heldout_format": float(table["format"].mean())}


def heldout_difference(a: pd.DataFrame, b: pd.DataFrame, seed: int = 0):
    """(accuracy of a - accuracy of b, low, high) on the same held-out questions (paired by qid, stats.paired_bootstrap)."""
    both = a[["qid", "correct"]].merge(b[["qid", "correct"]], on="qid", suffixes=("_a", "_b"))
    if len(both) != len(a) or len(both) != len(b):
        raise ValueError("the two held-out tables must answer the same questions")
    return stats.paired_bootstrap(both["correct_a"], both["correct_b"], seed=seed)


def training_summary(results: dict, base_eval: pd.DataFrame, seed: int = 0) -> dict:
    """Per variant (and the untrained base): held-out summary, steps, wall time, share of training replies
    correct in the first and second half, grad-norm CV, mean group std of the updated prompts and the
    held-out difference from the base model with its interval."""
    out = {"base (no training)": {**heldout_summary(base_eval), "steps": 0}}
    for v, (rows, table) in results.items():
        half = len(rows) // 2
        g = rows["grad_norm"] if "grad_norm" in rows else pd.Series(dtype=float)
        d, lo, hi = heldout_difference(table, base_eval, seed=seed)
        out[v] = {**heldout_summary(table), "steps": len(rows), "train_wall_s": float(rows["wall_s"].sum()),
                  "train_correct_first_half": float(rows["train_correct"][: half or 1].mean()),
                  "train_correct_second_half": float(rows["train_correct"][half:].mean()),
                  "grad_norm_cv": float(g.std() / g.mean()) if len(g.dropna()) > 1 and g.mean() > 0 else None,
                  "update_std_mean": float(rows["update_std_mean"].mean()) if "update_std_mean" in rows else None,
                  "vs_base": {"difference": d, "ci95": [lo, hi]}}
    return out


def filter_summary(filtered: dict, beta: float, warmup) -> dict:
    """The std filter of the main filtered variant ('rlpr' if run): final threshold, share of prompts dropped
    after the warm-up, and per step the threshold, the share dropped and the rollouts made."""
    main = "rlpr" if "rlpr" in filtered else next(iter(filtered), None)
    if main is None:
        return {"final_threshold": None, "fraction_filtered": None}
    rows = filtered[main]
    after = rows[rows["threshold"].notna()]
    return {"variant": main,
            "final_threshold": float(rows["ema"].iloc[-1] * beta) if rows["ema"].notna().any() else None,
            "fraction_filtered": float(after["fraction_filtered"].mean()) if len(after) else 0.0,
            "threshold_by_step": [None if pd.isna(x) else float(x) for x in rows["threshold"]],
            "fraction_filtered_by_step": rows["fraction_filtered"].tolist(), "rollouts_by_step": rows["rollouts"].tolist(),
            "warmup_window": list(warmup)}
