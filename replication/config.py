"""Paths, profiles, seeding and parameter checks shared by every notebook."""
import json
import os
import random
from pathlib import Path

import numpy as np

PROFILES = ("smoke", "default", "paper")
ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def runs_dir() -> Path:
    """Folder for executed notebooks, metrics and reports (override: REPLICATION_RUNS)."""
    return Path(os.environ.get("REPLICATION_RUNS", ROOT / "runs"))


def cache_dir() -> Path:
    """Folder for converted model checkpoints (override: REPLICATION_CACHE)."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "replication"
    return Path(os.environ.get("REPLICATION_CACHE", default))


def figures_dir(profile: str) -> Path:
    """The default profile writes the committed figures/ (override: REPLICATION_FIGURES); others under runs/."""
    check_choice("profile", profile, PROFILES)
    if profile == "default":
        return Path(os.environ.get("REPLICATION_FIGURES", ROOT / "figures"))
    return runs_dir() / profile / "figures"


def list_notebooks(folder: Path = NOTEBOOKS) -> list:
    """Stems of the workbook's notebooks (NN_name.ipynb), in order."""
    return sorted(p.stem for p in Path(folder).glob("[0-9][0-9]_*.ipynb"))


class Paths:
    """Where one profile's outputs go."""

    def __init__(self, profile: str):
        self.root = runs_dir() / profile
        self.notebooks = self.root / "notebooks"
        self.state = self.root / "state"
        self.metrics = self.root / "metrics"
        self.report = self.root / "report"

    def executed(self, stem):
        return self.notebooks / f"{stem}.ipynb"

    def is_current(self, stem, key) -> bool:
        state = self.state / f"{stem}.json"
        return (state.is_file() and json.loads(state.read_text()).get("stamp") == key
                and self.executed(stem).is_file() and (self.metrics / f"{stem}.json").is_file())


def set_seed(seed: int) -> None:
    """Seed python, numpy and torch in one place."""
    import torch

    check_int("seed", seed, minimum=0)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def derive_seed(seed: int, *parts) -> int:
    """The one way to derive a seed for a sub-task (a step, an arm, an attempt) from the notebook's seed:
    a hash of (seed, *parts), so different parts give unrelated streams and the same parts the same one."""
    import hashlib
    import json

    check_int("seed", seed, minimum=0)
    blob = json.dumps([int(seed), *[str(p) if not isinstance(p, (int, float)) else p for p in parts]]).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "big") >> 1


def check_choice(name: str, value, allowed) -> None:
    """Raise a ValueError naming the parameter unless value is one of allowed."""
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed; choose one of {', '.join(map(repr, allowed))}")


def check_int(name: str, value, minimum: int = 1) -> None:
    """Raise a ValueError naming the parameter unless value is an integer >= minimum."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name}={value!r} is not allowed; it must be an integer >= {minimum}")


def check_range(name: str, value, low: float, high: float) -> None:
    """Raise a ValueError naming the parameter unless low <= value <= high."""
    if not isinstance(value, (int, float, np.floating)) or not (low <= value <= high):
        raise ValueError(f"{name}={value!r} is not allowed; it must be a number in [{low}, {high}]")
