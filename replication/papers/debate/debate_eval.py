"""Judge accuracy for the debate notebook: hits, accuracy with Wilson intervals, paired protocol differences,
position bias, quote tables, the expert-vs-naive precondition over story levels and readings, and the "arms"
records of the metrics."""
import time

import numpy as np
import pandas as pd

from replication.core import config, stats
from .debate import READINGS, judge


def hits(p_correct) -> np.ndarray:
    """Per judgment: 1 where the order-averaged P(correct) is above 0.5, 0 below, 0.5 at exactly 0.5."""
    p = np.asarray(p_correct, float)
    return (p > 0.5) + 0.5 * (p == 0.5)


def question_scores(p_correct, per_question: int = 1) -> np.ndarray:
    """Per question: the mean of hits over its `per_question` consecutive judgments (2 in consultancy: the
    correct and the incorrect consultant), so protocols can be paired on the same questions."""
    return hits(p_correct).reshape(-1, per_question).mean(1)


def accuracy(p_correct) -> dict:
    """Judge accuracy (the paper's definition): the share of judgments that are correct (hits), with n and a
    95% Wilson interval (stats.proportion_ci), and the mean order-averaged P(correct)."""
    h = hits(p_correct)
    if len(h) == 0:
        raise ValueError("p_correct is empty; accuracy needs at least one judgment")
    p, lo, hi = stats.proportion_ci(float(h.sum()), len(h))
    return {"accuracy": p, "ci95": [lo, hi], "n": len(h), "mean_p_correct": float(np.mean(p_correct))}


def versus_chance(acc: dict) -> str:
    """Where an accuracy's 95% interval lies relative to chance (0.5)."""
    lo, hi = acc["ci95"]
    return "above chance" if lo > 0.5 else "below chance" if hi < 0.5 else "consistent with chance"


def accuracy_table(accs: dict) -> pd.DataFrame:
    """One row per protocol: accuracy, its Wilson interval, n, mean P(correct) and where it lies against chance."""
    return pd.DataFrame([{"protocol": k, "accuracy": a["accuracy"], "ci_low": a["ci95"][0], "ci_high": a["ci95"][1],
                          "n": a["n"], "mean_p_correct": a["mean_p_correct"], "vs chance": versus_chance(a)}
                         for k, a in accs.items()]).set_index("protocol")


def protocol_differences(judgments: dict, seed: int, n_boot: int = 2000) -> dict:
    """Paired accuracy differences on the same questions (stats.paired_bootstrap, 95% interval):
    debate - naive, debate - consultancy (consultancy per question: mean of its two consultants) and
    expert - debate. judgments: protocol -> judge() output. Returns name -> (difference, low, high)."""
    q = {k: question_scores(v["p_correct"], 2 if k == "consultancy" else 1) for k, v in judgments.items()}
    pairs = {"debate - naive": ("debate", "naive"), "debate - consultancy": ("debate", "consultancy"),
             "expert - debate": ("expert", "debate")}
    return {name: stats.paired_bootstrap(q[a], q[b], n_boot=n_boot, seed=config.derive_seed(seed, "bootstrap", name))
            for name, (a, b) in pairs.items()}


def position_bias(judgments: dict) -> pd.DataFrame:
    """Per protocol: the judge's mean P(picks the answer in the first position) (the letter judge's P(A)), its
    accuracy with the correct answer shown first and second (single-order verdicts), and the mean order-averaged
    P(correct)."""
    return pd.DataFrame({k: {"P(picks first)": float(v["p_first"].mean()),
                             "acc, correct shown first": float(np.mean(v["p_correct_first"] > 0.5)),
                             "acc, correct shown second": float(np.mean(v["p_correct_second"] > 0.5)),
                             "mean P(correct), averaged orders": float(np.mean(v["p_correct"]))}
                         for k, v in judgments.items()}).T


def arguments_frame(**runs) -> pd.DataFrame:
    """The arguments of several run_protocol outputs (protocol=output) in one frame, sides named."""
    frames = [pd.DataFrame(out["arguments"]).assign(protocol=name) for name, out in runs.items()]
    args = pd.concat(frames, ignore_index=True)
    args["side"] = args["side"].replace({0: "correct", 1: "distractor"})
    return args


def verified_rate(args: pd.DataFrame):
    """Verified quotes / quotes over all arguments; None when there are no quotes at all."""
    total = int(args["quotes"].sum())
    return float(args["verified"].sum() / total) if total else None


def quote_table(args: pd.DataFrame) -> pd.DataFrame:
    """Per protocol and side: arguments, mean and longest length in words, share with a quote, quotes and
    the verified share."""
    out = args.groupby(["protocol", "side"]).agg(arguments=("words", "size"), mean_words=("words", "mean"),
                                                 max_words=("words", "max"),
                                                 with_quote=("quotes", lambda q: float(np.mean(q > 0))),
                                                 quotes=("quotes", "sum"), verified=("verified", "sum"))
    out["verified_rate"] = out["verified"] / out["quotes"].where(out["quotes"] > 0)
    return out


# --- the precondition: does reading the story help this judge? -----------------------------------------------
def expert_check(model, tok, stories: dict, readings=READINGS, seed: int = 0, batch_size: int = 16) -> tuple:
    """Naive and expert judge on the same questions, for each story level (stories: level -> items) and each
    reading: a table with both accuracies (95% Wilson intervals), the paired difference expert - naive
    (stats.paired_bootstrap over questions), the judges' P(picks first) and CPU seconds per question; and the
    judgments by (level, reading, kind)."""
    rows, out = [], {}
    for level, items in stories.items():
        for reading in readings:
            row = {"level": level, "reading": reading, "n": len(items)}
            for kind in ("naive", "expert"):
                t0 = time.process_time()
                out[level, reading, kind] = j = judge(model, tok, items, kind, batch_size=batch_size, reading=reading)
                a = accuracy(j["p_correct"])
                row.update({kind: a["accuracy"], f"{kind}_ci": a["ci95"], f"{kind} P(picks first)": float(j["p_first"].mean()),
                            f"{kind} cpu s/question": (time.process_time() - t0) / len(items)})
            d = stats.paired_bootstrap(hits(out[level, reading, "expert"]["p_correct"]),
                                       hits(out[level, reading, "naive"]["p_correct"]),
                                       seed=config.derive_seed(seed, "bootstrap", f"expert-naive-{level}-{reading}"))
            row.update({"expert - naive": d[0], "diff_ci": [d[1], d[2]]})
            rows.append(row)
    return pd.DataFrame(rows).set_index(["level", "reading"]), out


def arm_record(arm: str, p_correct, per_question: int = 1, arguments=None) -> dict:
    """One judged protocol as an arm of the metrics' "arms" list, with the keys of every arm record
    (arms.RECORD_KEYS): no training (steps and samples 0), n_heldout questions, accuracy over judgments with its
    Wilson interval, and healthy = every judgment a probability in (0, 1) and, for an argued protocol, every
    argument non-empty (failed_checks names which failed)."""
    p = np.asarray(p_correct, float)
    acc = accuracy(p)
    checks = {"judgments_valid": bool(np.all(np.isfinite(p)) and np.all((p > 0) & (p < 1))),
              "arguments_written": arguments is None or all(a["words"] > 0 for a in arguments)}
    return {"arm": arm, "steps": 0, "samples": 0, "n_heldout": len(p) // per_question, "accuracy": acc["accuracy"],
            "interval": acc["ci95"], "healthy": all(checks.values()), "failed_checks": [k for k, ok in checks.items() if not ok]}
