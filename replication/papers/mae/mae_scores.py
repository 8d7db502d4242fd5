"""Multi-Agent Evolve's judge scores: reading `<score>X</score>` replies as the authors' code does.

Source: ulab-uiuc/Multi-agent-evolve, `absolute_zero_reasoner/rewards/reward_managers.py`, at the release commit
cf2ea62 (2025-11-10) unless said otherwise. Three rules, one per code path:

- `self_judge` (MAE's setting: the trained model judges, `judge_with_actor: true` in
  `configs/azr_ppo_trainer_general.yaml`): the score is read from the tags only (`extract_score_from_tags`) and
  normalised clip((X - 1) / 9, 0, 1); a reply without one gives no score: it is left out of a question's mean
  and a question (or answer) with no score at all gets the neutral 0.5.
- `external_judge` (an API judge, `_generate_llm_response`): a tag value in [1, 10] is normalised as above, any
  other tag value is taken as already normalised and clipped to [0, 1]; without a tag, the first integer 1-10 in
  the reply (the code collects them all and its callers take the first); with no such number, 0.0.
- `last_number` (the later commit d71c00b, 2026-01-21, for both judges): without a tag, the last number in the
  reply (a fraction read as its value), then normalised as `self_judge`; 0.5 when there is no number.

The tag is read as `extract_score_from_tags` does: the first tag that holds a number; in it a fraction a/b is
read as the fraction itself (9/10 -> 0.9, which a 1-10 normalisation clips to 0), then a float, then an
integer; digits only, so a minus sign is not read; a zero denominator makes that tag give nothing.
"""
import re

import numpy as np

from replication.core import config

SCORE_RULES = ("self_judge", "external_judge", "last_number")
NEUTRAL = 0.5  # the authors' score for a judgment that gave none

_SCORE = re.compile(r"<score>(.*?)</score>", re.IGNORECASE | re.DOTALL)
_FRACTION = re.compile(r"\b(\d+)/(\d+)\b")
_FLOAT = re.compile(r"\b(\d+\.\d+)\b")
_INT = re.compile(r"\b(\d+)\b")
_ANY_NUMBER = re.compile(r"\b\d+/\d+\b|\b\d+\.\d+\b|\b\d+\b")  # d71c00b's fallback, in this order


def tag_value(text: str):
    """The number in the first score tag that holds one (fraction as its value, then float, then integer), or None."""
    for content in _SCORE.findall(text or ""):
        fraction = _FRACTION.search(content)
        if fraction:
            if int(fraction.group(2)):
                return int(fraction.group(1)) / int(fraction.group(2))
            continue  # a zero denominator: this tag gives nothing
        number = _FLOAT.search(content) or _INT.search(content)
        if number:
            return float(number.group(1))
    return None


def fallback_value(text: str, rule: str):
    """The number a rule reads from a reply whose tags give none: None for `self_judge`."""
    if rule == "external_judge":
        in_range = [int(n) for n in re.findall(r"\d+", text or "") if 1 <= int(n) <= 10]
        return float(in_range[0]) if in_range else None
    if rule == "last_number":
        found = _ANY_NUMBER.findall(text or "")
        if found:
            a, _, b = found[-1].partition("/")
            return (int(a) / int(b) if int(b) else None) if b else float(a)
    return None


def read_score(text: str, rule: str = "self_judge"):
    """(raw score, source) of one judge reply under `rule`: source 'tag', 'fallback', or 'none' (raw None)."""
    config.check_choice("rule", rule, SCORE_RULES)
    raw = tag_value(text)
    if raw is not None:
        return raw, "tag"
    raw = fallback_value(text, rule)
    return (raw, "fallback") if raw is not None else (None, "none")


def normalise(raw, rule: str = "self_judge"):
    """A raw score in [0, 1]: clip((s - 1) / 9, 0, 1), but an external judge's value outside [1, 10] is clipped as it
    is; nothing read (None): 0.0 for an external judge, else None (no score; see mean_score)."""
    config.check_choice("rule", rule, SCORE_RULES)
    if raw is None:
        return 0.0 if rule == "external_judge" else None
    if rule == "external_judge" and not 1 <= raw <= 10:
        return float(np.clip(raw, 0.0, 1.0))
    return float(np.clip((raw - 1) / 9, 0.0, 1.0))


def score(text: str, rule: str = "self_judge"):
    """One judgment's normalised score under `rule`, or None when it gave none."""
    return normalise(read_score(text, rule)[0], rule)


def mean_score(scores) -> float:
    """The mean of the judgments that gave a score (None skipped); the neutral 0.5 when none did."""
    given = [s for s in scores if s is not None]
    return float(np.mean(given)) if given else NEUTRAL


def parse_score(text: str, rule: str = "self_judge") -> float:
    """One judgment's score in [0, 1] as a reward uses it (0.5 when it gave none)."""
    return mean_score([score(text, rule)])
