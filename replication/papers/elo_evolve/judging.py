"""Elo-Evolve's judges and the win/loss reward with the length rule, and the one factory that makes the training
judge for notebook 02 and the `train` command (`make_judge`).

Judges (notebook 02 says which it uses and why):
- LikelihoodJudge: the judge model's mean log-probability per token of each reply with its answer statement
  rewritten to one form, s = mean log p(canonical(reply) | k worked examples + the question) (canonical: the reply's
  working, then "The answer is N." with N its final answer). It never sees the true answer. A comparison: the
  higher s wins, equal scores tie (0.5); an absolute score (point-based reward) is s itself, floored at -10 (a reply
  stating no number). How the answer is stated cannot win; the working before it counts. Deterministic: one score
  and one comparison rank a pair alike, so its noise ratio (pair_noise_ratio) is 1.
- QualityJudge: the exact verifier as quality (q = correct, 0/1) with Thurstone comparison noise,
  P(a wins) = Phi((q_a - q_b) / sigma_comp), and absolute scores q + N(0, sigma_abs^2).
- LLMJudge: the prompted judge of notebook 01 (for larger models; the 135M model always answers "A").
"""
import re

import numpy as np
from scipy import stats as sps

from replication.core import config, paper, phases
from replication.lm import judges, models, tasks, training
from .params import JUDGES


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


def quality_noise(sigma_comp: float = 1.0, abs_noise_ratio: float = None) -> dict:
    """The quality judge's two noises at a stated ratio: sigma_abs = ratio x sigma_comp / sqrt(2), so that ranking two
    replies by two absolute scores (noise sqrt(2) sigma_abs) is `ratio` times noisier than one comparison (sigma_comp),
    as the paper measures it (Section 4.6.2: sigma_abs,eff / sigma_comp). abs_noise_ratio None: the paper's ratio at a
    quality gap of 1 (data/paper/elo_evolve_noise.csv, ratio_gap1). Returns sigma_comp, sigma_abs, ratio, source."""
    if not isinstance(sigma_comp, (int, float)) or sigma_comp <= 0:
        raise ValueError(f"sigma_comp={sigma_comp!r} is not allowed; a judge's noise must be > 0")
    if abs_noise_ratio is None:
        ratio, source = float(paper.value("elo_evolve_noise", statistic="ratio_gap1")), "paper"
    elif isinstance(abs_noise_ratio, (int, float)) and abs_noise_ratio > 0:
        ratio, source = float(abs_noise_ratio), "set"
    else:
        raise ValueError(f"abs_noise_ratio={abs_noise_ratio!r} is not allowed; give a ratio > 0, or None for the paper's")
    return {"sigma_comp": float(sigma_comp), "sigma_abs": ratio * float(sigma_comp) / np.sqrt(2), "ratio": ratio, "source": source}


def measured_noise_ratio(judge, n: int = 20000, seed: int = 0) -> dict:
    """The judge's noise ratio read back from its own outcomes on n right/wrong pairs: how often one comparison and
    how often two absolute scores rank the right reply first (p_comp = Phi(1 / sigma_comp), p_abs = Phi(1 / (sqrt(2)
    sigma_abs))), and the ratio Phi^-1(p_comp) / Phi^-1(p_abs), which is sqrt(2) sigma_abs / sigma_comp."""
    config.check_int("n", n)
    rng = np.random.default_rng(seed)
    q, a = ["q"] * n, [1] * n
    right, wrong = ["The answer is 1."] * n, ["The answer is 2."] * n
    p_comp = float(np.mean(outcomes(judge, q, a, right, wrong, rng, length_margin=10**6)))
    p_abs = float(np.mean(judge.scores(q, a, right, rng) > judge.scores(q, a, wrong, rng)))
    ratio = float(sps.norm.ppf(p_comp) / sps.norm.ppf(p_abs)) if 0.5 < p_abs < 1 else float("nan")
    return {"p_comparison": p_comp, "p_absolute": p_abs, "ratio": ratio, "n": n}


def right_wrong_pairs(problems, players: dict) -> tuple:
    """Every pair of players' replies to a problem with one right and one wrong but stated answer (exact verifier):
    lists of questions, answers, right replies, wrong replies and the problem's index."""
    qs, ans, right, wrong, group = [], [], [], [], []
    for j, p in enumerate(problems):
        replies = [r[j] for r in players.values()]
        good = [r for r in replies if tasks.verify(r, p.answer)]
        bad = [r for r in replies if not tasks.verify(r, p.answer) and tasks.extract_answer(r) is not None]
        for g in good:
            for b in bad:
                qs.append(p.question), ans.append(p.answer), right.append(g), wrong.append(b), group.append(j)
    return qs, ans, right, wrong, group


def pair_noise_ratio(judge, problems, players: dict, seed: int = 0) -> dict:
    """The judge's noise ratio measured on the training task: over every pair of players' replies to a problem with
    one right and one wrong (but stated) answer (exact verifier), how often one comparison ranks the right reply first
    (its win/loss/tie outcome, a tie counting half) and how often two absolute scores do (the point-based reward;
    equal scores half), and Phi^-1(p_comparison) / Phi^-1(p_absolute) as in measured_noise_ratio (the paper's
    sqrt(2) sigma_abs,eff / sigma_comp); nan where either is at or below 0.5. A deterministic judge whose comparison
    is the order of its scores reads 1."""
    qs, ans, right, wrong, _ = right_wrong_pairs(problems, players)
    if not qs:
        return {"p_comparison": float("nan"), "p_absolute": float("nan"), "ratio": float("nan"), "n": 0}
    rng = np.random.default_rng(config.derive_seed(seed, "pair-noise"))
    p_comp = float(np.mean(outcomes(judge, qs, ans, right, wrong, rng, length_margin=10**6)))
    sr, sw = judge.scores(qs, ans, right, rng), judge.scores(qs, ans, wrong, rng)
    p_abs = float(np.mean(np.where(sr == sw, 0.5, (sr > sw).astype(float))))
    ok = 0.5 < p_comp < 1 and 0.5 < p_abs < 1
    ratio = float(sps.norm.ppf(p_comp) / sps.norm.ppf(p_abs)) if ok else float("nan")
    return {"p_comparison": p_comp, "p_absolute": p_abs, "ratio": ratio, "n": len(qs)}


def reward_snr(judge, accuracy: float, group_size: int = 8, groups: int = 5000, seed: int = 0):
    """What a GRPO group's update is told, per reward, at rollout accuracy `accuracy` (a simulation of the rewards,
    no model): for each of `groups` groups of G replies (each right with that probability), the sum of GRPO's group
    advantages (grpo.group_advantages) over its right replies: its mean over groups is the signal, its SD the noise.
    Rewards: the exact verifier, the judge's win/loss/tie against a right and against a wrong opponent reply (outcomes),
    and the judge's absolute score (point-based). One row per reward: signal, noise, their ratio."""
    import pandas as pd
    import torch

    from replication.lm import grpo

    config.check_range("accuracy", accuracy, 0.0, 1.0)
    rng = np.random.default_rng(seed)
    n = groups * group_size
    right = rng.random(n) < accuracy
    replies = np.where(right, "The answer is 1.", "The answer is 2.").tolist()
    q, a = ["q"] * n, [1] * n
    rewards = {"exact verifier": right.astype(float),
               "comparison, right opponent": outcomes(judge, q, a, replies, ["So 1. The answer is 1."] * n, rng, 10**6),
               "comparison, wrong opponent": outcomes(judge, q, a, replies, ["So 2. The answer is 2."] * n, rng, 10**6),
               "absolute score (point)": judge.scores(q, a, replies, rng)}
    rows = []
    for name, r in rewards.items():
        adv, _ = grpo.group_advantages(torch.tensor(np.asarray(r, float)), group_size)
        toward = (adv.numpy() * right).reshape(groups, group_size).sum(1)
        rows.append({"reward": name, "signal": float(toward.mean()), "noise": float(toward.std()),
                     "signal / noise": float(toward.mean() / toward.std())})
    return pd.DataFrame(rows)


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

    @phases.timed("judging")
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


def make_judge(kind: str, base, level: str, judge_shots: int = 0, seed: int = 0, judge_model: str = None,
               sigma_comp: float = 1.0, sigma_abs: float = 3.21):
    """The training judge of Elo-Evolve, for notebook 02 and the `train` command alike. base: (model, tokenizer) of
    the policy's base model (kept frozen: give a copy when the policy trains in place), which judges unless
    judge_model names another model. The likelihood judge reads `judge_shots` worked examples of `level`, drawn with
    the seed config.derive_seed(seed, "judge"); the quality judge is the noisy stand-in (sigma_comp, sigma_abs)."""
    config.check_choice("judge", kind, JUDGES)
    if kind == "quality":
        return QualityJudge(sigma_comp, sigma_abs)
    model, tok = base if judge_model is None else models.load_model(judge_model)
    if kind == "likelihood":
        return LikelihoodJudge(model, tok, shots=tasks.worked_examples(level, judge_shots, seed=config.derive_seed(seed, "judge")))
    return LLMJudge(model, tok)
