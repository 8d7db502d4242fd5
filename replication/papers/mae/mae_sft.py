"""MAE's SFT baseline at the workbook's scale: supervised fine-tuning on the seed questions.

The paper's Table 1 sets "SFT" (the base model fine-tuned on the seed data, with its reference answers) beside MAE in
its with-reference block, and reports it below the base model overall. Here the seed data are the loop's seed
questions with the task's worked solutions (`Problem.solution`: the sum written out, then "The answer is N."), in
the solver's prompt (`mae.solve_prompt`, the same worked examples before each question); a fresh LoRA adapter (the
loop's rank and, per training seed, its initialisation) is trained by the workbook's one SFT trainer
(`lm.dpo.train_sft`). Unlike the MAE arms it reads the reference answers: it is the labelled baseline the paper
compares against, not a label-free method. Its health signal is the fall of its training loss (first third of the
steps against the last third), read by `arms.health` like every trained arm."""
import numpy as np
import pandas as pd

from replication.core import config
from replication.lm import arms, dpo
from . import mae, mae_eval


def examples(problems, shots=()) -> list:
    """(prompt, completion) pairs: the solver's prompt for each seed question and its worked solution."""
    return [(mae.solve_prompt(p.question, shots), p.solution) for p in problems]


def sft_config(lr: float, epochs: int, seed: int, batch_size: int = dpo.PreferenceConfig.batch_size) -> dpo.PreferenceConfig:
    """The SFT trainer's settings (lm.dpo.PreferenceConfig, its batch size by default), validated; the seed orders
    the batches."""
    return dpo.PreferenceConfig(lr=lr, epochs=epochs, batch_size=batch_size, seed=seed).validate()


def train(model, tok, name: str, problems, shots, cfg: dpo.PreferenceConfig, lora_r: int, progress: bool = False):
    """A fresh adapter `name` (mae.new_adapter: seeded by cfg.seed, rank lora_r) fine-tuned on the seed questions'
    solutions: (model, the trainer's rows: loss and gradient norm per step)."""
    config.check_int("lora_r", lora_r)
    model = mae.new_adapter(model, name, mae.MAEConfig(seed=cfg.seed, lora_r=lora_r))
    rows = dpo.train_sft(model, tok, examples(problems, shots), cfg, adapter_name=name, progress=progress)
    return model, rows


def loss_signal(rows, n_boot: int = 1000, seed: int = 0) -> dict:
    """The SFT run's training signal for arms.health: the fall of its loss from the first third of the steps to the
    last (arms.reward_rise on the negated loss, so a fall is positive), with its 95% bootstrap interval."""
    return {**arms.reward_rise([-r["loss"] for r in rows], n_boot=n_boot, seed=seed), "signal": "training loss fall"}


def record(name: str, rows, table: pd.DataFrame, base: pd.DataFrame, n_examples: int, n_boot: int = 1000,
           seed: int = 0) -> dict:
    """arms.record of an SFT arm (steps: optimizer steps; samples: examples trained on, epochs included), its health
    from arms.health on the loss fall and the held-out replies' length (no training replies: SFT samples none)."""
    check = arms.health(loss_signal(rows, n_boot, seed), table["correct"], base["correct"], table["tokens"],
                        base["tokens"])
    return arms.record(name, table["correct"], len(rows), n_examples, check,
                       heldout_format=float(table["format"].mean()), heldout_tokens=float(table["tokens"].mean()),
                       final_loss=float(np.mean([r["loss"] for r in rows[-max(1, len(rows) // 3):]])) if rows else None)


def run_arm(model, tok, params, cfg: dpo.PreferenceConfig, problems, shots, heldout) -> dict:
    """The SFT arm of training seed cfg.seed: a fresh adapter `sft_seed<seed>` of rank params.lora_r trained on the
    seed questions (train), then its greedy answers to the held-out problems (mae_eval.heldout_answers: the solver's
    prompt, params.eval_tokens, params.batch_size, seeded by params.seed; params: notebook 06's run.params).
    Returns {"rows": the trainer's rows, "table": the held-out answers as records}, what a notebook caches."""
    P = params
    model, rows = train(model, tok, f"sft_seed{cfg.seed}", problems, shots, cfg, P.lora_r)
    table = mae_eval.heldout_answers(model, tok, heldout, shots, P.eval_tokens, P.batch_size, P.seed)
    return {"rows": rows, "table": table.to_dict("records")}
