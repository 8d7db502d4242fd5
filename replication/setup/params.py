"""Notebook 00's parameters: types, ranges and cross-field rules (the defaults live in its parameters cell)."""
from dataclasses import dataclass

from replication.core.params import DTYPE, DTYPES, Trained, lr_rule, notebook, p, temperature_rule
from replication.lm import tasks

@notebook("00_setup_and_baselines")
@dataclass
class Setup(Trained):
    levels: list = p(each={"choices": tuple(tasks.LEVELS)})
    n_per_level: int = p()
    max_new_tokens: int = p()
    batch_size: int = p()
    throughput_prompts: int = p()
    measure_first_load: bool = p()
    group_size: int = p(minimum=2)
    prompts_per_step: int = p()
    step_tokens: int = p()
    rollout_temperature: float = temperature_rule()
    rollout_dtype: str = DTYPE
    step_update_dtypes: list = p(each={"choices": DTYPES})
    candidate_levels: list = p(each={"choices": tuple(tasks.LEVELS)})
    candidate_shots: list = p(each={"minimum": 0})
    sampling_problems: int = p()
    yardstick_level: str = p(choices=tuple(tasks.LEVELS))
    n_train: int = p()
    lrs: list = p(each=lr_rule())
    sweep_steps: int = p()
    yardstick_steps: int = p()
    eval_every: int = p()

    def check(self):
        self.at_most("prompts_per_step", self.throughput_prompts, "throughput_prompts")
        self.at_most("prompts_per_step", self.n_train, "n_train")
        self.at_most("sweep_steps", self.yardstick_steps, "yardstick_steps")
        self.at_most("eval_every", self.sweep_steps, "sweep_steps")
