"""The seven notebooks' parameter classes: types, ranges and cross-field rules (defaults live in the cells)."""
from dataclasses import dataclass
from typing import Optional

from . import debate, mae_scores, tasks
from .params import Params, notebook, p

MODEL = p()  # a model name known to replication.models or a local checkpoint folder


@notebook("00_setup_and_baselines")
@dataclass
class Setup(Params):
    model: str = MODEL
    levels: list = p(each={"choices": tuple(tasks.LEVELS)})
    n_per_level: int = p()
    max_new_tokens: int = p()
    batch_size: int = p()
    throughput_prompts: int = p()
    measure_first_load: bool = p()
    group_size: int = p(minimum=2)
    step_prompts: int = p()
    step_tokens: int = p()
    rollout_temperature: float = p(low=0.01, high=2.0)
    rollout_dtype: str = p(choices=("float32", "bfloat16"))
    step_update_dtypes: list = p(each={"choices": ("float32", "bfloat16")})
    candidate_levels: list = p(each={"choices": tuple(tasks.LEVELS)})
    candidate_shots: list = p(each={"minimum": 0})
    sampling_problems: int = p()
    yardstick_level: str = p(choices=tuple(tasks.LEVELS))
    shots: int = p(minimum=0)
    n_train: int = p()
    n_eval: int = p()
    lrs: list = p(each={"low": 0.0, "high": 0.1})
    sweep_steps: int = p()
    yardstick_steps: int = p()
    eval_every: int = p()
    lora_r: int = p()

    def check(self):
        self.at_most("step_prompts", self.throughput_prompts, "throughput_prompts")
        self.at_most("step_prompts", self.n_train, "n_train")
        self.at_most("sweep_steps", self.yardstick_steps, "yardstick_steps")
        self.at_most("eval_every", self.sweep_steps, "sweep_steps")


@notebook("01_noise_analysis")
@dataclass
class Noise(Params):
    model: str = MODEL
    n_boot: int = p()
    n_sim_datasets: int = p()
    sim_boot: int = p()
    judge_questions: int = p()
    pairs_per_question: int = p()
    k: int = p()
    batch_size: int = p()


@notebook("02_elo_dynamics")
@dataclass
class EloDynamics(Params):
    steps: int = p()
    batch: int = p()
    group: int = p()
    n_seeds: int = p()
    eta: float = p(low=1e-9, high=100.0)
    temperatures: list = p(each={"low": 1e-9, "high": 1e9})
    sweep: list = p(each={"low": 1e-9, "high": 1e9})
    degrade_step: int = p(minimum=0)
    degrade_to: float = p(low=0.0, high=1e5)
    sliders: bool = p()
    model: str = MODEL
    level: str = p(choices=tuple(tasks.LEVELS))
    shots: int = p(minimum=0)
    n_train: int = p()
    n_eval: int = p()
    train_steps: int = p()
    prompts_per_step: int = p()
    group_size: int = p(minimum=2)
    rollout_temperature: float = p(low=0.01, high=2.0)
    max_new_tokens: int = p()
    lr: float = p(low=0.0, high=0.1)
    kl_beta: float = p(low=0.0, high=10.0)
    lora_r: int = p()
    judge: str = p(choices=("likelihood", "quality", "llm"))
    judge_model: Optional[str] = p()
    judge_shots: int = p(minimum=0)
    sigma_comp: float = p(low=1e-9, high=100.0)
    abs_noise_ratio: Optional[float] = p(low=1e-9, high=1e3)
    length_margin: int = p(minimum=0)
    elo_k: float = p(low=0.0, high=1e4)
    train_temperatures: list = p(each={"low": 1e-9, "high": 1e9})
    static_rule: str = p(choices=("middle", "strongest", "weakest", "nearest"))
    opponents: dict = p()

    def check(self):
        self.at_most("prompts_per_step", self.n_train, "n_train")
        for name, spec in self.opponents.items():
            ok = isinstance(spec, (list, tuple)) and len(spec) in (2, 3) and spec[0] >= 0 and int(spec[1]) == spec[1] >= 1
            if not (ok and (len(spec) == 2 or int(spec[2]) == spec[2] >= 0)):
                raise ValueError(f"opponents[{name!r}]={spec!r} is not allowed; use [temperature >= 0 (0: greedy), "
                                 "best of >= 1, shots >= 0 (optional)]")


@notebook("03_rlpr_debiasing")
@dataclass
class RLPR(Params):
    model: str = MODEL
    n_arithmetic: int = p(minimum=0)
    n_factual: int = p(minimum=0)
    samples: int = p(minimum=2)
    temperature: float = p(low=0.05, high=2.0)
    max_new_tokens: int = p()
    batch_size: int = p()
    n_boot: int = p()
    level: str = p(choices=tuple(tasks.LEVELS))
    shots: int = p(minimum=0)
    styles: list = p(each={"choices": ("digits", "unit", "words")})
    n_train: int = p()
    n_heldout: int = p()
    steps: int = p()
    batch_prompts: int = p()
    group: int = p(minimum=2)
    lr: float = p(low=0.0, high=0.1)
    lora_r: int = p()
    warmup_start: int = p(minimum=0)
    warmup_end: int = p()
    max_rollouts: int = p()
    variants: list = p(each={"choices": ("rlpr", "rlvr", "rlpr_no_debias", "rlpr_no_filter")})

    def check(self):
        if self.warmup_end <= self.warmup_start:
            raise ValueError(f"warmup_end={self.warmup_end} is not allowed; it must be > warmup_start = {self.warmup_start}")
        self.at_most("warmup_end", self.steps, "steps")
        self.at_most("batch_prompts", self.n_train, "n_train")


@notebook("04_debate_judge_accuracy")
@dataclass
class Debate(Params):
    model: str = MODEL
    level: str = p(choices=debate.LEVELS)
    reading: str = p(choices=debate.READINGS)
    check_questions: int = p()
    check_levels: list = p(each={"choices": debate.LEVELS})
    check_readings: list = p(each={"choices": debate.READINGS})
    n_questions: int = p()
    rounds: int = p()
    word_limit: int = p()
    best_of: int = p()
    temperature: float = p(low=0.01, high=2.0)
    batch_size: int = p()
    verdict_checks: int = p()
    n_debaters: int = p()
    tournament_rounds: int = p()
    sim_questions: int = p()
    n_worlds: int = p()
    truth_advantage: float = p(low=0.0, high=10.0)
    rhetoric: float = p(low=0.0, high=10.0)
    arg_noise: float = p(low=0.0, high=10.0)
    judge_noise: float = p(low=0.0, high=10.0)
    judge_noises: list = p(each={"low": 0.0, "high": 10.0})

    def check(self):
        if self.best_of > 1 and self.rounds != 1:
            raise ValueError(f"rounds={self.rounds} is not allowed with best_of={self.best_of}: the best-of-1 arm is "
                             "read from the first candidates of a one-round run (debate.first_candidates)")


@notebook("05_malt_trajectory_trees")
@dataclass
class MALT(Params):
    model: str = MODEL
    level: str = p(choices=tuple(tasks.LEVELS))
    shots: int = p(minimum=0)
    n_branch: int = p()
    train_questions: int = p()
    val_questions: int = p()
    eval_questions: int = p()
    votes: int = p()
    gen_tokens: int = p()
    ver_tokens: int = p()
    ref_tokens: int = p()
    temperature: float = p(low=0.01, high=2.0)
    rollout_dtype: str = p(choices=("float32", "bfloat16"))
    batch_size: int = p()
    reference: str = p(choices=("sft", "base"))
    lora_r: int = p()
    sft_lr: float = p(low=1e-7, high=1.0)
    sft_epochs: int = p()
    dpo_lr: float = p(low=1e-7, high=1.0)
    dpo_epochs: int = p()
    beta: float = p(low=1e-9, high=100.0)
    max_sft: int = p()
    max_pairs: int = p()
    n_boot: int = p()


@notebook("06_multi_agent_evolve")
@dataclass
class MAE(Params):
    model: str = MODEL
    seed_level: str = p(choices=tuple(tasks.LEVELS))
    shots: int = p(minimum=0)
    n_seed_questions: int = p()
    heldout_level: str = p(choices=tuple(tasks.LEVELS))
    n_heldout: int = p()
    n_probe: int = p()
    iterations: int = p()
    proposals: int = p()
    n_solve: int = p()
    pool_solve: int = p()
    question_tokens: int = p()
    answer_tokens: int = p()
    judge_tokens: int = p()
    eval_tokens: int = p()
    temperature: float = p(low=0.01, high=2.0)
    lr: float = p(low=0.0, high=0.1)
    lora_r: int = p()
    reference_ratio: float = p(low=0.0, high=1.0)
    quality_threshold: float = p(low=0.0, high=1.0)
    score_rule: str = p(choices=mae_scores.SCORE_RULES)
    n_boot: int = p()
    batch_size: int = p()

    def check(self):
        self.at_most("n_probe", self.n_heldout, "n_heldout")
