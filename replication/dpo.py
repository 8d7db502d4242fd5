"""SFT and DPO for named LoRA adapters on one base model; the DPO reference is the model with adapters
disabled or the adapter as it was before DPO. Both trainers are step functions on the one loop (loop.run)."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import config, loop, training


@dataclass
class PreferenceConfig:
    """Settings shared by SFT and DPO runs."""

    lr: float = 1e-4
    epochs: int = 1
    batch_size: int = 8
    beta: float = 0.1            # DPO temperature
    max_grad_norm: float = 1.0
    seed: int = 0
    system: str = None

    def validate(self) -> "PreferenceConfig":
        config.check_int("epochs", self.epochs)
        config.check_int("batch_size", self.batch_size)
        config.check_int("seed", self.seed, minimum=0)
        config.check_range("lr", self.lr, 0.0, 1.0)
        if not isinstance(self.beta, (int, float)) or self.beta <= 0:
            raise ValueError(f"beta={self.beta!r} is not allowed; the DPO beta must be > 0")
        return self


def dpo_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta: float = 0.1):
    """Sigmoid DPO loss on summed completion log-probs: -log sigmoid(beta * (chosen margin - rejected margin))."""
    margin = (chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps)
    return -F.logsigmoid(beta * margin).mean(), margin.detach()


def sft_loss(logps, mask):
    """Negative log-likelihood of the completion tokens (mean over tokens)."""
    mask = mask.float()
    return -(logps * mask).sum() / mask.sum().clamp(min=1.0)


def _activate(model, adapter_name):
    """Make `adapter_name` the active (and only trainable) adapter."""
    if adapter_name is not None:
        model.set_adapter(adapter_name)
    if not training.trainable(model):
        raise ValueError("model has no trainable parameters; attach a LoRA adapter with models.add_lora")


def _batches(n, batch_size, epochs, seed) -> list:
    """Index batches: one seeded shuffle of range(n) per epoch, cut into batch_size pieces (none if n == 0)."""
    g = torch.Generator().manual_seed(seed)
    return [b for _ in range(epochs) for b in torch.randperm(n, generator=g).split(batch_size) if len(b)]


def _seq_logps(model, tok, prompts, completions, system):
    p_ids, p_mask, c_ids, c_mask = training.encode_pairs(tok, prompts, completions, system)
    return training.completion_logps(model, p_ids, p_mask, c_ids, c_mask), c_mask


def _seq_sums(model, tok, prompts, completions, system):
    """Summed completion log-probs per sequence."""
    logps, mask = _seq_logps(model, tok, prompts, completions, system)
    return (logps * mask).sum(1)


def train_sft(model, tok, examples, cfg: PreferenceConfig, adapter_name=None, progress=True) -> list:
    """Supervised fine-tuning on (prompt, completion) pairs, loss on completion tokens only; one row per step."""
    cfg.validate()
    _activate(model, adapter_name)
    batches = _batches(len(examples), cfg.batch_size, cfg.epochs, cfg.seed)
    if not batches:
        return []
    opt = torch.optim.AdamW(training.trainable(model).values(), lr=cfg.lr)

    def step(i, state):
        batch = [examples[k] for k in batches[i]]
        logps, mask = _seq_logps(model, tok, [p for p, _ in batch], [c for _, c in batch], cfg.system)
        loss = sft_loss(logps, mask)
        loss.backward()
        return {"loss": float(loss.detach()), "grad_norm": training.optimizer_step(model, opt, cfg.max_grad_norm)}

    model.train()
    rows, _ = loop.run(step, len(batches), model, opt, desc=f"sft {adapter_name or ''}", progress=progress)
    model.eval()
    return rows


REFERENCES = ("base", "initial")


def train_dpo(model, tok, pairs, cfg: PreferenceConfig, adapter_name=None, progress=True, reference: str = "base") -> list:
    """DPO on (prompt, chosen, rejected) triples. Reference: 'base' = all adapters disabled; 'initial' = the
    active adapter as it is before the first step (e.g. the SFT policy), its log-probs computed up front."""
    cfg.validate()
    config.check_choice("reference", reference, REFERENCES)
    _activate(model, adapter_name)
    batches = _batches(len(pairs), cfg.batch_size, cfg.epochs, cfg.seed)
    if not batches:
        return []
    texts = [([p for p, _, _ in b] * 2, [c for _, c, _ in b] + [r for _, _, r in b])
             for b in ([pairs[i] for i in idx] for idx in batches)]
    model.eval()
    refs = []
    if reference == "initial":
        with torch.no_grad():
            refs = [_seq_sums(model, tok, prompts, completions, cfg.system) for prompts, completions in texts]
    opt = torch.optim.AdamW(training.trainable(model).values(), lr=cfg.lr)

    def step(i, state):
        prompts, completions = texts[i]
        if reference == "base":
            model.eval()
            with torch.no_grad(), model.disable_adapter():
                ref = _seq_sums(model, tok, prompts, completions, cfg.system)
        else:
            ref = refs[i]
        model.train()
        seq = _seq_sums(model, tok, prompts, completions, cfg.system)
        k = len(prompts) // 2
        loss, margin = dpo_loss(seq[:k], seq[k:], ref[:k], ref[k:], cfg.beta)
        loss.backward()
        norm = training.optimizer_step(model, opt, cfg.max_grad_norm)
        return {"loss": float(loss.detach()), "margin": float(margin.mean()),
                "accuracy": float((margin > 0).float().mean()), "grad_norm": norm}

    rows, _ = loop.run(step, len(texts), model, opt, desc=f"dpo {adapter_name or ''}", progress=progress)
    model.eval()
    return rows
