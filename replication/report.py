"""The figure index with the claims ledger (Markdown) and the HTML report of executed notebooks."""
import html
from pathlib import Path

from . import files
from .config import NOTEBOOKS, Paths, list_notebooks


def records(profile: str, folder: Path = NOTEBOOKS, name: str = None) -> list:
    """Metrics records of the workbook's notebooks that have run in this profile (run folder `name`, by default
    the profile's own), in order."""
    paths = Paths(profile, name)
    out = []
    for stem in list_notebooks(folder):
        path = paths.metrics / f"{stem}.json"
        if path.is_file():
            out.append(files.read_json(path))
    return out


def ledger(recs) -> list:
    """All claims of all notebooks, each with its notebook."""
    return [{"notebook": r["notebook"], **c} for r in recs for c in r.get("claims", [])]


LEDGER_COLUMNS = ("notebook", "claim", "paper", "measured", "verdict", "evidence", "interval", "n", "why")


def _cell(claim: dict, key: str) -> str:
    """One ledger cell: intervals as [low, high], missing values as '-'."""
    v = claim.get(key)
    if v is None:
        return "-"
    if key == "interval":
        return "[" + ", ".join(f"{x:+.3g}" for x in v) + "]"
    return str(v)


def _md_cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def index_path(profile: str, name: str = None) -> Path:
    """figures/README.md for the default profile, runs/<profile>/figures/README.md for the others (and
    runs/<name>/figures/README.md for the run folder of one-off overrides)."""
    return Paths(profile, name).figures / "README.md"


_SECTIONS = {"| figure |": "figures", "| notebook | claim |": "claims", "| notebook | seed |": "times"}


def kept_rows(path: Path, stems, ran) -> dict:
    """Rows of an existing index for workbook notebooks that have no metrics here (they ran on another machine)."""
    kept = {name: {} for name in _SECTIONS.values()}
    if not Path(path).is_file():
        return kept
    section = None
    for line in Path(path).read_text().splitlines():
        section = next((name for head, name in _SECTIONS.items() if line.startswith(head)), section)
        if section is None or not line.startswith("| ") or line.startswith(tuple(_SECTIONS)):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        stem = cells[1] if section == "figures" and len(cells) > 1 else cells[0]
        if stem in stems and stem not in ran:
            kept[section].setdefault(stem, []).append(line)
    return kept


def write_index(profile: str, folder: Path = NOTEBOOKS, name: str = None) -> Path:
    """Each figure with its notebook and caption, then the claims ledger of every notebook.

    Notebooks with no metrics here keep their rows from the existing index, so rerunning one notebook
    does not drop the others."""
    recs = {r["notebook"]: r for r in records(profile, folder, name)}
    stems = list_notebooks(folder)
    kept = kept_rows(index_path(profile, name), stems, recs)
    rows = {name: [] for name in _SECTIONS.values()}
    for stem in stems:
        r = recs.get(stem)
        if r is None:
            for section in rows:
                rows[section] += kept[section].get(stem, [])
            continue
        for f in r["figures"]:
            png = next((x for x in f["files"] if x.endswith(".png")), f["files"][0])
            rows["figures"].append(f"| [{f['name']}]({png}) | {r['notebook']} | {_md_cell(f['caption'])} |")
        rows["claims"] += ["| " + " | ".join(_md_cell(_cell(c, k)) for k in LEDGER_COLUMNS) + " |" for c in ledger([r])]
        rows["times"].append(f"| {r['notebook']} | {r['seed']} | {r['wall_time_s']} |")
    where = f"{profile} profile" + (f", one-off overrides in runs/{name}/" if name and name != profile else "")
    lines = [f"# Figures ({where})", "",
             f"Written by `python -m replication run --profile {profile}`; do not edit by hand.", "",
             "| figure | notebook | caption |", "|---|---|---|", *rows["figures"],
             "", "## Claims ledger", "", "| " + " | ".join(LEDGER_COLUMNS) + " |",
             "|" + "---|" * len(LEDGER_COLUMNS), *(rows["claims"] or ["| (no claims recorded yet) |" + " |" * (len(LEDGER_COLUMNS) - 1)]),
             "", "| notebook | seed | wall time (s) |", "|---|---|---|", *rows["times"]]
    return files.write_text(index_path(profile, name), "\n".join(lines) + "\n")


def write_html(profile: str, folder: Path = NOTEBOOKS, name: str = None) -> Path:
    """runs/<profile>/report/index.html (runs/<name>/ for a run folder of overrides) linking each executed
    notebook (as HTML) and the ledger."""
    from nbconvert import HTMLExporter

    paths = Paths(profile, name)
    paths.report.mkdir(parents=True, exist_ok=True)
    exporter = HTMLExporter()
    items = []
    for stem in list_notebooks(folder):
        nb = paths.executed(stem)
        if not nb.is_file():
            continue
        out = paths.report / f"{stem}.html"
        if not out.is_file() or out.stat().st_mtime < nb.stat().st_mtime:
            body, _ = exporter.from_filename(str(nb))
            files.write_text(out, body)
        items.append(f'<li><a href="{out.name}">{html.escape(stem)}</a></li>')
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(c, k))}</td>" for k in LEDGER_COLUMNS) + "</tr>"
        for c in ledger(records(profile, folder, name))
    )
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Replication workbook: {profile}</title>
<style>body{{font-family:sans-serif;max-width:70em;margin:2em auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;vertical-align:top}}</style></head><body>
<h1>Replication workbook ({html.escape(profile)} profile)</h1>
<h2>Executed notebooks</h2><ul>{''.join(items)}</ul>
<h2>Claims ledger</h2><table><tr>{''.join(f"<th>{k}</th>" for k in LEDGER_COLUMNS)}</tr>
{rows}</table></body></html>
"""
    return files.write_text(paths.report / "index.html", page)


# ---- figure digests: which figures a run changed, and why ------------------------------------------

# Figures that plot wall-clock measurements: they change on every run, and that is expected.
TIMED_FIGURES = ("00b_generation_throughput",)
REASONS = {"notebook": "code (the notebook)", "package": "code (the package)", "params": "parameters",
           "data": "data (data/)", "machine": "the machine or its thread count"}


def digests_path(profile: str, name: str = None) -> Path:
    """digests.json beside the index: figures/digests.json for the default profile."""
    return Paths(profile, name).figures / "digests.json"


file_sha256 = files.sha256


def why_changed(before: dict, parts: dict) -> list:
    """The stamp parts (notebook, params, package, data, machine) that differ from the run recorded before."""
    return [REASONS.get(k, k) for k in parts if before.get(k) != parts[k]]


def record_digests(profile: str, stem: str, parts: dict, stamp: str, names, log=print, name: str = None) -> dict:
    """Store the sha256 of each figure file a notebook wrote, with the stamp parts of the run that wrote it,
    in digests.json (one entry per notebook; the others are kept), and log each figure whose digest changed
    since the recorded run with the reason: the code (notebook or package), the parameters, data/, the machine
    (CPU numerics depend on the thread count), or none of them: a determinism bug, logged loudly.
    Returns {figure file: reason}."""
    path = digests_path(profile, name)
    book = files.read_json(path) if path.is_file() else {}
    entries = book.get("notebooks", {})
    old = entries.get(stem)
    new = {n: file_sha256(Paths(profile, name).figures / n) for n in sorted(names)}
    changed = {}
    if old is not None:
        causes = why_changed(old.get("parts", {}), parts)
        for file, sha in new.items():
            was = old["figures"].get(file)
            if was == sha:
                continue
            if was is None:
                changed[file] = "new figure"
            elif causes:
                changed[file] = "changed: " + ", ".join(causes)
            elif Path(file).stem in TIMED_FIGURES:
                changed[file] = "changed: it plots measured timings (expected)"
            else:
                changed[file] = "DETERMINISM BUG"
        changed.update({n: "no longer written" for n in old["figures"] if n not in new})
    for file, why in changed.items():
        if why == "DETERMINISM BUG":
            log(f"[{stem}] DETERMINISM BUG: {file} changed although the notebook, its parameters, the package, data/ "
                f"and the machine did not: unseeded randomness, or a cache entry made by older code")
        else:
            log(f"[{stem}] figure {file}: {why}")
    if old is None:
        log(f"[{stem}] {len(new)} figure digests recorded in {path} (no earlier record to compare with)")
    elif not changed:
        log(f"[{stem}] all {len(new)} figure files identical to the recorded run")
    entries[stem] = {"stamp": stamp, "parts": dict(parts), "figures": new}
    files.write_json(path, {"about": "sha256 of each figure file and the stamp parts (digests of the notebook, its "
                                     "parameters, the package source and data/; the machine) of the run that wrote "
                                     "it; written by python -m replication run",
                            "notebooks": dict(sorted(entries.items()))})
    return changed
