"""A trained arm, handled one way in every notebook: its health check, its record and its paired comparison with
another arm (its held-out answers come from the one evaluation, `tasks.evaluate`).

The health rule (`health`): an arm is healthy when all three checks pass; a failed check is reported beside
the verdict of every comparison the arm takes part in (the comparison is still measured and judged).
- learned: the arm's own training signal moved the right way. Each paper passes its signal as a change where
  positive means learning: the rise of the training reward from the first to the last third of the steps
  (`reward_rise`), the rise of the policy's Elo, or the fall of a validation loss (`loss_fall`). With a 95%
  interval, its lower end must lie above 0; without one, the change itself.
- accuracy_ok: held-out accuracy is not below the lower end of the base model's Wilson 95% interval.
- length_ok: the replies did not collapse: the held-out replies' mean length in tokens is at least MIN_LENGTH_RATIO x
  the base model's and, where the training replies' lengths are logged, the last third's mean is at least
  MIN_LENGTH_RATIO x the first third's. One third: a collapse seen here went from about 22 words to 5 (0.23), while
  a model that learns to answer concisely ("3 + 4 = 7. The answer is 7.", 7 words) lands near half the base
  model's length (notebook 02's default run: 0.49-0.52 in tokens, every arm at least twice as accurate as the base).
"""
import numpy as np
import pandas as pd

from replication.core import config, stats

MIN_LENGTH_RATIO = 1 / 3
RECORD_KEYS = ("arm", "steps", "samples", "n_heldout", "accuracy", "interval", "healthy", "failed_checks")
CHECKS = ("learned", "accuracy_ok", "length_ok")


def thirds(n: int):
    """Boolean masks of the first and the last third of n steps (at least one step each)."""
    k = max(1, n // 3)
    idx = np.arange(n)
    return idx < k, idx >= n - k


def reward_rise(rewards, n_boot: int = 1000, seed: int = 0) -> dict:
    """The training signal of a reward: mean of the last third of the steps minus the first third, with a 95%
    bootstrap interval over those steps (stats.bootstrap)."""
    reward = np.asarray(rewards, float)
    first, last = thirds(len(reward))
    keep = first | last
    rise = stats.bootstrap(lambda r, late: r[late].mean() - r[~late].mean() if late.any() and (~late).any() else np.nan,
                           reward[keep], last[keep], n_boot=n_boot, seed=seed)
    return {"signal": "training reward", "first": float(reward[first].mean()), "last": float(reward[last].mean()),
            "change": float(rise[0]), "ci95": [float(rise[1]), float(rise[2])]}


def loss_fall(curves: dict) -> dict:
    """The training signal of validation losses by role (each a list, the value before training first): the largest
    fall of any role's loss below its starting value (0 when none fell)."""
    fell = {r: float(c[0] - min(c)) if c else 0.0 for r, c in curves.items()}
    return {"signal": "validation loss fall", "change": max(fell.values(), default=0.0), "ci95": None, "by_role": fell}


def token_lengths(tok, texts) -> np.ndarray:
    """Each text's length in tokens (no special tokens), for replies whose generated ids are not at hand."""
    return np.array([len(ids) for ids in tok(list(texts), add_special_tokens=False)["input_ids"]], float)


def health(signal: dict, correct, base_correct, tokens, base_tokens, train_tokens=None,
           min_length_ratio: float = MIN_LENGTH_RATIO) -> dict:
    """The one health check (module docstring). signal: {"signal": name, "change": x, "ci95": [lo, hi] or None};
    correct / base_correct: per held-out question 0/1 of the arm and the base model; tokens / base_tokens: their
    held-out replies' lengths; train_tokens: the mean reply length of each training step, or None. Returns the
    numbers behind each check, the checks, `failed` (their names) and `healthy`."""
    config.check_range("min_length_ratio", min_length_ratio, 0.0, 1.0)
    ci = signal.get("ci95")
    learned = bool(np.isfinite(ci[0]) and ci[0] > 0) if ci is not None else bool(signal["change"] > 0)
    base_correct = np.asarray(base_correct, float)
    base_lo = stats.proportion_ci(int(base_correct.sum()), len(base_correct))[1]
    heldout_ratio = float(np.mean(tokens) / max(np.mean(base_tokens), 1e-9))
    train_ratio = None
    if train_tokens is not None:
        length = np.asarray(train_tokens, float)
        first, last = thirds(len(length))
        train_ratio = float(length[last].mean() / max(length[first].mean(), 1e-9))
    checks = {"learned": learned, "accuracy_ok": bool(np.mean(correct) >= base_lo),
              "length_ok": bool(heldout_ratio >= min_length_ratio and (train_ratio is None or train_ratio >= min_length_ratio))}
    return {"signal": signal, "base_accuracy_low": base_lo, "heldout_length_ratio": heldout_ratio,
            "train_length_ratio": train_ratio, **checks, "failed": [k for k, ok in checks.items() if not ok],
            "healthy": all(checks.values())}


def record(name: str, correct, steps: int = 0, samples: int = 0, check: dict = None, **extra) -> dict:
    """The metrics record of one arm, the same keys for every notebook (RECORD_KEYS, then `health` and the paper's
    own `extra`): steps, completions (or examples) trained on, held-out n, accuracy with its Wilson 95% interval,
    and the health check (an untrained arm, check=None, is healthy by definition)."""
    correct = np.asarray(correct, float)
    p, lo, hi = stats.proportion_ci(int(correct.sum()), len(correct))
    return {"arm": name, "steps": int(steps), "samples": int(samples), "n_heldout": len(correct), "accuracy": p,
            "interval": [lo, hi], "healthy": True if check is None else check["healthy"],
            "failed_checks": [] if check is None else check["failed"],
            "health": None if check is None else {k: v for k, v in check.items() if k not in ("failed", "healthy")},
            **extra}


def paired(a: pd.DataFrame, b: pd.DataFrame, column: str = "correct", on: str = "qid"):
    """The two arms' values of `column` on the same held-out questions, aligned by `on`."""
    both = a[[on, column]].merge(b[[on, column]], on=on, suffixes=("_a", "_b"))
    if len(both) != len(a) or len(both) != len(b):
        raise ValueError("the two held-out tables must answer the same questions")
    return both[f"{column}_a"].to_numpy(float), both[f"{column}_b"].to_numpy(float)


def training_seeds(seed: int, seeds: int) -> list:
    """The training seeds of a notebook's arms: seed, seed + 1, ..., seed + seeds - 1 (the first is the one-run
    workbook's seed, so its cached runs are reused). Every arm trains once per seed; the held-out questions stay."""
    config.check_int("seed", seed, minimum=0)
    config.check_int("seeds", seeds, minimum=1)
    return [seed + i for i in range(seeds)]


def data_key(seed: int) -> dict:
    """What a training seed's cache key adds for the notebook's seed, which draws the questions and worked
    examples, where the key's own "seed" is the training seed: {"data_seed": seed}, or nothing for seed 0 (every
    profile's), so that the entries keyed before the notebook's seed was recorded stay valid. Without it, training
    seed 1 of a notebook at seed 0 and of one at seed 1 would share a key but not their questions."""
    config.check_int("seed", seed, minimum=0)
    return {"data_seed": seed} if seed else {}


def by_seed(value) -> list:
    """An arm's per-seed values: a list or tuple as given (training seed i at position i), one value (an untrained
    arm, or a one-seed run) as a list of one."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


def failed_text(names, records: dict, unit: str = "seed"):
    """'failed health check: a seed 1 (length_ok); b (learned)' for the named arms' failed seeds, or None (seeds
    counted from 0 in the order trained: seed 1 is the second training seed; unit: 'draw' where the repeats are
    draws of sampled replies)."""
    out = []
    for x in names:
        recs = by_seed(records[x])
        for i, r in enumerate(recs):
            if not r["healthy"]:
                out.append(f"{x}{f' {unit} {i}' if len(recs) > 1 else ''} ({', '.join(r['failed_checks'])})")
    return "failed health check: " + "; ".join(out) if out else None


def compare(a: str, b: str, tables: dict, records: dict, column: str = "correct", on: str = "qid",
            n_boot: int = 2000, seed: int = 0, unit: str = "seed") -> dict:
    """Arm a minus arm b on the same held-out questions, over training seeds. tables: arm -> its held-out table, or
    a list of them, one per training seed (the same seeds in the same order for every trained arm; an untrained arm
    such as the base model: one table, paired with every seed); records: arm -> record() or a list of them.

    The interval is stats.two_level_bootstrap's over the seeds x questions paired differences (between seeds a t
    interval from the per-seed means, within a bootstrap of the shared questions); beside it the per-seed
    differences, the probability of improvement over the per-seed means (stats.probability_of_improvement) and
    run.claim's `basis`: interval, estimate, per-seed differences (one seed caps the verdict at 'inconclusive (one
    run)'), over seeds the interval's question part (core.power plans seeds with it; `ci95` is a stats.Interval
    that carries it too) and any failed health check, reported beside the verdict (a failed arm's comparison is
    still measured and judged). unit: what a repeat is, in n and the health text ('seed'; 'draw' for draws of
    sampled replies without training). Where both arms' values lie in [0, 1] (0/1 outcomes, scores) the interval is
    kept inside [-1, 1], what their difference can be (stats.clip; a clipped end is marked in the text)."""
    ta, tb = by_seed(tables[a]), by_seed(tables[b])
    if len(ta) != len(tb) and 1 not in (len(ta), len(tb)):
        raise ValueError(f"{a} has {len(ta)} seeds and {b} {len(tb)}; pair the same training seeds")
    n = max(len(ta), len(tb))
    pairs = [paired(ta[i if len(ta) > 1 else 0], tb[i if len(tb) > 1 else 0], column, on) for i in range(n)]
    diffs = np.array([x - y for x, y in pairs])
    unit_range = all(((v >= 0) & (v <= 1)).all() for p in pairs for v in p)   # 0/1 outcomes or scores in [0, 1]
    d = stats.two_level_bootstrap(diffs, n_boot=n_boot, seed=seed, bounds=(-1, 1) if unit_range else None)
    per_seed = diffs.mean(axis=1)
    health_text = failed_text((a, b), records, unit)
    return {"pair": f"{a} - {b}", "difference": d[0], "ci95": d.interval, "seeds": n, "questions": diffs.shape[1],
            "n": f"{n} {unit}{'s' if n > 1 else ''} x {diffs.shape[1]} questions",
            "per_seed": [float(x) for x in per_seed],
            "probability_of_improvement": stats.probability_of_improvement([x.mean() for x, _ in pairs[:len(ta)]],
                                                                          [y.mean() for _, y in pairs[:len(tb)]]),
            "failed": [x for x in (a, b) if not all(r["healthy"] for r in by_seed(records[x]))],
            "basis": {"interval": d.interval, "estimate": d[0], "seed_differences": [float(x) for x in per_seed],
                      "health": health_text, **({} if unit == "seed" else {"unit": unit}),
                      **({} if d.question_variance is None else {"question_variance": d.question_variance})}}


def basis(interval, records: dict, names, estimate: float = None, seed_differences=None) -> dict:
    """run.claim's basis for a difference between the named arms: the interval (with its estimate and per-seed
    differences when given) and, beside it, any failed health check of the named arms (failed_text)."""
    out = {"interval": tuple(interval), "health": failed_text(names, records)}
    if getattr(interval, "question_variance", None) is not None:   # a two-level interval's question part
        out["question_variance"] = interval.question_variance
    if estimate is not None:
        out["estimate"] = estimate
    if seed_differences is not None:
        out["seed_differences"] = list(seed_differences)
    return out
