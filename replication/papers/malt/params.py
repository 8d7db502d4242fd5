"""Notebook 05's parameters: types, ranges and cross-field rules (the defaults live in its parameters cell)."""
from dataclasses import dataclass

from replication.core.params import DEVICE, DTYPE, MODEL, Params, notebook, p
from replication.lm import tasks

@notebook("05_malt_trajectory_trees")
@dataclass
class MALT(Params):
    model: str = MODEL
    device: str = DEVICE
    seeds: int = p()
    level: str = p(choices=tuple(tasks.LEVELS))
    shots: int = p(minimum=0)
    n_branch: int = p()
    train_questions: int = p()
    val_questions: int = p()
    n_heldout: int = p()
    votes: int = p()
    gen_tokens: int = p()
    ver_tokens: int = p()
    ref_tokens: int = p()
    temperature: float = p(low=0.01, high=2.0)
    rollout_dtype: str = DTYPE
    batch_size: int = p()
    reference: str = p(choices=("sft", "base"))
    lora_r: int = p()
    sft_lr: float = p(low=1e-7, high=1.0)
    sft_epochs: int = p()
    dpo_lr: float = p(low=1e-7, high=1.0)
    dpo_epochs: int = p()
    dpo_beta: float = p(low=1e-9, high=100.0)
    max_sft: int = p()
    max_pairs: int = p()
    n_boot: int = p()
    workers: int = p(minimum=1)
