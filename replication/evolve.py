"""Elo-Evolve on the real model: an opponent pool of precomputed responses, pairwise and absolute judges,
the win/loss reward with the length rule, the training regimes (point, static, Elo-orchestrated) as a
step function on the resumable loop, and the held-out comparison of Table 1.

The stand-in judge (documented in notebook 02): a response's quality on the arithmetic task is
q = 1 + 2 * correct + 1 * format (1..4). A comparison is a Thurstone draw, P(policy wins) =
Phi((q_policy - q_opponent) / sigma_comp); an absolute score is q + N(0, sigma_abs^2).
"""
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as sps

from . import config, elo, files, loop, models, paper, stats, tasks

REGIMES = ("point", "static", "elo")
START_PLAYER = "policy at start"   # the pool's anchor: the base model sampling at the training temperature


def quality(response: str, answer) -> float:
    """q = 1 + 2 * (answer correct) + 1 * (answer stated as 'The answer is N'), in 1..4."""
    return 1.0 + 2.0 * tasks.verify(response, answer) + 1.0 * tasks.has_format(response)


def words(text: str) -> int:
    """Whitespace-separated words, as the length rule counts them."""
    return len((text or "").split())


def identical(a, b) -> np.ndarray:
    """True where two responses are the same text (a tie)."""
    return np.array([x.strip() == y.strip() for x, y in zip(a, b)], bool)


class QualityJudge:
    """The stand-in judge: Thurstone comparisons and noisy absolute scores of the task's quality function."""

    name = "quality"

    def __init__(self, sigma_comp: float = 1.0, sigma_abs: float = 3.21):
        for n, v in (("sigma_comp", sigma_comp), ("sigma_abs", sigma_abs)):
            if not isinstance(v, (int, float)) or v <= 0:
                raise ValueError(f"{n}={v!r} is not allowed; a judge's noise must be > 0")
        self.sigma_comp, self.sigma_abs = float(sigma_comp), float(sigma_abs)

    def p_win(self, questions, answers, a, b) -> np.ndarray:
        """P(a beats b) per item; identical responses are a tie (0.5)."""
        qa = np.array([quality(x, ans) for x, ans in zip(a, answers)])
        qb = np.array([quality(x, ans) for x, ans in zip(b, answers)])
        return np.where(identical(a, b), 0.5, sps.norm.cdf((qa - qb) / self.sigma_comp))

    def scores(self, questions, answers, responses, rng) -> np.ndarray:
        """One noisy absolute score per response."""
        q = np.array([quality(x, ans) for x, ans in zip(responses, answers)])
        return q + rng.normal(0.0, self.sigma_abs, size=len(q))


class LLMJudge:
    """A prompted LLM judge read from its next-token distribution, in both orders (notebook 01's judge)."""

    name = "llm"

    def __init__(self, model, tok, batch_size: int = 16):
        self.model, self.tok, self.batch_size = model, tok, batch_size

    def p_win(self, questions, answers, a, b) -> np.ndarray:
        from . import judges

        p = judges.pairwise(self.model, self.tok, questions, a, b, k=1, batch_size=self.batch_size)["p_better"]
        return np.where(identical(a, b), 0.5, p.to_numpy())

    def scores(self, questions, answers, responses, rng) -> np.ndarray:
        from . import judges

        probs, _ = judges.absolute(self.model, self.tok, questions, responses, k=1, batch_size=self.batch_size)
        return np.array([rng.choice(5, p=p / p.sum()) + 1 for p in probs], float)


def outcomes(judge, questions, answers, policy, opponent, rng, length_margin: int = 20) -> np.ndarray:
    """Win (1) / loss (0) / tie (0.5) of each policy response against the opponent's, drawn from the judge;
    0 when the policy response is longer than the opponent's by more than length_margin words."""
    config.check_int("length_margin", length_margin, minimum=0)
    p = judge.p_win(questions, answers, policy, opponent)
    s = np.where(identical(policy, opponent), 0.5, (rng.random(len(p)) < p).astype(float))
    too_long = np.array([words(x) - words(y) > length_margin for x, y in zip(policy, opponent)], bool)
    return np.where(too_long, 0.0, s)


# ---------------------------------------------------------------- opponent pool

@dataclass
class OpponentSpec:
    """How one opponent answers: sampling temperature, and best-of-n under the quality function."""

    name: str
    temperature: float = 0.0
    best_of: int = 1


def opponent_specs(opponents: dict, start_temperature: float) -> list:
    """OpponentSpecs from {name: [temperature, best of]}, then the anchor START_PLAYER (the base model
    sampling once at the training temperature)."""
    specs = [OpponentSpec(n, float(t), int(b)) for n, (t, b) in opponents.items()]
    return specs + [OpponentSpec(START_PLAYER, float(start_temperature), 1)]


def build_pool(model, tok, problems, specs, max_new_tokens: int = 48, seed: int = 0, progress: bool = True) -> dict:
    """{opponent name: one response per problem}. Opponents sampling at the same temperature share their
    candidates, so best-of-4 picks from best-of-1's sample plus three more (it is never worse per problem).
    Cache it with run.cached("evolve_pool", pool_key(...), ...)."""
    prompts = [p.prompt() for p in problems]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"opponent names {names} must be unique")
    candidates = {}
    for t in sorted({s.temperature for s in specs}):
        n = max(s.best_of for s in specs if s.temperature == t)
        config.check_int("best_of", n)
        gen = models.generate(model, tok, prompts, max_new_tokens, temperature=t, repeats=n, progress=progress,
                              seed=config.derive_seed(seed, "pool", t))
        candidates[t] = [gen.texts[j * n:(j + 1) * n] for j in range(len(problems))]
    best = lambda c, answer: c[int(np.argmax([quality(r, answer) for r in c]))]  # noqa: E731  (first of the best)
    return {s.name: [best(c[:s.best_of], p.answer) for c, p in zip(candidates[s.temperature], problems)] for s in specs}


def pool_key(model_name: str, problems, specs, max_new_tokens: int, seed: int) -> dict:
    """What a cached pool depends on."""
    return {"model": str(model_name), "problems": [p.id + "|" + p.question for p in problems],
            "specs": [asdict(s) for s in specs], "max_new_tokens": max_new_tokens, "seed": seed}


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
    """One row per player: how it samples, mean quality, accuracy, format rate, words and fitted rating."""
    import pandas as pd

    rows = []
    for s, rating in zip(specs, ratings):
        r = responses[s.name]
        rows.append({"player": s.name, "sampling": f"T = {s.temperature:g}" + (f", best of {s.best_of}" if s.best_of > 1 else ""),
                     "quality": np.mean([quality(x, p.answer) for x, p in zip(r, problems)]),
                     "accuracy": np.mean([tasks.verify(x, p.answer) for x, p in zip(r, problems)]),
                     "format": np.mean([tasks.has_format(x) for x in r]),
                     "words": np.mean([words(x) for x in r]), "rating": float(rating)})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- held-out comparison

def judge_heldout(model, tok, judge, problems, reference, max_new_tokens: int = 48, seed: int = 0,
                  progress: bool = True, replies=None):
    """Table 1 at this scale: greedy replies on held-out problems (tasks.evaluate), or the given replies,
    judged against the reference replies. Per-problem rows and a summary with the win rate, the
    length-controlled win rate and task accuracy with their 95% intervals (replication.stats; the
    bootstrap seed is derived from `seed`)."""
    import pandas as pd

    if replies is None:
        replies = tasks.evaluate(model, tok, problems, max_new_tokens, progress=progress)["reply"].tolist()  # greedy
    qs, ans = [p.question for p in problems], [p.answer for p in problems]
    df = pd.DataFrame({"id": [p.id for p in problems], "reply": list(replies), "reference": list(reference),
                       "p_win": judge.p_win(qs, ans, replies, reference),
                       "correct": [tasks.verify(t, a) for t, a in zip(replies, ans)],
                       "format": [tasks.has_format(t) for t in replies],
                       "words": [words(t) for t in replies], "ref_words": [words(t) for t in reference]})
    wr = stats.win_rate(df["p_win"], seed=config.derive_seed(seed, "win-rate"))
    lc = stats.lc_win_rate(df["p_win"], df["words"], df["ref_words"])
    acc, lo, hi = stats.proportion_ci(int(df["correct"].sum()), len(df))
    return df, {"win_rate": wr["win_rate"], "win_rate_ci95": wr["ci95"], "lc_win_rate": lc["lc_win_rate"],
                "lc_win_rate_ci95": lc["ci95"], "length_coef": lc["length_coef"], "accuracy": acc,
                "accuracy_ci95": [lo, hi], "format_rate": float(df["format"].mean()),
                "mean_words": float(df["words"].mean()), "n": len(df)}


def paired_comparisons(evals: dict, results: dict, seed: int = 0) -> dict:
    """Point < static pairwise < Elo-Evolve on the same held-out problems: paired bootstrap differences
    (stats.paired_bootstrap) of the per-problem win probability against the reference, for the best Elo
    run (by win rate) minus point, best Elo minus the static runs' mean, and static mean minus point."""
    p = {n: np.asarray(e["p_win"], float) for n, e in evals.items()}
    elo_runs, static_runs = [n for n in p if n.startswith("elo")], [n for n in p if n.startswith("static")]
    best = max(elo_runs, key=lambda n: results[n]["win_rate"])
    static = np.mean([p[n] for n in static_runs], axis=0)
    diff = lambda a, b, what: stats.paired_bootstrap(a, b, seed=config.derive_seed(seed, "paired", what))  # noqa: E731
    return {"elo_best": best, "static_runs": static_runs, "n": len(static),
            "win_rates": {"point": float(p["point"].mean()), "static": float(static.mean()), "elo": float(p[best].mean())},
            "elo_minus_point": diff(p[best], p["point"], "elo-point"),
            "elo_minus_static": diff(p[best], static, "elo-static"),
            "static_minus_point": diff(static, p["point"], "static-point")}


def lc_difference(a, b, n_boot: int = 1000, seed: int = 0):
    """(LC win rate of a - that of b, low, high) on the same held-out problems: stats.lc_win_rate of each,
    with a percentile bootstrap over problems (stats.bootstrap). a, b: judge_heldout rows."""
    cols = [np.asarray(x[c], float) for x, c in ((a, "p_win"), (a, "words"), (b, "p_win"), (b, "words"), (a, "ref_words"))]
    gap = lambda pa, wa, pb, wb, ref: (stats.lc_win_rate(pa, wa, ref)["lc_win_rate"]  # noqa: E731
                                       - stats.lc_win_rate(pb, wb, ref)["lc_win_rate"])
    return stats.bootstrap(gap, *cols, n_boot=n_boot, seed=config.derive_seed(seed, "lc-difference"))


def rating_rise(rows, k: float, n_boot: int = 2000, seed: int = 0):
    """(change of the policy's Elo over a run under the mean rule, low, high): K times the sum over steps of
    the mean of (S - E), with a bootstrap interval resampling prompts (a prompt's G matches share its
    opponent), and the number of prompts. rows: an Elo run's step rows (they log outcomes and expected)."""
    d, groups = [], []
    for r in rows:
        s, e = np.asarray(r["outcomes"], float), np.asarray(r["expected"], float)
        g = len(s) // len(r["opponents"])
        d += (s - e).tolist()
        groups += [f"{r['step']}-{i // g}" for i in range(len(s))]
    rise = stats.bootstrap(lambda x: k * len(rows) * x.mean(), np.array(d), groups=groups, n_boot=n_boot,
                           seed=config.derive_seed(seed, "rating-rise"))
    return rise, len(set(groups))


def paper_table1(step: int = 500):
    """The paper's AlpacaEval 2.0 WR and LC (Table 1) after `step` steps, base at step 0: regime x metric."""
    t = paper.table("elo_evolve_table1")
    t = t[t["step"].isin([0, step]) & t["metric"].isin(["alpacaeval_wr", "alpacaeval_lc"])]
    return t.pivot_table(index="regime", columns="metric", values="value")


def results_table(results: dict, opp_names, step: int = 500):
    """Each regime's held-out win rate, LC win rate and accuracy with 95% intervals, format, words, steps and
    training seconds, beside the paper's WR / LC at `step` (static runs matched by strength order)."""
    import pandas as pd

    at = paper_table1(step)
    match = {"base": "base", "point": "point",
             **{f"static-{n}": r for n, r in zip(opp_names, ("static-weak", "static-mid", "static-strong"))}}
    ci = lambda r, key: f"{r[key]:.3f} [{r[key + '_ci95'][0]:.3f}, {r[key + '_ci95'][1]:.3f}]"  # noqa: E731
    rows = []
    for name, r in results.items():
        reg = "elo" if name.startswith("elo") else match.get(name)
        rows.append({"regime": name, "win rate": ci(r, "win_rate"), "LC win rate": ci(r, "lc_win_rate"),
                     "accuracy": ci(r, "accuracy"), "format": round(r["format_rate"], 3),
                     "words": round(r["mean_words"], 1), "steps": r.get("steps", 0), "train s": round(r.get("wall_time_s", 0.0)),
                     f"paper WR/LC @{step}": (f"{at.loc[reg, 'alpacaeval_wr']:.2f} / {at.loc[reg, 'alpacaeval_lc']:.2f}"
                                              if reg in at.index else "")})
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
    length_margin: int = 20       # words
    seed: int = 0

    def validate(self, names) -> "EvolveConfig":
        config.check_choice("regime", self.regime, REGIMES)
        if self.regime == "static":
            config.check_choice("opponent", self.opponent, tuple(names))
        config.check_choice("update_rule", self.update_rule, elo.UPDATE_RULES)
        config.check_int("steps", self.steps)
        config.check_int("prompts_per_step", self.prompts_per_step)
        config.check_int("length_margin", self.length_margin, minimum=0)
        if not isinstance(self.temperature, (int, float)) or self.temperature <= 0:
            raise ValueError(f"temperature={self.temperature!r} is not allowed; T must be > 0")
        return self


def regimes(opp_names, temperatures, **common) -> dict:
    """The compared regimes by name: point, static-<opponent> for each opponent, elo-T<T> for each T."""
    return {"point": EvolveConfig(regime="point", **common),
            **{f"static-{n}": EvolveConfig(regime="static", opponent=n, **common) for n in opp_names},
            **{f"elo-T{T:g}": EvolveConfig(regime="elo", temperature=float(T), **common) for T in temperatures}}


class Arena:
    """The GRPO reward function: each completion against its prompt's opponent response (pairwise regimes)
    or scored alone (point regime). Side data goes through the trainer's callables: log_metric for the
    rollouts' mean quality, accuracy, format rate and words; log_extra('outcome', ...) for the win / loss /
    tie of every completion (the Elo update reads it from rollout.extras). `rng` draws the judge's noise."""

    def __init__(self, judge, regime: str, length_margin: int = 20):
        self.judge, self.regime, self.length_margin = judge, regime, length_margin
        self.rng = np.random.default_rng(0)

    def __call__(self, prompts, completions, metadata, log_metric=None, log_extra=None):
        qs, ans = [m["question"] for m in metadata], [m["answer"] for m in metadata]
        if log_metric is not None:
            log_metric("rollout_quality", np.mean([quality(c, a) for c, a in zip(completions, ans)]))
            log_metric("rollout_accuracy", np.mean([tasks.verify(c, a) for c, a in zip(completions, ans)]))
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


def train(model, tok, judge, problems, pool: dict, ratings, cfg: EvolveConfig, grpo_cfg, folder=None,
          progress: bool = True) -> list:
    """GRPO steps of one regime on loop.run (resumable; the policy's Elo is the loop's state, a finished run
    loads its final weights). Logs per step the reward, opponent probabilities, opponents, outcomes and
    their expected scores, and the policy's Elo before and after the step's update."""
    import torch

    from . import grpo

    names, ratings = list(pool), np.asarray(ratings, float)
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
        meta = [{"question": problems[i].question, "answer": problems[i].answer,
                 "opponent_response": None if opp is None else pool[names[o]][i]}
                for i, o in zip(idx, [0] * len(idx) if opp is None else opp)]
        arena.rng = np.random.default_rng(config.derive_seed(cfg.seed, "judge", t))
        torch.manual_seed(config.derive_seed(grpo_cfg.seed, "grpo-step", t))
        trainer.timer.seconds.clear()
        batch = trainer.rollout([problems[i].prompt() for i in idx], meta)
        row = {**grpo.step_stats(batch), **trainer.update(batch), **trainer.times(batch),
               "regime": cfg.regime, "rating_before": rating, "probs": probs.tolist()}
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
                       progress=progress)
    return rows


def run_key(model_name: str, cfg: EvolveConfig, grpo_cfg, lora_r: int, pool: dict, ratings, extra: dict = None) -> dict:
    """What a training run depends on: for run.run_folder(name, run_key(...))."""
    return {"regime": asdict(cfg), "grpo": asdict(grpo_cfg), "model": str(model_name), "lora_r": lora_r,
            "pool": files.digest(pool), "ratings": [float(r) for r in ratings], "lora_init": "evolve-lora", **(extra or {})}


def train_and_evaluate(model_name: str, judge, problems, heldout, reference, pool: dict, ratings, cfg: EvolveConfig,
                       grpo_cfg, folder, cache, lora_r: int = 16, progress: bool = True):
    """Train one regime on a fresh LoRA adapter in `folder` (run.run_folder) and judge it on the held-out
    problems through cache(name, key, make) (run.cached). Returns (step rows, evaluation summary with the
    steps and training seconds, evaluation rows)."""
    import torch

    model, tok = models.load_model(model_name)
    torch.manual_seed(config.derive_seed(grpo_cfg.seed, "evolve-lora"))  # the same adapter init for every regime
    model = models.add_lora(model, r=lora_r, alpha=2 * lora_r)
    rows = train(model, tok, judge, problems, pool, ratings, cfg, grpo_cfg, folder, progress)
    key = {"run": folder.path.name, "heldout": files.digest([p.id + "|" + p.question for p in heldout]),
           "reference": files.digest(list(reference)), "max_new_tokens": grpo_cfg.max_new_tokens, "seed": cfg.seed}

    def make():
        df, summary = judge_heldout(model, tok, judge, heldout, reference, grpo_cfg.max_new_tokens, cfg.seed, progress)
        return {"summary": summary, "rows": df.to_dict("records")}

    ev = cache("evolve_eval", key, make)
    summary = {**ev["summary"], "steps": len(rows), "wall_time_s": float(sum(r.get("wall_s", 0.0) for r in rows))}
    return rows, summary, ev["rows"]
