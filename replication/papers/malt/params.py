"""Notebook 05's parameters: types, ranges and cross-field rules (the defaults live in its parameters cell)."""
from dataclasses import dataclass

from replication.core.params import DTYPE, Trained, lr_rule, notebook, p, temperature_rule
from replication.lm import tasks

@notebook("05_malt_trajectory_trees")
@dataclass
class MALT(Trained):
    level: str = p(choices=tuple(tasks.LEVELS))
    n_branch: int = p()
    train_questions: int = p()
    val_questions: int = p()
    votes: int = p()
    gen_tokens: int = p()
    ver_tokens: int = p()
    ref_tokens: int = p()
    temperature: float = temperature_rule()
    rollout_dtype: str = DTYPE
    batch_size: int = p()
    reference: str = p(choices=("sft", "base"))
    sft_lr: float = lr_rule()
    sft_epochs: int = p()
    dpo_lr: float = lr_rule()
    dpo_epochs: int = p()
    dpo_beta: float = p(low=1e-9, high=100.0)
    max_sft: int = p()
    max_pairs: int = p()
    n_boot: int = p()
