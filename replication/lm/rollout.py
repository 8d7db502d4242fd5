"""The rollout record: one generation batch with its rewards, advantages and side data.

Rows are completions; a prompt's G completions are consecutive (a group). Reward functions report side
data through the two callables they receive, as TRL's reward functions do: `log_metric(name, value)`
for a number about the batch and `log_extra(name, values)` for one value per completion. Per-completion
extras travel with their rows through `select` and `concat`.
"""
from dataclasses import dataclass, field, fields, replace

import torch


@dataclass
class Rollout:
    prompt_ids: torch.Tensor        # (B, P) left-padded
    prompt_mask: torch.Tensor       # (B, P)
    completion_ids: torch.Tensor    # (B, T) right-padded
    completion_mask: torch.Tensor   # (B, T)
    completions: list               # B decoded texts
    rewards: torch.Tensor           # (B,)
    group_size: int                 # G consecutive rows per prompt
    advantages: torch.Tensor = None  # (B,) or (B, T)
    zero_std: torch.Tensor = None   # (B,) bool: the row's group has equal rewards (no GRPO gradient)
    old_logps: torch.Tensor = None  # (B, T) when num_iterations > 1
    ref_logps: torch.Tensor = None  # (B, T) when kl_beta > 0
    metrics: dict = field(default_factory=dict)  # name -> number (reward functions' log_metric)
    extras: dict = field(default_factory=dict)   # name -> list of B values (reward functions' log_extra)

    def __len__(self) -> int:
        return len(self.completions)

    def group_std(self) -> torch.Tensor:
        """Per-prompt standard deviation of the rewards (Bessel-corrected), shape (B / G,)."""
        return self.rewards.view(-1, self.group_size).std(1)

    def select(self, rows) -> "Rollout":
        """The given rows (a list of indices), every per-row field and extra alike."""
        rows = list(rows)
        idx = torch.as_tensor(rows, dtype=torch.long)
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if torch.is_tensor(v):
                v = v[idx]
            elif f.name == "completions":
                v = [v[i] for i in rows]
            elif f.name == "extras":
                v = {k: [x[i] for i in rows] for k, x in v.items()}
            out[f.name] = v
        return replace(self, **out)

    def groups(self, keep) -> "Rollout":
        """The rows of the groups (prompts) where keep[g] is true."""
        G = self.group_size
        return self.select([g * G + j for g, k in enumerate(keep) if k for j in range(G)])

    @staticmethod
    def concat(parts, pad_id: int) -> "Rollout":
        """One rollout from several: prompts re-padded on the left, completions and log-probs on the right."""
        parts = list(parts)
        if len(parts) == 1:
            return parts[0]
        if len({p.group_size for p in parts}) != 1:
            raise ValueError("rollouts with different group sizes cannot be joined")
        P = max(p.prompt_ids.shape[1] for p in parts)
        T = max(p.completion_ids.shape[1] for p in parts)
        left = lambda x, v: torch.nn.functional.pad(x, (P - x.shape[1], 0), value=v)  # noqa: E731
        right = lambda x, v: torch.nn.functional.pad(x, (0, T - x.shape[1]), value=v)  # noqa: E731
        cat = lambda name, pad=None: (None if getattr(parts[0], name) is None  # noqa: E731
                                      else torch.cat([pad(getattr(p, name)) if pad else getattr(p, name) for p in parts]))
        adv_pad = (lambda x: right(x, 0.0)) if parts[0].advantages is not None and parts[0].advantages.dim() == 2 else None
        return Rollout(
            prompt_ids=cat("prompt_ids", lambda x: left(x, pad_id)), prompt_mask=cat("prompt_mask", lambda x: left(x, 0)),
            completion_ids=cat("completion_ids", lambda x: right(x, pad_id)),
            completion_mask=cat("completion_mask", lambda x: right(x, 0)),
            completions=[c for p in parts for c in p.completions], rewards=cat("rewards"), group_size=parts[0].group_size,
            advantages=cat("advantages", adv_pad), zero_std=cat("zero_std"),
            old_logps=cat("old_logps", lambda x: right(x, 0.0)), ref_logps=cat("ref_logps", lambda x: right(x, 0.0)),
            metrics={k: v for p in parts for k, v in p.metrics.items()},
            extras={k: [x for p in parts for x in p.extras.get(k, [None] * len(p))] for k in parts[0].extras})


class Recorder:
    """The logging callables handed to a reward function, collecting into a rollout's metrics and extras."""

    def __init__(self, n: int):
        self.n, self.metrics, self.extras = n, {}, {}

    def log_metric(self, name: str, value) -> None:
        self.metrics[name] = float(value)

    def log_extra(self, name: str, values) -> None:
        values = list(values)
        if len(values) != self.n:
            raise ValueError(f"log_extra({name!r}) got {len(values)} values for {self.n} completions")
        self.extras[name] = values
