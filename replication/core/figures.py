"""One figure style and one savefig: PNG and PDF, named after the notebook and what they show."""
import re

import matplotlib.pyplot as plt

from . import phases

FORMATS = ("png", "pdf")
_run = None  # the notebook's run record, attached by workbook.start (figures never imports workbook)


def attach(run) -> None:
    """Send savefig's files to this run's figure folder and record them in it."""
    global _run
    _run = run


def use_style() -> None:
    """The workbook's figure style."""
    import seaborn as sns

    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind")
    plt.rcParams.update({"figure.figsize": (6.4, 4.0), "figure.dpi": 100, "savefig.bbox": "tight",
                         "axes.titlesize": "medium", "pdf.fonttype": 42})


@phases.timed("statistics and plotting")
def savefig(name: str, caption: str, fig=None) -> None:
    """Save the current (or given) figure as <figures>/<name>.png/.pdf and record it with its caption. Returns
    nothing, so a notebook cell that ends with it shows no output (the paths are in the run's metrics)."""
    run = _run
    if run is None:
        raise RuntimeError("no run started; call replication.run.workbook.start(notebook, globals()) first")
    if not re.fullmatch(r"\d\d[a-z]?_[a-z0-9_]+", name) or not name.startswith(run.number):
        raise ValueError(f"name={name!r} is not allowed; use '{run.number}<letter>_<what_it_shows>' in lower case")
    fig = fig or plt.gcf()
    run.figures_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in FORMATS:
        path = run.figures_dir / f"{name}.{fmt}"
        tmp = path.with_name(f".{path.name}.tmp.{fmt}")
        fig.savefig(tmp, dpi=150, format=fmt, metadata={"CreationDate": None} if fmt == "pdf" else None)
        tmp.replace(path)
        paths.append(path)
    run.figures = [f for f in run.figures if f["name"] != name]
    run.figures.append({"name": name, "files": [p.name for p in paths], "caption": caption})
