"""environment.yml and pyproject.toml pin the same packages at the same versions."""
import tomllib

import yaml

from replication import config


def test_pins_agree():
    project = tomllib.loads((config.ROOT / "pyproject.toml").read_text())["project"]
    pins = set(project["dependencies"]) | {p for group in project["optional-dependencies"].values() for p in group}
    env = yaml.safe_load((config.ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert set(pip) - {"-e ."} == pins
    assert all("==" in p for p in pins), "every dependency is pinned exactly"
    assert "torch==2.13.0" in pins
