"""The figure index with the claims ledger (Markdown) and the HTML report of executed notebooks."""
import html
from pathlib import Path

from replication.core import files, phases
from replication.core.config import NOTEBOOKS, Paths, list_notebooks
from . import forest, seeds
from .table import (LEDGER_COLUMNS, LONG_COLUMNS, SHORT, _cell, _md_cell, claim_anchor,  # noqa: F401
                    grouped, ledger_md, short, table_cell)


def records(profile: str, folder: Path = NOTEBOOKS, name: str = None) -> list:
    """Metrics records of the workbook's notebooks that have run in this profile (run folder `name`, by default
    the profile's own), in order; a notebook not run here is read from the metrics committed beside the figures
    (figures/metrics/ for the default profile)."""
    paths = Paths(profile, name)
    out = []
    for stem in list_notebooks(folder):  # the run folder's record, else the one committed beside the figures
        path = next((p for p in (paths.metrics / f"{stem}.json", paths.figures / "metrics" / f"{stem}.json")
                     if p.is_file()), None)
        if path is not None:
            out.append(files.read_json(path))
    return out


def ledger(recs) -> list:
    """All claims of all notebooks, each with its notebook, in the ledger's order (table.grouped)."""
    return grouped([{"notebook": r["notebook"], **c} for r in recs for c in r.get("claims", [])])


def caveat(profile: str, name: str = None):
    """What a reader must know before reading a run's numbers, or None for the profile's own default or paper run:
    a smoke run tests the code at tiny sizes (its verdicts are not findings), and a run with one-off overrides
    (--set) is not the workbook's run of that profile."""
    if profile == "smoke":
        return ("Smoke run: tiny sizes that test the code, not the papers. Its numbers and verdicts are not results; "
                "the default profile's run (figures/README.md) holds the workbook's findings.")
    if name and name != profile:
        return (f"One-off overrides (runs/{name}/, made with --set): not the workbook's {profile} run; read its "
                "verdicts against the settings that were changed.")
    return None


def verdict_label(profile: str, name: str = None) -> str:
    """The ledger's verdict column header: marked when the run's verdicts are not findings (caveat)."""
    return "verdict" if caveat(profile, name) is None else ("verdict (smoke: tests the code)" if profile == "smoke"
                                                            else "verdict (one-off overrides)")


_OLD = ("notebook", "claim", "paper", "measured", "verdict", "evidence", "interval", "n")   # earlier indexes' columns:
_OLD_LEDGERS = (_OLD + ("why",), _OLD + ("rerun", "why"), _OLD + ("rerun", "why", "source"))   # kept_rows realigns


def source_note(rec: dict) -> str:
    """Where a notebook's cached results came from in its last execution (its metrics' results_store): how many were
    read from the results store (with its commit and date) and how many were made now; '-' when not recorded."""
    counts = rec.get("results_store")
    if not counts:
        return "-"
    store = counts.get("store") or {}
    read = (f"{counts['from_store']} from the store ({store.get('commit') or 'uncommitted'}, {store.get('date')})"
            if counts.get("from_store") else "none from the store")
    return f"{read}; {counts.get('made_now', 0)} made now"


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
        if section == "times" and len(cells) == 3 + len(PHASE_COLUMNS):   # an index written before the reused column
            cells = [*cells[:3], "-", *cells[3:]]
        if section == "times" and len(cells) == 4 + len(PHASE_COLUMNS):   # before the cached-results column
            line = "| " + " | ".join([*cells, "-"]) + " |"
        old = next((c for c in _OLD_LEDGERS if len(c) == len(cells)), None) if section == "claims" else None
        if old is not None:   # an index written before some of today's columns: their cells read '-'
            got = dict(zip(old, cells))
            line = "| " + " | ".join(got.get(k, "-") for k in LEDGER_COLUMNS) + " |"
        if stem in stems and stem not in ran:
            kept[section].setdefault(stem, []).append(line)
    return kept


PHASE_COLUMNS = (*phases.PHASES, "other")


def write_index(profile: str, folder: Path = NOTEBOOKS, name: str = None) -> Path:
    """The forest plot of every comparative claim (forest.plot), each figure with its notebook and caption, then
    the claims ledger of every notebook with its long cells cut short (each claim links to its full entry in
    ledger.md beside the index).

    Notebooks with no metrics here keep their rows from the existing index, so rerunning one notebook
    does not drop the others."""
    recs = {r["notebook"]: r for r in records(profile, folder, name)}
    stems = list_notebooks(folder)
    kept = kept_rows(index_path(profile, name), stems, recs)
    rows = {name: [] for name in _SECTIONS.values()}
    claims = ledger([recs[s] for s in stems if s in recs])
    anchors = {id(c): claim_anchor(c, i) for i, c in enumerate(claims)}
    for stem in stems:
        r = recs.get(stem)
        if r is None:
            for section in rows:
                rows[section] += kept[section].get(stem, [])
            continue
        for f in r["figures"]:
            png = next((x for x in f["files"] if x.endswith(".png")), f["files"][0])
            rows["figures"].append(f"| [{f['name']}]({png}) | {r['notebook']} | {_md_cell(f['caption'])} |")
        for c in (c for c in claims if c["notebook"] == stem):
            cells = [_md_cell(table_cell(c, k)) for k in LEDGER_COLUMNS]
            cells[1] = f"[{cells[1]}](ledger.md#{anchors[id(c)]})"
            rows["claims"].append("| " + " | ".join(cells) + " |")
        prof = r.get("phases_s") or {}
        rows["times"].append(f"| {r['notebook']} | {r['seed']} | {r['wall_time_s']} | {reused_cell(r.get('reused_s'))} | "
                             + " | ".join(f"{prof[k]:.0f}" if k in prof else "-" for k in PHASE_COLUMNS)
                             + f" | {_md_cell(source_note(r))} |")
    out_dir = index_path(profile, name).parent
    plotted = forest.plot(claims, out_dir)
    files.write_text(out_dir / "ledger.md", ledger_md(claims, profile))
    where = f"{profile} profile" + (f", one-off overrides in runs/{name}/" if name and name != profile else "")
    note = caveat(profile, name)
    head = [verdict_label(profile, name) if k == "verdict" else k for k in LEDGER_COLUMNS]
    forest_lines = ([f"![every comparative claim]({next(f for f in plotted if f.endswith('.png'))})", "",
                     "Every comparative claim: estimate, 95% interval, each training seed, the paper's effect where "
                     "comparable, in the paper's direction (right of 0 is the paper's side; "
                     f"[how to read it](../docs/statistics.md#reading-the-forest-plot)).", ""] if plotted else [])
    lines = [f"# Figures ({where})", "", *([f"> **{note}**", ""] if note else []),
             f"Written by `python -m replication run --profile {profile}`; do not edit by hand.", "",
             *forest_lines, "## Claims ledger", "",
             "Rows that test the same claim by simulation and by the real model stand together (`evidence` tells "
             "them apart). "
             "Long cells are cut short, a failed health check counted per arm; click a claim for its full entry "
             "([ledger.md](ledger.md)). `source`: whether "
             "a real-model claim's cached results were read from the committed results store (`results/default/`) "
             "or computed now (simulation and arithmetic rows are always computed now). " + seeds.RERUN_HELP, "",
             "| " + " | ".join(head) + " |",
             "|" + "---|" * len(LEDGER_COLUMNS), *(rows["claims"] or ["| (no claims recorded yet) |" + " |" * (len(LEDGER_COLUMNS) - 1)]),
             "", "## Figures", "", "| figure | notebook | caption |", "|---|---|---|", *rows["figures"],
             "", "Wall time and where it went (seconds by phase, `phases_s` in each notebook's metrics; a cached step "
             "costs nothing there). A notebook resumed from its cache did only part of its work in this execution: "
             "`reused` is what the cached results it loaded took when they were made (`reused_s`; '+ k untimed': k of "
             "them were made before times were recorded, so the sum is a lower bound; '-': not recorded):", "",
             "| notebook | seed | wall time (s) | reused (s) | " + " | ".join(PHASE_COLUMNS) + " | cached results |",
             "|---|---|---|---|" + "---|" * (len(PHASE_COLUMNS) + 1), *rows["times"]]
    return files.write_text(index_path(profile, name), "\n".join(lines) + "\n")


def reused_cell(reused) -> str:
    """The index's `reused` cell: the seconds the cached results a notebook loaded took when they were made, with how
    many carry no recorded time; '-' for a record written before it was kept."""
    if not reused:
        return "-"
    untimed = f" + {reused['untimed']} untimed" if reused.get("untimed") else ""
    return f"{reused['seconds']:.0f}{untimed}"


# ---- the HTML report: offline, with figures and a marked ledger -------------------------------------

# MathJax 2.7 from the jupyter-server-mathjax package, copied into the report folder so equations render offline;
# the files its TeX-AMS-MML_HTMLorMML-full configuration loads (HTML-CSS output with the STIX-Web fonts).
MATHJAX_URL = "mathjax/MathJax.js?config=TeX-AMS-MML_HTMLorMML-full,Safe"
MATHJAX_PARTS = ("MathJax.js", "LICENSE", "config", "extensions", "jax/element", "jax/input", "jax/output/HTML-CSS",
                 "fonts/HTML-CSS/STIX-Web")
MATHJAX_SKIP = ("a11y",)  # the accessibility explorer, loaded only from MathJax's menu
# nbconvert's lab template without require.js from the network, and MathJax told to use its STIX-Web fonts.
MATHJAX_FONTS = ('<script>window.MathJax = {"HTML-CSS": {availableFonts: [], preferredFont: null, webFont: "STIX-Web", '
                 'imageFont: null}, tex2jax: {inlineMath: [["$", "$"], ["\\\\(", "\\\\)"]], processEscapes: true}, '
                 'messageStyle: "none"};</script>')
TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- from 'mathjax.html.j2' import mathjax -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}
""" + MATHJAX_FONTS + """
{{ mathjax(resources.mathjax_url) }}
{%- endblock html_head_js_mathjax -%}
"""
VERDICT_COLOURS = {"reproduced": "#1b7f3b", "partly": "#1f5fa8", "inconclusive": "#a86b00",
                   "not reproduced": "#b3261e", "not tested": "#6b6b6b"}
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
CAVEAT_STYLE = ".caveat{background:#fff4d6;border:2px solid #a86b00;padding:.6em 1em;font-weight:bold;max-width:75em}"
STYLE = """body{font-family:sans-serif;max-width:75em;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;vertical-align:top;text-align:left}
.figs{display:flex;flex-wrap:wrap;gap:1em}figure{width:22em;margin:0}figure img{width:100%;border:1px solid #ddd}
figcaption{font-size:.85em}.badge{display:inline-block;padding:1px 8px;border-radius:1em;color:#fff;white-space:nowrap}
.kind{display:inline-block;padding:1px 6px;border:1px solid #888;border-radius:3px;font-size:.85em;white-space:nowrap}
""" + CAVEAT_STYLE


def install_mathjax(report_dir: Path) -> Path:
    """Copy MathJax (MATHJAX_PARTS of jupyter_server_mathjax's files) into <report>/mathjax/ unless it is there."""
    import shutil

    import jupyter_server_mathjax

    source = Path(jupyter_server_mathjax.__file__).parent / "static"
    target = Path(report_dir) / "mathjax"
    marker = target / ".complete"
    if not marker.is_file():
        shutil.rmtree(target, ignore_errors=True)
        for part in MATHJAX_PARTS:
            if (source / part).is_dir():
                shutil.copytree(source / part, target / part, ignore=shutil.ignore_patterns(*MATHJAX_SKIP))
            else:
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source / part, target / part)
        files.write_text(marker, "copied from jupyter_server_mathjax by replication.ledger.report\n")
    return target


def widget_text(state: dict, model_id: str) -> str:
    """The text a widget shows in its final state: a tqdm bar's 'desc: 100%' and '272/272 [00:01<00:00]'."""
    import re

    model = state.get(model_id, {}).get("state", {})
    parts = [widget_text(state, c.removeprefix("IPY_MODEL_")) for c in model.get("children", [])]
    value = model.get("value") if model.get("_model_name") == "HTMLModel" else None
    text = " ".join([html.unescape(re.sub(r"<[^>]+>", " ", str(value)))] if value else [p for p in parts if p])
    return " ".join(text.split())


def widgets_as_text(nb) -> None:
    """Show each widget output as the text of its final state and drop the widget state, so the page needs no
    widget library from the network (a notebook's tqdm bars are widgets)."""
    state = nb.metadata.pop("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state", {})
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            view = out.get("data", {}).pop(WIDGET_VIEW, None)
            if view:
                out["data"]["text/plain"] = widget_text(state, view.get("model_id", "")) or out["data"].get("text/plain", "")


def banner_html(note) -> str:
    return f'<p class="caveat">{html.escape(note)}</p>' if note else ""


def notebook_html(path: Path, note: str = None) -> str:
    """One executed notebook as a standalone HTML page that loads nothing from the network, opened by the run's
    caveat when it has one."""
    import jinja2
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(path, as_version=4)
    widgets_as_text(nb)
    exporter = HTMLExporter(template_name="lab", extra_loaders=[jinja2.DictLoader({"report.html.j2": TEMPLATE})],
                            template_file="report.html.j2", mathjax_url=MATHJAX_URL)
    page = exporter.from_notebook_node(nb)[0]
    if note:
        at = page.index(">", page.index("<body")) + 1
        page = page[:at] + f"<style>{CAVEAT_STYLE}</style>" + banner_html(note) + page[at:]
    return page


def badge(text: str, colour: str = None) -> str:
    """A coloured label (a verdict), or an outlined one (an evidence kind)."""
    if colour is None:
        return f'<span class="kind">{html.escape(text)}</span>'
    return f'<span class="badge" style="background:{colour}">{html.escape(text)}</span>'


def ledger_html(claims, verdict_header: str = "verdict") -> str:
    """The claims ledger as a table, each verdict a coloured badge and each evidence kind a label, with a count of
    the verdicts above it; verdict_header marks the column when the run's verdicts are not findings."""
    counts = {v: sum(c["verdict"] == v for c in claims) for v in VERDICT_COLOURS}
    summary = " ".join(f"{badge(f'{n} {v}', VERDICT_COLOURS[v])}" for v, n in counts.items() if n)

    def cell(c, k):
        if k == "verdict":   # the qualifier and the failed checks counted per arm; each failed seed one click away
            extra = table_cell(c, k)[len(c[k]):].lstrip("; ")
            if c.get("health"):
                extra = (f"<details><summary>{html.escape(extra)}</summary>{html.escape(c['health'])}</details>")
            else:
                extra = html.escape(extra)
            return badge(c[k], VERDICT_COLOURS.get(c[k], "#444")) + (f"<br><small>{extra}</small>" if extra else "")
        if k == "evidence":
            return badge(c[k])
        text = _cell(c, k)
        if k in LONG_COLUMNS and short(text) != text:  # the full paragraph one click away
            return f"<details><summary>{html.escape(short(text))}</summary>{html.escape(text)}</details>"
        return html.escape(text)

    rows = "".join("<tr>" + "".join(f"<td>{cell(c, k)}</td>" for k in LEDGER_COLUMNS) + "</tr>" for c in claims)
    head = "".join(f"<th>{verdict_header if k == 'verdict' else k}</th>" for k in LEDGER_COLUMNS)
    return f"<p>{summary or 'no claims recorded yet'}</p><table><tr>{head}</tr>{rows}</table>"


def figures_html(rec: dict, paths: Paths) -> str:
    """A notebook's figures as thumbnails with their captions, each PNG copied into <report>/figures/."""
    out = []
    for f in rec.get("figures", []):
        png = next((x for x in f["files"] if x.endswith(".png")), None)
        if png is None or not (paths.figures / png).is_file():
            continue
        files.write_bytes(paths.report / "figures" / png, (paths.figures / png).read_bytes())
        src = html.escape(f"figures/{png}")
        out.append(f'<figure><a href="{src}"><img src="{src}" alt="{html.escape(f["name"])}"></a>'
                   f'<figcaption><b>{html.escape(f["name"])}</b>: {html.escape(f["caption"])}</figcaption></figure>')
    return f'<div class="figs">{"".join(out)}</div>' if out else "<p>(no figures)</p>"


def write_html(profile: str, folder: Path = NOTEBOOKS, name: str = None) -> Path:
    """runs/<profile>/report/index.html (runs/<name>/ for a run folder of overrides): each executed notebook (as
    HTML, with MathJax served from the report folder) with its figures as captioned thumbnails, then the ledger."""
    paths = Paths(profile, name)
    paths.report.mkdir(parents=True, exist_ok=True)
    install_mathjax(paths.report)
    recs = {r["notebook"]: r for r in records(profile, folder, name)}
    sections = []
    for stem in list_notebooks(folder):
        nb = paths.executed(stem)
        if not nb.is_file():
            continue
        out = paths.report / f"{stem}.html"
        note = caveat(profile, paths.name)
        text = out.read_text() if out.is_file() else ""
        if (not text or out.stat().st_mtime < nb.stat().st_mtime or MATHJAX_URL not in text
                or bool(note) != ('class="caveat"' in text)):
            files.write_text(out, notebook_html(nb, note))
        rec = recs.get(stem, {})
        took = f" ({rec['wall_time_s']:.0f} s; cached results: {html.escape(source_note(rec))})" if "wall_time_s" in rec else ""
        sections.append(f'<h3 id="{stem}"><a href="{out.name}">{html.escape(stem)}</a>{took}</h3>{figures_html(rec, paths)}')
    claims = ledger([recs[s] for s in list_notebooks(folder) if s in recs])
    plotted = [f for f in forest.plot(claims, paths.report / "figures") if f.endswith(".png")]
    summary = (f'<p><a href="figures/{plotted[0]}"><img src="figures/{plotted[0]}" style="max-width:100%" '
               f'alt="forest plot of every comparative claim"></a></p>' if plotted else "")
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>Replication workbook: {html.escape(profile)}</title>
<style>{STYLE}</style>{MATHJAX_FONTS}<script src="{MATHJAX_URL}"></script></head><body>
<h1>Replication workbook ({html.escape(paths.name)})</h1>{banner_html(caveat(profile, paths.name))}
<p>Each notebook links to its executed HTML; click a figure for the full size. <a href="#ledger">Claims ledger</a>.</p>
{summary}
<h2>Notebooks and figures</h2>{''.join(sections) or '<p>(no executed notebooks yet)</p>'}
<h2 id="ledger">Claims ledger</h2>{ledger_html(claims, verdict_label(profile, paths.name))}
</body></html>
"""
    return files.write_text(paths.report / "index.html", page)
