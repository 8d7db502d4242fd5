"""Notebook 03's parameters: types, ranges and cross-field rules (the defaults live in its parameters cell)."""
from dataclasses import dataclass

from replication.core.params import DTYPE, Trained, lr_rule, notebook, p
from replication.lm import tasks

# The arms of notebook 03, read by everything that needs them (this module loads no torch, so the parameter registry
# can read it): variant -> (reward kind, r' (None: not debiased; "initial": the authors', scored once by the initial
# policy; "per_step": scored under the policy of each step), std filter). A new arm is one entry here (and a reward
# function in rlpr.CORES if it needs a new one).
VARIANTS = {"rlpr": ("probability", "initial", True), "rlvr": ("verifier", None, False),
            "oracle": ("oracle", None, False), "rlpr_no_debias": ("probability", None, True),
            "rlpr_no_filter": ("probability", "initial", False),
            "rlpr_per_step_r_prime": ("probability", "per_step", True)}


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
    variants: list = p(each={"choices": tuple(VARIANTS)})

    def check(self):
        if self.warmup_end <= self.warmup_start:
            raise ValueError(f"warmup_end={self.warmup_end} is not allowed; it must be > warmup_start = {self.warmup_start}")
        self.at_most("warmup_end", self.steps, "steps")
        self.at_most("prompts_per_step", self.n_train, "n_train")
        self.at_most("n_arithmetic", self.n_train, "n_train")   # part (a) samples the first n_arithmetic of the pool
