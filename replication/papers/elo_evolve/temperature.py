"""Elo-Evolve's temperature analysis on the real model (notebook 02, part 2): the Elo arms at several T, and the
degradation experiment (evolve.pool_at: from a stated step the strongest opponent answers with a weaker one's
responses, its rating kept). What each arm was exposed to (how often it drew the strongest opponent, before and after
the degradation, and how often its groups carried no gradient), the final-Elo difference between two temperatures
paired by seed and prompt, and the held-out drop that the degradation causes at each T with the difference of two
drops, all over training seeds (stats.two_level_bootstrap through arms.compare, seeds then questions or prompts)."""
import numpy as np
import pandas as pd

from replication.core import config, stats
from replication.lm import arms
from . import evolve
from .evolve_eval import prompt_rises


def exposure(rows, names, ratings, step: int = None) -> dict:
    """One Elo run's exposure to the strongest opponent: the share of its prompts that drew it, its win rate against
    it (mean outcome) and the share of groups with equal rewards (no GRPO gradient), over the steps before `step`
    and from it on (step None: the whole run as 'before')."""
    top = evolve.strongest(names, ratings)
    cut = len(rows) if step is None else step

    def part(rs):
        if not rs:
            return {"drew_strongest": float("nan"), "win_vs_strongest": float("nan"), "zero_gradient": float("nan")}
        drew = [o == top for r in rs for o in r["opponents"]]
        wins = [np.mean(np.reshape(r["outcomes"], (len(r["opponents"]), -1))[i]) for r in rs
                for i, o in enumerate(r["opponents"]) if o == top]
        return {"drew_strongest": float(np.mean(drew)), "win_vs_strongest": float(np.mean(wins)) if wins else float("nan"),
                "zero_gradient": float(np.mean([r["zero_std_frac"] for r in rs]))}

    before, after = part(rows[:cut]), part(rows[cut:])
    return {"strongest": top, **{f"{k}_before": v for k, v in before.items()}, **{f"{k}_after": v for k, v in after.items()}}


def rating_difference(runs_a, runs_b, k: float, n_boot: int = 2000, seed: int = 0) -> dict:
    """Arm a's final Elo minus arm b's over training seeds, under the mean rule (the start is shared, so the
    difference of the rises): per prompt K x steps x mean(S - E) (evolve_eval.prompt_rises), paired by seed and by
    prompt (seed s of both arms draws the same prompts each step; checked), two-level bootstrap over seeds x prompts."""
    if len(runs_a) != len(runs_b):
        raise ValueError(f"a has {len(runs_a)} seeds and b {len(runs_b)}; pair the same training seeds")
    diffs = []
    for ra, rb in zip(runs_a, runs_b):
        if [r.get("prompts") for r in ra] != [r.get("prompts") for r in rb]:
            raise ValueError("the two arms did not draw the same prompts; pair runs of the same training seed")
        diffs.append(np.asarray(prompt_rises(ra, k)) - np.asarray(prompt_rises(rb, k)))
    x = np.array(diffs)
    r = stats.two_level_bootstrap(x, n_boot=n_boot, seed=config.derive_seed(seed, "rating-difference"))
    n = len(x)
    return {"difference": r[0], "ci95": r.interval, "per_seed": x.mean(axis=1).tolist(), "seeds": n, "prompts": x.shape[1],
            "n": f"{n} seed{'s' if n > 1 else ''} x {x.shape[1]} prompts"}


def _mean(values) -> float:
    """The mean of the finite values (nan when there are none: an undegraded arm has no 'after')."""
    v = np.asarray(values, float)
    return float(v[np.isfinite(v)].mean()) if np.isfinite(v).any() else float("nan")


def _drop(plain, degraded) -> list:
    """Per training seed: the held-out table of the degraded arm minus the plain arm, question by question (id,
    correct: -1, 0 or +1)."""
    out = []
    for p, d in zip(arms.by_seed(plain), arms.by_seed(degraded)):
        a, b = arms.paired(d, p, "correct", on="id")
        out.append(pd.DataFrame({"id": d.merge(p[["id"]], on="id")["id"], "correct": a - b}))
    return out


def _both(records_a, records_b) -> list:
    """Per seed, one health record for a pair of arms: healthy when both are, their failed checks named."""
    return [{"healthy": a["healthy"] and b["healthy"],
             "failed_checks": [f"{a['arm']}: {c}" for c in a["failed_checks"]] + [f"{b['arm']}: {c}" for c in b["failed_checks"]]}
            for a, b in zip(arms.by_seed(records_a), arms.by_seed(records_b))]


def degradation(evals: dict, records: dict, temperatures, seed: int = 0) -> dict:
    """The degradation's effect on held-out accuracy at each T (arms.compare: elo-T<T>-degraded - elo-T<T>, paired by
    seed and question) and, for the first two temperatures, the difference of their drops (the first's drop minus
    the second's: the paper expects T = 20 to fall more than T = 200, a negative difference)."""
    out, drops, recs = {}, {}, {}
    for T in temperatures:
        plain, deg = f"elo-T{T:g}", f"elo-T{T:g}-degraded"
        out[f"T{T:g}"] = arms.compare(deg, plain, evals, records, "correct", on="id",
                                      seed=config.derive_seed(seed, "degradation", T))
        drops[f"drop T{T:g}"], recs[f"drop T{T:g}"] = _drop(evals[plain], evals[deg]), _both(records[deg], records[plain])
    if len(temperatures) >= 2:
        a, b = (f"drop T{T:g}" for T in temperatures[:2])
        out[f"{a} - {b}"] = arms.compare(a, b, drops, recs, "correct", on="id",
                                         seed=config.derive_seed(seed, "degradation-difference"))
    return out


def temperature_table(curves: dict, evals: dict, records: dict, arms_cfg: dict, names, ratings) -> pd.DataFrame:
    """One row per Elo arm (T, degraded from which step): final Elo and held-out accuracy (mean over seeds, and each
    seed's), the share of prompts that drew the strongest opponent and the share of groups with no gradient, before
    and after the degradation step (the whole run for an undegraded arm), and its health."""
    rows = []
    for name, cfg in arms_cfg.items():
        if cfg.regime != "elo" or name not in curves:
            continue
        runs = [c.to_dict("records") if hasattr(c, "to_dict") else c for c in curves[name]]
        ex = [exposure(r, names, ratings, cfg.degrade_step) for r in runs]
        acc = [float(t["correct"].mean()) for t in arms.by_seed(evals[name])]
        failed = arms.failed_text([name], records)
        rows.append({"arm": name, "T": cfg.temperature, "degraded from step": cfg.degrade_step,
                     "final Elo": float(np.mean([r[-1]["rating"] for r in runs])),
                     "accuracy": float(np.mean(acc)), "accuracy by seed": " / ".join(f"{x:.3f}" for x in acc),
                     **{k: _mean([e[k] for e in ex]) for k in ex[0] if k != "strongest"},
                     "health": "healthy" if not failed else failed.replace("failed health check: ", "failed: ")})
    return pd.DataFrame(rows)
