"""Notebook 05's probe of the verifier and refiner on first answers known to be wrong and known to be right.

Each held-out question gets two constructed first answers in the generator's own format (its worked solution, "49 +
20 = 69. The answer is 69."): the solution itself (known right) and the same solution with its result off by k (known
wrong: "49 + 20 = 72. The answer is 72."), k a seeded nonzero integer in [-K_MAX, K_MAX]; the exact verifier checks
both. The chain continues from each (malt.run_chains with the first answers given), so the verifier and refiner are
the only roles at work: a fix is a known-wrong first answer whose final answer is right, a break a known-right one
whose final answer is wrong. The chains sampled in the held-out protocol (malt_eval.flip_table) are the other half of
the picture: there the first answers are the generator's own, and most are right."""
import numpy as np
import pandas as pd

from replication.core import config, stats
from replication.lm import arms, tasks
from . import malt_eval

K_MAX = 10
KIND = "constructed: the worked solution, and the same solution off by k"


def off_by_k(problem: tasks.Problem, k: int) -> str:
    """The problem's worked solution with its result off by k: the last step's result and the stated answer both read
    answer + k (the earlier steps as they are)."""
    steps, _, _ = problem.solution.rpartition("The answer is ")
    wrong = problem.answer + k
    head, found, tail = steps.rpartition(f"= {problem.answer}.")
    steps = f"{head}= {wrong}.{tail}" if found else steps
    return f"{steps}The answer is {wrong}."


def first_answers(problems, seed: int = 0, k_max: int = K_MAX) -> dict:
    """{"right": worked solutions, "wrong": the same off by k, "k": the offsets}, one per problem; k is drawn from the
    nonzero integers in [-k_max, k_max] by a generator seeded with (seed, "off-by-k"), its sign flipped where the
    wrong answer would be negative. Raises if the exact verifier reads a right one as wrong or a wrong one as right."""
    config.check_int("k_max", k_max)
    rng = np.random.default_rng(config.derive_seed(seed, "off-by-k"))
    size = rng.integers(1, k_max + 1, len(problems))
    sign = rng.choice([-1, 1], len(problems))
    ks = [int(s * m) if p.answer + s * m >= 0 else int(m) for p, s, m in zip(problems, sign, size)]
    right = [p.solution for p in problems]
    wrong = [off_by_k(p, k) for p, k in zip(problems, ks)]
    for p, r, w in zip(problems, right, wrong):
        if not tasks.verify(r, p.answer) or tasks.verify(w, p.answer):
            raise ValueError(f"the constructed first answers of {p.id!r} are not known right / wrong: {r!r}, {w!r}")
    return {"right": right, "wrong": wrong, "k": ks}


def chain_call(key: dict, name: str, problems, first: dict, **kw) -> dict:
    """continue_chains' arguments as one malt_eval.variant_chains call (key, name, problems and its settings)."""
    return dict(key={**key, "first answers": KIND, "k_max": K_MAX}, name=f"known-{name}", problems=list(problems) * 2,
                k=1, g=first["wrong"] + first["right"], **kw)


def continue_chains(cache, key: dict, name: str, model, tok, problems, first: dict, **kw) -> list:
    """The verifier's and refiner's turns after each known-wrong, then each known-right first answer (one chain each,
    malt_eval.variant_chains, cached as 'eval-known-<name>'): rows of the wrong answers first, question i's right
    answer at row len(problems) + i."""
    call = chain_call(key, name, problems, first, **kw)
    return malt_eval.variant_chains(cache, call.pop("key"), call.pop("name"), model, tok, call.pop("problems"), **call)


def outcomes(rows) -> dict:
    """Per question 0/1 outcomes of continue_chains' rows: fixed (the known-wrong first answer ends right), broken
    (the known-right one ends wrong), kept_wrong (the final answer is the wrong first answer) and kept_right."""
    n = len(rows) // 2
    wrong, right = rows[:n], rows[n:]
    if any(r["g_correct"] for r in wrong) or not all(r["g_correct"] for r in right):
        raise ValueError("rows must hold the known-wrong first answers, then the known-right ones (continue_chains)")
    same = lambda r: float(r["final_answer"] is not None and r["final_answer"] == r["g_answer"])  # noqa: E731
    return {"fixed": np.array([float(r["correct"]) for r in wrong]), "broken": np.array([1.0 - r["correct"] for r in right]),
            "kept_wrong": np.array([same(r) for r in wrong]), "kept_right": np.array([same(r) for r in right])}


def summary(probe, variants, records: dict, n_boot: int = 2000, seed: int = 0) -> dict:
    """Per variant (probe: one dict per training seed, variant -> continue_chains rows; an untrained variant's rows
    read once, malt_eval.seed_chains): the fix rate on known-wrong first answers and the break rate on known-right
    ones, each with its 95% interval (malt_eval.rate_interval: Wilson for one run, over seeds then questions for a
    trained variant), the kept rates, and the net change fix - break (each question's fix minus its break: the change
    in accuracy over a half-wrong, half-right set of first answers) with its interval and per-seed values. With a
    trained variant and 'untrained' both given, "trained - untrained" holds arms.compare's difference of their fix
    rates and of their break rates (records: malt_eval.records_by_arm, for the health checks)."""
    out, arrays = {}, {}
    for name in variants:
        per = [outcomes(rs) for rs in malt_eval.seed_chains(probe, name)]
        arrays[name] = {k: np.array([o[k] for o in per]) for k in per[0]}
        a = arrays[name]
        net = a["fixed"] - a["broken"]
        r = stats.two_level_bootstrap(net, n_boot=n_boot, seed=seed, bounds=(-1, 1))   # a difference of rates
        out[name] = {**{f"{k}_rate": malt_eval.rate_interval(a[k], n_boot, seed) for k in ("fixed", "broken", "kept_wrong", "kept_right")},
                     "fixed": int(a["fixed"].sum()), "broken": int(a["broken"].sum()), "net": r[0], "ci95": r.interval,
                     "per_seed": [float(x) for x in net.mean(1)], "seeds": len(per), "questions": net.shape[1],
                     "n": f"{len(per)} seed{'s' if len(per) > 1 else ''} x {net.shape[1]} questions"}
    trained = [v for v in variants if v != "untrained"]
    if trained and "untrained" in variants:
        pair = {malt_eval.ARM_OF[v]: v for v in (trained[0], "untrained")}
        tables = lambda kind: {arm: [pd.DataFrame({"qid": np.arange(h.size), "correct": h}) for h in arrays[v][kind]]  # noqa: E731
                               for arm, v in pair.items()}
        out["trained - untrained"] = {kind: arms.compare(*pair, tables(kind), records, n_boot=n_boot, seed=seed)
                                      for kind in ("fixed", "broken")}
    return out


def plot(summary: dict, variants: dict, ax):
    """Fix rate on known-wrong and break rate on known-right first answers per variant (variants: variant -> label):
    bars the mean over seeds, error bars the 95% interval, each training seed's rate a black dot."""
    width = 0.8 / len(variants)
    for i, (name, label) in enumerate(variants.items()):
        s = summary[name]
        for x, kind in enumerate(("fixed_rate", "broken_rate")):
            r = s[kind]
            pos = x - 0.4 + width * (i + 0.5)
            ax.bar(pos, r["rate"], width, yerr=[[r["rate"] - r["ci95"][0]], [r["ci95"][1] - r["rate"]]], capsize=3,
                   color=f"C{i}", alpha=0.85, label=label if x == 0 else None)
            if len(r["per_seed"]) > 1:
                ax.scatter(pos + np.linspace(-0.2, 0.2, len(r["per_seed"])) * width, r["per_seed"], s=12, color="k", zorder=3)
    ax.set_xticks([0, 1], ["known-wrong first answer:\nfixed (final answer right)", "known-right first answer:\nbroken (final answer wrong)"])
    ax.set_ylabel("share of questions")
    ax.legend(fontsize=8)
    return ax
