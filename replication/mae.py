"""Multi-Agent Evolve: one LoRA model as Proposer, Solver and Judge, trained jointly (Task-Relative REINFORCE++).

Rules follow the authors' code: judge scores are read from `<score>X</score>` (fraction, then float, then
integer; else the last number in the reply), normalised (s - 1) / 9 and clipped to [0, 1], 0.5 if nothing
parses. Proposer reward (quality + difficulty + format) / 3, the difficulty term dropped below the quality
threshold; solver 0.5 judge + 0.5 format; judge format only. Advantages are whitened within each role's batch,
then one update is taken over the three batches together. Adaptations for a 135M model: the proposer's reply
starts with an opened `<question>` tag (format = the model closes it); unless `strict_tags`, an unclosed
proposal whose first sentence ends in "?" is still judged (format 0), otherwise it gets reward 0 as in the paper;
the solver is asked to end with "The answer is N." and its format is that phrase or an `<answer>` tag
(`tasks.has_format`), since the model never writes the tag.
"""
import random
import re
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
import torch

from . import config, grpo, models, stats, tasks, training

QUALITY_THRESHOLD = 0.7
QUESTION_PREFILL = "<question>"
EXAMPLE = "Tom has 5 pencils. Tom gets 2 more pencils. How many pencils does Tom have now?"
PROPOSE_SCRATCH = ("You write math word problems. Write one new problem with a single number as its answer, inside "
                   f"question tags.\nExample of the format:\n<question>{EXAMPLE}</question>\n\n"
                   "Now write a new problem in the same format.")
PROPOSE_REFERENCE = ("You write math word problems. Here is a reference problem:\n{reference}\n\nWrite one new problem, "
                     "similar but different, inside question tags.\nExample of the format:\n"
                     f"<question>{EXAMPLE}</question>\n\nNow write the new problem in the same format.")
SOLVE = "{question}\n" + tasks.INSTRUCTION
JUDGE_ANSWER = ("Grade this answer to a math problem.\nProblem: {question}\nAnswer: {answer}\n"
                "Scoring rules: an answer with any factual, logical or arithmetic error gets 1-3; a correct answer "
                "with minor flaws gets 4-7; a fully correct, clear answer gets 8-10.\nExplain in one sentence, then "
                "give the score inside score tags.\nExample of the format: The sum is right. <score>9</score>")
JUDGE_QUESTION = ("Rate this math problem.\nProblem: {question}\nScoring rules: an unsolvable or self-contradictory "
                  "problem gets 1-3; an ambiguous but mostly reasonable problem gets 4-7; a clear, well-posed, solvable "
                  "problem gets 8-10.\nExplain in one sentence, then give the score inside score tags.\n"
                  "Example of the format: The problem is clear. <score>9</score>")

_SCORE = re.compile(r"<score>(.*?)</score>", re.IGNORECASE | re.DOTALL)
_FRACTION = re.compile(r"(-?\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)")
_FLOAT = re.compile(r"-?\d+\.\d+")
_INT = re.compile(r"-?\d+")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def read_score(text: str):
    """(raw score, source): from the score tag (fraction a/b read as 10 a / b, then float, then integer),
    else the last number in the text ('fallback'); (None, 'none') if there is no number."""
    m = _SCORE.search(text or "")
    if m:
        s = m.group(1)
        f = _FRACTION.search(s)
        if f and float(f.group(2)) != 0:
            return 10 * float(f.group(1)) / float(f.group(2)), "tag"
        for pattern in (_FLOAT, _INT):
            x = pattern.search(s)
            if x:
                return float(x.group(0)), "tag"
    numbers = _NUMBER.findall(text or "")
    return (float(numbers[-1]), "fallback") if numbers else (None, "none")


def normalise(raw) -> float:
    """(s - 1) / 9 clipped to [0, 1]; 0.5 when nothing parsed."""
    return 0.5 if raw is None else float(np.clip((raw - 1) / 9, 0.0, 1.0))


def parse_score(text: str) -> float:
    """The judge's normalised score in [0, 1] by the authors' rules."""
    return normalise(read_score(text)[0])


def has_tag(text: str, tag: str) -> bool:
    """True when the text holds a non-empty <tag>...</tag>."""
    m = re.search(rf"<{tag}>(.*?)</{tag}>", text or "", re.IGNORECASE | re.DOTALL)
    return bool(m and m.group(1).strip())


def extract_question(completion: str, strict: bool = False):
    """(question or None, closed tag?) from a proposer reply that starts after the opened <question> tag."""
    full = QUESTION_PREFILL + (completion or "")
    m = re.search(r"<question>(.*?)</question>", full, re.IGNORECASE | re.DOTALL)
    if m and m.group(1).strip():
        return m.group(1).strip(), True
    if strict:
        return None, False
    m = re.match(r"\s*([^?<\n]{10,400}\?)", completion or "")
    return (m.group(1).strip(), False) if m else (None, False)


def proposer_reward(quality: float, difficulty: float, formatted: bool, valid: bool = True,
                    threshold: float = QUALITY_THRESHOLD) -> float:
    """(quality + difficulty + format) / 3; no difficulty term below the threshold; 0 without a question."""
    if not valid:
        return 0.0
    return (quality + (difficulty if quality >= threshold else 0.0) + float(formatted)) / 3


def difficulty(solver_scores) -> float:
    """1 - mean judged solver score of a question."""
    return 1.0 - float(np.mean(solver_scores))


def solver_reward(judge_score: float, formatted: bool) -> float:
    """0.5 judge score + 0.5 answer format."""
    return 0.5 * judge_score + 0.5 * float(formatted)


def judge_reward(text: str) -> float:
    """Format only: 1 when the judgment holds a score tag."""
    return float(has_tag(text, "score"))


def passes_filter(quality: float, threshold: float = QUALITY_THRESHOLD) -> bool:
    """The quality filter: normalised quality >= threshold enters the pool."""
    return quality >= threshold


def role_advantages(rewards, masks, roles) -> list:
    """Task-Relative REINFORCE++: per-chunk (B, T) advantages, whitened within each role over all its chunks."""
    T = max(m.shape[1] for m in masks)
    pad = lambda m: torch.nn.functional.pad(m.float(), (0, T - m.shape[1]))  # noqa: E731
    labels = [r for r, m in zip(roles, masks) for _ in range(len(m))]
    adv = grpo.reinforce_pp_advantages(torch.cat([torch.as_tensor(r, dtype=torch.float32) for r in rewards]),
                                       torch.cat([pad(m) for m in masks]), labels)
    flat = torch.cat([torch.as_tensor(r, dtype=torch.float32) for r in rewards])
    for role in set(labels):  # a role with equal rewards has zero advantage (exactly, not up to rounding)
        idx = torch.tensor([j for j, x in enumerate(labels) if x == role])
        if torch.all(flat[idx] == flat[idx[0]]):
            adv[idx] = 0.0
    out, i = [], 0
    for m in masks:
        out.append(adv[i:i + len(m), :m.shape[1]])
        i += len(m)
    return out


@dataclass
class MAEConfig:
    """Settings of one Multi-Agent Evolve run; `validate()` names any bad value."""

    iterations: int = 6
    proposals: int = 6          # proposer samples per iteration
    n_solve: int = 2            # solver answers per question (the release script uses 5)
    pool_solve: int = 3         # pool questions solved per iteration (>= 1), besides the new ones
    question_tokens: int = 40
    answer_tokens: int = 48
    judge_tokens: int = 40
    temperature: float = 1.0
    lr: float = 2e-5
    lora_r: int = 8
    max_grad_norm: float = 1.0
    reference_ratio: float = 0.5  # 0 = zero reference, 0.5 = half reference
    quality_threshold: float = QUALITY_THRESHOLD
    use_filter: bool = True
    strict_tags: bool = False
    seed: int = 0

    def validate(self) -> "MAEConfig":
        for name in ("iterations", "proposals", "n_solve", "question_tokens", "answer_tokens", "judge_tokens", "lora_r"):
            config.check_int(name, getattr(self, name))
        config.check_int("pool_solve", self.pool_solve)
        config.check_int("seed", self.seed, minimum=0)
        config.check_range("reference_ratio", self.reference_ratio, 0.0, 1.0)
        config.check_range("quality_threshold", self.quality_threshold, 0.0, 1.0)
        config.check_range("temperature", self.temperature, 1e-6, 10.0)
        config.check_range("lr", self.lr, 0.0, 1.0)
        return self


class QuestionPool:
    """Questions the loop may reference or solve: the seeds (with known answers) and accepted proposals."""

    def __init__(self, items=None):
        self.items = list(items or [])

    @classmethod
    def from_problems(cls, problems):
        return cls({"question": p.question, "answer": p.answer, "source": "seed", "iteration": -1, "quality": None}
                   for p in problems)

    def add(self, question: str, quality: float, iteration: int) -> None:
        self.items.append({"question": question, "answer": None, "source": "proposed", "iteration": iteration,
                           "quality": quality})

    def sample(self, rng: random.Random, k: int) -> list:
        return [rng.choice(self.items) for _ in range(k)] if self.items else []

    def __len__(self):
        return len(self.items)


def new_adapter(model, name: str, cfg: MAEConfig):
    """A fresh LoRA adapter (seeded), made the active and only trainable one."""
    torch.manual_seed(cfg.seed)
    model = models.add_lora(model, r=cfg.lora_r, alpha=2 * cfg.lora_r, adapter_name=name)
    model.set_adapter(name)
    return model


def _generate(model, tok, prompts, max_new_tokens, temperature, prefill=""):
    """One sampled completion per prompt: the id tensors and the decoded texts."""
    texts = [t + prefill for t in models.chat_prompts(tok, prompts)]
    p_ids, p_mask, c_ids, c_mask = models.sample(model, tok, texts, max_new_tokens, temperature)
    decoded = [tok.decode(ids[m.bool()], skip_special_tokens=True) for ids, m in zip(c_ids, c_mask)]
    return {"ids": (p_ids, p_mask, c_ids, c_mask), "texts": decoded}


def iteration(model, tok, optimizer, pool: QuestionPool, cfg: MAEConfig, it: int, timer=None) -> dict:
    """One loop step: propose, judge questions, filter into the pool, solve, judge answers, one joint update."""
    torch.manual_seed(cfg.seed * 1_000_003 + it)
    rng = random.Random(f"{cfg.seed}-{it}")
    timer = timer or training.Timer()
    model.eval()
    with timer("generation"):
        refs = [pool.sample(rng, 1)[0]["question"] if rng.random() < cfg.reference_ratio and len(pool) else None
                for _ in range(cfg.proposals)]
        prompts = [PROPOSE_REFERENCE.format(reference=r) if r else PROPOSE_SCRATCH for r in refs]
        prop = _generate(model, tok, prompts, cfg.question_tokens, cfg.temperature, QUESTION_PREFILL)
        parsed = [extract_question(t, cfg.strict_tags) for t in prop["texts"]]
        valid = [i for i, (q, _) in enumerate(parsed) if q]
        qjudge = _generate(model, tok, [JUDGE_QUESTION.format(question=parsed[i][0]) for i in valid],
                           cfg.judge_tokens, cfg.temperature) if valid else None
        quality = {i: parse_score(t) for i, t in zip(valid, qjudge["texts"] if valid else [])}
        accepted = [i for i in valid if passes_filter(quality[i], cfg.quality_threshold) or not cfg.use_filter]
        for i in accepted:
            pool.add(parsed[i][0], quality[i], it)
        picked = pool.sample(rng, cfg.pool_solve)
        to_solve = [(parsed[i][0], None, i) for i in valid] + [(p["question"], p["answer"], None) for p in picked]
        to_solve = [x for x in to_solve for _ in range(cfg.n_solve)]
        sol = _generate(model, tok, [SOLVE.format(question=q) for q, _, _ in to_solve], cfg.answer_tokens, cfg.temperature)
        ajudge = _generate(model, tok, [JUDGE_ANSWER.format(question=q, answer=a) for (q, _, _), a in
                                        zip(to_solve, sol["texts"])], cfg.judge_tokens, cfg.temperature)
    a_scores = [parse_score(t) for t in ajudge["texts"]]
    s_format = [tasks.has_format(t) for t in sol["texts"]]
    diff = {i: difficulty([s for (_, _, j), s in zip(to_solve, a_scores) if j == i]) for i in valid}
    p_rewards = [proposer_reward(quality.get(i, 0.0), diff.get(i, 0.0), parsed[i][1], i in quality, cfg.quality_threshold)
                 for i in range(cfg.proposals)]
    s_rewards = [solver_reward(s, f) for s, f in zip(a_scores, s_format)]
    judged = (qjudge["texts"] if valid else []) + ajudge["texts"]
    chunks = [("proposer", prop, p_rewards), ("solver", sol, s_rewards), ("judge", ajudge, [judge_reward(t) for t in ajudge["texts"]])]
    if valid:
        chunks.append(("judge", qjudge, [judge_reward(t) for t in qjudge["texts"]]))
    with timer("backward"):
        update = joint_update(model, optimizer, chunks, cfg)
    verified = [{"iteration": it, "score": s, "correct": tasks.verify(t, ans)}
                for (_, ans, _), t, s in zip(to_solve, sol["texts"], a_scores) if ans is not None]
    sources = [read_score(t)[1] for t in judged]
    proposals = [{"iteration": it, "mode": "reference" if refs[i] else "scratch", "reply": prop["texts"][i][:300],
                  "question": parsed[i][0], "closed_tag": parsed[i][1], "quality": quality.get(i),
                  "difficulty": diff.get(i), "accepted": i in accepted, "reward": p_rewards[i]} for i in range(cfg.proposals)]
    mean = lambda xs: float(np.mean(xs)) if len(xs) else float("nan")  # noqa: E731
    row = {"iteration": it, "pool_size": len(pool), "accepted": len(accepted), "filtered": len(valid) - len(accepted),
           "no_question": cfg.proposals - len(valid), "proposer_reward": mean(p_rewards),
           "proposer_quality": mean(list(quality.values())), "proposer_difficulty": mean(list(diff.values())),
           "proposer_format": mean([q[1] for q in parsed]), "solver_reward": mean(s_rewards),
           "solver_judge": mean(a_scores), "solver_format": mean(s_format), "judge_format": mean([judge_reward(t) for t in judged]),
           "judge_fallback": mean([s == "fallback" for s in sources]), "judge_unparsed": mean([s == "none" for s in sources]),
           "seed_accuracy": mean([v["correct"] for v in verified]), **update,
           **{f"{k}_s": v for k, v in timer.seconds.items()}}
    return {"row": row, "proposals": proposals, "verified": verified}


def joint_update(model, optimizer, chunks, cfg: MAEConfig) -> dict:
    """Whiten per role, then one optimizer step on the token-mean loss over all roles' sequences together."""
    masks = [c[1]["ids"][3] for c in chunks]
    advs = role_advantages([c[2] for c in chunks], masks, [c[0] for c in chunks])
    total = float(sum(m.sum() for m in masks))
    model.train()
    loss_sum = 0.0
    for (_, gen, _), adv, mask in zip(chunks, advs, masks):
        rows = adv.abs().sum(1) > 0  # rows with zero advantage add nothing to the gradient: skip their pass
        if not rows.any():
            continue
        p_ids, p_mask, c_ids, c_mask, adv = (x[rows] for x in (*gen["ids"], adv))
        logps = training.completion_logps(model, p_ids, p_mask, c_ids, c_mask, cfg.temperature)
        loss, _ = grpo.grpo_loss(logps, logps.detach(), None, adv, c_mask, beta=0.0, loss_type="bnpo")
        loss = loss * float(c_mask.sum()) / total  # token mean over every role's tokens
        loss.backward()
        loss_sum += float(loss.detach())
    norm = training.optimizer_step(model, optimizer, cfg.max_grad_norm)
    model.eval()
    return {"loss": loss_sum, "grad_norm": norm, "tokens": int(total)}


def run_loop(model, tok, seeds, cfg: MAEConfig, folder: "training.RunFolder" = None, progress: bool = True) -> dict:
    """cfg.iterations loop steps on the active adapter from a seed pool; resumes from and caches in folder."""
    from tqdm.auto import tqdm

    cfg.validate()
    optimizer = torch.optim.AdamW(list(training.trainable(model).values()), lr=cfg.lr, weight_decay=0.0)
    state = {"rows": [], "proposals": [], "verified": [], "pool": QuestionPool.from_problems(seeds).items}
    if folder is not None:
        restored = folder.restore(model, optimizer)
        state = restored["extra"] or state
        if folder.done:
            return state
    pool = QuestionPool(state["pool"])
    for it in tqdm(range(len(state["rows"]), cfg.iterations), desc="mae", disable=not progress):
        out = iteration(model, tok, optimizer, pool, cfg, it)
        state["rows"].append(out["row"])
        state["proposals"] += out["proposals"]
        state["verified"] += out["verified"]
        state["pool"] = pool.items
        if folder is not None:
            old = folder.latest()
            folder.save(it + 1, model, optimizer, extra=state)
            if old is not None and old != folder.latest():
                old.unlink()
    if folder is not None:
        folder.mark_done({"iterations": cfg.iterations, "config": asdict(cfg)})
    return state


def run_arm(model, tok, name: str, seeds, cfg: MAEConfig, cache_dir, key=None, progress: bool = True):
    """Train a fresh adapter `name` with the loop, cached under cache_dir keyed by the config: (model, state)."""
    model = new_adapter(model, name, cfg)
    folder = training.RunFolder.keyed(cache_dir, f"loop-{name}", {**(key or {}), "seeds": [p.id for p in seeds], **asdict(cfg)})
    return model, run_loop(model, tok, seeds, cfg, folder, progress)


def solve_eval(model, tok, problems, max_new_tokens: int = 48, batch_size: int = 16, seed: int = 0) -> pd.DataFrame:
    """Greedy solver replies to held-out problems (solver prompt), checked by the exact verifier."""
    gen = models.generate(model, tok, [SOLVE.format(question=p.question) for p in problems], max_new_tokens=max_new_tokens,
                          seed=seed, batch_size=batch_size)
    return pd.DataFrame([{"id": p.id, "question": p.question, "answer": p.answer, "reply": t,
                          "correct": tasks.verify(t, p.answer), "correct_strict": tasks.verify(t, p.answer, strict=True),
                          "format": tasks.has_format(t)} for p, t in zip(problems, gen.texts)])


def judge_eval(model, tok, frame: pd.DataFrame, max_new_tokens: int = 40, batch_size: int = 16, seed: int = 0) -> pd.DataFrame:
    """The judge (sampled as in training) scores each (question, reply) of a solve_eval frame."""
    prompts = [JUDGE_ANSWER.format(question=q, answer=a) for q, a in zip(frame["question"], frame["reply"])]
    gen = models.generate(model, tok, prompts, max_new_tokens=max_new_tokens, temperature=1.0, seed=seed, batch_size=batch_size)
    raw = [read_score(t) for t in gen.texts]
    return frame.assign(judgment=gen.texts, raw_score=[r[0] for r in raw], parse=[r[1] for r in raw],
                        score=[normalise(r[0]) for r in raw])


def agreement(scores, correct, cut: float = 1 / 3) -> dict:
    """How well judge scores track the verifier: agreement of (score >= cut, i.e. raw >= 4) with correctness
    and its Wilson CI, the majority-class baseline, and the AUC (Mann-Whitney U / n1 n0)."""
    from scipy.stats import mannwhitneyu

    s, c = np.asarray(scores, float), np.asarray(correct, bool)
    k = int(np.sum((s >= cut) == c))
    p, lo, hi = stats.proportion_ci(k, len(s))
    auc = float(mannwhitneyu(s[c], s[~c]).statistic / (c.sum() * (~c).sum())) if 0 < c.sum() < len(c) else float("nan")
    return {"n": len(s), "agreement": p, "ci95": [lo, hi], "majority_baseline": float(max(c.mean(), 1 - c.mean())),
            "says_correct_rate": float(np.mean(s >= cut)), "auc": auc}


def paired_change(before, after) -> dict:
    """Exact McNemar test on paired 0/1 outcomes (binomial test on the discordant pairs)."""
    from scipy.stats import binomtest

    b, a = np.asarray(before, bool), np.asarray(after, bool)
    gained, lost = int(np.sum(~b & a)), int(np.sum(b & ~a))
    p = binomtest(gained, gained + lost, 0.5).pvalue if gained + lost else 1.0
    return {"gained": gained, "lost": lost, "change": float(a.mean() - b.mean()), "p_value": float(p)}


def cached_frame(path, make) -> pd.DataFrame:
    """A DataFrame cached as JSON records at path (written atomically), made by make() when absent."""
    from . import files

    if path.is_file():
        return pd.DataFrame(files.read_json(path))
    frame = make()
    files.write_json(path, frame.to_dict("records"))
    return frame
