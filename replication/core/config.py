"""Paths, profiles, seeding and parameter checks shared by every notebook."""
import contextlib
import os
import random
from pathlib import Path

import numpy as np

from . import files

PROFILES = ("smoke", "default", "gpu", "paper")
LR_RANGE = (0.0, 0.1)   # what a learning rate may be, wherever one is checked (params.lr_rule, GRPOConfig)
ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"


def runs_dir() -> Path:
    """Folder for executed notebooks, metrics and reports (override: REPLICATION_RUNS)."""
    return Path(os.environ.get("REPLICATION_RUNS", ROOT / "runs"))


def cache_dir() -> Path:
    """Folder for converted model checkpoints (override: REPLICATION_CACHE)."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "replication"
    return Path(os.environ.get("REPLICATION_CACHE", default))


def figures_dir(profile: str) -> Path:
    """Where the runner puts a profile's figures: the committed figures/ for the default profile (override:
    REPLICATION_FIGURES), runs/<profile>/figures/ for the others."""
    check_choice("profile", profile, PROFILES)
    if profile == "default":
        return Path(os.environ.get("REPLICATION_FIGURES", ROOT / "figures"))
    return runs_dir() / profile / "figures"


def notebooks_dir() -> Path:
    """The notebooks whose parameters cells and profile files a run by hand reads (override: REPLICATION_NOTEBOOKS)."""
    return Path(os.environ.get("REPLICATION_NOTEBOOKS", NOTEBOOKS))


def list_notebooks(folder: Path = NOTEBOOKS) -> list:
    """Stems of the workbook's notebooks (NN_name.ipynb), in order."""
    return sorted(p.stem for p in Path(folder).glob("[0-9][0-9]_*.ipynb"))


# Each training notebook's experiment at the paper's scale: the `train` command's method and its paper config
# (replication.scale); the paper profile names these where it cannot run (no GPU).
PAPER_SCALE = {"02_elo_dynamics": ("elo-evolve", "configs/paper/elo_evolve.yaml"),
               "03_rlpr_debiasing": ("rlpr", "configs/paper/rlpr.yaml"),
               "05_malt_trajectory_trees": ("malt", "configs/paper/malt.yaml"),
               "06_multi_agent_evolve": ("mae", "configs/paper/mae.yaml")}


# The runner names its run folder (under runs/) in this variable for the kernels it starts; a kernel without it
# is a run by hand (papermill by hand, JupyterLab) and writes under runs/<profile>-scratch/ only.
RUNNER_ENV = "REPLICATION_RUN_FOLDER"


class Paths:
    """Where the outputs of one run folder go: runs/<name>/, where name is the profile for the runner's runs,
    <profile>-set-<hash> for its runs with one-off overrides and <profile>-scratch for runs by hand.
    Figures go to figures_dir(profile) for the profile's own folder, to runs/<name>/figures/ otherwise."""

    def __init__(self, profile: str, name: str = None):
        check_choice("profile", profile, PROFILES)
        self.profile, self.name = profile, name or profile
        self.root = runs_dir() / self.name
        self.notebooks = self.root / "notebooks"
        self.state = self.root / "state"
        self.metrics = self.root / "metrics"
        self.report = self.root / "report"
        self.cache = self.root / "cache"
        self.figures = figures_dir(profile) if self.name == profile else self.root / "figures"

    def executed(self, stem):
        return self.notebooks / f"{stem}.ipynb"

    def staging(self, stem) -> Path:
        """Where the runner's kernel writes a notebook's metrics and figures; promoted when the notebook succeeds."""
        return self.root / "staging" / stem

    def outputs(self, stem, figure_files) -> dict:
        """sha256 of the notebook's metrics file and of each named figure file (None where missing)."""
        def sha(path):
            return files.sha256(path) if path.is_file() else None

        return {"metrics": sha(self.metrics / f"{stem}.json"),
                "figures": {name: sha(self.figures / name) for name in sorted(figure_files)}}

    def recorded(self, stem) -> dict:
        """The runner's record of the notebook's last execution here ({} if none)."""
        state = self.state / f"{stem}.json"
        return files.read_json(state) if state.is_file() else {}

    def is_current(self, stem, key) -> bool:
        """The recorded execution has this stamp, and its executed notebook, metrics and figures are still
        there, unchanged since the runner wrote them."""
        record = self.recorded(stem)
        outputs = record.get("outputs")
        return (record.get("stamp") == key and outputs is not None and self.executed(stem).is_file()
                and self.outputs(stem, outputs["figures"]) == outputs)


def kernel_paths(profile: str) -> Paths:
    """The run folder of this kernel's notebook: the runner's (named in REPLICATION_RUN_FOLDER) or, for a run by
    hand, runs/<profile>-scratch/."""
    return Paths(profile, os.environ.get(RUNNER_ENV) or f"{profile}-scratch")


THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")   # read by torch, OpenMP and MKL when a process starts


@contextlib.contextmanager
def environ(changes: dict):
    """os.environ with `changes` applied inside the block, each variable restored (or removed) after it."""
    before = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def by_runner() -> bool:
    """Whether this process is a kernel started by the runner."""
    return bool(os.environ.get(RUNNER_ENV))


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


BF16_FLAGS = ("amx_bf16", "avx512_bf16", "avx_vnni")


def cpu_bf16(cpuinfo: str = None) -> str:
    """The CPU's bf16 instruction sets (from /proc/cpuinfo's flags: amx_bf16, avx512_bf16, avx_vnni), e.g.
    'amx_bf16 avx512_bf16', or 'none'; 'unknown' where the flags cannot be read. bf16 matmuls round differently on
    each (an AMX machine and an AVX-512 BF16 machine sample different replies from the same seed)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return "unknown"
    line = next((x for x in cpuinfo.splitlines() if x.startswith("flags")), None)
    if line is None:
        return "unknown"
    flags = set(line.split(":", 1)[-1].split())
    return " ".join(f for f in BF16_FLAGS if f in flags) or "none"
