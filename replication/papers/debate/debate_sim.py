"""Cross-play tournaments for debate (Khan et al. 2024): Swiss pairing, Elo fitted to win rates, and a
simulation of debaters and judges that tests the paper's mechanisms at scale.

Simulation (documented in notebook 04). Question q holds evidence e_C(q) for its correct answer and
e_I(q) = e_C(q) - truth_advantage + noise for the best distractor (both clipped to [0, 1]). Debater i has a
persuasiveness s_i; its argument for side x has strength A = s_i * (e_x(q) + rhetoric) + N(0, arg_noise):
the evidence term rewards telling the truth, the rhetoric term persuades whatever the side. The judge reads
A with its own error N(0, judge_noise) and, after averaging both presentation orders, picks the stronger
side in debate; in consultancy it accepts the consultant's answer when A + error > 0.
"""
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from replication.core import config, stats
from replication.lm import elo

START = 1500.0


def _squared_error_fit(a, b, w, n: int) -> np.ndarray:
    """Ratings r (n players) minimising sum_k (expected_score(r[a_k], r[b_k]) - w_k)^2, the authors' unweighted
    squared error, from 1500 for every player; offset so that the mean rating is 1500. Solved by least squares
    (trust-region, analytic Jacobian): the authors' Nelder-Mead reaches the same optimum (a test checks it) about
    ten to a hundred times more slowly, too slowly for a bootstrap that refits the tournament thousands of times."""
    a, b, w = np.asarray(a), np.asarray(b), np.asarray(w, float)
    if not (len(a) == len(b) == len(w)) or len(w) == 0:
        raise ValueError("the players and win rates must be non-empty and the same length")
    rows, slope = np.arange(len(w)), math.log(10) / 400

    def jacobian(r):
        e = elo.expected_score(r[a], r[b])
        J = np.zeros((len(w), n))
        np.add.at(J, (rows, a), slope * e * (1 - e))
        np.add.at(J, (rows, b), -slope * e * (1 - e))
        return J

    r = least_squares(lambda r: elo.expected_score(r[a], r[b]) - w, np.full(n, START), jac=jacobian, method="trf",
                      xtol=1e-10, ftol=1e-12, gtol=1e-12).x
    return r - r.mean() + START


def fit_elo(i, j, win_rate, n: int):
    """Aggregate Elo as the authors fit it: minimise sum (expected_score(r_i, r_j) - w_ij)^2 (replication.lm.elo)
    from 1500 for every player; the free offset is then set so the mean rating is 1500."""
    return _squared_error_fit(i, j, win_rate, n)


def fit_elo_sides(correct, incorrect, win_rate_correct, n: int):
    """Correct- and incorrect-side Elo: w = expected_score(E^C[correct], E^I[incorrect]) for each match in which
    `correct` argued the right answer and won a share `win_rate_correct` of judgments. Returns (E^C, E^I),
    offset so that the mean of all 2n ratings is 1500."""
    r = _squared_error_fit(np.asarray(correct), n + np.asarray(incorrect), win_rate_correct, 2 * n)
    return r[:n], r[n:]


def swiss_rounds(n: int) -> int:
    """The authors' number of Swiss rounds: ceil(log2 n), capped at 3."""
    config.check_int("n", n, minimum=2)
    return min(math.ceil(math.log2(n)), 3)


def swiss_pairing(scores, played, had_bye=()):
    """One Swiss round: players sorted by score (stable, so ties keep their seed order), the lowest-ranked
    player without a bye sits out when n is odd, the rest are paired greedily top-down with the nearest
    opponent not met before (backtracking when the greedy choice leaves no legal pairing). Returns
    (pairs, bye). `played` is a set of frozensets of players who have met."""
    order = sorted(range(len(scores)), key=lambda p: -scores[p])
    bye = None
    if len(order) % 2:
        bye = next((p for p in reversed(order) if p not in had_bye), order[-1])
        order.remove(bye)

    def pair(rest):
        if not rest:
            return []
        first = rest[0]
        for k in range(1, len(rest)):
            if frozenset((first, rest[k])) not in played:
                tail = pair(rest[1:k] + rest[k + 1:])
                if tail is not None:
                    return [(first, rest[k])] + tail
        return None

    pairs = pair(order)
    if pairs is None:  # every legal pairing needs a rematch: fall back to adjacent pairs
        pairs = [(order[k], order[k + 1]) for k in range(0, len(order), 2)]
    return pairs, bye


def swiss_tournament(n: int, play, num_rounds: int = None):
    """Swiss tournament among n players. play(i, j) -> (w1, w2): i's win rate when i argues the correct answer
    and when i argues the incorrect one (both assignments of every pairing). A match is won by the player
    whose assignment-averaged win rate is above 0.5 (ties score 0.5 each); a bye counts as a win.
    Returns (matches, scores, byes): matches as dicts with i, j, round, w1, w2 and w = (w1 + w2) / 2."""
    num_rounds = swiss_rounds(n) if num_rounds is None else num_rounds
    config.check_int("num_rounds", num_rounds)
    scores, played, byes, matches = np.zeros(n), set(), [], []
    for rnd in range(num_rounds):
        pairs, bye = swiss_pairing(scores, played, byes)
        if bye is not None:
            byes.append(bye)
            scores[bye] += 1
        for i, j in pairs:
            w1, w2 = play(i, j)
            w = (w1 + w2) / 2
            matches.append({"round": rnd, "i": i, "j": j, "w1": w1, "w2": w2, "w": w})
            scores[i] += 1.0 if w > 0.5 else 0.5 if w == 0.5 else 0.0
            scores[j] += 1.0 if w < 0.5 else 0.5 if w == 0.5 else 0.0
            played.add(frozenset((i, j)))
    return matches, scores, byes


def round_robin(n: int, play):
    """Every pair once (both assignments): n (n - 1) / 2 matches."""
    out = []
    for i in range(n):
        for j in range(i + 1, n):
            w1, w2 = play(i, j)
            out.append({"round": 0, "i": i, "j": j, "w1": w1, "w2": w2, "w": (w1 + w2) / 2})
    return out


def ratings(matches, n: int) -> dict:
    """Aggregate, correct-side and incorrect-side Elo from a list of matches."""
    i = np.array([m["i"] for m in matches])
    j = np.array([m["j"] for m in matches])
    w1, w2 = np.array([m["w1"] for m in matches]), np.array([m["w2"] for m in matches])
    agg = fit_elo(i, j, (w1 + w2) / 2, n)
    # i correct vs j incorrect: i wins w1; j correct vs i incorrect: j wins 1 - w2
    ec, ei = fit_elo_sides(np.r_[i, j], np.r_[j, i], np.r_[w1, 1 - w2], n)
    return {"aggregate": agg, "correct": ec, "incorrect": ei}


@dataclass
class World:
    """Parameters of the simulated debate world (see the module docstring)."""

    n_questions: int = 200
    truth_advantage: float = 0.3
    evidence_noise: float = 0.15
    rhetoric: float = 0.5
    arg_noise: float = 0.3
    judge_noise: float = 0.5
    seed: int = 0

    def __post_init__(self):
        config.check_int("n_questions", self.n_questions)
        for name in ("truth_advantage", "evidence_noise", "rhetoric", "arg_noise", "judge_noise"):
            config.check_range(name, getattr(self, name), 0.0, 10.0)
        rng = np.random.default_rng(self.seed)
        self.e_correct = np.clip(rng.normal(0.6, 0.15, self.n_questions), 0, 1)
        self.e_incorrect = np.clip(self.e_correct - self.truth_advantage
                                   + rng.normal(0, self.evidence_noise, self.n_questions), 0, 1)

    def strength(self, s: float, correct: bool, rng) -> np.ndarray:
        """Argument strength of a debater with persuasiveness s for every question, on one side."""
        e = self.e_correct if correct else self.e_incorrect
        return s * (e + self.rhetoric) + rng.normal(0, self.arg_noise, self.n_questions)

    def debate(self, s_correct: float, s_incorrect: float, rng) -> np.ndarray:
        """1 where the judge picks the correct answer, per question (its reading error decides close calls)."""
        gap = self.strength(s_correct, True, rng) - self.strength(s_incorrect, False, rng)
        return (gap + rng.normal(0, self.judge_noise, self.n_questions) > 0).astype(float)

    def consultancy(self, s: float, correct: bool, rng) -> np.ndarray:
        """1 where the judge accepts the consultant's answer, per question."""
        a = self.strength(s, correct, rng)
        return (a + rng.normal(0, self.judge_noise, self.n_questions) > 0).astype(float)

    def player(self, skills, rng):
        """play(i, j) for the tournaments: i's win rate arguing correct, then arguing incorrect."""
        def play(i, j):
            return self.debate(skills[i], skills[j], rng).mean(), 1 - self.debate(skills[j], skills[i], rng).mean()
        return play

    def self_play_accuracy(self, s: float, rng) -> float:
        """Judge accuracy in self-play (D, D, J)."""
        return float(self.debate(s, s, rng).mean())

    def consultancy_accuracy(self, s: float, rng) -> dict:
        """Accuracy averaged over a correct and an incorrect consultant, and the consultant's win rate."""
        acc_c = self.consultancy(s, True, rng).mean()
        acc_i = 1 - self.consultancy(s, False, rng).mean()
        return {"accuracy": float((acc_c + acc_i) / 2), "win_rate": float((acc_c + 1 - acc_i) / 2)}


def study(n_debaters: int = 20, num_rounds: int = 4, skill_range=(0.2, 3.0), seed: int = 0, **world) -> dict:
    """One simulated cross-play study: debaters with persuasiveness drawn from skill_range play a Swiss
    tournament and a round robin; Elo is fitted to both; every debater also plays self-play debate and
    consultancy. The evidence and the play draw on seeds derived from `seed` (config.derive_seed), so a world
    with other parameters but the same seed has the same debaters and questions. Returns per-debater arrays
    and the statistics that test the paper's findings."""
    from scipy import stats as sps

    config.check_int("n_debaters", n_debaters, minimum=3)
    rng = np.random.default_rng(config.derive_seed(seed, "play"))
    w = World(seed=config.derive_seed(seed, "evidence"), **world)
    skills = np.sort(rng.uniform(*skill_range, n_debaters))
    swiss, _, byes = swiss_tournament(n_debaters, w.player(skills, rng), num_rounds)
    rr = round_robin(n_debaters, w.player(skills, rng))
    elos = ratings(swiss, n_debaters)
    elo_rr = fit_elo([m["i"] for m in rr], [m["j"] for m in rr], [m["w"] for m in rr], n_debaters)
    self_play = np.array([w.self_play_accuracy(s, rng) for s in skills])
    cons = [w.consultancy_accuracy(s, rng) for s in skills]
    cons_acc, cons_win = np.array([c["accuracy"] for c in cons]), np.array([c["win_rate"] for c in cons])
    gap = elos["correct"] - elos["incorrect"]
    return {"skills": skills, "elo": elos, "elo_rr": elo_rr, "self_play": self_play, "consultancy": cons_acc,
            "consultant_win_rate": cons_win, "swiss_matches": len(swiss), "round_robin_matches": len(rr),
            "byes": len(byes),
            "stats": {"elo_accuracy_corr": float(sps.pearsonr(elos["aggregate"], self_play)[0]),
                      "correct_minus_incorrect_elo": float(gap.mean()),
                      "gap_vs_aggregate_slope": float(np.polyfit(elos["aggregate"], gap, 1)[0]),
                      "consultancy_trend": float(sps.spearmanr(cons_win, cons_acc)[0]),
                      "consultancy_slope": float(np.polyfit(cons_win, cons_acc, 1)[0]),
                      "debate_minus_consultancy": float((self_play - cons_acc).mean()),
                      "swiss_vs_roundrobin_kendall_tau": float(sps.kendalltau(elos["aggregate"], elo_rr)[0]),
                      "swiss_vs_true_kendall_tau": float(sps.kendalltau(elos["aggregate"], skills)[0]),
                      "roundrobin_vs_true_kendall_tau": float(sps.kendalltau(elo_rr, skills)[0]),
                      "elo_spread": float(elos["aggregate"].std())}}


# --- many worlds: the notebook's tables and the intervals of its claims ----------------------------------------
def worlds(n_worlds: int, seed: int, n_debaters: int, num_rounds: int, **world) -> list:
    """study() in n_worlds worlds; world k's seed is config.derive_seed(seed, "world", k), so calls with
    other world parameters (the control, other judges) meet the same debaters and questions, world by world."""
    config.check_int("n_worlds", n_worlds)
    return [study(n_debaters, num_rounds, seed=config.derive_seed(seed, "world", k), **world) for k in range(n_worlds)]


def per_world(studies, name: str) -> np.ndarray:
    """One statistic of study()['stats'], one value per world."""
    return np.array([s["stats"][name] for s in studies], float)


def summary(studies, nulls) -> pd.DataFrame:
    """Mean and SD over worlds of every statistic, with truth advantage and in the control without it."""
    def agg(ss):
        return pd.DataFrame([s["stats"] for s in ss]).agg(["mean", "std"]).T

    return agg(studies).add_suffix(" (truth advantage)").join(agg(nulls).add_suffix(" (no truth advantage)"))


def fmt_world(table: pd.DataFrame, name: str, digits: int = 2) -> str:
    """'mean ± SD over worlds (control: mean)' of one statistic from summary()."""
    m, sd, c = (table.loc[name, col] for col in ("mean (truth advantage)", "std (truth advantage)",
                                                 "mean (no truth advantage)"))
    return f"{m:.{digits}f} ± {sd:.{digits}f} (control: {c:.{digits}f})"


def world_difference(studies, nulls, name: str, seed: int, n_boot: int = 2000):
    """(mean difference, low, high) of a statistic, truth-advantage world minus its control, paired world by
    world (stats.paired_bootstrap over the simulated worlds)."""
    return stats.paired_bootstrap(per_world(studies, name), per_world(nulls, name), n_boot=n_boot,
                                  seed=config.derive_seed(seed, "world-difference", name))


def persuasiveness_curve(grid, seed: int, **world) -> pd.DataFrame:
    """Self-play debate accuracy, consultancy accuracy and consultant win rate for one debater per
    persuasiveness s in grid (one world, seeds derived from `seed`)."""
    w = World(seed=config.derive_seed(seed, "curve-evidence"), **world)
    rng = np.random.default_rng(config.derive_seed(seed, "curve-play"))
    return pd.DataFrame([{"s": s, "debate": w.self_play_accuracy(s, rng), **w.consultancy_accuracy(s, rng)}
                         for s in grid])


def judge_sweep(judge_noises, n_worlds: int, seed: int, n_debaters: int, num_rounds: int, **world) -> pd.DataFrame:
    """The same worlds (see worlds()) judged by judges of each noise: one row per judge noise and world with
    the mean self-play accuracy and the world's statistics."""
    rows = []
    for jn in judge_noises:
        for k, res in enumerate(worlds(n_worlds, seed, n_debaters, num_rounds, **{**world, "judge_noise": jn})):
            rows.append({"judge_noise": jn, "world": k, "mean self-play accuracy": float(res["self_play"].mean()),
                         **res["stats"]})
    return pd.DataFrame(rows)


JUDGE_COLUMNS = ["elo_spread", "mean self-play accuracy", "elo_accuracy_corr", "swiss_vs_roundrobin_kendall_tau"]


def judge_table(sweep: pd.DataFrame) -> pd.DataFrame:
    """Means over worlds per judge noise."""
    return sweep.groupby("judge_noise")[JUDGE_COLUMNS].mean()


def judge_difference(sweep: pd.DataFrame, column: str, seed: int, n_boot: int = 2000):
    """(difference, low, high): the strongest judge (lowest noise) minus the weakest (highest noise) in one
    column, paired world by world (stats.paired_bootstrap)."""
    lo, hi = sweep["judge_noise"].min(), sweep["judge_noise"].max()
    strong = sweep[sweep["judge_noise"] == lo].sort_values("world")[column].to_numpy(float)
    weak = sweep[sweep["judge_noise"] == hi].sort_values("world")[column].to_numpy(float)
    return stats.paired_bootstrap(strong, weak, n_boot=n_boot,
                                  seed=config.derive_seed(seed, "judge-difference", column))


def swiss_check(studies, tau_bar: float = 0.8, seed: int = 0) -> dict:
    """The tournament method's stated condition: in every world the Swiss tournament uses fewer matches than a
    round robin, and its Elo ranks the debaters like the round robin's (mean Kendall tau over worlds >= tau_bar).
    Also the mean tau with a bootstrap interval over worlds (stats.bootstrap)."""
    tau = per_world(studies, "swiss_vs_roundrobin_kendall_tau")
    fewer = all(s["swiss_matches"] < s["round_robin_matches"] for s in studies)
    est, lo, hi = stats.bootstrap(np.mean, tau, seed=config.derive_seed(seed, "swiss-tau"))
    return {"holds": bool(fewer and est >= tau_bar), "tau": est, "ci95": [lo, hi], "tau_bar": tau_bar,
            "swiss_matches": studies[0]["swiss_matches"], "round_robin_matches": studies[0]["round_robin_matches"]}
