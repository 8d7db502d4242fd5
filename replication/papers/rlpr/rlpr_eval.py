"""What notebook 03 reports of its runs: each variant as a trained arm (replication.lm.arms: the health check and
the record), the base model as an arm, whether a reply's answer follows its own working, and the std filter's
summary."""
import numpy as np
import pandas as pd

from replication.core import stats
from replication.lm import arms
from . import answers


def health(rows: pd.DataFrame, table: pd.DataFrame, base: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> dict:
    """arms.health of a variant: its training reward's rise (first to last third of the steps, bootstrap over
    steps), its held-out accuracy against the base model's, its reply lengths (training and held-out, tokens)."""
    return arms.health(arms.reward_rise(rows["reward_mean"], n_boot=n_boot, seed=seed), table["correct"], base["correct"],
                       table["tokens"], base["tokens"], train_tokens=rows["completion_len"])


def heldout_summary(table: pd.DataFrame) -> dict:
    """The held-out verifier pass rate, format rate and reply length (tokens) beside the accuracy."""
    return {"heldout_verifier_pass": float(table["verified"].mean()), "heldout_format": float(table["format"].mean()),
            "heldout_tokens": float(table["tokens"].mean())}


def arm_record(name: str, rows: pd.DataFrame, table: pd.DataFrame, base: pd.DataFrame, group: int,
               n_boot: int = 1000, seed: int = 0) -> dict:
    """arms.record of one variant (samples: completions trained on), then the share of zero-gradient (zero reward
    std) groups among those rolled out and among those updated on, rollouts made, wall time, grad-norm CV, the
    held-out verifier pass rate, format rate and reply length, and the paired difference from the base model."""
    g = rows["grad_norm"].dropna() if "grad_norm" in rows else pd.Series(dtype=float)
    d = stats.paired_bootstrap(*arms.paired(table, base), n_boot=n_boot, seed=seed)
    zero = rows["zero_std_updated"].dropna() if "zero_std_updated" in rows else pd.Series(dtype=float)
    return arms.record(name, table["correct"], len(rows), int(rows["prompts_updated"].sum()) * group,
                       health(rows, table, base, n_boot, seed),
                       zero_std_rolled=float(rows["zero_std_rolled"].mean()),
                       zero_std_updated=float(zero.mean()) if len(zero) else None, rollouts=int(rows["rollouts"].sum()),
                       train_wall_s=float(rows["wall_s"].sum()),
                       grad_norm_cv=float(g.std() / g.mean()) if len(g) > 1 and g.mean() > 0 else None,
                       **heldout_summary(table), vs_base={"difference": d[0], "ci95": [d[1], d[2]]})


def answer_follows_work(tables: dict, questions, seeds) -> pd.DataFrame:
    """Per arm and training seed (tables: arm -> one held-out table, or a list of them, one per seed), over the
    held-out replies to questions with a numeric value: `accuracy` (lenient oracle), `worked_right` (the share whose
    own working reached the right value, answers.worked_result) and `follows` (among replies with both an answer and
    working, the share whose stated answer is the number their working reached). The probability reward scores the
    reference in place of the reply's answer, so nothing in it ties the written answer to the working; the
    verifier rewards read the written answer itself."""
    value = {q.id: q.value for q in questions if q.value is not None}
    rows = []
    for arm, runs in tables.items():
        runs = runs if isinstance(runs, list) else [runs]
        for k, table in enumerate(runs):
            t = table[table["qid"].isin(value)]
            checks = pd.DataFrame([answers.answer_vs_work(r, value[q]) for r, q in zip(t["reply"], t["qid"])])
            both = checks["follows"].dropna()
            rows.append({"arm": arm, "seed": seeds[k] if len(runs) > 1 or arm != "base" else None,
                         "accuracy": float(t["correct"].mean()),
                         "worked_right": float(checks["worked_right"].fillna(False).astype(bool).mean()),
                         "follows": float(both.astype(bool).mean()) if len(both) else float("nan"),
                         "with_both": float(len(both) / len(t)) if len(t) else float("nan")})
    return pd.DataFrame(rows).astype({"seed": "Int64"}).set_index(["arm", "seed"])


def base_record(base: pd.DataFrame) -> dict:
    """The untrained base model as an arm (no steps, no samples; healthy by definition)."""
    return arms.record("base", base["correct"], **heldout_summary(base))


def filter_summary(filtered: dict, std_filter_factor: float, warmup) -> dict:
    """The std filter of the main filtered variant ('rlpr' if run), whose step rows are given per training seed (a
    list, or one run's rows): per seed the final threshold, the share of prompts dropped after the warm-up, and per
    step the threshold, the share dropped and the rollouts made; `fraction_filtered` is the mean over the seeds."""
    main = "rlpr" if "rlpr" in filtered else next(iter(filtered), None)
    if main is None:
        return {"final_threshold": None, "fraction_filtered": None}
    runs = arms.by_seed(filtered[main])
    final, dropped = [], []
    for rows in runs:
        after = rows[rows["threshold"].notna()]
        final.append(float(rows["ema"].iloc[-1] * std_filter_factor) if rows["ema"].notna().any() else None)
        dropped.append(float(after["fraction_filtered"].mean()) if len(after) else 0.0)
    return {"variant": main, "final_threshold": final, "fraction_filtered": float(np.mean(dropped)),
            "fraction_filtered_by_seed": dropped,
            "threshold_by_step": [[None if pd.isna(x) else float(x) for x in rows["threshold"]] for rows in runs],
            "fraction_filtered_by_step": [rows["fraction_filtered"].tolist() for rows in runs],
            "rollouts_by_step": [rows["rollouts"].tolist() for rows in runs], "warmup_window": list(warmup)}
