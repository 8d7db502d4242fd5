"""Multi-Agent Evolve's arm runs side by side: each run trains in a worker process into its run folder, and the
notebook's model reads it back as a finished run (mae.run_arm), so every later cell sees the same adapters."""
from dataclasses import asdict
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


class Keys:
    """Notebook 06's cache keys from its parameters (run.params), held-out questions and worked examples, so no cell
    writes one by hand. `heldout` keys the base model's greedy held-out replies and is the root of the others;
    `arm(key, seeds, cfg)` adds one arm's run (mae.run_key) to any of them."""

    def __init__(self, params, heldout, shots):
        P = self.params = params
        self.heldout = {"model": P.model, "heldout": [p.id for p in heldout], "tokens": P.eval_tokens,
                        "shots": [s.id for s in shots], "batch_size": P.batch_size}
        self.sampled = {**self.heldout, "temperature": P.temperature}
        self.judge = {**self.heldout, "judge_tokens": P.judge_tokens, "temperature": P.temperature,
                      "rule": P.score_rule}
        self.probe = {**self.judge, "n": P.n_probe}

    def arm(self, key: dict, seeds, cfg: mae.MAEConfig) -> dict:
        """`key` with the arm's run: its model, seed questions and loop settings."""
        return {**key, **mae.run_key(self.params.model, seeds, cfg)}

    def corpus(self, problems) -> dict:
        """The questions of known quality, rated by the judge (the filter's check)."""
        P = self.params
        return {"model": P.model, "problems": [p.id for p in problems], "judge_tokens": P.judge_tokens,
                "temperature": P.temperature, "rule": P.score_rule, "threshold": P.quality_threshold}

    def rates(self, questions) -> dict:
        """The base model's sampled rate on the seed questions a loop drew."""
        P = self.params
        return {**self.heldout, "tokens": P.answer_tokens, "questions": list(questions), "k": P.rate_samples,
                "temperature": P.temperature}

    def trace(self, seeds, cfg: mae.MAEConfig) -> dict:
        """Every iteration's adapter of one run on the first n_trace held-out questions."""
        return {**self.arm(self.heldout, seeds, cfg), "n": self.params.n_trace, "temperature": self.params.temperature}

    def sft(self, seeds, sft_cfg) -> dict:
        """The SFT baseline's run on the seed questions' worked solutions (sft_cfg: mae_sft.sft_config)."""
        return {**self.heldout, "seed_questions": [p.id for p in seeds], "lora_r": self.params.lora_r,
                **asdict(sft_cfg)}
