"""Multi-Agent Evolve: one LoRA model as Proposer, Solver and Judge, trained jointly (Task-Relative REINFORCE++).

Rules follow the authors' code: judge scores are read from `<score>X</score>` by one of the rules of
`mae_scores` (`MAEConfig.score_rule`; by default `self_judge`, the authors' rule for the trained model as judge:
the tag only, normalised (s - 1) / 9 and clipped to [0, 1]; an untagged reply gives no score, 0.5 as a reward,
left out of a question's mean difficulty; mae_scores names the sources). Proposer reward (quality + difficulty
+ format) / 3, the difficulty term dropped below the quality threshold; solver 0.5 judge + 0.5 format; judge
format only. Advantages are whitened within each role's batch, then one update is taken over the three batches
together. Adaptations for a 135M model: the proposer's reply starts with an opened `<question>` tag (format =
the model closes it), and the judge's with an opened `<score>` tag (its reply is read, and its format reward given,
on the prefill plus what it wrote, so format = a number then the closing tag); unless `strict_tags`, an unclosed proposal whose first sentence ends in "?" is still judged
(format 0), otherwise it gets reward 0 as in the paper; the solver is asked to end with "The answer is N." and its
format is that phrase or an `<answer>` tag (`tasks.has_format`), since the model never writes the tag; the solver's
prompt may lead with worked examples (`shots`, as the RLVR yardstick's). `judge="verifier"` is the control arm: answers
to questions with a known answer are judged by the exact verifier (1 or 0), answers to proposed questions (answer
unknown) get no score (the authors' neutral 0.5), and questions are still rated by the model's judge. `judge="likelihood"`
judges every answer by the base model's likelihood of it (mae_likelihood: frozen, no reference, no prompt), questions as above.
"""
import random
import re
from dataclasses import asdict, dataclass, fields
from typing import Optional

import numpy as np
import torch

from replication.core import config
from replication.lm import grpo, loop, models, tasks, training
from . import mae_likelihood, mae_scores

QUALITY_THRESHOLD = 0.7
AGREEMENT_CUT = 1 / 3  # normalised score of a raw 4 of 10: the rubric's line between a wrong and a correct answer
QUESTION_PREFILL = "<question>"
SCORE_PREFILL = "<score>"  # the judge's turn starts with the opened score tag, so its next tokens are the score
JUDGES = ("self", "verifier", "likelihood")
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
                "with minor flaws gets 4-7; a fully correct, clear answer gets 8-10.\nGive the score inside score tags, "
                "then explain in one sentence.\nExample of the format: <score>9</score> The sum is right.")
JUDGE_QUESTION = ("Rate this math problem.\nProblem: {question}\nScoring rules: an unsolvable or self-contradictory "
                  "problem gets 1-3; an ambiguous but mostly reasonable problem gets 4-7; a clear, well-posed, solvable "
                  "problem gets 8-10.\nGive the score inside score tags, then explain in one sentence.\n"
                  "Example of the format: <score>9</score> The problem is clear.")

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
    return (quality + (difficulty if quality >= threshold else 0.0) + float(formatted)) / 3 if valid else 0.0


def difficulty(solver_scores) -> float:
    """1 - mean judged solver score of a question, over the judgments that gave a score (None skipped; 0.5 if none
    did), as the authors average a question's judgments (mae_scores.mean_score)."""
    return 1.0 - mae_scores.mean_score(solver_scores)


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
    flat = torch.cat([torch.as_tensor(r, dtype=torch.float32, device=masks[0].device) for r in rewards])
    adv = grpo.reinforce_pp_advantages(flat, torch.cat([pad(m) for m in masks]), labels)
    for role in set(labels):  # a role with equal rewards has zero advantage (exactly, not up to rounding)
        idx = torch.tensor([j for j, x in enumerate(labels) if x == role])
        if torch.all(flat[idx] == flat[idx[0]]):
            adv[idx] = 0.0
    return [a[:, :m.shape[1]] for a, m in zip(torch.split(adv, [len(m) for m in masks]), masks)]


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
    micro_batch: int = 8        # rows per forward/backward pass of the update (memory, not the result)
    reference_ratio: float = 0.5  # 0 = zero reference, 0.5 = half reference
    quality_threshold: float = QUALITY_THRESHOLD
    use_filter: bool = True
    strict_tags: bool = False
    score_rule: str = "self_judge"  # how judge replies are read (mae_scores.SCORE_RULES)
    judge: str = "self"         # who judges answers: the model prompted ("self"), the exact verifier ("verifier"), or
                                # the base model's likelihood of the reply ("likelihood", mae_likelihood)
    seed_level: str = "1d-1step-add"  # the level of the solver's worked examples
    shots: int = 0              # worked examples before each solver question (chat turns)
    seed: int = 0
    shots_seed: Optional[int] = None  # the seed that draws the worked examples (None: seed); a notebook's training
                                      # seeds keep the notebook's, so every seed is trained on the evaluated prompt

    @classmethod
    def from_params(cls, params, **changes) -> "MAEConfig":
        """The loop settings from a notebook's parameters (fields of the same name), with changes."""
        names = {f.name for f in fields(cls)}
        return cls(**{**{k: v for k, v in vars(params).items() if k in names}, **changes}).validate()

    def validate(self) -> "MAEConfig":
        for name in ("iterations", "proposals", "n_solve", "pool_solve", "question_tokens", "answer_tokens",
                     "judge_tokens", "lora_r", "micro_batch"):
            config.check_int(name, getattr(self, name))
        config.check_int("seed", self.seed, minimum=0)
        config.check_int("shots", self.shots, minimum=0)
        if self.shots_seed is not None:
            config.check_int("shots_seed", self.shots_seed, minimum=0)
        config.check_choice("judge", self.judge, JUDGES)
        config.check_choice("seed_level", self.seed_level, tuple(tasks.LEVELS))
        config.check_choice("score_rule", self.score_rule, mae_scores.SCORE_RULES)
        for name, low, high in (("reference_ratio", 0.0, 1.0), ("quality_threshold", 0.0, 1.0),
                                ("temperature", 1e-6, 10.0), ("lr", 0.0, 1.0)):
            config.check_range(name, getattr(self, name), low, high)
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


def _generate(model, tok, prompts, max_new_tokens, temperature, prefill="", repeats=1):
    """`repeats` sampled completions per prompt (prompt-major, one shared prefill), each turn opened with `prefill`:
    the id tensors (the prefill is part of the prompt ids) and the decoded texts (without the prefill)."""
    texts = [t + prefill for t in models.chat_prompts(tok, prompts)]
    p_ids, p_mask, c_ids, c_mask = models.sample(model, tok, texts, max_new_tokens, temperature, repeats=repeats)
    decoded = [tok.decode(ids[m.bool()], skip_special_tokens=True) for ids, m in zip(c_ids, c_mask)]
    return {"ids": (p_ids, p_mask, c_ids, c_mask), "texts": decoded, "group": repeats}


def judge_replies(model, tok, prompts, cfg: "MAEConfig"):
    """The model's judgments: sampled with the turn opened by `<score>`; "texts" hold the prefill and what followed
    (what mae_scores reads and the format reward checks)."""
    return _judged(sampler(model, tok, cfg), prompts, cfg)


def _judged(generate, prompts, cfg: "MAEConfig"):
    gen = generate(prompts, cfg.judge_tokens, SCORE_PREFILL)
    return {**gen, "texts": [SCORE_PREFILL + t for t in gen["texts"]]}


def sampler(model, tok, cfg: "MAEConfig"):
    """The loop's generate(prompts, max_new_tokens, prefill="", repeats=1) on the model itself (_generate)."""
    return lambda prompts, tokens, prefill="", repeats=1: _generate(model, tok, prompts, tokens, cfg.temperature, prefill,
                                                                    repeats=repeats)


def solve_prompt(question: str, shots=()):
    """The solver's prompt: the question and the answer instruction, after the worked examples as chat turns."""
    turns = [t for s in shots for t in ({"role": "user", "content": s.prompt()}, {"role": "assistant", "content": s.solution})]
    return turns + [{"role": "user", "content": SOLVE.format(question=question)}] if shots else SOLVE.format(question=question)


def pool_rng(cfg: MAEConfig, it: int, stream=()) -> random.Random:
    """The random stream of iteration `it`'s pool draws (references, then the pool questions solved)."""
    return random.Random(config.derive_seed(cfg.seed, "mae-pool", it, *stream))


def draw_references(rng: random.Random, pool: QuestionPool, cfg: MAEConfig) -> list:
    """Each proposal's reference question (with probability cfg.reference_ratio), or None (from scratch)."""
    return [pool.sample(rng, 1)[0]["question"] if rng.random() < cfg.reference_ratio and len(pool) else None
            for _ in range(cfg.proposals)]


def verifier_scores(replies, answers) -> list:
    """The verifier judge: 1.0 when a reply's answer is right (tasks.verify), 0.0 when wrong, None (no score) when
    the question's answer is unknown (a proposed question)."""
    return [None if a is None else float(tasks.verify(t, a)) for t, a in zip(replies, answers)]


def iteration(model, tok, optimizer, pool: QuestionPool, cfg: MAEConfig, it: int, timer=None) -> dict:
    """One loop step: propose, judge questions, filter into the pool, solve, judge answers, one joint update."""
    torch.manual_seed(config.derive_seed(cfg.seed, "mae-step", it))
    timer = timer or training.Timer()
    model.eval()
    score_answers = mae_likelihood.scorer(model, tok) if cfg.judge == "likelihood" else None
    out = collect(sampler(model, tok, cfg), pool, cfg, it, timer, score_answers=score_answers)
    with timer("backward"):
        update = joint_update(model, optimizer, out.pop("chunks"), cfg)
    out["row"].update({**update, **{f"{k}_s": v for k, v in timer.seconds.items()}})
    return out


def collect(generate, pool: QuestionPool, cfg: MAEConfig, it: int, timer=None, stream=(), score_answers=None) -> dict:
    """An iteration's rollouts and rewards: propose, judge questions, filter into the pool, solve, judge answers.
    generate(prompts, max_new_tokens, prefill="", repeats=1) -> {"ids", "texts", "group"} samples every role (the
    model itself, or TRL's generation in replication.scale.trl_mae); `stream` tells processes' pool draws apart;
    score_answers(questions, replies) -> scores judges the answers when cfg.judge is "likelihood".
    Returns {"chunks": [(role, generation, rewards)] for joint_update, "row", "proposals", "verified"}."""
    if cfg.judge == "likelihood" and score_answers is None:
        raise ValueError("judge='likelihood' needs score_answers (mae_likelihood.scorer of the model being trained)")
    rng = pool_rng(cfg, it, stream)
    timer = timer or training.Timer()
    shots = worked_examples(cfg)
    with timer("generation"):
        refs = draw_references(rng, pool, cfg)
        prompts = [PROPOSE_REFERENCE.format(reference=r) if r else PROPOSE_SCRATCH for r in refs]
        prop = generate(prompts, cfg.question_tokens, QUESTION_PREFILL)
        parsed = [extract_question(t, cfg.strict_tags) for t in prop["texts"]]
        valid = [i for i, (q, _) in enumerate(parsed) if q]
        # a generate that other processes wait on (TRL's under ZeRO-3 or a vLLM server) is called even with no question
        qjudge = (_judged(generate, [JUDGE_QUESTION.format(question=parsed[i][0]) for i in valid], cfg)
                  if valid or getattr(generate, "collective", False) else None)
        quality = {i: mae_scores.parse_score(t, cfg.score_rule) for i, t in zip(valid, qjudge["texts"] if valid else [])}
        accepted = [i for i in valid if passes_filter(quality[i], cfg.quality_threshold) or not cfg.use_filter]
        for i in accepted:
            pool.add(parsed[i][0], quality[i], it)
        picked = pool.sample(rng, cfg.pool_solve)
        distinct = [(parsed[i][0], None, i) for i in valid] + [(p["question"], p["answer"], None) for p in picked]
        to_solve = [x for x in distinct for _ in range(cfg.n_solve)]  # prompt-major, as sampled
        sol = generate([solve_prompt(q, shots) for q, _, _ in distinct], cfg.answer_tokens, repeats=cfg.n_solve)
        if cfg.judge == "verifier":
            ajudge, a_judged = None, verifier_scores(sol["texts"], [a for _, a, _ in to_solve])
        elif cfg.judge == "likelihood":
            ajudge, a_judged = None, score_answers([q for q, _, _ in to_solve], sol["texts"])
        else:
            ajudge = _judged(generate, [JUDGE_ANSWER.format(question=q, answer=a) for (q, _, _), a in
                                        zip(to_solve, sol["texts"])], cfg)
            a_judged = [mae_scores.score(t, cfg.score_rule) for t in ajudge["texts"]]  # None: the judgment gave no score
    a_scores = [mae_scores.mean_score([s]) for s in a_judged]
    s_format = [tasks.has_format(t) for t in sol["texts"]]
    diff = {i: difficulty([s for (_, _, j), s in zip(to_solve, a_judged) if j == i]) for i in valid}
    p_rewards = [proposer_reward(quality.get(i, 0.0), diff.get(i, 0.0), parsed[i][1], i in quality, cfg.quality_threshold)
                 for i in range(cfg.proposals)]
    s_rewards = [solver_reward(s, f) for s, f in zip(a_scores, s_format)]
    judge_gens = [g for g in (ajudge, qjudge) if g is not None]
    judged = [t for g in judge_gens for t in g["texts"]]
    chunks = [("proposer", prop, p_rewards), ("solver", sol, s_rewards)] + [("judge", g, [judge_reward(t) for t in g["texts"]])
                                                                           for g in judge_gens]
    verified = [{"iteration": it, "score": s, "judged": j is not None, "correct": tasks.verify(t, ans)}
                for (_, ans, _), t, s, j in zip(to_solve, sol["texts"], a_scores, a_judged) if ans is not None]
    sources = [mae_scores.read_score(t, cfg.score_rule)[1] for t in judged]
    proposals = [{"iteration": it, "mode": "reference" if refs[i] else "scratch", "reply": prop["texts"][i][:300],
                  "question": parsed[i][0], "closed_tag": parsed[i][1], "quality": quality.get(i),
                  "difficulty": diff.get(i), "accepted": i in accepted, "reward": p_rewards[i]} for i in range(cfg.proposals)]
    mean = lambda xs: float(np.mean(xs)) if len(xs) else float("nan")  # noqa: E731
    row = {"iteration": it, "pool_size": len(pool), "accepted": len(accepted), "filtered": len(valid) - len(accepted),
           "no_question": cfg.proposals - len(valid), "proposer_reward": mean(p_rewards),
           "proposer_quality": mean(list(quality.values())), "proposer_difficulty": mean(list(diff.values())),
           "proposer_format": mean([q[1] for q in parsed]), "solver_reward": mean(s_rewards),
           "solver_judge": mean(a_scores), "solver_format": mean(s_format),
           "solver_tokens": float(sol["ids"][3].sum()) / len(to_solve), "judgments": len(judged),
           "judge_format": mean([judge_reward(t) for t in judged]), "judge_fallback": mean([s == "fallback" for s in sources]),
           "judge_unparsed": mean([s == "none" for s in sources]), "seed_answers": len(verified),
           "seed_accuracy": mean([v["correct"] for v in verified]),
           "samples": sum(len(c[2]) for c in chunks), "solver_samples": len(to_solve)}
    return {"chunks": chunks, "row": row, "proposals": proposals, "verified": verified}


def joint_update(model, optimizer, chunks, cfg: MAEConfig) -> dict:
    """Whiten per role, then one optimizer step on the token-mean loss over all roles' sequences together, taken in
    micro-batches of about cfg.micro_batch rows (whole groups of a shared prompt, encoded once)."""
    masks = [c[1]["ids"][3] for c in chunks]
    advs = role_advantages([c[2] for c in chunks], masks, [c[0] for c in chunks])
    total = float(sum(m.sum() for m in masks))
    model.train()
    loss_sum = 0.0
    for (_, gen, _), adv, mask in zip(chunks, advs, masks):
        g = gen.get("group", 1)
        per = max(1, cfg.micro_batch // g) * g
        for start in range(0, len(mask), per):
            rows = slice(start, start + per)
            if not adv[rows].abs().sum() > 0:  # zero advantage adds nothing to the gradient: skip the pass
                continue
            p_ids, p_mask, c_ids, c_mask = (x[rows] for x in gen["ids"])
            logps = training.grouped_logps(model, p_ids, p_mask, c_ids, c_mask, g, cfg.temperature)
            loss, _ = grpo.grpo_loss(logps, logps.detach(), None, adv[rows], c_mask, kl_beta=0.0, loss_type="bnpo")
            loss = loss * float(c_mask.sum()) / total  # token mean over every role's tokens
            loss.backward()
            loss_sum += float(loss.detach())
    norm = training.optimizer_step(model, optimizer, cfg.max_grad_norm)
    model.eval()
    return {"loss": loss_sum, "grad_norm": norm, "tokens": int(total)}


def make_step(model, tok, optimizer, cfg: MAEConfig):
    """The loop's step function for `loop.run`: one iteration on the question pool, the proposals and the
    verified answers kept in the loop state (checkpointed with the weights); returns the iteration's row."""
    def step(it: int, state: dict) -> dict:
        pool = QuestionPool(state["pool"])
        out = iteration(model, tok, optimizer, pool, cfg, it)
        state["pool"] = pool.items
        state["proposals"] = state["proposals"] + out["proposals"]
        state["verified"] = state["verified"] + out["verified"]
        return out["row"]
    return step


def run_loop(model, tok, seeds, cfg: MAEConfig, folder: "loop.RunFolder" = None, progress: bool = True,
             keep: Optional[int] = 1) -> dict:
    """cfg.iterations steps on the active adapter from a seed pool, on the resumable loop (the newest `keep`
    checkpoints kept; None: every iteration's, for mae_trace). Returns {"rows": per-iteration rows, "pool",
    "proposals", "verified"}; a finished run is read back."""
    cfg.validate()
    optimizer = torch.optim.AdamW(list(loop.trainable(model).values()), lr=cfg.lr, weight_decay=0.0)
    state = {"pool": QuestionPool.from_problems(seeds).items, "proposals": [], "verified": []}
    rows, state = loop.run(make_step(model, tok, optimizer, cfg), cfg.iterations, model, optimizer, folder, state,
                           save_every=1, keep=keep, desc="mae", summary={"config": asdict(cfg)}, progress=progress,
                           postfix=lambda r: {"pool": r["pool_size"], "solver": f"{r['solver_reward']:.2f}"})
    return {"rows": rows, **state}


def worked_examples(cfg: MAEConfig) -> list:
    """The solver's worked examples: drawn with shots_seed (None: the loop's seed)."""
    return tasks.worked_examples(cfg.seed_level, cfg.shots, cfg.seed if cfg.shots_seed is None else cfg.shots_seed)


def run_key(model_name: str, seeds, cfg: MAEConfig) -> dict:
    """What identifies one arm's run: the model, the seed questions and the loop settings (shots_seed only where it
    draws other worked examples than the loop's seed would, so runs keyed before it keep their keys)."""
    settings = asdict(cfg)
    if cfg.shots_seed is None or cfg.shots_seed == cfg.seed:
        settings.pop("shots_seed")
    return {"model": model_name, "seeds": [p.id for p in seeds], **settings}


def run_arm(model, tok, name: str, seeds, cfg: MAEConfig, folder: "loop.RunFolder" = None, progress: bool = True,
            keep: Optional[int] = 1):
    """Train a fresh adapter `name` with the loop in `folder` (e.g. run.run_folder(name, run_key(...))): (model, result)."""
    model = new_adapter(model, name, cfg)
    return model, run_loop(model, tok, seeds, cfg, folder, progress, keep)
