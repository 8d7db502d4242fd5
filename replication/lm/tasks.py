"""Seeded arithmetic word problems with difficulty knobs, answer extraction and an exact verifier.

Answer format: the reply ends with "The answer is N." (the 135M model follows this phrase far more
often than tags). ``extract_answer`` reads the last ``<answer>N</answer>`` tag if there is one, else the
last "answer is N" / "Answer: N" phrase; unless ``strict``, it falls back to the last number in the text.
"""
import random
import re
from dataclasses import asdict, dataclass

from replication.core import config, phases

OPS = ("+", "-", "*")
NAMES = ("Mia", "Leo", "Ava", "Noah", "Zoe", "Omar", "Lina", "Sam", "Ivy", "Ben")
ITEMS = ("apples", "marbles", "stickers", "books", "coins", "shells", "pencils", "cards")
INSTRUCTION = "End your reply with: The answer is <number>."

_NUM = r"-?\d[\d,]*(?:\.\d+)?"
_TAG = re.compile(rf"<answer>\s*({_NUM})\s*</answer>", re.IGNORECASE)
_PHRASE = re.compile(rf"answer\s*(?:is|:|=)\s*\**\s*({_NUM})", re.IGNORECASE)
_ANY = re.compile(_NUM)


@dataclass(frozen=True)
class Problem:
    """One word problem with its integer answer and the knobs that made it."""

    id: str
    question: str
    answer: int
    digits: int
    steps: int
    ops: str
    solution: str = ""

    def prompt(self, instruction: str = INSTRUCTION) -> str:
        """The user message: the question followed by the answer-format instruction."""
        return f"{self.question}\n{instruction}"

    def chat(self, shots=(), instruction: str = INSTRUCTION):
        """The prompt as chat turns: each worked example (a Problem) as a user turn and its solution as the
        assistant's reply, then this question. With no shots, the plain user message."""
        if not shots:
            return self.prompt(instruction)
        turns = []
        for s in shots:
            turns += [{"role": "user", "content": s.prompt(instruction)}, {"role": "assistant", "content": s.solution}]
        return turns + [{"role": "user", "content": self.prompt(instruction)}]

    def to_dict(self) -> dict:
        return asdict(self)


def _operand(rng, digits):
    return rng.randint(1 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def make_problem(rng: random.Random, digits: int = 1, steps: int = 1, ops=("+",), uid: str = "") -> Problem:
    """One problem: a start amount, then `steps` operations drawn from `ops`."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    value = _operand(rng, digits)
    sentences = [f"{name} has {value} {item}."]
    work = []
    for k in range(steps):
        op = rng.choice(ops)
        then = "" if k == 0 else "Then "
        if op == "-" and value < 1:
            op = "+"
        if op == "+":
            b = _operand(rng, digits)
            sentences.append(f"{then}{name} gets {b} more {item}.")
            work.append(f"{value} + {b} = {value + b}.")
            value += b
        elif op == "-":
            b = rng.randint(1, min(value, 10**digits - 1))
            sentences.append(f"{then}{name} gives away {b} {item}.")
            work.append(f"{value} - {b} = {value - b}.")
            value -= b
        else:
            b = rng.randint(2, 4 if digits == 1 else 9)
            sentences.append(f"{then}{name}'s number of {item} becomes {b} times as large.")
            work.append(f"{value} * {b} = {value * b}.")
            value *= b
    sentences.append(f"How many {item} does {name} have now?")
    work.append(f"The answer is {value}.")
    return Problem(uid, " ".join(sentences), value, digits, steps, "".join(ops), " ".join(work))


def make_problems(n: int, seed: int = 0, digits: int = 1, steps: int = 1, ops=("+",)) -> list:
    """n problems, the same for the same arguments."""
    config.check_int("n", n)
    config.check_int("seed", seed, minimum=0)
    config.check_int("digits", digits)
    config.check_int("steps", steps)
    if digits > 6:
        raise ValueError(f"digits={digits} is not allowed; it must be between 1 and 6")
    if not ops or any(op not in OPS for op in ops):
        raise ValueError(f"ops={ops!r} is not allowed; use a non-empty subset of {OPS}")
    rng = random.Random(f"{seed}-{digits}-{steps}-{''.join(ops)}")
    tag = f"d{digits}s{steps}{''.join({'+': 'a', '-': 's', '*': 'm'}[o] for o in ops)}"
    return [make_problem(rng, digits, steps, tuple(ops), uid=f"{tag}-{seed}-{i}") for i in range(n)]


# Difficulty ladder shared by the notebooks: (digits, steps, ops).
LEVELS = {
    "1d-1step-add": (1, 1, ("+",)),
    "2d-1step-add": (2, 1, ("+",)),
    "1d-2step-addsub": (1, 2, ("+", "-")),
    "2d-2step-addsub": (2, 2, ("+", "-")),
    "1d-2step-mixed": (1, 2, ("+", "-", "*")),
}
# Each level in words a reader knows, for the ledger's task column.
LEVEL_WORDS = {"1d-1step-add": "one-digit sums", "2d-1step-add": "two-digit sums",
               "1d-2step-addsub": "one-digit two-step sums and differences",
               "2d-2step-addsub": "two-digit two-step sums and differences",
               "1d-2step-mixed": "one-digit two-step sums, differences and products"}


def make_level(level: str, n: int, seed: int = 0) -> list:
    """n problems of a named difficulty level from LEVELS."""
    config.check_choice("level", level, tuple(LEVELS))
    digits, steps, ops = LEVELS[level]
    return make_problems(n, seed=seed, digits=digits, steps=steps, ops=ops)


def worked_examples(level: str, k: int, seed: int = 0) -> list:
    """k worked examples of a level for few-shot prompts (Problem.chat), drawn apart from any split's problems."""
    config.check_int("k", k, minimum=0)
    return make_level(level, k, seed=config.derive_seed(seed, "shots", level)) if k else []


def split(level: str, n_train: int, n_heldout: int, seed: int = 0, eval_level: str = None):
    """The one train / held-out split: n_train problems of `level` and n_heldout problems of `eval_level`
    (default: the same level) whose question text never appears in the training set."""
    config.check_int("n_train", n_train, minimum=0)
    config.check_int("n_heldout", n_heldout, minimum=0)
    train = make_level(level, n_train, seed=config.derive_seed(seed, "train", level)) if n_train else []
    seen = {p.question for p in train}
    pool = make_level(eval_level or level, 3 * (n_heldout + n_train) + 10, seed=config.derive_seed(seed, "heldout", eval_level or level))
    heldout = list({p.question: p for p in pool if p.question not in seen}.values())
    if len(heldout) < n_heldout:
        raise ValueError(f"n_heldout={n_heldout} is not allowed; level {eval_level or level} has only {len(heldout)} "
                         f"questions unseen in training")
    return train, heldout[:n_heldout]


def _to_number(s: str):
    s = s.replace(",", "")
    try:
        x = float(s)
    except ValueError:
        return None
    return int(x) if x.is_integer() else x


def extract_answer(text: str, strict: bool = False):
    """The final numeric answer in a reply, or None (see the module docstring for the rules)."""
    if not isinstance(text, str):
        return None
    tags = _TAG.findall(text)
    if tags:
        return _to_number(tags[-1])
    phrases = _PHRASE.findall(text)
    if phrases:
        return _to_number(phrases[-1])
    if strict:
        return None
    numbers = _ANY.findall(text)
    return _to_number(numbers[-1]) if numbers else None


def verify(text: str, answer, strict: bool = False) -> bool:
    """Exact verifier: the extracted answer equals the true answer as a number."""
    got = extract_answer(text, strict=strict)
    return got is not None and float(got) == float(answer)


def has_format(text: str) -> bool:
    """True when the reply states its answer in the documented format (tag or phrase)."""
    return extract_answer(text, strict=True) is not None


def verifier_reward(prompts, completions, metadata, log_metric=None, log_extra=None):
    """The exact verifier as a GRPO reward (the RLVR yardstick's, the benchmark's): 1 when the reply's answer equals
    the problem's (lenient), else 0; logs the strict rate and the format rate through log_metric."""
    strict = [float(verify(c, m["answer"], strict=True)) for c, m in zip(completions, metadata)]
    if log_metric is not None:
        log_metric("rollout_strict", sum(strict) / len(strict))
        log_metric("rollout_format", sum(has_format(c) for c in completions) / len(completions))
    return [float(verify(c, m["answer"])) for c, m in zip(completions, metadata)]


def exact_scores(text: str, p: Problem) -> dict:
    """The exact verifier's columns of one reply: the extracted answer, lenient and strict correctness, format."""
    return {"extracted": extract_answer(text), "correct": verify(text, p.answer),
            "correct_strict": verify(text, p.answer, strict=True), "format": has_format(text)}


def evaluate(model, tok, problems, max_new_tokens: int = 64, batch_size: int = 16, seed: int = 0,
             temperature: float = 0.0, instruction: str = INSTRUCTION, prompts=None, progress: bool = True,
             score=exact_scores, columns=None):
    """The one held-out evaluation of answers to problems: one reply per problem (greedy unless a temperature
    is given) to p.prompt(instruction), or to the given prompts; a DataFrame with the problem's columns
    (columns(p), default p.to_dict()), the reply, its scores (score(reply, p), default the exact verifier's
    `exact_scores`: lenient and strict correctness, format) and its length in tokens."""
    import pandas as pd

    from .models import generate  # tasks stays free of torch at import: the parameter classes read its LEVELS

    prompts = [p.prompt(instruction) for p in problems] if prompts is None else list(prompts)
    if len(prompts) != len(problems):
        raise ValueError(f"prompts has {len(prompts)} entries for {len(problems)} problems")
    with phases.phase("generation for evaluation"):
        gen = generate(model, tok, prompts, max_new_tokens=max_new_tokens,
                       temperature=temperature, seed=seed, batch_size=batch_size, progress=progress)
    columns = (lambda p: p.to_dict()) if columns is None else columns
    rows = [{**columns(p), "reply": text, **score(text, p), "tokens": len(ids)}
            for p, text, ids in zip(problems, gen.texts, gen.completion_ids)]
    return pd.DataFrame(rows)
