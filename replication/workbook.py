"""The notebook's run record: seed, figures and claims, written to runs/<profile>/metrics/<stem>.json."""
import platform
import time
from pathlib import Path

from . import __version__, config, files

VERDICTS = ("reproduced", "partly", "not reproduced", "not tested")
_current = None


class Run:
    """What one notebook execution produced; `finish()` writes it atomically."""

    def __init__(self, notebook: str, profile: str, seed: int):
        config.check_choice("profile", profile, config.PROFILES)
        config.check_int("seed", seed, minimum=0)
        if not (len(notebook) > 3 and notebook[:2].isdigit() and notebook[2] == "_"):
            raise ValueError(f"notebook={notebook!r} is not allowed; use the notebook's stem, e.g. '00_setup_and_baselines'")
        self.notebook, self.profile, self.seed = notebook, profile, seed
        self.figures, self.claims, self.metrics = [], [], {}
        self.t0 = time.perf_counter()

    @property
    def number(self) -> str:
        return self.notebook[:2]

    @property
    def folder(self) -> Path:
        """runs/<profile>/"""
        return config.runs_dir() / self.profile

    @property
    def cache(self) -> Path:
        """Per-notebook cache for expensive steps, keyed further by their config."""
        return self.folder / "cache" / self.notebook

    @property
    def figures_dir(self) -> Path:
        return config.figures_dir(self.profile)

    @property
    def metrics_path(self) -> Path:
        return self.folder / "metrics" / f"{self.notebook}.json"

    def log(self, **metrics) -> None:
        """Record named results (plain numbers, strings, lists or dicts) in the metrics file."""
        self.metrics.update(metrics)

    def claim(self, claim: str, paper: str, measured: str, verdict: str, why: str) -> dict:
        """Add one row to the claims ledger: the paper's number beside ours, and a verdict."""
        config.check_choice("verdict", verdict, VERDICTS)
        row = {"claim": claim, "paper": str(paper), "measured": str(measured), "verdict": verdict, "why": why}
        self.claims = [c for c in self.claims if c["claim"] != claim] + [row]
        return row

    def claims_table(self):
        """The ledger as a DataFrame, for the notebook's closing table."""
        import pandas as pd

        return pd.DataFrame(self.claims, columns=["claim", "paper", "measured", "verdict", "why"])

    def finish(self) -> Path:
        """Write runs/<profile>/metrics/<notebook>.json atomically and return its path."""
        record = {
            "notebook": self.notebook, "profile": self.profile, "seed": self.seed,
            "wall_time_s": round(time.perf_counter() - self.t0, 2), "package_version": __version__,
            "python": platform.python_version(), "figures": self.figures, "claims": self.claims,
            "metrics": self.metrics,
        }
        return files.write_json(self.metrics_path, record)


def start(notebook: str, profile: str = "default", seed: int = 0) -> Run:
    """Begin a notebook's run: validate, seed everything, set the figure style."""
    global _current
    from . import figures

    run = Run(notebook, profile, seed)
    config.set_seed(seed)
    figures.use_style()
    _current = run
    return run


def current() -> Run:
    """The run started by this kernel's notebook."""
    if _current is None:
        raise RuntimeError("no run started; call replication.workbook.start(notebook, profile, seed) first")
    return _current
