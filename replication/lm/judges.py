"""LLM judges: a prompted one (absolute 1-5 scores and pairwise verdicts read from the next-token distribution),
a likelihood-comparison one (the reply the model finds likelier wins), and a corpus of responses with known
quality levels to test judges on."""
import re

import numpy as np
import pandas as pd
import torch

from replication.core import config, fmt, phases, stats
from . import models, tasks, training

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
@phases.timed("judging")
def answer_probs(model, tok, prompts, options, batch_size: int = 16, progress: bool = False) -> np.ndarray:
    """P(option | prompt) from the next-token distribution, renormalised over the options: (n, len(options))."""
    from tqdm.auto import tqdm

    config.check_int("batch_size", batch_size)
    ids = option_ids(tok, options)
    texts = models.chat_prompts(tok, prompts)
    out = []
    for i in tqdm(range(0, len(texts), batch_size), desc="judge", disable=not progress):
        enc = tok(texts[i:i + batch_size], return_tensors="pt", padding=True, add_special_tokens=False).to(models.device_of(model))
        logits = model(**enc, position_ids=models.position_ids(enc["attention_mask"]), logits_to_keep=1).logits[:, -1, ids]
        out.append(torch.softmax(logits.float(), -1).cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, len(options)))


def sample_scores(probs, k: int, seed: int) -> np.ndarray:
    """k 1-5 scores per response drawn from the judge's score distribution (rows of `probs`, from answer_probs)."""
    rng = np.random.default_rng(seed)
    return (np.stack([rng.choice(5, size=k, p=p / p.sum()) + 1 for p in np.asarray(probs, float)]) if len(probs)
            else np.zeros((0, k)))


def sample_wins(p_better, k: int, seed: int) -> np.ndarray:
    """k verdicts per pair (1: the better reply wins) drawn from the order-averaged P(better wins)."""
    p = np.asarray(p_better, float)
    return (np.random.default_rng(seed).random((len(p), k)) < p[:, None]).astype(float)


def absolute(model, tok, questions, responses, k: int = 5, seed: int = 0, batch_size: int = 16, progress=False):
    """k independent 1-5 scores per response, drawn from the judge's score distribution: (probs, scores)."""
    config.check_int("k", k)
    probs = answer_probs(model, tok, [ABSOLUTE.format(task=q, response=r) for q, r in zip(questions, responses)],
                         SCORES, batch_size, progress)
    return probs, sample_scores(probs, k, seed)


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
    wins = sample_wins(debiased, k, seed)
    return pd.DataFrame({"p_better_first": p_first, "p_better_second": p_second, "p_better": debiased,
                         "wins": list(wins), "win_rate": wins.mean(1), "p_says_a_first": p[:n],
                         "p_says_a_second": p[n:]})


@torch.no_grad()
def response_logps(model, tok, questions, responses, instruction: str = None, batch_size: int = 16,
                   progress: bool = False) -> pd.DataFrame:
    """Each response (+ EOS) scored alone as the assistant's reply to the question (followed by `instruction`
    on a new line when one is given): its mean and summed log-prob per token and its token count (EOS included).
    Each distinct (question, response) is scored once; a question's responses share one pass over its prompt."""
    from tqdm.auto import tqdm

    config.check_int("batch_size", batch_size)
    keys = list(zip(questions, responses))
    by_question = {}
    for q, r in dict.fromkeys(keys):
        by_question.setdefault(q, []).append(r)
    found = {}
    for q, rs in tqdm(by_question.items(), desc="likelihood", disable=not progress):
        user = q if instruction is None else f"{q}\n{instruction}"
        for i in range(0, len(rs), batch_size):
            chunk = rs[i:i + batch_size]
            p_ids, p_mask, c_ids, c_mask = training.encode_pairs(tok, [user] * len(chunk), chunk, device=models.device_of(model))
            lp = training.grouped_logps(model, p_ids, p_mask, c_ids, c_mask, len(chunk)) * c_mask   # (B, T)
            n = c_mask.sum(1)
            found.update({(q, r): (float(s_ / n_), float(s_), int(n_)) for r, s_, n_ in zip(chunk, lp.sum(1), n)})
    out = pd.DataFrame([(q, r, *found[(q, r)]) for q, r in keys],
                       columns=["question", "response", "mean_logp", "sum_logp", "n_tokens"])
    return out.astype({"mean_logp": float, "sum_logp": float, "n_tokens": int})


def likelihood_verdicts(scored: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    """The likelihood-comparison judge's verdicts on `pairs` (question, better, worse) from `response_logps`'s
    table, which must hold every reply of the pairs: the reply with the higher mean log-prob per token wins.
    Per pair: both scores and token counts, the margin (better - worse), win (1 when the better reply is the
    likelier; a tie, possible only for equal scores, counts 0) and shorter (1 when the better reply has fewer
    tokens, 0 more, 0.5 as many)."""
    table = scored.drop_duplicates(["question", "response"]).set_index(["question", "response"])
    b = table.loc[list(zip(pairs["question"], pairs["better"]))]
    w = table.loc[list(zip(pairs["question"], pairs["worse"]))]
    margin = b["mean_logp"].to_numpy() - w["mean_logp"].to_numpy()
    nb, nw = b["n_tokens"].to_numpy(), w["n_tokens"].to_numpy()
    return pd.DataFrame({"logp_better": b["mean_logp"].to_numpy(), "logp_worse": w["mean_logp"].to_numpy(),
                         "margin": margin, "win": (margin > 0).astype(float), "tokens_better": nb, "tokens_worse": nw,
                         "shorter": np.where(nb < nw, 1.0, np.where(nb > nw, 0.0, 0.5))})


@phases.timed("judging")
def likelihood_pairwise(model, tok, questions, better, worse, instruction: str = None,
                        batch_size: int = 16, progress: bool = False) -> pd.DataFrame:
    """The likelihood-comparison judge: each reply is scored alone (`response_logps`) and the likelier one per
    token wins (`likelihood_verdicts`), so the order a pair is given in cannot change the verdict."""
    pairs = pd.DataFrame({"question": list(questions), "better": list(better), "worse": list(worse)})
    scored = response_logps(model, tok, list(pairs["question"]) * 2, list(pairs["better"]) + list(pairs["worse"]),
                            instruction, batch_size, progress)
    return likelihood_verdicts(scored, pairs)


def signal(wins, alpha: float = 0.05) -> dict:
    """Whether a judge carries signal: its accuracy over all pairs with a Wilson interval; `carries` when the
    interval lies above 0.5."""
    w = np.asarray(wins, dtype=float)
    acc, lo, hi = stats.proportion_ci(float(w.sum()), len(w), alpha)
    return {"accuracy": acc, "ci95": [lo, hi], "n": int(len(w)), "carries": bool(lo > 0.5)}


def compare_table(columns: dict) -> pd.DataFrame:
    """Judges side by side, each as (noise.judge_summary's dict, signal's dict) by name: accuracy over all pairs
    and at gap 1, sigma_comp at gap 1, sigma_abs,eff and the noise ratio, each with its 95% interval."""
    out = {}
    for name, (j, sig) in columns.items():
        acc1, ci1 = j["accuracy"].get("1", float("nan")), j["accuracy_ci95"].get("1", [float("nan")] * 2)
        out[name] = [f"{sig['accuracy']:.2f} {fmt.ci(sig['ci95'])} (n = {sig['n']})", f"{acc1:.2f} {fmt.ci(ci1)}",
                     f"{fmt.number(j['sigma_comp'].get('1', float('nan')))} {fmt.ci(j['sigma_comp_ci95'].get('1', [float('nan')] * 2))}",
                     f"{fmt.number(j['sigma_abs_eff'])} {fmt.ci(j['sigma_abs_eff_ci95'])}",
                     f"{fmt.number(j['ratio'])} {fmt.ci(j['ratio_ci95'])}"]
    return pd.DataFrame(out, index=["accuracy, all pairs (one verdict a pair)", "accuracy, gap 1", "sigma_comp, gap 1",
                                    "sigma_abs,eff", "ratio sigma_abs,eff / sigma_comp (gap 1)"])


def length_check(pairs: pd.DataFrame, verdicts: pd.DataFrame) -> pd.DataFrame:
    """Does length alone explain a judge's choices? Per pair type (better vs worse quality level) and for the
    better reply being shorter, longer or of equal length: n, the judge's accuracy and the accuracies of "pick
    the shorter reply" and "pick the longer reply" (a tie in length counts half), each with a Wilson interval,
    and how often the judge picks the shorter reply where the two differ in length."""
    df = pd.DataFrame({"pair": pairs["better_quality"].astype(str) + " vs " + pairs["worse_quality"].astype(str),
                       "better_is": np.select([verdicts["shorter"] == 1, verdicts["shorter"] == 0],
                                              ["shorter", "longer"], "same length"),
                       "win": verdicts["win"].to_numpy(), "shorter": verdicts["shorter"].to_numpy()})
    df["judge_picks_shorter"] = np.where(df["shorter"] == 0.5, np.nan, (df["win"] == df["shorter"]).astype(float))
    rows = []
    for col, groups in (("pair", sorted(df["pair"].unique(), reverse=True)), ("better_is", ["shorter", "longer", "same length"]),
                        (None, ["all pairs"])):
        for name in groups:
            g = df if col is None else df[df[col] == name]
            if not len(g):
                continue
            judge = stats.proportion_ci(float(g["win"].sum()), len(g))
            short = stats.proportion_ci(float(g["shorter"].sum()), len(g))
            long = stats.proportion_ci(float((1 - g["shorter"]).sum()), len(g))
            picks = g["judge_picks_shorter"].dropna()
            rows.append({"by": col or "all", "group": name, "n": len(g), "judge": judge[0], "judge_lo": judge[1],
                         "judge_hi": judge[2], "pick_shorter": short[0], "shorter_lo": short[1], "shorter_hi": short[2],
                         "pick_longer": long[0], "longer_lo": long[1], "longer_hi": long[2],
                         "judge_picks_shorter": float(picks.mean()) if len(picks) else float("nan")})
    return pd.DataFrame(rows)


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
                         "better": hi["response"], "worse": lo["response"], "better_quality": int(hi["quality"]),
                         "worse_quality": int(lo["quality"])})
    return pd.DataFrame(rows)
