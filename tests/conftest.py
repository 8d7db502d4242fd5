"""Shared fixtures: a tiny random model, an isolated runs folder, and one smoke run of every notebook."""
import pytest

from replication.run import runner
from replication.lm import models


@pytest.fixture(scope="session")
def tiny():
    """(model, tokenizer) of a tiny random Llama with a byte-level tokenizer."""
    return models.tiny_model(seed=0)


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """Point runs/ (and the default profile's figures/) at a temporary folder."""
    monkeypatch.setenv("REPLICATION_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("REPLICATION_FIGURES", str(tmp_path / "figures"))
    return tmp_path / "runs"


def _run_all(base, profile: str = "smoke", env: dict = None):
    """Every notebook of the workbook, forced, into base/runs (and base/figures), with extra environment
    variables for the kernels: (runs folder, outcome)."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {"REPLICATION_RUNS": base / "runs", "REPLICATION_FIGURES": base / "figures",
                            **(env or {})}.items():
            mp.setenv(name, str(value))
        outcome = runner.run(profile, force=True)
    return base / "runs", outcome


@pytest.fixture(scope="session")
def run_all():
    """_run_all(base, profile="smoke", env=None) -> (runs folder, outcome)."""
    return _run_all


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """One smoke-profile run of every notebook (about 7 minutes), shared by the tests that need one:
    test_notebooks checks its outputs, test_determinism compares a second run with it."""
    return _run_all(tmp_path_factory.mktemp("smoke-first"))


@pytest.fixture(autouse=True)
def no_results_store(monkeypatch):
    """No test reads the committed results store unless it points REPLICATION_STORE at one itself."""
    monkeypatch.setenv("REPLICATION_STORE", "off")
