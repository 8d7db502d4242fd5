"""Elo-Evolve on the real model: the judges, the win/loss reward with the length rule, an opponent pool of
precomputed responses, and the training regimes (point, static, Elo-orchestrated) as a step function on the
resumable loop. Training an arm with its held-out evaluation, the judge's accuracy and the comparison of Table 1
are in replication.papers.elo_evolve.evolve_eval.

Judges (notebook 02 says which it uses and why):
- LikelihoodJudge (default): the base model's log-likelihood of each reply's final answer,
  s = log p("The answer is N." | k worked examples + the question), N read from the reply (tasks.extract_answer).
  It never sees the true answer. A comparison: the higher s wins, the same answer is a tie (0.5); an absolute
  score (point-based reward) is exp(s). Only the stated answer counts, so neither format nor wording can win.
- QualityJudge: the exact verifier as quality (q = correct, 0/1) with Thurstone comparison noise,
  P(a wins) = Phi((q_a - q_b) / sigma_comp), and absolute scores q + N(0, sigma_abs^2).
- LLMJudge: the prompted judge of notebook 01 (for larger models; the 135M model always answers "A").
"""
import re
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as sps

from replication.core import config, files
from replication.lm import elo, grpo, judges, loop, models, tasks, training

REGIMES = ("point", "static", "elo")
JUDGES = ("likelihood", "quality", "llm")
START_PLAYER = "policy at start"   # the pool's anchor: the base model sampling at the training temperature


def words(text: str) -> int:
    """Whitespace-separated words, as the length rule counts them."""
    return len((text or "").split())


def identical(a, b) -> np.ndarray:
    """True where two responses are the same text (a tie)."""
    return np.array([x.strip() == y.strip() for x, y in zip(a, b)], bool)


def correct(response: str, answer) -> float:
    """1.0 when the reply's answer is right (exact verifier), else 0.0: the quality judge's q."""
    return float(tasks.verify(response, answer))


class QualityJudge:
    """Correctness with Thurstone comparison noise and noisy absolute scores (a stand-in with a known truth)."""

    name = "quality"

    def __init__(self, sigma_comp: float = 1.0, sigma_abs: float = 3.21):
        for n, v in (("sigma_comp", sigma_comp), ("sigma_abs", sigma_abs)):
            if not isinstance(v, (int, float)) or v <= 0:
                raise ValueError(f"{n}={v!r} is not allowed; a judge's noise must be > 0")
        self.sigma_comp, self.sigma_abs = float(sigma_comp), float(sigma_abs)

    def p_win(self, questions, answers, a, b) -> np.ndarray:
        """P(a beats b) per item; identical responses are a tie (0.5)."""
        qa = np.array([correct(x, ans) for x, ans in zip(a, answers)])
        qb = np.array([correct(x, ans) for x, ans in zip(b, answers)])
        return np.where(identical(a, b), 0.5, sps.norm.cdf((qa - qb) / self.sigma_comp))

    def scores(self, questions, answers, responses, rng) -> np.ndarray:
        """One noisy absolute score per response."""
        q = np.array([correct(x, ans) for x, ans in zip(responses, answers)])
        return q + rng.normal(0.0, self.sigma_abs, size=len(q))


def canonical(reply: str):
    """The reply with its answer statement rewritten to one form: the text before its last "answer is N" phrase
    (or all of it) followed by "The answer is N." with N its final answer (tasks.extract_answer); None if it
    states no number. Two replies that differ only in how they state the answer become the same text."""
    n = tasks.extract_answer(reply)
    if n is None:
        return None
    cut = [m.start() for m in tasks._PHRASE.finditer(reply)]
    body = reply[:cut[-1]] if cut else reply
    body = re.sub(r"(?:\b(?:the|final|my)\s*)+$", "", body.rstrip(" (\n:*-"), flags=re.IGNORECASE).rstrip(" (\n:*-")
    return (body + " " if body else "") + f"The answer is {n}."


class LikelihoodJudge:
    """The model as a judge by likelihood: s(reply) = mean log-probability per token of canonical(reply) after
    `shots` worked examples and the question, under the judge model; -inf when the reply states no number. The
    likelier reply wins. Reference-free, deterministic and blind to how the answer is stated; each (question,
    canonical reply) is scored once (memo), a question's replies in one pass over its prompt."""

    name = "likelihood"

    def __init__(self, model, tok, shots=(), batch_size: int = 16):
        self.model, self.tok, self.shots, self.batch_size = model, tok, list(shots), batch_size
        self.memo = {}

    def prompt(self, question: str):
        turns = []
        for s in self.shots:
            turns += [{"role": "user", "content": s.prompt()}, {"role": "assistant", "content": s.solution}]
        return turns + [{"role": "user", "content": f"{question}\n{tasks.INSTRUCTION}"}]

    def _prefix(self):
        """The worked examples' tokens and their keys and values, computed once and shared by every question."""
        import torch

        if not hasattr(self, "_pre"):
            self._pre = None
            if self.shots:
                text = self.tok.apply_chat_template(self.prompt("")[:-1], tokenize=False)
                ids = self.tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"].to(models.device_of(self.model))
                with torch.no_grad():
                    self._pre = (ids[0], self.model(input_ids=ids, use_cache=True).past_key_values)
        return self._pre

    def _mean_logps(self, question: str, texts) -> list:
        """Mean log-probability per token of each text (+ EOS) as the reply to the question: the shared prefix's
        cache, then the question once, then the replies (training.grouped_logps does the same without the prefix)."""
        import copy

        import torch

        p_ids, p_mask, c_ids, c_mask = training.encode_pairs(self.tok, [self.prompt(question)] * len(texts), texts,
                                                             device=models.device_of(self.model))
        pre, n, T = self._prefix(), len(texts), c_ids.shape[1]
        L = 0 if pre is None else len(pre[0])
        with torch.no_grad():
            if pre is None or T < 2 or not torch.equal(p_ids[0, :L], pre[0]):
                lp = training.grouped_logps(self.model, p_ids, p_mask, c_ids, c_mask, n)
            else:
                P = p_ids.shape[1]
                out = self.model(input_ids=p_ids[:1, L:], past_key_values=copy.deepcopy(pre[1]), use_cache=True,
                                 position_ids=torch.arange(L, P, device=p_ids.device)[None], logits_to_keep=1)
                cache = out.past_key_values
                cache.batch_repeat_interleave(n)
                rest = self.model(input_ids=c_ids[:, :-1], attention_mask=torch.cat([p_mask, c_mask[:, :-1]], 1),
                                  position_ids=P + torch.arange(T - 1, device=p_ids.device)[None].expand(n, -1),
                                  past_key_values=cache,
                                  use_cache=True).logits
                lp = training.token_logps(torch.cat([out.logits[:, -1:].expand(n, -1, -1), rest], 1), c_ids)
        return ((lp * c_mask).sum(1) / c_mask.sum(1)).tolist()

    def judge_scores(self, questions, responses) -> np.ndarray:
        texts = [canonical(r) for r in responses]
        todo = {}
        for q, t in zip(questions, texts):
            if t is not None and (q, t) not in self.memo:
                todo.setdefault(q, {})[t] = None
        for q, ts in todo.items():
            ts = list(ts)
            for i in range(0, len(ts), self.batch_size):
                self.memo.update({(q, t): v for t, v in zip(ts[i:i + self.batch_size], self._mean_logps(q, ts[i:i + self.batch_size]))})
        return np.array([-np.inf if t is None else self.memo[(q, t)] for q, t in zip(questions, texts)])

    def p_win(self, questions, answers, a, b) -> np.ndarray:
        """1 where a is the likelier reply, 0 where b is, 0.5 for equal scores (or neither stating a number)."""
        sa, sb = self.judge_scores(questions, a), self.judge_scores(questions, b)
        return np.where(sa == sb, 0.5, (sa > sb).astype(float))

    def scores(self, questions, answers, responses, rng=None) -> np.ndarray:
        """The point-based reward: the judge's mean log-probability per token of the reply (-10 for no number)."""
        return np.maximum(self.judge_scores(questions, responses), -10.0)


class LLMJudge:
    """A prompted LLM judge read from its next-token distribution, in both orders (notebook 01's judge)."""

    name = "llm"

    def __init__(self, model, tok, batch_size: int = 16):
        self.model, self.tok, self.batch_size = model, tok, batch_size

    def p_win(self, questions, answers, a, b) -> np.ndarray:
        p = judges.pairwise(self.model, self.tok, questions, a, b, k=1, batch_size=self.batch_size)["p_better"]
        return np.where(identical(a, b), 0.5, p.to_numpy())

    def scores(self, questions, answers, responses, rng) -> np.ndarray:
        probs, _ = judges.absolute(self.model, self.tok, questions, responses, k=1, batch_size=self.batch_size)
        return np.array([rng.choice(5, p=p / p.sum()) + 1 for p in probs], float)


def outcomes(judge, questions, answers, policy, opponent, rng, length_margin: int = 60) -> np.ndarray:
    """Win (1) / loss (0) / tie (0.5) of each policy response against the opponent's, drawn from the judge;
    0 when the policy response is longer than the opponent's by more than length_margin words."""
    config.check_int("length_margin", length_margin, minimum=0)
    p = judge.p_win(questions, answers, policy, opponent)
    s = np.where(p == 0.5, 0.5, (rng.random(len(p)) < p).astype(float))
    too_long = np.array([words(x) - words(y) > length_margin for x, y in zip(policy, opponent)], bool)
    return np.where(too_long, 0.0, s)


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


def regimes(static_opponent: str, temperatures, **common) -> dict:
    """The compared arms by name: point, static-<opponent>, elo-T<T> for each T."""
    return {"point": EvolveConfig(regime="point", **common),
            f"static-{static_opponent}": EvolveConfig(regime="static", opponent=static_opponent, **common),
            **{f"elo-T{T:g}": EvolveConfig(regime="elo", temperature=float(T), **common) for T in temperatures}}


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


def train(model, tok, judge, problems, pool: dict, ratings, cfg: EvolveConfig, grpo_cfg, folder=None,
          progress: bool = True, shots=()) -> list:
    """GRPO steps of one regime on loop.run (resumable; the policy's Elo is the loop's state, a finished run
    loads its final weights). Prompts are p.chat(shots). Logs per step the reward, opponent probabilities,
    opponents, outcomes and their expected scores, and the policy's Elo before and after the step's update."""
    import torch

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
        batch = trainer.rollout([problems[i].chat(shots) for i in idx], meta)
        row = {**grpo.step_stats(batch), **trainer.update(batch), **trainer.times(batch),
               "regime": cfg.regime, "samples": len(batch), "rating_before": rating, "probs": probs.tolist()}
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
