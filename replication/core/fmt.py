"""Numbers and intervals as text, in one place: table cells, claim texts and the notebooks' prose."""
import numpy as np


def number(x, digits: int = 2) -> str:
    """A number for a table cell; 'inf' / '-inf' when unbounded (e.g. a noise with no signal), 'nan' when undefined."""
    if np.isnan(x):
        return "nan"
    return f"{x:.{digits}f}" if np.isfinite(x) else ("inf" if x > 0 else "-inf")


def ci(c, digits: int = 2) -> str:
    """'[low, high]', infinite bounds written as inf."""
    return f"[{number(c[0], digits)}, {number(c[1], digits)}]"


def diff(d, digits: int = 3) -> str:
    """'+0.031 [-0.012, +0.075]' from (difference, low, high)."""
    est, lo, hi = d
    return f"{est:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


def accuracy(v: dict, digits: int = 1, percent_bounds: bool = False) -> str:
    """An accuracy with its interval in percent: '62.5% [30.6, 86.3]', or with percent_bounds '55% [34%, 74%]'
    (digits=0). v holds "accuracy" and "ci95" (an accuracy record) or "interval" (an arm record)."""
    lo, hi = v.get("ci95", v.get("interval"))
    unit = "%" if percent_bounds else ""
    return f"{100 * v['accuracy']:.{digits}f}% [{100 * lo:.{digits}f}{unit}, {100 * hi:.{digits}f}{unit}]"
