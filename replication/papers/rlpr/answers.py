"""Free-form answers: where a reply states its answer, the forms a right answer may take, the lenient
oracle and the exact-match verifier, and RLPR's question sets (arithmetic and factual).

How the answer span is found (the 135M model never writes tags unprompted, see notebook 03): the last
``<answer>...</answer>`` pair if there is one, else the text after the last "answer is" / "Answer:"
phrase up to the end of its sentence. A reply with neither has no answer.
"""
import math
import random
import re
from dataclasses import asdict, dataclass

from replication.core import config, files
from replication.lm import tasks

ANSWER_INSTRUCTION = "End your reply with: The answer is <answer>."
FACTUAL_CSV = config.ROOT / "data" / "generated" / "rlpr_factual.csv"
_TAGS = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_PHRASE = re.compile(r"answer\s*(?:is|:|=)\s*:?[ \t]*", re.IGNORECASE)
_END = re.compile(r"\.(?=\s|$)|\n")
_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
         "sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


# ---- the answer span -------------------------------------------------------------------------------

def locate_answer(text: str):
    """(start, end) of the reply's answer: last <answer> tag pair, else the last "answer is" phrase; None if neither."""
    tags = list(_TAGS.finditer(text))
    if tags:
        m = tags[-1]
        inner = m.group(1)
        a = m.start(1) + len(inner) - len(inner.lstrip())
        return a, max(a, m.start(1) + len(inner.rstrip()))
    phrases = list(_PHRASE.finditer(text))
    if not phrases:
        return None
    a = phrases[-1].end()
    while a < len(text) and text[a] in "*\"'":
        a += 1
    end = _END.search(text, a)
    b = end.start() if end else len(text)
    span = text[a:b].rstrip(" \t!*")
    return (a, a + len(span)) if span.strip() else None


def replace_answer(text: str, reference: str):
    """(o', start, end): the reply with its answer replaced by the reference, and where the reference sits; or None."""
    if not reference:
        raise ValueError("reference='' is not allowed; the reference answer must be a non-empty string")
    span = locate_answer(text)
    if span is None:
        return None
    a, b = span
    return text[:a] + reference + text[b:], a, a + len(reference)


def format_score(text: str) -> float:
    """1 for exactly one answer: one <answer>...</answer> pair in order, or (no tags) exactly one answer phrase."""
    if "<answer>" in text or "</answer>" in text:
        ok = text.count("<answer>") == 1 and text.count("</answer>") == 1 and re.search(r"<answer>.*</answer>", text, re.DOTALL)
        return 1.0 if ok else 0.0
    return 1.0 if len(_PHRASE.findall(text)) == 1 and locate_answer(text) is not None else 0.0


# ---- right answers in any form ---------------------------------------------------------------------

def _norm(s: str) -> str:
    s = re.sub(r"[^a-z0-9.\- ]", " ", s.lower().replace("°", " "))
    s = re.sub(r"\b(the|a|an)\b", " ", s)
    return " ".join(s.replace("-", " ").split()).strip(" .")


def _clean(s: str) -> str:
    return " ".join(s.lower().split()).strip(" .*")


def exact_match(text: str, reference: str) -> bool:
    """A rule-based verifier: the located answer equals the reference string (case, spaces and final stop ignored)."""
    span = locate_answer(text)
    return span is not None and _clean(text[span[0]:span[1]]) == _clean(reference)


def number_words(n: int) -> str:
    """English words for 0 <= n <= 999 (e.g. 'twenty one')."""
    config.check_int("n", n, minimum=0)
    if n > 999:
        raise ValueError(f"n={n} is not allowed; number_words covers 0-999")
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    return _ONES[n // 100] + " hundred" + ("" if n % 100 == 0 else " " + number_words(n % 100))


def parse_number(text: str):
    """The first number in a text, written in digits or in words (0-999); None if there is none."""
    words = {w: i for i, w in enumerate(_ONES)} | {w: 10 * i for i, w in enumerate(_TENS) if w != "_"}
    for tokn in re.findall(r"-?\d[\d,]*(?:\.\d+)?|[a-z]+", text.lower().replace("-", " ")):
        if tokn[0].isdigit() or tokn[0] == "-":
            return float(tokn.replace(",", ""))
        if tokn in words:
            total, seen = 0, re.findall(r"[a-z]+", text.lower().replace("-", " "))
            for w in seen[seen.index(tokn):]:
                if w in words:
                    total += words[w]
                elif w == "hundred":
                    total *= 100
                elif w != "and":
                    break
            return float(total)
    return None


def is_correct(text: str, aliases, value=None) -> bool:
    """Lenient oracle: the answer (or, with none located, the last line) holds the value in any form or an alias."""
    span = locate_answer(text)
    answer = text[span[0]:span[1]] if span else (text.strip().splitlines() or [""])[-1]
    if value is not None and not (isinstance(value, float) and math.isnan(value)):
        got = parse_number(answer)
        return got is not None and got == float(value)
    a = f" {_norm(answer)} "
    return any(f" {_norm(x)} " in a for x in aliases if _norm(x))


_EQUATION = re.compile(r"=\s*(-?\d+(?:\.\d+)?)")


def worked_result(text: str):
    """The number the reply's own working reached: the right-hand side of its last "= N" before the answer span (the
    worked examples write "12 + 58 = 70. The answer is 70."); None without an answer span or an equation before it."""
    span = locate_answer(text)
    if span is None:
        return None
    found = _EQUATION.findall(text[:span[0]])
    return float(found[-1]) if found else None


def answer_vs_work(text: str, value) -> dict:
    """Does the stated answer follow the reply's own working? stated: the answer span's number; worked: worked_result;
    follows: stated == worked; worked_right: worked == value (None where a number is missing)."""
    span = locate_answer(text)
    stated = parse_number(text[span[0]:span[1]]) if span else None
    worked = worked_result(text)
    return {"stated": stated, "worked": worked,
            "follows": None if stated is None or worked is None else stated == worked,
            "worked_right": None if worked is None else worked == float(value)}


def score_reply(text: str, question) -> dict:
    """The three rule-based scores of one reply to a Question: lenient oracle, exact-match verifier, format."""
    return {"correct": is_correct(text, question.aliases, question.value),
            "verified": exact_match(text, question.reference), "format": format_score(text)}


# ---- question sets ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Question:
    """A question with one reference answer, the other forms that are also right, and its split."""

    id: str
    kind: str
    question: str
    reference: str
    aliases: tuple
    value: float = None
    style: str = "text"
    split: str = "train"

    def prompt(self) -> str:
        return f"{self.question}\n{ANSWER_INSTRUCTION}"

    def chat(self, shots=()):
        """The prompt as chat turns: each worked example (a tasks.Problem with its solution) as a user turn in
        this answer format and its solution as the assistant's reply, then this question; no shots: prompt()."""
        if not shots:
            return self.prompt()
        turns = []
        for s in shots:
            turns += [{"role": "user", "content": f"{s.question}\n{ANSWER_INSTRUCTION}"},
                      {"role": "assistant", "content": s.solution}]
        return turns + [{"role": "user", "content": self.prompt()}]

    def meta(self) -> dict:
        return {"id": self.id, "reference": self.reference, "aliases": list(self.aliases), "value": self.value}


STYLES = ("digits", "unit", "words")


def _arithmetic(problems, rng, split, styles=STYLES):
    out = []
    for p in problems:
        item = next(w for w in tasks.ITEMS if w in p.question)
        forms = {"digits": str(p.answer), "words": number_words(p.answer), "unit": f"{p.answer} {item}"}
        style = rng.choice(sorted(styles))
        aliases = (str(p.answer), number_words(p.answer), f"{p.answer} {item}", f"{number_words(p.answer)} {item}")
        out.append(Question(f"{split}-{p.id}", "arithmetic", p.question, forms[style], aliases, float(p.answer), style, split))
    return out


def _factual(rows, split):
    out = []
    for f in rows:
        number = not math.isnan(f["value"])
        out.append(Question(f"{split}-{f['id']}", "factual", f["question"], f["reference"], tuple(f["aliases"].split("|")),
                            float(f["value"]) if number else None, "number" if number else "text", split))
    return out


def make_questions(n_arithmetic: int, n_factual: int, seed: int = 0, level: str = "1d-1step-add",
                   n_heldout: int = None, styles=STYLES) -> dict:
    """{'train': [...], 'heldout': [...]}: arithmetic from the one train / held-out split (tasks.split; n_arithmetic
    training and n_heldout held-out problems, default as many) with references written at random in one of
    `styles` (digits, words, or with the unit), plus n_factual factual questions per split from FACTUAL_CSV."""
    import pandas as pd

    config.check_int("n_arithmetic", n_arithmetic, minimum=0)
    config.check_int("n_factual", n_factual, minimum=0)
    n_heldout = n_arithmetic if n_heldout is None else n_heldout
    config.check_int("n_heldout", n_heldout, minimum=0)
    if not styles or any(x not in STYLES for x in styles):
        raise ValueError(f"styles={styles!r} is not allowed; use a non-empty subset of {STYLES}")
    rng = random.Random(config.derive_seed(seed, "rlpr-questions"))
    fact = pd.read_csv(FACTUAL_CSV, dtype={"value": float}).to_dict("records")
    if n_factual > len(fact) // 2:
        raise ValueError(f"n_factual={n_factual} is not allowed; at most {len(fact) // 2} per split (file: {FACTUAL_CSV.name})")
    rng.shuffle(fact)
    train_p, held_p = tasks.split(level, n_arithmetic, n_heldout, seed=seed)
    facts = {"train": fact[:n_factual], "heldout": fact[-n_factual:] if n_factual else []}
    return {split: _arithmetic(probs, rng, split, styles) + _factual(facts[split], split)
            for split, probs in (("train", train_p), ("heldout", held_p))}


def write_questions(path, questions: dict, seed: int) -> None:
    """Write both splits as CSV (aliases joined by '|') with the seed that made them."""
    import pandas as pd

    rows = [{**asdict(q), "aliases": "|".join(q.aliases), "seed": seed} for qs in questions.values() for q in qs]
    files.write_text(path, pd.DataFrame(rows).to_csv(index=False))
