"""Notebook 05's held-out protocol for MALT: the variants' chains (made once through the run's cache), accuracies
with Wilson intervals, paired differences, answer changes (flips, McNemar), reply statistics, and each trained
arm's health check and record."""
import numpy as np

from replication.core import config, stats
from replication.lm import arms, tasks
from .malt import ROLES, majority_vote, run_chains

def vote_accuracy(rows) -> tuple:
    """(correct questions, questions) when each question's chains are combined by majority vote."""
    by_q = {}
    for row in rows:
        by_q.setdefault(row["question"], []).append(row)
    hits = []
    for rs in by_q.values():
        vote = majority_vote([r["final_answer"] for r in sorted(rs, key=lambda r: r["chain"])])
        hits.append(vote is not None and float(vote) == float(rs[0]["answer"]))
    return int(sum(hits)), len(hits)


def flips(rows) -> dict:
    """How the verifier and refiner change the generator's answer: counts of each transition."""
    out = {"wrong_to_right": 0, "right_to_wrong": 0, "right_to_right": 0, "wrong_to_wrong": 0}
    for row in rows:
        key = f"{'right' if row['g_correct'] else 'wrong'}_to_{'right' if row['correct'] else 'wrong'}"
        out[key] += 1
    return out


def reply_stats(rows) -> dict:
    """Over all chains: accuracy (lenient and strict), stated-format rate, answer kept from g, reply length."""
    final = [r["g"] if r["r"] is None else r["r"] for r in rows]
    n = max(len(rows), 1)
    return {"chains": len(rows), "accuracy": sum(r["correct"] for r in rows) / n,
            "accuracy_strict": sum(tasks.verify(x, r["answer"], strict=True) for x, r in zip(final, rows)) / n,
            "format_rate": sum(tasks.has_format(x) for x in final) / n,
            "kept_generator_answer": sum(r["final_answer"] == r["g_answer"] for r in rows) / n,
            "mean_chars": sum(len(x) for x in final) / n}


def variant_chains(cache, key: dict, name: str, model, tok, problems, **kw) -> list:
    """run_chains(model, tok, problems, **kw) for one named variant, made once through
    cache(name, key, make) (run.cached's signature); its key is `key` plus the variant's settings."""
    return cache(f"eval-{name}", {**key, "variant": name, **{k: v for k, v in kw.items() if k not in ("g", "shots", "sampler")}},
                 lambda: run_chains(model, tok, problems, **kw))


def per_question(rows, vote: bool = False) -> np.ndarray:
    """One 0/1 outcome per question, in question order: its first chain's, or the majority vote of its chains."""
    if not vote:
        return np.array([float(r["correct"]) for r in sorted(rows, key=lambda r: r["question"]) if r["chain"] == 0])
    return np.array([float(vote_accuracy([r for r in rows if r["question"] == q])[0])
                     for q in sorted({r["question"] for r in rows})])


def accuracy_summary(rows: dict, votes: int) -> dict:
    """Held-out accuracy of each variant of rows (variant -> chains), single chain or vote, with n and a
    Wilson 95% interval (stats.proportion_ci)."""
    spec = {"base generator (greedy)": ("base_greedy", False), "base generator": ("base", False),
            f"base generator, vote of {votes}": ("base", True), "untrained G-V-R": ("untrained", False),
            "after SFT": ("sft", False), "after SFT + DPO (MALT)": ("dpo", False), f"MALT, vote of {votes}": ("dpo", True),
            "MALT, local pooling": ("dpo_local", False)}
    out = {}
    for label, (variant, vote) in spec.items():
        hits = per_question(rows[variant], vote)
        p, lo, hi = stats.proportion_ci(int(hits.sum()), len(hits))
        out[label] = {"acc": p, "ci95": [lo, hi], "n": len(hits)}
    return out


def paired_differences(rows: dict, votes: int, n_boot: int = 2000, seed: int = 0) -> dict:
    """MALT against the fair baselines on the same held-out questions: per comparison the accuracy
    difference with its paired bootstrap 95% interval over questions (stats.paired_bootstrap), n, and the
    relative improvement in the paper's sense (MALT / base - 1)."""
    comparisons = {f"MALT vote vs base vote ({votes})": (("dpo", True), ("base", True)),
                   "MALT vs base generator (single)": (("dpo", False), ("base", False)),
                   "MALT vs untrained G-V-R (single)": (("dpo", False), ("untrained", False)),
                   "SFT + DPO vs SFT (single)": (("dpo", False), ("sft", False)),
                   "global vs local pooling (single)": (("dpo", False), ("dpo_local", False)),
                   "untrained G-V-R vs base generator (single)": (("untrained", False), ("base", False))}
    out = {}
    for name, (a, b) in comparisons.items():
        a, b = per_question(rows[a[0]], a[1]), per_question(rows[b[0]], b[1])
        d, lo, hi = stats.paired_bootstrap(a, b, n_boot=n_boot, seed=seed)
        out[name] = {"diff": d, "ci95": [lo, hi], "n": len(a),
                     "relative": float(a.mean() / b.mean() - 1) if b.mean() > 0 else float("nan")}
    return out


def flip_table(rows: dict, n_boot: int = 2000, seed: int = 0) -> dict:
    """Per variant (variant -> chains): how the verifier and refiner change the generator's answer (flips),
    McNemar's exact test of gained (wrong -> right) vs lost (right -> wrong) (stats.mcnemar), and the net change
    in accuracy over all chains with a 95% interval bootstrapped over questions (their chains kept together)."""
    out = {}
    for name, rs in rows.items():
        before, after = [r["g_correct"] for r in rs], [r["correct"] for r in rs]
        test = stats.mcnemar(before, after)
        d, lo, hi = stats.paired_bootstrap(after, before, n_boot=n_boot, seed=seed, groups=[r["question"] for r in rs])
        out[name] = {**flips(rs), "mcnemar_p": test["p_value"], "change": d, "ci95": [lo, hi],
                     "chains": len(rs), "questions": len({r["question"] for r in rs})}
    return out


ARM_VARIANTS = {"base generator": ("base", None), "untrained G-V-R": ("untrained", None), "after SFT": ("sft", "sft"),
                "MALT (global pooling)": ("dpo", "dpo"), "MALT (local pooling)": ("dpo_local", "dpo")}


def health(rows, base_rows, logs: dict, stage: str, tok) -> dict:
    """arms.health of a trained MALT arm. Its training signal: the fall of any role's validation loss below its value
    before the stage, at the epoch kept (dpo.train_sft / train_dpo keep epoch 0 when it does not fall); its
    single-chain held-out accuracy against the base generator's; its final replies' length in tokens."""
    config.check_choice("stage", stage, ("sft", "dpo"))
    curves = {r: logs[r][stage][-1].get("val_curve") or [] for r in ROLES if logs[r][stage]}
    final = lambda rs: [r["g"] if r["r"] is None else r["r"] for r in rs]  # noqa: E731
    return arms.health(arms.loss_fall(curves), per_question(rows), per_question(base_rows),
                       arms.token_lengths(tok, final(rows)), arms.token_lengths(tok, final(base_rows)))


def arm_records(rows: dict, trained: dict, sets: dict, tok) -> list:
    """arms.record of each arm of ARM_VARIANTS (single-chain held-out outcomes) with its health check.
    trained: variant -> (logs of the arm's stages, its pooling); sets: pooling -> (role -> SFT examples, role ->
    pairs). Steps are the optimizer steps of all roles and stages up to the arm's; samples, the SFT examples and
    DPO pairs they trained on. The base generator and the untrained chain train nothing."""
    out = []
    for arm, (variant, stage) in ARM_VARIANTS.items():
        if stage is None:
            out.append(arms.record(arm, per_question(rows[variant])))
            continue
        logs, pooling = trained[variant]
        stages = ("sft",) if stage == "sft" else ("sft", "dpo")
        sft, pairs = sets[pooling]
        out.append(arms.record(arm, per_question(rows[variant]), sum(len(logs[r][s]) for r in ROLES for s in stages),
                               sum(len(sft[r]) for r in ROLES) + (sum(len(pairs[r]) for r in ROLES) if stage == "dpo" else 0),
                               health(rows[variant], rows["base"], logs, stage, tok), pooling=pooling))
    return out


def comparison_basis(diff: dict, names: list, records: list) -> dict:
    """run.claim's basis for a difference between arms (arms.basis: interval= when every arm named is healthy)."""
    return arms.basis(diff["ci95"], {r["arm"]: r for r in records}, names)
