"""The package's shape: no import circles, short modules, notebooks that orchestrate and read paper numbers from data/."""
import ast
import re
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from replication.core import config

PACKAGE = config.ROOT / "replication"
MAX_LINES = 400


def imports(path: Path) -> set:
    """Modules of the package that a module imports, at the top or inside functions."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            out |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("replication."):
            out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("replication.")}
    return out


def graph() -> dict:
    mods = {p.stem: p for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    return {m: imports(p) & set(mods) for m, p in mods.items()}


def cycles(g: dict) -> list:
    """Every module that can reach itself, with one path back to it."""
    found = []
    for start in g:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in g[node]:
                if nxt == start:
                    found.append(path + [start])
                    stack = []
                    break
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    return found


def test_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert not cycles({"a": {"b"}, "b": {"c"}, "c": set()})


def test_no_import_circles():
    assert not cycles(graph()), cycles(graph())


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_modules_are_short(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.name} has {n} lines; split it by what it holds (at most {MAX_LINES})"


# ---- notebooks orchestrate and explain ----------------------------------------------------------------

NOTEBOOKS = sorted(config.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.])")


def distinctive(value: str):
    """A paper number as it would be typed, if it could not be typed by chance: at least three significant
    digits and not a round setting such as 200, 1000 or 0.05 (those are also the workbook's own values)."""
    try:
        x = float(value)
    except ValueError:
        return None
    digits = re.sub(r"[^0-9]", "", f"{abs(x):.10g}").strip("0")
    return f"{x:.10g}" if len(digits) >= 3 else None


def paper_numbers() -> dict:
    out = {}
    for csv in sorted((config.ROOT / "data" / "paper").glob("*.csv")):
        frame = pd.read_csv(csv, dtype=str)
        for col in frame.columns:
            if col == "source":
                continue
            for cell in frame[col].dropna():
                for part in str(cell).split("|"):
                    key = distinctive(part.strip())
                    if key:
                        out[key] = f"{csv.name}:{col}"
    return out


def typed_numbers(nb) -> dict:
    """Numbers typed in code cells (but the parameters cell: settings) and in markdown, normalised."""
    out = {}
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.metadata.get("tags", []):
            continue
        text = cell.source
        if cell.cell_type == "code":
            text = "\n".join(line.split("#")[0] for line in text.splitlines())
        for m in _NUMBER.finditer(text):
            out.setdefault(f"{float(m.group()):.10g}", m.group())
    return out


def test_distinctive_numbers():
    assert distinctive("49.01") == "49.01" and distinctive("2300") is None and distinctive("0.05") is None
    assert distinctive("1350") == "1350" and distinctive("abc") is None


def defined_functions(source: str) -> list:
    """Functions and classes a cell defines, named lambdas included (`f = lambda ...`)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append(node.name)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda):
            out += [ast.unparse(t) for t in node.targets]
    return out


def test_defined_functions_sees_named_lambdas():
    assert defined_functions("def f():\n    pass\ng = lambda x: x\nsorted(a, key=lambda x: -x)") == ["f", "g"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_defines_no_functions(path):
    nb = nbformat.read(path, as_version=4)
    names = [n for c in nb.cells if c.cell_type == "code" for n in defined_functions(c.source)]
    assert not names, f"{path.name} defines {names}; put them in the replication package"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_types_no_paper_number(path):
    held = paper_numbers()
    typed = typed_numbers(nbformat.read(path, as_version=4))
    hits = {raw: held[key] for key, raw in typed.items() if key in held}
    assert not hits, f"{path.name} types paper numbers {hits}; read them with replication.core.paper"
