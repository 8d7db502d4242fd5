"""Shared fixtures: a tiny random model and an isolated runs folder."""
import pytest

from replication import models


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
