"""Notebook 04's parameters (types, ranges, cross-field rules; the defaults live in its parameters cell)
and the story levels and answer readings it chooses among."""
from dataclasses import dataclass
from typing import Optional

from replication.core.params import LM, notebook, p, temperature_rule

LEVELS = ("absent", "present")  # the distractor absent from the story, or present in a misleading role
READINGS = ("likelihood", "letter")  # the judge's answer read as each answer's likelihood, or P(A) vs P(B)


def check_strengths(ks) -> list:
    """Section (d)'s debaters, best-of-k for each k: integers from 1, increasing, at least two (best-of-1 and a
    stronger debater)."""
    ks = list(ks) if isinstance(ks, (list, tuple)) else [ks]
    if len(ks) < 2 or ks[0] != 1 or any(not isinstance(k, int) or k < 1 for k in ks) or ks != sorted(set(ks)):
        raise ValueError(f"hard_strengths={ks!r} is not allowed; give increasing integers from 1, at least two "
                         "(best-of-1 and a stronger debater), e.g. [1, 2, 4, 6, 8]")
    return ks


@notebook("04_debate_judge_accuracy")
@dataclass
class Debate(LM):
    level: str = p(choices=LEVELS)
    reading: str = p(choices=READINGS)
    check_questions: int = p()
    check_levels: list = p(each={"choices": LEVELS})
    check_readings: list = p(each={"choices": READINGS})
    n_questions: int = p()
    rounds: int = p()
    word_limit: int = p()
    best_of: int = p()
    temperature: float = temperature_rule()
    seeds: int = p()
    batch_size: int = p()
    verdict_checks: int = p()
    n_debaters: int = p()
    tournament_rounds: int = p()
    sim_questions: int = p()
    n_worlds: int = p()
    truth_advantage: float = p(low=0.0, high=10.0)
    rhetoric: float = p(low=0.0, high=10.0)
    arg_noise: float = p(low=0.0, high=10.0)
    judge_noise: float = p(low=0.0, high=10.0)
    judge_noises: list = p(each={"low": 0.0, "high": 10.0})
    hard_level: Optional[str] = p(choices=LEVELS)   # section (d); None: no section
    hard_strengths: list = p()
    workers: int = p()

    def check(self):
        if self.rounds != 1:
            raise ValueError(f"rounds={self.rounds} is not allowed: the debaters of the tournament are best-of-k picks "
                             "from one pool of one-round arguments (later rounds would depend on the kept arguments)")
        if self.best_of < 2 or self.best_of & (self.best_of - 1):
            raise ValueError(f"best_of={self.best_of} is not allowed: the debaters are best-of-1, 2, 4, ... up to "
                             "best_of, so it must be a power of two >= 2")
        check_strengths(self.hard_strengths)
        if self.hard_level is not None and self.hard_level == self.level:
            raise ValueError(f"hard_level={self.hard_level!r} is not allowed; name a level other than level="
                             f"{self.level!r}, or None")
