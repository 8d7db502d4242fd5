"""Notebook 06's parameters: types, ranges and cross-field rules (the defaults live in its parameters cell)."""
from dataclasses import dataclass

from replication.core.params import Trained, lr_rule, notebook, p, temperature_rule
from replication.lm import tasks
from . import mae_scores

@notebook("06_multi_agent_evolve")
@dataclass
class MAE(Trained):
    seed_level: str = p(choices=tuple(tasks.LEVELS))
    n_seed_questions: int = p()
    heldout_level: str = p(choices=tuple(tasks.LEVELS))
    n_probe: int = p()
    iterations: int = p()
    proposals: int = p()
    n_solve: int = p()
    pool_solve: int = p()
    question_tokens: int = p()
    answer_tokens: int = p()
    judge_tokens: int = p()
    eval_tokens: int = p()
    temperature: float = temperature_rule()
    lr: float = lr_rule()
    reference_ratio: float = p(low=0.0, high=1.0)
    quality_threshold: float = p(low=0.0, high=1.0)
    score_rule: str = p(choices=mae_scores.SCORE_RULES)
    sft_epochs: int = p()
    sft_lr: float = lr_rule()
    n_trace: int = p()
    rate_samples: int = p()
    n_question_problems: int = p()
    n_boot: int = p()
    batch_size: int = p()

    def check(self):
        self.at_most("n_probe", self.n_heldout, "n_heldout")
        self.at_most("n_trace", self.n_heldout, "n_heldout")
        self.at_most("n_question_problems", self.n_heldout, "n_heldout")
