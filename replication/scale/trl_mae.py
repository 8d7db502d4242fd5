"""Multi-Agent Evolve on TRL's GRPOTrainer: the three roles' batches with per-role whitening in one update.

TRL's advantages are per prompt group; MAE's (Task-Relative REINFORCE++) are whitened within each role's batch, and
its batch is not a fixed set of prompts x G but what one iteration makes (proposals, their ratings, the solver's
answers, their ratings). MAETrainer therefore replaces TRL's generation-and-scoring step with the workbook's own
iteration (mae.collect: prompts, parsing, filter, pool, rewards), sampling through TRL's generation (transformers, or
vLLM with use_vllm), and whitens with mae.role_advantages over every process's rows. TRL's loss does the rest:
with loss_type "dapo" it is the token mean over all roles' tokens of every process, which is the workbook's
joint_update (one process: the same number, tests/test_scale_mae.py). TRL's dataloader only paces the steps: the
questions come from the question pool, as in the workbook's loop. Every process runs its own proposals and draws
(mae.collect's `stream`); the questions accepted on every process join every process's pool in rank order, so the
pools agree. The pool is saved in each TRL checkpoint (scale.SaveState).
"""
from contextlib import contextmanager

import torch
from accelerate.utils import gather_object
from trl import GRPOTrainer

from replication.core import config
from replication.lm import models
from replication.papers.mae import mae


class MAETrainer(GRPOTrainer):
    """GRPOTrainer whose generation batch is one MAE iteration (mae.collect) over a question pool of `seeds`."""

    def __init__(self, *args, mae_cfg: mae.MAEConfig = None, seeds=(), **kwargs):
        super().__init__(*args, **kwargs)
        if self.beta != 0.0:
            raise ValueError(f"trl.beta={self.beta} is not allowed for mae; MAE trains without a KL term (beta 0)")
        if self.loss_type != "dapo":
            raise ValueError(f"trl.loss_type={self.loss_type!r} is not allowed for mae; use dapo (the token mean over "
                             "every role's tokens, as the workbook's joint update)")
        if self.use_vllm and self.vllm_importance_sampling_correction:
            raise ValueError("trl.vllm_importance_sampling_correction=true is not allowed for mae; set it false (the "
                             "roles' samples carry no sampling log-probs)")
        self.mae_cfg, self.pool, self.iterations, self.last = mae_cfg.validate(), mae.QuestionPool.from_problems(seeds), 0, None

    def stream(self) -> tuple:
        """What tells this process's draws apart: nothing on one process (the workbook's own seeds)."""
        n = self.accelerator.num_processes
        return () if n == 1 else (self.accelerator.process_index,)

    @contextmanager
    def max_tokens(self, n: int):
        """TRL's generation capped at n new tokens (each role has its own cap)."""
        saved = self.max_completion_length
        if self.use_vllm:
            self.vllm_generation.max_completion_length = n
        else:
            self.generation_config.max_new_tokens = self.generation_kwargs["max_new_tokens"] = n
        try:
            yield
        finally:
            if self.use_vllm:
                self.vllm_generation.max_completion_length = saved
            else:
                self.generation_config.max_new_tokens = self.generation_kwargs["max_new_tokens"] = saved

    def generate(self, prompts, max_new_tokens, prefill="", repeats=1) -> dict:
        """mae.collect's generate on TRL's generation: `repeats` samples per prompt (prompt-major), each turn opened
        with `prefill`; the id tensors (prompts left-padded, completions right-padded) and decoded texts. With no
        prompt it still takes part in the generation call (ZeRO-3 gathers the weights on every process)."""
        tok = self.processing_class
        texts = [t + prefill for t in models.chat_prompts(tok, prompts)]
        ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts for _ in range(repeats)]
        with self.max_tokens(max_new_tokens):
            completion_ids, _ = self._generate_single_turn(ids or [[tok.eos_token_id]], None, {}, 1)
        completion_ids = completion_ids[:len(ids)]
        p_ids, p_mask = pad([torch.tensor(x) for x in ids], tok.pad_token_id, "left")
        c_ids, c_mask = pad([torch.tensor(x) for x in completion_ids], tok.pad_token_id, "right")
        return {"ids": (p_ids, p_mask, c_ids, c_mask), "texts": tok.batch_decode(completion_ids, skip_special_tokens=True),
                "group": repeats}

    generate.collective = True

    def _generate_and_score_completions(self, inputs):
        """One MAE iteration on this process, the pools merged, advantages whitened per role over every process's
        rows; the batch in the layout TRL's loss reads."""
        cfg, it, device = self.mae_cfg, self.iterations, self.accelerator.device
        torch.manual_seed(config.derive_seed(cfg.seed, "mae-step", it, *self.stream()))
        before = len(self.pool)
        self.model.eval()
        out = mae.collect(self.generate, self.pool, cfg, it, stream=self.stream())
        self.model.train()
        self.pool.items = self.pool.items[:before] + [x for part in gather_object([self.pool.items[before:]]) for x in part]
        chunks = [c for c in out["chunks"] if len(c[2])]
        rows = [(role, float(r), int(n)) for role, gen, rewards in chunks for r, n in zip(rewards, gen["ids"][3].sum(1))]
        everyone = gather_object(rows)  # every process's (role, reward, tokens), in rank order
        start = sum(len(x) for x in gather_object([rows])[:self.accelerator.process_index])
        adv = role_advantages(everyone)[start:start + len(rows)]
        p_ids, p_mask = cat([c[1]["ids"][0] for c in chunks], [c[1]["ids"][1] for c in chunks], "left", self.pad_id())
        c_ids, c_mask = cat([c[1]["ids"][2] for c in chunks], [c[1]["ids"][3] for c in chunks], "right", self.pad_id())
        extra = (-len(rows)) % self.args.steps_per_generation  # rows with no tokens, so the batch splits evenly
        batch = {"prompt_ids": p_ids, "prompt_mask": p_mask, "completion_ids": c_ids, "completion_mask": c_mask,
                 "advantages": torch.tensor(adv, dtype=torch.float32)}
        batch = {k: torch.cat([v, torch.zeros((extra, *v.shape[1:]), dtype=v.dtype)]) if extra else v
                 for k, v in batch.items()}
        batch["prompt_ids"][len(rows):] = batch["completion_ids"][len(rows):] = self.pad_id()
        batch["prompt_mask"][len(rows):, -1] = 1  # one attended token: a fully masked row would give NaN log-probs
        batch = {k: v.to(device) for k, v in batch.items()}
        batch["num_items_in_batch"] = self.accelerator.gather(batch["completion_mask"].sum()).sum()
        self.last = {"roles": [r[0] for r in rows], "rewards": [r[1] for r in rows], "advantages": adv,
                     "row": out["row"], "proposals": out["proposals"], "verified": out["verified"]}
        for key in ("pool_size", "accepted", "proposer_reward", "solver_reward", "judge_format", "seed_accuracy"):
            self._metrics["train"][f"mae/{key}"].append(float(out["row"][key]))
        self.iterations += 1
        return batch

    def pad_id(self) -> int:
        return self.processing_class.pad_token_id

    def state_dict(self) -> dict:
        return {"pool": self.pool.items, "iterations": self.iterations}

    def load_state_dict(self, state: dict) -> None:
        self.pool.items, self.iterations = list(state["pool"]), int(state["iterations"])


def role_advantages(rows) -> list:
    """Each row's advantage from (role, reward, completion tokens) rows: mae.role_advantages (REINFORCE++ returns,
    gamma 1, no KL: the reward at every token, whitened token-weighted within each role) on masks of those lengths;
    constant along a row, so one number per row."""
    if not rows:
        return []
    masks = [torch.ones((1, n)) for _, _, n in rows]
    adv = mae.role_advantages([[r] for _, r, _ in rows], masks, [role for role, _, _ in rows])
    return [float(a[0, 0]) for a in adv]


def pad(rows, value: int, side: str):
    """(ids, mask) of 1-D id tensors padded to one length on `side`."""
    T = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), T), value, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    for i, r in enumerate(rows):
        where = slice(T - len(r), T) if side == "left" else slice(0, len(r))
        ids[i, where], mask[i, where] = r, 1
    return ids, mask


def cat(ids, masks, side: str, value: int):
    """Concatenate (B_i, T_i) id and mask tensors, re-padded on `side` to the longest."""
    T = max(x.shape[1] for x in ids)
    widths = lambda x: (T - x.shape[1], 0) if side == "left" else (0, T - x.shape[1])  # noqa: E731
    return (torch.cat([torch.nn.functional.pad(x, widths(x), value=value) for x in ids]),
            torch.cat([torch.nn.functional.pad(m, widths(m), value=0) for m in masks]))
