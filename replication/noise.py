"""Noise of absolute vs pairwise judging: OLS for absolute scores, the Thurstone MLE for comparisons.

Absolute: mean judge score per response y = a q + b + e, sigma_residual = sd(e); the ranking noise of two
scores in quality units is sigma_abs,eff = sqrt(2) sigma_residual / a. Pairwise (Thurstone):
P(better one wins | gap d) = Phi(d / sigma_comp), so per gap sigma_comp = d / Phi^-1(accuracy).
"""
import numpy as np
import pandas as pd
import statsmodels.api as sm
from scipy import optimize
from scipy import stats as st

from .stats import proportion_ci


def _as_scores(quality, scores, scale):
    q = np.asarray(quality, dtype=float)
    s = np.asarray(scores, dtype=float)
    s = s[:, None] if s.ndim == 1 else s
    if q.size == 0 or s.size == 0:
        raise ValueError("quality and scores are empty; the fit needs at least 3 responses")
    if q.ndim != 1 or len(q) != len(s):
        raise ValueError(f"quality has {len(q)} entries but scores has {len(s)} rows; they must match")
    if len(q) < 3:
        raise ValueError(f"{len(q)} responses is too few; the fit needs at least 3")
    if np.isnan(s).any() or s.min() < scale[0] or s.max() > scale[1]:
        raise ValueError(f"scores must lie on the scale [{scale[0]}, {scale[1]}] with no missing values")
    return q, s


def fit_absolute(quality, scores, scale=(1, 5)) -> dict:
    """OLS of the mean judge score per response on true quality: a, b, R^2, residual SD, sigma_abs,eff."""
    q, s = _as_scores(quality, scores, scale)
    y = s.mean(1)
    fit = sm.OLS(y, sm.add_constant(q, has_constant="add")).fit()
    b, a = fit.params
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = float(fit.rsquared) if np.ptp(y) > 0 else 0.0
    sigma_residual = float(np.sqrt(fit.mse_resid))
    a_lo, a_hi = fit.conf_int(0.05)[1]
    return {"slope_a": float(a), "intercept_b": float(b), "r2": r2,
            "sigma_residual": sigma_residual,
            "sigma_within2": float(s.var(1, ddof=1).mean()) if s.shape[1] > 1 else float("nan"),
            "sigma_abs_eff": sigma_abs_eff(a, sigma_residual), "slope_a_ci95": [float(a_lo), float(a_hi)],
            "n": int(len(q)), "k": int(s.shape[1])}


def sigma_abs_eff(a: float, sigma_residual: float) -> float:
    """sqrt(2) sigma_residual / a: the noise of a two-score ranking in quality units (inf when a <= 0)."""
    return float(np.sqrt(2) * sigma_residual / a) if a > 1e-12 else float("inf")


def thurstone_sigma(accuracy, gap):
    """Closed-form per-gap probit MLE: gap / Phi^-1(accuracy); inf when accuracy <= 0.5 (no signal)."""
    acc = np.asarray(accuracy, dtype=float)
    z = st.norm.ppf(np.clip(acc, 0.0, 1.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(acc > 0.5, np.asarray(gap, dtype=float) / z, np.inf)
    return float(out) if out.ndim == 0 else out


def _loglik(sigma, gaps, k, n):
    p = np.clip(st.norm.cdf(gaps / sigma), 1e-12, 1 - 1e-12)
    return float(np.sum(k * np.log(p) + (n - k) * np.log1p(-p)))


def fit_pairwise(gaps, wins, alpha: float = 0.05) -> dict:
    """Thurstone MLE of sigma_comp per gap (with intervals) and pooled, and an LR test of one sigma for all gaps.

    Per-gap intervals map the accuracy's Wilson interval through gap / Phi^-1(p), which is monotone in p."""
    g = np.asarray(gaps, dtype=float)
    w = np.asarray(wins, dtype=float)
    if g.size == 0 or len(g) != len(w):
        raise ValueError(f"gaps ({len(g)}) and wins ({len(w)}) must be non-empty and of the same length")
    if not np.isin(w, (0, 1)).all() or (g <= 0).any():
        raise ValueError("wins must be 0/1 (1 = the better response won) and every gap must be > 0")
    table = pd.DataFrame({"gap": g, "win": w}).groupby("gap")["win"].agg(["sum", "count"])
    per_gap = {}
    for gap, (k, n) in table.iterrows():
        acc, lo, hi = proportion_ci(int(k), int(n), alpha)
        per_gap[gap] = {"n": int(n), "accuracy": acc, "accuracy_ci95": [lo, hi],
                        "sigma_comp": thurstone_sigma(acc, gap),
                        "sigma_comp_ci95": [thurstone_sigma(hi, gap), thurstone_sigma(lo, gap)]}
    gv, kv, nv = table.index.to_numpy(float), table["sum"].to_numpy(float), table["count"].to_numpy(float)
    if kv.sum() / nv.sum() <= 0.5 and all(d["accuracy"] <= 0.5 for d in per_gap.values()):
        pooled, ll_pool = float("inf"), _loglik(np.inf, gv, kv, nv)
    else:
        res = optimize.minimize_scalar(lambda ls: -_loglik(np.exp(ls), gv, kv, nv), bounds=(-8, 12), method="bounded")
        pooled, ll_pool = float(np.exp(res.x)), -float(res.fun)
    # separate model: one sigma per gap, so each gap's win probability is its own MLE, constrained to >= 0.5
    p_sep = np.clip(np.maximum(kv / nv, 0.5), 1e-12, 1 - 1e-12)
    ll_sep = float(np.sum(kv * np.log(p_sep) + (nv - kv) * np.log1p(-p_sep)))
    stat = max(2 * (ll_sep - ll_pool), 0.0)
    df = len(gv) - 1
    return {"per_gap": per_gap, "sigma_pooled": pooled,
            "lr_test": {"statistic": stat, "df": df, "p_value": float(st.chi2.sf(stat, df)) if df > 0 else float("nan")}}


def bootstrap(quality, scores, gaps, wins, n_boot: int = 1000, seed: int = 0, gap: float = 1.0, scale=(1, 5)) -> dict:
    """Percentile bootstrap (responses resampled for the fit, pairs within each gap for sigma_comp) of
    sigma_abs,eff, sigma_comp at one gap, and their ratio. Returns the draws and 95% intervals."""
    q, s = _as_scores(quality, scores, scale)
    g, w = np.asarray(gaps, dtype=float), np.asarray(wins, dtype=float)
    rng = np.random.default_rng(seed)
    idx_gap = np.flatnonzero(g == gap)
    if idx_gap.size == 0:
        raise ValueError(f"gap={gap} has no pairs; choose one of {sorted(set(g.tolist()))}")
    abs_eff, comp = np.empty(n_boot), np.empty(n_boot)
    for i in range(n_boot):
        rows = rng.integers(0, len(q), len(q))
        y = s[rows].mean(1)
        a, b = np.polyfit(q[rows], y, 1)
        resid = y - (a * q[rows] + b)
        abs_eff[i] = sigma_abs_eff(a, np.sqrt(resid @ resid / (len(q) - 2)))
        comp[i] = thurstone_sigma(w[rng.choice(idx_gap, idx_gap.size)].mean(), gap)
    with np.errstate(invalid="ignore"):
        ratio = abs_eff / comp  # inf / inf (no signal in either) is undefined: nan, left out of the interval

    def ci(x):  # order statistics, so infinite draws (no signal) give an infinite bound rather than nan
        return [float(np.nanpercentile(x, 2.5, method="lower")), float(np.nanpercentile(x, 97.5, method="higher"))]

    return {"sigma_abs_eff": abs_eff, "sigma_comp": comp, "ratio": ratio,
            "ci95": {"sigma_abs_eff": ci(abs_eff), "sigma_comp": ci(comp), "ratio": ci(ratio)}}


def simulate(n_responses: int, n_pairs: int, a: float, b: float, sigma_residual: float, sigma_within2: float,
             sigma_comp, k: int = 5, gaps=(1, 2, 3, 4), seed: int = 0):
    """A dataset from known parameters: true quality uniform on 1-5; k scores per response whose mean has
    residual SD sigma_residual (item noise plus within-item noise of variance sigma_within2); pairs spread
    evenly over `gaps`, won by the better response with probability Phi(gap / sigma_comp[gap])."""
    rng = np.random.default_rng(seed)
    q = rng.integers(1, 6, n_responses).astype(float)
    item_sd = np.sqrt(max(sigma_residual**2 - sigma_within2 / k, 0.0))
    mean = a * q + b + rng.normal(0, item_sd, n_responses)
    scores = mean[:, None] + rng.normal(0, np.sqrt(sigma_within2), (n_responses, k))
    g = np.resize(np.asarray(gaps, dtype=float), n_pairs)
    sig = np.array([sigma_comp[int(x)] if isinstance(sigma_comp, dict) else sigma_comp for x in g])
    wins = (rng.random(n_pairs) < st.norm.cdf(g / sig)).astype(float)
    return q, scores, g, wins


def coverage(n_datasets: int, truth: dict, n_responses: int, n_pairs: int, n_boot: int = 200, seed: int = 0,
             progress: bool = False) -> pd.DataFrame:
    """Fit many simulated datasets with known truth; one row per dataset with estimates, intervals and coverage."""
    from tqdm.auto import tqdm

    rows = []
    true_ratio = sigma_abs_eff(truth["a"], truth["sigma_residual"]) / truth["sigma_comp"]
    for i in tqdm(range(n_datasets), desc="coverage", disable=not progress):
        q, s, g, w = simulate(n_responses, n_pairs, truth["a"], truth["b"], truth["sigma_residual"],
                              truth["sigma_within2"], truth["sigma_comp"], seed=seed + i)
        fa = fit_absolute(q, s, scale=(-np.inf, np.inf))
        fp = fit_pairwise(g, w)["per_gap"][1.0]
        boot = bootstrap(q, s, g, w, n_boot=n_boot, seed=seed + i, scale=(-np.inf, np.inf))["ci95"]
        rows.append({"a": fa["slope_a"], "a_covered": fa["slope_a_ci95"][0] <= truth["a"] <= fa["slope_a_ci95"][1],
                     "sigma_comp": fp["sigma_comp"],
                     "sigma_comp_covered": fp["sigma_comp_ci95"][0] <= truth["sigma_comp"] <= fp["sigma_comp_ci95"][1],
                     "ratio": fa["sigma_abs_eff"] / fp["sigma_comp"],
                     "ratio_covered": boot["ratio"][0] <= true_ratio <= boot["ratio"][1]})
    return pd.DataFrame(rows)
