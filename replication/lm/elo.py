"""Elo for Elo-Evolve: expected score, the policy's batch update, temperature-based opponent sampling,
rating fits to round-robin win rates, and the learning model of notebook 02 with its summaries.

Opponent ratings stay fixed; only the policy's rating moves. One opponent is drawn per prompt (shared by its
G samples): p(M_k | pi) is proportional to exp(-|R(pi) - R(M_k)| / T).
"""
import numpy as np

from replication.core import config, paper, stats

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


def fit_ratings(wins: np.ndarray, anchor: int = 0, anchor_rating: float = 1350.0) -> np.ndarray:
    """Elo ratings maximising the Bradley-Terry likelihood of round-robin win rates (wins[i, j] = P(i beats j)),
    with player `anchor` fixed at anchor_rating (ratings in Elo points, base 10, scale 400)."""
    from scipy import optimize

    w = np.clip(np.asarray(wins, float), 1e-6, 1 - 1e-6)
    n = len(w)
    free = [i for i in range(n) if i != anchor]
    off = ~np.eye(n, dtype=bool)

    def nll(x):
        r = np.full(n, float(anchor_rating))
        r[free] = x
        e = expected_score(r[:, None], r[None, :])
        return -np.sum(w[off] * np.log(e[off]) + (1 - w[off]) * np.log(1 - e[off]))

    r = np.full(n, float(anchor_rating))
    r[free] = optimize.minimize(nll, np.full(n - 1, float(anchor_rating)), method="BFGS").x
    return r


# ---- the paper's setting and the notebook's simulation summaries ------------------------------------

def paper_setting() -> dict:
    """Fig. 2's setting from data/paper/elo_evolve_temperature.csv: opponent names and ratings, the policy's
    start rating, K and the batch size."""

    t = paper.table("elo_evolve_temperature")
    opp = t[t["quantity"] == "opponent_rating"]
    return {"names": opp["opponent"].tolist(), "pool": opp["value"].astype(float).tolist(),
            "start": paper.value("elo_evolve_temperature", quantity="start_rating"),
            "k": paper.value("elo_evolve_temperature", quantity="k_factor"),
            "batch": int(paper.value("elo_evolve_temperature", quantity="batch_size"))}


def paper_values(quantity: str, temperature=None) -> list:
    """The paper's numbers of one quantity of Fig. 2 (e.g. 'start_prob', 'final_elo'), optionally at one T,
    in the table's (opponent) order."""

    t = paper.table("elo_evolve_temperature")
    t = t[t["quantity"] == quantity]
    if temperature is not None:
        t = t[t["temperature"] == float(temperature)]
    if t.empty:
        raise ValueError(f"quantity={quantity!r} at temperature={temperature!r} is not in elo_evolve_temperature")
    return t["value"].astype(float).tolist()


def plot_sampling(pool, names, temperature: float = 200.0, rating: float = None, show: bool = True):
    """Bar chart of the sampling probabilities at one temperature and policy rating (default: the weakest
    opponent's rating minus 50); the notebook's sliders redraw it. Shown (returns None) or returned."""
    import matplotlib.pyplot as plt

    rating = float(min(pool)) - 50 if rating is None else rating
    fig, ax = plt.subplots(figsize=(4, 2.5))
    ax.bar(names, sampling_probs(rating, pool, temperature))
    ax.set_ylim(0, 1)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title(f"T = {temperature:g}, R = {rating:g}")
    if show:
        plt.show()
        return None
    return fig


def simulate_seeds(temperature: float, n: int, seed: int = 0, **kw) -> list:
    """n runs of simulate() at one temperature, run i seeded with config.derive_seed(seed, 'elo-sim', i)
    (the same seeds at every temperature and setting, so runs compare pairwise)."""
    config.check_int("n", n)
    return [simulate(temperature, seed=config.derive_seed(seed, "elo-sim", i), **kw) for i in range(n)]


def summarize(sims: list, window: int) -> dict:
    """Per-temperature summary of simulated runs: mean final Elo with a bootstrap 95% interval over seeds,
    mean final skill, the largest change of any probability within `window` steps (abrupt switches vs smooth
    drift) and the range of all probabilities over the run."""

    final = np.array([s["rating"][-1] for s in sims])
    est, lo, hi = stats.bootstrap(np.mean, final) if len(final) > 1 else (float(final[0]),) * 3
    probs = np.stack([s["probs"] for s in sims])
    return {"final_elo_mean": est, "final_elo_ci95": [lo, hi],
            "final_skill_mean": float(np.mean([s["skill"][-1] for s in sims])),
            "max_window_change": float(np.max(np.abs(probs[:, window:] - probs[:, :-window]))),
            "prob_range": [float(probs.min()), float(probs.max())]}


def degradation_summary(sims: list, degrade_step: int, before: int = 100) -> dict:
    """Skill gained per step in the `before` steps up to degrade_step and from it to the end, their ratio
    (learning rate after / before), and the final skill and rating; means over seeds."""
    sk, rt = np.stack([s["skill"] for s in sims]), np.stack([s["rating"] for s in sims])
    steps = sk.shape[1]
    if not 1 <= degrade_step < steps:
        raise ValueError(f"degrade_step={degrade_step} is not allowed; it must lie in [1, {steps - 1}]")
    b = (sk[:, degrade_step - 1] - sk[:, max(degrade_step - before, 0)]) / max(min(before, degrade_step - 1), 1)
    a = (sk[:, -1] - sk[:, degrade_step]) / max(steps - 1 - degrade_step, 1)
    return {"skill_gain_per_step_before": float(b.mean()), "skill_gain_per_step_after": float(a.mean()),
            "relative_rate_after": float(a.mean() / b.mean()) if b.mean() else float("nan"),
            "final_skill": float(sk[:, -1].mean()), "final_rating": float(rt[:, -1].mean())}


def temperature_sweep(temperatures, n: int, seed: int, degrade_step: int, degrade_to: float, **kw):
    """Final Elo, final skill, final skill when the strongest opponent degrades, and the share of groups
    with mixed outcomes, per temperature (means over n seeds): a DataFrame."""
    import pandas as pd

    rows = []
    for T in temperatures:
        plain = simulate_seeds(T, n, seed, **kw)
        deg = simulate_seeds(T, n, seed, degrade_step=degrade_step, degrade_to=degrade_to, **kw)
        rows.append({"T": T, "final_elo": float(np.mean([s["rating"][-1] for s in plain])),
                     "final_skill": float(np.mean([s["skill"][-1] for s in plain])),
                     "final_skill_degraded": float(np.mean([s["skill"][-1] for s in deg])),
                     "mixed_share": float(np.mean([s["mixed"].mean() for s in plain]))})
    return pd.DataFrame(rows)
