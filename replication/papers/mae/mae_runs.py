"""Multi-Agent Evolve's arm runs side by side: each run trains in a worker process into its run folder, and the
notebook's model reads it back as a finished run (mae.run_arm), so every later cell sees the same adapters."""
from typing import Optional

from replication.lm import loop, models, parallel
from . import mae


def train_in_folder(model_name: str, name: str, seeds, cfg: mae.MAEConfig, folder: loop.RunFolder,
                    keep: Optional[int] = 1) -> None:
    """run_arm on a freshly loaded model, for its folder only (a worker of run_arms): the folder then holds the run."""
    model, tok = models.load_model(model_name)
    mae.run_arm(model, tok, name, seeds, cfg, folder, progress=False, keep=keep)


def run_arms(model, tok, model_name: str, runs, workers: int = 1, keep: Optional[int] = 1):
    """mae.run_arm for each of `runs` ((adapter name, seed questions, cfg, folder) each) on `model`, in order: (model,
    [result]). With workers > 1 the runs not finished in their folders first train side by side, each in its own
    process at one thread on a fresh model (parallel.run_jobs); each is then read back onto `model` as a finished
    run (its final weights and logged rows), so the adapters and results are those of mae.run_arm's own runs, but
    for the rounding of one thread. A run's adapter starts from its own seed (mae.new_adapter), whatever adapters the model
    already has, so it does not matter where it trained."""
    runs, holder = list(runs), [model]

    def pending(i):
        name, seeds, cfg, folder = runs[i]
        return None if folder.done else dict(model_name=model_name, name=name, seeds=seeds, cfg=cfg, folder=folder, keep=keep)

    def read(i):
        holder[0], result = mae.run_arm(holder[0], tok, *runs[i], keep=keep)
        return result

    results, _ = parallel.made_then_read(range(len(runs)), pending, train_in_folder, read, workers, "arm runs")
    return holder[0], results
