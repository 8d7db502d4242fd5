"""Where a notebook's time goes: wall seconds by phase, for the phase profile in each notebook's metrics.

The machinery marks its own work (`with phase(...)` or `@timed(...)`): GRPO's rollouts are generation for training,
its reward call reward scoring, its scoring and backward passes the update (training.Timer); tasks.evaluate and the
papers' held-out chains and arguments generation for evaluation; the judges judging; MALT's trees tree/chain
building; SFT and DPO the update; the bootstraps and savefig statistics and plotting. Time is counted once, in the
innermost phase (a judge called inside a reward is judging, not reward scoring); what no phase covers (model loading,
data, tables) is `other` (`profile(wall)`). Cached steps that are skipped cost nothing here; the time they took when
they were made (recorded with the cache entry or in a training run's log) is tallied apart (`reused`, `reused_profile`),
so that a notebook resumed from its cache says how much of its work this execution did not redo.
"""
import functools
import os
import secrets
import time
from contextlib import contextmanager

PHASES = ("generation for training", "generation for evaluation", "judging", "reward scoring", "update",
          "tree/chain building", "statistics and plotting")
_totals: dict = {}
_stack: list = []   # [name, seconds so far, running since]
_reused = {"entries": 0, "seconds": 0.0, "untimed": 0}   # cached results loaded instead of made, and what they cost
_made_here = [0]   # > 0 inside made_here(): loads of what this execution made elsewhere are not reuse


@contextmanager
def phase(name: str):
    """Count the wall time inside the block to `name` (one of PHASES), less the time of phases nested inside it."""
    if name not in PHASES:
        raise ValueError(f"phase={name!r} is not allowed; choose one of {', '.join(PHASES)}")
    now = time.perf_counter()
    if _stack:   # the enclosing phase pauses
        _stack[-1][1] += now - _stack[-1][2]
    entry = [name, 0.0, now]
    _stack.append(entry)
    try:
        yield
    finally:
        now = time.perf_counter()
        entry[1] += now - entry[2]
        _stack.pop()
        _totals[name] = _totals.get(name, 0.0) + entry[1]
        if _stack:   # and resumes
            _stack[-1][2] = now


def timed(name: str):
    """A decorator: every call of the function is counted to phase `name`."""
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            with phase(name):
                return fn(*args, **kwargs)
        return inner
    return wrap


EXECUTION = "REPLICATION_EXECUTION"   # environment variable: the execution's token, inherited by its workers


def new_execution() -> str:
    """Start a new execution (workbook.start): a fresh token, which the worker processes it spawns inherit."""
    os.environ[EXECUTION] = secrets.token_hex(8)
    return os.environ[EXECUTION]


def execution() -> str:
    """This execution's token (new_execution's, or one made for this process and its workers where none was set): a
    training run records under it the steps it trained, so that continuing it later in the same execution is not
    counted as reuse (loop.run)."""
    return os.environ.setdefault(EXECUTION, secrets.token_hex(8))


def reset() -> None:
    """Start counting afresh (workbook.start: one notebook per kernel)."""
    _totals.clear()
    _stack.clear()
    _reused.update(entries=0, seconds=0.0, untimed=0)


@contextmanager
def made_here():
    """Inside the block, loading a result is not counted as reuse: what it loads was made by this execution's own
    workers (parallel.run_jobs), whose time absorb already counted."""
    _made_here[0] += 1
    try:
        yield
    finally:
        _made_here[0] -= 1


def reused(seconds) -> None:
    """Count one cached result loaded instead of made: `seconds`, the time it took when it was made (None: made
    before times were recorded); nothing inside made_here()."""
    if _made_here[0]:
        return
    _reused["entries"] += 1
    if seconds is None:
        _reused["untimed"] += 1
    else:
        _reused["seconds"] += float(seconds)


def reused_profile() -> dict:
    """The cached results this execution loaded: how many, the seconds they took when made, and how many of them
    carry no recorded time (so the seconds are a lower bound)."""
    return {"entries": _reused["entries"], "seconds": round(_reused["seconds"], 2), "untimed": _reused["untimed"]}


def snapshot(wall: float) -> dict:
    """What this process counted (seconds by phase, cached results reused) and the wall time it took: a worker's
    record, for absorb in the process that started it."""
    return {"totals": dict(_totals), "reused": dict(_reused), "wall": float(wall)}


def absorb(snapshots, wall: float) -> None:
    """Count the work of worker processes that ran side by side for `wall` seconds of this process's time
    (parallel.run_jobs): their phases share those seconds in proportion to the time each worker spent in them (the
    workers' seconds scaled by wall / the sum of their walls), so the profile stays wall seconds and its parts add
    up; the time they spent in no phase is `other` here too. An enclosing phase gives up what is counted here, as
    a nested phase's time is counted once. Their reused results count as they are."""
    spent = sum(s["wall"] for s in snapshots)
    scale = wall / spent if spent > 0 else 0.0
    counted = 0.0
    for s in snapshots:
        for name, seconds in s["totals"].items():
            _totals[name] = _totals.get(name, 0.0) + seconds * scale
            counted += seconds * scale
        for k in _reused:
            _reused[k] += s["reused"].get(k, 0)
    if _stack:
        _stack[-1][1] -= counted


def profile(wall: float) -> dict:
    """Seconds by phase (every phase named, 0 where none ran) and `other`: the wall time no phase covered."""
    out = {name: round(_totals.get(name, 0.0), 2) for name in PHASES}
    out["other"] = round(max(0.0, wall - sum(_totals.values())), 2)
    return out
