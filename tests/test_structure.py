"""The package's shape: no import circles, short modules, notebooks that orchestrate and read paper numbers from data/."""
import ast
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pandas as pd
import pytest

from replication.core import config

PACKAGE = config.ROOT / "replication"
MAX_LINES = 400


def module_name(path: Path) -> str:
    """'replication.papers.mae.mae' for replication/papers/mae/mae.py ('replication.core' for its __init__.py)."""
    parts = path.relative_to(config.ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(source: str, name: str, is_package: bool, known) -> set:
    """Modules of the package that a module imports, at the top or inside functions, as full dotted names
    (`from replication.lm import grpo` -> replication.lm.grpo; `from . import x` resolved against the module)."""
    here = name if is_package else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            if not base.startswith("replication"):
                continue
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("replication")}
    return out


def graph(mods: dict = None) -> dict:
    """Module -> the package's modules it imports (top-level and function-local imports alike)."""
    mods = modules() if mods is None else mods
    return {m: imports(p.read_text(), m, p.name == "__init__.py", mods) & set(mods) for m, p in mods.items()}


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


# ---- layers: core < lm < one folder per paper (and notebook 00's setup) < scale < the ledger < the run machinery ---

FOLDERS = {"core", "lm", "setup", "scale", "ledger", "run"}


def layer(module: str) -> str:
    """The layer a module belongs to: core, lm, papers.<paper>, setup, scale, ledger (the index, report, forest plot,
    comparison, rerun projection, digests and provenance stamp) or run (the runner, the workbook record, the
    parameter registry, the store's command line, and the package's top level: the command line)."""
    parts = module.split(".")
    if len(parts) == 1:
        return "run"
    if parts[1] == "papers":
        return ".".join(parts[1:3]) if len(parts) > 2 else "papers"
    return parts[1] if parts[1] in FOLDERS else "run"


def allowed(src: str, dst: str) -> bool:
    """core imports only core; lm imports core and lm; a paper (or notebook 00's setup) imports core, lm and its own
    folder, never another paper; scale imports everything below it; the ledger reads what runs wrote, with the
    core's help only; the run machinery imports any layer."""
    a, b = layer(src), layer(dst)
    if a == b or dst == "replication":  # the package root holds only __version__
        return True
    below = {"core": set(), "lm": {"core"}, "scale": {"core", "lm", "setup", "papers"}, "ledger": {"core"},
             "run": {"core", "lm", "setup", "papers", "scale", "ledger"}}
    if a in below:
        return b in below[a] or b.startswith("papers.") and "papers" in below[a]
    if a.startswith("papers.") or a in ("setup", "papers"):
        return b in ("core", "lm") or b == "papers" and a.startswith("papers.")
    return False


def violations(g: dict) -> list:
    return sorted(f"{src} -> {dst} ({layer(src)} may not import {layer(dst)})"
                  for src, dsts in g.items() for dst in dsts if not allowed(src, dst))


def test_layers_hold():
    assert not violations(graph()), "\n".join(violations(graph()))


def test_layer_check_fails_on_a_paper_importing_another_paper(tmp_path):
    mods = {**modules(), "replication.papers.mae.planted": tmp_path / "planted.py"}
    (tmp_path / "planted.py").write_text("def f():\n    from replication.papers.rlpr import rlpr\n    return rlpr\n")
    found = [v for v in violations(graph(mods)) if "planted" in v]
    assert found == ["replication.papers.mae.planted -> replication.papers.rlpr.rlpr (papers.mae may not import "
                     "papers.rlpr)"], found


def test_layer_check_fails_on_core_importing_a_paper(tmp_path):
    mods = {**modules(), "replication.core.planted": tmp_path / "planted.py"}
    (tmp_path / "planted.py").write_text("from replication.papers.malt import malt\nfrom ..lm import grpo\n")
    found = [v for v in violations(graph(mods)) if "planted" in v]
    assert found == ["replication.core.planted -> replication.lm.grpo (core may not import lm)",
                     "replication.core.planted -> replication.papers.malt.malt (core may not import papers.malt)"], found


def test_core_and_the_runner_import_no_torch():
    """The core layer, the runner and the parameter registry load without torch (or a model): the runner checks
    parameters before any kernel starts, and the core holds no model machinery."""
    names = sorted(m for m in modules() if layer(m) == "core") + ["replication.run.runner", "replication.run.settings"]
    code = ("import importlib, sys\n"
            f"for m in {names!r}:\n    importlib.import_module(m)\n"
            "print(sorted(k for k in ('torch', 'transformers', 'peft') if k in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=config.ROOT, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_every_notebook_has_its_parameter_class_beside_its_code():
    from replication.run import settings  # noqa: F401  (registers the classes)
    from replication.core import params

    assert sorted(params.REGISTRY) == [p.stem for p in NOTEBOOKS]
    for stem, cls in params.REGISTRY.items():
        assert cls.__module__.endswith(".params") and layer(cls.__module__) != "run", (stem, cls.__module__)


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_are_short(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.name} has {n} lines; split it by what it holds (at most {MAX_LINES})"


# ---- notebooks orchestrate and explain ----------------------------------------------------------------

NOTEBOOKS = sorted(config.NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?=x?(?![\w.]))")  # "4.5x" too


def distinctive(value: str):
    """A paper number as it would be typed, if it could not be typed by chance: at least three significant
    digits and not a round setting such as 200, 1000 or 0.05 (those are also the workbook's own values)."""
    try:
        x = float(value)
    except ValueError:
        return None
    digits = re.sub(r"[^0-9]", "", f"{abs(x):.10g}").strip("0")
    return f"{x:.10g}" if len(digits) >= 3 else None


def paper_values() -> dict:
    """Every number of data/paper/*.csv (but the source column) -> where it is held."""
    out = {}
    for csv in sorted((config.ROOT / "data" / "paper").glob("*.csv")):
        frame = pd.read_csv(csv, dtype=str)
        for col in frame.columns:
            if col == "source":
                continue
            for cell in frame[col].dropna():
                for part in str(cell).split("|"):
                    try:
                        out.setdefault(float(part.strip()), f"{csv.name}:{col}")
                    except ValueError:
                        pass
    return out


def significant(raw: str) -> int:
    return len(re.sub(r"[^0-9]", "", raw.lstrip("-")).lstrip("0").rstrip("0") if "." not in raw
               else re.sub(r"[^0-9]", "", raw.lstrip("-")).lstrip("0"))


def paper_hits(lines, held: dict, code: bool = False) -> dict:
    """Paper numbers typed on these lines, at any precision. A typed number is the paper's when
    - it equals a distinctive paper number (three or more significant digits), or, typed with two or more
      significant digits as a ratio ("4.5x") or on a line that names the paper, a distinctive paper number rounds
      to it at the precision typed (4.5 for the paper's 4.54: "4.5x less noise"); or
    - (code lines) its line's comment says "paper" and the number, in the code, equals a paper number however round
      (`kl_beta = 0.001  # the paper KL coefficient`)."""
    hits = {}
    for line in lines:
        says_paper = code and "#" in line and "paper" in line.split("#", 1)[1].lower()
        for m in _NUMBER.finditer(line.split("#", 1)[0] if says_paper else line):
            raw = m.group()
            x = float(raw)
            decimals = len(raw.split(".")[1]) if "." in raw else 0
            rounded_ok = significant(raw) >= 2 and (line[m.end():m.end() + 1] == "x" or "paper" in line.lower())
            for v, where in held.items():
                if says_paper and x == v:
                    hits[raw] = where
                elif distinctive(f"{v:.10g}") and (x == v or rounded_ok and decimals and round(v, decimals) == x
                                                   and significant(f"{v:.10g}") > significant(raw)):
                    hits[raw] = where
    return hits


def notebook_hits(nb, held: dict) -> dict:
    """paper_hits over every line a reader sees: markdown, code and its comments, the parameters cell included (a
    default that is the paper's number belongs in data/paper/, read by the notebook)."""
    hits = {}
    for cell in nb.cells:
        hits.update(paper_hits(cell.source.splitlines(), held, code=cell.cell_type == "code"))
    return hits


def test_distinctive_numbers():
    assert distinctive("49.01") == "49.01" and distinctive("2300") is None and distinctive("0.05") is None
    assert distinctive("1350") == "1350" and distinctive("abc") is None


def test_paper_hits_at_any_precision():
    held = {4.54: "noise", 0.001: "settings", 1350.0: "temperature", 0.7: "x", 200.0: "steps"}
    assert paper_hits(['run.claim("pairwise judging has 4.5x less noise", ...)'], held) == {"4.5": "noise"}
    assert paper_hits(["kl_beta = 0.001                   # the paper KL coefficient"], held, code=True) == {"0.001": "settings"}
    assert paper_hits(["kl_beta = 0.001                   # the paper KL coefficient"], held) == {}  # prose: too round
    assert paper_hits(["start = 1350"], held) == {"1350": "temperature"}
    assert paper_hits(["temperature = 0.7", "n_heldout = 200", "lr = 1e-3", "ratio 4.6", "figsize=(4.5, 3)"], held) == {}
    assert paper_hits(["the paper's ratio, about 4.5"], held) == {"4.5": "noise"}
    assert paper_hits(["t = 0.7  # as in the paper"], held, code=True) == {"0.7": "x"}
    assert paper_hits(["t = 0.7  # not from a paper, 200 steps"], held, code=True) == {"0.7": "x"}  # code part only
    assert paper_hits(["steps = 200  # 4.5 in the paper"], held, code=True) == {"200": "steps"}


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
    hits = notebook_hits(nbformat.read(path, as_version=4), paper_values())
    assert not hits, f"{path.name} types paper numbers {hits}; read them with replication.core.paper"
