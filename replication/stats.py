"""Confidence intervals and summary tables used across the notebooks."""
import numpy as np
import pandas as pd
from statsmodels.stats.proportion import proportion_confint


def proportion_ci(k, n, alpha: float = 0.05, method: str = "wilson"):
    """(p, low, high): a proportion with its Wilson interval (statsmodels)."""
    if n <= 0:
        raise ValueError(f"n={n} is not allowed; a proportion needs n >= 1")
    lo, hi = proportion_confint(k, n, alpha=alpha, method=method)
    return k / n, float(lo), float(hi)


def accuracy_table(df: pd.DataFrame, by, column: str = "correct", alpha: float = 0.05) -> pd.DataFrame:
    """Per-group accuracy with n and a Wilson interval, from a 0/1 column."""
    rows = []
    for key, g in df.groupby(by, sort=False):
        k, n = int(np.sum(g[column])), len(g)
        p, lo, hi = proportion_ci(k, n, alpha)
        rows.append({**dict(zip([by] if isinstance(by, str) else by, [key] if isinstance(by, str) else key)),
                     "n": n, "accuracy": p, "ci_low": lo, "ci_high": hi})
    return pd.DataFrame(rows)
