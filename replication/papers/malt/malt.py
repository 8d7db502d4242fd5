"""MALT: generator -> verifier -> refiner chains, trajectory trees, value iteration, both poolings, sibling pairs and
SFT sets at an equal budget (the roles' training: malt_training; notebook 05's held-out protocol: malt_eval)."""
from collections import Counter
from contextlib import contextmanager, nullcontext

import numpy as np

from replication.core import config, phases
from replication.lm import models, tasks, training

ROLES = ("generator", "verifier", "refiner")
POOLINGS = ("global", "local")
THRESHOLD = 0.5   # a node is positive when its value is strictly above this (the paper's V > 0.5)


# Short replies keep trees affordable on a CPU: in a probe (with "sum" for "calculation") the 135M model was about
# as accurate with this instruction as with the task's default one, at half the reply length (notebook 05's notes).
GENERATOR_INSTRUCTION = "Write the calculation in one short sentence, then end your reply with: The answer is <number>."


def generator_prompt(question: str, shots=()):
    """G(q): the question with a short-answer instruction; after `shots` worked examples (tasks.Problem) as chat
    turns when given, each answered by its one-sentence solution ("5 + 3 = 8. The answer is 8.")."""
    ask = f"{question}\n{GENERATOR_INSTRUCTION}"
    if not shots:
        return ask
    turns = [t for s in shots for t in ({"role": "user", "content": f"{s.question}\n{GENERATOR_INSTRUCTION}"},
                                        {"role": "assistant", "content": s.solution})]
    return turns + [{"role": "user", "content": ask}]


def _turns(prompt) -> list:
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)


def verifier_prompt(question: str, g: str) -> str:
    """V(q, g): ask for a short critique of the generator's answer."""
    return (f"{question}\n\nA student wrote: \"{g}\"\n\n"
            "Is the student's final answer correct? Check it and reply in one or two sentences.")


def refiner_prompt(question: str, g: str, v: str, shots=()) -> list:
    """R(q, g, v): a conversation: the generator's prompt (worked examples included), g as the model's own first
    reply, then the critique."""
    return [*_turns(generator_prompt(question, shots)), {"role": "assistant", "content": g},
            {"role": "user", "content": f"A reviewer said: \"{v}\"\n"
                                        "Write your final answer in one short sentence, ending with: The answer is <number>."}]


def prompt_key(shots=()) -> list:
    """The three role prompts with placeholders: part of every cache key, so a prompt change resamples."""
    return [generator_prompt("{q}", shots), verifier_prompt("{q}", "{g}"), refiner_prompt("{q}", "{g}", "{v}", shots)]


@contextmanager
def use_role(model, role):
    """Run with the role's LoRA adapter active, or the base model (all adapters off) when it has none."""
    adapters = getattr(model, "peft_config", {})
    if role is not None:
        config.check_choice("role", role, ROLES)
    if role in adapters:
        model.set_adapter(role)
        yield model
    else:
        with model.disable_adapter() if adapters else nullcontext():
            yield model


def sampling_copy(model, dtype: str = "float32"):
    """None (sample from the model itself) or, for "bfloat16", a bf16 copy that each role's sampling syncs to
    (training.SamplingCopy: base + the active adapter's delta, measured faster on this CPU; the training and
    every log-prob stay in fp32, only which replies are drawn changes)."""
    import torch

    config.check_choice("rollout_dtype", dtype, ("float32", "bfloat16"))
    return training.SamplingCopy(model, torch.bfloat16) if dtype == "bfloat16" else None


def _generate(model, tok, prompts, role, max_new_tokens, temperature, seed, batch_size, repeats=1, sampler=None):
    with use_role(model, role):
        net = model if sampler is None else sampler.sync()
        return models.generate(net, tok, prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                               seed=seed, batch_size=batch_size, repeats=repeats).texts


@phases.timed("tree/chain building")
def sample_trees(model, tok, problems, n=3, tokens=(48, 32, 48), temperature=0.7, seed=0, batch_size=16,
                 trained=False, shots=(), sampler=None) -> dict:
    """One tree per problem: n generations, n critiques of each, n refinements of each (n^3 leaves), batched;
    the generator's and refiner's prompts open with the worked examples `shots`."""
    config.check_int("n", n)
    if len(tokens) != 3:
        raise ValueError(f"tokens={tokens!r} is not allowed; give max new tokens for (generator, verifier, refiner)")
    role = (lambda r: r) if trained else (lambda r: None)
    Q, qs = len(problems), [p.question for p in problems]
    g = _generate(model, tok, [generator_prompt(q, shots) for q in qs], role("generator"),
                  tokens[0], temperature, config.derive_seed(seed, "tree", "generator"), batch_size, n, sampler)  # q*n + j
    v = _generate(model, tok, [verifier_prompt(qs[i // n], g[i]) for i in range(Q * n)], role("verifier"),
                  tokens[1], temperature, config.derive_seed(seed, "tree", "verifier"), batch_size, n, sampler)   # (q*n + j)*n + k
    r = _generate(model, tok, [refiner_prompt(qs[i // n**2], g[i // n], v[i], shots) for i in range(Q * n * n)],
                  role("refiner"), tokens[2], temperature, config.derive_seed(seed, "tree", "refiner"), batch_size, n, sampler)
    reward = [int(tasks.verify(t, problems[i // n**3].answer)) for i, t in enumerate(r)]
    return {"n": n, "questions": qs, "answers": [p.answer for p in problems], "g": g, "v": v, "r": r,
            "reward": reward, "shots": [s.to_dict() for s in shots]}


def rewards(tree) -> np.ndarray:
    """Leaf rewards as an array of shape (Q, n, n, n)."""
    return np.asarray(tree["reward"], dtype=float).reshape(-1, *(tree["n"],) * 3)


def value_iteration(reward):
    """(V(g), V(v), V(r)): leaf = reward, verifier = mean of its refinements, generator = mean of its critiques."""
    v_r = np.asarray(reward, dtype=float)
    if v_r.size and not np.isin(v_r, (0.0, 1.0)).all():
        raise ValueError("reward must hold outcome rewards in {0, 1}")
    v_v = v_r.mean(-1)
    return v_v.mean(-1), v_v, v_r


def binarise(values, threshold: float = THRESHOLD) -> np.ndarray:
    """Positive when the value is strictly above the threshold (the paper's V > 0.5)."""
    return np.asarray(values) > threshold


def labels(reward, pooling: str = "global"):
    """(generator, verifier, refiner) labels: global = binarised subtree mean, local = majority of direct children."""
    config.check_choice("pooling", pooling, POOLINGS)
    v_g, v_v, v_r = value_iteration(reward)
    if pooling == "global":
        return binarise(v_g), binarise(v_v), binarise(v_r)
    lab_v = binarise(v_v)                       # the children of a verifier node are leaves: same as global
    return binarise(lab_v.mean(-1)), lab_v, binarise(v_r)


def pooling_agreement(reward) -> dict:
    """Share of generator and verifier nodes whose global and local labels agree."""
    (g1, v1, _), (g2, v2, _) = labels(reward, "global"), labels(reward, "local")
    return {"generator": float((g1 == g2).mean()), "verifier": float((v1 == v2).mean())}


def sibling_pairs(lab) -> list:
    """(parent index, positive child, negative child) for every positive/negative pair of siblings."""
    lab = np.asarray(lab, dtype=bool)
    out = []
    for parent in np.ndindex(lab.shape[:-1]):
        row = lab[parent]
        out += [(parent, int(i), int(j)) for i in np.flatnonzero(row) for j in np.flatnonzero(~row)]
    return out


def _nodes(tree):
    """Prompt and text of every node, as arrays indexed like the labels."""
    n, qs = tree["n"], tree["questions"]
    shots = [tasks.Problem(**s) for s in tree.get("shots", [])]
    Q = len(qs)
    g = np.array(tree["g"], dtype=object).reshape(Q, n)
    v = np.array(tree["v"], dtype=object).reshape(Q, n, n)
    r = np.array(tree["r"], dtype=object).reshape(Q, n, n, n)
    prompt = {"generator": lambda q: generator_prompt(qs[q], shots),
              "verifier": lambda q, j: verifier_prompt(qs[q], g[q, j]),
              "refiner": lambda q, j, k: refiner_prompt(qs[q], g[q, j], v[q, j, k], shots)}
    return {"generator": g, "verifier": v, "refiner": r}, prompt


def preference_pairs(tree, pooling: str = "global") -> dict:
    """D_G, D_V, D_R: (prompt, chosen, rejected) from siblings under the same parent, positive vs negative."""
    texts, prompt = _nodes(tree)
    out = {}
    for role, lab in zip(ROLES, labels(rewards(tree), pooling)):
        out[role] = [(prompt[role](*parent), texts[role][parent + (i,)], texts[role][parent + (j,)])
                     for parent, i, j in sibling_pairs(lab)]
    return out


def sft_examples(tree, pooling: str = "global") -> dict:
    """(prompt, completion) for every positive node of each role."""
    texts, prompt = _nodes(tree)
    return {role: [(prompt[role](*idx[:-1]), texts[role][idx]) for idx in zip(*np.nonzero(lab))]
            for role, lab in zip(ROLES, labels(rewards(tree), pooling))}


def tree_subset(tree, questions) -> dict:
    """The trees of the question indices `questions`, as a tree of their own (e.g. a validation slice)."""
    n = tree["n"]
    pick = lambda xs, per: [xs[q * per + i] for q in questions for i in range(per)]
    return {**tree, "questions": [tree["questions"][q] for q in questions], "answers": [tree["answers"][q] for q in questions],
            "g": pick(tree["g"], n), "v": pick(tree["v"], n**2), "r": pick(tree["r"], n**3), "reward": pick(tree["reward"], n**3)}


def equal_budget(by_pooling: dict, limit: int, seed: int = 0) -> dict:
    """pooling -> role -> items, cut so that every pooling trains each role on the same number of items:
    min(limit, the smallest pooling's count), a seeded subsample of each (subsample)."""
    out = {p: {} for p in by_pooling}
    for role in ROLES:
        k = min([limit] + [len(d[role]) for d in by_pooling.values()])
        for p, d in by_pooling.items():
            out[p][role] = subsample(d[role], k, config.derive_seed(seed, "budget", role)) if k else []
    return out


def subsample(items, limit: int, seed: int = 0) -> list:
    """At most `limit` items, a seeded random subset in the original order."""
    config.check_int("limit", limit)
    if len(items) <= limit:
        return list(items)
    keep = np.sort(np.random.default_rng(seed).choice(len(items), limit, replace=False))
    return [items[i] for i in keep]


def training_sets(tree, val_tree, max_sft: int, max_pairs: int, seed: int = 0) -> tuple:
    """(sets, validation), each pooling -> (role -> SFT examples, role -> pairs): the training trees' items at an
    equal budget per pooling (equal_budget, at most max_sft / max_pairs per role) and the validation trees' items,
    each cut to the same limits (subsample), all seeded by `seed`."""
    budget = [equal_budget({p: make(tree, p) for p in POOLINGS}, limit, config.derive_seed(seed, name))
              for make, limit, name in ((sft_examples, max_sft, "sft-subset"), (preference_pairs, max_pairs, "dpo-subset"))]
    validation = {p: ({r: subsample(x, max_sft, seed) for r, x in sft_examples(val_tree, p).items()},
                      {r: subsample(x, max_pairs, seed) for r, x in preference_pairs(val_tree, p).items()}) for p in POOLINGS}
    return {p: (budget[0][p], budget[1][p]) for p in POOLINGS}, validation


def majority_vote(answers):
    """Most frequent non-missing answer; a tie goes to the tied answer that appeared first; None if all missing."""
    votes = [a for a in answers if a is not None]
    if not votes:
        return None
    counts = Counter(votes)
    return next(a for a in votes if counts[a] == max(counts.values()))


def run_chains(model, tok, problems, k=1, trained=False, tokens=(48, 32, 48), temperature=0.7, seed=0,
               batch_size=16, generator_only=False, g=None, shots=(), sampler=None) -> list:
    """k independent G -> V -> R chains per problem (or k generator samples): one row per chain.

    `g`, one generator reply per chain (question-major), replaces the generator step: chains that continue
    given first answers, e.g. another variant's, for a comparison paired on the same g."""
    config.check_int("k", k)
    role = (lambda r: r) if trained else (lambda r: None)
    items = [(i, c) for i in range(len(problems)) for c in range(k)]
    qs = [problems[i].question for i, _ in items]
    if g is None:
        g = _generate(model, tok, [generator_prompt(p.question, shots) for p in problems], role("generator"), tokens[0],
                      temperature, config.derive_seed(seed, "chains", "generator"), batch_size, k, sampler)
    elif len(g) != len(items):
        raise ValueError(f"g has {len(g)} replies; give one per chain ({len(problems)} problems x k = {k})")
    v = r = [None] * len(items)
    if not generator_only:
        v = _generate(model, tok, [verifier_prompt(q, x) for q, x in zip(qs, g)], role("verifier"), tokens[1],
                      temperature, config.derive_seed(seed, "chains", "verifier"), batch_size, 1, sampler)
        r = _generate(model, tok, [refiner_prompt(q, x, y, shots) for q, x, y in zip(qs, g, v)], role("refiner"),
                      tokens[2], temperature, config.derive_seed(seed, "chains", "refiner"), batch_size, 1, sampler)
    rows = []
    for (i, c), x, y, z in zip(items, g, v, r):
        truth, final = problems[i].answer, (x if generator_only else z)
        rows.append({"question": i, "chain": c, "g": x, "v": y, "r": z, "answer": truth,
                     "g_answer": tasks.extract_answer(x), "g_correct": tasks.verify(x, truth),
                     "final_answer": tasks.extract_answer(final), "correct": tasks.verify(final, truth)})
    return rows


def construction_holds(tree, paper_n, paper_leaves, paper_threshold) -> bool:
    """The paper's tree arithmetic on this implementation: the tree samples the paper's n per role, n samples per
    role give n^3 leaves per question (and the paper's n^3 is its number of trajectories), the sampled tree has
    every node, and a node is positive exactly when its value is strictly above the paper's threshold."""
    n, q, t = tree["n"], len(tree["questions"]), float(paper_threshold)
    sizes = [len(tree["g"]), len(tree["v"]), len(tree["r"]), len(tree["reward"])]
    return bool(n == int(paper_n) and int(paper_n) ** 3 == int(paper_leaves)
                and sizes == [q * n, q * n**2, q * n**3, q * n**3] and rewards(tree).shape == (q, n, n, n)
                and THRESHOLD == t and binarise([t, np.nextafter(t, 1.0)]).tolist() == [False, True])
