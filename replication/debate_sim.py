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
from scipy.optimize import minimize

from . import config

START = 1500.0


def elo_win_prob(r1, r2):
    """P(player 1 beats player 2) = 1 / (1 + 10^((r2 - r1) / 400))."""
    return 1.0 / (1.0 + 10.0 ** ((np.asarray(r2, float) - np.asarray(r1, float)) / 400.0))


def _nelder_mead(loss, x0, restarts: int = 4):
    """Nelder-Mead from x0, restarted from its own optimum until it stops improving."""
    x, best = np.asarray(x0, float), np.inf
    opts = {"maxiter": 400 * len(x0), "maxfev": 400 * len(x0), "xatol": 1e-3, "fatol": 1e-12, "adaptive": True}
    for _ in range(restarts):
        res = minimize(loss, x, method="Nelder-Mead", options=opts)
        x = res.x
        if best - res.fun < 1e-12:
            break
        best = res.fun
    return x


def fit_elo(i, j, win_rate, n: int):
    """Aggregate Elo as the authors fit it: minimise sum (elo_win_prob(r_i, r_j) - w_ij)^2 by Nelder-Mead from
    1500 for every player; the free offset is then set so the mean rating is 1500."""
    i, j, w = np.asarray(i), np.asarray(j), np.asarray(win_rate, float)
    if not (len(i) == len(j) == len(w)) or len(w) == 0:
        raise ValueError("i, j and win_rate must be non-empty and the same length")
    r = _nelder_mead(lambda r: np.sum((elo_win_prob(r[i], r[j]) - w) ** 2), np.full(n, START))
    return r - r.mean() + START


def fit_elo_sides(correct, incorrect, win_rate_correct, n: int):
    """Correct- and incorrect-side Elo: w = elo_win_prob(E^C[correct], E^I[incorrect]) for each match in which
    `correct` argued the right answer and won a share `win_rate_correct` of judgments. Returns (E^C, E^I),
    offset so that the mean of all 2n ratings is 1500."""
    c, k, w = np.asarray(correct), np.asarray(incorrect), np.asarray(win_rate_correct, float)
    r = _nelder_mead(lambda r: np.sum((elo_win_prob(r[c], r[n + k]) - w) ** 2), np.full(2 * n, START))
    r = r - r.mean() + START
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
    consultancy. Returns per-debater arrays and the statistics that test the paper's findings."""
    from scipy import stats

    config.check_int("n_debaters", n_debaters, minimum=3)
    rng = np.random.default_rng(seed)
    w = World(seed=seed, **world)
    skills = np.sort(rng.uniform(*skill_range, n_debaters))
    swiss, _, byes = swiss_tournament(n_debaters, w.player(skills, rng), num_rounds)
    rr = round_robin(n_debaters, w.player(skills, rng))
    elo = ratings(swiss, n_debaters)
    elo_rr = fit_elo([m["i"] for m in rr], [m["j"] for m in rr], [m["w"] for m in rr], n_debaters)
    self_play = np.array([w.self_play_accuracy(s, rng) for s in skills])
    cons = [w.consultancy_accuracy(s, rng) for s in skills]
    cons_acc, cons_win = np.array([c["accuracy"] for c in cons]), np.array([c["win_rate"] for c in cons])
    gap = elo["correct"] - elo["incorrect"]
    return {"skills": skills, "elo": elo, "elo_rr": elo_rr, "self_play": self_play, "consultancy": cons_acc,
            "consultant_win_rate": cons_win, "swiss_matches": len(swiss), "round_robin_matches": len(rr),
            "byes": len(byes),
            "stats": {"elo_accuracy_corr": float(stats.pearsonr(elo["aggregate"], self_play)[0]),
                      "correct_minus_incorrect_elo": float(gap.mean()),
                      "gap_vs_aggregate_slope": float(np.polyfit(elo["aggregate"], gap, 1)[0]),
                      "consultancy_trend": float(stats.spearmanr(cons_win, cons_acc)[0]),
                      "consultancy_slope": float(np.polyfit(cons_win, cons_acc, 1)[0]),
                      "debate_minus_consultancy": float((self_play - cons_acc).mean()),
                      "swiss_vs_roundrobin_kendall_tau": float(stats.kendalltau(elo["aggregate"], elo_rr)[0]),
                      "swiss_vs_true_kendall_tau": float(stats.kendalltau(elo["aggregate"], skills)[0]),
                      "roundrobin_vs_true_kendall_tau": float(stats.kendalltau(elo_rr, skills)[0]),
                      "elo_spread": float(elo["aggregate"].std())}}
