"""How many seeds each row of a ledger needs: every comparison over seeds (or draws) with its chance of each verdict
if it were run again with S seeds, the measured difference and seed spread taken as the truth (core.power):

    python -m replication seeds figures/metrics --seeds 3,5,10,20 [--only 03] [--markdown]

A ledger is read as `compare` reads one (a metrics file, a folder of them, or git:REV). Each row records its
interval, per-seed differences and its interval's question part; for an older row that lacks it, the
question part is read back from the interval's width, which can fit two (core.power.question_variances), and a
chance that differs between them is shown as a range. `rerun` gives one row's chances at its own number of seeds
and at 5 and 10: the ledger's `rerun` column and each notebook's closing table.
"""
import math
import sys

from replication.core import power, verdicts
from replication.core.fmt import short_claim
from .compare import load

SHORT = {"reproduced": "R", "partly": "P", "inconclusive": "I", "not reproduced": "N"}


def rows(records: dict, seeds=(3, 5, 10, 20), only=None, sims: int = 2000, seed: int = 0) -> list:
    """One row per comparison over two or more seeds or draws, in ledger order: notebook, claim (its bracketed
    qualifiers dropped), n, verdict, unit ('seed' or 'draw', as its n reads) and core.power.project's plan."""
    out = []
    for stem in sorted(records):
        if only and not any(stem.startswith(o) for o in only):
            continue
        for c in verdicts.expanded(records[stem].get("claims", [])):
            if c.get("interval") is None or len(c.get("seed_differences") or []) < 2:
                continue
            unit = "draw" if "draw" in str(c.get("n") or "") else "seed"
            out.append({"notebook": stem, "claim": short_claim(c["claim"]), "n": c.get("n"), "verdict": c["verdict"],
                        "unit": unit, **power.project(c, seeds, sims=sims, seed=seed)})
    return out


def _chance(pair) -> str:
    lo, hi = pair
    return f"{lo:.2f}" if round(lo, 2) == round(hi, 2) else f"{lo:.2f}-{hi:.2f}"


def cell(plan: dict) -> str:
    """'R 0.66 I 0.34 N 0.00; same 0.55': each verdict's chance, and two runs' chance of the same verdict."""
    return " ".join(f"{SHORT[k]} {_chance(plan[k])}" for k in power.OUTCOMES) + f"; same {_chance(plan['same'])}"


AT = (5, 10)   # besides a row's own number of seeds or draws, the rerun cell plans for these
RERUN_HELP = ("`rerun`: a comparison over seeds or draws run again with as many, then with 5 and 10: the chance of "
              "each verdict (R reproduced, P partly, I inconclusive, N not reproduced), its measured difference and "
              "seed spread taken as the truth, in brackets while the spread runs over its 90% interval (0.58x-4.4x "
              "from three seeds). `R 0.55 (0.07-0.89)`: a coin flip that three seeds cannot pin down; `at 10: R "
              "0.95`: ten seeds would likely settle it (`python -m replication seeds`).")


def _with_span(plan, span) -> str:
    """'0.55 (0.21-0.93)': a chance with its range in brackets, the brackets left out where they add nothing."""
    return _chance(plan) + ("" if _chance(span) == _chance(plan) else f" ({_chance(span)})")


def rerun(claim: dict, sims: int = 2000, seed: int = 0, full: bool = False):
    """A ledger row's chance of each verdict if it were run again, with as many seeds (or draws) and with 5 and 10
    (AT; those above its own), its measured difference taken as the truth and its seed SD at the measured value
    (the chance) and across the 90% interval that so few seeds leave it (the range in brackets; core.power.project,
    spans=True). The cell: 'R 0.55 (0.21-0.93) I 0.45 (0.07-0.79) · at 5: R 0.72 (0.30-0.97) · at 10: ...', every
    verdict with a chance of 0.005 or more at its own number and the likeliest at the others; full=True: every
    verdict in words at each number, and two runs' chance of agreeing at its own. None for a row not over two or
    more seeds or draws."""
    n = len(claim.get("seed_differences") or [])
    if n < 2 or claim.get("interval") is None or not all(math.isfinite(x) for x in claim["interval"]):
        return None
    if claim.get("parts"):   # a compound verdict is not one interval's: each part's chances (python -m replication seeds)
        return None
    counts = (n, *[s for s in AT if s > n])
    p = power.project(claim, counts, sims=sims, seed=seed, spans=True)
    if full:
        unit = "draws" if "draw" in str(claim.get("n") or "") else "seeds"
        lo, hi = p["sd_range"]
        parts = [f"with its {n} {unit}: " + ", ".join(f"{k} {_with_span(p['plans'][n][k], p['spans'][n][k])}"
                                                      for k in power.OUTCOMES)
                 + f"; two such runs agree {_chance(p['plans'][n]['same'])}"]
        parts += [f"with {s}: " + ", ".join(f"{k} {_with_span(p['plans'][s][k], p['spans'][s][k])}"
                                           for k in power.OUTCOMES) for s in counts[1:]]
        return ("; ".join(parts) + f" (the measured difference {p['estimate']:+.3g} taken as the truth, the seed SD "
                f"{p['seed_sd']:.3g} as measured and, in brackets, from {lo:.2g} to {hi:.2g}, its 90% interval from "
                f"{n} {unit}: `python -m replication seeds`)")
    own = " ".join(f"{SHORT[k]} {_with_span(p['plans'][n][k], p['spans'][n][k])}" for k in power.OUTCOMES
                   if p["plans"][n][k][1] >= 0.005)
    more = [f"at {s}: {SHORT[k]} {_with_span(p['plans'][s][k], p['spans'][s][k])}"
            for s in counts[1:] for k in [max(power.OUTCOMES, key=lambda k: sum(p["plans"][s][k]))]]
    return " · ".join([own, *more])


def markdown(table, seeds, width: int = 70) -> str:
    """The rows as a Markdown table: claim, verdict now, estimate with seed SD (its 90% range), a cell per S, and
    the chance that every seed lands on the paper's side at the largest S."""
    top = max(seeds)
    units = "seeds or draws" if any(r["unit"] == "draw" for r in table) else "seeds"
    head = ["notebook", "claim", "now", "estimate, SD between seeds (90% range)", *[f"{s} {units}" for s in seeds],
            f"every one on the paper's side, {top} {units}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table:
        claim = r["claim"] if len(r["claim"]) <= width else r["claim"][: width - 3] + "..."
        lo, hi = r["sd_range"]
        lines.append("| " + " | ".join([r["notebook"][:2], claim, f"{r['verdict']} ({r['seeds_now']})",
                                        f"{r['estimate']:+.3g}, {r['seed_sd']:.3g} ({lo:.2g}-{hi:.2g})",
                                        *[cell(r["plans"][s]) for s in seeds],
                                        _chance(r["plans"][top]["every_seed"])]) + " |")
    return "\n".join(lines)


def text(table, seeds, width: int = 72) -> str:
    """The rows for a terminal: one block per comparison, each number of seeds with its chances, the chance that the
    interval clears no effect and the chance that every seed lands on the paper's side (shown, not required)."""
    out = []
    for r in table:
        lo, hi = r["sd_range"]
        u = r["unit"]
        out.append(f"{r['notebook'][:2]}  {r['claim'][:width]}\n    now: {r['verdict']} ({r['n']}); estimate "
                   f"{r['estimate']:+.3g}, {u} SD {r['seed_sd']:.3g} (90% range {lo:.2g}-{hi:.2g})")
        out += [f"    {s:>3} {u}s: {cell(r['plans'][s])}; interval clears no effect "
                f"{_chance(r['plans'][s]['clears'])}, every {u} on the paper's side {_chance(r['plans'][s]['every_seed'])}"
                for s in seeds]
    return "\n".join(out)


def main(argv) -> int:
    """python -m replication seeds [SOURCE] [--seeds 3,5,10,20] [--only 03] [--sims 2000] [--markdown]."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m replication seeds",
                                 description="each comparison over seeds: its chance of each verdict at S seeds")
    ap.add_argument("source", nargs="?", default="figures/metrics")
    ap.add_argument("--seeds", default="3,5,10,20", help="numbers of seeds to plan for, each 2 or more")
    ap.add_argument("--only", default=None, help="notebooks, e.g. 03 or 03,05")
    ap.add_argument("--sims", type=int, default=2000, help="simulated runs per row and number of seeds")
    ap.add_argument("--markdown", action="store_true", help="a Markdown table instead of blocks")
    args = ap.parse_args(argv)
    try:
        seeds = tuple(int(s) for s in args.seeds.split(","))
        if not seeds or any(s < 2 for s in seeds):
            raise ValueError
    except ValueError:
        print(f"error: --seeds {args.seeds!r} is not allowed; give numbers of seeds of 2 or more separated by commas "
              "(e.g. 3,5,10)", file=sys.stderr)
        return 1
    if args.sims < 100:
        print(f"error: --sims {args.sims} is not allowed; it must be an integer >= 100", file=sys.stderr)
        return 1
    only = [o.strip() for o in args.only.split(",") if o.strip()] if args.only else None
    try:
        table = rows(load(args.source), seeds, only, sims=args.sims)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if not table:
        print(f"error: no comparison over two or more seeds in {args.source}"
              + (f" for --only {args.only}" if only else ""), file=sys.stderr)
        return 1
    print(markdown(table, seeds) if args.markdown else text(table, seeds))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
