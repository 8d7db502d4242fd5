"""The workbook's one summary figure: a forest plot of every comparative claim of the ledger.

Each row is one claim that rests on an interval, drawn in the paper's direction (the measured effect minus no effect,
times the paper's sign), so right of 0 is the paper's side for every row: the estimate (a dot), its 95% interval (a
bar; an infinite end runs to the frame with an arrow), each training seed's difference (small open circles) and the
paper's effect where it is comparable (a diamond), coloured by verdict. The rows' metrics differ (accuracy
differences, AUC differences, Elo points, ratios), so each row is drawn scaled by its own largest finite magnitude
(the interval, the seeds, the paper's effect) and its interval is written beside it in its own units: read a row
against its own no-effect line and paper's effect, not the lengths of two rows.
"""
import io
import math
import re
from pathlib import Path

from replication.core import files

COLOURS = {"reproduced": "#1b7f3b", "partly": "#1f5fa8", "inconclusive": "#a86b00", "not reproduced": "#b3261e",
           "not tested": "#6b6b6b"}
NAME = "forest_plot"


def short_claim(claim: str) -> str:
    """A claim without its bracketed task-and-judge qualifiers ("... [2d sums; judge: ...]"), which the ledger keeps:
    the row label keeps the claim itself within its width."""
    return re.sub(r"\s*\[[^\]]*\]", "", claim).strip()


def rows(claims) -> list:
    """The ledger's comparative claims (those with an interval) in the paper's direction: label, verdict, low, high,
    estimate (the interval's midpoint where none was recorded), per-seed differences and the paper's effect."""
    out = []
    for c in claims:
        if not c.get("interval"):
            continue
        sign, null = c.get("direction") or 1, c.get("null") or 0.0
        lo, hi = sorted(((c["interval"][0] - null) * sign, (c["interval"][1] - null) * sign))
        est = c.get("estimate")
        est = (est - null) * sign if est is not None else (lo + hi) / 2
        seeds = [(x - null) * sign for x in (c.get("seed_differences") or [])]
        label = f"{c.get('notebook', '')[:2]} {short_claim(c['claim'])}"
        out.append({"label": label if len(label) <= 70 else label[:69] + "…", "verdict": c["verdict"],
                    "low": lo, "high": hi, "estimate": est, "interval": list(c["interval"]), "seeds": seeds if len(seeds) > 1 else [],
                    "effect": c.get("effect")})
    return out


def plot(claims, out_dir: Path) -> list:
    """Write the forest plot (PNG and PDF) of `claims` (report.ledger rows) into out_dir; return the files written
    ([] when no claim has an interval)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = rows(claims)
    if not data:
        return []
    fig, ax = plt.subplots(figsize=(10.5, 0.28 * len(data) + 1.4))
    for y, r in enumerate(reversed(data)):
        colour = COLOURS.get(r["verdict"], "#444")
        finite = [abs(x) for x in (r["low"], r["high"], r["estimate"], *r["seeds"], r["effect"] or 0.0)
                  if x is not None and math.isfinite(x)]
        scale = max(finite, default=0.0) or 1.0
        at = lambda x: max(-1.05, min(1.05, x / scale))  # noqa: E731  (an infinite end runs to the frame)
        ax.plot([at(r["low"]), at(r["high"])], [y, y], color=colour, lw=2, solid_capstyle="butt")
        for end, mark in ((r["low"], "<"), (r["high"], ">")):
            if not math.isfinite(end):
                ax.plot(at(end), y, mark, color=colour, ms=5)
        if math.isfinite(r["estimate"]):
            ax.plot(at(r["estimate"]), y, "o", color=colour, ms=5)
        ax.plot([at(x) for x in r["seeds"]], [y] * len(r["seeds"]), "o", mfc="none", mec=colour, ms=4, mew=0.8)
        if r["effect"] is not None:
            ax.plot(at(abs(r["effect"])), y, "D", color="black", ms=4)
        ax.text(1.1, y, "[" + ", ".join(f"{x:+.3g}" for x in r["interval"]) + "]", va="center", fontsize=6.5, color=colour)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_xlim(-1.1, 1.45)
    ax.set_xticks([-1, -0.5, 0, 0.5, 1])
    ax.set_yticks(range(len(data)), [r["label"] for r in reversed(data)], fontsize=7)
    ax.set_ylim(-0.7, len(data) - 0.3)
    ax.set_xlabel("measured effect in the paper's direction, each row scaled to its largest magnitude "
                  "(0 = no effect; right: the interval in the row's own units)", fontsize=8)
    handles = [plt.Line2D([], [], color=c, lw=2, label=v) for v, c in COLOURS.items()
               if any(r["verdict"] == v for r in data)]
    handles += [plt.Line2D([], [], ls="", marker="o", mfc="none", mec="black", label="one training seed"),
                plt.Line2D([], [], ls="", marker="D", color="black", label="paper's effect")]
    ax.set_title(f"Every comparative claim of the workbook ({len(data)}): estimate, 95% interval, seeds", fontsize=10)
    fig.tight_layout()
    # below the figure's lower edge, under the axis label whatever the number of rows (the tight bounding box of
    # savefig takes it in)
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
