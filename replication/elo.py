"""Elo for Elo-Evolve: expected score, the policy's batch update, and temperature-based opponent sampling.

Opponent ratings stay fixed; only the policy's rating moves. Sampling is per sample:
p(M_k | pi) is proportional to exp(-|R(pi) - R(M_k)| / T).
"""
import numpy as np

from . import config

UPDATE_RULES = ("sum", "mean")


def expected_score(rating, opponent_rating):
    """E = 1 / (1 + 10^((R_opp - R) / 400)), elementwise."""
    return 1.0 / (1.0 + 10.0 ** ((np.asarray(opponent_rating, float) - np.asarray(rating, float)) / 400.0))


def update(rating: float, outcomes, opponent_ratings, k: float = 32.0, rule: str = "sum") -> float:
    """The policy's rating after a batch: R + K * sum(S_i - E_i) as the paper writes it, or K * mean(...)."""
    config.check_choice("rule", rule, UPDATE_RULES)
    if not isinstance(k, (int, float)) or k < 0:
        raise ValueError(f"k={k!r} is not allowed; the Elo K-factor must be >= 0")
    s = np.asarray(outcomes, float)
    opp = np.asarray(opponent_ratings, float)
    if s.size == 0 or s.shape != opp.shape:
        raise ValueError(f"outcomes ({s.size}) and opponent_ratings ({opp.size}) must be non-empty and the same length")
    delta = s - expected_score(rating, opp)
    return float(rating + k * (delta.sum() if rule == "sum" else delta.mean()))


def sampling_probs(rating: float, pool_ratings, temperature: float) -> np.ndarray:
    """p(M_k | pi) proportional to exp(-|R(pi) - R(M_k)| / T), computed stably."""
    pool = np.asarray(pool_ratings, float)
    if pool.size == 0:
        raise ValueError("pool_ratings is empty; the opponent pool needs at least one opponent")
    if not isinstance(temperature, (int, float)) or temperature <= 0:
        raise ValueError(f"temperature={temperature!r} is not allowed; T must be > 0")
    logits = -np.abs(rating - pool) / temperature
    w = np.exp(logits - logits.max())
    return w / w.sum()


def sample_opponents(rating: float, pool_ratings, temperature: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of n opponents drawn independently (one per sample) from sampling_probs."""
    config.check_int("n", n)
    return rng.choice(len(pool_ratings), size=n, p=sampling_probs(rating, pool_ratings, temperature))


def simulate(temperature: float, steps: int = 1000, batch: int = 128, group: int = 8, k: float = 32.0,
             rule: str = "mean", pool=(1400.0, 1700.0, 2000.0), start: float = 1350.0, eta: float = 1.1,
             degrade_step: int = None, degrade_to: float = None, seed: int = 0):
    """Elo-orchestrated training as a model of learning (documented in notebook 02).

    The policy has a latent skill s (Elo units, starts at `start`). Each step, every one of `batch` prompts
    gets an opponent drawn from sampling_probs(R, pool, T) and `group` samples that win with probability
    expected_score(s, true strength). Only groups with mixed outcomes carry a GRPO gradient, so the skill grows
    by eta times the fraction of mixed groups (expected 1 - p^G - (1 - p)^G). The rating R follows update()
    over all batch x group matches. From `degrade_step` on, the strongest opponent's true strength is
    `degrade_to` while its rating stays fixed. Returns a dict of per-step arrays."""
    config.check_int("steps", steps)
    config.check_int("batch", batch)
    config.check_int("group", group)
    rng = np.random.default_rng(seed)
    ratings = np.asarray(pool, float)
    strength = ratings.copy()
    skill, rating = float(start), float(start)
    out = {key: np.empty(steps) for key in ("rating", "skill", "mixed")}
    out["probs"] = np.empty((steps, len(ratings)))
    for t in range(steps):
        if degrade_step is not None and t == degrade_step:
            strength[-1] = degrade_to
        probs = sampling_probs(rating, ratings, temperature)
        opp = rng.choice(len(ratings), size=batch, p=probs)
        wins = rng.random((batch, group)) < expected_score(skill, strength[opp])[:, None]
        mixed = float(np.mean(wins.any(1) & ~wins.all(1)))
        rating = update(rating, wins.ravel(), np.repeat(ratings[opp], group), k, rule)
        skill += eta * mixed
        out["rating"][t], out["skill"][t], out["mixed"][t], out["probs"][t] = rating, skill, mixed, probs
    return out
