"""The notebook's run record: parameters, seed, figures, claims and measurements, written to metrics/<stem>.json
of its run folder; also the notebook's one cache and its training-run folders.

Only the runner writes the committed results: under the runner (it sets config.RUNNER_ENV for its kernels) a
notebook writes its metrics and figures to a staging folder that the runner promotes when the notebook succeeds;
a run by hand (papermill by hand, JupyterLab) writes them under runs/<profile>-scratch/."""
import platform
import time
from pathlib import Path

from replication import __version__
from replication.core import cache, config, console, files, figures, params, phases, store, verdicts
from replication.lm import loop, models
from . import settings  # noqa: F401  (registers the notebooks' parameter classes)

VERDICTS = verdicts.VERDICTS
CLAIM_LIMIT = 90   # characters of a claim's label: a plain sentence; the setting goes in its own columns
CLAIM_COLUMNS = ["claim", "task", "judge", "paper", "measured", "verdict", "evidence", "interval", "n", "rerun", "why"]
_current = None


class Run:
    """What one notebook execution produced; `finish()` writes it atomically."""

    def __init__(self, notebook: str, profile: str, seed: int, params=None):
        config.check_choice("profile", profile, config.PROFILES)
        config.check_int("seed", seed, minimum=0)
        if not (len(notebook) > 3 and notebook[:2].isdigit() and notebook[2] == "_"):
            raise ValueError(f"notebook={notebook!r} is not allowed; use the notebook's stem, e.g. '00_setup_and_baselines'")
        self.notebook, self.profile, self.seed, self.params = notebook, profile, seed, params
        self.figures, self.claims, self.metrics = [], [], {}
        self.t0 = time.perf_counter()

    @property
    def number(self) -> str:
        return self.notebook[:2]

    @property
    def paths(self) -> config.Paths:
        """The run folder: the runner's runs/<profile>/ (or its one-off overrides' folder), or runs/<profile>-scratch/
        when the notebook runs by hand (papermill by hand, JupyterLab)."""
        return config.kernel_paths(self.profile)

    @property
    def output(self) -> Path:
        """Where metrics and figures go: the runner's staging folder (it promotes them when the notebook succeeds),
        or the scratch run folder itself for a run by hand."""
        return self.paths.staging(self.notebook) if config.by_runner() else self.paths.root

    @property
    def cache(self) -> Path:
        """Per-notebook cache for expensive steps, keyed further by their config."""
        return self.paths.cache / self.notebook

    @property
    def figures_dir(self) -> Path:
        return self.output / "figures"

    @property
    def metrics_path(self) -> Path:
        return self.output / "metrics" / f"{self.notebook}.json"

    def log(self, **metrics) -> None:
        """Record named results (plain numbers, strings, lists or dicts) in the metrics file."""
        self.metrics.update(metrics)

    def cached(self, name: str, key, make):
        """make()'s value, computed once per key under this notebook's cache (replication.core.cache)."""
        return cache.cached(self.cache, name, key, make)

    def run_folder(self, name: str, key: dict) -> "loop.RunFolder":
        """The folder of a training run of this notebook, keyed by its configuration (resumable)."""
        return loop.RunFolder.keyed(self.cache / "training", name, key)

    def claim(self, claim: str, paper: str, measured: str, evidence: str, why: str, *, n=None, interval=None,
              direction: int = +1, null: float = 0.0, effect: float = None, estimate: float = None,
              seed_differences=None, health: str = None, unit: str = "seed", question_variance: float = None,
              matches=None, holds: bool = None, parts: dict = None, not_tested: str = None, task: str = None,
              judge: str = None, model: str = None, effect_why: str = None) -> dict:
        """Add one row to the claims ledger: the paper's number beside ours, the evidence behind it, and the
        verdict from the one rule (replication.core.verdicts): an interval decides alone, unless matches=(measured,
        paper, tolerance) or parts={...} is given too, which then decides (the interval is shown beside it); without an
        interval exactly one of matches=, holds=<a checked condition>, parts= or not_tested=<reason>.

        A training comparison (lm.arms.compare's `basis`) also passes its estimate, its per-seed differences (one
        seed: at most 'inconclusive', qualified 'one run'; 'one draw' with unit='draw'), `health`, a failed
        health check reported beside the verdict, and the interval's question part (`question_variance`, recorded
        for `python -m replication seeds`; read from the interval itself when it is a stats.Interval). n: a count, or a text such as '3 seeds x 200 questions'.
        `claim` is a plain sentence of at most CLAIM_LIMIT characters; what it was measured on goes in `task` and
        `judge` (the ledger's own columns) and `model` (a real-model claim's default: the notebook's `model`).
        effect: the paper's effect on this row's scale, passed to the rule; where the paper's number is on another scale
        or there is none, `effect_why` says so in a few words (a real-model row with an interval gives one of the two)."""
        config.check_choice("evidence", evidence, verdicts.EVIDENCE)
        if len(claim) > CLAIM_LIMIT:
            raise ValueError(f"claim: at most {CLAIM_LIMIT} characters, a plain sentence (task=, judge= and model= "
                             f"hold the setting); got {len(claim)}: {claim[:60]!r}...")
        if model is None and evidence == "real model" and not_tested is None:
            model = getattr(self.params, "model", None)
        basis = {k: v for k, v in {"matches": matches, "holds": holds, "parts": parts, "not_tested": not_tested}.items()
                 if v is not None}
        if interval is not None and ("holds" in basis or "not_tested" in basis):
            raise ValueError("an interval decides the verdict by itself; drop holds= / not_tested=")
        if effect is not None and effect_why is not None:
            raise ValueError("effect_why: says why the paper's effect is not passed; drop it when effect= is given")
        if seed_differences is not None and interval is None:
            raise ValueError("seed_differences= belongs to a training comparison; give its interval= too")
        if basis:
            verdict = verdicts.verdict(**basis)
        elif interval is not None:
            verdict = verdicts.verdict(interval=interval, direction=direction, null=null, effect=effect,
                                       seed_differences=seed_differences)
        else:
            raise ValueError(f"claim {claim!r} has no basis; give interval=, matches=, holds=, parts= or not_tested=")
        if parts is not None:
            why = f"{why} [parts: " + "; ".join(f"{k}: {verdicts.part_word(v)}" for k, v in parts.items()) + "]"
        if not_tested is not None:
            why = f"{why} ({not_tested})" if why else not_tested
        if evidence == "simulation" and verdicts.SIMULATION_NOTE not in why:
            why = f"{why} ({verdicts.SIMULATION_NOTE})"
        if question_variance is None:   # a two-level interval (stats.Interval) carries its question part
            question_variance = getattr(interval, "question_variance", None)
        bounds = getattr(interval, "bounds", None)   # what the quantity can be (stats.clip), where the interval says
        if interval is not None:
            interval = [round(float(interval[0]), 6), round(float(interval[1]), 6)]
        r6 = lambda x: None if x is None else round(float(x), 6)  # noqa: E731
        row = {"claim": claim, "task": task, "model": model, "judge": judge, "paper": str(paper), "measured": str(measured), "verdict": verdict, "evidence": evidence,
               "interval": interval, "bounds": None if bounds is None else list(bounds), "n": None if n is None else (n if isinstance(n, str) else int(n)), "why": why,
               "qualifier": verdicts.qualifier(seed_differences, unit, direction, null), "health": health or None,
               "estimate": r6(estimate), "direction": direction, "null": null, "effect": r6(effect),
               "effect_why": effect_why,
               "seed_differences": None if seed_differences is None else [r6(x) for x in seed_differences],
               "question_variance": None if question_variance is None else float(f"{float(question_variance):.6g}")}
        if parts and any(isinstance(v, dict) for v in parts.values()):   # parts measured by intervals (verdicts.part)
            row["parts"] = {k: v if isinstance(v, dict) else {"verdict": v} for k, v in parts.items()}
            if len(seed_differences or []) > 1:   # the seeds on the paper's side are each part's (ledger.md)
                row["qualifier"] = None
        same = lambda c: all(c.get(k) == row[k] for k in ("claim", "task", "judge", "evidence"))  # noqa: E731  (a rerun cell)
        self.claims = [c for c in self.claims if not same(c)] + [row]
        return row

    def claims_table(self):
        """The ledger as a DataFrame, for the notebook's closing table; `rerun`, as in the index's ledger: for a
        comparison over seeds or draws, the chance of each verdict if it were run again with as many (seeds.rerun)."""
        import pandas as pd

        from replication.ledger import seeds

        table = pd.DataFrame(self.claims, columns=CLAIM_COLUMNS + ["qualifier", "health"])
        table["verdict"] = [verdicts.label(c) for c in self.claims]
        table["rerun"] = [seeds.rerun(c) or "-" for c in self.claims]
        return table[CLAIM_COLUMNS]

    def finish(self) -> Path:
        """Write the metrics record (metrics/<notebook>.json of the output folder; its timings in their own keys:
        wall_time_s, phases_s (the phase profile) and reused_s (the cached results it loaded instead of making, and
        the seconds they took when made)), and results_store (store.tally: what it read from the results store and
        what it made now; each claim's `source` follows from it, store.claim_source) atomically; return where it is read
        from: its path, or under the runner the run folder's metrics file it becomes once the runner promotes it (the
        staged copy is removed then, so a notebook that prints the path never points at a removed file)."""
        import torch

        wall = time.perf_counter() - self.t0
        counts = store.tally(self.cache)
        for c in self.claims:
            c["source"] = store.claim_source(c["evidence"], counts)
        record = {
            "notebook": self.notebook, "profile": self.profile, "seed": self.seed,
            "wall_time_s": round(wall, 2), "phases_s": phases.profile(wall), "reused_s": phases.reused_profile(),
            "package_version": __version__,
            "python": platform.python_version(), "torch": torch.__version__, "device": models.describe_device(),
            "parameters": self._params_record(), "results_store": counts,
            "figures": self.figures, "claims": self.claims,
            "metrics": self.metrics,
        }
        written = files.write_json(self.metrics_path, record)
        return self.paths.metrics / written.name if config.by_runner() else written

    def _params_record(self):
        import dataclasses

        return dataclasses.asdict(self.params) if self.params is not None else None


PRECISIONS = ("rollout_dtype", "step_update_dtypes")   # parameters that may say "auto" (models.resolve_dtype)


def start(notebook: str, namespace: dict = None, *, profile: str = None, seed: int = None) -> Run:
    """Begin a notebook's run: build and validate its parameters from the parameters cell's names
    (`globals()`; the result is `run.params`), seed everything, set the figure style. A precision of
    "auto" (PRECISIONS) becomes the one it stands for here (models.resolve_dtype), in `run.params` and `namespace`.

    In a run by hand the profile's values (notebooks/params/<notebook>.json) replace the cell's values of the
    parameters not set by hand, in `namespace` too (params.profile_changes); the runner injects them itself."""
    global _current
    console.quiet_warnings()
    phases.reset()   # the phase profile counts this notebook only
    phases.new_execution()
    cfg = None
    if namespace is not None:
        if not config.by_runner():
            changes = params.profile_changes(notebook, namespace, config.notebooks_dir())
            if changes:
                print(f"profile {namespace['profile']!r}: " + ", ".join(f"{k} = {v!r}" for k, v in changes.items()))
            namespace.update(changes)
        cfg = params.build(notebook, namespace)
        profile, seed = cfg.profile, cfg.seed
        device = models.use_device(cfg.device) if getattr(cfg, "device", None) is not None else None
        root = store.activate("default" if profile is None else profile)
        on_cpu = device is None or device.type == "cpu"
        stored = store.auto_precision(root, notebook) if root is not None and on_cpu else None
        for name in PRECISIONS:   # auto: as the store's entries were made, else bf16 where the device has bf16 kernels
            value = getattr(cfg, name, None)
            if value is not None and "auto" in ([value] if isinstance(value, str) else value):
                resolved = models.resolve_dtype(name, value, auto=stored)
                setattr(cfg, name, resolved)
                namespace[name] = resolved
                why = "" if models.bf16_kernels() else " (no bf16 kernels here: bf16 would run several times slower)"
                if stored is not None and stored != models.resolve_dtype(name, "auto"):
                    why = (" as the results store's entries of this notebook were made (anything made anew here in "
                           f"{stored} may run slower; --retrain makes everything in {models.resolve_dtype(name, 'auto')})")
                print(f"{name} = {value!r} -> {resolved!r} on {device or 'cpu'}{why}")
    run = Run(notebook, "default" if profile is None else profile, 0 if seed is None else seed, cfg)
    store.activate(run.profile)   # the default profile reads the committed results store (core.store)
    config.set_seed(run.seed)
    figures.use_style()
    figures.attach(run)
    _current = run
    return run


def current() -> Run:
    """The run started by this kernel's notebook."""
    if _current is None:
        raise RuntimeError("no run started; call replication.run.workbook.start(notebook, profile, seed) first")
    return _current
