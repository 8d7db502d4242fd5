"""Execute the notebooks in order with papermill; skip the ones whose outputs are current."""
import json
import sys
import time
from pathlib import Path

from . import __version__, config, files, report as report_mod
from .config import NOTEBOOKS, Paths, list_notebooks


class RunError(RuntimeError):
    """A notebook failed or a request was invalid; the message is one line naming the fix."""


def select(only, folder: Path = NOTEBOOKS) -> list:
    """The notebooks named by --only ("01,03" or full stems), in workbook order; None means all of them.
    An empty or unknown name is an error naming --only and what it accepts."""
    stems = list_notebooks(folder)
    if only is None:
        return stems
    allowed = f"give notebook numbers or stems separated by commas, e.g. --only 00,03 (notebooks: {', '.join(s[:2] for s in stems)})"
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


def parameters(stem: str, profile: str, folder: Path = NOTEBOOKS) -> dict:
    """The notebook's parameters for a profile, from notebooks/params/<stem>.json."""
    config.check_choice("profile", profile, config.PROFILES)
    path = Path(folder) / "params" / f"{stem}.json"
    if not path.is_file():
        raise RunError(f"{path} is missing; every notebook needs a parameter file with one entry per profile")
    table = files.read_json(path)
    if profile not in table:
        raise RunError(f"{path} has no {profile!r} entry; add one (profiles: {', '.join(config.PROFILES)})")
    return {"profile": profile, **table[profile]}


def package_digest() -> str:
    """Hash of the package's source, so a code change re-executes the notebooks."""
    srcs = sorted((config.ROOT / "replication").rglob("*.py"))
    return files.digest(__version__, *[p.read_bytes() for p in srcs])


def data_digest() -> str:
    """Hash of data/ (the papers' numbers and the generated datasets the notebooks read)."""
    data = config.ROOT / "data"
    srcs = sorted(p for p in data.rglob("*") if p.is_file()) if data.is_dir() else []
    return files.digest(*[x for p in srcs for x in (str(p.relative_to(data)), p.read_bytes())])


def stamp(stem: str, params: dict, folder: Path = NOTEBOOKS) -> str:
    """Identity of one execution: the notebook, its parameters and the package."""
    return files.digest((Path(folder) / f"{stem}.ipynb").read_bytes(), params, package_digest())


def machine() -> str:
    """What CPU numerics depend on besides the code: the architecture and the thread count the kernels get."""
    import os
    import platform

    return f"{platform.machine()}, threads {os.environ.get('OMP_NUM_THREADS') or f'default ({os.cpu_count()} cpus)'}"


def stamp_parts(stem: str, params: dict, folder: Path = NOTEBOOKS) -> dict:
    """The stamp's parts one by one, and data/ and the machine: kept beside the figure digests to say why a
    figure changed."""
    return {"notebook": files.digest((Path(folder) / f"{stem}.ipynb").read_bytes()), "params": files.digest(params),
            "package": package_digest(), "data": data_digest(), "machine": machine()}


def execute(stem: str, profile: str, folder: Path = NOTEBOOKS, force: bool = False, log=print) -> str:
    """Run one notebook unless current; return 'skipped' or 'executed'. Raises RunError on failure."""
    import papermill as pm

    paths, params = Paths(profile), parameters(stem, profile, folder)
    key = stamp(stem, params, folder)
    if not force and paths.is_current(stem, key):
        log(f"[{stem}] current, skipped (use --force to re-execute)")
        return "skipped"
    paths.notebooks.mkdir(parents=True, exist_ok=True)
    partial = paths.notebooks / f"{stem}.partial.ipynb"
    metrics = paths.metrics / f"{stem}.json"
    log(f"[{stem}] executing with profile {profile!r}: {json.dumps(params)}")
    parts = stamp_parts(stem, params, folder)
    t0 = time.time()
    try:
        pm.execute_notebook(str(Path(folder) / f"{stem}.ipynb"), str(partial), parameters=params,
                            cwd=str(folder), progress_bar=True, kernel_name="python3", log_output=False)
    except pm.PapermillExecutionError as e:
        raise RunError(f"{stem} failed at cell {e.cell_index} (execution count {e.exec_count}): "
                       f"{e.ename}: {e.evalue.splitlines()[0] if e.evalue else ''} | partly executed notebook: {partial}") from None
    except Exception as e:  # noqa: BLE001 - a dead kernel or a timeout: one line, and the rerun resumes here
        raise RunError(f"{stem} stopped ({type(e).__name__}: {e}); rerun to resume from it | "
                       f"partly executed notebook: {partial}") from None
    if not metrics.is_file() or metrics.stat().st_mtime < t0:
        raise RunError(f"{stem} ran but wrote no metrics; end it with run.finish() | notebook: {partial}")
    partial.replace(paths.executed(stem))
    files.write_json(paths.state / f"{stem}.json", {"stamp": key, "params": params, "seconds": round(time.time() - t0, 1)})
    written = [name for f in files.read_json(metrics)["figures"] for name in f["files"]]
    report_mod.record_digests(profile, stem, parts, key, written, log)
    log(f"[{stem}] done in {time.time() - t0:.0f} s")
    return "executed"


def run(profile: str = "default", only=None, force: bool = False, folder: Path = NOTEBOOKS, report: bool = True,
        log=print) -> dict:
    """Execute the selected notebooks in order, then write the figure index and the HTML report."""
    config.check_choice("profile", profile, config.PROFILES)
    stems = select(only, folder)
    outcome = {}
    for stem in stems:
        outcome[stem] = execute(stem, profile, folder, force, log)
    if report:
        index = report_mod.write_index(profile, folder)
        html = report_mod.write_html(profile, folder)
        log(f"index: {index}\nreport: {html}")
    return outcome


def main(argv=None) -> int:
    """`python -m replication run ...` with one-line errors."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m replication run", description="Execute the workbook's notebooks.")
    ap.add_argument("--profile", default="default", help="smoke | default | paper (default: default)")
    ap.add_argument("--only", default=None, help="comma-separated notebook numbers or stems, e.g. 00,01")
    ap.add_argument("--force", action="store_true", help="re-execute notebooks whose outputs are current")
    ap.add_argument("--no-report", action="store_true", help="skip the figure index and the HTML report")
    ap.add_argument("--notebooks", default=str(NOTEBOOKS), help="folder of notebooks (default: notebooks/)")
    args = ap.parse_args(argv)
    try:
        run(args.profile, args.only, args.force, folder=Path(args.notebooks), report=not args.no_report)
    except (RunError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted; notebooks already done are kept, rerun the same command to resume", file=sys.stderr)
        return 130
    return 0
