"""SFT and DPO for named LoRA adapters on one base model; the DPO reference is the model with adapters
disabled or the adapter as it was before DPO."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from . import config, training


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


def _batches(n, batch_size, epochs, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(n, generator=g)
        yield from order.split(batch_size)


def _seq_logps(model, tok, prompts, completions, system):
    p_ids, p_mask, c_ids, c_mask = training.encode_pairs(tok, prompts, completions, system)
    return training.completion_logps(model, p_ids, p_mask, c_ids, c_mask), c_mask


def _seq_sums(model, tok, prompts, completions, system):
    """Summed completion log-probs per sequence."""
    logps, mask = _seq_logps(model, tok, prompts, completions, system)
    return (logps * mask).sum(1)


def train_sft(model, tok, examples, cfg: PreferenceConfig, adapter_name=None, progress=True) -> list:
    """Supervised fine-tuning on (prompt, completion) pairs, loss on completion tokens only."""
    cfg.validate()
    _activate(model, adapter_name)
    opt = torch.optim.AdamW(training.trainable(model).values(), lr=cfg.lr)
    rows = []
    model.train()
    for step, idx in enumerate(tqdm(list(_batches(len(examples), cfg.batch_size, cfg.epochs, cfg.seed)),
                                    desc=f"sft {adapter_name or ''}", disable=not progress)):
        batch = [examples[i] for i in idx]
        logps, mask = _seq_logps(model, tok, [p for p, _ in batch], [c for _, c in batch], cfg.system)
        loss = sft_loss(logps, mask)
        loss.backward()
        norm = training.optimizer_step(model, opt, cfg.max_grad_norm)
        rows.append({"step": step, "loss": float(loss.detach()), "grad_norm": norm})
    model.eval()
    return rows


REFERENCES = ("base", "initial")


def train_dpo(model, tok, pairs, cfg: PreferenceConfig, adapter_name=None, progress=True, reference: str = "base") -> list:
    """DPO on (prompt, chosen, rejected) triples. Reference: 'base' = all adapters disabled; 'initial' = the
    active adapter as it is before the first step (e.g. the SFT policy), its log-probs computed up front."""
    cfg.validate()
    config.check_choice("reference", reference, REFERENCES)
    _activate(model, adapter_name)
    batches = list(_batches(len(pairs), cfg.batch_size, cfg.epochs, cfg.seed))
    texts = [([p for p, _, _ in b] * 2, [c for _, c, _ in b] + [r for _, _, r in b])
             for b in ([pairs[i] for i in idx] for idx in batches)]
    model.eval()
    refs = []
    if reference == "initial":
        with torch.no_grad():
            refs = [_seq_sums(model, tok, prompts, completions, cfg.system) for prompts, completions in texts]
    opt = torch.optim.AdamW(training.trainable(model).values(), lr=cfg.lr)
    rows = []
    for step, (prompts, completions) in enumerate(tqdm(texts, desc=f"dpo {adapter_name or ''}", disable=not progress)):
        if reference == "base":
            model.eval()
            with torch.no_grad(), model.disable_adapter():
                ref = _seq_sums(model, tok, prompts, completions, cfg.system)
        else:
            ref = refs[step]
        model.train()
        seq = _seq_sums(model, tok, prompts, completions, cfg.system)
        k = len(prompts) // 2
        loss, margin = dpo_loss(seq[:k], seq[k:], ref[:k], ref[k:], cfg.beta)
        loss.backward()
        norm = training.optimizer_step(model, opt, cfg.max_grad_norm)
        rows.append({"step": step, "loss": float(loss.detach()), "margin": float(margin.mean()),
                     "accuracy": float((margin > 0).float().mean()), "grad_norm": norm})
    model.eval()
    return rows
