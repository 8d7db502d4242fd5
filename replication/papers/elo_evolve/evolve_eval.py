"""Elo-Evolve's held-out comparison (Table 1 at the workbook's scale): the judge's accuracy on right/wrong pairs, the
static opponent's rule, training an arm and judging its greedy replies against a reference, the health checks an
arm must pass, the per-arm records and summaries over training seeds, paired differences, the length-controlled
difference, the policy's rating rise, and the paper's Tables 1-2. Every interval comes from replication.core.stats;
over training seeds it joins a t interval between seeds with a bootstrap of the questions (or prompts)."""
import numpy as np

from replication.core import config, files, fmt, paper, stats, verdicts
from replication.lm import arms, models, tasks
from . import evolve
from .judging import correct, right_wrong_pairs, words
from .params import STATIC_RULES



class VerifierJudge:
    """The held-out evaluation judge (the role of AlpacaEval's GPT-4): the exact verifier, which the training judge
    never sees. P(a beats b) = 1 when only a is right, 0 when only b is, 0.5 when both or neither are."""

    name = "verifier"

    def p_win(self, questions, answers, a, b) -> np.ndarray:
        ca = np.array([correct(x, n) for x, n in zip(a, answers)])
        cb = np.array([correct(x, n) for x, n in zip(b, answers)])
        return 0.5 + 0.5 * (ca - cb)


def judge_heldout(model, tok, judge, problems, reference, max_new_tokens: int = 32, seed: int = 0,
                  progress: bool = True, replies=None, shots=(), batch_size: int = 64):
    """Greedy replies to the held-out problems (tasks.evaluate on p.chat(shots)), or the given replies, judged
    against the reference replies. Per-problem rows and a summary: win rate, length-controlled win rate and
    task accuracy (exact verifier) with their 95% intervals (the bootstrap seed is derived from `seed`)."""
    import pandas as pd

    if replies is None:
        replies = tasks.evaluate(model, tok, problems, max_new_tokens, batch_size=batch_size,
                                 prompts=[p.chat(shots) for p in problems], progress=progress)["reply"].tolist()
    qs, ans = [p.question for p in problems], [p.answer for p in problems]
    df = pd.DataFrame({"id": [p.id for p in problems], "reply": list(replies), "reference": list(reference),
                       "p_win": judge.p_win(qs, ans, replies, reference),
                       "correct": [correct(t, a) for t, a in zip(replies, ans)],
                       "format": [tasks.has_format(t) for t in replies],
                       "words": [words(t) for t in replies], "ref_words": [words(t) for t in reference],
                       "tokens": arms.token_lengths(tok, replies) if tok is not None else np.nan})
    wr = stats.win_rate(df["p_win"], seed=config.derive_seed(seed, "win-rate"))
    lc = stats.lc_win_rate(df["p_win"], df["words"], df["ref_words"])
    acc, lo, hi = stats.proportion_ci(int(df["correct"].sum()), len(df))
    return df, {"win_rate": wr["win_rate"], "win_rate_ci95": wr["ci95"], "lc_win_rate": lc["lc_win_rate"],
                "lc_win_rate_ci95": lc["ci95"], "length_coef": lc["length_coef"], "accuracy": acc,
                "accuracy_ci95": [lo, hi], "format_rate": float(df["format"].mean()),
                "mean_words": float(df["words"].mean()), "mean_tokens": float(df["tokens"].mean()), "n": len(df)}


def judge_accuracy(judge, problems, players: dict, seed: int = 0) -> dict:
    """How often the judge prefers the right reply where the truth is known: every pair of players' replies to a
    problem with one right and one wrong (but stated) answer (exact verifier). Mean P(right wins)
    with a bootstrap 95% interval over problems (replication.core.stats), the share of ties, and n pairs."""
    qs, ans, right, wrong, group = right_wrong_pairs(problems, players)
    if not qs:
        return {"accuracy": float("nan"), "ci95": [float("nan")] * 2, "ties": float("nan"), "n": 0}
    pw = judge.p_win(qs, ans, right, wrong)
    est, lo, hi = stats.bootstrap(np.mean, pw, groups=group, seed=config.derive_seed(seed, "judge-accuracy"))
    return {"accuracy": est, "ci95": [lo, hi], "ties": float(np.mean(pw == 0.5)), "n": len(pw), "problems": len(set(group))}


def paper_role(regime: str, static_rule: str = "middle"):
    """The row of the paper's Table 1 an arm stands for: point, elo, or the static arm by its rule's opponent."""
    if regime != "static":
        return regime
    return {"middle": "static-mid", "strongest": "static-strong", "weakest": "static-weak"}.get(static_rule)


def static_choice(names, ratings, rule: str = "middle", start: float = None) -> str:
    """The static arm's opponent by a rule fixed before training: the middle-rated opponent (the paper's best
    static opponent at step 500 was its middle one), the strongest, the weakest, or the one rated nearest to
    the policy's start rating."""
    config.check_choice("static_rule", rule, STATIC_RULES)
    r = np.asarray(ratings, float)
    order = np.argsort(r)
    if rule == "nearest":
        if start is None:
            raise ValueError("start=None is not allowed with rule 'nearest'; give the policy's start rating")
        return list(names)[int(np.argmin(np.abs(r - start)))]
    pick = {"middle": order[len(r) // 2], "strongest": order[-1], "weakest": order[0]}[rule]
    return list(names)[int(pick)]


def health(rows, table, base, regime: str, n_boot: int = 1000, seed: int = 0) -> dict:
    """arms.health of one regime's arm. Its training signal: for point and static, the rise of its reward
    (arms.reward_rise); for Elo, whose opponents get stronger as it improves, the rise of its rating from the start
    to the end of the run. table, base: judge_heldout rows of the arm and of the base model (correct, tokens)."""
    if regime == "elo":
        rise = float(rows[-1]["rating"] - rows[0]["rating_before"]) if rows else float("nan")
        signal = {"signal": "policy Elo", "change": rise, "ci95": None}
    else:
        signal = arms.reward_rise([r["reward_mean"] for r in rows], n_boot=n_boot, seed=seed)
    return arms.health(signal, table["correct"], base["correct"], table["tokens"], base["tokens"],
                       train_tokens=[r["completion_len"] for r in rows])


def arm_record(name: str, rows, table, summary: dict, check: dict, training_seed: int = None) -> dict:
    """arms.record of one trained arm and training seed (samples: completions trained on), then the share of groups
    with equal rewards (no GRPO gradient), the win rates against the reference and the reply length in words."""
    return arms.record(name, table["correct"], len(rows), sum(r["samples"] for r in rows), check,
                       training_seed=training_seed, zero_gradient_share=float(np.mean([r["zero_std_frac"] for r in rows])),
                       win_rate=float(summary["win_rate"]), lc_win_rate=float(summary["lc_win_rate"]),
                       mean_words=float(summary["mean_words"]))


def compare(evals: dict, records: dict, pairs, column: str = "p_win", seed: int = 0) -> dict:
    """arms.compare for (a, b) pairs of arms on the same held-out problems and training seeds (the mean of `column`:
    p_win, the win rate against the reference; correct, accuracy), each with its own bootstrap seed. evals[arm]:
    one judge_heldout table or a list of them, one per training seed."""
    return {f"{a} - {b}": arms.compare(a, b, evals, records, column, on="id",
                                       seed=config.derive_seed(seed, "paired", a, b, column)) for a, b in pairs}


def part(entry: dict, effect: float = None) -> dict:
    """One compared pair (an entry of compare()) as a part of a compound claim (verdicts.part): its verdict by the one
    rule from its two-level interval and per-seed differences (one seed: at most inconclusive), with the interval and
    seeds the ledger shows beside it. A failed health check does not enter it: run.claim names it beside."""
    b = entry["basis"]
    return verdicts.part(b["interval"], effect=effect, estimate=b.get("estimate"),
                         seed_differences=b.get("seed_differences"))


def describe(comparisons: dict) -> str:
    """'a - b +0.031 [-0.012, +0.075] (seeds +0.020 / +0.050 / +0.030); ...' for compare()'s entries, an arm that
    failed its health check named beside its pair."""
    out = []
    for k, v in comparisons.items():
        text = f"{k} {fmt.diff((v['difference'], *v['ci95']))}"
        if len(v["per_seed"]) > 1:
            text += " (seeds " + " / ".join(f"{x:+.3f}" for x in v["per_seed"]) + ")"
        out.append(text + (f" ({', '.join(v['failed'])} failed health)" if v["failed"] else ""))
    return "; ".join(out)


def rating_lag(k: float) -> float:
    """Steps the mean-rule Elo update needs to close a gap between rating and skill by a factor e, near E = 0.5:
    each step moves R by K x mean(S - E), and dE/dR = ln(10) / 400 x E (1 - E), so the lag is 1 / (K ln 10 / 1600)."""
    if not isinstance(k, (int, float)) or k <= 0:
        raise ValueError(f"k={k!r} is not allowed; the Elo K-factor must be > 0")
    return 1600.0 / (k * np.log(10.0))


def _aligned(tables, like):
    """The tables (one per seed) with their rows in the order of `like`'s ids (the same held-out questions)."""
    out = []
    for t in tables:
        if sorted(t["id"]) != sorted(like["id"]):
            raise ValueError("the held-out tables must answer the same questions")
        out.append(t.set_index("id").loc[list(like["id"])].reset_index())
    return out


def _lc(p, words_, ref_words):
    """stats.lc_win_rate's estimate alone: with no spread of length differences it is the mean win probability, which
    is taken directly here (stats.lc_win_rate would also bootstrap its interval, on every draw of lc_win_rates)."""
    d = words_ - ref_words
    if np.ptp(d) == 0:
        return float(np.clip(p, 0.0, 1.0).mean())
    return stats.lc_win_rate(p, words_, ref_words)["lc_win_rate"]


def lc_win_rates(a, b=None, n_boot: int = 1000, seed: int = 0) -> dict:
    """The length-controlled win rate of arm a over training seeds, or, given b, a's minus b's on the same questions
    and seeds: stats.lc_win_rate (a GLM fitted per arm and seed) per seed, their mean, and the 95% interval of
    stats.nested_bootstrap (between seeds a t interval, within a bootstrap of the questions, paired for a and b),
    refitting the GLMs on every draw: the GLM has no per-question value for stats.two_level_bootstrap.
    a, b: judge_heldout tables, one or a list per training seed (b may be one table, e.g. the base model)."""
    ta = arms.by_seed(a)
    tb = None if b is None else arms.by_seed(b)
    if tb is not None and len(tb) not in (1, len(ta)):
        raise ValueError(f"a has {len(ta)} seeds and b {len(tb)}; pair the same training seeds")
    tb = None if tb is None else _aligned(tb * (len(ta) if len(tb) == 1 else 1), ta[0])
    ta = _aligned(ta, ta[0])
    cols = lambda t: [t[c].to_numpy(float) for c in ("p_win", "words", "ref_words")]  # noqa: E731
    units = [cols(x) + ([] if tb is None else cols(tb[i])) for i, x in enumerate(ta)]

    def value(*c):   # one seed's (resampled) questions: a's LC win rate, minus b's when given
        return _lc(*c[:3]) - (_lc(*c[3:]) if len(c) > 3 else 0.0)

    n, q = len(ta), len(ta[0])
    per_seed = [value(*u) for u in units]
    interval = stats.nested_bootstrap(value, units, [np.arange(q)] * n, n_boot=n_boot, seed=seed).interval
    return {"estimate": float(np.mean(per_seed)), "ci95": interval, "per_seed": [float(x) for x in per_seed],
            "seeds": n, "questions": q, "n": f"{n} seed{'s' if n > 1 else ''} x {q} questions"}


def arm_summary(tables, n_boot: int = 1000, seed: int = 0) -> dict:
    """One arm's held-out numbers over its training seeds (tables: judge_heldout rows, one or a list per seed): win
    rate against the reference and accuracy (stats.two_level_bootstrap over seeds x questions), the LC win rate
    (lc_win_rates), each with its per-seed values (`<metric>_seeds`), and the mean format rate and words."""
    tables = arms.by_seed(tables)
    out = {"seeds": len(tables)}
    for key, col in (("win_rate", "p_win"), ("accuracy", "correct")):
        x = np.array([t[col].to_numpy(float) for t in tables])
        r = stats.two_level_bootstrap(x, n_boot=n_boot, seed=config.derive_seed(seed, key))
        out.update({key: r[0], f"{key}_ci95": r.interval, f"{key}_seeds": x.mean(axis=1).tolist()})
    lc = lc_win_rates(tables, n_boot=n_boot, seed=config.derive_seed(seed, "lc_win_rate"))
    out.update(lc_win_rate=lc["estimate"], lc_win_rate_ci95=lc["ci95"], lc_win_rate_seeds=lc["per_seed"],
               format_rate=float(np.mean([t["format"].mean() for t in tables])),
               mean_words=float(np.mean([t["words"].mean() for t in tables])))
    return out


def rating_rise(runs, k: float, n_boot: int = 2000, seed: int = 0) -> dict:
    """The change of the policy's Elo over a run under the mean rule, K times the sum over steps of mean(S - E), over
    training seeds. runs: one Elo run's step rows (they log outcomes and expected) or a list of runs, one per seed.
    Per prompt (its G matches share its opponent): K x steps x its mean(S - E), whose mean over a run's prompts is the
    run's rise; the interval is stats.two_level_bootstrap's over seeds x prompts."""
    runs = [runs] if runs and isinstance(runs[0], dict) else list(runs)
    per_prompt = [prompt_rises(rows, k) for rows in runs]
    if len({len(v) for v in per_prompt}) != 1:
        raise ValueError("every seed's run must have the same number of steps and prompts")
    x = np.array(per_prompt)
    r = stats.two_level_bootstrap(x, n_boot=n_boot, seed=config.derive_seed(seed, "rating-rise"))
    n = len(x)
    return {"rise": r[0], "ci95": r.interval, "per_seed": x.mean(axis=1).tolist(), "seeds": n, "prompts": x.shape[1],
            "n": f"{n} seed{'s' if n > 1 else ''} x {x.shape[1]} prompts"}


def prompt_rises(rows, k: float) -> list:
    """One Elo run's rise split by prompt, in step order: K x steps x the prompt's mean(S - E) over its G matches (their
    mean over the run's prompts is the run's rise under the mean rule)."""
    v = []
    for r in rows:
        d = np.asarray(r["outcomes"], float) - np.asarray(r["expected"], float)
        v += (k * len(rows) * d.reshape(len(r["opponents"]), -1).mean(axis=1)).tolist()
    return v


def sampling_movement(rows, names) -> dict:
    """How far an Elo run's opponent probabilities moved: first and last step, and the largest change of any
    opponent's probability between them."""
    p = np.array([r["probs"] for r in rows], float)
    return {"first": dict(zip(names, p[0].round(4).tolist())), "last": dict(zip(names, p[-1].round(4).tolist())),
            "largest_change": float(np.max(np.abs(p[-1] - p[0]))),
            "largest_range": float(np.max(p.max(0) - p.min(0)))}


def paper_table1(step: int = 500):
    """The paper's AlpacaEval 2.0 WR and LC (Table 1) after `step` steps, base at step 0: regime x metric."""
    t = paper.table("elo_evolve_table1")
    t = t[t["step"].isin([0, step]) & t["metric"].isin(["alpacaeval_wr", "alpacaeval_lc"])]
    return t.pivot_table(index="regime", columns="metric", values="value")


def paper_tables(metric: str = "alpacaeval_wr"):
    """The paper's Tables 1 and 2 side by side: one row per method (Table 2's static opponents included),
    one column per step, for one metric (alpacaeval_wr, alpacaeval_lc or mt_bench)."""
    import pandas as pd

    parts = []
    for name in ("elo_evolve_table1", "elo_evolve_table2"):
        t = paper.table(name)
        t = t[t["metric"] == metric].assign(table=name.split("_")[-1])
        parts.append(t)
    t = pd.concat(parts)
    out = t.pivot_table(index=["table", "method"], columns="step", values="value", sort=False)
    out.columns = [f"step {c}" for c in out.columns]
    return out.reset_index()


def results_table(summaries: dict, records: dict, roles: dict, step: int = 500):
    """Each arm's held-out win rate, LC win rate and accuracy over its training seeds (arm_summary: mean with the
    two-level 95% interval, and the per-seed accuracies), format, words, steps, completions trained on per seed,
    zero-gradient share and health, beside the paper's WR / LC at `step`. records: arm -> arm_record or a list per
    seed; roles: arm name -> the paper's regime it stands for (base, point, static-mid, elo...)."""
    import pandas as pd

    at = paper_table1(step)
    ci = lambda r, key: f"{r[key]:.3f} [{r[key + '_ci95'][0]:.3f}, {r[key + '_ci95'][1]:.3f}]"  # noqa: E731
    rows = []
    for name, r in summaries.items():
        recs, reg = arms.by_seed(records.get(name, [])), roles.get(name)
        failed = arms.failed_text([name], {name: recs}) if recs else None
        rows.append({"arm": name, "win rate": ci(r, "win_rate"), "LC win rate": ci(r, "lc_win_rate"),
                     "accuracy": ci(r, "accuracy"), "accuracy by seed": " / ".join(f"{x:.3f}" for x in r["accuracy_seeds"]),
                     "format": round(r["format_rate"], 3), "words": round(r["mean_words"], 1),
                     "steps": recs[0]["steps"] if recs else 0, "samples": recs[0]["samples"] if recs else 0,
                     "zero-gradient groups": round(float(np.mean([x["zero_gradient_share"] for x in recs])), 3) if recs else None,
                     "health": "healthy" if not failed else failed.replace("failed health check: ", "failed: "),
                     f"paper WR/LC @{step}": (f"{at.loc[reg, 'alpacaeval_wr']:.2f} / {at.loc[reg, 'alpacaeval_lc']:.2f}"
                                              if reg in at.index else "")})
    return pd.DataFrame(rows)


def eval_key(folder, heldout, reference, grpo_cfg, cfg: "evolve.EvolveConfig", shots, eval_judge) -> dict:
    """The cache key of a run's held-out judging ("evolve_eval", train_and_evaluate)."""
    return {"run": folder.path.name, "heldout": files.digest([p.id + "|" + p.question for p in heldout]),
            "reference": files.digest(list(reference)), "max_new_tokens": grpo_cfg.max_new_tokens, "seed": cfg.seed,
            "shots": [s.question for s in shots], "judge": getattr(eval_judge, "name", "")}


def train_and_evaluate(setting: "evolve.ArmSetting", judge, opponents: "evolve.Opponents", cfg: "evolve.EvolveConfig",
                       grpo_cfg, folder, cache):
    """Train one regime on a fresh LoRA adapter in `folder` (run.run_folder) and judge its greedy replies to the
    held-out problems (the same shots) with setting.eval_judge (None: the training judge) through cache(name, key,
    make) (run.cached). Returns (step rows, evaluation summary with the steps and training seconds, evaluation
    rows)."""
    import torch

    S = setting
    eval_judge = judge if S.eval_judge is None else S.eval_judge
    model, tok = models.load_model(S.model)
    torch.manual_seed(config.derive_seed(grpo_cfg.seed, "evolve-lora"))  # the same adapter init for every regime
    model = models.add_lora(model, r=S.lora_r, alpha=2 * S.lora_r)
    rows = evolve.train(model, tok, judge, S, opponents, cfg, grpo_cfg, folder)
    key = eval_key(folder, S.heldout, S.reference, grpo_cfg, cfg, S.shots, eval_judge)

    def make():
        df, summary = judge_heldout(model, tok, eval_judge, list(S.heldout), list(S.reference), grpo_cfg.max_new_tokens,
                                    cfg.seed, S.progress, shots=list(S.shots))
        return {"summary": summary, "rows": df.to_dict("records")}

    ev = cache("evolve_eval", key, make)
    summary = {**ev["summary"], "steps": len(rows), "wall_time_s": float(sum(r.get("wall_s", 0.0) for r in rows))}
    return rows, summary, ev["rows"]
