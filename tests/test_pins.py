"""environment.yml and pyproject.toml pin the same packages at the same versions, and requirements.lock pins the
whole tree they resolve to (made by `make lock`)."""
import re
import tomllib
from importlib import metadata

import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement

from replication.core import config

LOCK = config.ROOT / "requirements.lock"
LOCK_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)(\s*;\s*(.+))?$")
# PyPI's CUDA build of torch brings these; the lock pins the CPU tree (Makefile: CUDA_ONLY).
CUDA_ONLY = re.compile(r"^(nvidia-|cuda-|triton$)")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project_pins() -> set:
    project = tomllib.loads((config.ROOT / "pyproject.toml").read_text())["project"]
    return set(project["dependencies"]) | {p for group in project["optional-dependencies"].values() for p in group}


def locked() -> dict:
    """{name: [(version, marker or None)]} from requirements.lock; every requirement line must be name==version."""
    out = {}
    for line in LOCK.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = LOCK_LINE.match(line.strip())
        assert m, f"requirements.lock: not an exact pin: {line!r}"
        out.setdefault(norm(m.group(1)), []).append((m.group(2), m.group(4)))
    return out


def test_pins_agree():
    pins = project_pins()
    env = yaml.safe_load((config.ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert set(pip) - {"-e ."} == pins
    assert all("==" in p for p in pins), "every dependency is pinned exactly"
    assert "torch==2.13.0" in pins
    assert "python>=3.11,<3.14" in env["dependencies"]
    assert tomllib.loads((config.ROOT / "pyproject.toml").read_text())["project"]["requires-python"] == ">=3.11,<3.14"


def test_lock_holds_every_pin_at_its_version_and_no_cuda_package():
    lock = locked()
    for pin in project_pins():
        name, version = pin.split("==")
        assert [v for v, marker in lock.get(norm(name), [])] == [version], f"requirements.lock disagrees on {pin}"
    assert not [n for n in lock if CUDA_ONLY.match(n)]
    makefile = (config.ROOT / "Makefile").read_text()
    excluded = set(re.findall(r"--no-emit-package (\S+)", LOCK.read_text()))
    assert excluded and all(name in makefile for name in excluded) and all(CUDA_ONLY.match(n) for n in excluded)


def test_lock_covers_the_installed_tree():
    """Walk the requirements from the project's pins through the installed packages' metadata (markers evaluated
    for this interpreter): each one is in the lock, at the installed version where it is installed."""
    lock, env = locked(), default_environment()
    todo, seen, missing = [(Requirement(p), "") for p in project_pins()], set(), []
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({**env, "extra": extra}):
            continue
        name = norm(req.name)
        key = (name, tuple(sorted(req.extras)))
        if CUDA_ONLY.match(name) or key in seen:
            continue
        seen.add(key)
        if name not in lock:
            missing.append(str(req))
            continue
        try:
            installed = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            continue
        if installed.split("+")[0] not in [v for v, _ in lock[name]]:
            continue  # an environment not built from the lock: its metadata says nothing about the lock
        for r in metadata.requires(req.name) or []:
            for e in ("", *req.extras):
                todo.append((Requirement(r), e))
    assert not missing, f"requirements.lock lacks {missing}; run make lock"
    assert len(seen) > 100
