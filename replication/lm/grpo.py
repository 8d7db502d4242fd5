"""GRPO and REINFORCE++ for a LoRA-adapted causal LM: advantages, the clipped loss, and the trainer.

Conventions (see notebooks for the equations):
- group advantages: A_i = (r_i - mean(r)) / (std(r) + 1e-4) within each prompt's G samples, std with
  Bessel's correction (as TRL); a group with zero std gets A = 0; `scale_rewards=False` drops the std;
- the KL term is the k3 estimator exp(ref - logp) - (ref - logp) - 1 against the same model with its
  adapters disabled; with `kl_ratio_correction` (TRL's default `use_bias_correction_kl`) it is multiplied
  by the importance ratio, which makes its gradient the unbiased reverse-KL gradient;
- log-probs are taken of logits / temperature (the sampling distribution), for completion tokens only.
"""
import contextlib
from dataclasses import asdict, dataclass

import torch

from replication.core import config
from . import loop, models, training
from .rollout import Recorder, Rollout

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo")
ADVANTAGES = ("group", "reinforce++")
ROLLOUT_DTYPES = ("float32", "bfloat16")
UPDATE_DTYPES = ("float32", "bfloat16")


@dataclass
class GRPOConfig:
    """Settings of a GRPO / REINFORCE++ run; `validate()` names any bad value."""

    num_generations: int = 8          # G samples per prompt
    max_new_tokens: int = 48
    temperature: float = 1.0
    top_p: float = 1.0                # nucleus sampling in the rollout (1.0: off)
    top_k: int = 0                    # keep the k most likely tokens (0: unset, so generate() keeps its default 50)
    min_p: float = 0.0                # drop tokens below min_p x the top probability (0: off)
    rollout_dtype: str = "float32"    # float32 | bfloat16: sample from a bf16 copy of the policy (faster on a CPU
                                      # with AVX-512 BF16); the update and the reference follow update_dtype
    update_dtype: str = "float32"     # float32 | bfloat16: the update and the scoring passes (reference and old
                                      # log-probs) with the frozen base weights in bf16 (training.LowPrecisionBase;
                                      # LoRA weights, their gradients, AdamW state, attention, log-softmax and loss
                                      # stay fp32; its tolerance against fp32: docs/training.md, Precision)
    length_buckets: int = 1           # the scoring and update passes run the completions in up to this many
                                      # passes of similar length, each as wide as its longest row
                                      # (training.length_buckets): same loss, less computed padding
    lr: float = 1e-5
    weight_decay: float = 0.0
    kl_beta: float = 0.04             # KL coefficient (TRL's `beta`)
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    loss_type: str = "grpo"           # grpo | bnpo | dr_grpo
    scale_rewards: bool = True
    advantage: str = "group"          # group (GRPO) | reinforce++ (whitened per metadata["group"], or whole batch)
    num_iterations: int = 1           # updates per generation batch (old log-probs stored)
    grad_accum_steps: int = 1         # micro-batches per optimizer step
    max_grad_norm: float = 1.0
    kl_ratio_correction: bool = True
    seed: int = 0
    save_every: int = 10
    system: str = None

    def validate(self) -> "GRPOConfig":
        config.check_choice("advantage", self.advantage, ADVANTAGES)
        # group advantages need G >= 2 samples per prompt
        config.check_int("num_generations", self.num_generations, minimum=2 if self.advantage == "group" else 1)
        for name in ("max_new_tokens", "num_iterations", "grad_accum_steps", "length_buckets"):
            config.check_int(name, getattr(self, name))
        config.check_int("save_every", self.save_every, minimum=0)
        config.check_int("seed", self.seed, minimum=0)
        if not isinstance(self.kl_beta, (int, float)) or self.kl_beta < 0:
            raise ValueError(f"kl_beta={self.kl_beta!r} is not allowed; the KL coefficient must be >= 0")
        for name in ("epsilon_low", "epsilon_high"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not 0 < v < 1:
                raise ValueError(f"{name}={v!r} is not allowed; it must lie in (0, 1)")
        config.check_choice("loss_type", self.loss_type, LOSS_TYPES)
        config.check_range("temperature", self.temperature, 1e-6, 10.0)
        config.check_range("top_p", self.top_p, 1e-6, 1.0)
        config.check_int("top_k", self.top_k, minimum=0)
        config.check_range("min_p", self.min_p, 0.0, 1.0)
        config.check_choice("rollout_dtype", self.rollout_dtype, ROLLOUT_DTYPES)
        config.check_choice("update_dtype", self.update_dtype, UPDATE_DTYPES)
        config.check_range("lr", self.lr, *config.LR_RANGE)
        return self


def group_advantages(rewards: torch.Tensor, G: int, scale: bool = True, eps: float = 1e-4):
    """GRPO advantages within groups of G consecutive samples; also which samples sit in a zero-std group."""
    r = rewards.view(-1, G)
    std = r.std(1, keepdim=True)
    adv = r - r.mean(1, keepdim=True)
    if scale:
        adv = adv / (std + eps)
    zero = torch.isclose(std, torch.zeros_like(std)).expand_as(r)
    return adv.reshape(-1), zero.reshape(-1)


def reinforce_pp_advantages(rewards, mask, groups=None, token_kl=None, kl_coef: float = 0.0, eps: float = 1e-8):
    """REINFORCE++: per-token returns (gamma = 1) of the outcome reward minus kl_coef * KL per token,
    whitened (token-weighted mean and variance) over the batch, or within each group label
    (Task-Relative REINFORCE++ whitens each role's batch separately). Shape (B, T)."""
    mask = mask.float()
    token_rewards = torch.zeros_like(mask)
    if token_kl is not None:
        token_rewards = token_rewards - kl_coef * token_kl * mask
    last = (mask.sum(1) - 1).clamp(min=0).long()
    token_rewards[torch.arange(len(rewards), device=mask.device), last] += rewards.to(mask.device)
    returns = token_rewards.flip(1).cumsum(1).flip(1) * mask
    labels = list(groups) if groups is not None else [0] * len(rewards)
    adv = torch.zeros_like(returns)
    for g in dict.fromkeys(labels):
        idx = torch.tensor([i for i, x in enumerate(labels) if x == g], device=mask.device)
        x, m = returns[idx], mask[idx]
        mean = (x * m).sum() / m.sum().clamp(min=1.0)
        var = ((x - mean) ** 2 * m).sum() / m.sum().clamp(min=1.0)
        adv[idx] = (x - mean) * torch.rsqrt(var + eps) * m
    return adv


def grpo_loss(logps, old_logps, ref_logps, advantages, mask, kl_beta: float = 0.04, epsilon_low: float = 0.2,
              epsilon_high: float = 0.2, loss_type: str = "grpo", max_completion_length: int = None,
              kl_ratio_correction: bool = True):
    """PPO-clipped surrogate plus kl_beta * k3 KL, aggregated as grpo / bnpo / dr_grpo. Returns (loss, stats)."""
    mask = mask.float()
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages  # (B, 1) or (B, T)
    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    per_token = -torch.min(ratio * adv, clipped * adv)
    kl = torch.zeros_like(logps)
    if kl_beta != 0.0:
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1
        if kl_ratio_correction:
            kl = kl * ratio
        per_token = per_token + kl_beta * kl
    if loss_type == "grpo":
        loss = ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "dr_grpo":
        if not max_completion_length:
            raise ValueError("max_completion_length is required for loss_type='dr_grpo'")
        loss = (per_token * mask).sum() / (per_token.size(0) * max_completion_length)
    else:
        raise ValueError(f"loss_type={loss_type!r} is not allowed; choose one of {', '.join(LOSS_TYPES)}")
    n, kl = mask.sum().clamp(min=1.0), kl.detach()
    is_clipped = ((ratio < 1 - epsilon_low) & (adv < 0)) | ((ratio > 1 + epsilon_high) & (adv > 0))
    stats = {"kl": float((kl * mask).sum() / n), "clip_frac": float((is_clipped.float() * mask).sum() / n)}
    return loss, stats


class GRPOTrainer:
    """Samples G completions per prompt, scores them, and updates the active LoRA adapter.

    reward_fn(prompts, completions, metadata, log_metric=..., log_extra=...) -> one number per completion;
    the two callables collect side data into the rollout record (see replication.lm.rollout)."""

    def __init__(self, model, tok, reward_fn, cfg: GRPOConfig):
        self.model, self.tok, self.reward_fn, self.cfg = model, tok, reward_fn, cfg.validate()
        params = list(training.trainable(model).values())
        if not params:
            raise ValueError("model has no trainable parameters; attach a LoRA adapter with models.add_lora")
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.timer = training.Timer()
        self.sampler = training.SamplingCopy(model, torch.bfloat16) if cfg.rollout_dtype == "bfloat16" else None
        self.low = training.LowPrecisionBase(model) if cfg.update_dtype == "bfloat16" else None

    def precision(self):
        """The context the update and scoring passes run in: the base weights in bf16 (update_dtype="bfloat16"),
        or nothing (fp32)."""
        return self.low if self.low is not None else contextlib.nullcontext()

    def rollout(self, prompts, metadata=None) -> Rollout:
        """Generate, reward and compute advantages (and stored old / reference log-probs) for one batch."""
        cfg, G = self.cfg, self.cfg.num_generations
        metadata = metadata or [{} for _ in prompts]
        texts = models.chat_prompts(self.tok, prompts, cfg.system)
        rep = lambda xs: [x for x in xs for _ in range(G)]  # noqa: E731
        self.model.eval()
        with self.timer("generation"):  # G samples per prompt from one shared prefill
            policy = self.model if self.sampler is None else self.sampler.sync()
            p_ids, p_mask, c_ids, c_mask = models.sample(policy, self.tok, texts, cfg.max_new_tokens,
                                                           cfg.temperature, cfg.top_p, repeats=G, top_k=cfg.top_k,
                                                           min_p=cfg.min_p)
        completions = [self.tok.decode(ids[m.bool()], skip_special_tokens=True) for ids, m in zip(c_ids, c_mask)]
        rec = Recorder(len(completions))
        with self.timer("reward"):
            rewards = torch.tensor(self.reward_fn(rep(prompts), completions, rep(metadata), log_metric=rec.log_metric,
                                                  log_extra=rec.log_extra), dtype=torch.float32, device=c_ids.device)
        if rewards.shape != (len(completions),):
            raise ValueError(f"reward_fn returned {tuple(rewards.shape)} rewards for {len(completions)} completions")
        batch = Rollout(p_ids, p_mask, c_ids, c_mask, completions, rewards, G, metrics=rec.metrics, extras=rec.extras)
        with torch.no_grad(), self.timer("scoring"), self.precision():
            if cfg.num_iterations > 1:
                batch.old_logps = self._logps(batch)
            if cfg.kl_beta > 0:
                with self.model.disable_adapter():
                    batch.ref_logps = self._logps(batch)
        batch.zero_std = (group_advantages(rewards, G)[1] if G > 1
                          else torch.zeros(len(rewards), dtype=torch.bool, device=rewards.device))
        if cfg.advantage == "group":
            batch.advantages = group_advantages(rewards, G, cfg.scale_rewards)[0]
        else:
            groups = [m.get("group", 0) for m in rep(metadata)]
            batch.advantages = reinforce_pp_advantages(rewards, c_mask, groups)
        return batch

    def collect(self, draw, groups: int, keep=None, max_rollouts: int = 1):
        """Rollouts of draw(attempt) -> (prompts, metadata) until `groups` kept prompts or max_rollouts tries.

        keep(rollout) -> one bool per prompt (all kept when None): the hook for filters such as RLPR's
        adaptive std filter. Returns (the kept rows, at most `groups` prompts, or None; every rollout made)."""
        config.check_int("max_rollouts", max_rollouts)
        kept, made = [], []
        for attempt in range(max_rollouts):
            prompts, metadata = draw(attempt)
            batch = self.rollout(prompts, metadata)
            made.append(batch)
            mask = [True] * (len(batch) // batch.group_size) if keep is None else list(keep(batch))
            if any(mask):
                kept.append(batch.groups(mask))
            if sum(len(b) for b in kept) >= groups * batch.group_size:
                break
        if not kept:
            return None, made
        merged = Rollout.concat(kept, self.tok.pad_token_id)
        return merged.select(range(min(len(merged), groups * merged.group_size))), made

    def _logps(self, batch: Rollout, rows=slice(None)):
        """Completion log-probs of the batch's rows (whole groups) under the model as it is now; each group's
        prompt is encoded once (training.grouped_logps)."""
        return training.grouped_logps(self.model, batch.prompt_ids[rows], batch.prompt_mask[rows],
                                      batch.completion_ids[rows], batch.completion_mask[rows], batch.group_size,
                                      self.cfg.temperature, self.cfg.length_buckets)

    def update(self, batch: Rollout) -> dict:
        """num_iterations optimizer steps on one generation batch, each over grad_accum_steps micro-batches."""
        cfg = self.cfg
        self.model.train()
        G = batch.group_size  # micro-batches hold whole groups, so each prompt is encoded once
        chunks = [(g[:, None] * G + torch.arange(G)).reshape(-1)
                  for g in torch.arange(len(batch) // G).chunk(cfg.grad_accum_steps)]
        out = {"loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "grad_norm": 0.0}
        for _ in range(cfg.num_iterations):
            for rows in chunks:
                with self.timer("backward"), self.precision():  # forward and backward in one precision block
                    logps = self._logps(batch, rows)
                    old = logps.detach() if batch.old_logps is None else batch.old_logps[rows]
                    ref = None if batch.ref_logps is None else batch.ref_logps[rows]
                    loss, stats = grpo_loss(logps, old, ref, batch.advantages[rows], batch.completion_mask[rows],
                                            cfg.kl_beta, cfg.epsilon_low, cfg.epsilon_high, cfg.loss_type,
                                            cfg.max_new_tokens, cfg.kl_ratio_correction)
                    (loss / len(chunks)).backward()
                w = 1 / (len(chunks) * cfg.num_iterations)
                out["loss"] += float(loss.detach()) * w
                out["kl"] += stats["kl"] * w
                out["clip_frac"] += stats["clip_frac"] * w
            with self.timer("backward"):
                norm = training.optimizer_step(self.model, self.optimizer, cfg.max_grad_norm)
            out["grad_norm"] += norm / cfg.num_iterations
        self.model.eval()
        return out

    def step(self, prompts, metadata=None, step: int = 0) -> dict:
        """One full GRPO step (generation, scoring, update) with a seed derived from (seed, step)."""
        torch.manual_seed(config.derive_seed(self.cfg.seed, "grpo-step", step))
        self.timer.seconds.clear()
        batch = self.rollout(prompts, metadata)
        stats = self.update(batch)
        return {**step_stats(batch), **stats, **self.times(batch)}

    def times(self, batch: Rollout) -> dict:
        """Wall time of the step by phase, and completion tokens per second."""
        wall = sum(self.timer.seconds.values())
        return {"tokens_per_s": int(batch.completion_mask.sum()) / max(wall, 1e-9), "wall_s": wall,
                **{f"{k}_s": v for k, v in self.timer.seconds.items()}}

    def train(self, sampler, num_steps: int, folder: "loop.RunFolder" = None, progress: bool = True) -> list:
        """Steps 0..num_steps with sampler(step) -> (prompts, metadata), on the resumable loop. Returns the rows."""
        rows, _ = loop.run(lambda step, state: self.step(*sampler(step), step=step), num_steps, self.model,
                           self.optimizer, folder, save_every=self.cfg.save_every, desc="grpo",
                           postfix=lambda r: {"reward": f"{r['reward_mean']:.3f}", "kl": f"{r['kl']:.4f}"},
                           summary={"config": asdict(self.cfg)}, progress=progress)
        return rows


def step_stats(batch: Rollout) -> dict:
    """What every GRPO step logs about its batch: reward, zero-gradient groups, length, reward side data."""
    r = batch.rewards
    return {"reward_mean": float(r.mean()), "reward_std": float(r.std()) if len(r) > 1 else 0.0,
            "zero_std_frac": float(batch.zero_std.float().mean()),
            "completion_len": float(batch.completion_mask.sum()) / len(r), **batch.metrics}
