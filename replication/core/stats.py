"""The workbook's statistics, once: proportion intervals, the bootstrap, AUC/ROC, agreement, win rates.

Every interval is a 95% interval unless `alpha` says otherwise. Differences are always (a - b).
"""
import math

import numpy as np
import pandas as pd
from scipy.special import expit
from scipy.stats import t as student_t
from statsmodels.stats.proportion import proportion_confint

from . import phases


def proportion_ci(k, n, alpha: float = 0.05, method: str = "wilson"):
    """(p, low, high): a proportion with its Wilson interval (statsmodels)."""
    if n <= 0:
        raise ValueError(f"n={n} is not allowed; a proportion needs n >= 1")
    lo, hi = proportion_confint(k, n, alpha=alpha, method=method)
    p = k / n  # at k = 0 or n the interval's end can miss p by a rounding error (1e-16): clamp it
    return p, min(float(lo), p), max(float(hi), p)


def accuracy_table(df: pd.DataFrame, by, column: str = "correct", alpha: float = 0.05) -> pd.DataFrame:
    """Per-group accuracy with n and a Wilson interval, from a 0/1 column."""
    rows = []
    keys = [by] if isinstance(by, str) else list(by)
    for key, g in df.groupby(by, sort=False):
        k, n = int(np.sum(g[column])), len(g)
        p, lo, hi = proportion_ci(k, n, alpha)
        rows.append({**dict(zip(keys, [key] if isinstance(by, str) else key)),
                     "n": n, "accuracy": p, "ci_low": lo, "ci_high": hi})
    return pd.DataFrame(rows)


# ---- the bootstrap ---------------------------------------------------------------------------------

@phases.timed("statistics and plotting")
def bootstrap(statistic, *columns, groups=None, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05):
    """(estimate, low, high): percentile bootstrap of statistic(*columns) over rows, or over whole groups
    (e.g. questions, the unit of dependence) when `groups` labels the rows. Non-finite draws are ignored."""
    cols = [np.asarray(c) for c in columns]
    n = len(cols[0])
    if n == 0 or any(len(c) != n for c in cols):
        raise ValueError("the columns must be non-empty and equally long")
    rng = np.random.default_rng(seed)
    if groups is None:
        idx = rng.integers(0, n, size=(n_boot, n))
    else:
        g = np.asarray(groups)
        members = [np.flatnonzero(g == k) for k in dict.fromkeys(g.tolist())]
        picks = rng.integers(0, len(members), size=(n_boot, len(members)))
        idx = [np.concatenate([members[j] for j in row]) for row in picks]
    draws = np.array([statistic(*(c[i] for c in cols)) for i in idx], dtype=float)
    draws = draws[np.isfinite(draws)]
    est = float(statistic(*cols))
    if not len(draws):
        return est, float("nan"), float("nan")
    lo, hi = np.quantile(draws, [alpha / 2, 1 - alpha / 2])
    return est, float(lo), float(hi)


def paired_bootstrap(a, b, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05, groups=None):
    """(mean(a) - mean(b), low, high) over paired outcomes (the same items), percentile bootstrap."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or not len(a):
        raise ValueError("a and b must be equally long, non-empty 1-d sequences of paired outcomes")
    return bootstrap(lambda x: x.mean(), a - b, groups=groups, n_boot=n_boot, seed=seed, alpha=alpha)


# ---- training comparisons over seeds -------------------------------------------------------------------

class Interval(list):
    """[low, high] of a two-level interval with its question part as `question_variance` (None: not a two-level
    interval), which run.claim records when given the interval; it prints, compares and is written as the list.
    `bounds`: what the quantity can be (None: unbounded); `clipped`: the ends ("low", "high") that `clip` moved onto
    a bound, which core.fmt marks."""

    def __init__(self, low, high, question_variance=None, bounds=None, clipped=()):
        super().__init__((float(low), float(high)))
        self.question_variance = question_variance
        self.bounds = None if bounds is None else (float(bounds[0]), float(bounds[1]))
        self.clipped = tuple(clipped)


class Estimate(tuple):
    """(estimate, low, high) of a two-level interval, with the variance of its question part beside it
    (`question_variance`; None for one seed or draw, whose interval is a percentile bootstrap), so that a ledger row
    can say how its interval would narrow with more seeds (core.power). `interval`: [low, high] as an Interval;
    `bounds` and `clipped` as Interval's."""

    def __new__(cls, estimate, low, high, question_variance=None, bounds=None, clipped=()):
        out = super().__new__(cls, (estimate, low, high))
        out.question_variance = question_variance
        out.bounds = None if bounds is None else (float(bounds[0]), float(bounds[1]))
        out.clipped = tuple(clipped)
        return out

    def __getnewargs__(self):
        return (*self, self.question_variance, self.bounds, self.clipped)

    @property
    def interval(self) -> Interval:
        return Interval(self[1], self[2], self.question_variance, self.bounds, self.clipped)


def clip(estimate, bounds) -> "Estimate":
    """The (estimate, low, high) with its interval's ends kept inside what the quantity can be (bounds=(lo, hi): an
    accuracy or share (0, 1), a difference of two (-1, 1)); an end moved onto a bound is named in `clipped`. A t
    interval between seeds is symmetric and knows no bound, so with three seeds near 0 or 1 it can reach past it;
    the true value lies inside the bounds, so clipping never lowers the interval's coverage. bounds=None: as given."""
    est, low, high = (float(x) for x in estimate)
    qv = getattr(estimate, "question_variance", None)
    if bounds is None:
        return Estimate(est, low, high, qv)
    lo_b, hi_b = (float(b) for b in bounds)
    if not lo_b < hi_b:
        raise ValueError(f"bounds={tuple(bounds)!r} is not allowed; give (low, high) with low < high")
    clipped = [end for end, out in (("low", low < lo_b), ("high", high > hi_b)) if out]
    return Estimate(est, min(max(low, lo_b), hi_b), max(min(high, hi_b), lo_b), qv, (lo_b, hi_b), clipped)


def joined_half(v_seed, v_q, n_seeds: int, alpha: float = 0.05):
    """(half-width, df) of the interval that joins a between-seed variance of the mean (v_seed: the per-seed values'
    variance over S, S - 1 degrees of freedom) with a question part v_q: Student's t with Satterthwaite's degrees of
    freedom (infinite where v_seed is 0). Arrays broadcast. The half-width is not monotone in v_q: a question part
    of about 0.75 v_seed (at S = 3) adds degrees of freedom faster than variance, so the interval narrows before it
    widens."""
    v_seed, v_q = np.asarray(v_seed, dtype=float), np.asarray(v_q, dtype=float)
    v = v_seed + v_q
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(v_seed > 0, v**2 / (v_seed**2 / max(n_seeds - 1, 1)), np.inf)
    half = np.where(v > 0, student_t.ppf(1 - alpha / 2, df) * np.sqrt(np.maximum(v, 0.0)), 0.0)
    return (float(half), float(df)) if half.ndim == 0 else (half, df)


def _variance(draws) -> float:
    """The question part of seeds_and_questions: the variance of the finite draws (0.0 with fewer than two)."""
    q = np.asarray(draws, dtype=float)
    q = q[np.isfinite(q)]
    return float(q.var(ddof=1)) if len(q) > 1 else 0.0


def seeds_and_questions(per_seed, question_draws, alpha: float = 0.05):
    """(low_offset, high_offset, df) of the interval that joins the two sources of spread of a statistic averaged
    over training seeds (or draws): between seeds, the variance of the per-seed values over S (S - 1 degrees of
    freedom); within, the variance of the seed-averaged statistic under resampled questions (the seeds held).
    t interval with Satterthwaite's degrees of freedom (the question part has many; `joined_half`). A percentile
    bootstrap over 3 seeds has only 10 distinct resamples and covers far less than 95% when the seeds differ
    (tests/test_stats.py)."""
    per_seed = np.asarray(per_seed, dtype=float)
    v_seed = per_seed.var(ddof=1) / len(per_seed) if len(per_seed) > 1 else 0.0
    half, df = joined_half(v_seed, _variance(question_draws), len(per_seed), alpha)
    return -half, half, df


@phases.timed("statistics and plotting")
def two_level_bootstrap(diffs, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05, questions: bool = True,
                        bounds=None):
    """(mean, low, high) of a seeds x questions array of paired differences (arm a minus arm b, the same training
    seed and the same held-out question), with an interval that covers both sources of spread: between seeds, a t
    interval from the spread of the per-seed means (S - 1 degrees of freedom), and within, a bootstrap of the
    questions, the same resample for every seed (the seeds answer the same questions), joined by
    `seeds_and_questions`. questions=False: the seeds only, the t interval over per-seed means. One seed gives the
    percentile bootstrap over its questions (one run's interval). The result is an `Estimate`: over seeds its
    question_variance is the question part of the interval (None for one seed). bounds: what the mean can be, its
    interval clipped to them (`clip`)."""
    d = np.asarray(diffs, dtype=float)
    if d.ndim != 2 or not d.size:
        raise ValueError("diffs must be a non-empty seeds x questions array of paired differences")
    n_seeds, n_questions = d.shape
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, n_questions, size=(n_boot, n_questions))
    if n_seeds == 1:
        lo, hi = np.quantile(d[0][rows].mean(axis=1), [alpha / 2, 1 - alpha / 2])
        return clip(Estimate(float(d.mean()), float(lo), float(hi)), bounds)
    draws = d[:, rows].mean(axis=(0, 2)) if questions else np.array([])
    lo, hi, _ = seeds_and_questions(d.mean(axis=1), draws, alpha)
    return clip(Estimate(float(d.mean()), float(d.mean() + lo), float(d.mean() + hi), _variance(draws)), bounds)


@phases.timed("statistics and plotting")
def nested_bootstrap(statistic, units, groups, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05, bounds=None):
    """(mean over units of statistic(*columns), low, high) for any statistic (e.g. an AUC) computed within each unit
    (a training seed, a draw of sampled replies), with two_level_bootstrap's interval: between units, a t interval
    from the spread of the per-unit values; within, the statistic averaged over the units under resampled groups
    (questions, whole, with replacement; the same resample for every unit when all have as many groups, else each
    its own). units: per unit a list of equally long columns; groups: per unit the group label of each row. For a
    plain mean of one value per group it gives two_level_bootstrap's interval; with one unit it is `bootstrap`
    over groups. Non-finite resamples are ignored. The result is an `Estimate` (over units its question part
    beside it); bounds: what the statistic can be (an AUC (0, 1)), its interval clipped to them (`clip`)."""
    if not units:
        return float("nan"), float("nan"), float("nan")
    members = [[np.flatnonzero(np.asarray(g) == k) for k in dict.fromkeys(np.asarray(g).tolist())] for g in groups]
    sizes = {len(m) for m in members}
    values = np.array([statistic(*cols) for cols in units], dtype=float)
    est = float(np.mean(values))
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, max(sizes), size=(n_boot, max(sizes))) if len(sizes) == 1 else None
    boot = np.empty(n_boot)
    for b in range(n_boot):
        drawn = []
        for d, m in enumerate(members):
            r = rows[b] if rows is not None else rng.integers(0, len(m), len(m))
            idx = np.concatenate([m[j] for j in r])
            drawn.append(statistic(*(c[idx] for c in units[d])))
        boot[b] = np.mean(drawn)
    boot = boot[np.isfinite(boot)]
    if not len(boot):
        return est, float("nan"), float("nan")
    if len(units) == 1:
        lo, hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
        return clip(Estimate(est, float(lo), float(hi)), bounds)
    lo, hi, _ = seeds_and_questions(values, boot, alpha)
    return clip(Estimate(est, est + lo, est + hi, _variance(boot)), bounds)


def probability_of_improvement(x, y) -> float:
    """P(X > Y) + P(X = Y) / 2 over every pair of a run of X and a run of Y (the Mann-Whitney statistic; Agarwal
    et al. 2021): x, y the per-seed scores of two arms."""
    x, y = np.asarray(x, dtype=float)[:, None], np.asarray(y, dtype=float)[None, :]
    if not x.size or not y.size:
        raise ValueError("x and y must each hold at least one run's score")
    return float(np.mean((x > y) + 0.5 * (x == y)))


# ---- ranking: AUC and ROC --------------------------------------------------------------------------

def auc(scores, labels) -> float:
    """ROC-AUC by the rank (Mann-Whitney) formula with mid-ranks for ties; nan if a class is empty."""
    from scipy.stats import rankdata

    s, y = np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=bool)
    n1, n0 = int(y.sum()), int((~y).sum())
    if n1 == 0 or n0 == 0:
        return float("nan")
    ranks = rankdata(s)
    return float((ranks[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def roc_curve(scores, labels):
    """(false positive rate, true positive rate) at every threshold, from the highest score down."""
    s, y = np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=bool)
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    last = np.r_[np.flatnonzero(np.diff(s)), len(s) - 1]  # last index of each distinct score
    tp, fp = np.cumsum(y)[last], np.cumsum(~y)[last]
    return np.r_[0, fp / max((~y).sum(), 1)], np.r_[0, tp / max(y.sum(), 1)]


def within_auc(scores, labels, groups) -> float:
    """Mean AUC inside groups that have both classes: what a per-group baseline sees."""
    s, y, g = np.asarray(scores), np.asarray(labels, dtype=bool), np.asarray(groups)
    vals = [auc(s[g == k], y[g == k]) for k in dict.fromkeys(g.tolist())]
    vals = [v for v in vals if not math.isnan(v)]
    return float(np.mean(vals)) if vals else float("nan")


# ---- paired 0/1 outcomes and judges ----------------------------------------------------------------

def agreement(scores, correct, cut: float = 0.5) -> dict:
    """How well judge scores track a verifier: agreement of (score >= cut) with correctness (Wilson 95%),
    the majority-class baseline, the rate of 'correct' verdicts and the AUC."""
    s, c = np.asarray(scores, float), np.asarray(correct, bool)
    p, lo, hi = proportion_ci(int(np.sum((s >= cut) == c)), len(s))
    return {"n": len(s), "agreement": p, "ci95": [lo, hi], "majority_baseline": float(max(c.mean(), 1 - c.mean())),
            "says_correct_rate": float(np.mean(s >= cut)), "auc": auc(s, c)}


# ---- win rates -------------------------------------------------------------------------------------

def win_rate(p, seed: int = 0) -> dict:
    """Mean of per-item win probabilities with a percentile bootstrap 95% interval."""
    p = np.asarray(p, float)
    if np.ptp(p) == 0:
        return {"win_rate": float(p.mean()), "ci95": [float(p.mean())] * 2}
    est, lo, hi = bootstrap(lambda x: x.mean(), p, seed=seed)
    return {"win_rate": est, "ci95": [lo, hi]}


def lc_win_rate(p, len_model, len_ref) -> dict:
    """Length-controlled win rate (the AlpacaEval GLM idea): fit logit P(win) = theta + phi * tanh(d / sd(d))
    with d the length difference in words (statsmodels binomial GLM on the win probabilities) and report
    sigmoid(theta), the win rate at equal length, with its 95% interval."""
    import statsmodels.api as sm

    p = np.clip(np.asarray(p, float), 0.0, 1.0)
    d = np.asarray(len_model, float) - np.asarray(len_ref, float)
    sd = d.std()
    x = np.tanh(d / sd) if sd > 0 else np.zeros_like(d)
    sig = lambda t: float(expit(t))  # noqa: E731  (a separated sample's bound of -3e4 gives 0.0, not an overflow)
    if np.ptp(x) == 0:
        out = win_rate(p)
        return {"lc_win_rate": out["win_rate"], "ci95": out["ci95"], "length_coef": 0.0}
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # perfect separation on small samples: the wide interval says so
        fit = sm.GLM(p, sm.add_constant(x), family=sm.families.Binomial()).fit()
    lo, hi = fit.conf_int()[0]
    return {"lc_win_rate": sig(fit.params[0]), "ci95": [sig(lo), sig(hi)], "length_coef": float(fit.params[1])}
