"""The notebooks' parameter classes, each beside its notebook's code (`<folder>/params.py`, found by walking the
package): importing this module registers them with replication.core.params. It imports no model machinery (no
torch), so the runner can check parameters before any kernel starts."""
import importlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
MODULES = tuple(".".join(("replication", *p.relative_to(PACKAGE).with_suffix("").parts))
                for p in sorted(PACKAGE.rglob("params.py")) if p.parent != PACKAGE / "core")
for _name in MODULES:
    importlib.import_module(_name)
