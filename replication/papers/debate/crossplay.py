"""The real cross-play tournament of notebook 04 (Khan et al. 2024, Fig. 3 and 4, with the 135M model): best-of-N
debaters and consultants from one pool of sampled arguments, every pair of debaters judged in both orders, Elo
per debater and per side fitted as the authors fit it (debate_sim.ratings), and the statistics of the paper's
claims with intervals over draws of the arguments, then questions.

One-round arguments do not depend on the opponent, so a draw samples `best_of` candidates per side and story once
(debate_runs.cached_protocol, in cached pieces of CHUNK stories) and rates each by the judge's P(own answer) in both
orders; the best-of-k debater, k = 1, 2, 4, ..., best_of, keeps the judge-preferred one of the first k candidates
(debate.pick). Debaters of different k share samples, so a draw costs one generation pass, the candidates' rating
and the tournament's verdicts, each distinct pair of arguments judged once. With workers > 1 the pools' pieces
(pools) and the tournaments' judged pieces (plays) are made side by side, each in its own process at one thread."""
import functools
import hashlib
import json
from dataclasses import replace

import numpy as np
import pandas as pd

from replication.core import cache, config, fmt, stats
from replication.lm import arms, models, parallel
from . import debate, debate_runs, debate_sim
from .debate_eval import arm_record, hits

CHUNK = 50  # stories per cached piece of a pool and of its tournament: an interrupted run resumes from the last piece


def ladder(best_of: int) -> list:
    """The debaters' (and consultants') N: 1, 2, 4, ..., best_of, which must be a power of two >= 2."""
    config.check_int("best_of", best_of, minimum=2)
    if best_of & (best_of - 1):
        raise ValueError(f"best_of={best_of} is not allowed: the debaters are best-of-1, 2, 4, ... up to best_of, "
                         "so it must be a power of two >= 2")
    return [2 ** i for i in range(best_of.bit_length())]


def pieces(n: int, chunk: int = CHUNK) -> list:
    """(start, stop) of the consecutive pieces of n stories, `chunk` stories each (the last may be shorter)."""
    config.check_int("chunk", chunk)
    return [(a, min(a + chunk, n)) for a in range(0, n, chunk)]


def piece_seed(seed: int, piece: int) -> int:
    """The sampling seed of one piece of a draw (config.derive_seed): pieces of one draw sample independently."""
    return config.derive_seed(seed, "pool-piece", piece)


def merge(outs: list) -> dict:
    """run_protocol outputs of consecutive pieces as one: items, transcripts and arguments (item indices offset),
    tokens and seconds summed."""
    out, offset = {"items": [], "transcripts": [], "arguments": [], "tokens": 0, "seconds": 0.0}, 0
    for o in outs:
        out["items"] += o["items"]
        out["transcripts"] += o["transcripts"]
        out["arguments"] += [{**a, "item": a["item"] + offset} for a in o["arguments"]]
        out["tokens"] += o["tokens"]
        out["seconds"] += o.get("seconds", 0.0)
        offset += len(o["items"])
    return out


def pool(cache, model, tok, items, kind: str, setting: debate_runs.Setting, seed: int, chunk: int = CHUNK) -> dict:
    """One draw's candidates for every story: a one-round best-of-`setting.best_of` run_protocol
    (debate_runs.cached_protocol, every candidate rated and kept) in pieces of `chunk` stories, piece c argued with
    sampling seed piece_seed(seed, c); merged. Made here, one piece after another (pools with one worker)."""
    return pools(cache, None, model, tok, items, [kind], setting, [seed], 1, chunk)[kind][0]


def piece_in_worker(model_name: str, folder, **job) -> None:
    """One piece of a pool (debate_runs.cached_protocol) on a freshly loaded model into the cache `folder` (a
    worker of pools)."""
    model, tok = models.load_model(model_name)
    debate_runs.cached_protocol(functools.partial(cache.cached, folder), model, tok, **job)


def pools(cached, folder, model, tok, items, kinds, setting: debate_runs.Setting, draws, workers: int = 1,
          chunk: int = CHUNK) -> dict:
    """{kind: [one draw's pool for each draw]}: every kind's candidates in every draw (the arguments' sampling
    seeds), in the pieces `pool` describes. With workers > 1 the pieces not yet in the cache `folder` are first made side by side,
    each in its own process at one thread (parallel.made_then_read); then every piece is read here in order."""
    one_round, spans = replace(setting, rounds=1), pieces(len(items), chunk)
    ids = [(k, s, c) for k in kinds for s in draws for c in range(len(spans))]

    def job(i):
        k, s, c = i
        return dict(items=items[spans[c][0]:spans[c][1]], kind=k, setting=one_round, seed=piece_seed(s, c))

    def pending(i):
        name, key = debate_runs.cached_protocol(lambda n, k, make: (n, k), None, None, **job(i))
        return None if cache.intact(folder, name, key) else dict(model_name=setting.model_name, folder=folder,
                                                                  **job(i))

    got, _ = parallel.made_then_read(ids, pending, piece_in_worker,
                                     lambda i: debate_runs.cached_protocol(cached, model, tok, **job(i)), workers,
                                     "argument pieces")
    by = dict(zip(ids, got))
    return {k: [merge([by[k, s, c] for c in range(len(spans))]) for s in draws] for k in kinds}


def _turns(out: dict) -> dict:
    """(item, side) -> its argument record; a consultancy item's one turn is side 0."""
    return {(a["item"], a["side"] if isinstance(a["side"], int) else 0): a for a in out["arguments"]}


def picks(out: dict, ks) -> np.ndarray:
    """Which candidate each best-of-k arguer keeps (debate.pick): (items, sides, len(ks)) candidate indices."""
    turns = _turns(out)
    sides = 1 + max(s for _, s in turns)
    return np.array([[[debate.pick(turns[q, s], k) for k in ks] for s in range(sides)] for q in range(len(out["items"]))])


def picked_words(out: dict, k: int) -> list:
    """Word counts of the best-of-k arguer's arguments, every turn of the pool."""
    return [a["words_each"][debate.pick(a, k)] for a in out["arguments"]]


def _judged_piece(cache, model, tok, items, trs, setting: debate_runs.Setting) -> dict:
    """The judge's P(correct) in each order for one piece of distinct debates (items[i] with transcript trs[i]),
    through cache(name, key, make), keyed by what the judge reads (the stories' ids and the arguments) and how it
    reads them (`setting`'s model and reading; its batch)."""
    model_name, batch_size, reading = setting.model_name, setting.batch_size, setting.reading
    digest = hashlib.sha256(json.dumps([[it["id"] for it in items], trs]).encode()).hexdigest()[:16]
    key = {"judged": digest, "n": len(items), "model": model_name, "reading": reading, "lead": debate.LEAD,
           "context": debate.ANSWER_CONTEXT["debate"] if reading == "likelihood" else debate.JUDGE_INTRO}
    return cache("crossplay", key, lambda: {k: np.asarray(v).tolist() for k, v in debate.judge(
        model, tok, items, "debate", trs, batch_size, reading).items() if k in ("p_correct_first", "p_correct_second")})


def judge_in_worker(model_name: str, folder, **job) -> None:
    """One judged piece of a tournament (_judged_piece) on a freshly loaded model into the cache `folder` (a
    worker of plays)."""
    model, tok = models.load_model(model_name)
    _judged_piece(functools.partial(cache.cached, folder), model, tok, **job)


def _distinct_pairs(out: dict, idx: np.ndarray, a: int, b: int):
    """The distinct (story, correct-side candidate, distractor-side candidate) of stories a..b-1 over every pair of
    debaters (idx: picks), sorted, with their items and one-round transcripts."""
    turns, m = _turns(out), idx.shape[2]
    pairs = sorted({(q, int(idx[q, 0, x]), int(idx[q, 1, y])) for q in range(a, b) for x in range(m) for y in range(m)})
    items = [out["items"][q] for q, _, _ in pairs]
    trs = [[[turns[q, 0]["options"][i], turns[q, 1]["options"][j]]] for q, i, j in pairs]
    return pairs, items, trs


def plays(cached, folder, model, tok, outs: list, ks, setting: debate_runs.Setting, workers: int = 1,
          chunk: int = CHUNK) -> list:
    """cross_play of each debate pool in `outs` (one per draw). The judge reads each draw's distinct pairs of
    arguments in cached pieces of `chunk` stories; with workers > 1 the pieces not yet in the cache `folder` are
    first judged side by side, each in its own process at one thread (parallel.made_then_read), then every piece
    is read here in order."""
    m, idxs = len(ks), [picks(out, ks) for out in outs]
    spans = [pieces(len(idx), chunk) for idx in idxs]
    ids = [(d, c) for d in range(len(outs)) for c in range(len(spans[d]))]
    found = {i: _distinct_pairs(outs[i[0]], idxs[i[0]], *spans[i[0]][i[1]]) for i in ids}

    def job(i):
        return dict(items=found[i][1], trs=found[i][2], setting=setting)

    def pending(i):
        name, key = _judged_piece(lambda n, k, make: (n, k), None, None, **job(i))
        return None if cache.intact(folder, name, key) else dict(model_name=setting.model_name, folder=folder,
                                                                  **job(i))

    got, _ = parallel.made_then_read(ids, pending, judge_in_worker,
                                     lambda i: _judged_piece(cached, model, tok, **job(i)), workers, "judged pieces")
    by, out = dict(zip(ids, got)), []
    for d, idx in enumerate(idxs):
        first, second, judged = np.empty((len(idx), m, m)), np.empty((len(idx), m, m)), 0
        for c, (a, b) in enumerate(spans[d]):
            pairs, j = found[d, c][0], by[d, c]
            where = {p: n for n, p in enumerate(pairs)}
            for q in range(a, b):
                for x in range(m):
                    for y in range(m):
                        n = where[q, int(idx[q, 0, x]), int(idx[q, 1, y])]
                        first[q, x, y], second[q, x, y] = j["p_correct_first"][n], j["p_correct_second"][n]
            judged += len(pairs)
        out.append({"ks": list(ks), "first": first, "second": second, "pairs_judged": judged})
    return out


def cross_play(cache, model, tok, out: dict, ks, setting: debate_runs.Setting, chunk: int = CHUNK) -> dict:
    """Every pair of debaters on every story of a debate pool: debater a (best-of-ks[a]) argues the correct
    answer, debater b the distractor, self-play included (a = b). The judge reads each distinct pair of arguments
    once, in both orders (debate.judge: `setting`'s model, batch and reading), in cached pieces of `chunk`
    stories keyed by what it reads. Returns
    P(correct) with the correct answer's debater first and second, arrays (stories, a, b), and the pairs judged.
    Judged here, one piece after another (plays with one worker)."""
    return plays(cache, None, model, tok, [out], ks, setting, 1, chunk)[0]


def consultants(out: dict, ks) -> dict:
    """Each best-of-k consultant's verdicts on a consultancy pool, arrays (consultancy items, len(ks)) in each
    order: a one-round consultancy is judged with the prompt its candidates were rated with, so the kept
    candidate's P(correct) per order (its `orders`) is the verdict, with no judging beyond the rating."""
    idx, turns = picks(out, ks), _turns(out)
    orders = np.array([[turns[q, 0]["orders"][idx[q, 0, x]] for x in range(len(ks))] for q in range(len(idx))])
    return {"ks": list(ks), "first": orders[..., 0], "second": orders[..., 1]}


def verdicts(first, second) -> dict:
    """A debate.judge() output from P(correct) in each order."""
    first, second = np.asarray(first, float), np.asarray(second, float)
    return {"p_correct_first": first, "p_correct_second": second, "p_correct": (first + second) / 2,
            "p_first": np.r_[first, 1 - second]}


def cell(play: dict, a: int, b: int) -> dict:
    """One tournament cell as a judge() output: debater a (index in ks) for the correct answer, b for the distractor."""
    return verdicts(play["first"][:, a, b], play["second"][:, a, b])


def consultant(cons: dict, a: int) -> dict:
    """One consultant's verdicts as a judge() output, both consultants of a question in a row (correct first)."""
    return verdicts(cons["first"][:, a], cons["second"][:, a])


# --- the statistics of the paper's claims --------------------------------------------------------------------
def slope(x, y) -> float:
    """Least-squares slope of y on x; nan when x does not vary."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    var = np.var(x)
    return float(np.mean((x - x.mean()) * (y - y.mean())) / var) if var > 0 else float("nan")


def debate_hits(play: dict) -> np.ndarray:
    """Per story and cell: 1 when the order-averaged P(correct) is above 0.5 (debate_eval.hits), (stories, a, b)."""
    return hits((play["first"] + play["second"]) / 2)


def consultancy_hits(cons: dict) -> np.ndarray:
    """Per question, consultant (correct, incorrect) and k: the judge's verdict is right, (questions, 2, len(ks))."""
    h = hits((cons["first"] + cons["second"]) / 2)
    return h.reshape(-1, 2, h.shape[1])


def elo_stats(h) -> dict:
    """The tournament from per-story hits (stories, a correct, b incorrect): win rates w[a, b] (means over stories),
    a round robin of every pair without self-play, each pair in both assignments (debate_sim.round_robin), the
    authors' Elo fits (debate_sim.ratings: aggregate, correct side E^C, incorrect side E^I), self-play accuracy
    (the diagonal), and the claims' statistics: the mean of E^C - E^I, the slope of E^C - E^I on aggregate Elo,
    the slope of self-play accuracy on aggregate Elo per 100 points."""
    w = np.asarray(h, float).mean(0)
    m = len(w)
    r = debate_sim.ratings(debate_sim.round_robin(m, lambda i, j: (w[i, j], 1 - w[j, i])), m)
    gap, acc = r["correct"] - r["incorrect"], np.diag(w)
    return {"win_rates": w, **r, "self_play": acc, "gap_mean": float(gap.mean()),
            "gap_slope": slope(r["aggregate"], gap), "accuracy_slope": 100 * slope(r["aggregate"], acc)}


def consultancy_stats(h) -> dict:
    """Per consultant from (questions, 2, k) hits: accuracy (mean over the correct and the incorrect consultant)
    and win rate (the share of judgments that side with the consultant), and the slope of accuracy on win rate."""
    h = np.asarray(h, float)
    acc_correct, acc_incorrect = h[:, 0].mean(0), h[:, 1].mean(0)  # judge right with a correct / incorrect consultant
    accuracy, win = (acc_correct + acc_incorrect) / 2, (acc_correct + 1 - acc_incorrect) / 2
    return {"accuracy": accuracy, "win_rate": win, "accuracy_slope": slope(win, accuracy)}


DIGITS = {"gap_mean": 0, "gap_slope": 2, "accuracy_slope": 3, "consultancy_slope": 2}  # as the claims print them
CLAIM_STATS = {"gap_mean": elo_stats, "gap_slope": elo_stats, "accuracy_slope": elo_stats,
               "consultancy_slope": lambda h: {"consultancy_slope": consultancy_stats(h)["accuracy_slope"]}}


def over_draws(names, per_draw: list, seed: int, n_boot: int = 2000, records: dict = None) -> dict:
    """Claim statistics (CLAIM_STATS) over draws of the arguments, then questions: name -> its mean over draws with
    the interval of stats.nested_bootstrap (a t interval between draws joined with a bootstrap of each draw's
    questions, whole, the tournament refitted on each resample; every statistic on the same resamples, each refit
    made once), each draw's value and run.claim's basis (unit 'draw'; a failed health check of `records`' arms
    beside it). per_draw: one hits array per draw, questions first."""
    memo = {}

    def values(h):
        key = (h.shape, h.tobytes())
        if key not in memo:
            memo[key] = {name: CLAIM_STATS[name](h)[name] for name in names}
        return memo[key]

    health = arms.failed_text(list(records), records, "draw") if records else None
    n = f"{len(per_draw)} draw{'s' if len(per_draw) > 1 else ''} x {len(per_draw[0])} questions"
    out = {}
    for name in names:
        interval = stats.nested_bootstrap(lambda h: values(h)[name], [[h] for h in per_draw],
                                          [np.arange(len(h)) for h in per_draw], n_boot=n_boot,
                                          seed=config.derive_seed(seed, "crossplay"))
        est, lo, hi = interval
        each = [float(values(h)[name]) for h in per_draw]
        digits = DIGITS[name]
        text = fmt.diff((est, lo, hi), digits) + (f" (draws {', '.join(f'{x:+.{digits}f}' for x in each)})" if len(each) > 1 else "")
        basis = {"interval": (lo, hi), "estimate": est, "seed_differences": each, "health": health, "unit": "draw",
                 **({} if getattr(interval, "question_variance", None) is None
                    else {"question_variance": interval.question_variance})}
        if not np.all(np.isfinite([est, lo, hi, *each])):  # e.g. a slope on ratings or win rates that did not vary
            basis = {"not_tested": f"{name} is undefined in a draw or in every resample: the debaters' ratings or win rates did not vary"}
        out[name] = {"estimate": est, "ci95": [lo, hi], "per_draw": each, "text": text, "basis": basis, "n": n}
    return out


def debater_table(plays: list, conss, ks) -> pd.DataFrame:
    """One row per draw and N: aggregate, correct-side and incorrect-side Elo, self-play judge accuracy, and the
    best-of-N consultant's win rate and consultancy accuracy (without them when conss is None)."""
    rows = []
    for d, play in enumerate(plays):
        e = elo_stats(debate_hits(play))
        c = None if conss is None else consultancy_stats(consultancy_hits(conss[d]))
        rows += [{"draw": d, "N": k, "aggregate Elo": e["aggregate"][x], "E^C": e["correct"][x], "E^I": e["incorrect"][x],
                  "E^C - E^I": e["correct"][x] - e["incorrect"][x], "self-play accuracy": e["self_play"][x],
                  **({} if c is None else {"consultant win rate": c["win_rate"][x],
                                           "consultancy accuracy": c["accuracy"][x]})}
                 for x, k in enumerate(ks)]
    return pd.DataFrame(rows)


def ladder_records(plays: list, pools: list, ks, draws: list) -> dict:
    """'debate-best-of-k (self-play)' -> one arm record per draw (debate_eval.arm_record): the self-play verdicts
    of every debater of the tournament, healthy when every verdict is a probability and every argument written."""
    return {f"debate-best-of-{k} (self-play)": [arm_record(f"debate-best-of-{k}", cell(play, x, x)["p_correct"],
                                                           words=picked_words(out, k), draw=s)
                                                for play, out, s in zip(plays, pools, draws)]
            for x, k in enumerate(ks)}
