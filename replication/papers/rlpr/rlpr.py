"""RLPR's reward: the policy's probability of the reference answer, its aggregation, debiasing and the format term.

A reply o is split into reasoning and answer (replication.papers.rlpr.answers locates the answer); the answer is
replaced by the reference to get o', and the reference's tokens are scored under the policy:
r = f_seq({p_i : o'_i in y*}). Debiasing subtracts r', the same score with no reasoning (the prompt followed
directly by "The answer is " and the reference): r_hat = clip(r - r', 0, 1). The authors' code scores r' ONCE,
before training, with the initial policy, and keeps it per (prompt, reference) for the whole run (OpenBMB/RLPR,
verl/trainer/ppo/ray_trainer.py: `fit` calls `compute_promptgt2scoreA(0)` before the first step; `get_scoreA`
scores the prompt followed directly by the reference): `initial_baseline` here. Scoring r' under the policy of
each step is a variant, not the authors' (Reward(baseline="policy")). A reply with no answer has nothing to
replace; the authors' code gives an empty reference mask the score 0, so its reward is 0 (plus the format term,
also 0). The std filter and the filtered GRPO loop are in replication.papers.rlpr.rlpr_training, the
reward-quality measurements in replication.papers.rlpr.reward_quality.
"""
import numpy as np

from replication.core import config
from replication.lm.training import token_probs
from . import answers

AGGREGATIONS = ("mean", "sequence", "geometric")


def reply_inputs(replies, references):
    """(o' texts, reference spans) for token_probs: each reply with its answer replaced by the reference
    ("" and None where no answer is found)."""
    rep = [answers.replace_answer(c, r) for c, r in zip(replies, references)]
    return [x[0] if x else "" for x in rep], [x[1:] if x else None for x in rep]


def baseline_inputs(references, lead: str = "The answer is "):
    """(texts, reference spans) for token_probs with no reasoning: lead + reference."""
    return [lead + r for r in references], [(len(lead), len(lead) + len(r)) for r in references]


def reply_probs(model, tok, prompts, replies, references, **kw):
    """Reference-token probabilities with the reasoning kept and the answer replaced (None: no answer found)."""
    return token_probs(model, tok, prompts, *reply_inputs(replies, references), **kw)


def baseline_probs(model, tok, prompts, references, lead: str = "The answer is ", **kw):
    """Reference-token probabilities with no reasoning: the prompt followed directly by lead + reference."""
    return token_probs(model, tok, prompts, *baseline_inputs(references, lead), **kw)


def initial_baseline(model, tok, questions, shots=(), **kw) -> dict:
    """{question id: r' token probabilities} under `model` as it is now (the initial policy, before any step): the
    authors' r', scored once and kept for the whole run (module docstring). kw: token_probs' temperature,
    batch_size, system (those of the rollouts)."""
    probs = baseline_probs(model, tok, [q.chat(shots) for q in questions], [q.reference for q in questions], **kw)
    return {q.id: p for q, p in zip(questions, probs)}


# ---- aggregation and debiasing ---------------------------------------------------------------------

def aggregate(probs, how: str = "mean") -> float:
    """f_seq over reference-token probabilities: mean, sequence (product) or geometric (N-th root); empty -> 0."""
    config.check_choice("aggregation", how, AGGREGATIONS)
    if probs is None or len(probs) == 0:
        return 0.0
    p = np.asarray(probs, dtype=np.float64)
    if how == "mean":
        return float(p.mean())
    logs = np.log(np.clip(p, 1e-300, 1.0))
    return float(np.exp(logs.sum() if how == "sequence" else logs.mean()))


def debias(r, r_prime):
    """r_hat = clip(r - r', 0, 1): the gain in reference probability the reasoning brings."""
    return np.clip(np.asarray(r, dtype=np.float64) - np.asarray(r_prime, dtype=np.float64), 0.0, 1.0)


# ---- the reward function ---------------------------------------------------------------------------

class Reward:
    """reward_fn for GRPOTrainer: RLPR (kind "probability"), RLVR with the exact-match rule verifier ("verifier")
    or the lenient oracle as the reward ("oracle", a ceiling), plus the format term.

    reward = (1 - format_weight) * core + format_weight * format; core = clip(r - r', 0, 1) with a baseline,
    clip(r, 0, 1) without (baseline=None), the verifier's or the oracle's 0/1 otherwise. baseline: a dict
    {question id: r' token probabilities}, a fixed r' (the authors': `initial_baseline`, scored once by the
    initial policy); "policy": the per-step variant, r' of each question in the batch scored under the policy as
    it is at that call (the prompt directly followed by "The answer is " and the reference). Side data go to the
    rollout record: log_extra r, core, format and correct (lenient oracle) per completion; log_metric
    answer_found (the share of replies with an answer span) and, when debiased, r_prime (mean r' of the
    batch's questions) and debiased_nonzero (the share of replies with r > r')."""

    def __init__(self, model, tok, kind: str = "probability", aggregation: str = "mean", baseline=None,
                 format_weight: float = 0.1, temperature: float = 1.0, batch_size: int = 16, system=None):
        config.check_choice("kind", kind, tuple(CORES))
        config.check_choice("aggregation", aggregation, AGGREGATIONS)
        config.check_range("format_weight", format_weight, 0.0, 1.0)
        if not (baseline is None or baseline == "policy" or isinstance(baseline, dict)):
            raise ValueError(f"baseline={baseline!r} is not allowed; use None, a dict of r' token probabilities (the "
                             "authors': initial_baseline) or 'policy' (scored per step)")
        self.model, self.tok, self.kind, self.aggregation, self.baseline = model, tok, kind, aggregation, baseline
        self.w, self.temperature, self.batch_size, self.system = format_weight, temperature, batch_size, system

    def probabilities(self, prompts, completions, metadata):
        """(reference-token probabilities of each reply, {question id: r' token probabilities}): one scoring
        pass, in which the policy's r' rows (baseline="policy", one per question) share the replies' prompts."""
        texts, spans = reply_inputs(completions, [m["reference"] for m in metadata])
        first = {}
        if self.baseline == "policy":
            first = {m["id"]: i for i, m in reversed(list(enumerate(metadata)))}
            more = baseline_inputs([metadata[i]["reference"] for i in first.values()])
            prompts = list(prompts) + [prompts[i] for i in first.values()]
            texts, spans = texts + more[0], spans + more[1]
        probs = token_probs(self.model, self.tok, prompts, texts, spans, temperature=self.temperature,
                            batch_size=self.batch_size, system=self.system)
        n = len(completions)
        return probs[:n], (dict(zip(first, probs[n:])) if self.baseline == "policy" else self.baseline)

    def __call__(self, prompts, completions, metadata, log_metric=None, log_extra=None):
        refs = [m["reference"] for m in metadata]
        fmt = np.array([answers.format_score(c) for c in completions])
        correct = [answers.is_correct(c, m["aliases"], m.get("value")) for c, m in zip(completions, metadata)]
        found = np.mean([answers.locate_answer(c) is not None for c in completions])
        r, core, metrics = CORES[self.kind](self, prompts, completions, metadata, refs, correct)
        metrics = {"answer_found": found, **metrics}
        reward = (1 - self.w) * core + self.w * fmt
        if log_extra is not None:
            for name, values in (("r", r.tolist()), ("core", core.tolist()), ("format", fmt.tolist()), ("correct", correct)):
                log_extra(name, values)
        if log_metric is not None:
            for name, value in metrics.items():
                log_metric(name, value)
        return reward.tolist()


# ---- the core rewards, one function each (Reward picks one by its kind) -----------------------------

def probability_core(reward: Reward, prompts, completions, metadata, refs, correct) -> tuple:
    """RLPR: r = the reference's token probabilities after the reply, aggregated; core = clip(r - r', 0, 1) with a
    baseline (the metrics: the batch's mean r' and the share of replies above it), clip(r, 0, 1) without."""
    probs, table = reward.probabilities(prompts, completions, metadata)
    r = np.array([aggregate(p, reward.aggregation) for p in probs])
    if reward.baseline is None:
        return r, np.clip(r, 0.0, 1.0), {}
    rp = np.array([aggregate(table[m["id"]], reward.aggregation) for m in metadata])
    core = debias(r, rp)
    return r, core, {"r_prime": float(rp.mean()), "debiased_nonzero": float((core > 0).mean())}


def verifier_core(reward: Reward, prompts, completions, metadata, refs, correct) -> tuple:
    """RLVR: the exact-match rule verifier's 0/1 against the reference."""
    r = np.array([float(answers.exact_match(c, ref)) for c, ref in zip(completions, refs)])
    return r, r, {}


def oracle_core(reward: Reward, prompts, completions, metadata, refs, correct) -> tuple:
    """The lenient oracle's 0/1 (any alias or the value, anywhere in the answer): a ceiling."""
    r = np.array(correct, dtype=np.float64)
    return r, r, {}


CORES = {"probability": probability_core, "verifier": verifier_core, "oracle": oracle_core}   # a new reward: one
KINDS = tuple(CORES)                                                                       # function, one entry
