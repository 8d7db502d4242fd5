"""The committed results store (core.store): round trip, damaged and stale entries, weights left out, no pickles."""
import gzip
import json
import os

import pandas as pd
import pytest
import torch

from replication.core import cache, files, phases, store, store_update
from replication.lm import loop, models

NB = "00_setup_and_baselines"


@pytest.fixture
def made(tmp_path, monkeypatch):
    """A default run's cache with a value, a table, a weights entry and a finished training run, copied into a
    store by store.update; then the run folder is emptied and the store made the active one."""
    monkeypatch.setenv("REPLICATION_STORE", "off")
    cache_root = tmp_path / "runs/default/cache"
    folder = cache_root / NB
    cache.cached(folder, "replies", {"n": 3}, lambda: {"texts": ["a", "b", "c"], "acc": 0.5})
    cache.cached(folder, "table", {"n": 2}, lambda: pd.DataFrame({"x": [1, 2], "y": [0.25, 0.5]}))
    cache.cached(folder, "stage", {"arm": "a"}, lambda: {"weights": {"w": torch.ones(2, 3)}, "logs": [{"loss": 1.0}]})
    model, _ = models.tiny_model(seed=0)
    model = models.add_lora(model, r=2, alpha=4)
    opt = torch.optim.SGD(list(loop.trainable(model).values()), lr=0.1)
    run = loop.RunFolder.keyed(folder / "training", "arm", {"lr": 0.1})
    rows, _ = loop.run(lambda step, state: state.update(n=state.get("n", 0) + 1) or {"loss": 1.0 / (step + 1)}, 4,
                       model, opt, run, save_every=2, progress=False)
    root = tmp_path / "store"
    counts = store_update.update(cache_root, root, log=lambda *_: None)
    assert counts[NB] == {"added": 4, "kept": 0, "replaced": 0, "withheld": 1}
    fresh = tmp_path / "runs/default-scratch/cache"
    monkeypatch.setenv("REPLICATION_STORE", str(root))
    return {"root": root, "cache": fresh / NB, "rows": rows, "model": model, "opt": opt, "source": cache_root}


def never():
    raise AssertionError("made again although the store holds it")


def test_round_trip_update_verify_load(made):
    root, folder = made["root"], made["cache"]
    assert store_update.verify(root, log=lambda *_: None) == []
    man = files.read_json(root / f"{NB}.json")
    assert man["version"] == store.version(NB) and man["code"] == store_update.fingerprint(NB)
    entry = man["entries"]["training/arm-" + files.digest({"lr": 0.1})]
    assert entry["kind"] == "run" and entry["made"]["cpu"] and entry["made"]["torch"] == torch.__version__
    assert not list(root.rglob("*.pt")) and all(p.suffix in (".json", ".gz") for p in root.rglob("*") if p.is_file())
    assert cache.cached(folder, "replies", {"n": 3}, never) == {"texts": ["a", "b", "c"], "acc": 0.5}
    assert cache.cached(folder, "table", {"n": 2}, never).equals(pd.DataFrame({"x": [1, 2], "y": [0.25, 0.5]}))
    stage = cache.cached(folder, "stage", {"arm": "a"}, never)
    assert stage["logs"] == [{"loss": 1.0}] and store.withheld_in(stage["weights"])
    counts = store.tally(folder)
    assert counts["from_store"] == 3 and counts["made_now"] == 0
    assert store.claim_source("real model", counts) == "results store"
    assert store.claim_source("simulation", counts) == "computed now"


def test_a_rerun_that_changes_nothing_changes_no_file(made):
    root = made["root"]
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    counts = store_update.update(made["source"], root, log=lambda *_: None)
    assert counts[NB]["kept"] == 4 and counts[NB]["added"] == 0
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


def test_a_run_cut_off_is_stored_as_part_of_a_run_and_completed_later(made, capsys):
    """A run of many hours spans sessions that each start from a fresh clone: what it made goes into the store marked
    as part of a run, the runner's first lines and the remake check say so, and the finished run's update clears it."""
    from replication.run import results, runner

    root, source = made["root"], made["source"]
    man = files.read_json(root / f"{NB}.json")
    assert man["complete"] is False and not store_update.complete(man)      # the fixture's run wrote no state file
    assert "part of 00 (a run cut off: the rest): made now" in runner.store_gaps([NB], root)
    assert results.remake(1, root, [NB], log=print) == []
    assert "holds part of its run (cut off); nothing re-made" in capsys.readouterr().out
    state = source.parent / "state" / f"{NB}.json"
    files.write_json(state, {"stamp": "x"})                               # the runner's mark of a finished execution
    store_update.update(source, root, log=lambda *_: None)
    assert store_update.complete(files.read_json(root / f"{NB}.json")) and runner.store_gaps([NB], root) == ""
    os.utime(state, (1, 1))                                                # an entry newer than the finished execution
    store_update.update(source, root, log=lambda *_: None)
    assert not store_update.complete(files.read_json(root / f"{NB}.json"))
    assert store_update.complete({"entries": {}})                          # manifests from before the mark


def test_a_finished_run_without_weights_returns_its_log_and_its_state(made):
    model, _ = models.tiny_model(seed=0)
    model = models.add_lora(model, r=2, alpha=4)
    opt = torch.optim.SGD(list(loop.trainable(model).values()), lr=0.1)
    run = loop.RunFolder.keyed(made["cache"] / "training", "arm", {"lr": 0.1})
    assert run.done and run.from_store and run.latest() is None
    rows, state = loop.run(lambda step, state: never(), 4, model, opt, run, save_every=2, progress=False)
    assert [r["loss"] for r in rows] == [r["loss"] for r in made["rows"]] and state == {"n": 4}
    short, state2 = loop.run(lambda step, state: never(), 2, model, opt, run, save_every=2, progress=False)
    assert len(short) == 2 and state2 == {"n": 2}   # the state the store kept after step 2
    with pytest.raises(models.WeightsMissing, match="--retrain"):   # its weights are not there: one line
        model(input_ids=torch.tensor([[1, 2, 3]]))
    with pytest.raises(models.WeightsMissing, match=f"the missing entry: {NB}/evaluation-"):
        cache.cached(made["cache"], "evaluation", {"of": "arm"}, lambda: model(input_ids=torch.tensor([[1, 2]])))
    loop.load_weights(model, made["source"] / NB / "training" / run.path.name / "checkpoints/step_000004.pt")
    model(input_ids=torch.tensor([[1, 2, 3]]))   # weights loaded again: it computes


def test_a_damaged_entry_is_rebuilt_with_one_line(made, capsys):
    root, folder = made["root"], made["cache"]
    man = files.read_json(root / f"{NB}.json")
    ident = "replies-" + files.digest({"n": 3})
    obj = root / man["entries"][ident]["object"]
    obj.write_bytes(gzip.compress(b'{"texts": ["tampered"], "acc": 1.0}', mtime=0))
    lines = []
    assert cache.cached(folder, "replies", {"n": 3}, lambda: {"made": "again"}) == {"made": "again"}
    value, status = cache.load(cache.path_for(folder, "replies", {"n": 3}), {"n": 3})
    assert value == {"made": "again"} and status == "ok"
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "checksum" in out and "made again" in out
    assert store_update.verify(root, log=lines.append) and any("checksum" in x for x in lines)


def test_a_mismatched_key_is_never_read(made):
    root, folder = made["root"], made["cache"]
    path = root / f"{NB}.json"
    man = files.read_json(path)
    man["entries"]["replies-" + files.digest({"n": 3})]["key"] = {"n": 4}
    files.write_json(path, man)
    assert cache.cached(folder, "replies", {"n": 3}, lambda: "new") == "new"


def test_a_changed_producer_version_recomputes_its_entries(made, monkeypatch):
    monkeypatch.setitem(store.VERSIONS, NB, store.version(NB) + 1)
    assert cache.cached(made["cache"], "replies", {"n": 3}, lambda: "remade") == "remade"
    assert not loop.RunFolder.keyed(made["cache"] / "training", "arm", {"lr": 0.1}).done
    assert store_update.verify(made["root"], log=lambda *_: None)   # and verify says the entries are stale


def test_a_set_run_reads_the_store_but_never_writes_into_it(made, tmp_path):
    root = made["root"]
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    other = tmp_path / "runs/default-set-0123abcd/cache" / NB
    assert cache.cached(other, "replies", {"n": 3}, never)["acc"] == 0.5      # untouched entries: from the store
    assert cache.cached(other, "replies", {"n": 30}, lambda: "new") == "new"   # a changed key: made, in the run folder
    assert cache.path_for(other, "replies", {"n": 30}).is_dir()
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


def test_off_reads_nothing(made, monkeypatch):
    monkeypatch.setenv("REPLICATION_STORE", "off")
    assert cache.cached(made["cache"], "replies", {"n": 3}, lambda: "made") == "made"


def test_a_planted_pickle_is_refused(made, tmp_path):
    root, folder = made["root"], made["cache"]
    flag = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {flag}",))

    import io
    import pickle

    buf = io.BytesIO()
    pickle.dump(Payload(), buf)
    data = buf.getvalue()
    path = root / f"{NB}.json"
    man = files.read_json(path)
    ident = "replies-" + files.digest({"n": 3})
    sha, rel, size = store_update._put_object(root, data)
    man["entries"][ident].update(kind="torch", sha256=sha, object=rel)
    files.write_json(path, man)
    assert cache.cached(folder, "replies", {"n": 3}, lambda: "safe") == "safe"
    assert not flag.exists()
    assert any("not plain data" in p for p in store_update.verify(root, log=lambda *_: None))


def test_torch_entries_are_read_without_unpickling_code(tmp_path, monkeypatch):
    """A local torch entry is read with weights_only=True: a pickle that would run code is refused."""
    import pickle

    flag = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {flag}",))

    path = cache.path_for(tmp_path / "cache" / NB, "x", {"a": 1})
    cache.store(path, {"a": 1}, {"w": torch.zeros(2)})
    data = pickle.dumps(Payload())
    (path / "value.pt").write_bytes(data)
    meta = files.read_json(path / "meta.json")
    files.write_json(path / "meta.json", {**meta, "sha256": cache._sha(data)})
    with pytest.raises(Exception):
        cache.load(path, {"a": 1})
    assert not flag.exists()


def test_fingerprint_ignores_docstrings_and_comments_but_not_statements():
    a = store_update._normalised('def f(x):\n    """Doc."""\n    return x + 1  # note\n')
    b = store_update._normalised('def f(x):\n\n    return x + 1\n')
    c = store_update._normalised('def f(x):\n    return x + 2\n')
    assert a == b != c


def test_a_new_notebooks_parameters_leave_the_other_fingerprints_alone(tmp_path, monkeypatch):
    """A new paper folder with its params.py (an eighth notebook) moves no stored notebook's fingerprint; a change to
    a notebook's own parameter module moves its fingerprint."""
    import shutil

    from replication.core import config

    shutil.copytree(config.ROOT / "replication", tmp_path / "replication",
                    ignore=shutil.ignore_patterns("__pycache__", "*.md"))
    monkeypatch.setattr(config, "ROOT", tmp_path)
    nb = "01_noise_analysis"
    before = store_update.fingerprint(nb)
    folder = tmp_path / "replication" / "papers" / "a_new_paper"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "params.py").write_text('from dataclasses import dataclass\n\n'
                                   'from replication.core.params import Params, notebook, p\n\n\n'
                                   '@notebook("99_a_new_paper")\n@dataclass\nclass NewPaper(Params):\n'
                                   '    votes: int = p()\n')
    assert store_update.fingerprint(nb) == before
    own = tmp_path / "replication" / "papers" / "elo_evolve" / "params.py"
    own.write_text(own.read_text() + "\nEXTRA = 1\n")
    assert store_update.fingerprint(nb) != before


def test_every_stored_notebook_matches_its_code_or_its_version_was_bumped():
    """A producer's code changed and its version did not: bump store.VERSIONS (its entries are remade) or, when the
    change changes no result, `python -m replication store accept NN`."""
    root = store.default_root()
    stale = []
    for path in sorted(root.glob("*.json")):
        man = files.read_json(path)
        nb = man["notebook"]
        if man.get("version") == store.version(nb) and man.get("code") != store_update.fingerprint(nb):
            stale.append(nb)
    assert not stale, f"code changed under the same producer version: {stale}"


def test_the_committed_store_is_intact_and_small():
    root = store.default_root()
    assert store_update.verify(root, log=lambda *_: None) == []
    assert store.summary(root)["bytes"] <= 40 * 2**20


def test_retrain_names_notebooks_as_only_does(tmp_path):
    from replication.run import runner

    stems = ["00_a", "01_b", "03_c"]
    for s in stems:
        (tmp_path / f"{s}.ipynb").write_text("{}")
    assert runner.retrained(None, stems, tmp_path) == set()
    assert runner.retrained("all", stems, tmp_path) == set(stems)
    assert runner.retrained("03", stems, tmp_path) == {"03_c"}
    with pytest.raises(runner.RunError, match="--retrain"):
        runner.retrained("9", stems, tmp_path)


def test_execution_token_marks_what_this_execution_made(tmp_path):
    folder = tmp_path / "cache" / NB
    cache.cached(folder, "v", {"k": 1}, lambda: 1)
    assert store.tally(folder)["made_now"] == 1
    phases.new_execution()
    assert store.tally(folder) == {"from_store": 0, "made_now": 0, "store": None}


BODY = """
import os
from replication.run import workbook
run = workbook.start("{stem}", profile=profile, seed=seed)
value = run.cached("pid", {{"n": n}}, lambda: {{"pid": os.getpid()}})
run.claim("made by a process", "-", str(value["pid"]), "real model", "counted", holds=True)
run.finish()
"""


def test_the_runner_reads_the_store_and_retrain_ignores_it(tmp_path, monkeypatch):
    """End to end through papermill: a first run's entry goes to a store; a fresh run folder reads it from there (the
    first line says so, the claim and the notebook are marked); --retrain makes it anew."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    from replication.run import runner

    book = tmp_path / "notebooks"
    (book / "params").mkdir(parents=True)
    nb = new_notebook()
    cell = new_code_cell("profile = 'default'\nseed = 0\nn = 3")
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, new_code_cell(BODY.format(stem="01_first"))]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, book / "01_first.ipynb")
    (book / "params" / "01_first.json").write_text('{"default": {}, "smoke": {}}')

    def run_in(name, **kw):
        monkeypatch.setenv("REPLICATION_RUNS", str(tmp_path / name / "runs"))
        monkeypatch.setenv("REPLICATION_FIGURES", str(tmp_path / name / "figures"))
        lines = []
        runner.run("default", folder=book, report=False, log=lines.append, **kw)
        rec = files.read_json(tmp_path / name / "runs/default/metrics/01_first.json")
        return lines, rec

    _, first = run_in("first")
    assert first["results_store"] == {"from_store": 0, "made_now": 1, "store": None}
    root = tmp_path / "store"
    store_update.update(tmp_path / "first/runs/default/cache", root, log=lambda *_: None, notebooks=book)
    monkeypatch.setenv("REPLICATION_STORE", str(root))
    lines, second = run_in("second")
    assert lines[0].startswith("results store of ") and "1 entries" in lines[0] and "--retrain" in lines[0]
    assert second["claims"][0]["measured"] == first["claims"][0]["measured"]
    assert second["results_store"]["from_store"] == 1 and second["results_store"]["made_now"] == 0
    assert second["claims"][0]["source"] == "results store"
    _, third = run_in("second", retrain="01")   # the same run folder, the notebook current: retrain still runs it
    assert third["claims"][0]["measured"] != first["claims"][0]["measured"]
    assert third["results_store"]["from_store"] == 0 and third["claims"][0]["source"] == "computed now"


def test_remake_picks_the_cheapest_fp32_entries(tmp_path):
    """CI re-makes each notebook's cheapest fp32 entry: the fewest seconds to make, never a bf16 one or a training run."""
    from replication.run import results

    entries = {"slow-1": {"kind": "json", "key": {"dtype": "float32"}, "seconds": 300.0, "made_at": 1},
               "quick-2": {"kind": "frame", "key": {"n": 3}, "seconds": 20.0, "made_at": 2},
               "bf16-3": {"kind": "json", "key": {"dtype": "bfloat16"}, "seconds": 1.0, "made_at": 3},
               "training/run-4": {"kind": "run", "key": {}, "seconds": 0.5, "made_at": 4},
               "untimed-5": {"kind": "json", "key": {}, "seconds": None, "made_at": 0}}
    (tmp_path / "07_example.json").write_text(json.dumps({"notebook": "07_example", "entries": entries}))
    assert results.candidates(tmp_path, "07_example", 1) == ["quick-2"]
    assert results.candidates(tmp_path, "07_example", 3) == ["quick-2", "slow-1", "untimed-5"]



def test_a_remade_entry_agrees_up_to_fp32_rounding_and_nothing_more():
    """Another CPU may add a sum's terms in another order: floats may move in the last digits, nothing else may."""
    from replication.run import results

    old = {"arrays": {"probs": [0.5328382849693298, 0.1178], "scores": [1, 5]}, "text": ["The answer is 3."],
           "nan": float("nan")}
    ok, text = results.same_values(old, json.loads(json.dumps(old)))
    assert ok and text.startswith("0 of 3 floats")
    moved = json.loads(json.dumps(old))
    moved["arrays"]["probs"][0] = 0.5328383445739746           # one fp32 step (2^-24 relative) away
    ok, text = results.same_values(old, moved)
    assert ok and text.startswith("1 of 3 floats differ") and "1.1e-07" in text
    for change, where in ((lambda v: v["arrays"]["probs"].__setitem__(1, 0.1179), "value.arrays.probs[1]"),
                          (lambda v: v["arrays"]["scores"].__setitem__(0, 2), "value.arrays.scores[0]"),
                          (lambda v: v["arrays"]["scores"].__setitem__(0, 1.0), "value.arrays.scores[0]"),
                          (lambda v: v["text"].__setitem__(0, "The answer is 4."), "value.text[0]"),
                          (lambda v: v["text"].append("x"), "value.text: 1 items against 2"),
                          (lambda v: v.pop("nan"), "value: keys ['nan'] in one only")):
        changed = json.loads(json.dumps(old))
        change(changed)
        ok, text = results.same_values(old, changed)
        assert not ok and text.startswith(where), (where, text)


def test_the_keys_the_notebooks_build_from_their_defaults_name_stored_entries():
    """The package builds each notebook's cache keys from run.params; for the committed default parameters they must
    be the keys the store's entries were made under (a changed key would silently retrain, not read the store)."""
    from replication.run import settings  # noqa: F401  (registers the parameter classes)
    from replication.core import config, files, params
    from replication.lm import tasks
    from replication.papers.elo_evolve import evolve_runs, judging, noise
    from replication.setup import yardstick

    def defaults(stem):
        return params.build(stem, params.cell_values(config.ROOT / "notebooks" / f"{stem}.ipynb"))

    def stored(stem, name, key):
        return f"{name}-{files.digest(key)}" in store.manifest(store.default_root(), stem)["entries"]

    P = defaults("00_setup_and_baselines")
    keys = yardstick.keys(P)
    for name, which in (("base_replies", "replies"), ("sampling_table", "sampling"), ("yardstick_base", "base")):
        assert stored("00_setup_and_baselines", name, keys[which]), name
    assert stored("01_noise_analysis", "judged", noise.judge_key(defaults("01_noise_analysis")))
    P = defaults("02_elo_dynamics")
    _, heldout = tasks.split(P.level, P.n_train, P.n_heldout, seed=P.seed)
    reference, _ = evolve_runs.keys(P, heldout, judging.quality_noise(P.sigma_comp, P.abs_noise_ratio)["sigma_abs"])
    assert stored("02_elo_dynamics", "evolve_reference", reference)
    assert not stored("02_elo_dynamics", "evolve_reference", {**reference, "shots": P.shots + 1})
    from replication.papers.mae import mae_runs

    P = defaults("06_multi_agent_evolve")
    _, heldout = tasks.split(P.seed_level, P.n_seed_questions, P.n_heldout, P.seed, eval_level=P.heldout_level)
    keys = mae_runs.Keys(P, heldout, tasks.worked_examples(P.seed_level, P.shots, P.seed))
    for name, key in (("heldout-base", keys.heldout), ("heldout-base-sampled", keys.sampled),
                      ("judge-base-prefill", keys.judge), ("judge-base-free", keys.probe),
                      ("questions-base", keys.corpus(heldout[:P.n_question_problems]))):
        assert stored("06_multi_agent_evolve", name, key), name


def test_store_info_into_a_pipe_closed_early_ends_quietly():
    """`python -m replication store info | head -1`: the reader closes the pipe; no traceback on stderr."""
    import subprocess
    import sys

    from replication.core import config

    proc = subprocess.Popen([sys.executable, "-m", "replication", "store", "info"], cwd=config.ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(config.ROOT), "OMP_NUM_THREADS": "1"})
    first = proc.stdout.readline()
    proc.stdout.close()                     # as `head -1` does after its line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert first.startswith(b"/") or b"entries" in first
    assert "Traceback" not in err and "BrokenPipe" not in err, err
