"""Elo-Evolve's arm runs for notebook 02: the arms and the opponent pool's ratings under a judge from the notebook's
parameters, and the runs side by side (21 per training judge at the default profile: seven arms x three training
seeds). Each run not yet finished, or whose held-out judging is not yet in the cache, trains and is judged in a
worker process at one thread on a freshly loaded model (parallel.make_pending, once per wave); every run is then
read back here in order (parallel.read_in_order), as a finished run and a cached judging, so every later cell sees
the same rows, gathered by arm. The undegraded runs go first: a degraded run starts from its twin's checkpoint at
the degradation step (evolve.fork), so it trains in a second wave. With workers=1 every run trains here, one after
another."""
import functools
import time
from dataclasses import replace

import numpy as np

from replication.core import cache, config, files, paper
from replication.lm import elo, grpo, models, parallel
from . import evolve, evolve_eval, judging


def grpo_config(params) -> grpo.GRPOConfig:
    """Notebook 02's GRPO configuration from its parameters (run.params), its one source: kl_beta None is the paper's
    KL coefficient (data/paper/); rollouts and updates in rollout_dtype; a checkpoint at train_degrade_step, for the
    degraded arms' fork. Its seed is the notebook's; each training seed replaces it (arm_runs)."""
    P = params
    kl_beta = paper.value("elo_evolve_temperature", quantity="kl_beta") if P.kl_beta is None else P.kl_beta
    return grpo.GRPOConfig(num_generations=P.group_size, max_new_tokens=P.max_new_tokens,
                           temperature=P.rollout_temperature, lr=P.lr, kl_beta=kl_beta, seed=P.seed,
                           save_every=P.train_degrade_step, rollout_dtype=P.rollout_dtype,
                           update_dtype=P.rollout_dtype)


def keys(params, heldout, sigma_abs: float, judge: str = None) -> tuple:
    """Notebook 02's keys from its parameters (run.params) and held-out problems: (the base model's greedy held-out
    replies, the training judge's settings that every arm run's key holds; sigma_abs: judging.quality_noise's;
    judge: the training judge's kind, default the parameter `judge`)."""
    P = params
    reference = {"model": P.model, "heldout": [p.id for p in heldout], "shots": P.shots,
                 "max_new_tokens": P.max_new_tokens}
    return reference, {"judge": P.judge if judge is None else judge, "judge_model": P.judge_model,
                       "judge_shots": P.judge_shots,
                       "sigma_comp": P.sigma_comp, "sigma_abs": sigma_abs, "level": P.level, "shots": P.shots,
                       "n_train": P.n_train, "n_heldout": P.n_heldout}


def regimes(params, static_opponent: str, start: float) -> dict:
    """Notebook 02's arms (evolve.regimes) from its parameters (run.params): point, static against
    `static_opponent`, Elo-Evolve at each of train_temperatures and the degraded arms, with the mean Elo rule from
    the rating `start`."""
    P = params
    return evolve.regimes(static_opponent, P.train_temperatures, P.degrade_temperatures, P.train_degrade_step,
                          P.degrade_with, k=P.elo_k, update_rule="mean", start_rating=start, steps=P.train_steps,
                          prompts_per_step=P.prompts_per_step, length_margin=P.length_margin, seed=P.seed)


def judged_pool(judge, settings: dict, problems, responses: dict, cached) -> dict:
    """What a judge says of the opponent pool, made once per key and read from the cache (`cached`, e.g. run.cached;
    entry `evolve_judged_pool`, keyed by the judge's settings, the problems and a digest of the pool's replies):
    the round robin of every player (evolve.win_matrix, as lists), the judge's accuracy on right/wrong pairs
    (evolve_eval.judge_accuracy) and its noise ratio (judging.pair_noise_ratio with the settings' seed), in that
    order, as rate_pool scores them. settings: JSON values naming the judge (judging.make_judge's arguments and
    the model that judges)."""
    key = {**settings, "problems": [p.id for p in problems], "pool": files.digest(responses)}
    return cached("evolve_judged_pool", key, lambda: {
        "wins": evolve.win_matrix(judge, problems, responses).tolist(),
        "judge_check": evolve_eval.judge_accuracy(judge, problems, responses),
        "noise": judging.pair_noise_ratio(judge, problems, responses, seed=settings.get("seed", 0))})


def rate_pool(judge, problems, responses: dict, opponents, start: float, static_rule: str,
              judged: dict = None) -> dict:
    """The opponent pool rated under one judge: the judge's accuracy on right/wrong pairs (evolve_eval.judge_accuracy),
    the round robin of every player (evolve.win_matrix), Elo ratings fitted to it with the policy at the start
    anchored at `start` (elo.fit_ratings), the opponents' names, replies and ratings, and the static arm's opponent
    by `static_rule` (evolve_eval.static_choice), fixed before any training; `opponents` (evolve.Opponents) is what
    training reads. judged: judged_pool's round robin and accuracy, when they are made (or cached) already."""
    players = list(responses)
    if judged is None:
        wins = evolve.win_matrix(judge, problems, responses)
        check = evolve_eval.judge_accuracy(judge, problems, responses)
    else:
        wins, check = np.array(judged["wins"], float), judged["judge_check"]
    fitted = elo.fit_ratings(wins, anchor=players.index(evolve.START_PLAYER), anchor_rating=start)
    names = list(opponents)
    ratings, pool = fitted[:len(names)], {n: responses[n] for n in names}
    return {"judge_check": check, "wins": wins, "players": players,
            "fitted": fitted, "names": names, "pool": pool, "ratings": ratings,
            "opponents": evolve.Opponents(pool, tuple(float(r) for r in ratings)),
            "static_opponent": evolve_eval.static_choice(names, ratings, static_rule, start)}


def gather(runs: list, trained: list, regimes: dict, base) -> dict:
    """train_arms' results by arm, one entry per training seed in `runs`' order: curves (step tables), evals
    (held-out tables, the base model's under "base"), results (summaries), records (evolve_eval.arm_record, health
    checked against the base model's held-out table `base`), spent (seconds, 0 when cached), and lines: one printed
    line per run."""
    import pandas as pd

    out = {"results": {}, "evals": {"base": base}, "curves": {}, "records": {}, "spent": {}, "lines": []}
    for r, (rows, summary, ev_rows, seconds) in zip(runs, trained):
        name, s = r["name"], r["seed"]
        table = pd.DataFrame(ev_rows)
        check = evolve_eval.health(rows, table, base, regimes[name].regime, seed=s)
        out["spent"].setdefault(name, []).append(seconds)
        out["curves"].setdefault(name, []).append(pd.DataFrame(rows))
        out["evals"].setdefault(name, []).append(table)
        out["results"].setdefault(name, []).append(summary)
        out["records"].setdefault(name, []).append(evolve_eval.arm_record(name, rows, table, summary, check,
                                                                          training_seed=s))
        out["lines"].append(f"{name:>18} seed {s}: accuracy {summary['accuracy']:.3f}, win rate vs base "
                            f"{summary['win_rate']:.3f}, {summary['wall_time_s']:.0f} s of training; healthy: "
                            f"{check['healthy']} (failed: {check['failed']})")
    return out


def arm_runs(run_folder, regimes: dict, seeds, grpo_cfg, setting: "evolve.ArmSetting", opponents: "evolve.Opponents",
             judge_key: dict) -> list:
    """One run per arm and training seed, arm by arm: dicts of name, seed, cfg and grpo_cfg (the seed's; the first
    seed's configs and run keys are the notebook's), folder (run_folder(name, evolve.run_key(...)), e.g.
    run.run_folder) and twin: the undegraded twin's folder for a degraded arm, else None."""
    out = []
    for name, rc in regimes.items():
        for s in seeds:
            rc_s, g_s = replace(rc, seed=s), replace(grpo_cfg, seed=s)
            key = functools.partial(evolve.run_key, setting.model, grpo_cfg=g_s, lora_r=setting.lora_r,
                                    pool=opponents.replies, ratings=opponents.ratings, extra=judge_key)
            twin = evolve.degrade_source(name, rc_s)
            out.append({"name": name, "seed": s, "cfg": rc_s, "grpo_cfg": g_s, "folder": run_folder(name, key(rc_s)),
                        "twin": None if twin is None else run_folder(twin[0], key(twin[1]))})
    return out


def train_in_worker(setting: "evolve.ArmSetting", judge_args: dict, cache_folder, **kw) -> float:
    """train_and_evaluate for one run on a freshly loaded model, with the training judge made here from
    judge_args (judging.make_judge's arguments but the base model), into its run folder and the cache folder
    (a worker of train_arms), without progress bars: its seconds."""
    t0 = time.perf_counter()
    needs_base = judge_args["kind"] != "quality" and judge_args.get("judge_model") is None
    judge = judging.make_judge(base=models.load_model(setting.model) if needs_base else None, **judge_args)
    evolve_eval.train_and_evaluate(replace(setting, progress=False), judge,
                                   cache=functools.partial(cache.cached, cache_folder), **kw)
    return time.perf_counter() - t0


def _fork(run: dict) -> None:
    """A degraded run starts from its twin's checkpoint at the degradation step (evolve.fork; nothing for the others)."""
    if run["twin"] is not None:
        evolve.fork(run["twin"], run["folder"], run["cfg"].degrade_step)


def train_arms(runs: list, setting: "evolve.ArmSetting", judge, judge_args: dict, opponents: "evolve.Opponents",
               cached, cache_folder, workers: int = 1) -> list:
    """evolve_eval.train_and_evaluate for each of `runs` (arm_runs) in order, a degraded run forked from its twin
    first: [(step rows, summary, evaluation rows, seconds of training and judging, 0 when cached)]. `judge` is the
    notebook's training judge; judge_args makes the same judge in a worker (judging.make_judge's arguments but
    `base`); cached(name, key, make) is the notebook's cache (run.cached), cache_folder its folder. With workers > 1
    the runs to make train side by side first (module docstring); a run's rows do not depend on where it trained but
    for the rounding of one thread: its adapter and every draw are seeded from its configs."""
    config.check_int("workers", workers, minimum=1)
    runs, S = list(runs), setting

    def pending(i):
        r = runs[i]
        judging_key = evolve_eval.eval_key(r["folder"], S.heldout, S.reference, r["grpo_cfg"], r["cfg"], S.shots,
                                           S.eval_judge or judge)
        if r["folder"].done and cache.intact(cache_folder, "evolve_eval", judging_key):
            return None
        return dict(setting=S, judge_args=judge_args, cache_folder=cache_folder, opponents=opponents, cfg=r["cfg"],
                    grpo_cfg=r["grpo_cfg"], folder=r["folder"])

    made = {}
    if workers > 1:   # the undegraded runs, then the degraded ones from their twins' checkpoints
        for wave, what in ((False, "arm runs"), (True, "degraded arm runs")):
            ids = [i for i, r in enumerate(runs) if (r["twin"] is not None) == wave]
            for i in ids:
                _fork(runs[i])
            made.update(parallel.make_pending(train_in_worker, {i: job for i in ids if (job := pending(i))}, workers, what))

    def read(i):
        r, t0 = runs[i], time.perf_counter()
        _fork(r)
        rows, summary, ev_rows = evolve_eval.train_and_evaluate(S, judge, opponents, r["cfg"], r["grpo_cfg"],
                                                                r["folder"], cached)
        return rows, summary, ev_rows, made.get(i, time.perf_counter() - t0)

    return parallel.read_in_order(range(len(runs)), read, made)
