"""RLPR training: the adaptive std filter, the filtered GRPO step on the one loop, and the held-out answers of a
trained model.

One step: draw `batch_prompts` questions, roll out G replies each (GRPOTrainer.collect), keep the prompts
whose group reward std passes the filter and, while the kept prompts fall short of the batch, roll out a
fresh draw of as many questions as are missing (up to max_rollouts rollouts); update on the kept prompts;
feed the step's mean group std (over every rollout made) to the filter.
The filter's EMA lives in the loop state, so a resumed run carries on with it.
"""
import random
from dataclasses import asdict

import numpy as np
import pandas as pd
import torch

from replication.core import config
from replication.lm import loop, tasks
from . import answers


class StdFilter:
    """Keep prompts whose group reward std >= factor * EMA of the per-step mean group std (the authors' beta).

    Steps [warmup_start, warmup_end) (0-based) are only observed; the EMA starts at their mean, then
    ema = (1 - ratio) * step_std + ratio * ema after each step (the threshold of a step uses the EMA before it)."""

    def __init__(self, factor: float = 0.5, ratio: float = 0.99, warmup_start: int = 5, warmup_end: int = 10):
        config.check_range("std_filter_factor", factor, 0.0, 10.0)
        config.check_range("ratio", ratio, 0.0, 1.0)
        config.check_int("warmup_start", warmup_start, minimum=0)
        config.check_int("warmup_end", warmup_end, minimum=warmup_start + 1)
        self.factor, self.ratio, self.warmup = factor, ratio, (warmup_start, warmup_end)
        self.ema, self.seen = None, []

    @property
    def threshold(self):
        return None if self.ema is None else self.factor * self.ema

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

def filtered_step(trainer, pool, batch_prompts: int, std_filter: StdFilter = None, max_rollouts: int = 2, shots=()):
    """step_fn(step, state) -> row for loop.run: one GRPO step on questions drawn from pool (prompted with the
    worked examples `shots`, answers.Question.chat), with the std filter as GRPOTrainer.collect's keep hook (its
    state in state["filter"]). Draws and sampling are seeded by config.derive_seed(seed, "rlpr-draw", step,
    attempt), so every variant sees the same draws. The row holds the reward of every rollout made, the share of
    groups with zero reward std among those rolled out and among those updated on (no gradient), the mean reply
    length, the filter's threshold and dropped share, and the update's statistics."""
    config.check_int("batch_prompts", batch_prompts)
    config.check_int("max_rollouts", max_rollouts)
    G, seed = trainer.cfg.num_generations, trainer.cfg.seed

    def step_fn(step, state):
        masks = []
        if std_filter is not None:
            std_filter.load(state.get("filter") or {})
        threshold = std_filter.threshold if std_filter else None

        def draw(attempt):  # a refill rolls out only as many prompts as the filter dropped
            s = config.derive_seed(seed, "rlpr-draw", step, attempt)
            qs = random.Random(s).sample(pool, batch_prompts - int(sum(m.sum() for m in masks)))
            torch.manual_seed(s)
            return [q.chat(shots) for q in qs], [q.meta() for q in qs]

        def keep(rollout):
            masks.append(std_filter.keep(rollout.group_std().cpu().numpy()))
            return masks[-1]

        trainer.timer.seconds.clear()
        kept, made = trainer.collect(draw, batch_prompts, keep=keep if std_filter else None,
                                     max_rollouts=max_rollouts if std_filter else 1)
        stds = np.concatenate([r.group_std().cpu().numpy() for r in made])
        extra = lambda name: [x for r in made for x in r.extras.get(name, [])]  # noqa: E731
        correct, raw = extra("correct"), extra("r")
        update = {}
        if kept is not None:
            update = {**trainer.update(kept), "update_std_mean": float(kept.group_std().mean()),
                      "zero_std_updated": float(np.isclose(kept.group_std().cpu().numpy(), 0.0).mean())}
        n_kept = int(sum(m.sum() for m in masks)) if std_filter else len(stds)
        if std_filter is not None:
            std_filter.observe(step, float(stds.mean()))
            state["filter"] = std_filter.state()
        metrics = {k: float(np.mean([r.metrics[k] for r in made if k in r.metrics])) for k in made[0].metrics}
        lengths = torch.cat([r.completion_mask.sum(1) for r in made]).float()
        return {"reward_mean": float(torch.cat([r.rewards for r in made]).mean()), "group_std_mean": float(stds.mean()),
                "train_correct": float(np.mean(correct)) if correct else None,
                "r_mean": float(np.mean(raw)) if raw else None, "threshold": threshold,
                "ema": std_filter.ema if std_filter else None, "rollouts": len(made),
                "fraction_filtered": 1 - n_kept / len(stds), "prompts_updated": 0 if kept is None else len(kept) // G,
                "prompts_rolled": len(stds),
                "zero_std_rolled": float(np.isclose(stds, 0.0).mean()), "completion_len": float(lengths.mean()),
                **metrics, **update, **{f"{k}_s": v for k, v in trainer.timer.seconds.items()},
                "wall_s": sum(trainer.timer.seconds.values())}

    return step_fn


def train(trainer, pool, num_steps: int, batch_prompts: int, folder: loop.RunFolder = None,
          std_filter: StdFilter = None, max_rollouts: int = 2, progress: bool = True, shots=()) -> list:
    """num_steps filtered GRPO steps on loop.run (resumable from folder, the filter's EMA included).
    Without a std filter every prompt is kept and each step makes one rollout. Returns one row per step."""
    state = {"filter": std_filter.state()} if std_filter is not None else {}
    rows, _ = loop.run(filtered_step(trainer, pool, batch_prompts, std_filter, max_rollouts, shots), num_steps,
                       trainer.model, trainer.optimizer, folder, state=state, save_every=trainer.cfg.save_every,
                       desc="rlpr", postfix=lambda r: {"reward": f"{r['reward_mean']:.3f}"},
                       summary={"config": asdict(trainer.cfg)}, progress=progress)
    return rows


# ---- variants and held-out answers -----------------------------------------------------------------

def answer_heldout(model, tok, questions, max_new_tokens: int = 48, batch_size: int = 16, seed: int = 0,
                   shots=()) -> pd.DataFrame:
    """Greedy replies to the questions (prompted with the worked examples `shots`) by the one held-out evaluation
    (tasks.evaluate), scored by the lenient oracle, the exact-match verifier and the format term
    (answers.score_reply), with the reply's length in tokens."""
    return tasks.evaluate(model, tok, questions, max_new_tokens, batch_size, seed, prompts=[q.chat(shots) for q in questions],
                          progress=False, score=answers.score_reply,
                          columns=lambda q: {"qid": q.id, "kind": q.kind, "style": q.style})
