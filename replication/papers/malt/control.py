"""Notebook 05's single-agent control: the generator alone, trained by SFT then DPO (malt_training.train_arm, the
same settings as MALT) on its own samples from the training trees, each labelled by its own answer (the exact
verifier on g: the generator's tree with its samples as the leaves, V(g) = R(g, a_GT), positive when V > 0.5), and
cut to as many SFT examples and pairs as MALT's generator trains on. The only difference from MALT is then the
verifier and refiner: their part in labelling the generator's samples and their turns at inference."""
import numpy as np

from replication.core import config
from replication.lm import tasks
from .malt import ROLES, binarise, generator_prompt, sibling_pairs, subsample


def own_labels(tree) -> np.ndarray:
    """(questions, n) booleans: each generator sample of the tree is positive when its own answer is right (its value
    R(g, a_GT) is above the paper's threshold, malt.binarise)."""
    n, q = tree["n"], len(tree["questions"])
    right = [float(tasks.verify(g, tree["answers"][i // n])) for i, g in enumerate(tree["g"])]
    return binarise(np.reshape(right, (q, n)))


def own_data(tree) -> tuple:
    """(SFT examples, pairs) of the generator from its own labels: (prompt, g) for each positive sample and (prompt,
    positive, negative) for each positive/negative pair of samples of the same question (malt.sibling_pairs, as
    MALT's D_G), with the tree's worked examples in the prompt."""
    shots = [tasks.Problem(**s) for s in tree.get("shots", [])]
    lab = own_labels(tree)
    g = np.array(tree["g"], dtype=object).reshape(lab.shape)
    prompt = [generator_prompt(q, shots) for q in tree["questions"]]
    sft = [(prompt[q], g[q, j]) for q, j in zip(*np.nonzero(lab))]
    pairs = [(prompt[q], g[q, i], g[q, j]) for (q,), i, j in sibling_pairs(lab)]
    return sft, pairs


def control_sets(tree, val_tree, malt_sets: tuple, max_sft: int, max_pairs: int, seed: int = 0) -> dict:
    """The control's data in MALT's shape, (role -> SFT examples, role -> pairs), the verifier and refiner with none:
    the generator's own SFT examples and pairs of `tree` (own_data), each a seeded subset of exactly as many as MALT's
    generator trains on (malt_sets: one MALT arm's (role -> SFT examples, role -> pairs)); its validation items those
    of `val_tree`, cut to max_sft / max_pairs as MALT's are (malt.training_sets). Returns {"sets", "validation",
    "budget": MALT's generator counts, "available": the control's own counts, "short": how many items the control's
    trees lack to meet the budget (0 and 0 when met)}."""
    config.check_int("max_sft", max_sft)
    config.check_int("max_pairs", max_pairs)
    own, val = own_data(tree), own_data(val_tree)
    budget = {"sft": len(malt_sets[0]["generator"]), "pairs": len(malt_sets[1]["generator"])}
    available = {"sft": len(own[0]), "pairs": len(own[1])}
    gen = [subsample(items, budget[kind], config.derive_seed(seed, "control", kind)) if budget[kind] else []
           for items, kind in zip(own, ("sft", "pairs"))]
    empty = {r: [] for r in ROLES if r != "generator"}
    return {"sets": ({"generator": gen[0], **empty}, {"generator": gen[1], **empty}),
            "validation": ({"generator": subsample(val[0], max_sft, seed), **empty},
                           {"generator": subsample(val[1], max_pairs, seed), **empty}),
            "budget": budget, "available": available,
            "short": {k: max(0, budget[k] - available[k]) for k in budget}}
