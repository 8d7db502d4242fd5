"""Independent training runs side by side: each in its own worker process at one torch thread.

On a CPU with few cores, two runs at one thread each can do more work per second than one run at two threads (a
small model's matmuls do not keep two threads busy), but only when each process keeps to its own thread (two
processes at two threads each oversubscribe two cores: docs/runner.md). On a GPU, runs in several processes keep it
busier than one run alone. `run_jobs(fn, jobs,
workers)` calls fn(**job) for every job, in that many spawned processes whose torch (and OpenMP/MKL) use one thread
and whose models go to the device this process uses (models.use_device), and returns the results in job order;
workers=1 calls them here, one after another, in this process. A job must seed everything it draws from (the
workbook's training runs do: LoRA init, draws and sampling all derive from their config's seed), so a result does
not depend on which worker ran it: the same as a run of the same job in one process at one thread (test). fn must
be a module-level function and the jobs' values picklable; a cached or resumable job (run.cached, run.run_folder)
writes its cache from the worker, so an interrupted parallel run resumes like a sequential one. The workers' phase
profiles come back with their results and are counted here (phases.absorb), so the notebook's profile still covers
the work. A worker whose parent process is gone (the notebook's kernel killed, a timeout) ends within about a second
instead of running its job on (`_exit_with_parent`); its cache is written atomically, so nothing half-made is kept.

`made_then_read` is the pattern every notebook's side-by-side work follows: the pieces not yet made (not in the
cache, run folder unfinished) are made in workers, then every piece is read back here in order, so later cells see
the same values and weights either way; a read-back of what a worker made in this execution is not reuse
(phases.made_here).
"""
import contextlib
import multiprocessing
import os
import pickle
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed

from tqdm.auto import tqdm

from replication.core import config, phases
from replication.lm import models


def _exit_with_parent(parent: int, every: float = 0.5) -> None:
    """Ends this process once its parent `parent` (a pid) is gone: a daemon thread that polls the parent's pid (a
    re-parented process reads another), since a worker busy in a job never reads the pool's closed pipes."""
    def watch():
        while os.getppid() == parent:
            time.sleep(every)
        os._exit(1)
    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _init(device: str, parent: int) -> None:
    _exit_with_parent(parent)
    import torch
    from transformers.utils import logging as hf_logging

    from replication.core import console

    torch.set_num_threads(1)
    models.use_device(device)
    console.quiet_warnings()   # the worker's stderr is the terminal's: only what the notebook would show
    hf_logging.disable_progress_bar()


def _call(fn, job: bytes) -> bytes:
    """fn(**job) in a worker, its job and its result pickled by value (standard pickle): a tensor then travels as its
    bytes, not as a file descriptor of shared memory, which torch's reductions would open per tensor (jobs that carry
    adapter weights, e.g. MALT's stages, ran out of descriptors)."""
    phases.reset()
    t0 = time.perf_counter()
    out = fn(**pickle.loads(job))
    return pickle.dumps((out, phases.snapshot(time.perf_counter() - t0)), protocol=pickle.HIGHEST_PROTOCOL)


def run_jobs(fn, jobs, workers: int = 1, progress: str = None) -> list:
    """[fn(**job) for job in jobs], in `workers` worker processes at one thread each when workers > 1 (module
    docstring); an error in a job is raised here, naming the job. progress: a bar of that name over the jobs done
    (None: no bar)."""
    config.check_int("workers", workers, minimum=1)
    jobs = list(jobs)
    bar = tqdm(total=len(jobs), desc=progress, disable=progress is None or not jobs)
    if workers == 1 or len(jobs) <= 1:
        out = []
        for job in jobs:
            out.append(fn(**job))
            bar.update()
        bar.close()
        return out
    one_thread = config.environ({k: "1" for k in config.THREAD_VARIABLES})  # read when torch loads in a worker
    phases.execution()   # set before the spawn: the workers inherit this execution's token (loop.run reads it)
    spawn = multiprocessing.get_context("spawn")
    t0 = time.perf_counter()
    with one_thread, ProcessPoolExecutor(min(workers, len(jobs)), mp_context=spawn, initializer=_init,
                                         initargs=(str(models.current_device()), os.getpid())) as pool:
        futures = {pool.submit(_call, fn, pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)): i
                   for i, job in enumerate(jobs)}
        done = {}
        for f in as_completed(futures):
            i = futures[f]
            try:
                done[i] = pickle.loads(f.result())
            except Exception as e:  # noqa: BLE001 - one line that says which job failed, the cause kept
                for other in futures:
                    other.cancel()
                raise RuntimeError(f"parallel job {i} of {len(jobs)} ({fn.__name__}) failed: {type(e).__name__}: {e}") from e
            bar.update()
    bar.close()
    phases.absorb([done[i][1] for i in range(len(jobs))], time.perf_counter() - t0)
    return [done[i][0] for i in range(len(jobs))]


def make_pending(fn, jobs: dict, workers: int, what: str) -> dict:
    """{id: fn(**job)} for each of `jobs` ({id: job}, the pieces still to make) side by side when workers > 1 (a bar
    named `what`); nothing when workers == 1 (the read-back makes them here) or there are none."""
    config.check_int("workers", workers, minimum=1)
    if workers == 1 or not jobs:
        return {}
    return dict(zip(jobs, run_jobs(fn, list(jobs.values()), workers, progress=f"{what} ({workers} side by side)")))


def read_in_order(ids, read, made) -> list:
    """[read(i) for i in ids], each inside phases.made_here() when a worker made it in this execution (`made`: those
    ids), so loading it is not counted as reuse."""
    out = []
    for i in ids:
        with phases.made_here() if i in made else contextlib.nullcontext():
            out.append(read(i))
    return out


def made_then_read(ids, pending, fn, read, workers: int = 1, what: str = "runs"):
    """The module docstring's pattern: pending(i) gives fn's job for a piece still to make (None when it is made
    already); with workers > 1 those jobs run side by side first (make_pending), then read(i) for every id in order
    (read_in_order), which makes a piece here when workers == 1. Returns ([read(i)], {id: fn's result} of the pieces
    the workers made)."""
    config.check_int("workers", workers, minimum=1)
    ids = list(ids)
    jobs = {} if workers == 1 else {i: job for i in ids if (job := pending(i)) is not None}
    made = make_pending(fn, jobs, workers, what)
    return read_in_order(ids, read, made), made
