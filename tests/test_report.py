"""The HTML report's parts without a browser: widget outputs as text, the marked ledger, MathJax in the folder;
and the committed figures match their index."""
import re
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from replication.ledger import report


def test_widget_outputs_become_the_text_of_their_final_state():
    nb = new_notebook()
    view = {"model_id": "box", "version_major": 2, "version_minor": 0}
    nb.cells = [new_code_cell("tqdm", outputs=[new_output("display_data", data={
        report.WIDGET_VIEW: view, "text/plain": "inner:   0%|          | 0/3"})])]
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"version_major": 2, "state": {
        "box": {"state": {"_model_name": "HBoxModel", "children": ["IPY_MODEL_left", "IPY_MODEL_bar", "IPY_MODEL_right"]}},
        "left": {"state": {"_model_name": "HTMLModel", "value": "inner: 100%"}},
        "bar": {"state": {"_model_name": "FloatProgressModel", "value": 3, "max": 3}},
        "right": {"state": {"_model_name": "HTMLModel", "value": " 3/3 [00:00&lt;00:00, 9.1it/s]"}}}}}
    report.widgets_as_text(nb)
    data = nb.cells[0].outputs[0]["data"]
    assert data == {"text/plain": "inner: 100% 3/3 [00:00<00:00, 9.1it/s]"} and "widgets" not in nb.metadata
    nbformat.validate(nb)


def test_ledger_marks_each_verdict_and_evidence_kind():
    claims = [{"notebook": "01_x", "claim": c, "paper": "p", "measured": "m", "verdict": v, "evidence": e,
               "interval": None, "n": None, "why": "w"}
              for c, v, e in [("a", "reproduced", "real model"), ("b", "not reproduced", "simulation"),
                              ("c", "reproduced", "arithmetic")]]
    page = report.ledger_html(claims)
    assert page.count(f'background:{report.VERDICT_COLOURS["reproduced"]}">reproduced<') == 2
    assert f'background:{report.VERDICT_COLOURS["not reproduced"]}">not reproduced<' in page
    assert ">2 reproduced<" in page and ">1 not reproduced<" in page and "inconclusive" not in page
    assert '<span class="kind">simulation</span>' in page and '<span class="kind">real model</span>' in page
    assert report.ledger_html([]).startswith("<p>no claims recorded yet")


def test_mathjax_is_copied_into_the_report_folder_once(tmp_path):
    target = report.install_mathjax(tmp_path)
    assert (target / "MathJax.js").is_file() and (target / "config/TeX-AMS-MML_HTMLorMML-full.js").is_file()
    assert list((target / "fonts/HTML-CSS/STIX-Web/woff").glob("*.woff"))
    assert not list(target.rglob("a11y")) and not (target / "localization").exists()
    (target / "MathJax.js").write_text("kept")
    report.install_mathjax(tmp_path)  # already there: not copied again
    assert (target / "MathJax.js").read_text() == "kept"


def test_every_committed_figure_is_in_the_index():
    """A figure the notebooks no longer make (renamed or dropped) must leave figures/ with the run that drops it:
    the index lists exactly the committed figures."""
    folder = Path(__file__).resolve().parents[1] / "figures"
    index = (folder / "README.md").read_text()
    listed = set(re.findall(r"\]\(([\w.-]+)\.png\)", index))
    files = {p.stem for p in folder.glob("*.png")}
    assert files == listed, f"not in the index: {sorted(files - listed)}; in the index, no file: {sorted(listed - files)}"
    assert {p.stem for p in folder.glob("*.pdf")} == files


def claim_row(claim, verdict, interval, **kw):
    return {"notebook": "03_x", "claim": claim, "paper": "p", "measured": "m", "verdict": verdict,
            "evidence": "real model", "interval": interval, "n": "3 seeds x 200 questions", "why": "w", **kw}


def test_forest_rows_are_in_the_papers_direction_with_seeds_and_effect():
    from replication.ledger import forest
    from replication.core import fmt

    claims = [claim_row("up [2d sums; judge: the verifier]", "reproduced", [0.1, 0.3], estimate=0.2,
                        seed_differences=[0.1, 0.2, 0.3], effect=0.28),
              claim_row("down", "reproduced", [-0.3, -0.1], direction=-1, estimate=-0.2, seed_differences=[-0.2]),
              claim_row("ratio", "inconclusive", [0.8, 1.5], null=1.0),
              claim_row("no interval", "reproduced", None)]
    rows = forest.rows(claims)
    assert [r["label"] for r in rows] == ["03 up", "03 down", "03 ratio"]      # claims without an interval are left out,
    assert fmt.short_claim("a - b [x; judge: y] holds [z]") == "a - b holds"  # the qualifiers stay in the ledger
    assert (rows[0]["low"], rows[0]["high"], rows[0]["estimate"], rows[0]["effect"]) == (0.1, 0.3, 0.2, 0.28)
    assert rows[0]["seeds"] == [0.1, 0.2, 0.3] and rows[1]["seeds"] == []     # one seed: no seed dots
    assert rows[1]["low"] == pytest.approx(0.1) and rows[1]["estimate"] == pytest.approx(0.2)   # flipped to the paper's side
    assert rows[2]["low"] == pytest.approx(0.8) and rows[2]["estimate"] == pytest.approx(1.15)  # a ratio keeps its scale
    assert [r["unit"] for r in rows] == ["points", "points", "ratio"]


def test_forest_panels_by_unit_each_in_its_own_scale():
    from replication.ledger import forest

    elo = claim_row("gap", "reproduced", [51.2, 116.4], measured="mean E^C - E^I (Elo): +84")
    auc = claim_row("auc", "inconclusive", [-0.06, 0.07], measured="within-question AUC mean - product +0.006")
    slope = claim_row("s", "reproduced", [-0.92, -0.58], direction=-1, measured="slope of consultancy accuracy")
    ratio = claim_row("r", "partly", [6.2, float("inf")], null=1.0, estimate=20.5)
    inverse = claim_row("r2", "reproduced", [0.25, 0.5], null=1.0, direction=-1, estimate=0.4)
    sim = claim_row("acc", "reproduced", [0.11, 0.13], evidence="simulation", measured="sim: accuracy")
    rows = forest.rows([elo, auc, slope, ratio, inverse, sim])
    assert [r["unit"] for r in rows] == ["elo", "auc", "slope", "ratio", "ratio", "points"]
    assert (rows[2]["low"], rows[2]["high"]) == (0.58, 0.92)               # flipped into the paper's direction
    assert (rows[4]["low"], rows[4]["high"], rows[4]["estimate"]) == (2.0, 4.0, 2.5)   # a ratio flips to its inverse
    assert rows[5]["evidence"] == "simulation"
    long = claim_row("a claim whose label runs on " * 5, "reproduced", [0.1, 0.2])
    assert forest.rows([long])[0]["label"].endswith("runs on")             # the whole label, wrapped when drawn


def test_forest_plot_is_written_once_per_ledger(tmp_path):
    from replication.ledger import forest

    claims = [claim_row("a", "reproduced", [0.1, 0.3], seed_differences=[0.1, 0.2]),
              claim_row("b", "not reproduced", [-0.5, float("-inf")][::-1], direction=-1)]
    assert forest.plot(claims, tmp_path) == ["forest_plot.png", "forest_plot.pdf"]
    first = (tmp_path / "forest_plot.png").read_bytes()
    forest.plot(claims, tmp_path)
    assert (tmp_path / "forest_plot.png").read_bytes() == first          # no timestamps: the same ledger, the same bytes
    assert forest.plot([claim_row("c", "reproduced", None)], tmp_path / "none") == []


def test_long_cells_are_cut_with_the_full_text_one_click_away():
    long = "a measured sentence " * 10
    row = claim_row("c", "inconclusive", [-0.1, 0.2], measured=long.strip(), qualifier="one run",
                    health="failed health check: rlvr seed 1 (learned)")
    assert report.short(long).endswith(" …") and len(report.short(long)) <= report.SHORT + 1
    assert report.short("fits") == "fits"
    page = report.ledger_html([row])
    assert f"<details><summary>{report.short(long.strip())}</summary>{long.strip()}</details>" in page
    assert "one run" in page and "rlvr seed 1 (learned)" in page
    full = report.ledger_md([row], "default")
    assert long.strip() in full and 'id="claim-03-0"' in full
    assert "inconclusive (one run); failed health check: rlvr seed 1 (learned)" in full


def test_rows_that_test_the_same_claim_stand_together_in_the_ledger():
    """A claim tested by simulation and, later in the notebook, by the real model: the two rows side by side where the
    first stood, every other row in its recorded order; another notebook's row of the same words stays apart."""
    def row(nb, claim, evidence):
        return {"notebook": nb, "claim": claim, "paper": "p", "measured": "m", "verdict": "reproduced",
                "evidence": evidence, "interval": None, "n": None, "why": "w"}
    recs = [{"notebook": "02_x", "claims": [row("02_x", "A", "simulation"), row("02_x", "B", "simulation"),
                                            row("02_x", "C", "real model"), row("02_x", "a", "real model")]},
            {"notebook": "04_y", "claims": [row("04_y", "A", "real model")]}]
    claims = report.ledger(recs)
    assert [(c["notebook"], c["claim"], c["evidence"]) for c in claims] == [
        ("02_x", "A", "simulation"), ("02_x", "a", "real model"), ("02_x", "B", "simulation"),
        ("02_x", "C", "real model"), ("04_y", "A", "real model")]
    assert 'id="claim-02-1"></a>\n### 02. a' in report.ledger_md(claims, "default")


def test_a_failed_health_check_is_counted_per_arm_in_the_table_and_listed_in_full_in_ledger_md():
    health = ("failed health check: point seed 0 (learned, accuracy_ok); point seed 1 (learned); point seed 2 "
              "(accuracy_ok); static-mid seed 0 (learned); static-mid seed 2 (learned)")
    row = claim_row("c", "inconclusive", [-0.1, 0.2], qualifier="1 of 3 seeds on the paper's side", health=health)
    cell = report.table_cell(row, "verdict")
    assert cell == ("inconclusive (1 of 3 seeds on the paper's side); "
                    "failed health check: point 3 seeds, static-mid 2 seeds")
    assert report.table_cell({**row, "health": "failed health check: a draw 1 (learned); b (learned)"},
                             "verdict").endswith("failed health check: a 1 draw, b")
    assert report.table_cell({**row, "health": None}, "verdict") == "inconclusive (1 of 3 seeds on the paper's side)"
    assert health in report.ledger_md([row], "default")


def test_the_committed_ledger_tables_cells_stay_short():
    """figures/README.md's ledger table: the paper, verdict, measured and why cells at most about 120 characters (their
    full text is in ledger.md)."""
    lines = (Path(__file__).parents[1] / "figures" / "README.md").read_text().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| notebook | claim |"))
    columns = [c.strip() for c in lines[head].strip("|").split("|")]
    long = []
    for line in lines[head + 2:]:
        if not line.startswith("|"):
            break
        cells = dict(zip(columns, (c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|")))))
        long += [(cells["notebook"], k, len(cells[k])) for k in ("paper", "verdict", "measured", "why") if len(cells[k]) > 120]
    assert not long, long


def test_ledger_rows_over_seeds_say_how_a_rerun_would_read():
    """The rerun cell is the projection of `python -m replication seeds` at the row's own number of seeds: a row whose
    seeds straddle the rule's edge reads two verdicts, one far from it one; a row of one run or without seeds '-'."""
    from replication.ledger import seeds
    from replication.core import power

    edge = claim_row("edge", "reproduced", [0.010, 0.170], estimate=0.09, seed_differences=[0.045, 0.13, 0.095])
    far = claim_row("far", "reproduced", [0.165, 0.318], estimate=0.242, seed_differences=[0.25, 0.225, 0.25])
    single = claim_row("one", "inconclusive", [-0.05, 0.2], estimate=0.07, seed_differences=[0.07], qualifier="one run")
    plan = power.project(edge, (3,))["plans"][3]
    assert 0.2 < plan["inconclusive"][0] and 0.2 < plan["reproduced"][0]
    assert report._cell(edge, "rerun") == seeds.rerun(edge) and report._cell(edge, "rerun").startswith("R 0.")
    assert " I 0." in report._cell(edge, "rerun") and " N " not in report._cell(edge, "rerun")
    assert report._cell(far, "rerun").startswith("R 1.00")
    assert report._cell(single, "rerun") == "-" and report._cell(claim_row("x", "reproduced", None), "rerun") == "-"
    full = report.ledger_md([edge, single], "default")
    assert full.count("- **a rerun reads**: with its 3 seeds: reproduced 0.") == 1 and "two such runs agree 0." in full
    assert "- **rerun**" not in full
    page = report.ledger_html([edge])
    assert "<th>rerun</th>" in page and f"<td>{seeds.rerun(edge)}</td>" in page


def test_the_rerun_cell_plans_for_5_and_10_seeds_and_carries_the_uncertainty_of_the_seed_sd():
    """Beside the chances at the row's own seeds, the cell gives the likeliest verdict at 5 and 10, and each chance
    with its range over the seed SD's 90% interval (from three seeds, about 0.58x to 4.4x): a boundary row's
    `reproduced` ranges widely, and more seeds make it likelier at the measured SD."""
    from replication.ledger import seeds
    from replication.core import power

    edge = claim_row("edge", "reproduced", [0.010, 0.170], estimate=0.09, seed_differences=[0.045, 0.13, 0.095])
    p = power.project(edge, (3, 5, 10), spans=True)
    lo, hi = p["sd_range"]
    assert lo < 0.6 * p["seed_sd"] and hi > 4 * p["seed_sd"]
    for s in (3, 5, 10):
        for k in power.OUTCOMES:   # the range holds the chance at the measured SD
            assert p["spans"][s][k][0] <= p["plans"][s][k][0] <= p["plans"][s][k][1] <= p["spans"][s][k][1]
    assert p["spans"][3]["reproduced"][1] - p["spans"][3]["reproduced"][0] > 0.4
    assert p["plans"][10]["reproduced"][0] > p["plans"][3]["reproduced"][1]
    cell = seeds.rerun(edge)
    own, at5, at10 = cell.split(" · ")
    assert own.startswith("R 0.") and "(" in own and " I 0." in own
    assert at5.startswith("at 5: R ") and at10.startswith("at 10: R ")
    five = claim_row("five", "reproduced", [0.05, 0.13], estimate=0.09,
                     seed_differences=[0.045, 0.13, 0.095, 0.08, 0.1])
    assert [part.split(":")[0] for part in seeds.rerun(five).split(" · ")[1:]] == ["at 10"]
    full = seeds.rerun(edge, full=True)
    assert full.startswith("with its 3 seeds: reproduced 0.") and "; with 5: " in full and "; with 10: " in full
    assert f"from {lo:.2g} to {hi:.2g}, its 90% interval from 3 seeds" in full


def test_an_index_written_before_the_rerun_column_keeps_its_rows_aligned(tmp_path):
    old = tmp_path / "README.md"
    old.write_text("| notebook | claim | paper | measured | verdict | evidence | interval | n | why |\n|---|---|---|---|---|---|---|---|---|\n"
                   "| 04_y | c | p | m | reproduced | real model | [+0.1, +0.2] | 3 seeds x 200 questions | w |\n")
    kept = report.kept_rows(old, ["04_y"], ran={})
    cells = [c.strip() for c in kept["claims"]["04_y"][0].strip().strip("|").split(" | ")]
    assert len(cells) == len(report.LEDGER_COLUMNS) and cells[report.LEDGER_COLUMNS.index("rerun")] == "-"
    assert cells[report.LEDGER_COLUMNS.index("why")] == "w" and cells[-1] == "-"   # no source recorded then


def test_an_index_written_before_the_source_column_keeps_its_rows_aligned(tmp_path):
    old = tmp_path / "README.md"
    old.write_text("| notebook | claim | paper | measured | verdict | evidence | interval | n | rerun | why |\n"
                   "|---|---|---|---|---|---|---|---|---|---|\n"
                   "| 04_y | c | p | m | reproduced | real model | [+0.1, +0.2] | 3 seeds | R 0.9 | w |\n")
    cells = [c.strip() for c in report.kept_rows(old, ["04_y"], ran={})["claims"]["04_y"][0].strip().strip("|").split(" | ")]
    assert len(cells) == len(report.LEDGER_COLUMNS) and cells[-2:] == ["w", "-"]
    assert cells[report.LEDGER_COLUMNS.index("task")] == "-" and cells[report.LEDGER_COLUMNS.index("paper")] == "p"


def test_an_index_written_before_the_task_model_and_judge_columns_keeps_its_rows_aligned(tmp_path):
    old = tmp_path / "README.md"
    old.write_text("| notebook | claim | paper | measured | verdict | evidence | interval | n | rerun | why | source |\n"
                   "|---|---|---|---|---|---|---|---|---|---|---|\n"
                   "| 04_y | c | p | m | reproduced | real model | [+0.1, +0.2] | 3 seeds | R 0.9 | w | results store |\n")
    cells = [c.strip() for c in report.kept_rows(old, ["04_y"], ran={})["claims"]["04_y"][0].strip().strip("|").split(" | ")]
    assert cells == ["04_y", "c", "-", "-", "-", "p", "m", "reproduced", "real model", "[+0.1, +0.2]", "3 seeds", "R 0.9",
                     "w", "results store"]


def test_the_source_of_each_claim_and_notebook_is_shown():
    rec = {"results_store": {"from_store": 12, "made_now": 0, "store": {"commit": "abc1234", "date": "2026-12-02"}}}
    assert report.source_note(rec) == "12 from the store (abc1234, 2026-12-02); 0 made now"
    assert report.source_note({}) == "-"
    assert report._cell({"source": "results store"}, "source") == "results store"
