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

from replication.core import config, phases
from replication.core.stats import proportion_ci
from replication.lm import judges, tasks


def judge_key(params) -> dict:
    """Notebook 01's key of the real judge's scores and comparisons (judge_corpus), from its parameters (run.params):
    the corpus and pairs follow from the question count, pairs per question and seed."""
    P = params
    return {"model": P.model, "judge_questions": P.judge_questions, "pairs_per_question": P.pairs_per_question,
            "k": P.k, "seed": P.seed, "instruction": tasks.INSTRUCTION, "batch_size": P.batch_size}


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


@phases.timed("statistics and plotting")
def bootstrap_ratio(quality, scores, gaps, wins, n_boot: int = 1000, seed: int = 0, gap: float = 1.0, scale=(1, 5),
                    groups=None) -> dict:
    """Percentile bootstrap of sigma_abs,eff, sigma_comp at one gap, and their ratio: responses are resampled
    for the regression and, independently, the comparisons of that gap for sigma_comp (whole pairs when
    `groups` labels the comparisons, e.g. k sampled verdicts of one pair). Returns the draws and 95% intervals.

    Not stats.bootstrap: the two samples are resampled separately, and a draw with no signal (slope <= 0 or
    accuracy <= 0.5) is an infinite noise that must stay in the interval (as an infinite bound), not be dropped."""
    q, s = _as_scores(quality, scores, scale)
    g, w = np.asarray(gaps, dtype=float), np.asarray(wins, dtype=float)
    if len(g) != len(w) or (groups is not None and len(groups) != len(g)):
        raise ValueError(f"gaps ({len(g)}), wins ({len(w)}) and groups must be of the same length")
    rng = np.random.default_rng(seed)
    idx_gap = np.flatnonzero(g == gap)
    if idx_gap.size == 0:
        raise ValueError(f"gap={gap} has no pairs; choose one of {sorted(set(g.tolist()))}")
    if groups is not None:
        labels = np.asarray(groups)[idx_gap]
        members = [idx_gap[labels == k] for k in dict.fromkeys(labels.tolist())]
    abs_eff, comp = np.empty(n_boot), np.empty(n_boot)
    for i in range(n_boot):
        rows = rng.integers(0, len(q), len(q))
        y = s[rows].mean(1)
        a, b = np.polyfit(q[rows], y, 1)
        resid = y - (a * q[rows] + b)
        abs_eff[i] = sigma_abs_eff(a, np.sqrt(resid @ resid / (len(q) - 2)))
        if groups is None:
            picked = rng.choice(idx_gap, idx_gap.size)
        else:
            picked = np.concatenate([members[j] for j in rng.integers(0, len(members), len(members))])
        comp[i] = thurstone_sigma(w[picked].mean(), gap)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = abs_eff / comp  # inf / inf (no signal in either) is undefined: nan, left out of the interval;
        # x / 0 (every comparison of the draw right) is inf
    return {"sigma_abs_eff": abs_eff, "sigma_comp": comp, "ratio": ratio,
            "ci95": {"sigma_abs_eff": _ci(abs_eff), "sigma_comp": _ci(comp), "ratio": _ci(ratio)}}


def redraw_ratios(quality, probs, k: int, score_seeds, gaps, wins=None, p_better=None, verdict_seeds=None,
                  n_boot: int = 1000, boot_seed: int = 0, gap: float = 1.0) -> pd.DataFrame:
    """The real judge's noise ratio over independent draws of its sampled judgments, fitted as in the notebook.
    Each draw takes the k prompted 1-5 scores per response again from `probs` (score_seeds, one per draw) and,
    given p_better, the k A/B verdicts per pair (verdict_seeds; bootstrap resamples whole pairs); otherwise the
    comparisons `wins` (one per pair, gaps) stay, as for a deterministic judge. One row per draw: sigma_abs,eff,
    sigma_comp at `gap`, the ratio and its bootstrap 95% interval (bootstrap_ratio with boot_seed)."""
    q, g = np.asarray(quality, float), np.asarray(gaps, float)
    rows = []
    for i, s in enumerate(score_seeds):
        scores = judges.sample_scores(probs, k, s)
        if p_better is None:
            w, gg, groups = np.asarray(wins, float), g, None
        else:
            w, gg = judges.sample_wins(p_better, k, verdict_seeds[i]).ravel(), np.repeat(g, k)
            groups = np.repeat(np.arange(len(g)), k)
        fa, fp = fit_absolute(q, scores), fit_pairwise(gg, w)["per_gap"].get(gap, {"sigma_comp": float("nan")})
        lo, hi = bootstrap_ratio(q, scores, gg, w, n_boot=n_boot, seed=boot_seed, gap=gap, groups=groups)["ci95"]["ratio"]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = fa["sigma_abs_eff"] / fp["sigma_comp"] if fp["sigma_comp"] else float("inf")
        rows.append({"draw": i, "sigma_abs_eff": fa["sigma_abs_eff"], "sigma_comp": fp["sigma_comp"], "ratio": ratio,
                     "ratio_lo": lo, "ratio_hi": hi})
    return pd.DataFrame(rows)


def _ci(x) -> list:
    """95% percentile interval by order statistics, so infinite draws (no signal) give an infinite bound
    rather than nan; [0, inf] (no information) when every draw is undefined."""
    x = np.asarray(x, dtype=float)
    if np.isnan(x).all():
        return [0.0, float("inf")]
    return [float(np.nanpercentile(x, 2.5, method="lower")), float(np.nanpercentile(x, 97.5, method="higher"))]


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


# A world where the signal is real, for the calibration check (sigma_within2 comes from the paper).
CALIBRATION = {"a": 0.5, "b": 1.5, "sigma_residual": 0.7, "sigma_comp": 2.0}


def coverage(n_datasets: int, truth: dict, n_responses: int, n_pairs: int, n_boot: int = 200, seed: int = 0,
             progress: bool = False) -> pd.DataFrame:
    """Fit many simulated datasets with known truth; one row per dataset with estimates, intervals and coverage."""
    from tqdm.auto import tqdm

    rows = []
    true_ratio = sigma_abs_eff(truth["a"], truth["sigma_residual"]) / truth["sigma_comp"]
    for i in tqdm(range(n_datasets), desc="coverage", disable=not progress):
        q, s, g, w = simulate(n_responses, n_pairs, truth["a"], truth["b"], truth["sigma_residual"],
                              truth["sigma_within2"], truth["sigma_comp"], seed=config.derive_seed(seed, "dataset", i))
        fa = fit_absolute(q, s, scale=(-np.inf, np.inf))
        fp = fit_pairwise(g, w)["per_gap"][1.0]
        boot = bootstrap_ratio(q, s, g, w, n_boot=n_boot, seed=config.derive_seed(seed, "bootstrap", i),
                               scale=(-np.inf, np.inf))["ci95"]
        rows.append({"a": fa["slope_a"], "a_covered": fa["slope_a_ci95"][0] <= truth["a"] <= fa["slope_a_ci95"][1],
                     "sigma_comp": fp["sigma_comp"],
                     "sigma_comp_covered": fp["sigma_comp_ci95"][0] <= truth["sigma_comp"] <= fp["sigma_comp_ci95"][1],
                     "ratio": fa["sigma_abs_eff"] / fp["sigma_comp"],
                     "ratio_covered": boot["ratio"][0] <= true_ratio <= boot["ratio"][1]})
    return pd.DataFrame(rows)


def coverage_band(n_datasets: int, nominal: float = 0.95) -> list:
    """[low, high]: where the observed coverage of a nominal interval over n datasets falls if the interval is
    calibrated, within three binomial standard errors of the nominal level (capped at 1)."""
    se = np.sqrt(nominal * (1 - nominal) / n_datasets)
    return [float(nominal - 3 * se), float(min(1.0, nominal + 3 * se))]


# ---- the paper's numbers recomputed from its own statistics ------------------------------------------

def half_unit(values) -> float:
    """Half a unit in the last digit of a column of published numbers (0.0005 for 0.551, 0.005 for 25.53)."""
    decimals = max(len(np.format_float_positional(float(v), trim="-").partition(".")[2]) for v in np.atleast_1d(values))
    return 0.5 * 10.0 ** -decimals


def rounding_band(f, values, units) -> tuple:
    """(f(values), how far f moves when each input moves by its rounding half unit): f is taken at every
    corner of the box, which bounds it when f is monotone in each input (all functions here are)."""
    import itertools

    v0 = float(f(*values))
    corners = [float(f(*(v + s * u for v, s, u in zip(values, signs, units))))
               for signs in itertools.product((-1, 1), repeat=len(values))]
    return v0, max(abs(c - v0) for c in corners)


def reproduce_paper(stats, by_gap: pd.DataFrame) -> pd.DataFrame:
    """Each reported sigma recomputed from the paper's reported inputs, with the tolerance its rounding allows:
    the inputs' rounding carried through the formula plus half a unit of the reported value's last digit.

    stats: the `value` column of elo_evolve_noise by `statistic`; by_gap: elo_evolve_noise_by_gap."""
    by_gap = by_gap.set_index("gap") if "gap" in by_gap.columns else by_gap
    u_acc, u_sig = half_unit(by_gap["accuracy"]), half_unit(by_gap["sigma_comp"])
    u_a, u_s = half_unit(stats["slope_a"]), half_unit(stats["sigma_residual"])
    rows = []
    for gap, r in by_gap.iterrows():
        v, tol = rounding_band(lambda acc: thurstone_sigma(acc, gap), [r["accuracy"]], [u_acc])
        rows.append({"quantity": f"sigma_comp gap {int(gap)}", "paper": r["sigma_comp"], "recomputed": v, "tolerance": tol + u_sig})
    v, tol = rounding_band(sigma_abs_eff, [stats["slope_a"], stats["sigma_residual"]], [u_a, u_s])
    rows.append({"quantity": "sigma_abs,eff", "paper": stats["sigma_abs_eff"], "recomputed": v,
                 "tolerance": tol + half_unit(stats["sigma_abs_eff"])})
    u_ratio = half_unit(stats["ratio_gap1"])
    v, tol = rounding_band(lambda e, c: e / c, [stats["sigma_abs_eff"], by_gap.loc[1, "sigma_comp"]],
                           [half_unit(stats["sigma_abs_eff"]), u_sig])
    rows.append({"quantity": "ratio gap 1 (the paper's sigmas)", "paper": stats["ratio_gap1"], "recomputed": v,
                 "tolerance": tol + u_ratio})
    v, tol = rounding_band(lambda a, s, acc: sigma_abs_eff(a, s) / thurstone_sigma(acc, 1.0),
                           [stats["slope_a"], stats["sigma_residual"], by_gap.loc[1, "accuracy"]], [u_a, u_s, u_acc])
    rows.append({"quantity": "ratio gap 1 (from the statistics)", "paper": stats["ratio_gap1"], "recomputed": v,
                 "tolerance": tol + u_ratio})
    out = pd.DataFrame(rows).set_index("quantity")
    out["within"] = (out["recomputed"] - out["paper"]).abs() <= out["tolerance"]
    return out


def slope_ci_from_stats(a: float, sigma_residual: float, n: int, levels=(1, 2, 3, 4, 5), alpha: float = 0.05) -> list:
    """The OLS slope's interval from reported statistics alone: SE(a) = sigma_residual / (sd(q) sqrt(n)),
    with true quality spread evenly over `levels` (the paper does not give its distribution)."""
    se = sigma_residual / (np.std(np.asarray(levels, dtype=float)) * np.sqrt(n))
    z = st.norm.ppf(1 - alpha / 2)
    return [float(a - z * se), float(a + z * se)]


# ---- tables and formatting for the notebook -----------------------------------------------------------


def by_gap_table(paper_by_gap: pd.DataFrame, fits: dict) -> pd.DataFrame:
    """Accuracy and sigma_comp by gap with 95% intervals: the paper's (no intervals) beside each named fit_pairwise
    result; a sigma interval is the accuracy's Wilson interval mapped through gap / Phi^-1(p)."""
    rows = []
    for _, r in paper_by_gap.iterrows():
        gap = float(r["gap"])
        rows.append({"gap": int(gap), "source": "paper", "accuracy": r["accuracy"], "lo": np.nan, "hi": np.nan,
                     "sigma_comp": r["sigma_comp"], "sigma_lo": r["sigma_comp"], "sigma_hi": r["sigma_comp"]})
        for name, fit in fits.items():
            d = fit["per_gap"].get(gap)
            if d:
                rows.append({"gap": int(gap), "source": name, "accuracy": d["accuracy"], "lo": d["accuracy_ci95"][0],
                             "hi": d["accuracy_ci95"][1], "sigma_comp": d["sigma_comp"],
                             "sigma_lo": d["sigma_comp_ci95"][0], "sigma_hi": d["sigma_comp_ci95"][1]})
    return pd.DataFrame(rows)


def judge_summary(fit_abs: dict, fit_pair: dict, boot: dict) -> dict:
    """The real judge's numbers for the metrics file: the absolute fit, sigma_comp and accuracy by gap with
    intervals, and the gap-1 ratio with its bootstrap interval."""
    per_gap = fit_pair["per_gap"]
    gap1 = per_gap.get(1.0, {"sigma_comp": float("nan")})
    return {**{k: fit_abs[k] for k in ("slope_a", "slope_a_ci95", "intercept_b", "r2", "sigma_residual",
                                        "sigma_within2", "sigma_abs_eff")},
            "sigma_abs_eff_ci95": boot["ci95"]["sigma_abs_eff"],
            "sigma_comp": {str(int(g)): d["sigma_comp"] for g, d in per_gap.items()},
            "sigma_comp_ci95": {str(int(g)): d["sigma_comp_ci95"] for g, d in per_gap.items()},
            "accuracy": {str(int(g)): d["accuracy"] for g, d in per_gap.items()},
            "accuracy_ci95": {str(int(g)): d["accuracy_ci95"] for g, d in per_gap.items()},
            "n_verdicts_gap1": int(per_gap[1.0]["n"]) if 1.0 in per_gap else 0,
            "ratio": fit_abs["sigma_abs_eff"] / gap1["sigma_comp"] if gap1["sigma_comp"] else float("inf"),
            "ratio_ci95": boot["ci95"]["ratio"], "lr_test": fit_pair["lr_test"]}


def judge_corpus(model, tok, corpus: pd.DataFrame, pairs: pd.DataFrame, k: int, seeds: dict, instruction: str,
                 batch_size: int = 16, progress: bool = False) -> dict:
    """Everything notebook 01 asks the real judge, as plain data for its cache entry (rebuilt by judged_parts):
    k prompted 1-5 scores per response and their distribution (judges.absolute, seed seeds["absolute"]), both orders
    of each pair (judges.pairwise, seeds["pairwise"]), and each response's log-likelihood under the question alone
    and under the question and `instruction` (judges.response_logps)."""
    probs, scores = judges.absolute(model, tok, corpus["question"], corpus["response"], k=k, seed=seeds["absolute"],
                                    batch_size=batch_size, progress=progress)
    judged = judges.pairwise(model, tok, pairs["question"], pairs["better"], pairs["worse"], k=k, seed=seeds["pairwise"],
                             batch_size=batch_size, progress=progress)
    scored = {name: judges.response_logps(model, tok, corpus["question"], corpus["response"], instruction=text,
                                          batch_size=batch_size, progress=progress)
              for name, text in (("question", None), ("question + instruction", instruction))}
    arrays = {"probs": probs, "scores": scores}
    return {"arrays": {n: {"values": a.tolist(), "dtype": str(a.dtype)} for n, a in arrays.items()},
            "frames": {n: {"columns": {c: f[c].tolist() if c != "wins" else [w.tolist() for w in f[c]] for c in f},
                           "dtypes": {c: str(f[c].dtype) for c in f if c != "wins"},
                           "wins_dtype": str(f["wins"].iloc[0].dtype) if "wins" in f and len(f) else None}
                       for n, f in {"pairwise": judged, **scored}.items()}}


def judged_parts(made: dict):
    """judge_corpus's data as the judges made it: (probs, scores, pairwise, scored, scored_instructed), each array
    and column in its own dtype, so a value read from the cache or the results store computes as a fresh one does."""
    arrays = {n: np.asarray(a["values"], dtype=a["dtype"]) for n, a in made["arrays"].items()}
    frames = {}
    for n, f in made["frames"].items():
        frame = pd.DataFrame({c: v for c, v in f["columns"].items() if c != "wins"}).astype(f["dtypes"])
        if "wins" in f["columns"]:
            frame.insert(list(f["columns"]).index("wins"), "wins",
                         [np.asarray(w, dtype=f["wins_dtype"]) for w in f["columns"]["wins"]])
        frames[n] = frame
    return (arrays["probs"], arrays["scores"], frames["pairwise"], frames["question"], frames["question + instruction"])
