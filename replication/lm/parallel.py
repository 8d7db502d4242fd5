"""Independent training runs side by side: each in its own worker process at one torch thread.

On a CPU with few cores, two runs at one thread each can do more work per second than one run at two threads (a
small model's matmuls do not keep two threads busy), but only when each process keeps to its own thread: two
processes at two threads each on two cores ran 10x slower here. `run_jobs(fn, jobs, workers)` calls fn(**job) for
every job, in that many spawned processes whose torch (and OpenMP/MKL) use one thread, and returns the results in
job order; workers=1 calls them here, one after another, in this process. A job must seed everything it draws from
(the workbook's training runs do: LoRA init, draws and sampling all derive from their config's seed), so a result
does not depend on which worker ran it: the same as a run of the same job in one process at one thread (test).
fn must be a module-level function and the jobs' values picklable; a cached or resumable job (run.cached,
run.run_folder) writes its cache from the worker, so an interrupted parallel run resumes like a sequential one.
"""
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

from replication.core import config

def _init() -> None:
    import torch

    torch.set_num_threads(1)


def _call(fn, job: dict):
    return fn(**job)


def run_jobs(fn, jobs, workers: int = 1) -> list:
    """[fn(**job) for job in jobs], in `workers` worker processes at one thread each when workers > 1 (module
    docstring); an error in a job is raised here, naming the job."""
    config.check_int("workers", workers, minimum=1)
    jobs = list(jobs)
    if workers == 1 or len(jobs) <= 1:
        return [fn(**job) for job in jobs]
    one_thread = config.environ({k: "1" for k in config.THREAD_VARIABLES})  # read when torch loads in a worker
    spawn = multiprocessing.get_context("spawn")
    with one_thread, ProcessPoolExecutor(min(workers, len(jobs)), mp_context=spawn, initializer=_init) as pool:
        futures = [pool.submit(_call, fn, job) for job in jobs]
        out = []
        for i, f in enumerate(futures):
            try:
                out.append(f.result())
            except Exception as e:  # noqa: BLE001 - one line that says which job failed, the cause kept
                raise RuntimeError(f"parallel job {i} of {len(jobs)} ({fn.__name__}) failed: {type(e).__name__}: {e}") from e
        return out
