"""SFT and DPO for named LoRA adapters on one base model; the DPO reference is the model with adapters
disabled or the adapter as it was before DPO. Both trainers are step functions on the one loop (loop.run)."""
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from replication.core import config, phases
from . import loop, models, training


@dataclass
class PreferenceConfig:
    """Settings shared by SFT and DPO runs."""

    lr: float = 1e-4
    epochs: int = 1
    batch_size: int = 8
    dpo_beta: float = 0.1        # DPO temperature (TRL's `beta`)
    max_grad_norm: float = 1.0
    seed: int = 0
    system: str = None

    def validate(self) -> "PreferenceConfig":
        config.check_int("epochs", self.epochs)
        config.check_int("batch_size", self.batch_size)
        config.check_int("seed", self.seed, minimum=0)
        config.check_range("lr", self.lr, *config.LR_RANGE)
        if not isinstance(self.dpo_beta, (int, float)) or self.dpo_beta <= 0:
            raise ValueError(f"dpo_beta={self.dpo_beta!r} is not allowed; the DPO beta must be > 0")
        return self


def dpo_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, dpo_beta: float = 0.1):
    """Sigmoid DPO loss on summed completion log-probs: -log sigmoid(dpo_beta * (chosen margin - rejected margin))."""
    margin = (chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps)
    return -F.logsigmoid(dpo_beta * margin).mean(), margin.detach()


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


def _per_epoch(n, batch_size) -> int:
    return -(-n // batch_size)


class _BestEpoch:
    """The held-out check behind `validation`: the adapter's weights at the epoch end (epoch 0: before training)
    with the lowest validation loss, put back when training ends. Each epoch's loss goes into its last step's row."""

    def __init__(self, model, measure):
        self.model, self.measure = model, measure
        self.loss, self.epoch, self.state, self.curve = float("inf"), 0, None, []
        self.check(0)

    @torch.no_grad()
    def check(self, epoch):
        self.model.eval()
        loss = float(self.measure())
        self.curve.append(loss)
        if loss < self.loss:
            self.loss, self.epoch = loss, epoch
            self.state = {k: v.detach().clone() for k, v in training.trainable(self.model).items()}
        self.model.train()
        return loss

    @torch.no_grad()
    def restore(self, rows):
        params = training.trainable(self.model)
        for k, v in self.state.items():
            params[k].copy_(v)
        if rows:
            rows[-1].update(best_epoch=self.epoch, val_curve=list(self.curve))


def _batches(n, batch_size, epochs, seed) -> list:
    """Index batches: one seeded shuffle of range(n) per epoch, cut into batch_size pieces (none if n == 0)."""
    g = torch.Generator().manual_seed(seed)
    return [b for _ in range(epochs) for b in torch.randperm(n, generator=g).split(batch_size) if len(b)]


def _seq_logps(model, tok, prompts, completions, system):
    """Per-token completion log-probs and mask; each distinct prompt is encoded once and a leading run the prompts
    share (the system turn, the same worked examples) once for all (training.shared_prompt_logps): a DPO batch
    holds every prompt twice, and MALT's prompts open with the same ~200 tokens of worked examples."""
    distinct = {}                                      # a prompt is a string or a list of chat turns
    which = torch.tensor([distinct.setdefault(repr(p), (len(distinct), p))[0] for p in prompts])
    p_ids, p_mask, c_ids, c_mask = training.encode_pairs(tok, [p for _, p in distinct.values()], completions, system,
                                                         models.device_of(model))
    return training.shared_prompt_logps(model, p_ids, p_mask, which, c_ids, c_mask), c_mask


def _seq_sums(model, tok, prompts, completions, system):
    """Summed completion log-probs per sequence."""
    logps, mask = _seq_logps(model, tok, prompts, completions, system)
    return (logps * mask).sum(1)


def sft_validation_loss(model, tok, examples, cfg: PreferenceConfig) -> float:
    """Mean over held-out (prompt, completion) pairs of the completion's per-token NLL (no gradient)."""
    total = 0.0
    for i in range(0, len(examples), cfg.batch_size):
        batch = examples[i:i + cfg.batch_size]
        with torch.no_grad():
            logps, mask = _seq_logps(model, tok, [p for p, _ in batch], [c for _, c in batch], cfg.system)
        total += float(-((logps * mask).sum(1) / mask.sum(1).clamp(min=1)).sum())
    return total / len(examples)


@phases.timed("update")
def train_sft(model, tok, examples, cfg: PreferenceConfig, adapter_name=None, progress=True, validation=None) -> list:
    """Supervised fine-tuning on (prompt, completion) pairs, loss on completion tokens only; one row per step.

    With `validation` (held-out pairs), the NLL on them is measured before training and after every epoch, and
    the adapter ends at the epoch with the lowest (0: the adapter as it was): the last row holds `best_epoch`
    and `val_curve`, each epoch's last row its `val_loss`."""
    cfg.validate()
    _activate(model, adapter_name)
    batches = _batches(len(examples), cfg.batch_size, cfg.epochs, cfg.seed)
    if not batches:
        return []
    opt = torch.optim.AdamW(training.trainable(model).values(), lr=cfg.lr)
    per_epoch = _per_epoch(len(examples), cfg.batch_size)
    best = _BestEpoch(model, lambda: sft_validation_loss(model, tok, validation, cfg)) if validation else None

    def step(i, state):
        batch = [examples[k] for k in batches[i]]
        logps, mask = _seq_logps(model, tok, [p for p, _ in batch], [c for _, c in batch], cfg.system)
        loss = sft_loss(logps, mask)
        loss.backward()
        row = {"loss": float(loss.detach()), "grad_norm": training.optimizer_step(model, opt, cfg.max_grad_norm)}
        if best is not None and (i + 1) % per_epoch == 0:
            row["val_loss"] = best.check((i + 1) // per_epoch)
        return row

    model.train()
    rows, _ = loop.run(step, len(batches), model, opt, desc=f"sft {adapter_name or ''}", progress=progress)
    if best is not None:
        best.restore(rows)
    model.eval()
    return rows


REFERENCES = ("base", "initial")


def _pair_texts(pairs):
    return [p for p, _, _ in pairs] * 2, [c for _, c, _ in pairs] + [r for _, _, r in pairs]


@phases.timed("update")
def train_dpo(model, tok, pairs, cfg: PreferenceConfig, adapter_name=None, progress=True, reference: str = "base",
              validation=None) -> list:
    """DPO on (prompt, chosen, rejected) triples. Reference: 'base' = all adapters disabled; 'initial' = the
    active adapter as it is before the first step (e.g. the SFT policy), its log-probs computed up front.

    With `validation` (held-out triples), their DPO loss against the same reference is measured before training
    and after every epoch, and the adapter ends at the epoch with the lowest, as in train_sft."""
    cfg.validate()
    config.check_choice("reference", reference, REFERENCES)
    _activate(model, adapter_name)
    batches = _batches(len(pairs), cfg.batch_size, cfg.epochs, cfg.seed)
    if not batches:
        return []
    texts = [_pair_texts([pairs[i] for i in idx]) for idx in batches]
    val = [_pair_texts(validation[i:i + cfg.batch_size]) for i in range(0, len(validation or []), cfg.batch_size)]
    model.eval()
    refs, val_refs = [], []
    with torch.no_grad(), (nullcontext() if reference == "initial" else model.disable_adapter()):
        if reference == "initial":
            refs = [_seq_sums(model, tok, prompts, completions, cfg.system) for prompts, completions in texts]
        val_refs = [_seq_sums(model, tok, prompts, completions, cfg.system) for prompts, completions in val]

    def val_loss():
        seqs = [_seq_sums(model, tok, prompts, completions, cfg.system) for prompts, completions in val]
        return sum(float(dpo_loss(s[:len(s) // 2], s[len(s) // 2:], r[:len(r) // 2], r[len(r) // 2:], cfg.dpo_beta)[0]) * (len(s) // 2)
                   for s, r in zip(seqs, val_refs)) / len(validation)

    per_epoch = _per_epoch(len(pairs), cfg.batch_size)
    best = _BestEpoch(model, val_loss) if validation else None
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
        loss, margin = dpo_loss(seq[:k], seq[k:], ref[:k], ref[k:], cfg.dpo_beta)
        loss.backward()
        norm = training.optimizer_step(model, opt, cfg.max_grad_norm)
        row = {"loss": float(loss.detach()), "margin": float(margin.mean()),
               "accuracy": float((margin > 0).float().mean()), "grad_norm": norm}
        if best is not None and (i + 1) % per_epoch == 0:
            row["val_loss"] = best.check((i + 1) // per_epoch)
        return row

    rows, _ = loop.run(step, len(texts), model, opt, desc=f"dpo {adapter_name or ''}", progress=progress)
    if best is not None:
        best.restore(rows)
    model.eval()
    return rows
