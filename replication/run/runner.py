"""Execute the notebooks in order with papermill; skip the ones whose outputs are current.

Only the runner writes the committed results (figures/, runs/<profile>/metrics/): each notebook's figures and
metrics are staged and promoted when it succeeds, and the skip stamp records their sha256."""
import contextlib
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import nbformat

from replication.core import config, console, files, offline, params, store, store_update
from replication.core.config import BF16_FLAGS, NOTEBOOKS, Paths, cpu_bf16, list_notebooks  # noqa: F401
from replication.ledger import compare, digests, provenance, report as report_mod
from . import settings  # noqa: F401  (registers the notebooks' parameter classes, for --set checks)


class RunError(RuntimeError):
    """A notebook failed or a request was invalid; the message is one line naming the fix."""


def select(only, folder: Path = NOTEBOOKS) -> list:
    """The notebooks named by --only ("01,03" or full stems), in workbook order; None means all of them.
    An empty or unknown name is an error naming --only and what it accepts."""
    stems = list_notebooks(folder)
    if only is None:
        return stems
    allowed = f"give notebook numbers or stems separated by commas or spaces, e.g. --only 00,03 (notebooks: {', '.join(s[:2] for s in stems)})"
    wanted = [str(w).strip() for w in (only.split(",") if isinstance(only, str) else only)]
    if not wanted or "" in wanted:
        raise RunError(f"--only {only!r} is not allowed: it has an empty name; {allowed}")
    chosen = set()
    for w in wanted:
        key = w.zfill(2) if w.isdigit() else w
        hits = [s for s in stems if s == key or s[:2] == key]
        if not hits:
            raise RunError(f"--only {w!r} names no notebook; {allowed}")
        chosen.update(hits)
    return [s for s in stems if s in chosen]


def parameters(stem: str, profile: str, folder: Path = NOTEBOOKS, overrides: dict = None) -> dict:
    """The notebook's parameters for a profile (notebooks/params/<stem>.json), then those one-off overrides (--set)
    that name parameters of its cell (run() checks that each names one in some selected notebook), checked by its
    typed parameters (params.build); every model-valued parameter must be loadable without a download the profile
    may not make (offline.model_problem)."""
    try:
        values = {"profile": profile, **params.profile_values(stem, profile, folder)}
    except ValueError as e:
        raise RunError(str(e)) from None
    cell = params.cell_values(Path(folder) / f"{stem}.ipynb")
    if overrides:
        if "profile" in overrides:
            raise RunError("--set profile=... is not allowed; pick the profile with --profile")
        values.update({k: v for k, v in overrides.items() if k in cell})
        try:
            params.build(stem, {**cell, **values})
        except ValueError as e:
            raise RunError(f"--set for {stem}: {e}") from None
    for name, value in offline.model_parameters({**cell, **values}).items():
        problem = offline.model_problem(value, profile)
        if problem:
            raise RunError(f"{name}={value!r} is not allowed for {stem}: {problem}")
    return values


def override_scope(stems, folder: Path, overrides: dict) -> list:
    """A --set name applies to the selected notebooks that have that parameter: an error when none has it, else one
    line per name that some selected notebooks lack (it is not applied there)."""
    if not overrides:
        return []
    cells = {stem: params.cell_values(Path(folder) / f"{stem}.ipynb") for stem in stems}
    lines = []
    for name in overrides:
        have = [s for s in stems if name in cells[s]]
        if not have:
            known = "; ".join(f"{s}: {', '.join(n for n in cells[s] if n != 'profile')}" for s in stems)
            raise RunError(f"--set {name}=...: no selected notebook has a parameter {name!r} (parameters of {known})")
        if len(have) < len(stems):
            lines.append(f"--set {name}: applied to {', '.join(have)}; not to "
                         f"{', '.join(s for s in stems if s not in have)}, which have no parameter {name!r}")
    return lines


# Profiles sized for a GPU: on a machine without one they refuse in one line. The gpu profile runs the notebooks'
# own experiments bigger (or at CPU speed with --set device=cpu); the paper profile's settings (billions of
# parameters, the papers' batch sizes) name the command that runs each experiment at that scale instead
# (config.PAPER_SCALE, replication.scale).
NEEDS_GPU = ("gpu", "paper")
FINISHING = threading.Lock()   # the writes after a notebook succeeds (execute), one notebook at a time


def gpu_available() -> bool:
    """Whether torch sees a CUDA device (torch is imported only here, for the paper profile)."""
    import torch

    return torch.cuda.is_available()


def paper_refusal(stems, folder: Path) -> str:
    """The one line the paper profile prints on a machine without a GPU."""
    named = [f"{s[:2]}: python -m replication train {m} --config {c}" for s, (m, c) in config.PAPER_SCALE.items()
             if s in stems]
    return ("--profile paper needs a GPU (none is visible to torch here): it runs the notebooks at the papers' scale; "
            + ("run the experiments at that scale with TRL instead, " + "; ".join(named) if named else
               "the selected notebooks have no paper-scale training command")
            + " (docs/gpu.md, Running at paper scale); on a CPU use --profile default")


def parse_sets(pairs) -> dict:
    """--set name=value pairs as {name: value}; a value is read as JSON (100, 3e-4, true, null, [1, 2]), else kept
    as a string (--set level=2d-1step-add)."""
    out = {}
    for pair in pairs or []:
        name, eq, text = pair.partition("=")
        if not eq or not name.strip().isidentifier():
            raise RunError(f"--set {pair!r} is not allowed; use --set name=value, e.g. --set steps=100")
        try:
            out[name.strip()] = json.loads(text)
        except ValueError:
            out[name.strip()] = text
    return out


def folder_name(profile: str, overrides: dict = None) -> str:
    """The run folder under runs/: the profile, or <profile>-set-<hash of the overrides> for one-off overrides,
    so that they never write into figures/ or the profile's metrics."""
    return f"{profile}-set-{files.digest(overrides)[:8]}" if overrides else profile


def accelerator(device: str = "auto") -> str:
    """The device the notebook's models compute on, as its `device` parameter resolves here (models.describe_device:
    "cpu", or e.g. "cuda: NVIDIA H200 (CUDA 13.0)")."""
    from replication.lm import models

    return models.describe_device(device)


def promote(stem: str, paths: Paths, figure_files) -> None:
    """Move a notebook's figures, then its metrics, from the staging folder into place, file by file (each write
    atomic); called only when the notebook succeeded. The metrics are also copied beside the figures
    (figures/metrics/<stem>.json for the default profile, committed), so results can be diffed between versions."""
    staging = paths.staging(stem)
    for name in figure_files:
        if not (staging / "figures" / name).is_file():
            raise RunError(f"{stem}'s metrics name the figure file {name}, which it did not write under {staging}")
        files.write_bytes(paths.figures / name, (staging / "figures" / name).read_bytes())
    metrics = (staging / "metrics" / f"{stem}.json").read_bytes()
    files.write_bytes(paths.metrics / f"{stem}.json", metrics)
    files.write_bytes(paths.figures / "metrics" / f"{stem}.json", metrics)  # committed with the default figures
    shutil.rmtree(staging)


@contextlib.contextmanager
def kernel_env(name: str):
    """Environment for the kernels started inside: the run folder (config.RUNNER_ENV), and this package's checkout
    first on PYTHONPATH, so a kernel imports the same source as the runner (not another installed copy)."""
    root = str(config.ROOT)
    changes = {config.RUNNER_ENV: name,
               "PYTHONPATH": os.pathsep.join([root, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                     if p and p != root]])}
    with config.environ(changes):
        yield


def execute(stem: str, profile: str, folder: Path = NOTEBOOKS, force: bool = False, log=print,
            overrides: dict = None, retrain: bool = False) -> str:
    """Run one notebook unless current; return 'skipped' or 'executed'. Raises RunError on failure.

    The kernel learns from config.RUNNER_ENV that the runner runs it, and in which run folder: it writes its
    metrics and figures to a staging folder, promoted here only when the notebook succeeds. retrain: the kernel
    reads no results store (store.ENV "off") and the notebook executes even when current."""
    import papermill as pm

    params, paths = parameters(stem, profile, folder, overrides), Paths(profile, folder_name(profile, overrides))
    key = provenance.stamp(stem, params, folder)
    force = force or retrain
    if not force and paths.is_current(stem, key):
        log(f"[{stem}] current, skipped (use --force to re-execute)")
        return "skipped"
    if not force and paths.recorded(stem).get("stamp") == key:
        log(f"[{stem}] its figures or metrics changed or went missing since the runner wrote them: re-executing")
    paths.notebooks.mkdir(parents=True, exist_ok=True)
    partial = paths.notebooks / f"{stem}.partial.ipynb"
    staging = paths.staging(stem)
    shutil.rmtree(staging, ignore_errors=True)
    log(f"[{stem}] executing with profile {profile!r}: {json.dumps(params)}"
        + (f" (one-off overrides: outputs in {paths.root})" if overrides else ""))
    parts = provenance.stamp_parts(stem, params, folder, accelerator(params.get("device", "auto")))
    t0 = time.time()
    source = Path(folder) / f"{stem}.ipynb"
    console.quiet()
    bar = console.Progress(stem, len(nbformat.read(source, as_version=4).cells) + 1)  # + papermill's injected cell
    done = False
    try:
        off = {store.ENV: "off"} if retrain and os.environ.get(store.ENV) != "off" else {}
        with kernel_env(paths.name), config.environ(off):
            pm.execute_notebook(str(source), str(partial), parameters=params, cwd=str(folder), progress_bar=False,
                                kernel_name="python3", log_output=False, engine_name=bar.engine(),
                                extra_arguments=console.KERNEL_ARGS, on_cell_start=bar.cell_start)
        done = True
    except pm.PapermillExecutionError as e:
        raise RunError(f"{stem} failed at cell {e.cell_index} (execution count {e.exec_count}): "
                       f"{e.ename}: {e.evalue.splitlines()[0] if e.evalue else ''} | partly executed notebook: {partial}") from None
    except Exception as e:  # noqa: BLE001 - a dead kernel or a timeout: one line, and the rerun resumes here
        raise RunError(f"{stem} stopped ({type(e).__name__}: {e}); rerun to resume from it | "
                       f"partly executed notebook: {partial}") from None
    finally:
        bar.close(done)
    metrics = staging / "metrics" / f"{stem}.json"
    if not metrics.is_file():
        raise RunError(f"{stem} ran but wrote no metrics; end it with run.finish() | notebook: {partial}")
    written = [name for f in files.read_json(metrics)["figures"] for name in f["files"]]
    with FINISHING:   # notebooks run side by side (--jobs) write shared files here (figures/, the digests) one at a time
        before = compare.previous(paths, stem)
        promote(stem, paths, written)
        partial.replace(paths.executed(stem))
        files.write_json(paths.state / f"{stem}.json", {"stamp": key, "params": params, "seconds": round(time.time() - t0, 1),
                                                        "outputs": paths.outputs(stem, written)})
        digests.record_digests(profile, stem, parts, key, written, log, name=paths.name)
        compare.log_changes(stem, before, files.read_json(paths.metrics / f"{stem}.json"), log)
    log(f"[{stem}] done in {time.time() - t0:.0f} s")
    return "executed"


def side_by_side(stems, jobs: int, execute_one, name: str) -> dict:
    """Execute notebooks `jobs` at a time, each kernel at one torch / OpenMP / MKL thread (two kernels at two
    threads each on two cores run 10x slower; two at one thread do about a third more work than one at two:
    `bench parallel`). Every notebook runs to its end; the first failure is raised after the others finish."""
    from concurrent.futures import ThreadPoolExecutor

    one = {v: "1" for v in config.THREAD_VARIABLES}
    with config.environ(one), kernel_env(name), ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {stem: pool.submit(execute_one, stem) for stem in stems}
        errors = [f.exception() for f in futures.values() if f.exception() is not None]
    if errors:
        raise errors[0]
    return {stem: f.result() for stem, f in futures.items()}


def retrained(retrain, stems, folder: Path = NOTEBOOKS) -> set:
    """The notebooks --retrain names among `stems`: none (None or False), all of them (True or "all"), or those
    named as --only names them ("03", "00,03")."""
    if not retrain:
        return set()
    if retrain is True or retrain == "all":
        return set(stems)
    try:
        named = set(select(retrain, folder))
    except RunError as e:
        raise RunError(str(e).replace("--only", "--retrain")) from None
    return named & set(stems)


def run(profile: str = "default", only=None, force: bool = False, folder: Path = NOTEBOOKS, report: bool = True,
        log=print, overrides: dict = None, jobs: int = 1, retrain=None) -> dict:
    """Execute the selected notebooks in order (or `jobs` side by side, each at one thread), then write the figure
    index and the HTML report. With one-off overrides (--set) everything goes to the run folder
    runs/<profile>-set-<hash>/. The default profile reads the committed results store (core.store) for what it
    holds, and says so first; `retrain` (True, or notebooks as --only names them) makes those notebooks' results
    from scratch instead."""
    config.check_choice("profile", profile, config.PROFILES)
    config.check_int("jobs", jobs)
    stems = select(only, folder)
    again = retrained(retrain, stems, folder)
    if jobs > 1 and len(stems) > 1 and again and again != set(stems):
        raise RunError("--retrain of some of the selected notebooks cannot run with --jobs > 1 (the kernels share "
                       "one environment); retrain them in a run of their own, or give --jobs 1")
    if profile == "default" and again != set(stems):
        reading = os.environ.get(store.ENV) != "off"
        root = store.active() or store.default_root()
        log(store.first_line(root) if reading else "results store: off (REPLICATION_STORE=off)")
        if reading and (gap := store_gaps([s for s in stems if s not in again], root)):
            log(gap)
    if profile in NEEDS_GPU and not (profile == "gpu" and (overrides or {}).get("device") == "cpu") and not gpu_available():
        raise RunError(paper_refusal(stems, folder) if profile == "paper" else
                       "--profile gpu needs a GPU (none is visible to torch here): its sizes take hours on a CPU; to run "
                       "them at CPU speed anyway add --set device=cpu, or use --profile default")
    for line in override_scope(stems, folder, overrides):
        log(line)
    for stem in stems:  # check every notebook's parameters, overrides and models before executing anything
        parameters(stem, profile, folder, overrides)
    everything = config.environ({store.ENV: "off"}) if again and again == set(stems) else contextlib.nullcontext()
    with everything:
        if jobs > 1 and len(stems) > 1:
            outcome = side_by_side(stems, jobs, lambda stem: execute(stem, profile, folder, force, log, overrides,
                                                                     stem in again), folder_name(profile, overrides))
        else:
            outcome = {stem: execute(stem, profile, folder, force, log, overrides, stem in again) for stem in stems}
    if report:
        name = folder_name(profile, overrides)
        index = report_mod.write_index(profile, folder, name)
        html = report_mod.write_html(profile, folder, name)
        log(f"index: {index}\nreport: {html}")
    return outcome


def checkout(folder) -> None:
    """Raise a ValueError with the fix unless the notebooks folder is there: the package reads its notebooks, data/
    and figures/ from the clone it is installed from, which a non-editable install leaves behind."""
    if not Path(folder).is_dir():
        raise ValueError(f"no notebooks at {folder}: this copy of replication is installed apart from its clone "
                         f"(a non-editable `pip install .`); in the clone run `pip install -e .` (as make does)")


def store_gaps(stems, root) -> str:
    """A line naming the notebooks of `stems` of which the store at `root` holds nothing or part of a run cut off
    (what it lacks is made now, which takes CPU hours for a training notebook), and how to read only the store; ""
    when it holds a finished run of each."""
    empty = [s for s in stems if not store.manifest(root, s)["entries"]]
    part = [s for s in stems if s not in empty and not store_update.complete(store.manifest(root, s))]
    if not empty and not part:
        return ""
    held = [s[:2] for s in stems if s not in empty + part]
    what = [f"the store holds nothing of {', '.join(s[:2] for s in empty)}"] if empty else []
    what += [f"part of {', '.join(s[:2] for s in part)} (a run cut off: the rest)"] if part else []
    return (f"{'; '.join(what)}: made now (hours on 2 cores: README)"
            + (f"; `--only {','.join(held)}` reads only the store" if held else ""))


def main(argv=None) -> int:
    """`python -m replication run ...` with one-line errors."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m replication run", description="Execute the workbook's notebooks.")
    ap.add_argument("--profile", default="default", help="smoke | default | gpu | paper (default: default)")
    ap.add_argument("--only", nargs="+", default=None, metavar="NOTEBOOKS",
                    help="notebook numbers or stems, comma- or space-separated, e.g. 00,01 or 00 01")
    ap.add_argument("--set", action="append", metavar="NAME=VALUE",
                    help="one-off parameter override (value read as JSON, else a string), e.g. --set steps=100; "
                         "outputs go to runs/<profile>-set-<hash>/")
    ap.add_argument("--force", action="store_true", help="re-execute notebooks whose outputs are current")
    ap.add_argument("--no-report", action="store_true", help="skip the figure index and the HTML report")
    ap.add_argument("--jobs", type=int, default=1, help="notebooks side by side, each at one thread (default 1; "
                                                         "2 on two cores does about a third more work per hour)")
    ap.add_argument("--retrain", nargs="?", const="all", default=None, metavar="NOTEBOOKS",
                    help="make every result from scratch instead of reading the results store (results/default/); "
                         "--retrain 03 just that notebook (numbers as --only takes them)")
    ap.add_argument("--notebooks", default=str(NOTEBOOKS), help="folder of notebooks (default: notebooks/)")
    args = ap.parse_args(argv)
    try:
        checkout(args.notebooks)
        only = None if args.only is None else ",".join(args.only)   # 00 01 as 00,01
        run(args.profile, only, args.force, folder=Path(args.notebooks), report=not args.no_report,
            overrides=parse_sets(args.set), jobs=args.jobs, retrain=args.retrain)
    except (RunError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted; notebooks already done are kept, rerun the same command to resume", file=sys.stderr)
        return 130
    return 0
