"""Why the loop's own accuracy and the held-out accuracy can disagree: the loop's seed-question samples read against
the base model on the same questions, and every iteration's adapter on one fixed question set.

The loop logs, per iteration, how many of the solver's answers to pool questions with a known answer (the seed
questions) the exact verifier marks right (`seed_accuracy`, figure 06b). Three things separate that number from the
held-out accuracy of the final adapter: it is sampled (cfg.temperature) where the held-out evaluation is greedy; it is
read on the policy before the iteration's update, so the last update is never seen; and each point rests on the
7-8 pool questions the iteration drew, whose difficulty varies from draw to draw. `solved_seed_questions` replays
those draws (the same random stream as mae.collect, from the run's final pool), `against_base` sets each point beside
the base model's sampled accuracy on the same questions, and `trace` scores each iteration's adapter (the run keeps
every checkpoint with keep=None) on one fixed set of questions, greedy and sampled."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from replication.core import config, store
from replication.lm import loop, models, tasks
from . import mae


def solved_seed_questions(result: dict, cfg: "mae.MAEConfig", stream=()) -> list:
    """Per iteration, the pool questions with a known answer the solver answered (each cfg.n_solve times, in the order
    of the run's `verified` records): mae.collect's draws replayed from the run's final pool."""
    seeds = [p for p in result["pool"] if p["source"] == "seed"]
    proposed = [p for p in result["pool"] if p["source"] != "seed"]
    out = []
    for it in range(len(result["rows"])):
        pool = mae.QuestionPool(seeds + [p for p in proposed if p["iteration"] < it])
        rng = mae.pool_rng(cfg, it, stream)
        mae.draw_references(rng, pool, cfg)
        pool.items += [p for p in proposed if p["iteration"] == it]  # accepted before the solver's draw
        out.append([p["question"] for p in pool.sample(rng, cfg.pool_solve) if p["answer"] is not None])
    return out


def sampled_rates(model, tok, problems, shots, k: int, max_new_tokens: int, temperature: float, batch_size: int = 16,
                  seed: int = 0) -> pd.DataFrame:
    """The active model's share of right answers per question over k sampled replies (the solver's prompt, as in the
    loop): question, answer, rate."""
    config.check_int("k", k)
    gen = models.generate(model, tok, [mae.solve_prompt(p.question, shots) for p in problems], max_new_tokens,
                          temperature=temperature, seed=seed, batch_size=batch_size, repeats=k)
    return pd.DataFrame([{"question": p.question, "answer": p.answer,
                          "rate": float(np.mean([tasks.verify(t, p.answer) for t in gen.texts[i * k:(i + 1) * k]]))}
                         for i, p in enumerate(problems)])


def against_base(result: dict, cfg: "mae.MAEConfig", base_rates: pd.DataFrame) -> pd.DataFrame:
    """Per iteration (from 1): the loop's sampled seed-question accuracy, the base model's sampled accuracy on the
    same draws (base_rates' rate, each question weighted by how often it was drawn) and the difference."""
    rate = base_rates.drop_duplicates("question").set_index("question")["rate"]
    verified = pd.DataFrame(result["verified"])
    rows = []
    for it, qs in enumerate(solved_seed_questions(result, cfg)):
        got = verified.loc[verified["iteration"] == it, "correct"].astype(float) if len(verified) else pd.Series(dtype=float)
        if len(got) != len(qs) * cfg.n_solve:
            raise ValueError(f"iteration {it}: {len(got)} verified answers for {len(qs)} replayed questions; the replay "
                             "does not match this run")
        base = float(rate.loc[qs].mean()) if qs else float("nan")
        rows.append({"iteration": it + 1, "questions": len(qs), "distinct": len(set(qs)), "loop": float(got.mean()),
                     "base_same_questions": base, "difference": float(got.mean()) - base})
    return pd.DataFrame(rows)


def checkpoints(folder) -> dict:
    """{iterations done: checkpoint path} of a run folder (step_000003.pt: the adapter after 3 updates)."""
    return loop.RunFolder(folder).checkpoints()


def has_every_checkpoint(folder, iterations: int) -> bool:
    """True when the run folder kept the adapter of every iteration (trained with keep=None); for a run read from the
    results store, which keeps no weights, when it kept every iteration's checkpoint where it was made (the store
    holds the loop state after each)."""
    run = loop.RunFolder(folder)
    kept = set(run.checkpoints()) or ({int(k) for k in run.stored_states()} if run.from_store else set())
    return set(range(1, iterations + 1)) <= kept


def trace(model, tok, folder, problems, shots, max_new_tokens: int, temperature: float, batch_size: int = 16,
          seed: int = 0) -> pd.DataFrame:
    """Every iteration's adapter of a run (its checkpoints; iteration 0: the adapter as initialised, which is the base
    model, LoRA's B being zero) on the same problems, greedy and sampled at `temperature` (one draw): iteration, qid,
    decoding, correct. The active adapter's weights are left at the run's last checkpoint."""
    if loop.RunFolder(folder).from_store:
        raise models.WeightsMissing(store.missing_weights(f"training run {Path(folder).name}"))
    steps = checkpoints(folder)
    rows = []
    for it in [0, *sorted(steps)]:
        if it:
            loop.load_weights(model, steps[it])
            ctx = torch.no_grad()
        else:
            ctx = model.disable_adapter()
        prompts = [mae.solve_prompt(p.question, shots) for p in problems]
        with ctx:
            for decoding, t in (("greedy", 0.0), ("sampled", temperature)):
                table = tasks.evaluate(model, tok, problems, max_new_tokens, batch_size, seed, temperature=t,
                                       prompts=prompts, progress=False)
                rows += [{"iteration": it, "qid": q, "decoding": decoding, "correct": bool(c)}
                         for q, c in zip(table["id"], table["correct"])]
    return pd.DataFrame(rows)


def same_rows(a, b) -> bool:
    """True when two runs logged the same rows, wall times aside (NaN equal to NaN): the same run."""
    strip = lambda rows: json.dumps([{k: v for k, v in r.items() if not k.endswith("_s")} for r in rows])  # noqa: E731
    return strip(a) == strip(b)
