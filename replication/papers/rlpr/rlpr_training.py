"""RLPR training: the adaptive std filter, the filtered GRPO step on the one loop, the variants (each once per
training seed, `run_seeds`; every variant and seed, side by side where asked, `run_all`) and their held-out answers,
the health check of each run, and the records notebook 03 reports.

One step: draw `batch_prompts` questions, roll out G replies each (GRPOTrainer.collect), keep the prompts
whose group reward std passes the filter and, while the kept prompts fall short of the batch, roll out a
fresh draw of as many questions as are missing (up to max_rollouts rollouts); update on the kept prompts;
feed the step's mean group std (over every rollout made) to the filter.
The filter's EMA lives in the loop state, so a resumed run carries on with it.
"""
import random
from dataclasses import asdict, dataclass, replace
from dataclasses import fields as dataclass_fields

import numpy as np
import pandas as pd
import torch

from replication.core import config, stats
from replication.lm import arms, grpo, loop, models, parallel, tasks
from . import answers
from .params import VARIANTS   # the arms, in one table
from .rlpr import Reward, initial_baseline



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


@dataclass(frozen=True)
class ArmSetting:
    """What every arm run of notebook 03 shares, under the notebook's parameter names (`setting` builds it from
    run.params): the GRPO configuration (its seed is the training seed), the budget, the model and worked examples,
    the paper's format weight and std filter (std_beta, ema_ratio, the warm-up window), the refills a step may make,
    the LoRA rank and the held-out answers' length and batch. Its `key` is every setting a run depends on."""

    grpo: grpo.GRPOConfig
    steps: int
    prompts_per_step: int
    model: str = "smollm2-135m-instruct"
    shots: tuple = ()
    format_weight: float = 0.1
    std_beta: float = 0.5
    ema_ratio: float = 0.99
    warmup: tuple = (0, 2)
    max_rollouts: int = 2
    lora_r: int = 16
    max_new_tokens: int = 48
    batch_size: int = 16

    def key(self, name: str, pool, heldout) -> dict:
        """The cache key of variant `name`'s run on these questions: every setting, the questions and references."""
        fields = {f.name: getattr(self, f.name) for f in dataclass_fields(self) if f.name not in ("grpo", "shots")}
        return {"variant": name, "grpo": asdict(self.grpo), **fields, "warmup": list(self.warmup),
                "shots": [s.id for s in self.shots], "r_prime": VARIANTS[name][1], "pool": [q.id for q in pool],
                "references": [q.reference for q in list(pool) + list(heldout)], "heldout": [q.id for q in heldout],
                "lora_init": "rlpr-lora"}

    def seeded(self, seed: int) -> "ArmSetting":
        return replace(self, grpo=replace(self.grpo, seed=seed))


def setting(params, paper_settings, shots=()) -> ArmSetting:
    """The arms' setting from notebook 03's parameters (run.params) and the paper's settings table (rlpr_reported's
    clip_low, clip_high, format_weight, std_beta, ema_ratio): the one place they become a GRPOConfig."""
    P = paper_settings
    cfg = grpo.GRPOConfig(num_generations=params.group_size, max_new_tokens=params.max_new_tokens,
                          temperature=params.temperature, lr=params.lr, kl_beta=0.0, epsilon_low=P["clip_low"],
                          epsilon_high=P["clip_high"], seed=params.seed, save_every=4,
                          rollout_dtype=params.rollout_dtype, update_dtype=params.rollout_dtype)
    return ArmSetting(cfg, params.steps, params.prompts_per_step, params.model, tuple(shots), P["format_weight"],
                      P["std_beta"], P["ema_ratio"], (params.warmup_start, params.warmup_end), params.max_rollouts,
                      params.lora_r, params.max_new_tokens, params.batch_size)


def base_answers(model, tok, heldout, arm: ArmSetting, cache=None) -> pd.DataFrame:
    """The base model's greedy held-out answers (answer_heldout), made once per setting (cache: run.cached)."""
    key = {"questions": [q.id for q in heldout], "references": [q.reference for q in heldout], "model": arm.model,
           "max_new_tokens": arm.max_new_tokens, "batch_size": arm.batch_size, "seed": arm.grpo.seed,
           "shots": [s.id for s in arm.shots]}
    make = lambda: answer_heldout(model, tok, heldout, arm.max_new_tokens, arm.batch_size, arm.grpo.seed,  # noqa: E731
                                  arm.shots)
    return make() if cache is None else cache("heldout-base", key, make)


def initial_r_prime(model, tok, pool, arm: ArmSetting, cache=None) -> dict:
    """r' of the authors' debiasing, scored once by the initial policy (rlpr.initial_baseline) for every arm and
    seed (cache: run.cached)."""
    key = {"questions": [q.id for q in pool], "references": [q.reference for q in pool], "model": arm.model,
           "shots": [s.id for s in arm.shots], "temperature": arm.grpo.temperature, "batch_size": arm.batch_size}
    make = lambda: initial_baseline(model, tok, pool, arm.shots, temperature=arm.grpo.temperature,  # noqa: E731
                                    batch_size=arm.batch_size, system=arm.grpo.system)
    return make() if cache is None else cache("r-prime-initial", key, make)


def run_variant(name: str, pool, heldout, arm: ArmSetting, r_prime: dict = None, run_folder=None, cache=None,
                progress: bool = False):
    """Train one variant (VARIANTS) with LoRA GRPO from the base model, then answer the held-out questions greedily.
    Every variant starts from the same adapter (seeded by config.derive_seed(arm.grpo.seed, "rlpr-lora")), whatever
    ran or was cached before it. r' of the debiased variants: VARIANTS' "initial" (the authors') uses the table
    r_prime ({question id: r' token probabilities} from the initial policy, rlpr.initial_baseline, e.g. computed once
    by the notebook for every run) or, when None, scores it here once from the freshly initialised model (LoRA B = 0:
    the base model) before the first step; "per_step" scores it under the policy at every step (rlpr.Reward "policy").

    run_folder(name, key) -> loop.RunFolder and cache(name, key, make) are the notebook's run.run_folder and
    run.cached (None: no folder, no cache); both are keyed by arm.key. Returns (step rows, held-out table)."""
    config.check_choice("variant", name, tuple(VARIANTS))
    kind, mode, filtered = VARIANTS[name]
    key, cfg = arm.key(name, pool, heldout), arm.grpo
    model, tok = models.load_model(arm.model)
    torch.manual_seed(config.derive_seed(cfg.seed, "rlpr-lora"))  # LoRA A's init draws from torch's global RNG
    model = models.add_lora(model, r=arm.lora_r, alpha=2 * arm.lora_r)
    score = {"temperature": cfg.temperature, "batch_size": arm.batch_size, "system": cfg.system}
    if mode == "initial" and r_prime is None:
        r_prime = initial_baseline(model, tok, pool, arm.shots, **score)
    baseline = {"initial": r_prime, "per_step": "policy", None: None}[mode]
    reward = Reward(model, tok, kind, baseline=baseline, format_weight=arm.format_weight, **score)
    trainer = grpo.GRPOTrainer(model, tok, reward, cfg)
    filt = StdFilter(arm.std_beta, arm.ema_ratio, warmup_start=arm.warmup[0], warmup_end=arm.warmup[1]) if filtered \
        else None
    folder = run_folder(name, key) if run_folder is not None else None
    rows = train(trainer, pool, arm.steps, arm.prompts_per_step, folder, filt, arm.max_rollouts, progress, arm.shots)
    make = lambda: answer_heldout(trainer.model, tok, heldout, arm.max_new_tokens, arm.batch_size, cfg.seed,  # noqa: E731
                                  arm.shots)
    table = make() if cache is None else cache(f"heldout-{name}", key, make)
    return pd.DataFrame(rows), table


def run_seeds(name: str, seeds, pool, heldout, arm: ArmSetting, **kw) -> list:
    """run_variant once per training seed s (arm.seeded(s): the LoRA init, the prompt draws and the rollout
    sampling), each run cached and resumed on its own (the keys hold the seed; the first seed's key is
    run_variant's with arm as given when seeds[0] == arm.grpo.seed). Returns [(step rows, held-out table)] by seed."""
    return run_all([name], seeds, pool, heldout, arm, **kw)[name]


def run_all(names, seeds, pool, heldout, arm: ArmSetting, workers: int = 1, **kw) -> dict:
    """Every variant in `names` over every training seed (run_seeds), `workers` runs side by side, each in its own
    process at one thread (parallel.run_jobs; 1: one after another here). A run's numbers do not depend on which
    worker ran it or beside what; only the thread count's rounding differs from a run at two threads. Returns
    {variant: [(step rows, held-out table)] by seed}."""
    names = list(names)
    jobs = [dict(name=v, pool=pool, heldout=heldout, arm=arm.seeded(s), **kw) for v in names for s in seeds]
    out = parallel.run_jobs(run_variant, jobs, workers, progress=f"arm runs ({workers} side by side)" if workers > 1 else None)
    return {v: out[i * len(seeds):(i + 1) * len(seeds)] for i, v in enumerate(names)}


# ---- what the notebook reports: each variant as a trained arm (replication.lm.arms) ---------------------

def health(rows: pd.DataFrame, table: pd.DataFrame, base: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> dict:
    """arms.health of a variant: its training reward's rise (first to last third of the steps, bootstrap over
    steps), its held-out accuracy against the base model's, its reply lengths (training and held-out, tokens)."""
    return arms.health(arms.reward_rise(rows["reward_mean"], n_boot=n_boot, seed=seed), table["correct"], base["correct"],
                       table["tokens"], base["tokens"], train_tokens=rows["completion_len"])


def heldout_summary(table: pd.DataFrame) -> dict:
    """The held-out verifier pass rate, format rate and reply length (tokens) beside the accuracy."""
    return {"heldout_verifier_pass": float(table["verified"].mean()), "heldout_format": float(table["format"].mean()),
            "heldout_tokens": float(table["tokens"].mean())}


def arm_record(name: str, rows: pd.DataFrame, table: pd.DataFrame, base: pd.DataFrame, group: int,
               n_boot: int = 1000, seed: int = 0) -> dict:
    """arms.record of one variant (samples: completions trained on), then the share of zero-gradient (zero reward
    std) groups among those rolled out and among those updated on, rollouts made, wall time, grad-norm CV, the
    held-out verifier pass rate, format rate and reply length, and the paired difference from the base model."""
    g = rows["grad_norm"].dropna() if "grad_norm" in rows else pd.Series(dtype=float)
    d = stats.paired_bootstrap(*arms.paired(table, base), n_boot=n_boot, seed=seed)
    zero = rows["zero_std_updated"].dropna() if "zero_std_updated" in rows else pd.Series(dtype=float)
    return arms.record(name, table["correct"], len(rows), int(rows["prompts_updated"].sum()) * group,
                       health(rows, table, base, n_boot, seed),
                       zero_std_rolled=float(rows["zero_std_rolled"].mean()),
                       zero_std_updated=float(zero.mean()) if len(zero) else None, rollouts=int(rows["rollouts"].sum()),
                       train_wall_s=float(rows["wall_s"].sum()),
                       grad_norm_cv=float(g.std() / g.mean()) if len(g) > 1 and g.mean() > 0 else None,
                       **heldout_summary(table), vs_base={"difference": d[0], "ci95": [d[1], d[2]]})


def answer_follows_work(tables: dict, questions, seeds) -> pd.DataFrame:
    """Per arm and training seed (tables: arm -> one held-out table, or a list of them, one per seed), over the
    held-out replies to questions with a numeric value: `accuracy` (lenient oracle), `worked_right` (the share whose
    own working reached the right value, answers.worked_result) and `follows` (among replies with both an answer and
    working, the share whose stated answer is the number their working reached). The probability reward scores the
    reference in place of the reply's answer, so nothing in it ties the written answer to the working; the
    verifier rewards read the written answer itself."""
    value = {q.id: q.value for q in questions if q.value is not None}
    rows = []
    for arm, runs in tables.items():
        runs = runs if isinstance(runs, list) else [runs]
        for k, table in enumerate(runs):
            t = table[table["qid"].isin(value)]
            checks = pd.DataFrame([answers.answer_vs_work(r, value[q]) for r, q in zip(t["reply"], t["qid"])])
            both = checks["follows"].dropna()
            rows.append({"arm": arm, "seed": seeds[k] if len(runs) > 1 or arm != "base" else None,
                         "accuracy": float(t["correct"].mean()),
                         "worked_right": float(checks["worked_right"].fillna(False).astype(bool).mean()),
                         "follows": float(both.astype(bool).mean()) if len(both) else float("nan"),
                         "with_both": float(len(both) / len(t)) if len(t) else float("nan")})
    return pd.DataFrame(rows).astype({"seed": "Int64"}).set_index(["arm", "seed"])


def base_record(base: pd.DataFrame) -> dict:
    """The untrained base model as an arm (no steps, no samples; healthy by definition)."""
    return arms.record("base", base["correct"], **heldout_summary(base))


def filter_summary(filtered: dict, std_filter_factor: float, warmup) -> dict:
    """The std filter of the main filtered variant ('rlpr' if run), whose step rows are given per training seed (a
    list, or one run's rows): per seed the final threshold, the share of prompts dropped after the warm-up, and per
    step the threshold, the share dropped and the rollouts made; `fraction_filtered` is the mean over the seeds."""
    main = "rlpr" if "rlpr" in filtered else next(iter(filtered), None)
    if main is None:
        return {"final_threshold": None, "fraction_filtered": None}
    runs = arms.by_seed(filtered[main])
    final, dropped = [], []
    for rows in runs:
        after = rows[rows["threshold"].notna()]
        final.append(float(rows["ema"].iloc[-1] * std_filter_factor) if rows["ema"].notna().any() else None)
        dropped.append(float(after["fraction_filtered"].mean()) if len(after) else 0.0)
    return {"variant": main, "final_threshold": final, "fraction_filtered": float(np.mean(dropped)),
            "fraction_filtered_by_seed": dropped,
            "threshold_by_step": [[None if pd.isna(x) else float(x) for x in rows["threshold"]] for rows in runs],
            "fraction_filtered_by_step": [rows["fraction_filtered"].tolist() for rows in runs],
            "rollouts_by_step": [rows["rollouts"].tolist() for rows in runs], "warmup_window": list(warmup)}
