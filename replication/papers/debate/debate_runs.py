"""What notebook 04 runs and caches: the setting every protocol run shares (`Setting`, built once from the notebook's
parameters), the naive and expert judgments (`cached_judge`) and the argued protocols (`cached_protocol`), each
made once through the notebook's cache and keyed by everything that decides it."""
import hashlib
import json
import time
from dataclasses import dataclass

import numpy as np

from . import debate


@dataclass(frozen=True)
class Setting:
    """What a protocol run depends on besides its stories, its kind and its sampling seed, under notebook 04's
    parameter names: the model's name, the arguments' word limit and best-of-N, the sampling temperature, the
    batch, the judge's reading, the rounds and whether a debater's quote is opened for it (run_protocol's)."""
    model_name: str
    word_limit: int
    best_of: int
    temperature: float
    batch_size: int
    reading: str = "likelihood"
    rounds: int = 1
    open_quote: bool = True


def cached_judge(cache, model, tok, items, kind: str, setting: Setting) -> dict:
    """judge() of a protocol without arguments (naive or expert) through cache(name, key, make) (the notebook's
    run.cached), keyed by the stories (ids and content digest), the model, the reading and the batch (of
    `setting`): the same arrays, read back."""
    model_name, batch_size, reading = setting.model_name, setting.batch_size, setting.reading
    if kind not in ("naive", "expert"):
        raise ValueError(f"kind={kind!r} is not allowed; cached_judge judges naive or expert (no arguments)")
    digest = hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()[:16]
    key = {"kind": kind, "ids": [it["id"] for it in items], "stories": digest, "model": model_name,
           "reading": reading, "batch_size": batch_size}
    made = cache(f"judged-{kind}", key, lambda: {k: np.asarray(v, float).tolist() for k, v in debate.judge(
        model, tok, items, kind, batch_size=batch_size, reading=reading).items()})
    return {k: np.asarray(v, float) for k, v in made.items()}


def cached_protocol(cache, model, tok, items, kind: str, setting: Setting, seed: int) -> dict:
    """run_protocol once per configuration through cache(name, key, make) (the notebook's run.cached), keyed by
    everything that determines the transcripts (the stories by their ids and content digest, `setting`, the
    sampling seed); the result also holds the seconds it took to make."""
    S = setting
    digest = hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()[:16]
    key = {"kind": kind, "ids": [it["id"] for it in items], "stories": digest, "rounds": S.rounds,
           "word_limit": S.word_limit, "best_of": S.best_of, "temperature": S.temperature, "seed": seed,
           "batch_size": S.batch_size, "model": S.model_name, "open_quote": S.open_quote,
           "candidates": "generate(repeats=best_of): one prefill per prompt; every candidate's score and orders kept"}
    if S.best_of > 1:  # how candidates are rated (best-of-1 transcripts do not depend on it)
        key["preference"] = {"score": "P(own answer), mean of both orders", "placeholder": debate.PLACEHOLDER,
                             "reading": S.reading, "lead": debate.LEAD,
                             "context": debate.ANSWER_CONTEXT if S.reading == "likelihood" else None}

    def make():
        t0 = time.perf_counter()
        out = debate.run_protocol(model, tok, items, kind, rounds=S.rounds, word_limit=S.word_limit,
                                  best_of=S.best_of, temperature=S.temperature, seed=seed, batch_size=S.batch_size,
                                  open_quote=S.open_quote, reading=S.reading)
        return {**out, "seconds": time.perf_counter() - t0}

    return cache(f"{kind}-bo{S.best_of}", key, make)
