"""The one resumable training loop, and the run folder it keeps its log and checkpoints in.

Every trainer of the workbook (GRPO, RLPR's filtered GRPO, Elo-Evolve, MAE) is a step function on
`run(...)`: the loop alone restores the latest checkpoint (trainable weights, optimizer, RNG states and the
loop's own state), logs one row per step, checkpoints every `save_every` steps and after the last one,
marks the run done, and on a finished run loads its final weights and returns what it logged. A finished run copied
from the results store (core.store.fetch_run) has its log and loop states but no weights: it returns them and leaves
the model marked as lacking them (models.withhold), so a computation that would need them stops with one line. Each logged row
has the step's wall seconds (`wall_s`, the step function's own where it reports one); the steps a run resumes past
count, with those seconds, to the notebook's reused tally (core.phases.reused), unless this execution trained them
(made.json: a sweep's run that a later call of the same execution continues).
"""
import json
import random
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from replication.core import config, files, phases, store

from . import models


def trainable(model) -> dict:
    """The parameters the optimizer updates (the active LoRA adapter), by name."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


class RunFolder:
    """A training run's folder: config, step log (JSONL), checkpoints, and a done marker."""

    def __init__(self, folder):
        self.path = Path(folder)
        self.path.mkdir(parents=True, exist_ok=True)
        self.log_path = self.path / "metrics.jsonl"

    @classmethod
    def keyed(cls, base, name: str, key: dict):
        """base/<name>-<hash of key>: the same configuration finds the same folder."""
        folder = cls(Path(base) / f"{name}-{files.digest(key)}")
        if not (folder.path / "config.json").is_file():
            files.write_json(folder.path / "config.json", key)
        if store.active() is not None and not folder.done:
            store.fetch_run(folder.path, key)
        elif store.active() is None and folder.from_store:   # --retrain: a run copied from the store trains anew
            for name in (store.FETCHED, "done.json", "metrics.jsonl", "copied.json"):
                (folder.path / name).unlink(missing_ok=True)
        return folder

    @property
    def done(self) -> bool:
        return (self.path / "done.json").is_file()

    @property
    def from_store(self) -> bool:
        """A finished run copied from the results store: its log and loop states, no checkpoint."""
        return (self.path / store.FETCHED).is_file() and self.latest() is None

    def stored_states(self) -> dict:
        """{str(step): the loop state after it} for each checkpoint the run kept where it was made, as the results
        store holds them ({} for a run not read from the store)."""
        path = self.path / store.FETCHED
        return files.read_json(path).get("states", {}) if path.is_file() else {}

    def stored_state(self, step: int):
        """The loop state after `step` steps as the store kept it (None where it kept none)."""
        return self.stored_states().get(str(step))

    def mark_done(self, summary: dict) -> None:
        files.write_json(self.path / "done.json", summary)

    def mark_copied(self, steps: int, source: str) -> None:
        """Record that the first `steps` steps of this run's log were copied from another run (named `source`), so
        their time is that run's, not this one's."""
        files.write_json(self.path / "copied.json", {"steps": steps, "from": source})

    def copied(self) -> int:
        """How many steps at the start of the log were copied from another run (mark_copied); 0 if none."""
        path = self.path / "copied.json"
        return int(files.read_json(path)["steps"]) if path.is_file() else 0

    def mark_made(self, start: int, stop: int) -> None:
        """Record that steps start..stop - 1 were trained by this execution (phases.execution), joined with the
        steps it trained here before."""
        path, token = self.path / "made.json", phases.execution()
        made = files.read_json(path) if path.is_file() else {}
        lo, hi = made.get(token, (start, stop))
        made[token] = [min(lo, start), max(hi, stop)]
        files.write_json(path, made)

    def made_here(self) -> range:
        """The steps this execution trained in this run (mark_made); empty if none."""
        path = self.path / "made.json"
        lo, hi = (files.read_json(path) if path.is_file() else {}).get(phases.execution(), (0, 0))
        return range(lo, hi)

    def log(self, row: dict) -> None:
        with self.log_path.open("a") as f:
            f.write(json.dumps(row, default=files._jsonable) + "\n")

    def rows(self) -> list:
        if not self.log_path.is_file():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]

    def save(self, step: int, model, optimizer, extra=None, keep: int = None) -> Path:
        """Checkpoint after `step` completed steps: trainable weights, optimizer, RNG states and `extra`,
        written atomically; with `keep`, only the newest `keep` checkpoints stay."""
        path = self.path / "checkpoints" / f"step_{step:06d}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        state = {"step": step, "weights": {n: p.detach().clone() for n, p in trainable(model).items()},
                 "optimizer": optimizer.state_dict(), "rng": rng_state(), "extra": extra or {}}
        torch.save(state, tmp)
        tmp.replace(path)
        if keep:
            for old in sorted(path.parent.glob("step_*.pt"))[:-keep]:
                old.unlink()
        return path

    def checkpoints(self) -> dict:
        """The kept checkpoints by step (completed steps), oldest first."""
        return {int(p.stem.split("_")[1]): p for p in sorted((self.path / "checkpoints").glob("step_*.pt"))}

    def latest(self):
        ckpts = list(self.checkpoints().values())
        return ckpts[-1] if ckpts else None

    def restore(self, model, optimizer) -> dict:
        """Load the latest checkpoint into model and optimizer; truncate the log to it (with no checkpoint yet, to
        nothing: rows an interrupted first stretch logged are trained again). Returns its state."""
        path = self.latest()
        state = {"step": 0, "extra": {}}
        if path is not None:
            state = load_weights(model, path)
            optimizer.load_state_dict(state["optimizer"])
            set_rng_state(state["rng"])
        if self.log_path.is_file():
            files.write_text(self.log_path, "".join(json.dumps(r) + "\n" for r in self.rows() if r["step"] < state["step"]))
        return state


def _stored(folder: RunFolder, num_steps: int, model, state: dict):
    """run's answer for a finished run copied from the results store: its first num_steps rows and the loop state
    the store kept after them; the model is left marked as lacking the run's weights (models.withhold)."""
    rows = [r for r in folder.rows() if r["step"] < num_steps]
    if len(rows) < num_steps:
        raise store.StoreError(f"training run {folder.path.name} in the results store has {len(rows)} steps, "
                               f"{num_steps} were asked for: rerun with --retrain")
    kept = folder.stored_state(num_steps)
    if kept is not None:
        state.clear()
        state.update(kept)
    spent = [r.get("wall_s") for r in rows]
    phases.reused(None if None in spent else sum(spent))
    models.withhold(model, store.missing_weights(f"training run {folder.path.name}"))
    return rows, state


@torch.no_grad()
def load_weights(model, path) -> dict:
    """Put a checkpoint's trainable weights into the model (nothing else of the run is restored); its whole state."""
    models.release(model)
    state = torch.load(path, weights_only=False)   # this machine's own checkpoint (RNG states: numpy arrays)
    params = trainable(model)
    for n, w in state["weights"].items():
        params[n].copy_(w)
    return state


def run(step_fn, num_steps: int, model, optimizer, folder: RunFolder = None, state: dict = None,
        save_every: int = 10, keep: int = None, desc: str = "train", postfix=None, summary: dict = None,
        progress: bool = True):
    """Steps start..num_steps of `step_fn(step, state) -> row`, resumable. Returns (rows, state).

    state: the loop's own data (a rating, a filter's EMA, a question pool), mutated by the step function
    and checkpointed with the weights; plain Python values and tensors only. postfix(row) -> dict of
    short values for the progress bar. A finished run (folder done) loads its final weights and state; asked for
    fewer steps than a later call continued it to (a sweep's run that the pick's run went on with), it returns the
    first num_steps rows and, where the checkpoint after step num_steps is kept, that checkpoint's weights and
    state, so the answer does not depend on whether the continuation ran yet."""
    config.check_int("num_steps", num_steps)
    config.check_int("save_every", save_every, minimum=0)
    state = {} if state is None else state
    start, rows = 0, []
    models.release(model)
    if folder is not None and folder.done and folder.from_store:
        return _stored(folder, num_steps, model, state)
    if folder is not None:
        restored = folder.restore(model, optimizer)
        start = restored["step"]
        state.update(restored["extra"] or {})
        rows = folder.rows()
        copied = folder.copied()
        here = folder.made_here()   # a run this execution trained before and now continues: not reuse
        spent = [r.get("wall_s") for r in rows if copied <= r["step"] < start and r["step"] not in here]
        if spent:   # steps trained by an earlier execution: their time was spent then
            phases.reused(None if None in spent else sum(spent))
        if folder.done and start >= num_steps:
            if start > num_steps:   # a later call continued this run: hand back its first num_steps steps
                rows = [r for r in rows if r["step"] < num_steps]
                kept = folder.checkpoints().get(num_steps)
                if kept is not None:
                    state.clear()
                    state.update(load_weights(model, kept)["extra"] or {})
            return rows, state
    bar = tqdm(range(start, num_steps), initial=start, total=num_steps, desc=desc, disable=not progress)
    for step in bar:
        t0 = time.perf_counter()
        row = {"step": step, **step_fn(step, state)}
        if folder is not None:
            row.setdefault("wall_s", time.perf_counter() - t0)
        rows.append(row)
        if postfix is not None:
            bar.set_postfix(postfix(row))
        if folder is not None:
            folder.log(row)
            if (save_every and (step + 1) % save_every == 0) or step + 1 == num_steps:
                folder.save(step + 1, model, optimizer, extra=state, keep=keep)
    if folder is not None:
        if num_steps > start:
            folder.mark_made(start, num_steps)
        folder.mark_done({"steps": num_steps, **(summary or {})})
    return rows, state
