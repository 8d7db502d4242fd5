"""The README's results at a glance: one row per notebook, its central claim read from the committed metrics
(`figures/metrics/`), written between two markers in README.md:

    python -m replication glance            # rewrite the table in README.md
    python -m replication glance --check    # exit 1 when README.md's table differs from the metrics

Each row names the claim it shows by a piece of its label (`HEADLINES`); a label that no longer matches stops with
one line, so a renamed claim cannot leave a stale row. A paper's page may hold a notebook's whole ledger the same
way, between `<!-- claims of <notebook> ... -->` and `<!-- end of claims -->` (`claims_table`).
"""
import json
import os
import re
import sys
from pathlib import Path

from replication.core import config, verdicts
from replication.core.fmt import number
from .table import claim_anchor, grouped

BEGIN = "<!-- results at a glance: made by `python -m replication glance` from figures/metrics; do not edit -->"
END = "<!-- end of results at a glance -->"

# (paper, notebook stem, the claim in plain words, a piece of the committed label that picks the claim (or a tuple
# of pieces, one per wording), its page)
HEADLINES = (
    ("Elo-Evolve", "01_noise_analysis", "a pairwise judge is less noisy than absolute scores: noise ratio",
     "with a real LLM judge, comparison is less noisy", "replication/papers/elo_evolve/README.md"),
    ("Elo-Evolve", "02_elo_dynamics", "under a judge that grades replies, Elo-Evolve (T = 200) beats point-based "
     "rewards: accuracy difference", "Graded judge: held-out accuracy point-based < static pairwise < Elo-Evolve",
     "replication/papers/elo_evolve/README.md"),
    ("RLPR", "03_rlpr_debiasing", "the probability reward trains better than a rule verifier: accuracy difference",
     "beats RLVR", "replication/papers/rlpr/README.md"),
    ("Debate", "04_debate_judge_accuracy", "a judge who hears a debate beats one who hears none: accuracy difference",
     "debate beats naive (LLM judge)", "replication/papers/debate/README.md"),
    ("MALT", "05_malt_trajectory_trees", "the trained generator-verifier-refiner chain beats the base: accuracy difference",
     "MALT improves over the same base model", "replication/papers/malt/README.md"),
    ("Multi-Agent Evolve", "06_multi_agent_evolve", "self-play, the model its own judge, improves the solver: accuracy difference",
     "the solver improves by self-play", "replication/papers/mae/README.md"),
)
SETUP = ("Setup (00)", "00_setup_and_baselines", "GRPO with the exact verifier raises held-out accuracy (the yardstick)",
         "replication/setup/README.md")
COUNTED = ("reproduced", "partly", "inconclusive", "not reproduced", "not tested")


def _effect(est, lo, hi) -> str:
    """'+0.142 [-0.013, +0.296]' for a difference; a ratio (an interval reaching inf) as '20.54 [6.21, inf]'."""
    if hi == float("inf"):
        return f"{number(est)} [{number(lo)}, inf]"
    digits = 1 if max(abs(est), abs(lo), abs(hi)) >= 10 else 3   # Elo points in tenths, differences in thousandths
    return f"{est:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"


def _claim(claims: list, pieces, stem: str) -> dict:
    """The one real-model claim whose label holds one of `pieces` (a label's piece, or several: its wordings)."""
    pieces = (pieces,) if isinstance(pieces, str) else tuple(pieces)
    found = [c for c in claims if c["evidence"] == "real model" and any(p in c["claim"] for p in pieces)]
    if len(found) != 1:
        raise ValueError(f"glance.HEADLINES: {len(found)} real-model claims of {stem} contain {' or '.join(map(repr, pieces))}; "
                         f"name exactly one")
    return found[0]


# A failed health check in plain words (lm.arms.CHECKS).
CHECK_WORDS = {"learned": "training reward did not rise clearly", "accuracy_ok": "held-out accuracy fell below the base",
               "length_ok": "replies collapsed in length"}


def _health_words(health) -> str:
    """' (seeds 1, 2: training reward did not rise clearly)' from a record's failed-health text
    ('failed health check: rlvr seed 1 (learned); ...'), '' when every seed passed."""
    if not health:
        return ""
    failed = {}
    for seed, checks in re.findall(r"seed (\d+) \(([^)]*)\)", health):
        for check in checks.split(", "):
            failed.setdefault(check, []).append(seed)
    if not failed:
        return " (a failed health check: see the page)"
    return " (" + "; ".join(f"seed{'s' * (len(s) > 1)} {', '.join(s)}: {CHECK_WORDS.get(k, k)}"
                            for k, s in failed.items()) + ")"


def _tally(claims: list) -> str:
    counts = {v: sum(c["verdict"] == v for c in claims) for v in COUNTED}
    return ", ".join(f"{n} {v}" for v, n in counts.items() if n)


def table(metrics: Path = None) -> str:
    """The markdown table, from the metrics files in `metrics` (default: the committed figures/metrics/)."""
    metrics = Path(metrics or config.ROOT / "figures" / "metrics")
    read = lambda stem: json.loads((metrics / f"{stem}.json").read_text())
    lines = ["| paper | notebook | the claim | verdict | effect [95% interval] | n | paper's value | all its claims |",
             "|---|---|---|---|---|---|---|---|"]
    name, stem, says, page = SETUP
    y = read(stem)["metrics"]["yardstick"]
    lines.append(f"| [{name}]({page}) | `{stem[:2]}` | {says} | yardstick{_health_words(y.get('health'))} | "
                 f"{_effect(*y['gain'])} over the base's {number(y['base_accuracy'])} | {y['n']} | - | - |")
    for paper, stem, says, piece, page in HEADLINES:
        claims = read(stem)["claims"]
        c = _claim(claims, piece, stem)
        verdict = c["verdict"] + (" (a failed health check)" if c.get("health") else "")
        lines.append(f"| [{paper}]({page}) | `{stem[:2]}` | {says} | {verdict} | {_measured(c)} | "
                     f"{c['n']} | {c['paper']} | {_tally(claims)} |")
    return "\n".join(lines) + "\n"


PAGE_BEGIN = "<!-- claims of {stem}: made by `python -m replication glance` from figures/metrics; do not edit -->"
PAGE_END = "<!-- end of claims -->"
PAGES = tuple(sorted({h[-1] for h in HEADLINES} | {SETUP[-1]}))


def _measured(c: dict) -> str:
    """The effect in the paper's direction (positive: the paper's side) with its interval, as the forest plot draws
    it; a level against a null above 0 (an AUC against one half, a ratio against 1) as it is, unsigned; else the
    measured text, cut short."""
    if c.get("interval") and c.get("estimate") is not None and (c.get("null") or 0) > 0:
        lo, hi = c["interval"]
        return f"{number(c['estimate'])} [{number(lo)}, {number(hi)}]"
    if c.get("interval") and c.get("estimate") is not None:
        d, (lo, hi) = c.get("direction") or 1, c["interval"]
        return _effect(d * c["estimate"], *sorted((d * lo, d * hi)))
    text = str(c.get("measured") or "-").replace("|", "/")
    return text if len(text) <= 60 else text[:59].rsplit(" ", 1)[0] + " …"


def claims_table(stem: str, metrics: Path = None, page: str = "README.md") -> str:
    """One notebook's claims as a page's table, numbered in the ledger's order (its rows across all notebooks), each
    claim linked to its full entry in figures/ledger.md (`page`: the page's path in the repository, for the link):
    the claim, its evidence, what it stands on ('as above' where it repeats the row above), the verdict, the effect
    with its interval (else the measured value) and n; under a compound claim, each part measured by an interval on
    a row of its own (13a, 13b)."""
    metrics = Path(metrics or config.ROOT / "figures" / "metrics")
    claims = grouped([{"notebook": stem, **c} for c in json.loads((metrics / f"{stem}.json").read_text())["claims"]])
    first = sum(len(json.loads(p.read_text())["claims"]) for p in sorted(metrics.glob("*.json")) if p.stem < stem)
    lines = ["| # | claim | evidence | task; judge | verdict | measured: effect [95% interval] | n |",
             "|---|---|---|---|---|---|---|"]
    above = None
    ledger = os.path.relpath("figures/ledger.md", start=os.path.dirname(page) or ".")
    for i, c in enumerate(claims, first + 1):   # the ledger's order, from 1; its anchors count from 0
        claim = f"[{c['claim']}]({ledger}#{claim_anchor(c, i - 1)})"
        setting = "; ".join(x for x in (c.get("task"), c.get("judge")) if x) or "-"
        setting, above = ("as above" if setting == above and setting != "-" else setting), setting
        verdict = c["verdict"] + (" (a failed health check)" if c.get("health") else "")
        lines.append(f"| {i} | {claim} | {c['evidence']} | {setting} | {verdict} | {_measured(c)} | {c.get('n') or '-'} |")
        parts = [p for p in verdicts.expanded([c]) if p is not c]   # a compound claim's parts with intervals
        for letter, p in zip("abcdefgh", parts):
            lines.append(f"| {i}{letter} | part: {p['claim'][len(c['claim']) + 2:]} | | | {p['verdict']} | "
                         f"{_measured(p)} | |")
    return "\n".join(lines) + "\n"


def page_replaced(text: str, metrics: Path = None, page: str = "README.md") -> str:
    """A page (at `page` in the repository) with each of its notebook claim blocks made again from the metrics."""
    for stem in re.findall(r"<!-- claims of (\d\d_\w+):", text):
        head, rest = text.split(PAGE_BEGIN.format(stem=stem), 1)
        _, tail = rest.split(PAGE_END, 1)
        text = f"{head}{PAGE_BEGIN.format(stem=stem)}\n{claims_table(stem, metrics, page)}{PAGE_END}{tail}"
    return text


def replaced(readme: str, block: str) -> str:
    """README text with the part between the markers replaced by `block`."""
    if BEGIN not in readme or END not in readme:
        raise ValueError("README.md: the results-at-a-glance markers are missing (glance.BEGIN and glance.END)")
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{block}{END}{tail}"


def main(argv) -> int:
    from replication.core.files import write_text

    stale = []
    for name in ("README.md", *PAGES):
        path = config.ROOT / name
        try:
            text = path.read_text()
            new = replaced(text, table()) if name == "README.md" else page_replaced(text, page=name)
        except (ValueError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        if new != text:
            stale.append(name)
            if "--check" not in argv:
                write_text(path, new)
    if "--check" in argv and stale:
        print(f"{', '.join(stale)}: results differ from figures/metrics; run python -m replication glance", file=sys.stderr)
        return 1
    print("results at a glance and the pages' claim tables: " + (f"rewrote {', '.join(stale)}" if stale else "current"))
    return 0
