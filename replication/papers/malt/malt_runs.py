"""MALT's per-seed work side by side: each training seed's trees, its two arms (SFT then DPO, both poolings), its
single-agent control's arm and each trained variant's held-out chains (a seed's stage weights on the held-out
questions, or its verifier and refiner after known first answers) are made in worker processes into the notebook's
cache, then read back in order on the notebook's model, so every later cell sees the same values and weights. With
workers=1 everything is made here, one after another, as the notebook did before."""
import functools

from replication.core import cache
from replication.lm import arms, models, parallel
from . import malt, malt_eval, malt_training


def keys(params, worked) -> tuple:
    """Notebook 05's cache keys from its parameters (run.params) and worked examples: (trees, training, held-out
    chains), each holding the one before. Their "seed" is the notebook's; a training seed's entries replace it by
    their own (the questions stay those of the notebook's seed, arms.data_key)."""
    P = params
    trees = {"model": P.model, "level": P.level, "n": P.n_branch, "questions": P.train_questions + P.val_questions,
             "tokens": (P.gen_tokens, P.ver_tokens, P.ref_tokens), "temperature": P.temperature,
             "rollout_dtype": P.rollout_dtype, "seed": P.seed, "prompts": malt.prompt_key(worked),
             "batch_size": P.batch_size, **arms.data_key(P.seed)}
    training = {**trees, "reference": P.reference, "r": P.lora_r, "sft": [P.sft_lr, P.sft_epochs, P.max_sft],
                "dpo": [P.dpo_lr, P.dpo_epochs, P.dpo_beta, P.max_pairs], "train_questions": P.train_questions}
    return trees, training, {**training, "eval": P.n_heldout, "votes": P.votes}


def _fresh_model(model_name: str, lora_r: int):
    model, tok = models.load_model(model_name)
    return malt_training.add_role_adapters(model, r=lora_r, alpha=2 * lora_r), tok


def trees_in_worker(model_name: str, lora_r: int, rollout_dtype: str, folder, key: dict, problems, **kw) -> None:
    """One seed's trees (malt.sample_trees with the base model's roles) into the cache `folder` (a worker of trees)."""
    model, tok = _fresh_model(model_name, lora_r)
    sampler = malt.sampling_copy(model, rollout_dtype)
    cache.cached(folder, "trees", key, lambda: malt.sample_trees(model, tok, problems, sampler=sampler, **kw))


def trees(cached, folder, model, tok, problems, keys: dict, workers: int = 1, model_name: str = None,
          lora_r: int = 16, rollout_dtype: str = "float32", sampler=None, **kw) -> dict:
    """{seed: malt.sample_trees(model, tok, problems, seed=seed, sampler=sampler, **kw)} for each seed of `keys`
    ({seed: its cache key}), made once through cached("trees", key, ...); with workers > 1 the seeds not in the cache
    `folder` first side by side (chains' docstring)."""
    keys = dict(keys)

    def pending(s):
        return None if cache.intact(folder, "trees", keys[s]) else dict(
            model_name=model_name, lora_r=lora_r, rollout_dtype=rollout_dtype, folder=folder, key=keys[s],
            problems=problems, seed=s, **kw)

    def read(s):
        return cached("trees", keys[s], lambda: malt.sample_trees(model, tok, problems, seed=s, sampler=sampler, **kw))

    return dict(zip(keys, parallel.made_then_read(keys, pending, trees_in_worker, read, workers, "trees")[0]))


def seed_arms(cached, model, tok, key: dict, init: dict, sets: dict, validation: dict,
              recipe: malt_training.Recipe) -> dict:
    """{pooling: malt_training.train_arm(...)} for one training seed: each pooling's arm from the seed's initial
    adapters `init`, on its sets and validation ({pooling: ...}), as `recipe` says; a later arm takes the roles it
    trains on the same data as the first arm from that arm."""
    out, first = {}, malt.POOLINGS[0]
    for p in malt.POOLINGS:
        reuse = (out[first], (sets[first], validation[first])) if out else None
        out[p] = malt_training.train_arm(cached, key, p, model, tok, init, (sets[p], validation[p]), recipe,
                                         reuse=reuse)
    return out


def arms_in_worker(model_name: str, lora_r: int, folder, **kw) -> None:
    """seed_arms on a freshly loaded model into the cache `folder` (a worker of train_arms)."""
    model, tok = _fresh_model(model_name, lora_r)
    seed_arms(functools.partial(cache.cached, folder), model, tok, **kw)


def train_arms(cached, folder, model, tok, seeds: dict, workers: int = 1, model_name: str = None,
               lora_r: int = 16) -> dict:
    """{seed: seed_arms(cached, model, tok, **seeds[seed])} in order; with workers > 1 the seeds whose last arm is not
    in the cache `folder` first train side by side, one seed a worker (chains' docstring). A stage's training has
    its own seeds (its PreferenceConfig) and starts from the seed's `init`, so where it ran does not matter but for
    the rounding of one thread. The model ends with the last seed's last arm's weights."""
    last = malt.POOLINGS[-1]

    def pending(s):
        kw = seeds[s]
        return None if cache.intact(folder, f"dpo-{last}", {**kw["key"], "arm": last}) else dict(
            model_name=model_name, lora_r=lora_r, folder=folder, **kw)

    def read(s):
        return seed_arms(cached, model, tok, **seeds[s])

    return dict(zip(seeds, parallel.made_then_read(seeds, pending, arms_in_worker, read, workers, "arms")[0]))


def single_in_worker(model_name: str, lora_r: int, folder, **kw) -> None:
    """One malt_training.train_arm on a freshly loaded model into the cache `folder` (a worker of single_arms)."""
    model, tok = _fresh_model(model_name, lora_r)
    malt_training.train_arm(functools.partial(cache.cached, folder), model=model, tok=tok, **kw)


def single_arms(cached, folder, model, tok, calls: dict, workers: int = 1, model_name: str = None,
                lora_r: int = 16) -> dict:
    """{seed: malt_training.train_arm(cached, model=model, tok=tok, **calls[seed])} in order: the single-agent control's
    arm of each seed (a call: key, name, init, data, recipe). With workers > 1 the
    seeds whose DPO stage is not in the cache `folder` first train side by side (chains' docstring); the model ends
    with the last seed's weights."""
    def pending(s):
        c = calls[s]
        return None if cache.intact(folder, f"dpo-{c['name']}", {**c["key"], "arm": c["name"]}) else dict(
            model_name=model_name, lora_r=lora_r, folder=folder, **c)

    def read(s):
        return malt_training.train_arm(cached, model=model, tok=tok, **calls[s])

    return dict(zip(calls, parallel.made_then_read(calls, pending, single_in_worker, read, workers, "control arms")[0]))


def chains_in_worker(model_name: str, lora_r: int, rollout_dtype: str, folder, stage: dict, key: dict, name: str,
                     problems, **kw) -> None:
    """One variant_chains call on a freshly loaded model carrying `stage`'s weights in every role, into the cache
    `folder` (a worker of chains): the entry is then there for the notebook to read."""
    model, tok = _fresh_model(model_name, lora_r)
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
    calls = [dict(c) for c in calls]

    def pending(i):
        c = calls[i]
        entry = malt_eval.chain_entry(c["key"], c["name"], **{k: v for k, v in c.items()
                                                              if k not in ("stage", "key", "name", "problems")})
        return None if cache.intact(folder, *entry) else dict(
            model_name=model_name, lora_r=lora_r, rollout_dtype=rollout_dtype, folder=folder,
            **{k: v for k, v in c.items() if k != "sampler"})

    def read(i):
        c = dict(calls[i])
        malt_training.load_stage(model, c.pop("stage"))
        return malt_eval.variant_chains(cached, c.pop("key"), c.pop("name"), model, tok, c.pop("problems"), **c)

    return parallel.made_then_read(range(len(calls)), pending, chains_in_worker, read, workers, "held-out chains")[0]
