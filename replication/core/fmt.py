"""Numbers and intervals as text, in one place: table cells, claim texts and the notebooks' prose."""
import re

import numpy as np


def number(x, digits: int = 2) -> str:
    """A number for a table cell; 'inf' / '-inf' when unbounded (e.g. a noise with no signal), 'nan' when undefined."""
    if np.isnan(x):
        return "nan"
    return f"{x:.{digits}f}" if np.isfinite(x) else ("inf" if x > 0 else "-inf")


CLIPPED = " (clipped)"   # after an interval's end that stats.clip moved onto the quantity's bound


def _ends(c, low: str, high: str):
    clipped = getattr(c, "clipped", ())
    return (low + CLIPPED if "low" in clipped else low), (high + CLIPPED if "high" in clipped else high)


def signed(x, digits: int = 3) -> str:
    """'+0.031'; a value that rounds to zero but is not zero keeps the digits that show its sign ('-8.6e-05', not
    '-0.000'), since an interval's end on either side of no effect decides a verdict; below 1e-9 it is float noise."""
    text = f"{x:+.{digits}f}"
    return f"{x:+.2g}" if np.isfinite(x) and abs(x) > 1e-9 and float(text) == 0 else text   # not float noise


def ci(c, digits: int = 2) -> str:
    """'[low, high]', infinite bounds written as inf; an end clipped onto the quantity's bound (stats.clip) marked
    ' (clipped)': '[0.00 (clipped), 0.59]'."""
    lo, hi = _ends(c, number(c[0], digits), number(c[1], digits))
    return f"[{lo}, {hi}]"


def diff(d, digits: int = 3) -> str:
    """'+0.031 [-0.012, +0.075]' from (difference, low, high); ends as `signed` writes them, a clipped end marked."""
    est, lo, hi = d
    a, b = _ends(d, signed(lo, digits), signed(hi, digits))
    return f"{est:+.{digits}f} [{a}, {b}]"


def accuracy(v: dict, digits: int = 1, percent_bounds: bool = False) -> str:
    """An accuracy with its interval in percent: '62.5% [30.6, 86.3]', or with percent_bounds '55% [34%, 74%]'
    (digits=0). v holds "accuracy" and "ci95" (an accuracy record) or "interval" (an arm record)."""
    c = v.get("ci95", v.get("interval"))
    unit = "%" if percent_bounds else ""
    lo, hi = _ends(c, f"{100 * c[0]:.{digits}f}{unit}", f"{100 * c[1]:.{digits}f}{unit}")
    return f"{100 * v['accuracy']:.{digits}f}% [{lo}, {hi}]"


def count(n: int, noun: str) -> str:
    """'1 seed', '3 seeds': a count with its noun in the number it takes (regular plurals only)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def short_claim(claim: str) -> str:
    """A claim without its bracketed task-and-judge qualifiers ("... [2d sums; judge: ...]"), which the ledger keeps:
    the row label keeps the claim itself."""
    return re.sub(r"\s*\[[^\]]*\]", "", claim).strip()
