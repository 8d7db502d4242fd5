"""Debate on hard stories (notebook 04, section (d)): stories whose distractor appears in the story itself, as in
the paper's QuALITY-HARD split, where a judge who reads the story is helped less. For one story level: the naive and
expert judges (debate_runs.cached_judge), one-round debaters of several strengths (best-of-k, any k up to the largest,
from one pool of sampled arguments per draw: crossplay.pools), their cross-play tournament (crossplay.plays),
the accuracy of debate against the naive and the expert judge, and the tournament's statistics over draws
(crossplay.over_draws). Debate only: the consultancy rows stay with the notebook's main level."""
from dataclasses import replace

from replication.core import config, stats
from . import crossplay, debate_eval, debate_runs
from .params import check_strengths

PAIRS = {"debate - naive": ("debate", "naive"), "expert - debate": ("expert", "debate"),
         "debate: best-of-N - best-of-1": ("debate", "debate (best-of-1)")}
TOURNAMENT = ("gap_mean", "gap_slope", "accuracy_slope")


def study(cache, model, tok, items, ks, draws, seed: int, setting: debate_runs.Setting, folder=None,
          workers: int = 1) -> dict:
    """Everything section (d) shows for one story level. setting: the main level's (its best_of is replaced by
    max(ks)); draws: the arguments' sampling seeds; folder and workers: crossplay.pools' and crossplay.plays'. Returns the
    judgments by protocol (naive, expert: one each; debate at the strongest k and at best-of-1: one per draw),
    their accuracies, expert - naive (paired bootstrap over stories), the paired differences of PAIRS over draws
    then stories, the tournament's per-draw table (crossplay.debater_table) and statistics, and the records."""
    ks = check_strengths(ks)
    top, best_of = len(ks) - 1, ks[-1]
    setting = replace(setting, best_of=best_of)
    judgments = {k: debate_runs.cached_judge(cache, model, tok, items, k, setting) for k in ("naive", "expert")}
    pools = crossplay.pools(cache, folder, model, tok, items, ["debate"], setting, draws, workers)["debate"]
    plays = crossplay.plays(cache, folder, model, tok, pools, ks, setting, workers)
    judgments.update({"debate": [crossplay.cell(p, top, top) for p in plays],
                      "debate (best-of-1)": [crossplay.cell(p, 0, 0) for p in plays]})
    words = {"debate": [crossplay.picked_words(p, best_of) for p in pools],
             "debate (best-of-1)": [crossplay.picked_words(p, 1) for p in pools]}
    records = debate_eval.protocol_records(judgments, words, best_of, draws)
    ladder = crossplay.ladder_records(plays, pools, ks, draws)
    expert_naive = stats.paired_bootstrap(debate_eval.hits(judgments["expert"]["p_correct"]),
                                          debate_eval.hits(judgments["naive"]["p_correct"]),
                                          seed=config.derive_seed(seed, "hard", "expert - naive"))
    return {"ks": ks, "judgments": judgments, "records": records, "expert_minus_naive": expert_naive,
            "accuracy": {k: debate_eval.protocol_accuracy(v, config.derive_seed(seed, "hard-accuracy", k))
                         for k, v in judgments.items()},
            "differences": debate_eval.protocol_differences(judgments, records, config.derive_seed(seed, "hard"),
                                                            pairs=PAIRS),
            "elo_table": crossplay.debater_table(plays, None, ks),
            "tournament": crossplay.over_draws(list(TOURNAMENT), [crossplay.debate_hits(p) for p in plays], seed,
                                               records=ladder),
            "pairs_judged": sum(p["pairs_judged"] for p in plays)}
