"""Each notebook's parameters as a typed dataclass, built and validated by one call from its parameters cell.

The notebook's tagged `parameters` cell is the single source of the default values; the profiles in
`notebooks/params/<notebook>.json` hold only what they change (papermill injects them after the cell).
`build(stem, namespace)` picks the fields out of the cell's names, checks each one's type and range, then
the notebook's cross-field rules, and raises a ValueError naming the parameter and what is allowed.
"""
import ast
import dataclasses
import json
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path

from . import config


def p(minimum=None, low=None, high=None, choices=None, each=None, pattern=None):
    """A field's rule: integer minimum, number range [low, high], a choice, a pattern (a regular expression the
    whole string matches, with a description of what it allows), or a rule for each list item."""
    return field(metadata={"minimum": minimum, "low": low, "high": high, "choices": choices, "each": each,
                           "pattern": pattern})


def _check(name: str, value, kind, rule: dict) -> None:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is typing.Union:  # Optional[X]
        if value is None:
            return
        kind = [a for a in args if a is not type(None)][0]
        origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is int:
        config.check_int(name, value, minimum=1 if rule.get("minimum") is None else rule["minimum"])
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name}={value!r} is not allowed; it must be a number")
    elif kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name}={value!r} is not allowed; it must be True or False")
    elif kind is str:
        if not isinstance(value, str):
            raise ValueError(f"{name}={value!r} is not allowed; it must be a string")
    elif (origin or kind) in (list, dict):
        if not isinstance(value, origin or kind) or not value:
            raise ValueError(f"{name}={value!r} is not allowed; it must be a non-empty {(origin or kind).__name__}")
        items = value if (origin or kind) is list else list(value.values())
        item_kind = args[0] if (origin or kind) is list and args else (args[1] if args else None)
        for x in items:
            if item_kind is not None:
                _check(name, x, item_kind, rule.get("each") or {})
            elif rule.get("each"):
                _check(name, x, type(x), rule["each"])
        return
    if rule.get("low") is not None or rule.get("high") is not None:
        low = -float("inf") if rule.get("low") is None else rule["low"]
        high = float("inf") if rule.get("high") is None else rule["high"]
        config.check_range(name, value, low, high)
    if rule.get("choices") is not None:
        config.check_choice(name, value, tuple(rule["choices"]))
    if rule.get("pattern") is not None:
        regex, allowed = rule["pattern"]
        if not re.fullmatch(regex, value):
            raise ValueError(f"{name}={value!r} is not allowed; use {allowed}")


MODEL = p()  # a model name known to replication.lm.models or a local checkpoint folder
# where models run: CUDA when available (auto), the CPU, or a CUDA device (replication.lm.models.use_device)
DEVICE = p(pattern=(r"auto|cpu|cuda(:\d+)?", "auto, cpu, cuda or cuda:N"))
# a sampling or update precision: auto (bf16 where the device has bf16 kernels, else fp32; workbook.start resolves
# it, replication.lm.models.resolve_dtype), float32 or bfloat16
DTYPES = ("auto", "float32", "bfloat16")
DTYPE = p(choices=DTYPES)


def temperature_rule():
    """The rule of a sampling temperature (a field of its own each time: dataclasses name the field they are given)."""
    return p(low=0.01, high=2.0)


def lr_rule():
    """The rule of a learning rate."""
    return p(low=config.LR_RANGE[0], high=config.LR_RANGE[1])


@dataclass
class Params:
    """Fields every notebook has; subclasses add theirs and may override `check` for cross-field rules."""

    profile: str = p(choices=config.PROFILES)
    seed: int = p(minimum=0)

    def check(self) -> None:
        """Rules that involve more than one parameter."""

    def validate(self) -> "Params":
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            rule = {k: v for k, v in f.metadata.items() if v is not None}
            each = f.metadata.get("each")
            if each is not None:
                rule["each"] = each.metadata if isinstance(each, dataclasses.Field) else each
            _check(f.name, getattr(self, f.name), hints[f.name], rule)
        self.check()
        return self

    def at_most(self, name: str, limit, what: str) -> None:
        """A cross-field rule: parameter `name` may not exceed `limit` (described by `what`)."""
        if getattr(self, name) > limit:
            raise ValueError(f"{name}={getattr(self, name)!r} is not allowed; it must be <= {what} = {limit}")


@dataclass
class LM(Params):
    """Fields every notebook that runs a language model has: the model and where it runs."""

    model: str = MODEL
    device: str = DEVICE


@dataclass
class Trained(LM):
    """Fields every notebook that trains has: training seeds (seed, seed + 1, ...), worker processes, worked
    examples in the prompt, held-out questions (the same for every arm and seed) and the LoRA rank."""

    seeds: int = p()
    workers: int = p()
    shots: int = p(minimum=0)
    n_heldout: int = p()
    lora_r: int = p()


REGISTRY = {}  # notebook stem -> parameter class (filled by replication.run.settings)


def notebook(stem: str):
    """Register a parameter class for the notebook `stem`."""
    def wrap(cls):
        REGISTRY[stem] = cls
        return cls
    return wrap


def build(stem: str, namespace: dict) -> Params:
    """The notebook's parameter dataclass from the names of its parameters cell, validated."""
    if stem not in REGISTRY:
        raise ValueError(f"notebook={stem!r} has no parameter class; choose one of {', '.join(sorted(REGISTRY))}")
    cls = REGISTRY[stem]
    names = [f.name for f in dataclasses.fields(cls)]
    missing = [n for n in names if n not in namespace]
    if missing:
        raise ValueError(f"the parameters cell of {stem} lacks {', '.join(missing)}")
    return cls(**{n: namespace[n] for n in names}).validate()


# ---- profiles in runs by hand: papermill -p profile smoke, or the cell edited in JupyterLab ----------------

def cell_values(path) -> dict:
    """The plain values of the notebook's cell tagged `parameters`, read from its .ipynb file."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            values = {}
            exec("".join(cell["source"]), {}, values)  # noqa: S102 - plain assignments, the notebook's own cell
            return values
    raise ValueError(f"{path} has no cell tagged 'parameters'")


def profile_values(stem: str, profile: str, folder) -> dict:
    """What a profile changes in a notebook's parameters, from <folder>/params/<stem>.json."""
    config.check_choice("profile", profile, config.PROFILES)
    path = Path(folder) / "params" / f"{stem}.json"
    if not path.is_file():
        raise ValueError(f"{path} is missing; every notebook needs a parameter file with one entry per profile")
    table = json.loads(path.read_text(encoding="utf-8"))
    if profile not in table:
        raise ValueError(f"{path} has no {profile!r} entry; add one (profiles: {', '.join(config.PROFILES)})")
    return table[profile]


def injected_names(namespace: dict) -> set:
    """The names papermill injected (`-p name value`): the assignments of the latest executed cell that starts with
    papermill's '# Parameters' line (IPython keeps the sources of the executed cells in `In`)."""
    for source in reversed(namespace.get("In") or []):
        if source.startswith("# Parameters\n"):
            return {t.id for node in ast.parse(source).body if isinstance(node, ast.Assign)
                    for t in node.targets if isinstance(t, ast.Name)}
    return set()


def profile_changes(stem: str, namespace: dict, folder) -> dict:
    """The profile's values (notebooks/params/<stem>.json) for a run by hand, for every parameter not set by hand.

    Set by hand means injected by papermill (`-p name value`) or holding another value than the committed
    parameters cell (<folder>/<stem>.ipynb), e.g. edited in JupyterLab. An edit back to the committed value
    cannot be told apart from no edit, and takes the profile's value."""
    changes = profile_values(stem, namespace.get("profile"), folder)
    if not changes:
        return {}
    cell = cell_values(Path(folder) / f"{stem}.ipynb")
    given = injected_names(namespace) | {n for n in cell if n in namespace and namespace[n] != cell[n]}
    return {n: v for n, v in changes.items() if n not in given}
