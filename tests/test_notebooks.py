"""Committed notebooks are clean, parameterised for every profile, and run end to end (smoke)."""
import dataclasses
import json

import nbformat
import pytest

from replication.run import runner, settings  # noqa: F401  (settings registers the classes)
from replication.core import config, params, verdicts

STEMS = runner.list_notebooks()


def test_there_are_notebooks():
    assert STEMS and STEMS[0] == "00_setup_and_baselines"


@pytest.mark.parametrize("stem", STEMS)
def test_notebook_is_clean_and_parameterised(stem):
    nb = nbformat.read(runner.NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "committed with outputs"
    assert all("id" in c for c in nb.cells), "every cell has an id (nbformat 4.5; later nbformat versions require it)"
    long = [line for c in code for line in c.source.splitlines() if len(line) > 100]
    assert not long, f"code lines of at most 100 characters: {len(long)} longer, e.g. {long[0][:60]!r}"
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters'"
    cell = {}
    exec(tagged[0].source, {}, cell)  # plain values only
    assert {"profile", "seed"} <= set(cell)
    after = code[code.index(tagged[0]) + 1].source
    assert after.lstrip().startswith(f'run = workbook.start("{stem}", globals())'), \
        "the cell after the parameters builds the typed parameters and starts the run"
    fields = {f.name for f in dataclasses.fields(params.REGISTRY[stem])}
    assert set(cell) == fields, f"parameters cell and {params.REGISTRY[stem].__name__} differ: {set(cell) ^ fields}"
    params.build(stem, cell)  # the cell's defaults are valid
    table = json.loads((runner.NOTEBOOKS / "params" / f"{stem}.json").read_text())
    assert set(table) == set(config.PROFILES)
    assert table["default"] == {}, "the parameters cell is the single source of the default values"
    for profile, values in table.items():
        assert set(values) <= fields, f"{profile} sets parameters the notebook does not have"
        same = [k for k, v in values.items() if v == cell[k] and k != "profile"]
        assert not same, f"{profile} repeats the cell's defaults for {same}; keep only what the profile changes"
        params.build(stem, {**cell, **values, "profile": profile})
    assert "run.finish()" in "".join(c.source for c in code)


@pytest.mark.parametrize("stem", STEMS)
def test_the_last_code_cell_writes_the_metrics_and_shows_the_verdicts(stem):
    """A notebook ends on its verdict table (00, which has no claims, on its baseline table), after run.finish()."""
    nb = nbformat.read(runner.NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    lines = code[-1].rstrip().splitlines()
    assert sum("run.finish()" in s for s in code) == 1 and "run.finish()" in lines[-2]
    claims = any("run.claim(" in s for s in code)
    assert (lines[-1] == "run.claims_table()") == claims, lines[-1]


@pytest.mark.parametrize("stem", STEMS)
def test_papermill_reads_every_parameter_line(stem, caplog):
    """papermill parses the parameters cell line by line (to list and inject parameters); a line it cannot read
    (e.g. an '=' inside a comment) prints 'Unable to parse line N' on every run."""
    from papermill.translators import PythonTranslator

    nb = nbformat.read(runner.NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    with caplog.at_level("WARNING", logger="papermill"):
        found = {p.name for p in PythonTranslator.inspect(cell)}
    assert not [r.getMessage() for r in caplog.records if "Unable to parse" in r.getMessage()]
    assert found == {f.name for f in dataclasses.fields(params.REGISTRY[stem])}


@pytest.mark.slow
def test_every_notebook_runs_in_the_smoke_profile(smoke_run):
    runs, out = smoke_run  # the session's one smoke run (conftest), also the first run of tests/test_determinism.py
    assert out == {stem: "executed" for stem in STEMS}
    for stem in STEMS:
        metrics = json.loads((runs / "smoke/metrics" / f"{stem}.json").read_text())
        assert metrics["profile"] == "smoke" and metrics["figures"]
        for f in metrics["figures"]:
            assert all((runs / "smoke/figures" / name).is_file() for name in f["files"])
        for c in metrics["claims"]:
            assert c["verdict"] in verdicts.VERDICTS and c["evidence"] in verdicts.EVIDENCE, c
            assert {"interval", "n"} <= set(c), c
            if c["interval"] is not None:   # the forest plot draws the estimate; a midpoint of [6.2, inf] is none
                assert c["estimate"] is not None, c["claim"]
    assert (runs / "smoke/report/index.html").is_file()


@pytest.mark.parametrize("stem", STEMS)
def test_profile_set_by_hand_loads_the_profile_values(stem):
    """Run by hand with `profile` set (papermill -p profile smoke, or the cell edited in JupyterLab), a notebook
    gets the profile's values of notebooks/params/<stem>.json for every parameter left at the cell's value."""
    cell = params.cell_values(runner.NOTEBOOKS / f"{stem}.ipynb")
    for profile in config.PROFILES:
        table = params.profile_values(stem, profile, runner.NOTEBOOKS)
        assert params.profile_changes(stem, {**cell, "profile": profile}, runner.NOTEBOOKS) == table
        if table:
            name = next(iter(table))
            kept = params.profile_changes(stem, {**cell, "profile": profile, "In": [f"# Parameters\n{name} = 1\n"]},
                                          runner.NOTEBOOKS)
            assert kept == {k: v for k, v in table.items() if k != name}
