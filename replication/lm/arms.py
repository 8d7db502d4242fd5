"""A trained arm, handled one way in every notebook: its health check, its record and its paired comparison with
another arm (its held-out answers come from the one evaluation, `tasks.evaluate`).

The health rule (`health`): an arm enters a comparison only when all three checks pass.
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


def compare(a: str, b: str, tables: dict, records: dict, column: str = "correct", on: str = "qid",
            n_boot: int = 2000, seed: int = 0) -> dict:
    """Arm a minus arm b on the same held-out questions (mean of `column`, paired bootstrap over questions,
    stats.paired_bootstrap) and run.claim's basis for it: interval= when both arms are healthy, else not_tested
    naming the failed arm(s) and their failed checks. tables: arm -> held-out table; records: arm -> record()."""
    d = stats.paired_bootstrap(*paired(tables[a], tables[b], column, on), n_boot=n_boot, seed=seed)
    return {"pair": f"{a} - {b}", "difference": d[0], "ci95": [d[1], d[2]],
            "failed": [x for x in (a, b) if not records[x]["healthy"]], "basis": basis((d[1], d[2]), records, (a, b))}


def basis(interval, records: dict, names) -> dict:
    """run.claim's basis for a difference between the named arms: interval= when every one is healthy, else
    not_tested naming the failed arm(s) and their failed checks (a failed arm is reported, not compared)."""
    failed = [x for x in names if not records[x]["healthy"]]
    named = "; ".join(f"{x} ({', '.join(records[x]['failed_checks'])})" for x in failed)
    return {"interval": tuple(interval)} if not failed else {"not_tested": f"not compared: failed health check: {named}"}
