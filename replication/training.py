"""Shared training pieces: sampling with token ids, completion log-probs, checkpoints and step logs."""
import json
import random
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from . import files, models


def completion_logps(model, prompt_ids, prompt_mask, completion_ids, mask, temperature: float = 1.0):
    """Per-token log-probs of the completion tokens only, shape (B, T); logits for prompt positions are skipped."""
    input_ids = torch.cat([prompt_ids, completion_ids], 1)
    attention = torch.cat([prompt_mask, mask], 1)
    positions = models.position_ids(attention)
    T = completion_ids.shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention, position_ids=positions,
                   logits_to_keep=T + 1, use_cache=False).logits[:, :-1]  # (B, T, V)
    logits = logits / temperature
    return logits.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)


def optimizer_step(model, optimizer, max_grad_norm: float) -> float:
    """Clip the trainable parameters' gradient norm, step, zero the gradients; returns the norm before clipping."""
    norm = torch.nn.utils.clip_grad_norm_(trainable(model).values(), max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)


def encode_pairs(tok, prompts, completions, system=None):
    """Chat-templated prompts (left-padded) and completions + EOS (right-padded), as id tensors with masks."""
    texts = models.chat_prompts(tok, prompts, system)
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    comp = [tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for c in completions]
    T = max(map(len, comp))
    ids = torch.full((len(comp), T), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(comp), T), dtype=torch.long)
    for i, c in enumerate(comp):
        ids[i, :len(c)], mask[i, :len(c)] = torch.tensor(c), 1
    return enc["input_ids"], enc["attention_mask"], ids, mask


def trainable(model) -> dict:
    """The parameters the optimizer updates (the active LoRA adapter), by name."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


class RunFolder:
    """A training run's folder: config, step log (JSONL), checkpoints, and a done marker."""

    def __init__(self, folder):
        self.path = Path(folder)
        self.path.mkdir(parents=True, exist_ok=True)
        self.log_path = self.path / "metrics.jsonl"

    @classmethod
    def keyed(cls, base, name: str, config: dict):
        """runs/.../<name>-<hash of config>: the same config finds the same folder."""
        folder = cls(Path(base) / f"{name}-{files.digest(config)}")
        if not (folder.path / "config.json").is_file():
            files.write_json(folder.path / "config.json", config)
        return folder

    @property
    def done(self) -> bool:
        return (self.path / "done.json").is_file()

    def mark_done(self, summary: dict) -> None:
        files.write_json(self.path / "done.json", summary)

    def log(self, row: dict) -> None:
        with self.log_path.open("a") as f:
            f.write(json.dumps(row, default=files._jsonable) + "\n")

    def rows(self) -> list:
        if not self.log_path.is_file():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]

    def save(self, step: int, model, optimizer, extra=None) -> Path:
        """Checkpoint after `step` completed steps: trainable weights, optimizer, RNG states, written atomically."""
        path = self.path / "checkpoints" / f"step_{step:06d}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        state = {"step": step, "weights": {n: p.detach().clone() for n, p in trainable(model).items()},
                 "optimizer": optimizer.state_dict(), "rng": rng_state(), "extra": extra or {}}
        torch.save(state, tmp)
        tmp.replace(path)
        return path

    def latest(self):
        ckpts = sorted((self.path / "checkpoints").glob("step_*.pt"))
        return ckpts[-1] if ckpts else None

    def restore(self, model, optimizer) -> dict:
        """Load the latest checkpoint into model and optimizer; truncate the log to it. Returns its state."""
        path = self.latest()
        if path is None:
            return {"step": 0, "extra": {}}
        state = torch.load(path, weights_only=False)
        params = trainable(model)
        with torch.no_grad():
            for n, w in state["weights"].items():
                params[n].copy_(w)
        optimizer.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"])
        files.write_text(self.log_path, "".join(json.dumps(r) + "\n" for r in self.rows() if r["step"] < state["step"]))
        return state


class Timer:
    """Accumulates wall time by phase (generation, scoring, backward)."""

    def __init__(self):
        self.seconds = {}

    @contextmanager
    def __call__(self, phase: str):
        t0 = time.perf_counter()
        yield
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0
