"""Notebook 05's held-out protocol for MALT: the variants' chains (made once through the run's cache), accuracies
over training seeds, paired differences (arms.compare: seeds x questions, two-level interval), answer changes
(flips, net change), reply statistics, each trained arm's health check and record, and the notebook's figures.

Rows come as variant -> chains for one training seed, or a list of them, one per training seed: the trained
variants (TRAINED) have chains of their own per seed; the base generator's and the untrained chain's are the same
for every seed (they train nothing), so only the first seed's are read. Variants: base_greedy and base (the base
generator alone), untrained (the base model in every role), sft (after SFT), dpo and dpo_local (MALT, global and
local pooling), dpo_generator (MALT's trained generator alone: the first answers of the dpo chains, generator_alone)
and single (the single-agent control's generator alone, papers.malt.control)."""
import numpy as np
import pandas as pd

from replication.core import config, fmt, phases, stats
from replication.lm import arms, tasks
from .malt import ROLES, majority_vote, rewards, run_chains, value_iteration

TRAINED = ("sft", "dpo", "dpo_local", "dpo_generator", "single")
ARM_VARIANTS = {"base generator": ("base", None), "untrained G-V-R": ("untrained", None), "after SFT": ("sft", "sft"),
                "MALT (global pooling)": ("dpo", "dpo"), "MALT (local pooling)": ("dpo_local", "dpo"),
                "MALT's generator alone": ("dpo_generator", "dpo"), "single-agent control": ("single", "dpo")}
ARM_OF = {variant: arm for arm, (variant, _) in ARM_VARIANTS.items()}


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


def generator_alone(rows) -> list:
    """The chains' first answers as the final ones (a generator-only variant: v and r None): the trained generator
    alone, paired with its own chain on the same samples."""
    return [{**r, "v": None, "r": None, "correct": r["g_correct"], "final_answer": r["g_answer"]} for r in rows]


def reply_stats(rows) -> dict:
    """Over all chains: accuracy (lenient and strict), stated-format rate, answer kept from g, reply length."""
    final = [r["g"] if r["r"] is None else r["r"] for r in rows]
    n = max(len(rows), 1)
    return {"chains": len(rows), "accuracy": sum(r["correct"] for r in rows) / n,
            "accuracy_strict": sum(tasks.verify(x, r["answer"], strict=True) for x, r in zip(final, rows)) / n,
            "format_rate": sum(tasks.has_format(x) for x in final) / n,
            "kept_generator_answer": sum(r["final_answer"] == r["g_answer"] for r in rows) / n,
            "mean_chars": sum(len(x) for x in final) / n}


def chain_entry(key: dict, name: str, **kw) -> tuple:
    """The cache entry (its name, its key) of variant_chains(cache, key, name, ..., **kw): `key` plus the variant's
    settings (not its first answers g, worked examples or sampling copy)."""
    return f"eval-{name}", {**key, "variant": name, **{k: v for k, v in kw.items() if k not in ("g", "shots", "sampler")}}


@phases.timed("generation for evaluation")
def variant_chains(cache, key: dict, name: str, model, tok, problems, **kw) -> list:
    """run_chains(model, tok, problems, **kw) for one named variant, made once through
    cache(name, key, make) (run.cached's signature) under chain_entry."""
    return cache(*chain_entry(key, name, **kw), lambda: run_chains(model, tok, problems, **kw))


def per_question(rows, vote: bool = False) -> np.ndarray:
    """One 0/1 outcome per question, in question order: its first chain's, or the majority vote of its chains."""
    if not vote:
        return np.array([float(r["correct"]) for r in sorted(rows, key=lambda r: r["question"]) if r["chain"] == 0])
    return np.array([float(vote_accuracy([r for r in rows if r["question"] == q])[0])
                     for q in sorted({r["question"] for r in rows})])


def seed_chains(rows, variant: str) -> list:
    """A variant's chains per training seed: one list per seed for a trained variant (TRAINED), the first seed's
    only for the base generator and the untrained chain (the same for every seed)."""
    runs = arms.by_seed(rows)
    return [r[variant] for r in (runs if variant in TRAINED else runs[:1])]


def outcomes(rows, variant: str, vote: bool = False) -> np.ndarray:
    """Seeds x questions 0/1 outcomes of a variant (per_question of each seed's chains, seed_chains)."""
    return np.array([per_question(x, vote) for x in seed_chains(rows, variant)])


def rate_interval(hits, n_boot: int = 2000, seed: int = 0) -> dict:
    """The mean of a seeds x questions 0/1 array with its 95% interval: Wilson's (stats.proportion_ci) for one run,
    over several seeds stats.two_level_bootstrap's (a t interval between the seeds' means joined with a bootstrap of
    the questions); and each seed's mean."""
    hits = np.asarray(hits, float)
    r = (stats.proportion_ci(int(hits.sum()), hits.size) if len(hits) == 1
         else stats.two_level_bootstrap(hits, n_boot=n_boot, seed=seed, bounds=(0, 1)))
    return {"rate": r[0], "ci95": r.interval if isinstance(r, stats.Estimate) else [r[1], r[2]], "per_seed": [float(x) for x in hits.mean(1)]}


def accuracy_summary(rows, votes: int, n_boot: int = 2000, seed: int = 0) -> dict:
    """Held-out accuracy of each variant, single chain or vote, over seeds x questions: mean, 95% interval, n (the
    questions), the number of seeds and each seed's accuracy (rate_interval: Wilson for one run, the two-level
    bootstrap for a trained variant over several seeds)."""
    spec = {"base generator (greedy)": ("base_greedy", False), "base generator": ("base", False),
            f"base generator, vote of {votes}": ("base", True), "untrained G-V-R": ("untrained", False),
            "after SFT": ("sft", False), "after SFT + DPO (MALT)": ("dpo", False), f"MALT, vote of {votes}": ("dpo", True),
            "MALT, local pooling": ("dpo_local", False), "MALT's generator alone": ("dpo_generator", False),
            f"MALT's generator alone, vote of {votes}": ("dpo_generator", True),
            "single-agent control": ("single", False), f"single-agent control, vote of {votes}": ("single", True)}
    out = {}
    for label, (variant, vote) in spec.items():
        hits = outcomes(rows, variant, vote)
        r = rate_interval(hits, n_boot, seed)
        out[label] = {"acc": r["rate"], "ci95": r["ci95"], "n": hits.shape[1], "seeds": len(hits),
                      "per_seed": r["per_seed"], "trained": variant in TRAINED}
    return out


def records_by_arm(records) -> dict:
    """arm -> its record (an untrained arm) or its records, one per training seed, from arm_records of each seed."""
    per_seed = [{r["arm"]: r for r in recs} for recs in records]
    return {arm: per_seed[0][arm] if stage is None else [x[arm] for x in per_seed] for arm, (_, stage) in ARM_VARIANTS.items()}


def records_frame(records: dict, seeds) -> pd.DataFrame:
    """The arms' records (records_by_arm) as one table, a row per arm and training seed ('-' for an untrained arm)."""
    keys = ("steps", "samples", "accuracy", "interval", "healthy", "failed_checks")
    return pd.DataFrame([{"arm": arm, "seed": seeds[i] if isinstance(recs, list) else "-", **{k: r[k] for k in keys}}
                         for arm, recs in records.items() for i, r in enumerate(arms.by_seed(recs))]).set_index(["arm", "seed"])


def paired_differences(rows, votes: int, records: dict, n_boot: int = 2000, seed: int = 0) -> dict:
    """MALT against the fair baselines on the same held-out questions, over training seeds: per comparison
    arms.compare's paired difference (seeds x questions) with its two-level 95% interval, n, per-seed differences,
    probability of improvement and claim basis (records: records_by_arm, for the health checks), and the relative
    improvement in the paper's sense (MALT / base - 1, over all seeds and questions)."""
    comparisons = {f"MALT vote vs base vote ({votes})": (("dpo", True), ("base", True)),
                   "MALT vs base generator (single)": (("dpo", False), ("base", False)),
                   "MALT vs untrained G-V-R (single)": (("dpo", False), ("untrained", False)),
                   "SFT + DPO vs SFT (single)": (("dpo", False), ("sft", False)),
                   "global vs local pooling (single)": (("dpo", False), ("dpo_local", False)),
                   "untrained G-V-R vs base generator (single)": (("untrained", False), ("base", False)),
                   "MALT vs single-agent control (single)": (("dpo", False), ("single", False)),
                   f"MALT vote vs single-agent control vote ({votes})": (("dpo", True), ("single", True)),
                   "MALT's generator alone vs single-agent control (single)": (("dpo_generator", False), ("single", False)),
                   "MALT vs its generator alone (single)": (("dpo", False), ("dpo_generator", False)),
                   "MALT's generator alone vs base generator (single)": (("dpo_generator", False), ("base", False)),
                   "single-agent control vs base generator (single)": (("single", False), ("base", False))}
    table = lambda hits: pd.DataFrame({"qid": np.arange(len(hits)), "correct": hits})
    out = {}
    for name, (a, b) in comparisons.items():
        ha, hb = outcomes(rows, *a), outcomes(rows, *b)
        arm_a, arm_b = ARM_OF[a[0]], ARM_OF[b[0]]
        c = arms.compare(arm_a, arm_b, {arm_a: [table(h) for h in ha], arm_b: [table(h) for h in hb]}, records,
                         n_boot=n_boot, seed=seed)
        out[name] = {"diff": c["difference"], "ci95": c["ci95"], "n": c["n"], "per_seed": c["per_seed"],
                     "probability_of_improvement": c["probability_of_improvement"], "failed": c["failed"],
                     "basis": c["basis"], "relative": float(ha.mean() / hb.mean() - 1) if hb.mean() > 0 else float("nan")}
    return out


def flip_table(rows, variants, n_boot: int = 2000, seed: int = 0) -> dict:
    """Per variant: how the verifier and refiner change the generator's answer (flips: counts summed over training
    seeds, shown but not tested, since a seed's chains and a question's votes are not independent) and the net
    change in accuracy (final minus first answer): each seed's mean over its questions' chains (per_seed) and a 95%
    interval with the seed as the unit (stats.two_level_bootstrap: a t interval between the seeds' means joined with a
    bootstrap of the questions, a question's chains kept together), the test the ledger reads."""
    out = {}
    for name in variants:
        per = seed_chains(rows, name)
        chains = [r for rs in per for r in rs]
        change = []
        for rs in per:
            by_q = {}
            for r in rs:
                by_q.setdefault(r["question"], []).append(float(r["correct"]) - float(r["g_correct"]))
            change.append([np.mean(by_q[q]) for q in sorted(by_q)])
        r = stats.two_level_bootstrap(np.array(change), n_boot=n_boot, seed=seed)
        out[name] = {**flips(chains), "change": r[0], "ci95": r.interval,
                     "per_seed": [float(np.mean(c)) for c in change], "chains": len(chains),
                     "questions": len(change[0]), "seeds": len(per),
                     "n": f"{len(per)} seed{'s' if len(per) > 1 else ''} x {len(change[0])} questions"}
    return out


def health(rows, base_rows, logs: dict, stage: str, tok) -> dict:
    """arms.health of a trained MALT arm (logs: role -> {"sft": rows, "dpo": rows} of the roles it counts). Its
    training signal: the fall of any of those roles' validation loss below its value before the stage, at the epoch
    kept (dpo.train_sft / train_dpo keep epoch 0 when it does not fall); its
    single-chain held-out accuracy against the base generator's; its final replies' length in tokens."""
    config.check_choice("stage", stage, ("sft", "dpo"))
    curves = {r: by[stage][-1].get("val_curve") or [] for r, by in logs.items() if by[stage]}
    final = lambda rs: [r["g"] if r["r"] is None else r["r"] for r in rs]  # noqa: E731
    return arms.health(arms.loss_fall(curves), per_question(rows), per_question(base_rows),
                       arms.token_lengths(tok, final(rows)), arms.token_lengths(tok, final(base_rows)))


def arm_records(rows: dict, trained: dict, tok) -> list:
    """arms.record of each arm of ARM_VARIANTS (single-chain held-out outcomes) with its health check. trained:
    variant -> (logs of the arm's stages, its (role -> SFT examples, role -> pairs), the roles it counts, its
    labels: 'global' / 'local' pooling or the control's 'own answer'). Steps are the optimizer steps of the counted
    roles in the stages up to the arm's; samples, the SFT examples and DPO pairs they trained on (MALT: all three
    roles; MALT's generator alone and the single-agent control: the generator's, the same number). The base
    generator and the untrained chain train nothing."""
    out = []
    for arm, (variant, stage) in ARM_VARIANTS.items():
        if stage is None:
            out.append(arms.record(arm, per_question(rows[variant])))
            continue
        logs, (sft, pairs), roles, labels = trained[variant]
        stages = ("sft",) if stage == "sft" else ("sft", "dpo")
        out.append(arms.record(arm, per_question(rows[variant]), sum(len(logs[r][s]) for r in roles for s in stages),
                               sum(len(sft[r]) for r in roles) + (sum(len(pairs[r]) for r in roles) if stage == "dpo" else 0),
                               health(rows[variant], rows["base"], {r: logs[r] for r in roles}, stage, tok), labels=labels))
    return out


def comparison_basis(diff: dict, names: list, records) -> dict:
    """run.claim's basis for a difference between arms (arms.basis): the interval diff["ci95"], with its estimate
    (diff["diff"]) and per-seed differences (diff["per_seed"]) when given, and any failed health check of the named
    arms reported beside the verdict. records: arm -> record or per-seed list (records_by_arm), or one seed's list."""
    recs = records if isinstance(records, dict) else {r["arm"]: r for r in records}
    return arms.basis(diff["ci95"], recs, names, estimate=diff.get("diff"), seed_differences=diff.get("per_seed"))


def side(ci) -> str:
    """Where a 95% interval lies: 'above zero', 'below zero' or 'holds zero'."""
    return "above zero" if ci[0] > 0 else "below zero" if ci[1] < 0 else "holds zero"


def gain_sources(diffs: dict, known: dict, flip: dict) -> list:
    """Where MALT's held-out gain comes from, one measured line each: from paired_differences (single chain, by seed
    and question) the trained generator alone over the base generator, the full chain over its own generator, MALT
    and its generator over the single-agent control; from known_answers.summary's 'dpo' the trained verifier and
    refiner on known-wrong and known-right first answers; from flip_table's 'dpo' their changes to the generator's
    own first answers."""
    d = {k: f"{fmt.diff((v['diff'], *v['ci95']))} ({side(v['ci95'])})" for k, v in diffs.items()}
    rate = lambda r: f"{r['rate']:.2f} {fmt.ci(r['ci95'])}"  # noqa: E731
    mine, control = "MALT's generator alone vs base generator (single)", "MALT's generator alone vs single-agent control (single)"
    return [f"trained generator alone - base generator: {d[mine]}",
            f"full chain - its own generator alone (what the trained verifier and refiner add): {d['MALT vs its generator alone (single)']}",
            f"full chain - single-agent control at the generator's budget: {d['MALT vs single-agent control (single)']}",
            f"MALT's generator alone - the control's generator: {d[control]}",
            f"known-wrong first answers fixed {rate(known['fixed_rate'])}, known-right ones broken {rate(known['broken_rate'])}, "
            f"fix - break {fmt.diff((known['net'], *known['ci95']))} ({side(known['ci95'])})",
            f"the generator's own first answers: {flip['wrong_to_right']} wrong -> right and {flip['right_to_wrong']} right -> "
            f"wrong of {flip['chains']} chains"]


# ---- figures ---------------------------------------------------------------------------------------------

def plot_accuracy(summary: dict, ax, colors):
    """Held-out accuracy of each variant of accuracy_summary: the bar its mean over seeds, the error bar its 95%
    interval, and a trained variant's accuracy in each training seed as a black dot."""
    labels = list(summary)
    acc = np.array([summary[k]["acc"] for k in labels])
    err = np.array([[a - summary[k]["ci95"][0], summary[k]["ci95"][1] - a] for a, k in zip(acc, labels)]).T
    ax.barh(range(len(labels)), acc, xerr=err, color=colors, capsize=3, alpha=0.85)
    trained = [i for i, k in enumerate(labels) if summary[k]["trained"]]
    for i in trained:
        per = summary[labels[i]]["per_seed"]
        ax.scatter(per, i + np.linspace(-0.2, 0.2, len(per)) * (len(per) > 1), s=14, color="k", zorder=3,
                   label="one training seed" if i == trained[0] else None)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    return ax


def plot_losses(trained: dict, axes, dpo_beta: float, reference: str):
    """SFT (axes[0]) and DPO (axes[1]) loss per step of every role: one thin line per training seed, global pooling
    solid, local dashed, the single-agent control's generator dotted. trained: training seed -> arm ('global',
    'local', 'single') -> malt_training.train_arm's result."""
    for n, by_pooling in enumerate(trained.values()):
        for pooling, ls in zip(by_pooling, ("-", "--", ":")):
            for i, role in enumerate(ROLES):
                for ax, stage in zip(axes, ("sft", "dpo")):
                    rows = by_pooling[pooling]["logs"][role][stage]
                    if rows:
                        ax.plot([x["loss"] for x in rows], ls=ls, lw=0.8, alpha=0.7, color=f"C{i}",
                                label=f"{role} ({pooling})" if n == 0 else None)
    axes[0].set_title(f"SFT loss per step ({len(trained)} seed{'s' if len(trained) > 1 else ''}, one line each)")
    axes[1].set_title(f"DPO loss per step (beta = {dpo_beta}, reference: {reference})")
    axes[1].axhline(np.log(2), color="0.5", ls=":")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:   # a stage with nothing to train draws no line
            ax.legend(fontsize=7)
    return axes


def plot_tree(tree, q: int, ax=None):
    """Draw question q's tree: generator, verifier and leaf nodes left to right, values shown, leaves by reward."""
    import matplotlib.pyplot as plt

    ax = ax or plt.gca()
    n = tree["n"]
    v_g, v_v, v_r = (x[q] for x in value_iteration(rewards(tree)))
    y_r = np.arange(n**3)[::-1].reshape(n, n, n).astype(float)
    y_v, y_g = y_r.mean(-1), y_r.mean((-1, -2))
    y_q = y_g.mean()
    cmap = plt.get_cmap("RdYlGn")
    for j in np.ndindex(n):
        ax.plot([0, 1], [y_q, y_g[j]], color="0.7", lw=1, zorder=1)
        for k in range(n):
            ax.plot([1, 2], [y_g[j], y_v[j][k]], color="0.7", lw=1, zorder=1)
            for m in range(n):
                ax.plot([2, 3], [y_v[j][k], y_r[j][k][m]], color="0.8", lw=0.8, zorder=1)
    ax.scatter([0], [y_q], s=120, color="0.5", zorder=2)
    for x, ys, vals, size in ((1, y_g, v_g, 260), (2, y_v, v_v, 160), (3, y_r, v_r, 60)):
        ax.scatter(np.full(ys.size, x), ys.ravel(), c=vals.ravel(), cmap=cmap, vmin=0, vmax=1, s=size,
                   edgecolors="k", linewidths=0.5, zorder=2)
        if x < 3:
            for y, v in zip(ys.ravel(), vals.ravel()):
                ax.annotate(f"{v:.2f}", (x, y), xytext=(0, 9), textcoords="offset points", ha="center", fontsize=7)
    ax.set_xticks([0, 1, 2, 3], ["question", "generator\nV(g)", "verifier\nV(v)", "refiner\nreward"])
    ax.set(yticks=[], xlim=(-0.3, 3.3))
    ax.grid(False)
    return ax
