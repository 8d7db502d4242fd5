"""One verdict rule and one vocabulary for every claim of the workbook.

- ``reproduced``: the paper's direction holds and the 95% interval excludes no effect (and, where the paper's
  effect is comparable and passed, reaches it: the interval's far end is at or beyond it); or a number recomputed
  from the paper's own data matches it within the paper's rounding; or a stated check holds.
- ``partly``: the interval lies wholly on the paper's side of no effect but wholly short of the paper's effect
  (direction reproduced, size not; the row shows both numbers); or a compound claim whose parts disagree with at
  least one part holding (reproduced or partly), the parts named in the row.
- ``not reproduced``: the interval excludes the paper's direction (all of it at or below no effect), or holds no
  effect and lies wholly below the paper's effect size when one is given (the effect is reliably smaller than
  reported, and may be none); or a recomputed number does not match; or a stated check fails; or a compound claim
  with no part holding and at least one part not reproduced.
- ``inconclusive``: the interval holds both no effect and the paper's direction (and its effect size); also a
  zero-width interval at no effect (no item differed: a bootstrap has no spread to decide on); a compound claim
  whose parts are all inconclusive or not tested.
- ``not tested``: not run here, with the reason.

A training comparison (arm a against arm b, each trained over several seeds) passes its per-seed differences
(`seed_differences`) beside its two-level interval (seeds, then questions):
- the interval alone decides (it already carries the seed spread); the row shows beside the verdict how many seeds
  landed on the paper's side ("2 of 3 seeds on the paper's side", `qualifier`). Requiring every seed on the paper's
  side would make ``reproduced`` less likely the more seeds are run;
- a single training run is at most ``inconclusive`` with the qualifier ``one run`` (reruns that changed only
  floating-point rounding have flipped one-run verdicts both ways);
- a failed health check of an arm is reported beside the verdict; it never turns a measured comparison into
  ``not tested`` (a harm that was measured is ``not reproduced``, with the failed check named).

Every claim also carries its evidence kind. A simulation shows only that a mechanism produces an effect
under stated assumptions, and its rows say so.
"""
import math

import numpy as np

VERDICTS = ("reproduced", "not reproduced", "inconclusive", "partly", "not tested")
EVIDENCE = ("arithmetic", "simulation", "real model")
SIMULATION_NOTE = "simulation: the mechanism under stated assumptions, not the paper's system"
ONE_RUN = "one run"


def from_interval(low: float, high: float, direction: int = +1, null: float = 0.0, effect: float = None,
                  seed_differences=None) -> str:
    """The rule for an estimated effect with a 95% interval [low, high] around it.

    direction: +1 if the paper reports the quantity above `null`, -1 if below. effect: the paper's effect
    size on the same scale (distance from null, positive), when it is comparable. seed_differences: a training
    comparison's per-seed differences (module docstring): one seed caps the verdict at 'inconclusive'; with two or
    more the interval alone decides (on_side counts the seeds for the row)."""
    if direction not in (+1, -1):
        raise ValueError(f"direction={direction!r} is not allowed; use +1 (paper: above null) or -1 (below)")
    if math.isnan(low) or math.isnan(high) or low > high:
        raise ValueError(f"interval=[{low}, {high}] is not allowed; it needs low <= high (infinite bounds are fine)")
    lo, hi = sorted(((low - null) * direction, (high - null) * direction))
    seeds = _seeds(seed_differences)
    if seeds is not None and seeds.size == 1:  # one training run: rounding alone has flipped such verdicts
        return "inconclusive"
    if lo == hi == 0:  # a zero-width interval at no effect: no item differed, so nothing to decide on
        return "inconclusive"
    short = effect is not None and hi < abs(effect)   # wholly short of the paper's effect
    if lo > 0:
        return "partly" if short else "reproduced"
    if hi <= 0 or short:
        return "not reproduced"
    return "inconclusive"


def _seeds(seed_differences):
    seeds = None if seed_differences is None else np.atleast_1d(np.asarray(seed_differences, float))
    if seeds is not None and (not seeds.size or not np.all(np.isfinite(seeds))):
        raise ValueError(f"seed_differences={list(seeds)} is not allowed; give one finite difference per training seed")
    return seeds


def on_side(seed_differences, direction: int = +1, null: float = 0.0):
    """(k, n): how many of the n per-seed differences lie on the paper's side of null (strictly)."""
    seeds = _seeds(seed_differences)
    return int(np.sum((seeds - null) * direction > 0)), int(seeds.size)


def qualifier(seed_differences=None, unit: str = "seed", direction: int = +1, null: float = 0.0):
    """The verdict's qualifier shown beside it: 'one run' for a training comparison of one seed ('one draw' where
    the repeats are draws of sampled replies, unit='draw'); '2 of 3 seeds on the paper's side' for two or more;
    None without per-seed differences."""
    if seed_differences is None:
        return None
    k, n = on_side(seed_differences, direction, null)
    if n == 1:
        return ONE_RUN if unit == "seed" else f"one {unit}"
    return f"{k} of {n} {unit}s on the paper's side"


def label(row: dict) -> str:
    """A ledger row's verdict as a reader sees it: the word, its qualifier ('inconclusive (one run)') and a failed
    health check beside it."""
    text = row["verdict"] + (f" ({row['qualifier']})" if row.get("qualifier") else "")
    return text + (f"; {row['health']}" if row.get("health") else "")


def from_match(measured, paper, tolerance) -> str:
    """The rule for numbers recomputed from the paper's own data: all within the paper's rounding."""
    m, p = np.atleast_1d(np.asarray(measured, float)), np.atleast_1d(np.asarray(paper, float))
    if m.shape != p.shape:
        raise ValueError(f"measured has {m.size} values and paper {p.size}; compare them one to one")
    return "reproduced" if bool(np.all(np.abs(m - p) <= tolerance)) else "not reproduced"


def part(interval, direction: int = +1, null: float = 0.0, effect: float = None, estimate: float = None,
         seed_differences=None) -> dict:
    """One part of a compound claim measured by an interval: its verdict by the one rule (from_interval), with the
    interval, estimate and per-seed differences that the ledger and the forest plot show beside it."""
    r6 = lambda x: None if x is None else round(float(x), 6)  # noqa: E731
    return {"verdict": from_interval(float(interval[0]), float(interval[1]), direction, null, effect, seed_differences),
            "interval": [r6(interval[0]), r6(interval[1])], "estimate": r6(estimate), "direction": direction,
            "null": null, "effect": r6(effect),
            "seed_differences": None if seed_differences is None else [r6(x) for x in seed_differences]}


def expanded(claims):
    """The ledger's claims with each compound claim whose parts carry intervals (part()) replaced by its parts, each
    a claim of its own, 'claim: part', with the part's interval, verdict and seeds (for the forest plot and the seeds
    projection; the ledger keeps the compound row)."""
    for c in claims:
        parts = {k: v for k, v in (c.get("parts") or {}).items() if v.get("interval")}
        if not parts:
            yield c
            continue
        for name, v in parts.items():
            yield {**c, "question_variance": None, "qualifier": None, **v, "claim": f"{c['claim']}: {name}",
                   "parts": None}


def part_word(v) -> str:
    """A part's verdict: the word itself, or the `verdict` of a part() record."""
    return v["verdict"] if isinstance(v, dict) else v


def from_parts(parts: dict) -> str:
    """A compound claim's verdict from its parts' (each shown with its own interval and verdict; a part is a verdict
    word or a part() record): one word when all parts agree; 'partly' when they disagree and at least one part holds
    (reproduced or partly); with no part holding, 'not reproduced' if any part is, else 'inconclusive'."""
    if not parts:
        raise ValueError("parts={} is not allowed; name at least one part and its verdict")
    parts = {k: part_word(v) for k, v in parts.items()}
    for name, v in parts.items():
        if v not in VERDICTS:
            raise ValueError(f"part {name!r} has verdict {v!r}; choose one of {', '.join(VERDICTS)}")
    words = set(parts.values())
    if len(words) == 1:
        return words.pop()
    if words & {"reproduced", "partly"}:
        return "partly"
    return "not reproduced" if "not reproduced" in words else "inconclusive"


def verdict(*, interval=None, direction: int = +1, null: float = 0.0, effect: float = None, seed_differences=None,
            matches=None, holds: bool = None, parts: dict = None, not_tested: str = None) -> str:
    """The verdict of one claim from exactly one kind of basis:

    interval=(low, high)               an estimated effect (with direction, null, the paper's effect and, for a
                                       training comparison, the per-seed differences);
    matches=(measured, paper, tol)     numbers recomputed from the paper's data, within its rounding;
    holds=True/False                   a stated, exactly checkable condition (arithmetic or simulation);
    parts={"name": verdict, ...}       a compound claim (a part: a verdict word or a part() record);
    not_tested="reason"                not run here."""
    given = [k for k, v in {"interval": interval, "matches": matches, "holds": holds, "parts": parts,
                            "not_tested": not_tested}.items() if v is not None]
    if len(given) != 1:
        raise ValueError(f"give exactly one basis for a verdict (interval, matches, holds, parts or not_tested); got {given or 'none'}")
    if interval is not None:
        return from_interval(float(interval[0]), float(interval[1]), direction, null, effect, seed_differences)
    if matches is not None:
        return from_match(*matches)
    if holds is not None:
        return "reproduced" if bool(holds) else "not reproduced"
    if parts is not None:
        return from_parts(parts)
    if not str(not_tested).strip():
        raise ValueError("not_tested='' is not allowed; say why the claim was not tested")
    return "not tested"
