import copy
import json
import time
from dataclasses import dataclass

import matplotlib.pyplot as plt
import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell, new_notebook

from replication.ledger import seeds

from replication.run import workbook
from replication.core import config, files, params, stats
from replication.core.figures import savefig
from replication.lm import models


def test_run_record_and_figures(runs):
    run = workbook.start("07_example", profile="smoke", seed=3)
    plt.plot([1, 2])
    assert savefig("07a_example_line", "A line.") is None   # a cell ending with savefig echoes no paths
    # not started by the runner: a run by hand, whose outputs go to the scratch run folder only
    assert all((runs / "smoke-scratch/figures" / f"07a_example_line.{x}").is_file() for x in ("png", "pdf"))
    assert run.figures[-1]["files"] == ["07a_example_line.png", "07a_example_line.pdf"]
    assert run.metrics_path == runs / "smoke-scratch/metrics/07_example.json"
    with pytest.raises(ValueError, match="name="):
        savefig("08a_wrong_notebook", "x")
    with pytest.raises(ValueError, match="evidence="):
        run.claim("c", "1", "2", "a hunch", "why", holds=True)
    with pytest.raises(ValueError, match="no basis"):
        run.claim("c", "1", "2", "real model", "why")
    run.claim("c", "1", "2", "real model", "why", interval=(-0.1, 0.2), n=200)
    run.claim("c", "1", "3", "real model", "why", interval=(0.05, 0.2), n=200)  # same claim replaces the earlier row
    run.claim("d", "1", "2", "real model", "why", interval=(0.05, 0.2), n="3 seeds x 200 questions",
              seed_differences=[0.1, 0.12, 0.15], question_variance=0.000123456789)
    run.claim("e", "1", "2", "real model", "why", interval=stats.Interval(0.05, 0.2, 0.0004), n="3 seeds x 200 questions",
              seed_differences=[0.1, 0.12, 0.15])   # a two-level interval carries its question part
    table = run.claims_table()
    assert list(table.columns) == workbook.CLAIM_COLUMNS   # one run: '-'; over seeds: the ledger's projection
    assert list(table["rerun"]) == ["-", *(seeds.rerun(c) for c in run.claims[1:])] and table["rerun"][1].startswith("R 0.9")
    record = json.loads(run.finish().read_text())
    assert not (runs / "smoke").exists()
    assert record["seed"] == 3 and len(record["claims"]) == 3 and record["claims"][0]["measured"] == "3"
    assert [c["question_variance"] for c in record["claims"]] == [None, 0.000123457, 0.0004]
    assert record["claims"][2]["interval"] == [0.05, 0.2]
    assert record["device"] == models.describe_device() and record["torch"] == torch.__version__  # where it computed
    row = record["claims"][0]
    assert row["verdict"] == "reproduced" and row["evidence"] == "real model" and row["interval"] == [0.05, 0.2]
    assert row["n"] == 200
    assert record["figures"][0]["caption"] == "A line."


def test_a_claim_is_a_short_sentence_with_its_setting_in_its_own_fields(runs):
    run = workbook.start("07_example", profile="smoke", seed=0)
    with pytest.raises(ValueError, match="claim: at most 90 characters"):
        run.claim("x" * 91, "1", "2", "real model", "why", holds=True)
    run.claim("debate beats the naive judge", "1", "2", "real model", "why", holds=True, task="300 stories",
              judge="likelihood judge")
    run.claim("debate beats the naive judge", "1", "2", "simulation", "why", holds=False)   # another row: its evidence
    real, sim = run.claims
    assert (real["task"], real["judge"], sim["task"], sim["judge"], sim["model"]) == ("300 stories", "likelihood judge",
                                                                                      None, None, None)
    assert list(run.claims_table().columns[:3]) == ["claim", "task", "judge"]


def test_a_compound_claim_keeps_each_parts_interval_verdict_and_seeds(runs):
    """A compound claim's parts measured by intervals (verdicts.part) are recorded with their own interval, verdict and
    seeds; the row's verdict follows from the parts; the forest plot and the seeds projection draw each part on its
    own row, the ledger's interval cell names each part's, and ledger.md gives each part a line."""
    from replication.ledger import forest, table as ledger
    from replication.core import verdicts

    run = workbook.start("07_example", profile="smoke", seed=0)
    flat = verdicts.part([-0.04, 0.08], estimate=0.02, seed_differences=[0.0, 0.01, 0.05])
    clear = verdicts.part([0.02, 0.1], estimate=0.06, seed_differences=[0.05, 0.06, 0.07])
    assert (flat["verdict"], clear["verdict"]) == ("inconclusive", "reproduced")
    row = run.claim("T = 200 is the best trade-off", "T = 200", "m", "real model", "why", n="3 seeds x 200 questions",
                    parts={"above T = 2000": flat, "above T = 20": clear}, interval=[0.0, 0.0], estimate=0.0,
                    seed_differences=[0.0, 0.0, 0.0])
    assert row["verdict"] == "partly" and row["qualifier"] is None   # not "0 of 3 seeds", which is one part's
    assert row["parts"]["above T = 2000"]["interval"] == [-0.04, 0.08] and "[parts: above T = 2000: inconclusive" in row["why"]
    drawn = forest.rows([{**row, "notebook": "02_x"}])
    assert [(r["label"], r["verdict"], r["low"]) for r in drawn] == [
        ("02 T = 200 is the best trade-off: above T = 2000", "inconclusive", -0.04),
        ("02 T = 200 is the best trade-off: above T = 20", "reproduced", 0.02)]
    assert ledger._cell(row, "interval") == "above T = 2000 [-0.04, +0.08]; above T = 20 [+0.02, +0.1]"
    assert seeds.rerun(row) is None and seeds.rerun(list(verdicts.expanded([row]))[0]) is not None
    full = ledger.ledger_md([{**row, "notebook": "02_x"}], "smoke")
    assert "- **part: above T = 20**: reproduced (3 of 3 seeds on the paper's side), [+0.02, +0.1]; per seed" in full
    assert "- **per seed**" not in full


def _committed_claims(field: str):
    """([(notebook, claims)] of the committed metrics whose claims carry `field`, [the notebooks whose do not])."""
    current, older = [], []
    for path in sorted((config.ROOT / "figures/metrics").glob("*.json")):
        claims = json.loads(path.read_text())["claims"]
        if claims and field not in claims[0]:
            older.append(path.stem)
        else:
            current.append((path.stem, claims))
    return current, older


def test_committed_claims_are_short_sentences_with_their_setting_in_columns():
    """Every committed claim made by today's run.claim (its record has the setting's fields) has a label of at most
    90 characters without bracketed qualifiers; a notebook whose committed metrics predate the fields fails it."""
    current, older = _committed_claims("task")
    for stem, claims in current:
        for c in claims:
            assert len(c["claim"]) <= workbook.CLAIM_LIMIT and "[" not in c["claim"], (stem, c["claim"])
    assert not older, f"committed metrics made before the task/judge fields: {older}"


def test_a_row_passes_the_papers_effect_or_says_why_not(runs):
    """effect= passes the paper's effect to the rule; effect_why= says in a few words why it is not passed (another
    scale, no number); never both; ledger.md gives each row with an interval a line on it."""
    from replication.ledger import table as ledger

    run = workbook.start("07_example", profile="smoke", seed=0)
    with pytest.raises(ValueError, match="effect_why"):
        run.claim("debate beats naive", "+0.28", "m", "real model", "why", interval=[0.05, 0.17], effect=0.28,
                  effect_why="another scale")
    short = run.claim("debate beats naive", "+0.28", "m", "real model", "why", interval=[0.05, 0.17], effect=0.28)
    other = run.claim("RLPR beats RLVR", "+7.6 points on 7B benchmarks", "m", "real model", "why",
                      interval=[-0.1, 0.2], effect_why="the paper's points are 7B benchmark accuracy: another scale")
    assert (short["verdict"], short["effect_why"], other["effect"]) == ("partly", None, None)
    text = ledger.ledger_md([{**c, "notebook": "07_example"} for c in run.claims], "smoke")
    assert "- **paper's effect**: +0.28, passed to the rule" in text
    assert "- **paper's effect**: not passed: the paper's points are 7B benchmark accuracy: another scale" in text


def test_every_committed_real_model_row_passes_the_papers_effect_or_says_why():
    """Every committed real-model row with an interval passes the paper's effect to the rule or says why not
    (`effect_why`), so a row never reads as a full success on a direction alone without saying so."""
    missing = [(path.stem, c["claim"]) for path in sorted((config.ROOT / "figures/metrics").glob("*.json"))
               for c in json.loads(path.read_text())["claims"]
               if c["evidence"] == "real model" and c.get("interval") is not None
               and c.get("effect") is None and not c.get("effect_why")]
    assert not missing, missing


def test_committed_intervals_stay_inside_what_their_quantities_can_be():
    """Every committed claim made by today's run.claim (its record has `bounds`): an interval with bounds lies inside
    them, and every accuracy written in percent with its interval ('26.0% [-6.9, 58.9]') has its ends in 0-100;
    a notebook whose committed metrics predate the bounds fails it."""
    import re

    percent = re.compile(r"(-?\d+(?:\.\d+)?)%? \[(-?\d+(?:\.\d+)?)%?(?: \(clipped\))?, (-?\d+(?:\.\d+)?)%?")
    current, older = _committed_claims("bounds")
    for stem, claims in current:
        for c in claims:
            if c.get("bounds") and c.get("interval"):
                lo, hi = c["bounds"]
                assert lo <= c["interval"][0] <= c["interval"][1] <= hi, (stem, c["claim"], c["interval"])
            for m in percent.finditer(c["measured"]):
                if f"{m.group(1)}%" in c["measured"][m.start():m.end()]:
                    ends = (m.group(2), m.group(3))   # '-0%' is an end below 0 that rounded
                    assert not any(e.startswith("-") for e in ends) and 0 <= float(ends[0]) <= float(ends[1]) <= 100, \
                        (stem, c["claim"], m.group(0))
    assert not older, f"committed metrics made before intervals knew their bounds: {older}"


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


@pytest.fixture
def profiled(tmp_path, monkeypatch):
    """A notebook 07_example with a parameters cell (n = 3, m = 1, lr = 0.001) and a smoke profile that changes
    n and m, in a notebooks folder that runs by hand read (REPLICATION_NOTEBOOKS); its class is registered."""
    folder = tmp_path / "notebooks"
    (folder / "params").mkdir(parents=True)
    nb = new_notebook()
    cell = new_code_cell("profile = 'default'\nseed = 0\nn = 3   # sizes\nm = 1\nlr = 0.001")
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, new_code_cell('run = workbook.start("07_example", globals())')]
    nbformat.write(nb, folder / "07_example.ipynb")
    (folder / "params/07_example.json").write_text(json.dumps({"smoke": {"n": 4, "m": 2}, "default": {}, "paper": {}}))

    @dataclass
    class Example(params.Params):
        n: int = params.p()
        m: int = params.p()
        lr: float = params.p(low=0.0, high=1.0)

    monkeypatch.setitem(params.REGISTRY, "07_example", Example)
    monkeypatch.setenv("REPLICATION_NOTEBOOKS", str(folder))
    monkeypatch.delenv(config.RUNNER_ENV, raising=False)
    return folder


CELL = {"profile": "default", "seed": 0, "n": 3, "m": 1, "lr": 0.001}


def test_profile_set_by_hand_loads_its_values(profiled, runs):
    """profile = 'smoke' edited in JupyterLab (or -p profile smoke): the smoke sizes, in run.params and globals."""
    namespace = {**CELL, "profile": "smoke"}
    run = workbook.start("07_example", namespace)
    assert (run.params.n, run.params.m, run.params.lr) == (4, 2, 0.001) and (namespace["n"], namespace["m"]) == (4, 2)
    assert run.profile == "smoke" and run.metrics_path.parent == runs / "smoke-scratch/metrics"
    # the default profile changes nothing
    assert workbook.start("07_example", dict(CELL)).params.n == 3


def test_values_set_by_hand_win_over_the_profile(profiled, runs):
    # edited in the cell: a value other than the committed one is kept
    assert params.profile_changes("07_example", {**CELL, "profile": "smoke", "n": 10}, profiled) == {"m": 2}
    # papermill -p profile smoke -p m 1: injected, so kept even though it equals the cell's value
    injected = ["", "profile = 'default'\nseed = 0\nn = 3\nm = 1\nlr = 0.001", '# Parameters\nprofile = "smoke"\nm = 1\n']
    namespace = {**CELL, "profile": "smoke", "In": injected}
    assert params.injected_names(namespace) == {"profile", "m"}
    assert params.profile_changes("07_example", namespace, profiled) == {"n": 4}
    run = workbook.start("07_example", namespace)
    assert (run.params.n, run.params.m) == (4, 1)
    with pytest.raises(ValueError, match="profile='fast' is not allowed"):
        workbook.start("07_example", {**CELL, "profile": "fast"})


def test_runner_kernels_take_the_parameters_as_injected(profiled, runs, monkeypatch):
    """Under the runner (it names its run folder in RUNNER_ENV) the profile is not applied a second time: the
    runner injected the resolved values (here an override equal to the cell's value), and outputs are staged."""
    monkeypatch.setenv(config.RUNNER_ENV, "smoke")
    run = workbook.start("07_example", {**CELL, "profile": "smoke", "n": 3, "m": 2})
    assert (run.params.n, run.params.m) == (3, 2)
    assert run.metrics_path == runs / "smoke/staging/07_example/metrics/07_example.json"
    assert run.figures_dir == runs / "smoke/staging/07_example/figures"


def test_phase_profile_counts_the_innermost_phase_once(monkeypatch):
    from replication.core import phases

    clock = iter([0.0, 1.0, 3.0, 4.0, 10.0, 12.0])   # enter eval, enter judging, leave judging, leave eval, stats
    monkeypatch.setattr(phases.time, "perf_counter", lambda: next(clock))
    phases.reset()
    with phases.phase("generation for evaluation"):
        with phases.phase("judging"):
            pass
    with phases.phase("statistics and plotting"):
        pass
    prof = phases.profile(wall=20.0)
    assert prof["generation for evaluation"] == 2.0 and prof["judging"] == 2.0   # 0-1 and 3-4; 1-3 is judging
    assert prof["statistics and plotting"] == 2.0 and prof["other"] == 14.0 and prof["update"] == 0.0
    assert set(prof) == {*phases.PHASES, "other"}
    with pytest.raises(ValueError, match="phase='thinking'"):
        with phases.phase("thinking"):
            pass
    phases.reset()


def test_grpo_steps_fill_the_training_phases(tiny):
    from replication.core import phases
    from replication.lm import grpo, models

    model, tok = tiny
    model = models.add_lora(copy.deepcopy(model), r=4, alpha=8)   # the shared fixture stays without adapters
    def slow_reward(prompts, completions, metadata, **kw):
        time.sleep(0.02)
        return [float(len(c)) for c in completions]

    trainer = grpo.GRPOTrainer(model, tok, slow_reward, grpo.GRPOConfig(num_generations=2, max_new_tokens=4))
    phases.reset()
    trainer.train(lambda step: (["a", "b"], [{}] * 2), 1, progress=False)
    prof = phases.profile(wall=1e6)
    assert prof["generation for training"] > 0 and prof["update"] > 0 and prof["reward scoring"] > 0
    assert prof["generation for evaluation"] == 0
    phases.reset()


def test_a_resumed_notebook_tallies_what_its_cached_results_took_when_made(tmp_path):
    """A cache hit counts its recorded making time once; an entry made before times were kept counts as untimed;
    a training run resumed past k steps counts those steps' seconds, unless this execution trained them (a run it
    continues), and copied steps (a fork) are not counted again."""
    from replication.core import cache, phases
    from replication.lm import loop

    phases.reset()
    cache.cached(tmp_path, "made", {"k": 1}, lambda: time.sleep(0.05) or [1, 2])   # a miss: made here
    assert phases.reused_profile() == {"entries": 0, "seconds": 0.0, "untimed": 0}
    assert cache.cached(tmp_path, "made", {"k": 1}, lambda: pytest.fail("made twice")) == [1, 2]
    assert phases.reused_profile()["entries"] == 1 and phases.reused_profile()["seconds"] >= 0.05
    cache.store(cache.path_for(tmp_path, "old", {"k": 2}), {"k": 2}, [3])   # an entry with no recorded time
    cache.cached(tmp_path, "old", {"k": 2}, lambda: pytest.fail("made twice"))
    assert phases.reused_profile()["untimed"] == 1 and phases.reused_profile()["entries"] == 2

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    folder = loop.RunFolder(tmp_path / "run")
    step = lambda i, state: {"wall_s": 2.0 + i}
    phases.reset()
    phases.new_execution()
    loop.run(step, 3, model, opt, folder, save_every=1, progress=False)
    loop.run(step, 3, model, opt, folder, save_every=1, progress=False)          # this execution made it: no reuse
    assert phases.reused_profile()["entries"] == 0
    continued = loop.RunFolder(tmp_path / "continued")                            # a sweep's run that the pick goes on with
    loop.run(step, 2, model, opt, continued, save_every=1, progress=False)
    loop.run(step, 4, model, opt, continued, save_every=1, progress=False)
    assert phases.reused_profile()["entries"] == 0 and len(continued.rows()) == 4
    phases.reset()
    phases.new_execution()                                                         # a later execution
    loop.run(step, 3, model, opt, folder, save_every=1, progress=False)          # finished: 2 + 3 + 4 s reused
    assert phases.reused_profile() == {"entries": 1, "seconds": 9.0, "untimed": 0}
    phases.reset()
    folder.mark_copied(2, "twin")                                                  # steps 0-1 were the twin's
    loop.run(step, 3, model, opt, folder, save_every=1, progress=False)
    assert phases.reused_profile() == {"entries": 1, "seconds": 4.0, "untimed": 0}
    phases.reset()
    untimed = loop.RunFolder(tmp_path / "untimed")
    loop.run(lambda i, state: {"x": i}, 2, model, opt, untimed, progress=False)
    assert all(r["wall_s"] >= 0 for r in untimed.rows())                          # the loop times its own steps
    phases.reset()


def test_the_index_shows_what_a_resumed_notebook_reused():
    from replication.ledger import report

    assert report.reused_cell(None) == "-"
    assert report.reused_cell({"entries": 3, "seconds": 1234.4, "untimed": 0}) == "1234"
    assert report.reused_cell({"entries": 3, "seconds": 10.0, "untimed": 2}) == "10 + 2 untimed"
