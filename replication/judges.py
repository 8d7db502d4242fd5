"""A prompted LLM judge: absolute 1-5 scores and pairwise verdicts read from the next-token distribution,
and a corpus of responses with known quality levels to test judges on."""
import re

import numpy as np
import pandas as pd
import torch

from . import config, models, tasks

ABSOLUTE = ("Rate how good the response is as an answer to the question, from 1 (useless) to 5 (correct and "
            "clearly explained).\n\nQuestion: {task}\n\nResponse: {response}\n\nReply with one digit from 1 to 5.")
PAIRWISE = ("Which response answers the question better?\n\nQuestion: {task}\n\nResponse A: {a}\n\n"
            "Response B: {b}\n\nReply with one letter: A or B.")
SCORES = ("1", "2", "3", "4", "5")
CHOICES = ("A", "B")


def option_ids(tok, options) -> list:
    """The token id of each option as the first token of the assistant's reply; they must differ."""
    ids = [tok(o, add_special_tokens=False)["input_ids"][0] for o in options]
    if len(set(ids)) != len(ids):
        raise ValueError(f"options {options} share a first token; the judge cannot tell them apart")
    return ids


@torch.no_grad()
def answer_probs(model, tok, prompts, options, batch_size: int = 16, progress: bool = False) -> np.ndarray:
    """P(option | prompt) from the next-token distribution, renormalised over the options: (n, len(options))."""
    from tqdm.auto import tqdm

    config.check_int("batch_size", batch_size)
    ids = option_ids(tok, options)
    texts = models.chat_prompts(tok, prompts)
    out = []
    for i in tqdm(range(0, len(texts), batch_size), desc="judge", disable=not progress):
        enc = tok(texts[i:i + batch_size], return_tensors="pt", padding=True, add_special_tokens=False)
        logits = model(**enc, position_ids=models.position_ids(enc["attention_mask"]), logits_to_keep=1).logits[:, -1, ids]
        out.append(torch.softmax(logits.float(), -1).numpy())
    return np.concatenate(out) if out else np.zeros((0, len(options)))


def absolute(model, tok, questions, responses, k: int = 5, seed: int = 0, batch_size: int = 16, progress=False):
    """k independent 1-5 scores per response, drawn from the judge's score distribution: (probs, scores)."""
    config.check_int("k", k)
    probs = answer_probs(model, tok, [ABSOLUTE.format(task=q, response=r) for q, r in zip(questions, responses)],
                         SCORES, batch_size, progress)
    rng = np.random.default_rng(seed)
    scores = np.stack([rng.choice(5, size=k, p=p / p.sum()) + 1 for p in probs]) if len(probs) else np.zeros((0, k))
    return probs, scores


def pairwise(model, tok, questions, better, worse, k: int = 5, seed: int = 0, batch_size: int = 16, progress=False):
    """Both orders per pair. Returns a DataFrame: P(better wins) with it shown first and second, the
    order-averaged probability, k sampled verdicts from it, and P(the judge says A) per order."""
    config.check_int("k", k)
    first = [PAIRWISE.format(task=q, a=b, b=w) for q, b, w in zip(questions, better, worse)]
    second = [PAIRWISE.format(task=q, a=w, b=b) for q, b, w in zip(questions, better, worse)]
    p = answer_probs(model, tok, first + second, CHOICES, batch_size, progress)[:, 0]  # P("A")
    n = len(questions)
    p_first, p_second = p[:n], 1 - p[n:]
    debiased = (p_first + p_second) / 2
    rng = np.random.default_rng(seed)
    wins = (rng.random((n, k)) < debiased[:, None]).astype(float)
    return pd.DataFrame({"p_better_first": p_first, "p_better_second": p_second, "p_better": debiased,
                         "wins": list(wins), "win_rate": wins.mean(1), "p_says_a_first": p[:n],
                         "p_says_a_second": p[n:]})


def parse_rating(text: str):
    """The first digit 1-5 in a generated absolute judgment (a rating), or None."""
    m = re.search(r"\b([1-5])\b", text or "")
    return int(m.group(1)) if m else None


def position_bias(verdicts: pd.DataFrame) -> dict:
    """How much the pairwise judge favours a position, from `pairwise`'s table: P(it says A) over both orders
    (0.5 = no bias), and P(the better response wins) when it is shown first and when second."""
    p_says_a = float(np.mean(np.r_[verdicts["p_says_a_first"], verdicts["p_says_a_second"]]))
    return {"p_says_a": p_says_a, "bias": p_says_a - 0.5,
            "p_better_when_first": float(verdicts["p_better_first"].mean()),
            "p_better_when_second": float(verdicts["p_better_second"].mean())}


def parse_choice(text: str):
    """'A' or 'B' from a generated pairwise verdict ("A", "Response B", "b."), or None if absent or both."""
    found = set(re.findall(r"\b(?:response\s+)?([AB])\b", (text or "").upper()))
    return found.pop() if len(found) == 1 else None


def _explained(p: tasks.Problem, answer) -> str:
    start = int(re.search(r"has (\d+)", p.question).group(1))
    steps = re.findall(r"(gets|gives away|becomes) (\d+)", p.question)
    value, parts = start, []
    for verb, b in steps:
        b = int(b)
        new = value + b if verb == "gets" else value - b if verb == "gives away" else value * b
        sign = {"gets": "+", "gives away": "-", "becomes": "*"}[verb]
        parts.append(f"{value} {sign} {b} = {new}")
        value = new
    return f"We start with {start}. Then {', then '.join(parts)}. The answer is {answer}."


def quality_corpus(n_questions: int, seed: int = 0, level: str = "1d-2step-addsub") -> pd.DataFrame:
    """Five responses per question with known quality 1-5, by controlled degradation of a correct answer:
    5 correct with worked steps; 4 correct answer, no steps; 3 worked steps with an off-by-one final answer;
    2 a wrong answer with no steps; 1 an off-topic reply."""
    config.check_int("n_questions", n_questions)
    rng = np.random.default_rng(seed)
    rows = []
    for p in tasks.make_level(level, n_questions, seed=seed):
        wrong = p.answer + int(rng.choice([-1, 1]))
        far = p.answer + int(rng.integers(5, 20))
        responses = {5: _explained(p, p.answer), 4: f"The answer is {p.answer}.",
                     3: _explained(p, wrong).replace(f"= {p.answer}.", f"= {wrong}."),
                     2: f"The answer is {far}.", 1: "I like to watch the clouds on a sunny day."}
        rows += [{"question_id": p.id, "question": p.question, "quality": q, "response": r} for q, r in responses.items()]
    return pd.DataFrame(rows)


def quality_pairs(corpus: pd.DataFrame, per_question: int = 10, seed: int = 0) -> pd.DataFrame:
    """Pairs of responses to the same question with different quality (gap 1-4), better one first."""
    rng = np.random.default_rng(seed)
    rows = []
    for qid, g in corpus.groupby("question_id", sort=False):
        g = g.sort_values("quality")
        combos = [(i, j) for i in range(len(g)) for j in range(i + 1, len(g))]
        for idx in rng.permutation(len(combos))[:per_question]:
            lo, hi = g.iloc[combos[idx][0]], g.iloc[combos[idx][1]]
            rows.append({"question_id": qid, "question": hi["question"], "gap": int(hi["quality"] - lo["quality"]),
                         "better": hi["response"], "worse": lo["response"]})
    return pd.DataFrame(rows)
