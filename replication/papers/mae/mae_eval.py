"""Multi-Agent Evolve at the workbook's scale: the solver on held-out questions (greedy, exact verifier), the judge
scored against that verifier (with and without its `<score>` prefill), each trained arm's health check and record
(replication.lm.arms, the one every trained arm of the workbook passes), pool summaries, the arms' numbers over their
training seeds (two-level intervals: seeds, then questions or proposals) and the paper's tables."""
import numpy as np
import pandas as pd

from replication.core import fmt, paper, stats
from replication.lm import arms, models, tasks
from . import mae, mae_scores



def heldout_answers(model, tok, problems, shots=(), max_new_tokens: int = 32, batch_size: int = 16, seed: int = 0,
                    temperature: float = 0.0):
    """The active solver's answers to held-out problems with the loop's solver prompt (tasks.evaluate, exact verifier),
    greedy unless a temperature is given; `qid` names each problem, so tables of different arms pair on it."""
    table = tasks.evaluate(model, tok, problems, max_new_tokens, batch_size, seed, temperature=temperature,
                           prompts=[mae.solve_prompt(p.question, shots) for p in problems], progress=False)
    return table.assign(qid=table["id"])


def judge_eval(model, tok, frame: pd.DataFrame, cfg: "mae.MAEConfig", batch_size: int = 16, seed: int = 0,
               prefill: bool = True) -> pd.DataFrame:
    """The judge, sampled as in training (cfg.temperature, cfg.judge_tokens), scores each (question, reply) of a
    held-out answer frame, read by cfg.score_rule; with `prefill` its turn opens with `<score>` as in the loop,
    without it the reply is free (the setup before the prefill). Adds judgment, raw_score, parse and score."""
    prompts = [mae.JUDGE_ANSWER.format(question=q, answer=a) for q, a in zip(frame["question"], frame["reply"])]
    opening = mae.SCORE_PREFILL if prefill else ""
    texts = [t + opening for t in models.chat_prompts(tok, prompts)]
    gen = models.generate(model, tok, texts, max_new_tokens=cfg.judge_tokens, temperature=cfg.temperature, seed=seed,
                          batch_size=batch_size, chat=False)
    replies = [opening + t for t in gen.texts]
    raw = [mae_scores.read_score(t, cfg.score_rule) for t in replies]
    return frame.assign(judgment=replies, raw_score=[r[0] for r in raw], parse=[r[1] for r in raw],
                        score=[mae_scores.parse_score(t, cfg.score_rule) for t in replies])


def judge_summary(judged: pd.DataFrame) -> dict:
    """How a judged frame's scores track the verifier (stats.agreement at the rubric's 4-of-10 line), the share of
    replies whose score was read from the tag (Wilson 95%), and the raw scores it gave, most frequent first."""
    k = int((judged["parse"] == "tag").sum())
    tag, lo, hi = stats.proportion_ci(k, len(judged))
    raw = judged["raw_score"].value_counts(dropna=False).head(5)
    return {**stats.agreement(judged["score"], judged["correct"], cut=mae.AGREEMENT_CUT), "tag_rate": tag,
            "tag_rate_ci95": [lo, hi], "tag_count": k,
            "top_raw_scores": {("none" if pd.isna(s) else f"{s:g}"): int(c) for s, c in raw.items()}}


def arm_record(name: str, result: dict, table: pd.DataFrame, base: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> dict:
    """arms.record of one trained arm (steps: iterations; samples: completions trained on, all roles), its health from
    arms.health on the solver's training reward and reply length, then the solver's share of the samples, the
    answers with a known answer, and the paired difference from the base model."""
    rows = pd.DataFrame(result["rows"])
    check = arms.health(arms.reward_rise(rows["solver_reward"], n_boot=n_boot, seed=seed), table["correct"],
                        base["correct"], table["tokens"], base["tokens"], train_tokens=rows["solver_tokens"])
    d = stats.paired_bootstrap(*arms.paired(table, base), n_boot=n_boot, seed=seed)
    return arms.record(name, table["correct"], len(rows), int(rows["samples"].sum()), check,
                       solver_samples=int(rows["solver_samples"].sum()), known_answer_samples=int(rows["seed_answers"].sum()),
                       heldout_format=float(table["format"].mean()), heldout_tokens=float(table["tokens"].mean()),
                       vs_base={"difference": d[0], "ci95": [d[1], d[2]]})


def base_record(base: pd.DataFrame) -> dict:
    """The untrained base solver as an arm (no steps, no samples; healthy by definition)."""
    return arms.record("base", base["correct"], heldout_format=float(base["format"].mean()),
                       heldout_tokens=float(base["tokens"].mean()))


def accuracy(frame: pd.DataFrame) -> dict:
    """Held-out accuracy of a frame of verified replies: accuracy with its Wilson 95% interval, n, format rate."""
    p, lo, hi = stats.proportion_ci(int(frame["correct"].sum()), len(frame))
    return {"accuracy": p, "ci95": [lo, hi], "n": len(frame), "format": float(frame["format"].mean())}


def pool_summary(rows: pd.DataFrame, n_seeds: int) -> dict:
    """Pool size at the start and end of a run and what happened to its proposals."""
    return {"initial": n_seeds, "final": int(rows["pool_size"].iloc[-1]), "accepted": int(rows["accepted"].sum()),
            "filtered": int(rows["filtered"].sum()), "no_question": int(rows["no_question"].sum())}


def arm_summary(result: dict, iterations: int) -> dict:
    """One arm over its first `iterations` iterations: pool, what the filter did, the accepted questions' judged
    quality, and the mean rewards and judge format rate."""
    r = pd.DataFrame(result["rows"]).iloc[:iterations]
    props = pd.DataFrame(result["proposals"])
    quality = props[(props["iteration"] < iterations) & props["accepted"].astype(bool)]["quality"]
    return {"iterations": len(r), "pool_final": int(r["pool_size"].iloc[-1]), "accepted": int(r["accepted"].sum()),
            "filtered": int(r["filtered"].sum()), "no_question": int(r["no_question"].sum()),
            "mean_quality_accepted": float(quality.mean()) if len(quality) else None,
            **{k: float(r[k].mean()) for k in ("proposer_reward", "proposer_difficulty", "solver_reward", "judge_format")}}


def seed_curves(rows, column: str) -> pd.DataFrame:
    """One per-iteration column of an arm's training seeds (a list of row frames): iteration (from 1) x seed index."""
    return pd.DataFrame({i: r.set_index(r["iteration"] + 1)[column] for i, r in enumerate(rows)})


def seed_lines(ax, curves: pd.DataFrame, color, label: str, style: str = "o-") -> None:
    """Training curves on a matplotlib axis: each training seed's (a column of `curves`) thin, their mean bold."""
    ax.plot(curves.index, curves, color=color, lw=0.7, alpha=0.35)
    ax.plot(curves.index, curves.mean(axis=1), style, color=color, label=label)


def versus(c: dict) -> str:
    """An arms.compare result as ledger text: 'a - b +0.062 [+0.000, +0.284] (seeds: +0.125, +0.000; P(improvement)
    0.75)'."""
    seeds = ", ".join(f"{d:+.3f}" for d in c["per_seed"])
    return (f"{c['pair']} {fmt.diff((c['difference'], *c['ci95']))} (seeds: {seeds}; "
            f"P(improvement) {c['probability_of_improvement']:.2f})")


def share(s: dict) -> str:
    """A share over seeds (_over_seeds) as text: '25% [12%, 40%]'."""
    return f"{s['mean']:.0%} [{s['ci95'][0]:.0%}, {s['ci95'][1]:.0%}]"


def _over_seeds(values, n_boot: int, seed: int, unit: str = "questions", bounds=(0, 1)) -> dict:
    """The mean of a seeds x items array with its two-level 95% interval (stats.two_level_bootstrap: a t interval
    between the seeds' means joined with a bootstrap of the items) kept inside `bounds` (an accuracy or share: 0 to 1),
    each seed's mean, and n as '3 seeds x 200 questions'."""
    x = np.asarray(values, float)
    r = stats.two_level_bootstrap(x, n_boot=n_boot, seed=seed, bounds=bounds)
    k = x.shape[0]
    return {"mean": r[0], "ci95": r.interval, "per_seed": [float(v) for v in x.mean(axis=1)],
            "n": f"{k} seed{'s' if k > 1 else ''} x {x.shape[1]} {unit}"}


def accuracy_over_seeds(tables, n_boot: int = 1000, seed: int = 0) -> dict:
    """Held-out accuracy of an arm over its training seeds (one table per seed, the same questions; an untrained arm:
    one table): the accuracy (mean over seeds), its two-level 95% interval and each seed's accuracy."""
    out = _over_seeds([t.sort_values("qid")["correct"] for t in arms.by_seed(tables)], n_boot, seed)
    return {"accuracy": out.pop("mean"), **out}


def agreement_over_seeds(judged, n_boot: int = 1000, seed: int = 0) -> dict:
    """The trained judge of each training seed against the verifier (judge_summary per seed, on that seed's held-out
    replies) and its agreement above the majority-class baseline over seeds: per reply, (score >= the rubric's cut)
    == correct minus its seed's baseline; the mean with its two-level 95% interval and each seed's value."""
    per_seed = [judge_summary(j) for j in judged]
    above = [((j["score"] >= mae.AGREEMENT_CUT) == j["correct"].astype(bool)).to_numpy(float) - s["majority_baseline"]
             for j, s in zip(judged, per_seed)]
    return {"per_seed": per_seed, "above_baseline": _over_seeds(above, n_boot, seed, bounds=(-1, 1))}


def proposal_shares(results, n_boot: int = 1000, seed: int = 0) -> dict:
    """What the quality filter did with an arm's proposals over its training seeds (one loop result per seed, the same
    number of proposals each): the share accepted into the pool and the share filtered out (a question judged below
    the threshold), each over all proposals with its two-level 95% interval and per-seed shares."""
    props = [pd.DataFrame(r["proposals"]) for r in results]
    accepted = [p["accepted"].astype(bool) for p in props]
    filtered = [p["question"].notna() & ~a for p, a in zip(props, accepted)]
    return {"accepted": _over_seeds(accepted, n_boot, seed, "proposals"),
            "filtered": _over_seeds(filtered, n_boot, seed, "proposals"),
            "held_question": int(sum(p["question"].notna().sum() for p in props))}


def settings_table(cfg: "mae.MAEConfig") -> pd.DataFrame:
    """The authors' settings (data/paper/mae_settings.csv) beside this run's."""
    ours = {"quality_threshold": cfg.quality_threshold, "n_solve": cfg.n_solve, "reference_ratio": cfg.reference_ratio,
            "batch_per_role": f"{cfg.proposals} proposals, <= {(cfg.proposals + cfg.pool_solve) * cfg.n_solve} answers",
            "lr": f"{cfg.lr} (LoRA r={cfg.lora_r})", "kl_coef": 0.0, "temperature": cfg.temperature, "steps": cfg.iterations}
    table = paper.table("mae_settings").set_index("quantity")
    return table.assign(ours=pd.Series(ours)).loc[list(ours), ["value", "ours", "meaning", "source"]]


def paper_table() -> pd.DataFrame:
    """The paper's Table 1 (data/paper/mae_results.csv) as setting x model by benchmark."""
    results = paper.table("mae_results")
    return results.pivot_table(index=["setting", "model"], columns="benchmark", values="value", sort=False)[
        list(dict.fromkeys(results["benchmark"]))]
