"""The figure index with the claims ledger (Markdown) and the HTML report of executed notebooks."""
import html
from pathlib import Path

from . import config, files
from .config import NOTEBOOKS, Paths, list_notebooks


def records(profile: str, folder: Path = NOTEBOOKS) -> list:
    """Metrics records of the workbook's notebooks that have run in this profile, in order."""
    paths = Paths(profile)
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


def index_path(profile: str) -> Path:
    """figures/README.md for the default profile, runs/<profile>/figures/README.md otherwise."""
    return config.figures_dir(profile) / "README.md"


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


def write_index(profile: str, folder: Path = NOTEBOOKS) -> Path:
    """Each figure with its notebook and caption, then the claims ledger of every notebook.

    Notebooks with no metrics here keep their rows from the existing index, so rerunning one notebook
    does not drop the others."""
    recs = {r["notebook"]: r for r in records(profile, folder)}
    stems = list_notebooks(folder)
    kept = kept_rows(index_path(profile), stems, recs)
    rows = {name: [] for name in _SECTIONS.values()}
    for stem in stems:
        r = recs.get(stem)
        if r is None:
            for name in rows:
                rows[name] += kept[name].get(stem, [])
            continue
        for f in r["figures"]:
            png = next((x for x in f["files"] if x.endswith(".png")), f["files"][0])
            rows["figures"].append(f"| [{f['name']}]({png}) | {r['notebook']} | {_md_cell(f['caption'])} |")
        rows["claims"] += ["| " + " | ".join(_md_cell(_cell(c, k)) for k in LEDGER_COLUMNS) + " |" for c in ledger([r])]
        rows["times"].append(f"| {r['notebook']} | {r['seed']} | {r['wall_time_s']} |")
    lines = [f"# Figures ({profile} profile)", "",
             f"Written by `python -m replication run --profile {profile}`; do not edit by hand.", "",
             "| figure | notebook | caption |", "|---|---|---|", *rows["figures"],
             "", "## Claims ledger", "", "| " + " | ".join(LEDGER_COLUMNS) + " |",
             "|" + "---|" * len(LEDGER_COLUMNS), *(rows["claims"] or ["| (no claims recorded yet) |" + " |" * (len(LEDGER_COLUMNS) - 1)]),
             "", "| notebook | seed | wall time (s) |", "|---|---|---|", *rows["times"]]
    return files.write_text(index_path(profile), "\n".join(lines) + "\n")


def write_html(profile: str, folder: Path = NOTEBOOKS) -> Path:
    """runs/<profile>/report/index.html linking each executed notebook (as HTML) and the ledger."""
    from nbconvert import HTMLExporter

    paths = Paths(profile)
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
        for c in ledger(records(profile, folder))
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
