"""Two ledgers side by side (replication.ledger.compare): pairing, the changed verdicts named, the sources it reads, and
the runner's line after a rerun."""
import json
import subprocess

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from replication.ledger import compare

from replication.run import runner
from replication.core import config


def claim(text, verdict, interval=None, estimate=None, **kw):
    return {"claim": text, "verdict": verdict, "interval": interval, "estimate": estimate, "n": kw.pop("n", None),
            "qualifier": kw.pop("qualifier", None), "health": kw.pop("health", None), **kw}


OLD = {"03_x": {"notebook": "03_x", "claims": [
    claim("[sums] A beats B", "reproduced", [0.01, 0.17], 0.09, n="3 seeds x 200 questions"),
    claim("A raises the base (473 replies)", "reproduced", [0.1, 0.3], 0.2),
    claim("twin", "inconclusive", [-0.1, 0.1], 0.0),
    claim("twin", "reproduced", [0.1, 0.2], 0.15),
    claim("dropped later", "not tested")]}}
NEW = {"03_x": {"notebook": "03_x", "claims": [
    claim("[sums] A beats B", "inconclusive", [-0.01, 0.15], 0.07, n="3 seeds x 200 questions"),
    claim("A raises the base (468 replies)", "reproduced", [0.12, 0.31], 0.21),
    claim("twin", "inconclusive", [-0.1, 0.1], 0.0),
    claim("twin", "reproduced", [0.1, 0.2], 0.15, health="failed health check: b seed 1 (learned)"),
    claim("added later", "partly")]}}


def test_pairs_claims_by_text_without_numbers_and_in_order():
    rows = compare.pair(OLD, NEW)
    assert [compare.status(r) for r in rows] == ["changed", "same", "same", "changed", "only old", "only new"]
    assert rows[1]["new"]["interval"] == [0.12, 0.31]        # the measured count in the text does not split a claim
    assert rows[3]["old"]["verdict"] == rows[3]["new"]["verdict"] == "reproduced"   # the health note alone changed
    assert compare.summary(rows) == {"same": 2, "changed": 2, "only old": 1, "only new": 1}
    assert compare.pair(OLD, NEW, only=["04"]) == [] and len(compare.pair(OLD, NEW, only=["03"])) == 6


def test_a_reworded_claim_pairs_with_its_old_text_and_unlike_claims_do_not():
    old = {"05_y": {"claims": [claim("MALT improves over the same base model (sums, exact verifier)", "reproduced", [0.01, 0.1], 0.05),
                               claim("dropped later", "not tested")]}}
    new = {"05_y": {"claims": [claim("MALT improves over the same base model (two-digit sums, exact verifier)", "inconclusive",
                                     [-0.01, 0.1], 0.04), claim("added later", "partly")]}}
    rows = compare.pair(old, new)
    assert [compare.status(r) for r in rows] == ["changed", "only old", "only new"]
    assert rows[0]["reworded"] and not rows[1]["reworded"] and rows[0]["new"]["estimate"] == 0.04
    assert "reworded, now: MALT improves over the same base model (two-digit sums" in compare.format_rows(rows)
    assert not any(r["reworded"] for r in compare.pair(OLD, NEW))   # exact pairs are not reworded


def test_text_shows_both_verdicts_and_intervals():
    text = compare.format_rows(compare.pair(OLD, NEW))
    assert "! A beats B  (n: 3 seeds x 200 questions)" in text            # the bracketed qualifier dropped
    assert "old: +0.09 [+0.01, +0.17]" in text and "reproduced" in text
    assert "new: +0.07 [-0.01, +0.15]" in text and "inconclusive" in text
    assert "failed health check: b seed 1 (learned)" in text
    assert "- dropped later" in text and "new: (no such claim)" in text and "+ added later" in text


def test_log_changes_names_each_changed_claim():
    logs = []
    counts = compare.log_changes("03_x", OLD["03_x"], NEW["03_x"], logs.append)
    assert counts["changed"] == 2
    assert logs[0] == "[03_x] verdicts against the recorded run: 2 as before, 2 changed, 1 only old, 1 only new"
    assert "A beats B: reproduced -> inconclusive (+0.09 [+0.01, +0.17] -> +0.07 [-0.01, +0.15])" in logs[1]
    assert "twin: reproduced, its health note changed" in logs[2]
    assert compare.log_changes("03_x", None, NEW["03_x"], logs.append) == {} and len(logs) == 3


def test_sources_files_folders_and_bad_input(tmp_path, capsys):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "03_x.json").write_text(json.dumps(OLD["03_x"]))
    (tmp_path / "old" / "digests.json").write_text(json.dumps({"notebooks": {}}))   # not a metrics record: skipped
    (tmp_path / "new.json").write_text(json.dumps(NEW["03_x"]))
    assert set(compare.load(str(tmp_path / "old"))) == {"03_x"}
    assert compare.main([str(tmp_path / "old"), str(tmp_path / "new.json"), "--changed"]) == 0
    out = capsys.readouterr().out
    assert "A beats B" in out and "A raises the base" not in out
    assert out.strip().endswith("6 claims: 2 verdicts as before, 2 changed, 1 only old, 1 only new")
    assert compare.main([str(tmp_path / "nowhere"), str(tmp_path / "new.json")]) == 1
    assert "source" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{")
    assert compare.main([str(tmp_path / "bad.json"), str(tmp_path / "new.json")]) == 1
    assert "bad.json is not a metrics record" in capsys.readouterr().err
    assert compare.main([str(tmp_path / "old"), str(tmp_path / "new.json"), "--only", "05"]) == 1
    assert "--only 05" in capsys.readouterr().err


def test_reads_the_committed_metrics_at_a_git_revision(capsys):
    if subprocess.run(["git", "rev-parse", "HEAD:figures/metrics"], cwd=config.ROOT, capture_output=True).returncode:
        pytest.skip("this checkout has no committed figures/metrics")
    recs = compare.load("git:HEAD")
    assert "03_rlpr_debiasing" in recs and recs["03_rlpr_debiasing"]["claims"]
    with pytest.raises(ValueError, match="git:no-such-revision"):
        compare.load("git:no-such-revision")


def test_runner_logs_the_verdicts_that_changed_since_the_recorded_run(tmp_path, runs):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    nb = new_notebook()
    cell = new_code_cell("profile = 'default'\nseed = 0\nn = 3")
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, new_code_cell(
        "from replication.run import workbook\nrun = workbook.start('01_one', profile=profile, seed=seed)\n"
        "run.claim(f'n is small (n = {n})', 'small', str(n), 'arithmetic', 'counted', holds=n < 4)\nrun.finish()")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / "01_one.ipynb")
    (folder / "params").mkdir()
    (folder / "params" / "01_one.json").write_text(json.dumps({"default": {}}))
    logs = []
    runner.run("default", folder=folder, report=False, log=logs.append)
    assert not [line for line in logs if "verdicts against" in line]          # nothing recorded before
    runner.run("default", folder=folder, report=False, force=True, log=logs.append)
    assert "[01_one] verdicts against the recorded run: 1 as before, 0 changed" in logs
    (folder / "params" / "01_one.json").write_text(json.dumps({"default": {"n": 5}}))
    logs.clear()
    runner.run("default", folder=folder, report=False, log=logs.append)
    assert "[01_one] verdicts against the recorded run: 0 as before, 1 changed" in logs
    assert "[01_one]   n is small (n = 3): reproduced -> not reproduced" in logs
