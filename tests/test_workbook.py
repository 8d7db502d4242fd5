import json

import matplotlib.pyplot as plt
import pytest

from replication import config, files, workbook
from replication.figures import savefig


def test_run_record_and_figures(runs):
    run = workbook.start("07_example", profile="smoke", seed=3)
    plt.plot([1, 2])
    paths = savefig("07a_example_line", "A line.")
    assert [p.suffix for p in paths] == [".png", ".pdf"] and all(p.parent == runs / "smoke/figures" for p in paths)
    with pytest.raises(ValueError, match="name="):
        savefig("08a_wrong_notebook", "x")
    with pytest.raises(ValueError, match="evidence="):
        run.claim("c", "1", "2", "a hunch", "why", holds=True)
    with pytest.raises(ValueError, match="no basis"):
        run.claim("c", "1", "2", "real model", "why")
    run.claim("c", "1", "2", "real model", "why", interval=(-0.1, 0.2), n=200)
    run.claim("c", "1", "3", "real model", "why", interval=(0.05, 0.2), n=200)  # same claim replaces the earlier row
    record = json.loads(run.finish().read_text())
    assert record["seed"] == 3 and len(record["claims"]) == 1 and record["claims"][0]["measured"] == "3"
    row = record["claims"][0]
    assert row["verdict"] == "reproduced" and row["evidence"] == "real model" and row["interval"] == [0.05, 0.2]
    assert row["n"] == 200
    assert record["figures"][0]["caption"] == "A line."


@pytest.mark.parametrize("kwargs, message", [
    ({"notebook": "x", "profile": "smoke", "seed": 0}, "notebook="),
    ({"notebook": "07_x", "profile": "fast", "seed": 0}, "profile='fast'"),
    ({"notebook": "07_x", "profile": "smoke", "seed": -1}, "seed=-1"),
])
def test_bad_run_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        workbook.start(**kwargs)


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    path = files.write_json(tmp_path / "a.json", {"x": 1})
    with pytest.raises(TypeError):
        files.write_json(path, {"x": object()})
    assert json.loads(path.read_text()) == {"x": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_default_profile_figures_go_to_committed_folder(monkeypatch):
    monkeypatch.delenv("REPLICATION_FIGURES", raising=False)
    assert config.figures_dir("default") == config.ROOT / "figures"
    assert config.figures_dir("smoke") != config.ROOT / "figures"
