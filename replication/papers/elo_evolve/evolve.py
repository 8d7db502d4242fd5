"""Elo-Evolve on the real model: an opponent pool of precomputed responses and the training regimes (point, static,
Elo-orchestrated) as a step function on the resumable loop (what every arm run shares: ArmSetting; the opponents'
replies and ratings it reads: Opponents), with the degradation schedule of the temperature analysis
(from a stated step the strongest opponent's responses are replaced by a weaker one's, its rating kept) and the fork
that starts a degraded run from its undegraded twin's checkpoint at that step. The judges and the win/loss reward are
in replication.papers.elo_evolve.judging; training an arm with its held-out evaluation, the judge's accuracy and the
comparison of Table 1 are in replication.papers.elo_evolve.evolve_eval.
"""
import json
import shutil
from dataclasses import asdict, dataclass, replace

import numpy as np

from replication.core import config, files
from replication.lm import elo, grpo, loop, models, tasks
from .judging import correct, outcomes, words

REGIMES = ("point", "static", "elo")
START_PLAYER = "policy at start"   # the pool's anchor: the base model sampling at the training temperature


# ---------------------------------------------------------------- opponent pool

@dataclass
class OpponentSpec:
    """How one opponent answers: sampling temperature (0: greedy), best-of-n under the exact verifier (right
    whenever one of its n samples is), and worked examples in its prompt."""

    name: str
    temperature: float = 0.0
    best_of: int = 1
    shots: int = 0


def opponent_specs(opponents: dict, start_temperature: float, start_shots: int = 0) -> list:
    """OpponentSpecs from {name: [temperature, best of, shots]}, then the anchor START_PLAYER (the base model
    sampling once at the training temperature with the policy's prompt)."""
    specs = [OpponentSpec(n, float(v[0]), int(v[1]), int(v[2]) if len(v) > 2 else 0) for n, v in opponents.items()]
    return specs + [OpponentSpec(START_PLAYER, float(start_temperature), 1, int(start_shots))]


def build_pool(model, tok, problems, specs, max_new_tokens: int = 32, seed: int = 0, level: str = None,
               progress: bool = True) -> dict:
    """{opponent name: one response per problem}. Opponents with the same temperature and shots share their
    candidates, so best-of-4 picks from best-of-1's sample plus three more. Shots are worked examples of
    `level` (default: the problems' own level is unknown, so pass it). Cache it with run.cached."""
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"opponent names {names} must be unique")
    candidates = {}
    for t, k in sorted({(s.temperature, s.shots) for s in specs}):
        n = max(s.best_of for s in specs if (s.temperature, s.shots) == (t, k))
        config.check_int("best_of", n)
        if k and level is None:
            raise ValueError("level=None is not allowed when an opponent uses shots; name the level of the worked examples")
        shots = tasks.worked_examples(level, k, seed) if k else []
        gen = models.generate(model, tok, [p.chat(shots) for p in problems], max_new_tokens, temperature=t, repeats=n,
                              progress=progress, seed=config.derive_seed(seed, "pool", t, k))
        candidates[(t, k)] = [gen.texts[j * n:(j + 1) * n] for j in range(len(problems))]
    out = {}
    for s in specs:
        c = candidates[(s.temperature, s.shots)]
        out[s.name] = [next((r for r in rs[:s.best_of] if tasks.verify(r, p.answer)), rs[0]) for rs, p in zip(c, problems)]
    return out


def pool_key(model_name: str, problems, specs, max_new_tokens: int, seed: int, level: str = None) -> dict:
    """What a cached pool depends on."""
    return {"model": str(model_name), "problems": [p.id + "|" + p.question for p in problems], "level": level,
            "specs": [asdict(s) for s in specs], "max_new_tokens": max_new_tokens, "seed": seed, "best_of": "verifier"}


def win_matrix(judge, problems, players: dict) -> np.ndarray:
    """Mean P(row beats column) over problems, for every pair of players (round robin)."""
    names = list(players)
    qs, ans = [p.question for p in problems], [p.answer for p in problems]
    m = np.full((len(names), len(names)), 0.5)
    for i, a in enumerate(names):
        for j, b in enumerate(names[i + 1:], i + 1):
            m[i, j] = float(np.mean(judge.p_win(qs, ans, players[a], players[b])))
            m[j, i] = 1 - m[i, j]
    return m


def pool_table(responses: dict, specs, problems, ratings):
    """One row per player: how it samples, accuracy, format rate, words and fitted rating."""
    import pandas as pd

    rows = []
    for s, rating in zip(specs, ratings):
        r = responses[s.name]
        how = "greedy" if s.temperature == 0 else f"T = {s.temperature:g}"
        rows.append({"player": s.name, "sampling": how + (f", best of {s.best_of}" if s.best_of > 1 else "")
                     + (f", {s.shots} shots" if s.shots else ""),
                     "accuracy": np.mean([correct(x, p.answer) for x, p in zip(r, problems)]),
                     "format": np.mean([tasks.has_format(x) for x in r]),
                     "words": np.mean([words(x) for x in r]), "rating": float(rating)})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- training

@dataclass
class EvolveConfig:
    """One training regime: point (absolute scores), static (one opponent) or elo (per-prompt opponents)."""

    regime: str = "elo"
    opponent: str = None          # the static regime's opponent
    temperature: float = 200.0    # Elo sampling temperature T
    k: float = 32.0               # Elo K-factor
    update_rule: str = "mean"     # elo.update rule
    start_rating: float = 1350.0
    steps: int = 10
    prompts_per_step: int = 4
    length_margin: int = 60       # words
    seed: int = 0
    degrade_step: int = None      # from this step on the strongest opponent answers with degrade_with's responses
    degrade_with: str = None      # (its rating kept; None: no degradation)

    def validate(self, names) -> "EvolveConfig":
        config.check_choice("regime", self.regime, REGIMES)
        if self.regime == "static":
            config.check_choice("opponent", self.opponent, tuple(names))
        if self.degrade_step is not None:
            if self.regime == "point":
                raise ValueError("degrade_step is not allowed with regime 'point'; it plays no opponent")
            config.check_int("degrade_step", self.degrade_step)
            if self.degrade_step >= self.steps:
                raise ValueError(f"degrade_step={self.degrade_step} is not allowed; it must be below steps={self.steps}")
            config.check_choice("degrade_with", self.degrade_with, tuple(names))
        config.check_choice("update_rule", self.update_rule, elo.UPDATE_RULES)
        config.check_int("steps", self.steps)
        config.check_int("prompts_per_step", self.prompts_per_step)
        config.check_int("length_margin", self.length_margin, minimum=0)
        if not isinstance(self.temperature, (int, float)) or self.temperature <= 0:
            raise ValueError(f"temperature={self.temperature!r} is not allowed; T must be > 0")
        return self


def regimes(static_opponent: str, temperatures, degrade_temperatures=None, degrade_step: int = None,
            degrade_with: str = None, **common) -> dict:
    """The compared arms by name: point, static-<opponent>, elo-T<T> for each T, then elo-T<T>-degraded for each T of
    degrade_temperatures (the same run with the strongest opponent degraded from degrade_step on)."""
    out = {"point": EvolveConfig(regime="point", **common),
           f"static-{static_opponent}": EvolveConfig(regime="static", opponent=static_opponent, **common),
           **{f"elo-T{T:g}": EvolveConfig(regime="elo", temperature=float(T), **common) for T in temperatures}}
    for T in degrade_temperatures or ():
        if f"elo-T{T:g}" not in out:
            raise ValueError(f"degrade_temperatures holds {T!r}, which is not one of temperatures {list(temperatures)}")
        out[f"elo-T{T:g}-degraded"] = replace(out[f"elo-T{T:g}"], degrade_step=degrade_step, degrade_with=degrade_with)
    return out


def table1_arms(arms: dict) -> tuple:
    """The arms of Table 1 by name: point, the static arm, and Elo-Evolve at T = 200 (the paper's choice), or at the
    first temperature trained when 200 is not."""
    point = next(n for n, c in arms.items() if c.regime == "point")
    static = next(n for n, c in arms.items() if c.regime == "static")
    elo_arms = [n for n, c in arms.items() if c.regime == "elo" and c.degrade_step is None]
    return point, static, next((n for n in elo_arms if arms[n].temperature == 200.0), elo_arms[0])


def degrade_source(name: str, cfg: EvolveConfig):
    """(name, config) of the undegraded run a degraded arm shares its first degrade_step steps with, or None."""
    if cfg.degrade_step is None:
        return None
    return name.removesuffix("-degraded"), replace(cfg, degrade_step=None, degrade_with=None)


def strongest(names, ratings) -> str:
    """The opponent with the highest rating (the one the temperature analysis degrades)."""
    return list(names)[int(np.argmax(np.asarray(ratings, float)))]


def pool_at(pool: dict, ratings, cfg: EvolveConfig, step: int) -> tuple:
    """(the responses each opponent answers with at `step`, degraded?). Before cfg.degrade_step: the pool as built.
    From it on: the strongest-rated opponent's responses are degrade_with's; every rating stays as given (the
    paper keeps opponent ratings fixed, so the policy's expected score against it still reads the old rating)."""
    if cfg.degrade_step is None or step < cfg.degrade_step:
        return pool, False
    top = strongest(list(pool), ratings)
    return {**pool, top: pool[cfg.degrade_with]}, True


def fork(source, target, step: int) -> bool:
    """Start the run in `target` (loop.RunFolder) from `source`'s checkpoint after `step` steps and its log up to
    there, so that a degraded run reuses its undegraded twin's first steps (identical up to the degradation: the
    same config, seeds and draws; loop.run then resumes from the copy, weights, optimizer, RNG and rating included).
    Nothing is done when target already has a checkpoint or source has none at `step`. True when forked."""
    ckpt = source.path / "checkpoints" / f"step_{step:06d}.pt"
    if target.latest() is not None or target.done or not ckpt.is_file():
        return False
    rows = [r for r in source.rows() if r["step"] < step]
    if len(rows) != step:
        return False
    (target.path / "checkpoints").mkdir(parents=True, exist_ok=True)
    tmp = target.path / "checkpoints" / f"step_{step:06d}.tmp"
    shutil.copyfile(ckpt, tmp)
    files.write_text(target.log_path, "".join(json.dumps(r) + "\n" for r in rows))
    target.mark_copied(step, source.path.name)
    tmp.replace(tmp.with_suffix(".pt"))
    return True


class Arena:
    """The GRPO reward function: each completion against its prompt's opponent response (pairwise regimes)
    or scored alone (point regime). Side data goes through the trainer's callables: log_metric for the
    rollouts' accuracy, format rate and words; log_extra('outcome', ...) for the win / loss / tie of every
    completion (the Elo update reads it from rollout.extras). `rng` draws the judge's noise."""

    def __init__(self, judge, regime: str, length_margin: int = 60):
        self.judge, self.regime, self.length_margin = judge, regime, length_margin
        self.rng = np.random.default_rng(0)

    def __call__(self, prompts, completions, metadata, log_metric=None, log_extra=None):
        qs, ans = [m["question"] for m in metadata], [m["answer"] for m in metadata]
        if log_metric is not None:
            log_metric("rollout_accuracy", np.mean([correct(c, a) for c, a in zip(completions, ans)]))
            log_metric("rollout_format_rate", np.mean([tasks.has_format(c) for c in completions]))
            log_metric("rollout_words", np.mean([words(c) for c in completions]))
        if self.regime == "point":
            return self.judge.scores(qs, ans, completions, self.rng).tolist()
        s = outcomes(self.judge, qs, ans, completions, [m["opponent_response"] for m in metadata], self.rng,
                     self.length_margin)
        if log_extra is not None:
            log_extra("outcome", s.tolist())
        return s.tolist()


def choose(cfg: EvolveConfig, rating: float, names, ratings, rng):
    """Opponent index per prompt of a step and the probabilities they were drawn from (elo.sampling_probs)."""
    n = len(names)
    if cfg.regime == "point":
        return None, np.zeros(n)
    probs = np.eye(n)[list(names).index(cfg.opponent)] if cfg.regime == "static" else \
        elo.sampling_probs(rating, ratings, cfg.temperature)
    return rng.choice(n, size=cfg.prompts_per_step, p=probs), probs


@dataclass(frozen=True)
class ArmSetting:
    """What every arm run of notebook 02 shares, whichever regime or judge trains it: the policy model's name, the
    training problems and the policy's worked examples; for the held-out test the problems, the base model's replies
    to them (the reference) and the evaluation judge (None: the training judge); the LoRA rank; progress bars."""

    model: str
    problems: tuple
    shots: tuple = ()
    heldout: tuple = ()
    reference: tuple = ()
    eval_judge: object = None
    lora_r: int = 16
    progress: bool = True


@dataclass(frozen=True)
class Opponents:
    """The opponent pool as training reads it: each opponent's reply to every training problem, and the opponents'
    fixed ratings in the same order."""

    replies: dict
    ratings: tuple


def train(model, tok, judge, setting: ArmSetting, opponents: Opponents, cfg: EvolveConfig, grpo_cfg,
          folder=None) -> list:
    """GRPO steps of one regime on loop.run (resumable; the policy's Elo is the loop's state, a finished run
    loads its final weights) on setting.problems, prompts p.chat(setting.shots). Logs per step the reward, opponent
    probabilities, opponents, outcomes and their expected scores, and the policy's Elo before and after the step's
    update."""
    import torch

    problems, shots, pool = setting.problems, setting.shots, opponents.replies
    names, ratings = list(pool), np.asarray(opponents.ratings, float)
    cfg.validate(names)
    if len(ratings) != len(names):
        raise ValueError(f"ratings has {len(ratings)} entries for {len(names)} opponents")
    config.check_range("prompts_per_step", cfg.prompts_per_step, 1, len(problems))
    arena = Arena(judge, cfg.regime, cfg.length_margin)
    trainer = grpo.GRPOTrainer(model, tok, arena, grpo_cfg)
    G = grpo_cfg.num_generations

    def step(t: int, state: dict) -> dict:
        rng = np.random.default_rng(config.derive_seed(cfg.seed, "evolve-step", t))
        idx = rng.choice(len(problems), size=cfg.prompts_per_step, replace=False)
        rating = state["rating"]
        opp, probs = choose(cfg, rating, names, ratings, rng)
        answers, degraded = pool_at(pool, ratings, cfg, t)
        meta = [{"question": problems[i].question, "answer": problems[i].answer,
                 "opponent_response": None if opp is None else answers[names[o]][i]}
                for i, o in zip(idx, [0] * len(idx) if opp is None else opp)]
        arena.rng = np.random.default_rng(config.derive_seed(cfg.seed, "judge", t))
        torch.manual_seed(config.derive_seed(grpo_cfg.seed, "grpo-step", t))
        trainer.timer.seconds.clear()
        batch = trainer.rollout([problems[i].chat(shots) for i in idx], meta)
        row = {**grpo.step_stats(batch), **trainer.update(batch), **trainer.times(batch),
               "regime": cfg.regime, "samples": len(batch), "rating_before": rating, "probs": probs.tolist(),
               "degraded": degraded, "prompts": [int(i) for i in idx]}
        if "outcome" in batch.extras:
            s, opp_r = np.asarray(batch.extras["outcome"], float), np.repeat(ratings[opp], G)
            row.update(win_rate=float(s.mean()), opponents=[names[o] for o in opp], outcomes=s.tolist(),
                       expected=elo.expected_score(rating, opp_r).tolist())
            state["rating"] = elo.update(rating, s, opp_r, cfg.k, cfg.update_rule)
        row["rating"] = state["rating"]
        return row

    rows, _ = loop.run(step, cfg.steps, model, trainer.optimizer, folder, state={"rating": float(cfg.start_rating)},
                       save_every=grpo_cfg.save_every, desc=cfg.regime, summary={"config": asdict(cfg)},
                       postfix=lambda r: {"reward": f"{r['reward_mean']:.2f}", "elo": f"{r['rating']:.0f}"},
                       progress=setting.progress)
    return rows


def run_key(model_name: str, cfg: EvolveConfig, grpo_cfg, lora_r: int, pool: dict, ratings, extra: dict = None) -> dict:
    """What a training run depends on: for run.run_folder(name, run_key(...))."""
    regime = {k: v for k, v in asdict(cfg).items() if v is not None or k not in ("degrade_step", "degrade_with")}
    return {"regime": regime, "grpo": asdict(grpo_cfg), "model": str(model_name), "lora_r": lora_r,
            "pool": files.digest(pool), "ratings": [float(r) for r in ratings], "lora_init": "evolve-lora", **(extra or {})}
