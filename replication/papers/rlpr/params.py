"""Notebook 03's parameters: types, ranges and cross-field rules (the defaults live in its parameters cell)."""
from dataclasses import dataclass

from replication.core.params import DTYPE, Trained, lr_rule, notebook, p
from replication.lm import tasks

# rlpr_training.VARIANTS' names (that module loads torch; the parameter registry may not)
VARIANTS = ("rlpr", "rlvr", "oracle", "rlpr_no_debias", "rlpr_no_filter", "rlpr_per_step_r_prime")


@notebook("03_rlpr_debiasing")
@dataclass
class RLPR(Trained):
    n_arithmetic: int = p(minimum=0)
    n_factual: int = p(minimum=0)
    samples: int = p(minimum=2)
    temperature: float = p(low=0.05, high=2.0)
    rollout_dtype: str = DTYPE
    max_new_tokens: int = p()
    batch_size: int = p()
    n_boot: int = p()
    level: str = p(choices=tuple(tasks.LEVELS))
    styles: list = p(each={"choices": ("digits", "unit", "words")})
    n_train: int = p()
    steps: int = p()
    prompts_per_step: int = p()
    group_size: int = p(minimum=2)
    lr: float = lr_rule()
    warmup_start: int = p(minimum=0)
    warmup_end: int = p()
    max_rollouts: int = p()
    variants: list = p(each={"choices": VARIANTS})

    def check(self):
        if self.warmup_end <= self.warmup_start:
            raise ValueError(f"warmup_end={self.warmup_end} is not allowed; it must be > warmup_start = {self.warmup_start}")
        self.at_most("warmup_end", self.steps, "steps")
        self.at_most("prompts_per_step", self.n_train, "n_train")
        self.at_most("n_arithmetic", self.n_train, "n_train")   # part (a) samples the first n_arithmetic of the pool
