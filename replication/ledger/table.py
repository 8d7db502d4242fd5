"""The claims ledger's cells and its full entries (ledger.md): what every table of claims shows, one place.

The table (figures/README.md, the HTML report) shows each cell cut short (`short`); ledger.md gives every claim in
full under its anchor, a compound claim's measured parts each on a line of their own."""
from replication.core import verdicts
from . import seeds

LEDGER_COLUMNS = ("notebook", "claim", "task", "model", "judge", "paper", "measured", "verdict", "evidence", "interval",
                  "n", "rerun", "why", "source")   # source: results store / computed now (store.claim_source)

SHORT = 90  # characters of a long cell shown in the ledger's table; the full text is one click away


def grouped(claims: list) -> list:
    """The claims in the ledger's order: each notebook's rows as recorded, except that the rows testing the same claim
    (the same words, case aside: by simulation and by the real model, say) stand together where the first of them
    stands. Its evidence column tells them apart."""
    order, groups = [], {}
    for c in claims:
        key = (c.get("notebook"), c["claim"].lower())
        if key not in groups:
            order.append(key)
            groups[key] = []
        groups[key].append(c)
    return [c for key in order for c in groups[key]]


def short(text: str, limit: int = SHORT) -> str:
    """A long cell cut at a word before `limit` characters, with an ellipsis (unchanged when it fits)."""
    text = str(text)
    if len(text) <= limit:
        return text
    cut = text[:limit - 1].rsplit(" ", 1)[0].rstrip(" ,;:(")
    return cut + " …"


def _cell(claim: dict, key: str) -> str:
    """One ledger cell: intervals as [low, high], the verdict with its qualifier and failed health check
    (verdicts.label), missing values as '-'."""
    v = claim.get(key)
    if key == "verdict":
        return verdicts.label(claim)
    if key == "rerun":   # not recorded: projected from the row's seeds (seeds.rerun)
        v = seeds.rerun(claim)
    if v is None:
        return "-"
    if key == "interval":
        parts = {k: p for k, p in (claim.get("parts") or {}).items() if p.get("interval")}
        text = lambda iv: "[" + ", ".join(f"{x:+.3g}" for x in iv) + "]"  # noqa: E731
        if parts:   # a compound claim: each part's interval (its verdict in ledger.md)
            return "; ".join(f"{k} {text(p['interval'])}" for k, p in parts.items())
        return text(v)
    return str(v)


def health_short(health: str) -> str:
    """A failed health check counted per arm for the ledger's table ('failed health check: point 3 seeds,
    static-mid 2 seeds'); the seeds and checks in full are in ledger.md."""
    items = health.split(": ", 1)[1].split("; ") if ": " in health else [health]
    counts = {}
    for item in items:
        arm = item.split(" (", 1)[0]
        for unit in (" seed ", " draw "):
            arm, _, index = arm.partition(unit)
            if index:
                counts.setdefault(arm, [0, unit.strip()])[0] += 1
                break
        else:
            counts.setdefault(arm, [0, None])
    words = [arm if unit is None else f"{arm} {n} {unit}{'s' if n > 1 else ''}" for arm, (n, unit) in counts.items()]
    return short("failed health check: " + ", ".join(words))


def table_cell(claim: dict, key: str) -> str:
    """A cell of the ledger's table: a long paragraph cut short, a failed health check counted per arm (health_short);
    ledger.md has both in full."""
    if key == "verdict" and claim.get("health"):
        return f"{verdicts.label({**claim, 'health': None})}; {health_short(claim['health'])}"
    return short(_cell(claim, key)) if key in LONG_COLUMNS else _cell(claim, key)


def _md_cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


LONG_COLUMNS = ("paper", "measured", "why")  # paragraphs: short in the table, in full in ledger.md


def claim_anchor(claim: dict, i: int) -> str:
    """The id of a claim's full entry in ledger.md (and the HTML report): its notebook number and place."""
    return f"claim-{claim.get('notebook', '')[:2]}-{i}"


def _part_line(p: dict, cut: int) -> str:
    """ledger.md's line for one measured part of a compound claim (verdicts.expanded): its verdict with the seeds on
    the paper's side, its interval, each seed's value and how a rerun would read it."""
    seeds_ = p.get("seed_differences") or []
    side = verdicts.qualifier(seeds_ or None, direction=p.get("direction", 1), null=p.get("null", 0.0))
    text = f"- **part: {p['claim'][cut + 2:]}**: {p['verdict']}" + (f" ({side})" if side else "") + ", "
    text += _cell(p, "interval") + ("; per seed " + ", ".join(f"{x:+.3f}" for x in seeds_) if seeds_ else "")
    return text + (f"; a rerun reads: {r}" if (r := seeds.rerun(p)) else "")


def paper_effect(claim: dict):
    """ledger.md's line on the paper's effect for a row with an interval: its size where it was passed to the rule,
    else why it was not (`effect_why`); None for a row without an interval or without either."""
    if claim.get("interval") is None:
        return None
    if claim.get("effect") is not None:
        return f"{claim['effect']:+.3g}, passed to the rule (an interval short of it reads partly)"
    return f"not passed: {claim['effect_why']}" if claim.get("effect_why") else None


def ledger_md(claims, profile: str) -> str:
    """ledger.md: every claim in full (all fields, the long paragraphs too), one entry per claim under its anchor."""
    out = [f"# Claims ledger in full ({profile} profile)", "",
           "Written by `python -m replication run`; the table in README.md shows these cells cut short.", ""]
    for i, c in enumerate(claims):
        out += [f'<a id="{claim_anchor(c, i)}"></a>', f"### {c['notebook'][:2]}. {c['claim']}", "",
                *[f"- **{k}**: {_md_cell(_cell(c, k))}" for k in LEDGER_COLUMNS[2:] if k != "rerun"]]
        if (effect := paper_effect(c)) is not None:
            out.append(f"- **paper's effect**: {_md_cell(effect)}")
        if c.get("seed_differences") and not c.get("parts"):
            out.append("- **per seed**: " + ", ".join(f"{x:+.3f}" for x in c["seed_differences"]))
        out += [_part_line(p, len(c["claim"])) for p in (verdicts.expanded([c]) if c.get("parts") else [])]
        if (rerun := seeds.rerun(c, full=True)) is not None:
            out.append("- **a rerun reads**: " + rerun)
        out.append("")
    return "\n".join(out)


