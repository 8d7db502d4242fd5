"""The workbook's one summary figure: a forest plot of every comparative claim of the ledger, in panels by unit.

Each row is one claim that rests on an interval, drawn in the paper's direction (the measured effect minus no effect,
times the paper's sign), so right of 0 is the paper's side for every row: the estimate (a dot; a square for a
simulation or arithmetic row, which shows a mechanism, not the paper's system), its 95% interval (a bar; an infinite
end runs to the frame with an arrow), each training seed's or draw's difference (small open circles) and the paper's
effect where it is comparable (a diamond), coloured by verdict. Rows are grouped in panels by unit (`UNITS`:
accuracy, share or win-rate differences in points; AUC differences; Elo points; slopes and correlations; ratios on
a log axis), each panel with one axis in its real units, so rows in a panel compare by length. The interval printed
at the right is the bar's, in the same direction and units.
"""
import io
import math
import textwrap
from pathlib import Path

from replication.core import files, verdicts
from replication.core.fmt import short_claim

COLOURS = {"reproduced": "#1b7f3b", "partly": "#1f5fa8", "inconclusive": "#a86b00", "not reproduced": "#b3261e",
           "not tested": "#6b6b6b"}
NAME = "forest_plot"
# unit: (panel title, factor from the claim's scale to the panel's)
UNITS = {"points": ("accuracy, share or win-rate difference (percentage points)", 100.0),
         "reward": ("difference in reward spread (reward units)", 1.0),
         "auc": ("AUC difference (AUC minus AUC, or minus 0.5)", 1.0),
         "elo": ("Elo points", 1.0),
         "slope": ("slope or correlation", 1.0),
         "ratio": ("ratio (log scale; 1 = no effect)", 1.0)}


def unit(c: dict) -> str:
    """The panel a claim is drawn in: a ratio (no effect at 1), an Elo difference (an interval past +-2, which no
    bounded quantity reaches), an AUC or a slope or correlation (as its measured text says), a reward spread, or
    else an accuracy, share or win-rate difference."""
    first = (c.get("measured") or "").split(";")[0]
    if (c.get("null") or 0.0) == 1.0:
        return "ratio"
    if max((abs(x) for x in c["interval"] if math.isfinite(x)), default=0.0) > 2:
        return "elo"
    if "AUC" in first:
        return "auc"
    if any(w in first for w in ("slope", "Pearson", "Spearman")):
        return "slope"
    if " std " in f" {first} ":
        return "reward"
    return "points"


def rows(claims) -> list:
    """The ledger's comparative claims (those with an interval; a compound claim's parts, each on its own row) in the
    paper's direction: label, unit, evidence,
    verdict, low, high, estimate (the interval's midpoint where none was recorded), per-seed differences and the
    paper's effect, all in the claim's own scale minus no effect (a ratio keeps its scale, no effect at 1)."""
    out = []
    for c in verdicts.expanded(claims):
        if not c.get("interval"):
            continue
        u = unit(c)
        sign, null = c.get("direction") or 1, c.get("null") or 0.0
        shift = 0.0 if u == "ratio" else null
        if u == "ratio" and sign < 0:   # a ratio in the paper's direction is its inverse
            move = lambda x: 1 / x if x else math.inf  # noqa: E731
        else:
            move = lambda x: (x - shift) * sign  # noqa: E731
        lo, hi = sorted((move(c["interval"][0]), move(c["interval"][1])))
        est = c.get("estimate")
        est = move(est) if est is not None else (lo + hi) / 2
        seeds = [move(x) for x in (c.get("seed_differences") or [])]
        out.append({"label": f"{c.get('notebook', '')[:2]} {short_claim(c['claim'])}", "unit": u,
                    "evidence": c.get("evidence") or "real model", "verdict": c["verdict"], "low": lo, "high": hi,
                    "estimate": est, "seeds": seeds if len(seeds) > 1 else [], "effect": c.get("effect")})
    return out


def _text(x: float, u: str) -> str:
    if not math.isfinite(x):
        return "inf" if x > 0 else "-inf"
    if u == "ratio":
        return f"{x:.3g}"
    return f"{x:+.1f}" if u in ("points", "elo") else f"{x:+.3f}"


def _label(r: dict) -> str:
    kind = "" if r["evidence"] == "real model" else f" ({r['evidence']})"
    lines = textwrap.wrap(r["label"] + kind, 78)
    return "\n".join(lines[:2]) + ("…" if len(lines) > 2 else "")


def _panel(ax, data: list, u: str):
    title, factor = UNITS[u]
    scale = lambda x: x * factor  # noqa: E731
    finite = [scale(x) for r in data for x in (r["low"], r["high"], r["estimate"], *r["seeds"],
                                                 *([abs(r["effect"])] if r["effect"] is not None else []))
              if x is not None and math.isfinite(x) and (u != "ratio" or x > 0)]
    null = 1.0 if u == "ratio" else 0.0
    if u == "ratio":
        ax.set_xscale("log")
        left, right = min(finite + [null]) / 1.6, max(finite + [null]) * 1.6
    else:
        left, right = min(finite + [null]), max(finite + [null])
        pad = 0.06 * (right - left or 1.0)
        left, right = left - pad, right + pad
    at = lambda x: min(max(scale(x), left), right)  # noqa: E731  (an infinite end runs to the frame)
    for y, r in enumerate(reversed(data)):
        colour = COLOURS.get(r["verdict"], "#444")
        mark = "o" if r["evidence"] == "real model" else "s"
        ax.plot([at(r["low"]), at(r["high"])], [y, y], color=colour, lw=2, solid_capstyle="butt")
        for end, arrow in ((r["low"], "<"), (r["high"], ">")):
            if not math.isfinite(end):
                ax.plot(at(end), y, arrow, color=colour, ms=5)
        if math.isfinite(r["estimate"]):
            ax.plot(at(r["estimate"]), y, mark, color=colour, ms=5)
        ax.plot([at(x) for x in r["seeds"]], [y] * len(r["seeds"]), "o", mfc="none", mec=colour, ms=4, mew=0.8)
        if r["effect"] is not None:
            ax.plot(at(abs(r["effect"])), y, "D", color="black", ms=4)
        text = f"{_text(scale(r['estimate']), u)} [{_text(scale(r['low']), u)}, {_text(scale(r['high']), u)}]"
        ax.annotate(text, (1.01, y), xycoords=("axes fraction", "data"), va="center", fontsize=6.5, color=colour)
    ax.axvline(null, color="grey", lw=0.8)
    ax.set_xlim(left, right)
    ax.set_yticks(range(len(data)), [_label(r) for r in reversed(data)], fontsize=6.5)
    ax.set_ylim(-0.7, len(data) - 0.3)
    ax.set_title(title, fontsize=8.5, loc="left")
    ax.tick_params(axis="x", labelsize=7)


def plot(claims, out_dir: Path) -> list:
    """Write the forest plot (PNG and PDF) of `claims` (report.ledger rows) into out_dir; return the files written
    ([] when no claim has an interval)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = rows(claims)
    if not data:
        return []
    panels = [(u, [r for r in data if r["unit"] == u]) for u in UNITS]
    panels = [(u, rs) for u, rs in panels if rs]
    heights = [len(rs) + 1.6 for _, rs in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 0.3 * sum(heights) + 1.2), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (u, rs) in zip(axes[:, 0], panels):
        _panel(ax, rs, u)
    handles = [plt.Line2D([], [], color=c, lw=2, label=v) for v, c in COLOURS.items()
               if any(r["verdict"] == v for r in data)]
    handles += [plt.Line2D([], [], ls="", marker="s", color="black", label="simulation or arithmetic"),
                plt.Line2D([], [], ls="", marker="o", mfc="none", mec="black", label="one seed or draw"),
                plt.Line2D([], [], ls="", marker="D", color="black", label="paper's effect")]
    fig.suptitle(f"Every comparative claim ({len(data)}): estimate and 95% interval in the paper's direction "
                 "(right of the grey line is the paper's side)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / (0.3 * sum(heights) + 1.2)))
    # below the figure's lower edge (the tight bounding box of savefig takes it in)
    fig.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(handles),
               frameon=False)
    written = []
    for ext in ("png", "pdf"):  # written atomically, without timestamps (the same ledger gives the same bytes)
        buf = io.BytesIO()
        fig.savefig(buf, format=ext, dpi=150, bbox_inches="tight", metadata={"Software": None} if ext == "png" else
                    {"Creator": None, "Producer": None, "CreationDate": None})
        written.append(files.write_bytes(Path(out_dir) / f"{NAME}.{ext}", buf.getvalue()).name)
    plt.close(fig)
    return written
