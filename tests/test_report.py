"""The HTML report's parts without a browser: widget outputs as text, the marked ledger, MathJax in the folder;
and the committed figures match their index."""
import re
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook, new_output

from replication import report


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
