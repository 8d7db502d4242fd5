"""Committed notebooks are clean, parameterised for every profile, and run end to end (smoke)."""
import ast
import json

import nbformat
import pytest

from replication import config, runner

STEMS = runner.list_notebooks()


def test_there_are_notebooks():
    assert STEMS and STEMS[0] == "00_setup_and_baselines"


@pytest.mark.parametrize("stem", STEMS)
def test_notebook_is_clean_and_parameterised(stem):
    nb = nbformat.read(runner.NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "committed with outputs"
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters'"
    names = {t.id for node in ast.parse(tagged[0].source).body for t in node.targets}
    assert {"profile", "seed"} <= names
    after = code[code.index(tagged[0]) + 1].source
    assert f'workbook.start("{stem}"' in after, "the cell after the parameters starts the run"
    table = json.loads((runner.NOTEBOOKS / "params" / f"{stem}.json").read_text())
    assert set(table) == set(config.PROFILES)
    for profile, values in table.items():
        assert set(values) <= names, f"{profile} sets parameters the notebook does not have"
    assert "run.finish()" in "".join(c.source for c in code)


@pytest.mark.slow
def test_every_notebook_runs_in_the_smoke_profile(runs):
    out = runner.run("smoke", force=True)
    assert set(out) == set(STEMS)
    for stem in STEMS:
        metrics = json.loads((runs / "smoke/metrics" / f"{stem}.json").read_text())
        assert metrics["profile"] == "smoke" and metrics["figures"]
        for f in metrics["figures"]:
            assert all((runs / "smoke/figures" / name).is_file() for name in f["files"])
        assert all(c["verdict"] in ("reproduced", "partly", "not reproduced", "not tested") for c in metrics["claims"])
    assert (runs / "smoke/report/index.html").is_file()
