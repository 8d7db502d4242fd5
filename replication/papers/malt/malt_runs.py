"""MALT's held-out chains side by side: each trained variant's chains (a training seed's stage weights on the
held-out questions, or its verifier and refiner after known first answers) are made in a worker process into the
notebook's cache, then read back in order on the notebook's model, so every later cell sees the same rows."""
import contextlib
import functools

from replication.core import cache, config, phases
from replication.lm import models, parallel
from . import malt, malt_eval, malt_training


def chains_in_worker(model_name: str, lora_r: int, rollout_dtype: str, folder, stage: dict, key: dict, name: str,
                     problems, **kw) -> None:
    """One variant_chains call on a freshly loaded model carrying `stage`'s weights in every role, into the cache
    `folder` (a worker of chains): the entry is then there for the notebook to read."""
    model, tok = models.load_model(model_name)
    model = malt_training.add_role_adapters(model, r=lora_r, alpha=2 * lora_r)
    malt_training.load_stage(model, stage)
    sampler = malt.sampling_copy(model, rollout_dtype)
    malt_eval.variant_chains(functools.partial(cache.cached, folder), key, name, model, tok, problems, sampler=sampler,
                             **kw)


def chains(cached, folder, model, tok, calls, workers: int = 1, model_name: str = None, lora_r: int = 16,
           rollout_dtype: str = "float32") -> list:
    """malt_eval.variant_chains for each of `calls` on `model`, in order: one list of rows per call. A call is a dict
    of variant_chains' arguments (key, name, problems and the chain settings, its sampling copy included) and
    `stage`, the train_stage result whose weights the chains run on (loaded into every role first).

    With workers > 1, the calls whose entries are not in the cache `folder` (run.cache) are first made side by side,
    each in its own process at one thread on a freshly loaded model (`model_name`, LoRA rank `lora_r`, a sampling
    copy in `rollout_dtype`); reading them back here is not counted as reuse (phases.made_here). Their rows are those
    of the calls made here, but for the rounding of one thread: each call's sampling has its own seeds and each
    role's weights are the stage's, whatever ran on the model before."""
    config.check_int("workers", workers)
    calls = [dict(c) for c in calls]
    made = set()
    if workers > 1:
        todo = []
        for i, c in enumerate(calls):
            settings = {k: v for k, v in c.items() if k not in ("stage", "key", "name", "problems")}
            entry, key = malt_eval.chain_entry(c["key"], c["name"], **settings)
            if cache.load(cache.path_for(folder, entry, key), key)[1] != "ok":
                todo.append(i)
        jobs = [dict(model_name=model_name, lora_r=lora_r, rollout_dtype=rollout_dtype, folder=folder,
                     **{k: v for k, v in calls[i].items() if k != "sampler"}) for i in todo]
        if jobs:
            parallel.run_jobs(chains_in_worker, jobs, workers, progress=f"held-out chains ({workers} side by side)")
        made = set(todo)
    out = []
    for i, c in enumerate(calls):
        malt_training.load_stage(model, c.pop("stage"))
        with phases.made_here() if i in made else contextlib.nullcontext():
            out.append(malt_eval.variant_chains(cached, c.pop("key"), c.pop("name"), model, tok, c.pop("problems"), **c))
    return out
