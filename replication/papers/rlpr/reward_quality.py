"""How good RLPR's rewards are before any training: each reward as a classifier of correct replies.

Sampled replies to the training questions get r under each aggregation, r' (no reasoning) per question,
the debiased r_hat and the exact-match verifier (`sample_replies`, `reward_columns`). Their ROC-AUC against
the lenient oracle comes with 95% intervals from resampling whole questions (the unit of dependence); the
statistics themselves are replication.core.stats'. Also: the sensitivity of each aggregation to one weak token,
and what debiasing removes (r' by question and its relation to correctness).
"""
import numpy as np
import pandas as pd

from replication.core import config, stats
from replication.lm import models
from . import answers
from .rlpr import AGGREGATIONS, aggregate, baseline_probs, debias, reply_probs

COLUMNS = ("mean", "sequence", "geometric", "mean_debiased", "sequence_debiased", "geometric_debiased", "verifier")


# ---- sampled replies and their rewards -------------------------------------------------------------

def sample_replies(model, tok, questions, samples: int, temperature: float = 1.0, max_new_tokens: int = 48,
                   batch_size: int = 16, seed: int = 0, shots=()) -> pd.DataFrame:
    """`samples` sampled replies per question (prompted with the worked examples `shots`; each question's replies
    consecutive, from one shared prefill) with reference-token probabilities (probs: r's tokens, None when
    the reply has no answer), the no-reasoning tokens (base_probs: r'), the lenient oracle, the verifier and
    the format term. Wrap the call in run.cached: it is the expensive part of the reward-quality study."""
    config.check_int("samples", samples)
    qs = [q for q in questions for _ in range(samples)]
    prompts = [q.chat(shots) for q in qs]
    gen = models.generate(model, tok, [q.chat(shots) for q in questions], max_new_tokens=max_new_tokens,
                          temperature=temperature, seed=seed, batch_size=batch_size, repeats=samples)
    kw = {"temperature": temperature, "batch_size": batch_size}
    probs = reply_probs(model, tok, prompts, gen.texts, [q.reference for q in qs], **kw)
    base = dict(zip([q.id for q in questions], baseline_probs(model, tok, [q.chat(shots) for q in questions],
                                                              [q.reference for q in questions], **kw)))
    return pd.DataFrame([{"qid": q.id, "kind": q.kind, "style": q.style, "reference": q.reference, "reply": t,
                          "probs": p, "base_probs": base[q.id], "answered": p is not None, **answers.score_reply(t, q),
                          "tokens": len(ids)} for q, t, p, ids in zip(qs, gen.texts, probs, gen.completion_ids)])


def reward_columns(table: pd.DataFrame) -> pd.DataFrame:
    """Add r (mean, sequence, geometric), r' (base_*) and debiased r_hat (*_debiased) columns, and the verifier as 0/1."""
    out = table.copy()
    for how in AGGREGATIONS:
        out[how] = [aggregate(p, how) for p in out["probs"]]
        out[f"base_{how}"] = [aggregate(p, how) for p in out["base_probs"]]
        out[f"{how}_debiased"] = debias(out[how], out[f"base_{how}"])
    out["verifier"] = out["verified"].astype(float)
    return out


def overview(table: pd.DataFrame) -> pd.DataFrame:
    """Per kind of question: replies, share with an answer span, correct, passing the verifier, format, length."""
    return table.groupby("kind").agg(replies=("qid", "size"), answer_found=("answered", "mean"),
                                     correct=("correct", "mean"), verifier=("verified", "mean"),
                                     format=("format", "mean"), tokens=("tokens", "mean"))


# ---- rewards as classifiers ------------------------------------------------------------------------

def auc_table(table: pd.DataFrame, columns=COLUMNS, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per reward column: pooled AUC with its question-resampled 95% interval (stats.bootstrap, groups = qid),
    the AUC over replies with an answer, and the within-question AUC (what a group baseline sees)."""
    y, q = table["correct"].to_numpy(bool), table["qid"].to_numpy()
    answered = table[table["answered"]]
    rows = {}
    for c in columns:
        est, lo, hi = stats.bootstrap(stats.auc, table[c].to_numpy(float), y, groups=q, n_boot=n_boot, seed=seed)
        rows[c] = {"AUC": est, "ci_low": lo, "ci_high": hi,
                   "AUC, replies with an answer": stats.auc(answered[c], answered["correct"]),
                   "within-question AUC": stats.within_auc(table[c], y, q)}
    return pd.DataFrame(rows).T


def auc_difference(table: pd.DataFrame, a: str, b: str, n_boot: int = 1000, seed: int = 0):
    """(AUC(a) - AUC(b), low, high): the two rewards ranked on the same replies, questions resampled together."""
    return stats.bootstrap(lambda x, z, y: stats.auc(x, y) - stats.auc(z, y), table[a].to_numpy(float),
                           table[b].to_numpy(float), table["correct"].to_numpy(bool), groups=table["qid"].to_numpy(),
                           n_boot=n_boot, seed=seed)


def auc_by_style(table: pd.DataFrame, columns=("mean", "mean_debiased", "verifier")) -> pd.DataFrame:
    """AUC of each reward by the form the reference is written in (nan: replies of only one class)."""
    return pd.DataFrame({s: [stats.auc(g[c], g["correct"]) for c in columns] for s, g in table.groupby("style")},
                        index=list(columns))


def reward_spread(table: pd.DataFrame) -> pd.DataFrame:
    """Per aggregation: the mean within-question std of r, its overall std and mean, and their ratio (CV)."""
    out = pd.DataFrame({"within-question std": {h: float(table.groupby("qid")[h].std().mean()) for h in AGGREGATIONS},
                        "overall std": {h: float(table[h].std()) for h in AGGREGATIONS},
                        "overall mean": {h: float(table[h].mean()) for h in AGGREGATIONS}})
    out["coefficient of variation"] = out["overall std"] / out["overall mean"]
    return out


def interval_or_reason(d, reason: str) -> dict:
    """run.claim's basis for an estimated difference (est, low, high): interval= when it is finite, else
    not_tested=reason (e.g. a reward that saw only one class of replies has no AUC)."""
    if np.isfinite(d[1]) and np.isfinite(d[2]):
        return {"interval": (d[1], d[2])}
    return {"not_tested": reason}


# ---- sensitivity to one weak token -----------------------------------------------------------------

def bump_weakest(probs, factor: float = 5.0) -> np.ndarray:
    """The probabilities with the least likely one multiplied by factor (capped at 1)."""
    q = np.array(probs, dtype=float)
    i = q.argmin()
    q[i] = min(1.0, factor * q[i])
    return q


def example_ratios(a, b) -> pd.DataFrame:
    """Each aggregation of two probability tuples (the paper's example) and the ratio b / a."""
    out = pd.DataFrame({"a": [aggregate(a, h) for h in AGGREGATIONS], "b": [aggregate(b, h) for h in AGGREGATIONS]},
                       index=list(AGGREGATIONS))
    out["b / a"] = out["b"] / out["a"]
    return out


def product_most_sensitive(a, b) -> bool:
    """The paper's point about its example, checked exactly: with a and b differing in one token, the product
    (sequence) moves by that token's whole factor, the geometric mean by less and the mean by least."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    differ = np.flatnonzero(~np.isclose(a, b))
    if a.shape != b.shape or len(differ) != 1:
        raise ValueError("a and b must be equally long and differ in exactly one token")
    moved = np.abs(np.log(example_ratios(a, b)["b / a"]))
    whole = abs(np.log(b[differ[0]] / a[differ[0]]))
    return bool(np.isclose(moved["sequence"], whole) and moved["mean"] < moved["geometric"] < moved["sequence"])


def multi_token(table: pd.DataFrame) -> pd.DataFrame:
    """Replies with an answer whose reference spans two or more tokens."""
    return table[table["answered"] & table["probs"].map(lambda p: p is not None and len(p) >= 2)]


def bump_ratios(probs, factor: float = 5.0) -> pd.DataFrame:
    """Per reply (a list of reference-token probabilities) and aggregation: f(bumped) / f(original), where the
    weakest token is made `factor` times as likely."""
    return pd.DataFrame({h: [aggregate(bump_weakest(p, factor), h) / max(aggregate(p, h), 1e-300) for p in probs]
                         for h in AGGREGATIONS}, columns=list(AGGREGATIONS))


# ---- what debiasing removes ------------------------------------------------------------------------

def correlation(x, y) -> dict:
    """Pearson r with its 95% interval (scipy, Fisher z); nan when either variable is constant."""
    from scipy.stats import pearsonr

    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or np.allclose(x, x[0]) or np.allclose(y, y[0]):
        return {"r": float("nan"), "ci95": [float("nan")] * 2}
    res = pearsonr(x, y)
    return {"r": float(res.statistic), "ci95": list(map(float, res.confidence_interval()))}


def per_question(table: pd.DataFrame) -> pd.DataFrame:
    """One row per question: kind, style, reference, r' (mean aggregation), mean r and r_hat of its replies,
    and the share of its replies that are correct; sorted by r'."""
    return table.groupby("qid").agg(kind=("kind", "first"), style=("style", "first"), reference=("reference", "first"),
                                    r_prime=("base_mean", "first"), r=("mean", "mean"), r_hat=("mean_debiased", "mean"),
                                    accuracy=("correct", "mean")).sort_values("r_prime")


def debiasing_effect(table: pd.DataFrame, questions: pd.DataFrame) -> dict:
    """Correlations of r and r_hat with correctness over replies, of r' with each question's accuracy, the
    spread of r' and the share of replies where the clip binds (r < r')."""
    return {"corr_r_correct": correlation(table["mean"], table["correct"]),
            "corr_rhat_correct": correlation(table["mean_debiased"], table["correct"]),
            "corr_rprime_question_accuracy": correlation(questions["r_prime"], questions["accuracy"]),
            "r_prime_mean": float(questions["r_prime"].mean()),
            "r_prime_range": [float(questions["r_prime"].min()), float(questions["r_prime"].max())],
            "clipped_share": float((table["mean"] - table["base_mean"] < 0).mean())}


def baseline_options(table: pd.DataFrame) -> pd.DataFrame:
    """Per kind of question and form of its reference, what each choice of r' leaves to learn from (mean
    aggregation): the share of replies correct, the mean r', and the share of replies with a non-zero reward
    core under no debiasing (r), the authors' r' (prompt directly followed by the answer phrase and the
    reference) and a per-question baseline (the mean r of the question's sampled replies), with the
    within-question AUC of each core (nan: no question with both right and wrong replies)."""
    t = table.assign(group_mean=table.groupby("qid")["mean"].transform("mean"))
    t["vs_group_mean"] = debias(t["mean"], t["group_mean"])
    cores = {"no debiasing (r)": "mean", "authors' r'": "mean_debiased", "question mean r": "vs_group_mean"}
    rows = {}
    for (kind, style), g in t.groupby(["kind", "style"]):
        y, q = g["correct"].to_numpy(bool), g["qid"].to_numpy()
        rows[f"{kind}, {style}"] = {"replies": len(g), "correct": float(g["correct"].mean()), "r' mean": float(g["base_mean"].mean()),
                      **{f"non-zero: {k}": float((g[c] > 0).mean()) for k, c in cores.items()},
                      **{f"within-question AUC: {k}": stats.within_auc(g[c], y, q) for k, c in cores.items()}}
    return pd.DataFrame(rows)
