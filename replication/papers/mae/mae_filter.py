"""Does MAE's quality filter have signal? Its judge on questions of known quality.

The filter lets a proposed question into the pool when the judge rates it >= the threshold. Whether it keeps
low-quality questions out can be measured only on questions whose quality is known, so `question_corpus` makes
them from the task's own problems by controlled degradation (as lm.judges.quality_corpus does for answers): the
problem as written (well posed), and three versions the paper's rubric rates low ("an unsolvable or
self-contradictory problem gets 1-3"): the starting amount removed (unsolvable), more given away than held
(self-contradictory), and the words shuffled (not a problem). The judge rates each as in the loop (`mae.JUDGE_QUESTION`,
its turn opened with `<score>`, sampled, read by the run's score rule), and `signal` reads what the filter does
with them: the pass rate of well-posed questions minus that of degraded ones (paired by problem) and the AUC of the
quality score, each with a two-level interval over the judges (training seeds) and the problems."""
import re

import numpy as np
import pandas as pd

from replication.core import config, stats
from replication.lm import models
from . import mae, mae_scores

DEGRADATIONS = ("unsolvable", "contradictory", "shuffled")


def _unsolvable(question: str) -> str:
    """The first amount removed: "Mia has 12 apples." -> "Mia has some apples." (nothing says how many)."""
    return re.sub(r"\bhas \d+ ", "has some ", question, count=1)


def _contradictory(question: str, rng) -> str:
    """A second sentence that gives away more than was there: "Mia gives away N apples." with N above the total."""
    start = re.search(r"(\w+) has (\d+) (\w+)\.", question)
    if not start:
        return question
    name, n, item = start.group(1), int(start.group(2)), start.group(3)
    numbers = [int(x) for x in re.findall(r"\d+", question)]
    more = sum(numbers) + int(rng.integers(5, 50))
    return question.replace(start.group(0), f"{start.group(0)} {name} gives away {more} {item} first.", 1) if n else question


def _shuffled(question: str, rng) -> str:
    words = question.replace("?", "").replace(".", "").split()
    return " ".join(rng.permutation(words)) + "?"


def question_corpus(problems, seed: int = 0) -> pd.DataFrame:
    """Per problem: the question as written (well_posed True) and its three degraded versions (DEGRADATIONS)."""
    config.check_int("seed", seed, minimum=0)
    rng = np.random.default_rng(config.derive_seed(seed, "mae-question-corpus"))
    rows = []
    for p in problems:
        versions = {"well_posed": p.question, "unsolvable": _unsolvable(p.question),
                    "contradictory": _contradictory(p.question, rng), "shuffled": _shuffled(p.question, rng)}
        rows += [{"problem": p.id, "kind": k, "well_posed": k == "well_posed", "question": q} for k, q in versions.items()]
    return pd.DataFrame(rows)


def rate_questions(model, tok, corpus: pd.DataFrame, cfg: "mae.MAEConfig", batch_size: int = 16,
                   seed: int = 0) -> pd.DataFrame:
    """The active model as MAE's question judge on each corpus question, as in the loop (mae.JUDGE_QUESTION, the turn
    opened with `<score>`, sampled at cfg.temperature for cfg.judge_tokens, read by cfg.score_rule): adds the
    judgment, its quality score in [0, 1] (0.5 when it gave none, as the loop uses it) and whether it passes the
    filter (mae.passes_filter at cfg.quality_threshold)."""
    prompts = [mae.JUDGE_QUESTION.format(question=q) for q in corpus["question"]]
    texts = [t + mae.SCORE_PREFILL for t in models.chat_prompts(tok, prompts)]
    gen = models.generate(model, tok, texts, max_new_tokens=cfg.judge_tokens, temperature=cfg.temperature, seed=seed,
                          batch_size=batch_size, chat=False)
    replies = [mae.SCORE_PREFILL + t for t in gen.texts]
    quality = [mae_scores.parse_score(t, cfg.score_rule) for t in replies]
    return corpus.assign(judgment=replies, quality=quality,
                         passes=[mae.passes_filter(q, cfg.quality_threshold) for q in quality])


def pass_gaps(rated: pd.DataFrame) -> np.ndarray:
    """Per problem: the well-posed question's pass (0/1) minus the mean pass of its degraded versions."""
    wide = rated.pivot_table(index="problem", columns="well_posed", values="passes", aggfunc="mean", sort=False)
    return (wide[True] - wide[False]).to_numpy(float)


def signal(rated_by_judge, n_boot: int = 1000, seed: int = 0) -> dict:
    """What the filter does with questions of known quality, over judges (one rated corpus per training seed's
    judge, the same problems each): the pass rate of well-posed and of degraded questions, their paired gap per
    problem (two-level bootstrap: judges, then problems) and the AUC of the quality score for well-posed vs
    degraded (stats.nested_bootstrap over judges, then problems), with per-judge values; n as '3 seeds x 50
    problems'."""
    rated = list(rated_by_judge)
    gaps = np.stack([pass_gaps(r) for r in rated])
    gap = stats.two_level_bootstrap(gaps, n_boot=n_boot, seed=seed, bounds=(-1, 1))
    units = [[r["quality"].to_numpy(float), r["well_posed"].to_numpy(bool)] for r in rated]
    auc = stats.nested_bootstrap(stats.auc, units, [r["problem"].to_numpy() for r in rated], n_boot=n_boot, seed=seed,
                                 bounds=(0, 1))
    k = len(rated)
    return {"pass_well_posed": [float(r.loc[r["well_posed"], "passes"].mean()) for r in rated],
            "pass_degraded": [float(r.loc[~r["well_posed"], "passes"].mean()) for r in rated],
            "pass_by_kind": [r.groupby("kind", sort=False)["passes"].mean().to_dict() for r in rated],
            "gap": gap[0], "gap_ci95": gap.interval, "gap_per_judge": [float(g.mean()) for g in gaps],
            "auc": auc[0], "auc_ci95": auc.interval, "auc_per_judge": [stats.auc(*u) for u in units],
            "n": f"{k} seed{'s' if k > 1 else ''} x {gaps.shape[1]} problems"}
