"""Notebooks 01 and 02's parameters: types, ranges and cross-field rules (the defaults live in their cells)."""
from dataclasses import dataclass
from typing import Optional

from replication.core.params import DTYPE, LM, Trained, lr_rule, notebook, p, temperature_rule
from replication.lm import tasks

JUDGES = ("likelihood", "quality", "llm")  # Elo-Evolve's training judges (judging.make_judge)
STATIC_RULES = ("middle", "strongest", "weakest", "nearest")  # how the static arm's opponent is fixed before training

@notebook("01_noise_analysis")
@dataclass
class Noise(LM):
    n_boot: int = p()
    n_sim_datasets: int = p()
    sim_boot: int = p()
    judge_questions: int = p()
    pairs_per_question: int = p()
    k: int = p()
    judge_draws: int = p()
    batch_size: int = p()


@notebook("02_elo_dynamics")
@dataclass
class EloDynamics(Trained):
    sim_steps: int = p()
    sim_batch: Optional[int] = p()
    sim_group_size: int = p()
    sim_seeds: int = p()
    eta: float = p(low=1e-9, high=100.0)
    temperatures: list = p(each={"low": 1e-9, "high": 1e9})
    sweep: list = p(each={"low": 1e-9, "high": 1e9})
    degrade_step: int = p(minimum=0)
    degrade_to: float = p(low=0.0, high=1e5)
    sliders: bool = p()
    level: str = p(choices=tuple(tasks.LEVELS))
    n_train: int = p()
    train_steps: int = p()
    prompts_per_step: int = p()
    group_size: int = p(minimum=2)
    rollout_temperature: float = temperature_rule()
    rollout_dtype: str = DTYPE
    max_new_tokens: int = p()
    lr: float = lr_rule()
    kl_beta: Optional[float] = p(low=0.0, high=10.0)
    judge: str = p(choices=JUDGES)
    graded_judge: Optional[str] = p(choices=JUDGES)   # None: no section (k)
    judge_model: Optional[str] = p()
    judge_shots: int = p(minimum=0)
    sigma_comp: float = p(low=1e-9, high=100.0)
    abs_noise_ratio: Optional[float] = p(low=1e-9, high=1e3)
    length_margin: int = p(minimum=0)
    elo_k: float = p(low=0.0, high=1e4)
    train_temperatures: list = p(each={"low": 1e-9, "high": 1e9})
    degrade_temperatures: Optional[list] = p(each={"low": 1e-9, "high": 1e9})   # None: no degraded arms
    train_degrade_step: int = p(minimum=1)
    degrade_with: str = p()
    static_rule: str = p(choices=STATIC_RULES)
    opponents: dict = p()

    def check(self):
        self.at_most("prompts_per_step", self.n_train, "n_train")
        if self.graded_judge is not None and self.graded_judge == self.judge:
            raise ValueError(f"graded_judge={self.graded_judge!r} is not allowed; name a judge other than judge="
                             f"{self.judge!r} (its arms would be the same runs), or None")
        if self.degrade_temperatures:
            missing = [t for t in self.degrade_temperatures if float(t) not in [float(x) for x in self.train_temperatures]]
            if missing:
                raise ValueError(f"degrade_temperatures={self.degrade_temperatures!r} is not allowed; each must be one of "
                                 f"train_temperatures {self.train_temperatures!r} (a degraded arm forks from that arm)")
            if not self.train_degrade_step < self.train_steps:
                raise ValueError(f"train_degrade_step={self.train_degrade_step} is not allowed; it must be below "
                                 f"train_steps={self.train_steps}")
            if self.degrade_with not in self.opponents:
                raise ValueError(f"degrade_with={self.degrade_with!r} is not allowed; name one of the opponents "
                                 f"{', '.join(self.opponents)}")
        for name, spec in self.opponents.items():
            ok = isinstance(spec, (list, tuple)) and len(spec) in (2, 3) and spec[0] >= 0 and int(spec[1]) == spec[1] >= 1
            if not (ok and (len(spec) == 2 or int(spec[2]) == spec[2] >= 0)):
                raise ValueError(f"opponents[{name!r}]={spec!r} is not allowed; use [temperature >= 0 (0: greedy), "
                                 "best of >= 1, shots >= 0 (optional)]")
