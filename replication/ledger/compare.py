"""Two ledgers side by side: every claim of one run beside the same claim of another, with both verdicts, estimates
and intervals, and the claims whose verdict changed named.

A ledger is read from the metrics records the runner writes (runs/<folder>/metrics/, and for the default profile the
copy committed beside the figures, figures/metrics/), from one such file, or from a git revision of the committed
copy (`git:REV`), so a reader can set two versions of the results side by side without rerunning either:

    python -m replication compare git:HEAD~5 figures/metrics --only 03

Claims are paired within a notebook by their text with its numbers taken out (a claim may name a count that the run
measured, e.g. "473 sampled replies"), in order where several read alike; a claim left over pairs with one that
reads nearly alike (a reworded claim, shown as such).
"""
import difflib
import json
import re
import subprocess
import sys
from pathlib import Path

from replication.core import config, verdicts
from replication.core.fmt import short_claim

NUMBER = re.compile(r"[-+]?\d+(?:[.,]\d+)*")


def claim_key(claim: str) -> str:
    """A claim's text without its numbers: the same claim in two runs whose measured counts differ reads alike."""
    return NUMBER.sub("#", " ".join(str(claim).split()))


def _records_of(text_by_name: dict, source: str) -> dict:
    out = {}
    for name, text in sorted(text_by_name.items()):
        try:
            rec = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{source}: {name} is not a metrics record ({e})") from None
        if isinstance(rec, dict) and "claims" in rec:
            out[rec.get("notebook") or Path(name).stem] = rec
    return out


def _git_records(rev: str) -> dict:
    folder = "figures/metrics"

    def git(*args):
        return subprocess.run(["git", *args], cwd=config.ROOT, capture_output=True, text=True)

    listing = git("ls-tree", "--name-only", f"{rev}:{folder}")
    if listing.returncode != 0:
        why = (listing.stderr.strip().splitlines() or ["git failed"])[-1]
        raise ValueError(f"source git:{rev}: no {folder}/ at that revision ({why})")
    texts = {n: git("show", f"{rev}:{folder}/{n}").stdout for n in listing.stdout.split() if n.endswith(".json")}
    return _records_of(texts, f"git:{rev}")


def load(source: str) -> dict:
    """{notebook: metrics record} from a metrics file, a folder of them, or `git:REV` (figures/metrics/ at that
    revision of this checkout). Raises ValueError naming the source when it holds no metrics record."""
    if source.startswith("git:"):
        recs = _git_records(source[4:] or "HEAD")
    else:
        path = Path(source)
        if path.is_dir():
            recs = _records_of({p.name: p.read_text() for p in path.glob("*.json")}, source)
        elif path.is_file():
            recs = _records_of({path.name: path.read_text()}, source)
        else:
            raise ValueError(f"source {source!r}: no such file or folder (a metrics file, a folder of them such as "
                             "figures/metrics, or git:REV)")
    if not recs:
        raise ValueError(f"source {source!r} holds no metrics record (a JSON file with 'claims', as the runner writes)")
    return recs


def _measured(c: dict) -> str:
    """estimate [low, high] as recorded (3 significant digits), '-' where the claim has neither."""
    est, iv = c.get("estimate"), c.get("interval")
    text = "" if est is None else f"{est:+.3g}"
    if iv:
        text += (" " if text else "") + "[" + ", ".join(f"{x:+.3g}" for x in iv) + "]"
    return text or "-"


REWORDED = 0.8   # the least text similarity (difflib's ratio, numbers taken out) at which two claims are one reworded


def _reworded(a: list, b: list) -> dict:
    """{i: j}: claims a[i] and b[j] that no exact pairing matched, paired as one claim reworded when their texts
    (numbers taken out) are at least REWORDED alike, the most alike first."""
    scored = sorted(((difflib.SequenceMatcher(None, claim_key(c["claim"]), claim_key(d["claim"])).ratio(), i, j)
                     for i, c in a for j, d in b), key=lambda t: -t[0])
    out, taken = {}, set()
    for ratio, i, j in scored:
        if ratio >= REWORDED and i not in out and j not in taken:
            out[i] = j
            taken.add(j)
    return out


def pair(old: dict, new: dict, only=None) -> list:
    """Rows for the claims of both ledgers, notebook by notebook (`only`: notebook stems or their number prefixes):
    {notebook, claim, old, new, reworded} with old / new the claim's record in each (None where a ledger lacks it).
    Claims pair by their text without numbers, in order where several read alike; those left over pair when they
    read nearly alike (a reworded claim, `reworded` True), else stand alone."""
    rows = []
    for stem in sorted(set(old) | set(new)):
        if only and not any(stem.startswith(o) for o in only):
            continue
        a = list((old.get(stem) or {}).get("claims", []))
        b = list((new.get(stem) or {}).get("claims", []))
        match = {}
        for i, c in enumerate(a):
            j = next((j for j, d in enumerate(b) if j not in match.values() and claim_key(d["claim"]) == claim_key(c["claim"])),
                     None)
            if j is not None:
                match[i] = j
        near = _reworded([(i, c) for i, c in enumerate(a) if i not in match],
                         [(j, d) for j, d in enumerate(b) if j not in match.values()])
        used = set(match.values()) | set(near.values())
        for i, c in enumerate(a):
            j = match.get(i, near.get(i))
            rows.append({"notebook": stem, "claim": c["claim"], "old": c, "new": b[j] if j is not None else None,
                         "reworded": i in near})
        rows += [{"notebook": stem, "claim": d["claim"], "old": None, "new": d, "reworded": False}
                 for j, d in enumerate(b) if j not in used]
    return rows


def status(row: dict) -> str:
    """'same', 'changed' (the verdict word, its qualifier or its health note), 'only old' or 'only new'."""
    if row["old"] is None or row["new"] is None:
        return "only new" if row["old"] is None else "only old"
    return "same" if verdicts.label(row["old"]) == verdicts.label(row["new"]) else "changed"


def summary(rows) -> dict:
    """How many rows have each status."""
    out = {k: 0 for k in ("same", "changed", "only old", "only new")}
    for r in rows:
        out[status(r)] += 1
    return out


MARK = {"same": "=", "changed": "!", "only old": "-", "only new": "+"}


def format_rows(rows, width: int = 72) -> str:
    """The rows as text: per claim a line with its mark (= same verdict, ! changed, - only in the old ledger, + only
    in the new), its short text and n, then one line per ledger with the verdict and the estimate [interval]."""
    lines, stem = [], None
    for r in rows:
        if r["notebook"] != stem:
            stem = r["notebook"]
            lines.append(f"{stem}")
        text = short_claim(r["claim"])
        text = text if len(text) <= width else text[:width - 1] + "…"
        n = (r["new"] or r["old"]).get("n")
        lines.append(f"  {MARK[status(r)]} {text}" + (f"  (n: {n})" if n else ""))
        if r.get("reworded"):
            lines.append(f"      reworded, now: {short_claim(r['new']['claim'])[:width]}")
        for side in ("old", "new"):
            c = r[side]
            lines.append(f"      {side}: " + ("(no such claim)" if c is None else f"{_measured(c):<30} {verdicts.label(c)}"))
    return "\n".join(lines)


def previous(paths, stem: str):
    """The metrics record a notebook's last successful run left in run folder `paths` (else the copy committed beside
    its figures), or None: what the runner compares a fresh run's verdicts with before it replaces the record."""
    for p in (paths.metrics / f"{stem}.json", paths.figures / "metrics" / f"{stem}.json"):
        if p.is_file():
            try:
                return json.loads(p.read_text())
            except json.JSONDecodeError:
                return None
    return None


def log_changes(stem: str, before, after: dict, log=print) -> dict:
    """Log how a fresh run's verdicts compare with the recorded run's (`before`, None: nothing to compare with):
    the count as before, and each changed claim with both verdicts and both estimates [intervals]. Returns the
    summary counts ({} when there was nothing to compare with)."""
    if not before:
        return {}
    rows = pair({stem: before}, {stem: after})
    counts = summary(rows)
    log(f"[{stem}] verdicts against the recorded run: {counts['same']} as before, {counts['changed']} changed"
        + "".join(f", {counts[k]} {k}" for k in ("only old", "only new") if counts[k]))
    for r in rows:
        if status(r) == "changed":
            words = [verdicts.label({**r[s], "health": None}) for s in ("old", "new")]
            how = f"{words[0]} -> {words[1]}" if words[0] != words[1] else f"{words[0]}, its health note changed"
            nums = [_measured(r[s]) for s in ("old", "new")]
            log(f"[{stem}]   {short_claim(r['claim'])[:80]}: {how}" + (f" ({nums[0]} -> {nums[1]})" if nums != ["-", "-"] else ""))
    return counts


def main(argv) -> int:
    """python -m replication compare OLD NEW [--only 03,05] [--changed]: print both ledgers' claims side by side
    and a count of verdicts as before and changed; exit 0 (a changed verdict is a finding, not an error)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m replication compare",
                                 description="two ledgers side by side (metrics file, folder, or git:REV)")
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--only", default=None, help="notebooks, e.g. 03 or 03,05")
    ap.add_argument("--changed", action="store_true", help="show only claims whose verdict changed or that one lacks")
    args = ap.parse_args(argv)
    try:
        old, new = load(args.old), load(args.new)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    only = [o.strip() for o in args.only.split(",") if o.strip()] if args.only else None
    rows = pair(old, new, only)
    if only and not rows:
        print(f"error: --only {args.only}: no claim of those notebooks in either ledger "
              f"(notebooks there: {', '.join(sorted(set(old) | set(new)))})", file=sys.stderr)
        return 1
    counts = summary(rows)
    shown = [r for r in rows if status(r) != "same"] if args.changed else rows
    if shown:
        print(format_rows(shown))
    print(f"{len(rows)} claims: {counts['same']} verdicts as before, {counts['changed']} changed"
          + "".join(f", {counts[k]} {k}" for k in ("only old", "only new") if counts[k]))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
