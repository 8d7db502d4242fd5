"""A label-free judge with signal for MAE's answers: the base model's likelihood of each reply.

MAE's judge is the model itself, prompted for a `<score>` (notebook 06 measures that this 135M model's prompted score
does not tell right answers from wrong). The likelihood judge drops the prompt and reads a belief instead: a reply's
score is the mean probability per token that the model as it was before training (the adapters disabled, so the
judge stays frozen while the policy trains) gives it,

    s(a | q) = exp( (1/|a|) sum_t log p_0(a_t | q, instruction, a_<t) ),     in (0, 1],

the reply (+ EOS) scored alone as the assistant's reply to the question and the answer instruction
(`lm.judges.response_logps`, the likelihood of notebooks 01 and 02, whose judge is also the frozen base model).
Within a question the likelier reply wins, as in `lm.judges.likelihood_verdicts`; across questions the score is
absolute, so MAE's difficulty (1 - the mean score of a question's answers) keeps its meaning. No reference answer,
no verifier and no worked example enter the score.

The frozen base model judges, not the policy: a policy judging by its own likelihood learns to make its own wrong
replies likely (why, and the other design left, is on the MAE page: replication/papers/mae/README.md).
"""
from contextlib import nullcontext

import numpy as np
import pandas as pd

from replication.core import config, stats
from replication.lm import judges, tasks


def scores(model, tok, questions, replies, batch_size: int = 16) -> list:
    """The likelihood judge's score in (0, 1] of each reply to its question, exp(mean log-prob per token), under the
    base model: a model with adapters is read with them disabled (the frozen judge), a plain model as it is."""
    config.check_int("batch_size", batch_size)
    if not len(replies):
        return []
    frozen = model.disable_adapter() if hasattr(model, "disable_adapter") else nullcontext()
    with frozen:
        lp = judges.response_logps(model, tok, list(questions), list(replies), instruction=tasks.INSTRUCTION,
                                   batch_size=batch_size)
    return np.exp(lp["mean_logp"].to_numpy(float)).tolist()


def scorer(model, tok, batch_size: int = 16):
    """mae.collect's score_answers(questions, replies) -> scores, by the frozen base of the model being trained."""
    return lambda questions, replies: scores(model, tok, questions, replies, batch_size)


def judge_table(model, tok, table: pd.DataFrame, batch_size: int = 16) -> pd.DataFrame:
    """A held-out answer table (question, reply, correct) with the likelihood judge's score of each reply."""
    return table.assign(score=scores(model, tok, table["question"], table["reply"], batch_size))


def signal(judged, n_boot: int = 1000, seed: int = 0) -> dict:
    """How well the judge's scores rank right replies above wrong ones (the exact verifier's `correct`), over judges
    (one judged table per training seed, the same questions): the AUC per judge and its mean with a two-level
    interval (stats.nested_bootstrap: judges, then questions); n as '3 seeds x 200 questions'."""
    judged = list(judged)
    units = [[j["score"].to_numpy(float), j["correct"].to_numpy(bool)] for j in judged]
    groups = [j["qid"].to_numpy() if "qid" in j else np.arange(len(j)) for j in judged]
    r = stats.nested_bootstrap(stats.auc, units, groups, n_boot=n_boot, seed=seed, bounds=(0, 1))
    k, n = len(judged), len(judged[0]) if judged else 0
    return {"auc": r[0], "ci95": r.interval, "per_seed": [stats.auc(*u) for u in units],
            "mean_score_right": [float(j.loc[j["correct"].astype(bool), "score"].mean()) for j in judged],
            "mean_score_wrong": [float(j.loc[~j["correct"].astype(bool), "score"].mean()) for j in judged],
            "n": f"{k} seed{'s' if k > 1 else ''} x {n} questions"}
