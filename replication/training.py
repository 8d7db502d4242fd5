"""Shared training pieces: completion log-probs, the optimizer step, encoding pairs, a phase timer."""
import time
from contextlib import contextmanager

import torch

from . import models
from .loop import trainable


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


class Timer:
    """Accumulates wall time by phase (generation, scoring, backward)."""

    def __init__(self):
        self.seconds = {}

    @contextmanager
    def __call__(self, phase: str):
        t0 = time.perf_counter()
        yield
        self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0
