"""The papers' reported numbers, read from data/paper/*.csv with their source (never typed in a notebook)."""
from functools import lru_cache

import pandas as pd

from . import config

FOLDER = config.ROOT / "data" / "paper"


@lru_cache(maxsize=None)
def _read(name: str) -> pd.DataFrame:
    path = FOLDER / f"{name}.csv"
    if not path.is_file():
        names = ", ".join(sorted(p.stem for p in FOLDER.glob("*.csv")))
        raise ValueError(f"table={name!r} is not allowed; choose one of {names}")
    frame = pd.read_csv(path)
    if "source" not in frame.columns:
        raise ValueError(f"{path} has no 'source' column; every paper number needs one")
    return frame


def table(name: str) -> pd.DataFrame:
    """A copy of data/paper/<name>.csv."""
    return _read(name).copy()


def row(name: str, **where) -> dict:
    """The one row of a table whose columns equal `where` (e.g. quantity="accuracy", protocol="debate")."""
    frame = _read(name)
    mask = pd.Series(True, index=frame.index)
    for col, want in where.items():
        if col not in frame.columns:
            raise ValueError(f"{col}= is not a column of {name}; its columns are {', '.join(frame.columns)}")
        mask &= frame[col].astype(str) == str(want)
    hits = frame[mask]
    if len(hits) != 1:
        raise ValueError(f"{name} has {len(hits)} rows where {where}; name exactly one")
    return hits.iloc[0].to_dict()


def value(name: str, column: str = "value", **where):
    """The number in `column` of the one matching row (a string if it is not a number, e.g. '0.01|0.7|0.9')."""
    v = row(name, **where)[column]
    try:
        return float(v)
    except (TypeError, ValueError):
        return v


def cite(name: str, column: str = "value", fmt: str = "{:g}", **where) -> str:
    """'<value> (<source>)' for a table or ledger cell."""
    r = row(name, **where)
    v = value(name, column, **where)
    return f"{fmt.format(v) if isinstance(v, float) else v} ({r['source']})"
