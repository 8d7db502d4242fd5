"""RLPR: the reference-probability reward, its debiasing, the format term and the adaptive std filter.

How the answer span is found (the 135M model never writes tags unprompted, see notebook 03): the last
``<answer>...</answer>`` pair if there is one, else the text after the last "answer is" / "Answer:"
phrase up to the end of its sentence. A reply with neither has no answer to replace; the authors'
code gives an empty reference mask the score 0, so its reward is 0 (plus the format term, also 0).
"""
import math
import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from . import config, models, tasks, training

AGGREGATIONS = ("mean", "sequence", "geometric")
INSTRUCTION = "End your reply with: The answer is <answer>."
FACTUAL_CSV = config.ROOT / "data" / "generated" / "rlpr_factual.csv"
_TAGS = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_PHRASE = re.compile(r"answer\s*(?:is|:|=)\s*:?[ \t]*", re.IGNORECASE)
_END = re.compile(r"\.(?=\s|$)|\n")
_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
         "sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


# ---- answer span, replacement and reference tokens ------------------------------------------------

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


def reference_mask(offsets, start: int, end: int) -> list:
    """Which tokens (character offsets (s, e)) overlap the reference's characters [start, end)."""
    return [s < end and e > start and e > s for s, e in offsets]


def token_probs(model, tok, prompts, completions, spans, temperature: float = 1.0, batch_size: int = 16, system=None):
    """Probabilities of the tokens overlapping each span, under the model (logits / temperature); None where span is None."""
    out = [None] * len(prompts)
    rows = [i for i, s in enumerate(spans) if s is not None]
    model.eval()
    for k in range(0, len(rows), batch_size):
        chunk = rows[k:k + batch_size]
        enc = tok(models.chat_prompts(tok, [prompts[i] for i in chunk], system), return_tensors="pt", padding=True,
                  add_special_tokens=False)
        comp = [tok(completions[i], add_special_tokens=False, return_offsets_mapping=True) for i in chunk]
        T = max(len(c["input_ids"]) for c in comp)
        ids = torch.full((len(chunk), T), tok.pad_token_id, dtype=torch.long)
        mask, ref = torch.zeros_like(ids), torch.zeros_like(ids, dtype=torch.bool)
        for j, (i, c) in enumerate(zip(chunk, comp)):
            n = len(c["input_ids"])
            ids[j, :n], mask[j, :n] = torch.tensor(c["input_ids"]), 1
            ref[j, :n] = torch.tensor(reference_mask(c["offset_mapping"], *spans[i]))
        with torch.no_grad():
            logps = training.completion_logps(model, enc["input_ids"], enc["attention_mask"], ids, mask, temperature)
        for j, i in enumerate(chunk):
            out[i] = logps[j][ref[j]].exp().tolist()
    return out


def reply_probs(model, tok, prompts, replies, references, **kw):
    """Reference-token probabilities with the reasoning kept and the answer replaced (None: no answer found)."""
    rep = [replace_answer(c, r) for c, r in zip(replies, references)]
    return token_probs(model, tok, prompts, [x[0] if x else "" for x in rep], [x[1:] if x else None for x in rep], **kw)


def baseline_probs(model, tok, prompts, references, lead: str = "The answer is ", **kw):
    """Reference-token probabilities with no reasoning: the prompt followed directly by lead + reference."""
    return token_probs(model, tok, prompts, [lead + r for r in references],
                       [(len(lead), len(lead) + len(r)) for r in references], **kw)


# ---- the reward ------------------------------------------------------------------------------------

def aggregate(probs, how: str = "mean") -> float:
    """f_seq over reference-token probabilities: mean, sequence (product) or geometric (N-th root); empty -> 0."""
    config.check_choice("aggregation", how, AGGREGATIONS)
    if probs is None or len(probs) == 0:
        return 0.0
    p = np.asarray(probs, dtype=np.float64)
    if how == "mean":
        return float(p.mean())
    logs = np.log(np.clip(p, 1e-300, 1.0))
    return float(np.exp(logs.sum() if how == "sequence" else logs.mean()))


def debias(r, r_prime):
    """r_hat = clip(r - r', 0, 1): the gain in reference probability the reasoning brings."""
    return np.clip(np.asarray(r, dtype=np.float64) - np.asarray(r_prime, dtype=np.float64), 0.0, 1.0)


def format_score(text: str) -> float:
    """1 for exactly one answer: one <answer>...</answer> pair in order, or (no tags) exactly one answer phrase."""
    if "<answer>" in text or "</answer>" in text:
        ok = text.count("<answer>") == 1 and text.count("</answer>") == 1 and re.search(r"<answer>.*</answer>", text, re.DOTALL)
        return 1.0 if ok else 0.0
    return 1.0 if len(_PHRASE.findall(text)) == 1 and locate_answer(text) is not None else 0.0


def _norm(s: str) -> str:
    s = re.sub(r"[^a-z0-9.\- ]", " ", s.lower().replace("°", " "))
    s = re.sub(r"\b(the|a|an)\b", " ", s)
    return " ".join(s.replace("-", " ").split()).strip(" .")


def exact_match(text: str, reference: str) -> bool:
    """A rule-based verifier: the located answer equals the reference string (case, spaces and final stop ignored)."""
    span = locate_answer(text)
    clean = lambda s: " ".join(s.lower().split()).strip(" .*")  # noqa: E731
    return span is not None and clean(text[span[0]:span[1]]) == clean(reference)


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


class Reward:
    """reward_fn(prompts, completions, metadata) for GRPOTrainer: RLPR (probability) or RLVR (exact match).

    reward = (1 - format_weight) * core + format_weight * format, core = clip(r - r', 0, 1) with debiasing,
    r without; `last` keeps the components of the latest call."""

    def __init__(self, model, tok, kind: str = "probability", aggregation: str = "mean", baseline: dict = None,
                 format_weight: float = 0.1, temperature: float = 1.0, batch_size: int = 16, system=None):
        config.check_choice("kind", kind, ("probability", "verifier"))
        config.check_choice("aggregation", aggregation, AGGREGATIONS)
        config.check_range("format_weight", format_weight, 0.0, 1.0)
        self.model, self.tok, self.kind, self.aggregation, self.baseline = model, tok, kind, aggregation, baseline
        self.w, self.temperature, self.batch_size, self.system, self.last = format_weight, temperature, batch_size, system, {}

    def __call__(self, prompts, completions, metadata):
        refs = [m["reference"] for m in metadata]
        fmt = np.array([format_score(c) for c in completions])
        correct = [is_correct(c, m["aliases"], m.get("value")) for c, m in zip(completions, metadata)]
        if self.kind == "verifier":
            r = core = np.array([float(exact_match(c, ref)) for c, ref in zip(completions, refs)])
        else:
            probs = reply_probs(self.model, self.tok, prompts, completions, refs, temperature=self.temperature,
                                batch_size=self.batch_size, system=self.system)
            r = np.array([aggregate(p, self.aggregation) for p in probs])
            if self.baseline is not None:
                core = debias(r, [aggregate(self.baseline[m["id"]], self.aggregation) for m in metadata])
            else:
                core = np.clip(r, 0.0, 1.0)
        reward = (1 - self.w) * core + self.w * fmt
        self.last = {"r": r.tolist(), "core": core.tolist(), "format": fmt.tolist(), "correct": correct}
        return reward.tolist()


# ---- questions -------------------------------------------------------------------------------------

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
        return f"{self.question}\n{INSTRUCTION}"

    def meta(self) -> dict:
        return {"id": self.id, "reference": self.reference, "aliases": list(self.aliases), "value": self.value}


def _arithmetic(problems, rng, split):
    out = []
    for p in problems:
        item = next(w for w in tasks.ITEMS if w in p.question)
        forms = {"digits": str(p.answer), "words": number_words(p.answer), "unit": f"{p.answer} {item}"}
        style = rng.choice(sorted(forms))
        aliases = (str(p.answer), number_words(p.answer), f"{p.answer} {item}", f"{number_words(p.answer)} {item}")
        out.append(Question(f"{split}-{p.id}", "arithmetic", p.question, forms[style], aliases, float(p.answer), style, split))
    return out


def make_questions(n_arithmetic: int, n_factual: int, seed: int = 0, level: str = "1d-1step-add") -> dict:
    """{'train': [...], 'heldout': [...]}: arithmetic with references as digits, words or with the unit, plus factual."""
    import pandas as pd

    config.check_int("n_arithmetic", n_arithmetic, minimum=0)
    config.check_int("n_factual", n_factual, minimum=0)
    rng = random.Random(f"rlpr-{seed}")
    fact = pd.read_csv(FACTUAL_CSV, dtype={"value": float}).to_dict("records")
    if n_factual > len(fact) // 2:
        raise ValueError(f"n_factual={n_factual} is not allowed; at most {len(fact) // 2} per split (file: {FACTUAL_CSV.name})")
    rng.shuffle(fact)
    train_p = tasks.make_level(level, n_arithmetic, seed=seed) if n_arithmetic else []
    seen = {p.question for p in train_p}
    held_p = [p for p in tasks.make_level(level, 3 * n_arithmetic + 10, seed=seed + 10_000) if p.question not in seen]
    out = {}
    for split, probs, facts in (("train", train_p, fact[:n_factual]), ("heldout", held_p[:n_arithmetic], fact[-n_factual:] if n_factual else [])):
        qs = _arithmetic(probs, rng, split)
        qs += [Question(f"{split}-{f['id']}", "factual", f["question"], f["reference"], tuple(f["aliases"].split("|")),
                        None if math.isnan(f["value"]) else float(f["value"]), "number" if not math.isnan(f["value"]) else "text", split)
               for f in facts]
        out[split] = qs
    return out


def write_questions(path, questions: dict, seed: int) -> None:
    """Write both splits as CSV (aliases joined by '|') with the seed that made them."""
    import pandas as pd

    from . import files

    rows = [{**asdict(q), "aliases": "|".join(q.aliases), "seed": seed} for qs in questions.values() for q in qs]
    files.write_text(path, pd.DataFrame(rows).to_csv(index=False))


# ---- reward quality ----------------------------------------------------------------------------------

def auc(scores, labels) -> float:
    """ROC-AUC by the rank (Mann-Whitney) formula with mid-ranks for ties; nan if a class is empty."""
    from scipy.stats import rankdata

    s, y = np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=bool)
    n1, n0 = int(y.sum()), int((~y).sum())
    if n1 == 0 or n0 == 0:
        return float("nan")
    ranks = rankdata(s)
    return float((ranks[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def roc_curve(scores, labels):
    """(false positive rate, true positive rate) at every threshold, from the highest score down."""
    s, y = np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=bool)
    order = np.argsort(-s, kind="stable")
    s, y = s[order], y[order]
    last = np.r_[np.flatnonzero(np.diff(s)), len(s) - 1]  # last index of each distinct score
    tp, fp = np.cumsum(y)[last], np.cumsum(~y)[last]
    return np.r_[0, fp / max((~y).sum(), 1)], np.r_[0, tp / max(y.sum(), 1)]


def within_auc(scores, labels, groups) -> float:
    """Mean AUC inside groups (questions) that have both right and wrong replies: what a group baseline sees."""
    s, y, g = np.asarray(scores), np.asarray(labels, dtype=bool), np.asarray(groups)
    vals = [auc(s[g == k], y[g == k]) for k in dict.fromkeys(g)]
    vals = [v for v in vals if not math.isnan(v)]
    return float(np.mean(vals)) if vals else float("nan")


def bootstrap_auc(table, columns, label: str = "correct", group: str = "qid", n_boot: int = 1000, seed: int = 0) -> dict:
    """Pooled AUC of each column with a 95% interval from resampling questions (the unit of dependence)."""
    rng = np.random.default_rng(seed)
    ids = table[group].unique()
    parts = {k: v for k, v in table.groupby(group)}
    draws = {c: [] for c in columns}
    for _ in range(n_boot):
        sample = np.concatenate([parts[k].index.to_numpy() for k in rng.choice(ids, len(ids))])
        sub = table.loc[sample]
        for c in columns:
            draws[c].append(auc(sub[c], sub[label]))
    return {c: {"auc": auc(table[c], table[label]), "draws": np.array(draws[c]),
                "ci95": np.nanpercentile(draws[c], [2.5, 97.5]).tolist()} for c in columns}


def sample_replies(model, tok, questions, samples: int, temperature: float = 1.0, max_new_tokens: int = 48,
                   batch_size: int = 16, seed: int = 0, cache=None):
    """Sampled replies per question with reference-token probabilities (r) and the no-reasoning baseline (r'),
    the lenient oracle, the verifier and the format term; cached as JSON at `cache`."""
    import pandas as pd

    from . import files

    if cache is not None and Path(cache).is_file():
        return pd.DataFrame(files.read_json(cache))
    config.check_int("samples", samples)
    qs = [q for q in questions for _ in range(samples)]
    prompts = [q.prompt() for q in qs]
    gen = models.generate(model, tok, prompts, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                          batch_size=batch_size)
    kw = {"temperature": temperature, "batch_size": batch_size}
    probs = reply_probs(model, tok, prompts, gen.texts, [q.reference for q in qs], **kw)
    base = dict(zip([q.id for q in questions], baseline_probs(model, tok, [q.prompt() for q in questions],
                                                              [q.reference for q in questions], **kw)))
    rows = [{"qid": q.id, "kind": q.kind, "style": q.style, "reference": q.reference, "reply": t, "probs": p,
             "base_probs": base[q.id], "answered": p is not None, "correct": is_correct(t, q.aliases, q.value),
             "verified": exact_match(t, q.reference), "format": format_score(t), "tokens": len(ids)}
            for q, t, p, ids in zip(qs, gen.texts, probs, gen.completion_ids)]
    if cache is not None:
        files.write_json(cache, rows)
    return pd.DataFrame(rows)


def reward_columns(table):
    """Add r (mean, sequence, geometric), r' (base_*) and debiased r_hat (*_debiased) columns, and the verifier as 0/1."""
    out = table.copy()
    for how in AGGREGATIONS:
        out[how] = [aggregate(p, how) for p in out["probs"]]
        out[f"base_{how}"] = [aggregate(p, how) for p in out["base_probs"]]
        out[f"{how}_debiased"] = debias(out[how], out[f"base_{how}"])
    out["verifier"] = out["verified"].astype(float)
    return out


def paired_difference(a, b, n_boot: int = 2000, seed: int = 0) -> dict:
    """Mean of a - b over paired 0/1 outcomes (same questions) with a bootstrap 95% interval."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    rng = np.random.default_rng(seed)
    draws = d[rng.integers(0, len(d), (n_boot, len(d)))].mean(1)
    return {"difference": float(d.mean()), "ci95": np.percentile(draws, [2.5, 97.5]).tolist()}


# ---- the adaptive std filter and the filtered GRPO loop -------------------------------------------

class StdFilter:
    """Keep prompts whose group reward std >= beta * EMA of the per-step mean group std.

    Steps [warmup_start, warmup_end) (0-based) are only observed; the EMA starts at their mean, then
    ema = (1 - ratio) * step_std + ratio * ema after each step (the threshold of a step uses the EMA before it)."""

    def __init__(self, beta: float = 0.5, ratio: float = 0.99, warmup_start: int = 5, warmup_end: int = 10):
        config.check_range("beta", beta, 0.0, 10.0)
        config.check_range("ratio", ratio, 0.0, 1.0)
        config.check_int("warmup_start", warmup_start, minimum=0)
        config.check_int("warmup_end", warmup_end, minimum=warmup_start + 1)
        self.beta, self.ratio, self.warmup = beta, ratio, (warmup_start, warmup_end)
        self.ema, self.seen = None, []

    @property
    def threshold(self):
        return None if self.ema is None else self.beta * self.ema

    def keep(self, stds):
        """Boolean mask of the prompts to keep (all of them before the EMA exists)."""
        stds = np.asarray(stds, dtype=np.float64)
        return np.ones(len(stds), dtype=bool) if self.ema is None else stds >= self.threshold

    def observe(self, step: int, step_std: float) -> None:
        """Feed one step's mean group std."""
        if self.ema is None:
            if self.warmup[0] <= step < self.warmup[1]:
                self.seen.append(float(step_std))
            if step >= self.warmup[1] - 1 and self.seen:
                self.ema = float(np.mean(self.seen))
        else:
            self.ema = (1 - self.ratio) * float(step_std) + self.ratio * self.ema

    def state(self) -> dict:
        return {"ema": self.ema, "seen": list(self.seen)}

    def load(self, state: dict) -> None:
        self.ema, self.seen = state.get("ema"), list(state.get("seen", []))


def _select(batch, rows):
    idx = torch.as_tensor(rows, dtype=torch.long)
    return {k: (v[idx] if torch.is_tensor(v) else [v[i] for i in rows] if isinstance(v, list) else v) for k, v in batch.items()}


def _merge(batches, pad_id: int):
    """Concatenate rollout batches, re-padding prompts on the left and completions on the right."""
    if len(batches) == 1:
        return batches[0]
    P = max(b["prompt_ids"].shape[1] for b in batches)
    T = max(b["completion_ids"].shape[1] for b in batches)
    lpad = lambda x, v: torch.nn.functional.pad(x, (P - x.shape[1], 0), value=v)  # noqa: E731
    rpad = lambda x, v: torch.nn.functional.pad(x, (0, T - x.shape[1]), value=v)  # noqa: E731
    out = {"prompt_ids": torch.cat([lpad(b["prompt_ids"], pad_id) for b in batches]),
           "prompt_mask": torch.cat([lpad(b["prompt_mask"], 0) for b in batches]),
           "completion_ids": torch.cat([rpad(b["completion_ids"], pad_id) for b in batches]),
           "completion_mask": torch.cat([rpad(b["completion_mask"], 0) for b in batches])}
    for k in ("rewards", "advantages", "zero_std"):
        out[k] = torch.cat([b[k] for b in batches])
    for k in ("old_logps", "ref_logps"):
        out[k] = None if batches[0][k] is None else torch.cat([rpad(b[k], 0.0) for b in batches])
    out["completions"] = [c for b in batches for c in b["completions"]]
    return out


def train(trainer, pool, num_steps: int, batch_prompts: int, folder=None, std_filter: StdFilter = None,
          max_rollouts: int = 2, progress: bool = True) -> list:
    """GRPO steps on questions drawn from pool; with a std filter, low-std prompts are dropped and the batch refilled
    from up to max_rollouts rollouts. Resumes from folder's checkpoint. Returns one row per step."""
    config.check_int("num_steps", num_steps)
    config.check_int("batch_prompts", batch_prompts)
    config.check_int("max_rollouts", max_rollouts)
    G, seed = trainer.cfg.num_generations, trainer.cfg.seed
    start = 0
    if folder is not None:
        state = folder.restore(trainer.model, trainer.optimizer)
        if folder.done:
            return folder.rows()
        start = state["step"]
        if std_filter is not None and state["extra"].get("filter"):
            std_filter.load(state["extra"]["filter"])
    rows = folder.rows() if folder is not None else []
    for step in tqdm(range(start, num_steps), initial=start, total=num_steps, desc="rlpr", disable=not progress):
        threshold, kept, stds, rewards, correct, raw = (std_filter.threshold if std_filter else None), [], [], [], [], []
        trainer.timer.seconds.clear()
        for attempt in range(max_rollouts if std_filter else 1):
            rng = random.Random(f"{seed}-{step}-{attempt}")
            qs = rng.sample(pool, batch_prompts)
            torch.manual_seed(seed * 1_000_003 + step * 101 + attempt)
            batch = trainer.rollout([q.prompt() for q in qs], [q.meta() for q in qs])
            s = batch["rewards"].view(-1, G).std(1).numpy()
            keep = std_filter.keep(s) if std_filter else np.ones(len(s), dtype=bool)
            stds += s.tolist()
            rewards += batch["rewards"].tolist()
            last = getattr(trainer.reward_fn, "last", {})
            correct += last.get("correct", [])
            raw += last.get("r", [])
            if keep.any():
                kept.append(_select(batch, [g * G + j for g in np.flatnonzero(keep) for j in range(G)]))
            if sum(len(b["rewards"]) for b in kept) >= batch_prompts * G:
                break
        stats = {}
        if kept:
            merged = _merge(kept, trainer.tok.pad_token_id)
            merged = _select(merged, list(range(min(len(merged["rewards"]), batch_prompts * G))))
            stats = {**trainer.update(merged), "update_std_mean": float(merged["rewards"].view(-1, G).std(1).mean())}
        if std_filter is not None:
            std_filter.observe(step, float(np.mean(stds)))
        n_kept = sum(len(b["rewards"]) for b in kept) // G
        row = {"step": step, "reward_mean": float(np.mean(rewards)), "group_std_mean": float(np.mean(stds)),
               "train_correct": float(np.mean(correct)) if correct else None, "r_mean": float(np.mean(raw)) if raw else None,
               "threshold": threshold, "ema": std_filter.ema if std_filter else None, "rollouts": attempt + 1,
               "fraction_filtered": 1 - n_kept / len(stds), "prompts_updated": min(n_kept, batch_prompts), **stats,
               "wall_s": sum(trainer.timer.seconds.values())}
        rows.append(row)
        if folder is not None:
            folder.log(row)
            if (trainer.cfg.save_every and (step + 1) % trainer.cfg.save_every == 0) or step + 1 == num_steps:
                folder.save(step + 1, trainer.model, trainer.optimizer, extra={"filter": std_filter.state() if std_filter else None})
    if folder is not None:
        folder.mark_done({"steps": num_steps, "config": asdict(trainer.cfg)})
    return rows


def evaluate(model, tok, questions, max_new_tokens: int = 48, batch_size: int = 16, seed: int = 0):
    """Greedy replies to the questions, scored by the lenient oracle, the exact-match verifier and the format term."""
    import pandas as pd

    gen = models.generate(model, tok, [q.prompt() for q in questions], max_new_tokens=max_new_tokens,
                          temperature=0.0, seed=seed, batch_size=batch_size)
    return pd.DataFrame([{"qid": q.id, "kind": q.kind, "style": q.style, "reply": t,
                          "correct": is_correct(t, q.aliases, q.value), "verified": exact_match(t, q.reference),
                          "format": format_score(t)} for q, t in zip(questions, gen.texts)])


# variant -> (reward kind, debiased, std filter)
VARIANTS = {"rlpr": ("probability", True, True), "rlvr": ("verifier", False, False),
            "rlpr_no_debias": ("probability", False, True), "rlpr_no_filter": ("probability", True, False)}


def run_variant(name: str, pool, heldout, baseline: dict, cfg, steps: int, batch_prompts: int, cache_dir,
                model_name: str = "smollm2-135m-instruct", format_weight: float = 0.1, beta: float = 0.5,
                ema_ratio: float = 0.99, warmup=(0, 2), max_rollouts: int = 2, lora_r: int = 16,
                eval_tokens: int = 48, batch_size: int = 16, progress: bool = True):
    """Train one variant (VARIANTS) with LoRA GRPO from the base model, then answer the held-out questions greedily.
    Cached under cache_dir keyed by every setting; returns (step rows, held-out table)."""
    import pandas as pd

    from . import files, grpo

    config.check_choice("variant", name, tuple(VARIANTS))
    kind, debiased, filtered = VARIANTS[name]
    key = {"variant": name, "grpo": asdict(cfg), "steps": steps, "batch_prompts": batch_prompts, "model": model_name,
           "format_weight": format_weight, "beta": beta, "ema_ratio": ema_ratio, "warmup": list(warmup),
           "max_rollouts": max_rollouts, "lora_r": lora_r, "pool": [q.id for q in pool],
           "heldout": [q.id for q in heldout], "eval_tokens": eval_tokens}
    folder = training.RunFolder.keyed(cache_dir, name, key)
    model, tok = models.load_model(model_name)
    model = models.add_lora(model, r=lora_r, alpha=2 * lora_r)
    reward = Reward(model, tok, kind, baseline=baseline if debiased else None, format_weight=format_weight,
                    temperature=cfg.temperature, batch_size=batch_size, system=cfg.system)
    trainer = grpo.GRPOTrainer(model, tok, reward, cfg)
    filt = StdFilter(beta, ema_ratio, warmup_start=warmup[0], warmup_end=warmup[1]) if filtered else None
    rows = train(trainer, pool, steps, batch_prompts, folder, filt, max_rollouts, progress)
    path = folder.path / "heldout.json"
    if path.is_file():
        return rows, pd.DataFrame(files.read_json(path))
    table = evaluate(trainer.model, tok, heldout, eval_tokens, batch_size, seed=cfg.seed)
    files.write_json(path, table.to_dict("records"))
    return rows, table
