"""The RLVR yardstick: does plain GRPO with the exact verifier teach this model anything, and in how many steps?

Every paper notebook's training cites it: the steps it needs for a resolvable held-out gain are the training
length the comparisons use. Three pieces:

- `sampling_table`: for candidate prompt formats (task level x number of worked examples), how often the base
  model is right under the rollout sampling, and the share of GRPO groups whose G rewards are all equal (no
  gradient). GRPO learns only from mixed groups, so a setting is chosen where most groups are mixed.
- `train_curve`: a GRPO run (exact-verifier reward) on the one resumable loop whose step function also answers
  the held-out problems greedily every `eval_every` steps; the answers are part of the step's row, so an
  interrupted run resumes with its earlier evaluations intact.
- `gain_table`: held-out accuracy by step and the gain over the base model on the same problems, over training
  seeds: the chosen learning rate's run is repeated once per seed (`seed_run`: the seed sets the LoRA
  initialisation, the training problems drawn each step and the rollout sampling; the held-out problems stay), and
  the interval covers seeds, then problems (stats.two_level_bootstrap), each seed's gain beside it. `summary` reads
  the last step through arms.compare, with each seed's health check.
"""
import dataclasses
import random

import numpy as np
import pandas as pd

from replication.core import config, files, stats
from replication.lm import arms, grpo, loop, models, parallel, tasks


def prompts_for(problems, shots) -> list:
    """Each problem as chat turns after the worked examples (Problem.chat)."""
    return [p.chat(shots) for p in problems]


def sampling_table(model, tok, candidates: dict, group_size: int, temperature: float, max_new_tokens: int,
                   top_p: float = 1.0, batch_size: int = 32, seed: int = 0) -> pd.DataFrame:
    """One row per candidate {name: (problems, shots)}: accuracy of G sampled replies per problem (Wilson 95%),
    strict accuracy, format rate, mean reply tokens, and the share of problems whose G replies are all right or
    all wrong (a GRPO group with no gradient)."""
    config.check_int("group_size", group_size, minimum=2)
    rows = []
    for name, (problems, shots) in candidates.items():
        gen = models.generate(model, tok, prompts_for(problems, shots), max_new_tokens=max_new_tokens,
                              temperature=temperature, top_p=top_p, repeats=group_size, batch_size=batch_size,
                              seed=config.derive_seed(seed, "sampling-table", name))
        answers = [p.answer for p in problems for _ in range(group_size)]
        right = np.array([tasks.verify(t, a) for t, a in zip(gen.texts, answers)], float).reshape(-1, group_size)
        acc, lo, hi = stats.proportion_ci(int(right.sum()), right.size)
        rows.append({"setting": name, "shots": len(shots), "problems": len(problems), "replies": right.size,
                     "accuracy": acc, "ci_low": lo, "ci_high": hi,
                     "strict": float(np.mean([tasks.verify(t, a, strict=True) for t, a in zip(gen.texts, answers)])),
                     "format": float(np.mean([tasks.has_format(t) for t in gen.texts])),
                     "tokens": gen.num_tokens / right.size,
                     "zero_gradient_groups": float(np.mean((right.min(1) == right.max(1)))),
                     "seconds": gen.seconds})
    return pd.DataFrame(rows)


def heldout_row(model, tok, heldout, shots, max_new_tokens: int, batch_size: int, seed: int) -> dict:
    """Greedy answers to the held-out problems (tasks.evaluate): accuracy, strict accuracy, format rate, mean
    reply tokens, and the per-problem correctness (for paired comparisons)."""
    df = tasks.evaluate(model, tok, heldout, max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed,
                        prompts=prompts_for(heldout, shots), progress=False)
    return {"eval_accuracy": float(df["correct"].mean()), "eval_strict": float(df["correct_strict"].mean()),
            "eval_format": float(df["format"].mean()), "eval_tokens": float(df["tokens"].mean()),
            "eval_correct": df["correct"].astype(int).tolist(), "eval_strict_correct": df["correct_strict"].astype(int).tolist()}


@dataclasses.dataclass(frozen=True)
class Schedule:
    """What a yardstick run trains on and how often it is read, besides its GRPO config: the training and held-out
    problems, the worked examples before each, the training problems drawn a step, the held-out answers after every
    `eval_every`-th step, and their batch."""
    train: list
    heldout: list
    shots: tuple
    prompts_per_step: int
    eval_every: int
    batch_size: int = 32


def grpo_config(params, lr: float) -> grpo.GRPOConfig:
    """Notebook 00's GRPO config at learning rate `lr` from its parameters (run.params): group_size replies of at
    most step_tokens at rollout_temperature, sampled in rollout_dtype, no KL term, seeded by the notebook's seed
    (seed_run puts a training seed in its place)."""
    P = params
    return grpo.GRPOConfig(num_generations=P.group_size, max_new_tokens=P.step_tokens, lr=lr, kl_beta=0.0,
                           temperature=P.rollout_temperature, rollout_dtype=P.rollout_dtype, seed=P.seed)


def train_curve(model, tok, schedule: Schedule, cfg: grpo.GRPOConfig, steps: int, folder: loop.RunFolder = None,
                progress: bool = True) -> list:
    """GRPO with the exact verifier for `steps` steps, schedule.prompts_per_step training problems a step (drawn
    with a seed derived from cfg.seed and the step), held-out greedy answers after every schedule.eval_every-th
    step (and the last). Resumable (loop.run); calling it again with more steps continues the same run. Returns the
    rows."""
    S = schedule
    config.check_int("steps", steps)
    config.check_int("eval_every", S.eval_every)
    config.check_range("prompts_per_step", S.prompts_per_step, 1, len(S.train))
    trainer = grpo.GRPOTrainer(model, tok, tasks.verifier_reward, cfg)

    def step_fn(step, state):
        batch = random.Random(config.derive_seed(cfg.seed, "yardstick-draw", step)).sample(S.train, S.prompts_per_step)
        row = trainer.step(prompts_for(batch, S.shots), [{"answer": p.answer} for p in batch], step=step)
        if (step + 1) % S.eval_every == 0:
            row.update(heldout_row(trainer.model, tok, S.heldout, S.shots, cfg.max_new_tokens, S.batch_size, cfg.seed))
        return row

    rows, _ = loop.run(step_fn, steps, model, trainer.optimizer, folder, save_every=S.eval_every,
                       desc=f"grpo lr {cfg.lr:g}",
                       postfix=lambda r: {"reward": f"{r['reward_mean']:.2f}", "held-out": f"{r.get('eval_accuracy', float('nan')):.2f}"},
                       progress=progress)
    return rows


def keys(params) -> dict:
    """Notebook 00's cache keys from its parameters (run.params): the base model's replies per level, the sampling
    table of the candidates, the yardstick's settings (seed_run adds a training seed's GRPO config) and the base
    model's held-out row."""
    P = params
    settings = {"model": P.model, "level": P.yardstick_level, "shots": P.shots, "n_train": P.n_train,
                "n_heldout": P.n_heldout, "lora_r": P.lora_r, "prompts": P.prompts_per_step, "eval_every": P.eval_every,
                "seed": P.seed}
    return {"replies": {"model": P.model, "levels": P.levels, "n_per_level": P.n_per_level,
                        "max_new_tokens": P.max_new_tokens, "batch_size": P.batch_size, "seed": P.seed},
            "sampling": {"model": P.model, "candidates": list(candidates(P)), "n": P.sampling_problems,
                         "G": P.group_size, "T": P.rollout_temperature, "tokens": P.step_tokens, "seed": P.seed},
            "settings": settings, "base": {**settings, "tokens": P.step_tokens}}


def candidates(params) -> dict:
    """The sampling table's rows: each candidate level with each number of worked examples, as (problems, worked
    examples) under a name such as "2d-1step-add, 3 shots"."""
    P = params
    return {f"{lv}, {k} shots": (tasks.make_level(lv, P.sampling_problems,
                                                  seed=config.derive_seed(P.seed, "sampling", lv)),
                                 tasks.worked_examples(lv, k, seed=P.seed))
            for lv in P.candidate_levels for k in P.candidate_shots}


def seed_run(key: dict, cfg: grpo.GRPOConfig, training_seed: int) -> tuple:
    """The GRPO config and run-folder key of one training seed: the seed replaces cfg.seed (the training problems
    drawn each step, the rollout sampling) and the key's seed. key: the run's settings with the notebook's seed, so
    that seed's key is the one-run workbook's {**key, "grpo": str(cfg)} (its cached run is reused); the notebook's
    seed, which drew the questions, stays in it as arms.data_key's data_seed."""
    run_cfg = dataclasses.replace(cfg, seed=training_seed)
    return run_cfg, {**key, **arms.data_key(key["seed"]), "seed": training_seed, "grpo": str(run_cfg)}


def gain_table(base: dict, runs: list, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Held-out accuracy and the gain over the base model at each evaluated step (step 0: the base model), over
    training seeds. runs: one list of step rows per seed (train_curve), evaluated at the same steps. Per step: the
    mean accuracy (lenient, strict), each seed's accuracy, the gain over the base on the same problems with its
    95% interval over seeds, then problems (stats.two_level_bootstrap of the seeds x problems paired differences),
    and each seed's gain."""
    evals = [[{**r, "step": r["step"] + 1} for r in rows if "eval_correct" in r] for rows in runs]
    if not evals or len({tuple(r["step"] for r in e) for e in evals}) != 1:
        raise ValueError("every seed's run must be evaluated at the same steps")
    b = np.asarray(base["eval_correct"], float)
    out = []
    for k, step in enumerate([0] + [r["step"] for r in evals[0]]):
        points = [base] * len(evals) if step == 0 else [e[k - 1] for e in evals]
        correct = np.array([r["eval_correct"] for r in points], float)  # (seeds, problems)
        d, lo, hi = stats.two_level_bootstrap(correct - b, n_boot=n_boot, seed=config.derive_seed(seed, "yardstick-gain", step),
                                              bounds=(-1, 1))
        out.append({"step": step, "seeds": len(points), "n": correct.shape[1], "accuracy": float(correct.mean()),
                    "strict": float(np.mean([r["eval_strict_correct"] for r in points])),
                    "tokens": float(np.mean([r["eval_tokens"] for r in points])),
                    "seed_accuracy": [float(x) for x in correct.mean(1)], "gain": d, "gain_low": lo, "gain_high": hi,
                    "seed_gains": [float(x) for x in (correct - b).mean(1)]})
    return pd.DataFrame(out)


def steps_to_gain(table: pd.DataFrame):
    """The first evaluated step whose gain over the base model has a 95% interval above 0 (None if none)."""
    hit = table[(table["step"] > 0) & (table["gain_low"] > 0)]
    return int(hit["step"].iloc[0]) if len(hit) else None


def heldout_frame(row: dict) -> pd.DataFrame:
    """A held-out evaluation's per-problem correctness as the table arms.compare pairs (qid, correct)."""
    return pd.DataFrame({"qid": range(len(row["eval_correct"])), "correct": row["eval_correct"]})


def summary(gains: pd.DataFrame, runs: list, cfg: dict, base: dict, n_boot: int = 2000) -> tuple:
    """The yardstick's outcome over training seeds and its arm records, one per seed (arms.record), each with the
    one health check (arms.health): the training reward's rise, the final held-out accuracy against the base
    model's (base: heldout_row of the base model), reply lengths. gains: gain_table over the same runs (one list of
    step rows per seed); cfg: level, shots, temperature, lr, steps, prompts_per_step, group_size, eval_every, seed
    and seeds (the training seeds). The final gain is arms.compare's (seeds, then problems), the last row of gains."""
    k, last = cfg["eval_every"], gains.iloc[-1]
    name = f"rlvr lr {cfg['lr']:g}"
    finals, records = [], []
    for s, rows in zip(cfg["seeds"], runs):
        steps = pd.DataFrame(rows)
        final = [r for r in rows if "eval_correct" in r][-1]
        check = arms.health(arms.reward_rise(steps["reward_mean"], n_boot=n_boot, seed=config.derive_seed(s, "health")),
                            final["eval_correct"], base["eval_correct"], [final["eval_tokens"]], [base["eval_tokens"]],
                            train_tokens=steps["completion_len"] if "completion_len" in steps else None)
        records.append(arms.record(name, final["eval_correct"], cfg["steps"], cfg["steps"] * cfg["prompts_per_step"] * cfg["group_size"],
                                   check, seed=s, reward_first=float(steps["reward_mean"][:k].mean()),
                                   reward_last=float(steps["reward_mean"][-k:].mean()),
                                   zero_gradient_groups=float(steps["zero_std_frac"].mean())))
        finals.append(final)
    c = arms.compare(name, "base", {name: [heldout_frame(f) for f in finals], "base": heldout_frame(base)},
                     {name: records, "base": arms.record("base", base["eval_correct"])}, n_boot=n_boot,
                     seed=config.derive_seed(cfg.get("seed", 0), "yardstick-gain", int(last["step"])))
    out = {**{n: cfg[n] for n in ("level", "shots", "temperature", "lr", "steps", "prompts_per_step", "group_size")},
           "seeds": list(cfg["seeds"]), "n": c["n"], "n_heldout": int(last["n"]), "base_accuracy": float(gains["accuracy"].iloc[0]),
           "final_accuracy": float(last["accuracy"]), "seed_accuracy": list(last["seed_accuracy"]),
           "gain": [c["difference"], *c["ci95"]], "seed_gains": c["per_seed"],
           "probability_of_improvement": c["probability_of_improvement"],
           "gain_excludes_0": bool(c["ci95"][0] > 0 or c["ci95"][1] < 0), "steps_to_gain": steps_to_gain(gains),
           "zero_gradient_groups": float(np.mean([r["zero_gradient_groups"] for r in records])),
           "reward_first": float(np.mean([r["reward_first"] for r in records])),
           "reward_last": float(np.mean([r["reward_last"] for r in records])),
           "tokens_base": float(base["eval_tokens"]), "tokens_last": float(last["tokens"]), "health": c["basis"]["health"]}
    return out, records


def fresh_policy(model_name: str, lora_r: int, seed: int):
    """The base model with a new LoRA adapter whose initialisation is seeded (the same for every run of a sweep; a
    training seed's own for the seeds of the chosen run)."""
    import torch

    model, tok = models.load_model(model_name)
    torch.manual_seed(config.derive_seed(seed, "yardstick-lora"))
    return models.add_lora(model, r=lora_r, alpha=2 * lora_r), tok


def train_in_folder(model_name: str, lora_r: int, policy_seed: int, **kw) -> None:
    """train_curve on a fresh policy (fresh_policy), for its folder only (a worker of train_runs)."""
    policy, tok = fresh_policy(model_name, lora_r, policy_seed)
    train_curve(policy, tok, progress=False, **kw)


def finished(folder: loop.RunFolder, steps: int) -> bool:
    """The run in `folder` has trained at least `steps` steps (its done marker says how many)."""
    return folder.done and files.read_json(folder.path / "done.json").get("steps", 0) >= steps


def train_runs(model_name: str, lora_r: int, runs, workers: int = 1) -> list:
    """train_curve for each of `runs` (dicts: policy_seed and train_curve's arguments but the model and tokenizer:
    schedule, cfg, steps, folder) on a fresh policy (fresh_policy(model_name, lora_r, policy_seed)), in order:
    their rows. With workers > 1 the runs not finished in their folders first train side by side, each in its own
    process at one thread (parallel.run_jobs); each is then read back here from its folder (not counted as reuse).
    A run's rows do not depend on where it trained but for the rounding of one thread: fresh_policy seeds its
    adapter and the training draws and samples from cfg.seed."""
    runs = list(runs)

    def pending(i):
        return None if finished(runs[i]["folder"], runs[i]["steps"]) else dict(model_name=model_name, lora_r=lora_r, **runs[i])

    def read(i):
        r = dict(runs[i])
        policy, tok = fresh_policy(model_name, lora_r, r.pop("policy_seed"))
        return train_curve(policy, tok, **r)

    return parallel.made_then_read(range(len(runs)), pending, train_in_folder, read, workers, "yardstick runs")[0]


def choose_lr(summary: pd.DataFrame) -> float:
    """The sweep's pick, by a rule fixed in advance that does not look at held-out data: the learning rate with
    the highest training reward over the last third of its steps."""
    return float(summary.loc[summary["reward_last"].idxmax(), "lr"])


def sweep_summary(runs: dict) -> pd.DataFrame:
    """One row per learning rate {lr: rows}: training reward over the first and last third of its steps, the
    share of zero-gradient groups, reply tokens, and its last held-out accuracy."""
    out = []
    for lr, rows in runs.items():
        r = pd.DataFrame(rows)
        third = max(1, len(r) // 3)
        last = r.dropna(subset=["eval_accuracy"]).iloc[-1] if "eval_accuracy" in r else None
        out.append({"lr": lr, "steps": len(r), "reward_first": float(r["reward_mean"][:third].mean()),
                    "reward_last": float(r["reward_mean"][-third:].mean()), "zero_gradient_groups": float(r["zero_std_frac"].mean()),
                    "tokens_last": float(r["completion_len"][-third:].mean()),
                    "heldout_accuracy": None if last is None else float(last["eval_accuracy"])})
    return pd.DataFrame(out)
