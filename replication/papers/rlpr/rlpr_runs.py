"""Notebook 03's arm runs: the setting every arm shares (`ArmSetting`, built from run.params by `setting`), the base
model's held-out answers and the initial policy's r' (each made once, cached), one variant trained and answered
(`run_variant`), each variant once per training seed (`run_seeds`) and every variant and seed side by side where
asked (`run_all`)."""
from dataclasses import asdict, dataclass, replace
from dataclasses import fields as dataclass_fields

import pandas as pd
import torch

from replication.core import config
from replication.lm import grpo, models, parallel
from .params import VARIANTS   # the arms, in one table
from .rlpr import Reward, initial_baseline
from .rlpr_training import StdFilter, answer_heldout, train


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
