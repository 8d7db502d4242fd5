"""Notebook 00's parameters: types, ranges and cross-field rules (the defaults live in its parameters cell)."""
from dataclasses import dataclass

from replication.core.params import DEVICE, DTYPE, DTYPES, MODEL, Params, notebook, p
from replication.lm import tasks

@notebook("00_setup_and_baselines")
@dataclass
class Setup(Params):
    model: str = MODEL
    device: str = DEVICE
    levels: list = p(each={"choices": tuple(tasks.LEVELS)})
    n_per_level: int = p()
    max_new_tokens: int = p()
    batch_size: int = p()
    throughput_prompts: int = p()
    measure_first_load: bool = p()
    group_size: int = p(minimum=2)
    prompts_per_step: int = p()
    step_tokens: int = p()
    rollout_temperature: float = p(low=0.01, high=2.0)
    rollout_dtype: str = DTYPE
    step_update_dtypes: list = p(each={"choices": DTYPES})
    candidate_levels: list = p(each={"choices": tuple(tasks.LEVELS)})
    candidate_shots: list = p(each={"minimum": 0})
    sampling_problems: int = p()
    yardstick_level: str = p(choices=tuple(tasks.LEVELS))
    shots: int = p(minimum=0)
    n_train: int = p()
    n_heldout: int = p()
    lrs: list = p(each={"low": 0.0, "high": 0.1})
    seeds: int = p()
    sweep_steps: int = p()
    yardstick_steps: int = p()
    eval_every: int = p()
    lora_r: int = p()
    workers: int = p(minimum=1)

    def check(self):
        self.at_most("prompts_per_step", self.throughput_prompts, "throughput_prompts")
        self.at_most("prompts_per_step", self.n_train, "n_train")
        self.at_most("sweep_steps", self.yardstick_steps, "yardstick_steps")
        self.at_most("eval_every", self.sweep_steps, "sweep_steps")
