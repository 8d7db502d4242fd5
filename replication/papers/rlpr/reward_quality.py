"""How good RLPR's rewards are before any training: each reward as a classifier of correct replies.

Sampled replies to the training questions get r under each aggregation, r' (no reasoning) per question,
the debiased r_hat and the exact-match verifier (`sample_replies`, `reward_columns`), in several draws (one per
sampling seed, `sample_draws`): one draw of replies is as fragile as one training run. Their ROC-AUC against the
lenient oracle is the mean over the draws, with a 95% interval over draws, then whole questions within a draw
(`over_draws`, the scheme of stats.two_level_bootstrap for a statistic that is not a mean over questions); the
statistics themselves are replication.core.stats'. GRPO compares replies only within a question's group, so the
reading that matters for training is within question (`by_question`, `within_question`: each question's AUC, the
share of its right-vs-wrong reply pairs the reward ranks right, averaged over the questions that have both; the
AUC pooled over questions is the secondary reading). Also: how often the exact-match verifier misses a right
answer (`verifier_misses`), the spread of each reward within a question (`spread_difference`), the sensitivity of
each aggregation to one weak token, and what debiasing removes (r' by question and its relation to correctness).
"""
import numpy as np
import pandas as pd

from replication.core import config, fmt, phases, stats
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


@phases.timed("generation for evaluation")
def sample_draws(model, tok, questions, samples: int, seeds, setting, cache=None) -> pd.DataFrame:
    """One draw of sampled replies per sampling seed in `seeds` (sample_replies with seed=s) with their reward
    columns, stacked with a `draw` column (0, 1, ... in the order of `seeds`). `setting`: the arms' setting of the
    notebook (rlpr_runs.ArmSetting: its model, worked examples, sampling temperature, reply length and batch).
    cache(name, key, make) is the notebook's run.cached: each draw is cached on its own under "samples", keyed by
    every setting and its seed, so a run with more draws reuses the draws done."""
    key = {"questions": [q.id for q in questions], "references": [q.reference for q in questions],
           "model": setting.model, "samples": samples, "temperature": setting.grpo.temperature,
           "max_new_tokens": setting.max_new_tokens, "batch_size": setting.batch_size,
           "shots": [s.id for s in setting.shots]}
    out = []
    for i, s in enumerate(seeds):
        make = lambda s=s: sample_replies(model, tok, questions, samples, setting.grpo.temperature,  # noqa: E731
                                          setting.max_new_tokens, setting.batch_size, s, setting.shots)
        table = make() if cache is None else cache("samples", {**key, "seed": s}, make)
        out.append(reward_columns(table).assign(draw=i))
    return pd.concat(out, ignore_index=True)


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

def draws(table: pd.DataFrame) -> list:
    """The table's draws of sampled replies (its `draw` column, in order; no such column: the table is one draw)."""
    return [g for _, g in table.groupby("draw", sort=True)] if "draw" in table else [table]


def finite_mean(values) -> float:
    """The mean of the finite values (nan when there is none)."""
    x = np.asarray(values, float)
    return float(x[np.isfinite(x)].mean()) if np.isfinite(x).any() else float("nan")


def over_draws(statistic, table: pd.DataFrame, columns, n_boot: int = 1000, seed: int = 0, alpha: float = 0.05) -> dict:
    """statistic(*columns) of each draw of sampled replies and its mean over the draws, with a 95% interval that
    covers both sources of spread: a t interval from the spread between draws joined with a bootstrap of each
    draw's questions (qid, whole, with replacement), the statistic averaged over the draws (stats.nested_bootstrap,
    the scheme of stats.two_level_bootstrap with draws as seeds) for any statistic, e.g. an AUC; with one draw it
    is stats.bootstrap over questions. A draw whose statistic is not finite (no replies, or replies of one class:
    no AUC) is left out; non-finite resamples are ignored. Returns estimate, ci95, per_draw (nan: left out), draws
    (used), the interval's question part (question_variance; None for one draw) and n."""
    parts = draws(table)
    data = [[g[c].to_numpy() for c in columns] for g in parts]
    per_draw = np.array([statistic(*cols) if len(cols[0]) else np.nan for cols in data], float)
    used = np.flatnonzero(np.isfinite(per_draw))
    interval = stats.nested_bootstrap(statistic, [data[d] for d in used], [parts[d]["qid"].to_numpy() for d in used],
                                      n_boot=n_boot, seed=seed, alpha=alpha)
    _, lo, hi = interval
    left = f"; {len(parts) - len(used)} without a value" if len(used) < len(parts) else ""
    return {"estimate": float(per_draw[used].mean()) if len(used) else np.nan, "ci95": [float(lo), float(hi)],
            "per_draw": [float(x) for x in per_draw], "draws": len(used),
            "question_variance": getattr(interval, "question_variance", None),
            "n": f"{len(parts)} draw{'s' if len(parts) != 1 else ''} x {table['qid'].nunique()} questions "
                 f"({len(table)} replies{left})"}


def difference_text(d: dict) -> str:
    """An over_draws result as text: '+0.093 [+0.020, +0.192] (per draw +0.080, +0.110, +0.089)'."""
    return f"{fmt.diff((d['estimate'], *d['ci95']))} (per draw {', '.join(f'{x:+.3f}' for x in d['per_draw'])})"


def auc_table(table: pd.DataFrame, columns=COLUMNS, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per reward column: the AUC (mean over the draws) with its two-level 95% interval (over_draws: draws, then
    questions), each draw's AUC, and, as means over the draws, the AUC over replies with an answer and the
    within-question AUC (what a group baseline sees)."""
    rows = {}
    for c in columns:
        d = over_draws(stats.auc, table, (c, "correct"), n_boot, seed)
        rows[c] = {"AUC": d["estimate"], "ci_low": d["ci95"][0], "ci_high": d["ci95"][1],
                   **{f"AUC draw {i}": x for i, x in enumerate(d["per_draw"])},
                   "AUC, replies with an answer": finite_mean([stats.auc(g.loc[g.answered, c], g.loc[g.answered, "correct"])
                                                               for g in draws(table)]),
                   "within-question AUC": finite_mean([stats.within_auc(g[c], g["correct"].to_numpy(bool), g["qid"].to_numpy())
                                                       for g in draws(table)])}
    return pd.DataFrame(rows).T


def auc_difference(table: pd.DataFrame, a: str, b: str, n_boot: int = 1000, seed: int = 0) -> dict:
    """AUC(a) - AUC(b) per draw, the two rewards ranked on the same replies, and its mean over the draws with the
    two-level interval (over_draws: draws, then questions resampled together for both rewards)."""
    diff = lambda x, z, y: stats.auc(x, y) - stats.auc(z, y)  # noqa: E731
    return over_draws(diff, table, (a, b, "correct"), n_boot, seed)


def auc_by_style(table: pd.DataFrame, columns=("mean", "mean_debiased", "verifier")) -> pd.DataFrame:
    """AUC of each reward by the form the reference is written in (nan: replies of only one class)."""
    return pd.DataFrame({s: [stats.auc(g[c], g["correct"]) for c in columns] for s, g in table.groupby("style")},
                        index=list(columns))


def reward_spread(table: pd.DataFrame) -> pd.DataFrame:
    """Per aggregation: the mean within-question std of r (each question's replies within one draw), its overall
    std and mean, and their ratio (CV)."""
    by = ["draw", "qid"] if "draw" in table else "qid"
    out = pd.DataFrame({"within-question std": {h: float(table.groupby(by)[h].std().mean()) for h in AGGREGATIONS},
                        "overall std": {h: float(table[h].std()) for h in AGGREGATIONS},
                        "overall mean": {h: float(table[h].mean()) for h in AGGREGATIONS}})
    out["coefficient of variation"] = out["overall std"] / out["overall mean"]
    return out


def claim_basis(d: dict, reason: str) -> dict:
    """run.claim's basis for an over_draws result: its interval, estimate and per-draw values (one draw caps the
    verdict at 'inconclusive (one draw)'; unit 'draw') when the interval is finite, else not_tested=reason (e.g. a
    reward that saw only one class of replies has no AUC)."""
    if np.isfinite(d["ci95"][0]) and np.isfinite(d["ci95"][1]):
        return {"interval": tuple(d["ci95"]), "estimate": d["estimate"],
                "seed_differences": [x for x in d["per_draw"] if np.isfinite(x)], "unit": "draw",
                **({} if d.get("question_variance") is None else {"question_variance": d["question_variance"]})}
    return {"not_tested": reason}


# ---- within question: what a group baseline (GRPO) sees ----------------------------------------------------

def by_question(table: pd.DataFrame, columns) -> pd.DataFrame:
    """One row per draw and question: its kind (if given), replies, the share right, and per reward column its AUC
    within the question (`<column>`: the share of right-vs-wrong reply pairs it ranks right, ties counted half; nan
    when the question's replies are all right or all wrong) and its spread (`<column> std`: the std of the reward
    over the question's replies)."""
    rows = []
    for (draw, qid), g in table.assign(draw=table["draw"] if "draw" in table else 0).groupby(["draw", "qid"], sort=False):
        y = g["correct"].to_numpy(bool)
        rows.append({"draw": draw, "qid": qid, **({"kind": g["kind"].iloc[0]} if "kind" in g else {}),
                     "replies": len(g), "correct": float(y.mean()),
                     **{c: stats.auc(g[c], y) for c in columns}, **{f"{c} std": float(g[c].std()) for c in columns}})
    return pd.DataFrame(rows)


def within_question(table: pd.DataFrame, a: str, b: str = None, n_boot: int = 1000, seed: int = 0) -> dict:
    """The within-question AUC of reward a (b given: of a minus b, on the same replies), averaged over the questions
    with both right and wrong replies, per draw, and its mean over the draws with the two-level interval
    (over_draws: draws, then those questions)."""
    cols = [a] if b is None else [a, b]
    q = by_question(table, cols)
    q = q[q[a].notna()]
    stat = (lambda x: float(np.mean(x))) if b is None else (lambda x, z: float(np.mean(x - z)))
    out = over_draws(stat, q, cols, n_boot, seed)
    out["n"] = (f"{q['draw'].nunique()} draw{'s' if q['draw'].nunique() != 1 else ''} x {q['qid'].nunique()} questions "
                f"with right and wrong replies ({int(q['replies'].sum())} replies)")
    return out


def spread_difference(table: pd.DataFrame, a: str, b: str, n_boot: int = 1000, seed: int = 0) -> dict:
    """The within-question std of reward a minus that of reward b (each question's replies), averaged over the
    questions, per draw, and its mean over the draws with the two-level interval; also each one's mean spread."""
    q = by_question(table, [a, b]).dropna(subset=[f"{a} std", f"{b} std"])
    out = over_draws(lambda x, z: float(np.mean(x - z)), q, (f"{a} std", f"{b} std"), n_boot, seed)
    out["n"] = (f"{fmt.count(q['draw'].nunique(), 'draw')} x {q['qid'].nunique()} questions "
                f"({int(q['replies'].sum())} replies)")
    return out | {"spread": {c: float(q[f"{c} std"].mean()) for c in (a, b)}}


def verifier_misses(table: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> dict:
    """How the exact-match verifier fails on sampled replies graded by the lenient oracle: the share of right
    replies it rejects (`missed`) and the share of replies right (`correct`), each per draw with its two-level
    interval, and by the form of the reference (`by_style`: replies, right, passing the verifier, right but missed)."""
    right = lambda c, v: float(np.mean(~v[c])) if c.any() else np.nan  # noqa: E731
    t = table.assign(correct=table["correct"].astype(bool), verified=table["verified"].astype(bool))
    styles = t.groupby("style").apply(lambda g: pd.Series({
        "replies": len(g), "correct": g["correct"].mean(), "verifier": g["verified"].mean(),
        "missed": right(g["correct"].to_numpy(), g["verified"].to_numpy())}), include_groups=False)
    return {"missed": over_draws(right, t, ("correct", "verified"), n_boot, seed),
            "correct": over_draws(lambda c: float(np.mean(c)), t, ("correct",), n_boot, seed), "by_style": styles}


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


def weakest_token_holds(probs, factor: float = 5.0) -> bool:
    """The arithmetic behind 'the weakest token moves the product more than the mean', checked on given
    probability lists: with the weakest token made `factor` times as likely (capped at 1), the product moves by
    that token's whole factor and the mean by at most 1 + (factor - 1) / N, so the product's ratio is at least
    the mean's for every list (bump_ratios; True for any probabilities, whichever model gave them)."""
    change = bump_ratios([p for p in probs if min(p) > 0], factor)   # a zero probability has no ratio to move
    return bool(len(change)) and bool(np.all(change["sequence"] >= change["mean"] * (1 - 1e-12)))


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


def pearson(x, y) -> float:
    """Pearson r of two columns; nan when either is constant or fewer than 3 values."""
    return correlation(x, y)["r"]


def debiasing_effect(table: pd.DataFrame, questions: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> dict:
    """Correlations of r and r_hat with correctness over replies (each draw's, then their mean with the two-level
    interval of over_draws: draws, then whole questions; the draw is the unit), of r' with each question's accuracy
    (over questions), the spread of r' and the share of replies where the clip binds (r < r')."""
    over = {f"corr_{name}_correct": over_draws(pearson, table, (col, "correct"), n_boot=n_boot, seed=seed)
            for name, col in (("r", "mean"), ("rhat", "mean_debiased"))}
    return {**{k: {"r": d["estimate"], "ci95": d["ci95"], "per_draw": d["per_draw"], "n": d["n"]}
               for k, d in over.items()},
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
