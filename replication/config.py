"""Paths, profiles, seeding and parameter checks shared by every notebook."""
import os
import random
from pathlib import Path

import numpy as np

PROFILES = ("smoke", "default", "paper")
ROOT = Path(__file__).resolve().parents[1]


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


def set_seed(seed: int) -> None:
    """Seed python, numpy and torch in one place."""
    import torch

    check_int("seed", seed, minimum=0)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


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
