"""How many seeds a comparison needs: the chance of each verdict when a comparison over seeds is run again.

A comparison over training seeds (or draws of sampled replies) keeps in its ledger row the per-seed differences and
the two-level interval (stats.seeds_and_questions). Run again on the same held-out questions, with other seeds or
with the same seeds under other rounding (which makes each seed's run another run), its estimate is the mean of S
fresh per-seed differences; their spread is what the row's own seeds estimate, and the question part of the interval
stays, since the questions do. Taking the measured difference and seed spread as the truth (a pilot, the way Colas
et al. 2018 plan the number of seeds), `verdict_chances` draws S per-seed differences from a normal spread, joins
their variance with the question part as the notebooks do (stats.joined_half), and reads each simulated run with the
one rule (verdicts.from_interval). It gives the chance of each verdict, of two such runs giving the same verdict, of
the interval clearing no effect, and of every seed landing on the paper's side (shown for the reader; the rule does
not require it, since that chance falls as seeds are added whenever a seed can land on the other side).

The plug-in truth is the pilot's: a seed SD estimated from three seeds is uncertain by a factor of about two either
way (`sd_range`), and the measured difference is itself a draw, so the chances are a plan, not a prediction.
"""
import numpy as np
from scipy.optimize import brentq
from scipy.stats import chi2

from . import config, stats, verdicts

OUTCOMES = ("reproduced", "partly", "inconclusive", "not reproduced")


def question_variances(per_seed, interval, alpha: float = 0.05) -> list:
    """The question part v_q of a recorded two-level interval: the values for which stats.joined_half(var/S, v_q, S)
    gives the interval's half-width, the per-seed values' variance being what it is. The half-width first falls, then
    rises, as v_q grows (stats.joined_half), so a width may fit two values, the smaller first; a width below the
    lowest reachable (rounding) fits the v_q at that lowest point. [0.0] for a zero-width interval."""
    per_seed = np.asarray(per_seed, dtype=float)
    if per_seed.size < 2:
        raise ValueError(f"per_seed has {per_seed.size} value(s); the question part needs at least two seeds")
    low, high = (float(x) for x in interval)
    half, n = (high - low) / 2, per_seed.size
    v_seed = float(per_seed.var(ddof=1)) / n
    if half <= 0:
        return [0.0]
    if v_seed <= 1e-12 * half**2:   # the seeds agree (to rounding): the width is the question part's alone
        return [(half / stats.joined_half(0.0, 1.0, n, alpha)[0]) ** 2]
    f = lambda r: stats.joined_half(v_seed, r * v_seed, n, alpha)[0] - half  # noqa: E731
    grid = np.concatenate([[0.0], np.geomspace(1e-4, 1e6, 400)])
    values = np.array([f(r) for r in grid])
    roots = [brentq(f, grid[i], grid[i + 1]) * v_seed
             for i in range(len(grid) - 1) if values[i] == 0 or np.sign(values[i]) != np.sign(values[i + 1])]
    if not roots:
        roots = [float(grid[int(np.argmin(np.abs(values)))]) * v_seed]
    return sorted({round(r, 15) for r in roots})


def verdict_chances(mean: float, seed_sd: float, question_variance: float, n_seeds: int, direction: int = +1,
                    null: float = 0.0, effect: float = None, sims: int = 2000, seed: int = 0,
                    alpha: float = 0.05) -> dict:
    """The chance of each verdict (OUTCOMES) for a comparison run over n_seeds seeds whose per-seed differences are
    normal(mean, seed_sd) and whose interval has the question part question_variance, by `sims` simulated runs read
    with verdicts.from_interval; `same`: two such runs giving the same verdict (the sum of squared chances);
    `clears`: the interval lies wholly on the paper's side of null; `every_seed`: every seed's difference does."""
    config.check_int("n_seeds", n_seeds, minimum=2)
    config.check_int("sims", sims, minimum=1)
    if not (np.isfinite(mean) and np.isfinite(seed_sd) and seed_sd >= 0):
        raise ValueError(f"mean={mean!r}, seed_sd={seed_sd!r} are not allowed; give a finite mean and seed_sd >= 0")
    if not (np.isfinite(question_variance) and question_variance >= 0):
        raise ValueError(f"question_variance={question_variance!r} is not allowed; give a finite value >= 0")
    rng = np.random.default_rng(seed)
    d = rng.normal(mean, seed_sd, size=(sims, n_seeds))   # (sims, S) per-seed differences
    m = d.mean(axis=1)
    half, _ = stats.joined_half(d.var(axis=1, ddof=1) / n_seeds, question_variance, n_seeds, alpha)
    words = [verdicts.from_interval(a - h, a + h, direction, null, effect, row) for a, h, row in zip(m, half, d)]
    out = {w: words.count(w) / sims for w in OUTCOMES}
    out["same"] = sum(p * p for p in out.values())
    out["clears"] = float(np.mean((np.where(direction > 0, m - half, m + half) - null) * direction > 0))
    out["every_seed"] = float(np.mean(np.all((d - null) * direction > 0, axis=1)))
    return out


def sd_range(seed_sd: float, n_seeds: int, level: float = 0.9):
    """The chi-square interval (level) of a standard deviation estimated from n_seeds values: how far a pilot's seed
    spread may be off (from three seeds, about 0.58x to 4.4x at 90%)."""
    config.check_int("n_seeds", n_seeds, minimum=2)
    k = n_seeds - 1
    return (float(seed_sd * np.sqrt(k / chi2.ppf(1 - (1 - level) / 2, k))),
            float(seed_sd * np.sqrt(k / chi2.ppf((1 - level) / 2, k))))


def project(claim: dict, seeds=(3, 5, 10, 20), sims: int = 2000, seed: int = 0, spans: bool = False) -> dict:
    """A ledger row's plan: for each number of seeds, each chance of verdict_chances as (low, high) over the question
    parts: the row's recorded `question_variance` where it has one, else those its interval fits
    (question_variances; one value gives low == high). The row needs `interval`, `seed_differences` (two or more),
    `estimate`, `direction`, `null` and `effect` as the metrics record them.

    spans=True adds `spans`: for each number of seeds, each chance as (low, high) over the question parts and over
    the seed SD at the measured value and at the two ends of its 90% interval (`sd_range`), which carries the
    uncertainty of a spread measured from a few seeds into the plan (the chances at those three SDs; a chance that
    peaks in between is not searched for)."""
    diffs = np.asarray(claim.get("seed_differences") or [], dtype=float)
    if diffs.size < 2 or claim.get("interval") is None:
        raise ValueError("the claim needs an interval and two or more seed_differences to project")
    sd = float(diffs.std(ddof=1))
    recorded = claim.get("question_variance")
    parts = [float(recorded)] if recorded is not None else question_variances(diffs, claim["interval"])
    est = float(claim["estimate"]) if claim.get("estimate") is not None else float(diffs.mean())
    sd_ends = sd_range(sd, diffs.size)

    def span(s: int, sds) -> dict:
        """Each chance as (low, high) over the question parts and the given (tag, SD)s, at s seeds."""
        runs = [verdict_chances(est, x, v, s, claim.get("direction", 1), claim.get("null", 0.0), claim.get("effect"),
                                sims=sims, seed=config.derive_seed(seed, "power", s, k, *tag))
                for tag, x in sds for k, v in enumerate(parts)]
        return {k: (min(r[k] for r in runs), max(r[k] for r in runs)) for k in runs[0]}

    plans = {s: span(s, [((), sd)]) for s in seeds}
    out = {"estimate": est, "seed_sd": sd, "sd_range": sd_ends, "question_variances": parts,
           "seeds_now": int(diffs.size), "plans": plans}
    if spans:   # the measured SD's chances and those at the ends of its 90% interval
        out["spans"] = {s: span(s, [((), sd), *((("sd", j), x) for j, x in enumerate(sd_ends))]) for s in seeds}
    return out
