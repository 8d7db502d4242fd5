"""The curriculum's mechanism on the real model (notebook 02, part 2): GRPO learns only from groups whose rewards
differ, and Elo-Evolve's point is to draw opponents that give such groups. From each run's step rows (evolve.train):
per step the share of groups with mixed rewards, the policy's win rate against the opponents it drew and which it
drew; per opponent the share of its groups that were mixed; and the difference in mixed-group share between two arms,
paired by training seed and step (seed s of every arm draws the same prompts each step), over seeds then steps."""
import numpy as np
import pandas as pd

from replication.core import config, stats


def steps_table(curves: dict, names) -> pd.DataFrame:
    """One row per arm, training seed and step: mixed (the share of groups whose rewards differ: 1 - zero_std_frac),
    win_rate (the mean win/loss/tie against the drawn opponents; nan for the point regime, which plays none) and
    drew_<name> (the share of prompts that drew each opponent). curves: arm -> one step table (or rows) per seed."""
    out = []
    for arm, runs in curves.items():
        for i, rows in enumerate(runs):
            for r in (rows.to_dict("records") if hasattr(rows, "to_dict") else rows):
                opp = r.get("opponents")
                opp = opp if isinstance(opp, (list, tuple)) else []
                out.append({"arm": arm, "seed_index": i, "step": int(r["step"]), "mixed": 1.0 - float(r["zero_std_frac"]),
                            "win_rate": float(r["win_rate"]) if opp else float("nan"),
                            **{f"drew_{n}": float(np.mean([o == n for o in opp])) if opp else float("nan")
                               for n in names}})
    return pd.DataFrame(out)


def by_opponent(curves: dict, names, group_size: int) -> pd.DataFrame:
    """One row per arm and opponent: prompts that drew it (all seeds and steps), the share of their groups whose
    win/loss/tie outcomes differ (a group with mixed outcomes carries a GRPO gradient) and the policy's mean outcome
    against it. Pairwise arms only (the point regime draws no opponent)."""
    config.check_int("group_size", group_size)
    out = []
    for arm, runs in curves.items():
        tally = {n: [] for n in names}
        for rows in runs:
            for r in (rows.to_dict("records") if hasattr(rows, "to_dict") else rows):
                opp, s = r.get("opponents"), r.get("outcomes")
                if not isinstance(opp, (list, tuple)) or not isinstance(s, (list, tuple)):
                    continue
                groups = np.asarray(s, float).reshape(len(opp), group_size)
                for o, g in zip(opp, groups):
                    tally[o].append((float(np.ptp(g) > 0), float(g.mean())))
        for n, v in tally.items():
            if v:
                a = np.array(v)
                out.append({"arm": arm, "opponent": n, "prompts": len(v), "mixed": float(a[:, 0].mean()),
                            "win_rate": float(a[:, 1].mean())})
    return pd.DataFrame(out)


def mixed_difference(runs_a, runs_b, n_boot: int = 2000, seed: int = 0) -> dict:
    """Arm a's share of groups with mixed rewards minus arm b's, paired by training seed and by step (the same
    prompts; checked), with stats.two_level_bootstrap over seeds then steps, kept inside [-1, 1]: the difference,
    its interval, the per-seed differences and n."""
    if len(runs_a) != len(runs_b):
        raise ValueError(f"a has {len(runs_a)} seeds and b {len(runs_b)}; pair the same training seeds")
    diffs = []
    for ra, rb in zip(runs_a, runs_b):
        ra = ra.to_dict("records") if hasattr(ra, "to_dict") else ra
        rb = rb.to_dict("records") if hasattr(rb, "to_dict") else rb
        if [r.get("prompts") for r in ra] != [r.get("prompts") for r in rb]:
            raise ValueError("the two arms did not draw the same prompts; pair runs of the same training seed")
        diffs.append([float(y["zero_std_frac"]) - float(x["zero_std_frac"]) for x, y in zip(ra, rb)])
    x = np.array(diffs)
    d = stats.two_level_bootstrap(x, n_boot=n_boot, seed=config.derive_seed(seed, "mixed-difference"), bounds=(-1, 1))
    n = len(x)
    return {"difference": d[0], "ci95": d.interval, "per_seed": x.mean(axis=1).tolist(), "seeds": n,
            "n": f"{n} seed{'s' if n > 1 else ''} x {x.shape[1]} steps"}
