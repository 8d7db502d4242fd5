"""What a newcomer meets first: --set and model values checked before any kernel starts (and nothing left behind),
the `train` command's one-line errors, the paper profile's refusal on a CPU, and smoke results that say what they are."""
import json
import re
import sys
from pathlib import Path

import pytest

from replication.ledger import report

from replication.run import runner
from replication.core import config, offline

ROOT = Path(__file__).resolve().parents[1]


# ---- models resolved before the first kernel starts ------------------------------------------------------

def test_model_problems_name_what_is_wrong(tmp_path):
    assert offline.model_problem("smollm2-135m-instruct", "default") is None       # installed by make / install-model
    assert "neither a known name" in offline.model_problem("no-such-model", "smoke")
    assert "no config.json" in offline.model_problem(str(tmp_path), "default")
    (tmp_path / "config.json").write_text("{}")
    assert offline.model_problem(str(tmp_path), "default") is None
    hub = "nobody-here/not-a-model-at-all"
    assert "downloads nothing" in offline.model_problem(hub, "default")
    assert offline.model_problem(hub, "paper") is None                               # the profile that may download
    assert offline.model_parameters({"model": "a", "judge_model": None, "critic_model": "b", "n": 3}) == {
        "model": "a", "critic_model": "b"}


@pytest.mark.parametrize("value, message", [("no-such-model", "neither a known name"),
                                            ("someone/unknown-model", "downloads nothing")])
def test_a_bad_model_fails_before_anything_runs_and_leaves_no_folder(runs, value, message):
    with pytest.raises(runner.RunError, match=rf"model='{re.escape(value)}' is not allowed for 01_noise_analysis: .*{message}"):
        runner.run("smoke", only="01", overrides={"model": value}, log=lambda *_: None)
    assert not runs.exists() or not any(runs.iterdir())


def test_a_paper_profile_model_is_checked_too(runs, monkeypatch):
    """The paper profile's values name hub ids; where it may run (a GPU) they may be fetched, so they pass."""
    monkeypatch.setattr(runner, "gpu_available", lambda: True)
    assert runner.parameters("02_elo_dynamics", "paper")["judge_model"] == "Qwen/Qwen3-14B"


# ---- --set applies where the parameter exists ------------------------------------------------------------

def test_a_set_name_applies_where_it_exists_and_says_where_not():
    lines = runner.override_scope(["00_setup_and_baselines", "03_rlpr_debiasing"], config.NOTEBOOKS, {"steps": 3})
    assert lines == ["--set steps: applied to 03_rlpr_debiasing; not to 00_setup_and_baselines, which have no "
                     "parameter 'steps'"]
    with pytest.raises(runner.RunError, match="no selected notebook has a parameter 'stepz'"):
        runner.override_scope(["00_setup_and_baselines", "03_rlpr_debiasing"], config.NOTEBOOKS, {"stepz": 3})
    assert "steps" not in runner.parameters("00_setup_and_baselines", "smoke", overrides={"steps": 3})
    assert runner.parameters("03_rlpr_debiasing", "smoke", overrides={"steps": 3})["steps"] == 3


def test_the_paper_profile_refuses_on_a_cpu_naming_the_train_command(runs, monkeypatch):
    monkeypatch.setattr(runner, "gpu_available", lambda: False)
    with pytest.raises(runner.RunError) as e:
        runner.run("paper", only="02,03", log=lambda *_: None)
    text = str(e.value)
    assert "needs a GPU" in text and "\n" not in text
    assert "python -m replication train elo-evolve --config configs/paper/elo_evolve.yaml" in text
    assert "python -m replication train rlpr --config configs/paper/rlpr.yaml" in text
    assert not runs.exists() or not any(runs.iterdir())


# ---- the train command: one line, exit 1, nothing created ------------------------------------------------

def tiny_config(tmp_path, text_after=""):
    out = tmp_path / "out"
    cfg = (ROOT / "configs/tiny/elo_evolve.yaml").read_text().replace("runs/scale/tiny-elo-evolve", str(out))
    (tmp_path / "tiny.yaml").write_text(cfg + text_after)
    return tmp_path / "tiny.yaml", out


@pytest.mark.parametrize("sets, message", [(["trl.learning_rate=abc"], "trl.learning_rate='abc' is not allowed; it must be a number"),
                                           (["trl.max_steps=2.5"], "trl.max_steps=2.5 is not allowed; it must be an integer"),
                                           (["trl.learning_rate=[1e-3"], r"--set trl.learning_rate=\[1e-3 is not valid YAML")])
def test_train_names_a_bad_value_in_one_line_and_creates_nothing(tmp_path, capsys, sets, message):
    pytest.importorskip("trl")
    from replication.scale import train

    path, out = tiny_config(tmp_path)
    assert train.main(["elo-evolve", "--config", str(path), *[x for s in sets for x in ("--set", s)]]) == 1
    err = capsys.readouterr().err
    assert re.search(message, err) and err.count("\n") == 1 and not out.exists(), err


def test_train_names_the_line_of_malformed_yaml(tmp_path, capsys):
    pytest.importorskip("trl")
    from replication.scale import train

    (tmp_path / "bad.yaml").write_text("model: tiny\ntrl: {max_steps: 2\n  learning_rate: [1e-3\n")
    assert train.main(["elo-evolve", "--config", str(tmp_path / "bad.yaml")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: config {tmp_path / 'bad.yaml'} is not valid YAML at line 3, column") and err.count("\n") == 1


def test_the_known_harmless_warnings_are_listed_once():
    import warnings

    from replication.core import console

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        console.quiet_warnings()
        for message in console.HARMLESS_WARNINGS:
            warnings.warn(message + " and will be removed in v6.", FutureWarning)
        warnings.warn("something else", FutureWarning)
    assert [str(w.message) for w in caught] == ["something else"]


# ---- smoke results say what they are ---------------------------------------------------------------------

def test_smoke_and_override_reports_carry_the_caveat(runs, tmp_path):
    from nbformat.v4 import new_markdown_cell, new_notebook

    assert report.caveat("default") is None and report.caveat("paper") is None
    assert "test the code, not the papers" in report.caveat("smoke")
    assert "One-off overrides" in report.caveat("default", "default-set-1234abcd")
    metrics = {"notebook": "01_noise_analysis", "seed": 0, "wall_time_s": 1.0, "figures": [],
               "claims": [{"claim": "c", "paper": "p", "measured": "m", "verdict": "reproduced", "evidence": "arithmetic",
                           "interval": None, "n": None, "why": "w"}]}
    for profile, marked in (("smoke", True), ("default", False)):
        paths = config.Paths(profile)
        paths.metrics.mkdir(parents=True)
        (paths.metrics / "01_noise_analysis.json").write_text(json.dumps(metrics))
        paths.notebooks.mkdir(parents=True)
        nb = new_notebook(cells=[new_markdown_cell("# 01")])
        (paths.notebooks / "01_noise_analysis.ipynb").write_text(json.dumps(nb))
        index = report.write_index(profile).read_text()
        page = report.write_html(profile).read_text()
        notebook_page = (paths.report / "01_noise_analysis.html").read_text()
        assert ("test the code, not the papers" in index) == marked
        assert ("| verdict (smoke: tests the code) |" in index) == marked
        assert ('class="caveat"' in page and "<th>verdict (smoke: tests the code)</th>" in page) == marked
        assert ('<p class="caveat">' in notebook_page) == marked


@pytest.mark.slow
def test_executed_cells_that_save_figures_print_no_paths(smoke_run):
    """The smoke run's executed notebooks: no output echoes a staging path (savefig returns nothing)."""
    runs_folder, _ = smoke_run
    for nb in sorted((runs_folder / "smoke" / "notebooks").glob("*.ipynb")):
        text = nb.read_text()
        assert "PosixPath(" not in text and "/staging/" not in text, nb.name


def test_readme_first_screen_holds_the_quick_start():
    head = "\n".join((ROOT / "README.md").read_text().splitlines()[:40])
    for needed in ("make smoke", "--only 00", "make figures", "make test", "runs/smoke/report/index.html",
                   "figures/README.md"):
        assert needed in head, needed
    assert "may download" in (ROOT / "README.md").read_text()
    assert sys.version_info >= (3, 11)
