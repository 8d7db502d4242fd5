"""Each notebook's parameters as a typed dataclass, built and validated by one call from its parameters cell.

The notebook's tagged `parameters` cell is the single source of the default values; the profiles in
`notebooks/params/<notebook>.json` hold only what they change (papermill injects them after the cell).
`build(stem, namespace)` picks the fields out of the cell's names, checks each one's type and range, then
the notebook's cross-field rules, and raises a ValueError naming the parameter and what is allowed.
"""
import dataclasses
import typing
from dataclasses import dataclass, field

from . import config


def p(minimum=None, low=None, high=None, choices=None, each=None):
    """A field's rule: integer minimum, number range [low, high], a choice, or a rule for each list item."""
    return field(metadata={"minimum": minimum, "low": low, "high": high, "choices": choices, "each": each})


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


REGISTRY = {}  # notebook stem -> parameter class (filled by replication.settings)


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
