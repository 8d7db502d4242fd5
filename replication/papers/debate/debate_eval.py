"""Judge accuracy for the debate notebook: hits, accuracy with Wilson intervals, paired protocol differences,
position bias, quote tables, the expert-vs-naive precondition over story levels and readings, and the "arms"
records of the metrics.

The arguments are sampled (temperature > 0), so an argued protocol's accuracy rests on one draw of them unless it
is argued several times: each draw has its own sampling seed (the stories stay), and a protocol's judgments are
then a list, one judge() output per draw. Accuracies and paired differences over draws have intervals over draws,
then questions (stats.two_level_bootstrap, through arms.compare), each draw's value beside them."""
from dataclasses import replace

import numpy as np
import pandas as pd

from replication.core import config, fmt, paper, stats
from replication.lm import arms
from . import debate_runs
from .debate import READINGS

# the paired comparisons of the notebook: name -> (protocol a, protocol b), a minus b on the same questions
PAIRS = {"debate - naive": ("debate", "naive"), "debate - consultancy": ("debate", "consultancy"),
         "expert - debate": ("expert", "debate"),
         "debate: best-of-N - best-of-1": ("debate", "debate (best-of-1)"),
         "consultancy: best-of-N - best-of-1": ("consultancy", "consultancy (best-of-1)")}


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
    """One row per protocol: accuracy, its interval (Wilson; over several draws, over draws then judgments), n,
    mean P(correct), where it lies against chance and, for a protocol argued over draws, each draw's accuracy."""
    return pd.DataFrame([{"protocol": k, "accuracy": a["accuracy"], "ci_low": a["ci95"][0], "ci_high": a["ci95"][1],
                          "n": a["n"], "mean_p_correct": a["mean_p_correct"], "vs chance": versus_chance(a),
                          **({"per draw": [round(x, 3) for x in a["per_draw"]]} if "per_draw" in a else {})}
                         for k, a in accs.items()]).set_index("protocol")


def paper_effects(table: str = "debate_khan2024") -> dict:
    """The paper's effect sizes for the PAIRS whose metric is the paper's own (distance from no difference, read
    from data/paper): debate - naive, the LLM judges' accuracy with debate minus without. The other pairs have
    none to compare with (the notebook says why)."""
    llm = "LLM (GPT-4-Turbo)"
    return {"debate - naive": paper.value(table, quantity="accuracy", protocol="debate", judge=llm)
            - paper.value(table, quantity="accuracy", protocol="naive", judge=llm)}


def per_question(protocol: str) -> int:
    """Judgments per question: 2 in consultancy (the correct and the incorrect consultant), else 1."""
    return 2 if protocol.startswith("consultancy") else 1


def pooled(judged) -> dict:
    """One judge() output as it is, or a list of them (one per draw) concatenated draw after draw."""
    return {k: np.concatenate([j[k] for j in judged]) for k in judged[0]} if isinstance(judged, list) else judged


def protocol_accuracy(judged, seed: int = 0) -> dict:
    """accuracy() of one judge() output. Over draws of the arguments (a list of judge() outputs): the mean
    accuracy with a 95% interval over draws, then judgments (stats.two_level_bootstrap of the draws x judgments
    hits; one draw: the Wilson interval), n judgments per draw, each draw's accuracy and the number of draws."""
    if not isinstance(judged, list):
        return accuracy(judged["p_correct"])
    h = np.array([hits(j["p_correct"]) for j in judged])
    out = {**accuracy(judged[0]["p_correct"]), "draws": len(judged), "per_draw": [float(x) for x in h.mean(1)]}
    if len(judged) > 1:
        r = stats.two_level_bootstrap(h, seed=seed, bounds=(0, 1))
        out.update(accuracy=r[0], ci95=r.interval, mean_p_correct=float(np.mean([j["p_correct"] for j in judged])))
    return out


def scores_frame(judged: dict, per: int = 1) -> pd.DataFrame:
    """One judge() output's per-question scores as the table arms.compare pairs (qid, score)."""
    score = question_scores(judged["p_correct"], per)
    return pd.DataFrame({"qid": np.arange(len(score)), "score": score})


def protocol_differences(judgments: dict, records: dict, seed: int, pairs: dict = PAIRS, n_boot: int = 2000) -> dict:
    """Paired accuracy differences on the same questions (a minus b for each of `pairs`), through arms.compare:
    the interval over draws of the arguments, then questions (one draw: over questions), each draw's difference
    (`per_seed`), the probability of improvement and run.claim's `basis` (any failed arm check beside it).
    judgments: protocol -> judge() output (naive, expert: no arguments, paired with every draw) or a list of them,
    one per draw; consultancy scored per question as the mean of its two consultants. records: protocol -> its
    arm_record or a list of them. Adds `diff`, (difference, low, high); n reads '3 draws x 100 questions'."""
    tables = {k: [scores_frame(j, per_question(k)) for j in v] if isinstance(v, list) else scores_frame(v, per_question(k))
              for k, v in judgments.items()}
    out = {}
    for name, (a, b) in pairs.items():
        c = arms.compare(a, b, tables, records, column="score", n_boot=n_boot, seed=config.derive_seed(seed, "bootstrap", name),
                         unit="draw")
        out[name] = {**c, "diff": (c["difference"], *c["ci95"])}
    return out


def diff_text(c: dict, digits: int = 3) -> str:
    """'+0.080 [-0.030, +0.190]' and, over several draws, each draw's difference: '(draws +0.05, +0.10, +0.09)'."""
    each = f" (draws {', '.join(f'{x:+.2f}' for x in c['per_seed'])})" if c["seeds"] > 1 else ""
    return fmt.diff(c["diff"], digits) + each


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
    """The arguments of several run_protocol outputs (protocol=output, or a list of outputs, one per draw) in one
    frame, sides named, each with its draw's index."""
    frames = [pd.DataFrame(out["arguments"]).assign(protocol=name, draw=i) for name, outs in runs.items()
              for i, out in enumerate(arms.by_seed(outs))]
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
def expert_check(cache, model, tok, stories: dict, setting, readings=READINGS, seed: int = 0) -> tuple:
    """Naive and expert judge on the same questions, for each story level (stories: level -> items) and each
    reading, each judging made once through cache(name, key, make) (debate_runs.cached_judge, with `setting`'s
    model and batch and the row's reading): a table with both accuracies (95% Wilson intervals), the paired
    difference expert - naive (stats.paired_bootstrap over questions) and the judges' P(picks first); and the
    judgments by (level, reading, kind)."""
    rows, out = [], {}
    for level, items in stories.items():
        for reading in readings:
            row = {"level": level, "reading": reading, "n": len(items)}
            for kind in ("naive", "expert"):
                out[level, reading, kind] = j = debate_runs.cached_judge(cache, model, tok, items, kind,
                                                                         replace(setting, reading=reading))
                a = accuracy(j["p_correct"])
                row.update({kind: a["accuracy"], f"{kind}_ci": a["ci95"], f"{kind} P(picks first)": float(j["p_first"].mean())})
            d = stats.paired_bootstrap(hits(out[level, reading, "expert"]["p_correct"]),
                                       hits(out[level, reading, "naive"]["p_correct"]),
                                       seed=config.derive_seed(seed, "bootstrap", f"expert-naive-{level}-{reading}"))
            row.update({"expert - naive": d[0], "diff_ci": [d[1], d[2]]})
            rows.append(row)
    return pd.DataFrame(rows).set_index(["level", "reading"]), out


def arm_record(arm: str, p_correct, per_question: int = 1, words=None, draw: int = None) -> dict:
    """One judged protocol as an arm of the metrics' "arms" list, with the keys of every arm record
    (arms.RECORD_KEYS): no training (steps and samples 0), n_heldout questions, accuracy over judgments with its
    Wilson interval, and healthy = every judgment a probability in (0, 1) and, for an argued protocol, every
    argument non-empty (`words`: each argument's word count; failed_checks names which failed); `draw`: the
    arguments' sampling seed, when argued."""
    p = np.asarray(p_correct, float)
    acc = accuracy(p)
    checks = {"judgments_valid": bool(np.all(np.isfinite(p)) and np.all((p > 0) & (p < 1))),
              "arguments_written": words is None or all(w > 0 for w in words)}
    return {"arm": arm, "steps": 0, "samples": 0, "n_heldout": len(p) // per_question, "accuracy": acc["accuracy"],
            "interval": acc["ci95"], "healthy": all(checks.values()), "failed_checks": [k for k, ok in checks.items() if not ok],
            **({} if draw is None else {"draw": draw})}


def protocol_records(judgments: dict, words: dict, best_of: int, draws: list) -> dict:
    """protocol -> arm_record: naive and expert one record each; an argued protocol (its judgments a list, one per
    draw) one record per draw, named with its best-of (words: protocol -> per draw the word counts of the
    arguments its judge read)."""
    out = {}
    for k, v in judgments.items():
        if not isinstance(v, list):
            out[k] = arm_record(k, v["p_correct"])
            continue
        name = f"{k.split(' ')[0]}-best-of-{1 if k.endswith('(best-of-1)') else best_of}"
        out[k] = [arm_record(name, j["p_correct"], per_question(k), w, draw=s) for j, w, s in zip(v, words[k], draws)]
    return out
