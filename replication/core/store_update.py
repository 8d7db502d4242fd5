"""Writing and checking the results store (core.store): `update` copies a run's cache entries in, without
weights or optimizer states; `verify` checks every entry; `fingerprint` hashes the code a notebook's entries are made
by; `accept` records it for a change that changes no entry."""
import ast
import gzip
import hashlib
import json
import platform
import subprocess
import time
from pathlib import Path

from . import config, files
from .store import (FETCHED, FORMAT, MARKER, PLAIN, RUN_FILES, StoreError, _blob, default_root, manifest,
                    manifest_path, version)


def _strip_tensors(value, withheld: list, path=()):
    """value with every tensor replaced by a marker (its shape and dtype), the paths of those tensors in `withheld`;
    numpy values as JSON."""
    import torch

    if torch.is_tensor(value):
        withheld.append("/".join(map(str, path)))
        return {MARKER: "tensor", "shape": list(value.shape), "dtype": str(value.dtype).replace("torch.", "")}
    if isinstance(value, dict):
        return {str(k): _strip_tensors(v, withheld, path + (k,)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strip_tensors(v, withheld, path + (i,)) for i, v in enumerate(value)]
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    raise StoreError(f"a value of type {type(value).__name__} at {'/'.join(map(str, path))} cannot be stored as data")


def _value_contents(entry_dir: Path):
    """(kind, contents, key, seconds, withheld paths) of an intact cache entry folder, or None when it is not one."""
    try:
        meta = files.read_json(entry_dir / "meta.json")
        data = (entry_dir / meta["file"]).read_bytes()
    except (OSError, ValueError, KeyError, TypeError):
        return None   # torn or missing: not an entry
    if hashlib.sha256(data).hexdigest() != meta.get("sha256") or \
            entry_dir.name.rsplit("-", 1)[-1] != files.digest(meta.get("key")):
        return None
    if meta["kind"] != "torch":
        return meta["kind"], data, meta["key"], meta.get("seconds"), []
    import io

    import torch

    try:
        value = torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:  # noqa: BLE001 - anything but tensors and plain containers
        raise StoreError(f"{entry_dir.name}: a torch entry that is not tensors and plain data ({type(e).__name__})")
    withheld = []
    stripped = _strip_tensors(value, withheld)
    return "withheld", json.dumps(stripped).encode(), meta["key"], meta.get("seconds"), withheld


def _run_contents(folder: Path):
    """(contents, key, seconds) of a finished training run folder, or None when it is not finished."""
    import torch

    if not (folder / "done.json").is_file() or not (folder / "config.json").is_file():
        return None
    record = {"files": {name: (folder / name).read_text() for name in RUN_FILES if (folder / name).is_file()}}
    states = {}
    fetched = folder / FETCHED
    if fetched.is_file():   # a run copied from the store: its states came with it
        states = files.read_json(fetched).get("states", {})
    for ckpt in sorted((folder / "checkpoints").glob("step_*.pt")):
        state = torch.load(ckpt, weights_only=False, map_location="cpu")   # this machine's own checkpoint
        withheld = []
        states[str(int(state["step"]))] = _strip_tensors(state.get("extra") or {}, withheld)
        if withheld:
            raise StoreError(f"{folder.name}: the loop state after step {state['step']} holds tensors "
                             f"({', '.join(withheld[:3])}); the store keeps plain data only")
    record["states"] = states
    rows = [json.loads(x) for x in record["files"].get("metrics.jsonl", "").splitlines() if x.strip()]
    seconds = sum(r.get("wall_s") or 0.0 for r in rows) or None
    return json.dumps(record, sort_keys=True).encode(), files.read_json(folder / "config.json"), seconds


_machine = {}


def machine(root=None) -> dict:
    """What made the entries: the checkout's commit, torch, the CPU's bf16 instruction sets, whether bf16 has fast
    kernels there (what "auto" precision resolves to: core.store.auto_precision), the machine."""
    if not _machine:
        import torch

        try:
            commit = subprocess.run(["git", "-C", str(root or config.ROOT), "rev-parse", "--short=12", "HEAD"],
                                    capture_output=True, text=True, timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            commit = None
        kernels = bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
        _machine.update(commit=commit, torch=torch.__version__, cpu=config.cpu_bf16(), bf16_kernels=kernels,
                        machine=platform.machine())
    return dict(_machine)


def _put_object(root: Path, data: bytes) -> tuple:
    """Write data (compressed, named by its sha256) unless it is there: (sha256, object path, compressed size)."""
    sha = hashlib.sha256(data).hexdigest()
    rel = f"objects/{sha[:2]}/{sha}.gz"
    path = root / rel
    if not path.is_file():
        files.write_bytes(path, gzip.compress(data, compresslevel=9, mtime=0))
    return sha, rel, path.stat().st_size


def fingerprint(notebook: str, folder: Path = None) -> str:
    """A hash of the code a notebook's entries are made by: its code cells and every package module they import,
    directly or through other package modules, each as its syntax tree without docstrings (so a comment, a
    docstring or a line break changes nothing; a changed statement does)."""
    import nbformat

    folder = Path(folder or config.NOTEBOOKS)
    nb = nbformat.read(folder / f"{notebook}.ipynb", as_version=4)
    code = "\n".join(line for c in nb.cells if c.cell_type == "code"
                     for line in c.source.splitlines() if not line.lstrip().startswith(("%", "!")))
    parts, seen, todo = [_normalised(code)], set(), _imports(ast.parse(code), None)
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        src = _module_file(mod)
        if src is None:
            continue
        tree = ast.parse(src.read_text())
        parts.append(mod + "\n" + _normalised(tree))
        todo.extend(_imports(tree, mod, src.name == "__init__.py"))
        if mod == "replication.run.settings":   # it imports the parameter modules it finds, not by name
            todo.extend(_params_modules(notebook))
    return files.digest(*sorted(parts))


def _params_modules(notebook: str) -> list:
    """The parameter modules (params.py files) that register `notebook`'s parameter class (`@notebook("<stem>")`):
    only these reach its entries, so a new notebook's folder leaves the other notebooks' fingerprints alone."""
    return [".".join(p.relative_to(config.ROOT).with_suffix("").parts)
            for p in sorted((config.ROOT / "replication").rglob("params.py"))
            if f'notebook("{notebook}")' in p.read_text()]


def _module_file(mod: str):
    base = config.ROOT / Path(*mod.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _imports(tree, current, package: bool = False) -> list:
    """The replication modules a syntax tree imports (`current`: its module's dotted name, for relative imports)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.split(".")[0] == "replication"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                pkg = current.split(".") if package else current.split(".")[:-1]
                pkg = pkg[:len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] != "replication":
                continue
            out.append(base)
            out += [f"{base}.{a.name}" for a in node.names]   # `from pkg import module`
    return out


def _normalised(tree) -> str:
    if isinstance(tree, str):
        tree = ast.parse(tree)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


def update(cache_root, root=None, only=None, log=print, notebooks: Path = None) -> dict:
    """Copy a run's cache entries (`cache_root`: runs/default/cache) into the store: every intact value entry and
    every finished training run of each notebook, without weights or optimizer states, under the notebook's producer
    version and fingerprint; a notebook whose execution has not finished is marked incomplete (`finished`). An entry
    already there with the same contents keeps its record (so a rerun that changes nothing changes no file); objects
    no manifest names are removed. Returns {notebook: counts}."""
    root = Path(root or default_root())
    cache_root = Path(cache_root)
    if not cache_root.is_dir():
        raise StoreError(f"no cache at {cache_root}: run the notebooks first (python -m replication run), or give "
                         f"the run's cache folder")
    made = machine()
    counts = {}
    for nb_dir in sorted(p for p in cache_root.iterdir() if p.is_dir()):
        notebook = nb_dir.name
        if not (Path(notebooks or config.NOTEBOOKS) / f"{notebook}.ipynb").is_file():
            log(f"store: {nb_dir} is not the cache of a notebook in {notebooks or config.NOTEBOOKS}; left out")
            continue
        if only and notebook not in only:
            continue
        old = manifest(root, notebook)
        entries = dict(old.get("entries", {}))
        if old.get("version") not in (None, version(notebook)):   # a bumped version: every old entry is stale
            entries = {}
        c = {"added": 0, "kept": 0, "replaced": 0, "withheld": 0}
        candidates = [(d, "value") for d in nb_dir.iterdir() if d.is_dir() and d.name != "training"]
        candidates += [(d, "run") for d in (nb_dir / "training").iterdir() if d.is_dir()] \
            if (nb_dir / "training").is_dir() else []
        intact = []
        for d, kind in sorted(candidates, key=lambda x: x[0].name):
            got = _value_contents(d) if kind == "value" else _run_contents(d)
            if got is None:
                continue
            intact.append(d)
            if kind == "value":
                kind, data, key, seconds, withheld = got
            else:
                (data, key, seconds), withheld = got, []
            ident = d.name if kind != "run" else f"training/{d.name}"
            sha = hashlib.sha256(data).hexdigest()
            before = entries.get(ident)
            if before is not None and before["sha256"] == sha and before.get("version") == version(notebook):
                c["kept"] += 1
                continue
            sha, rel, size = _put_object(root, data)
            entries[ident] = {
                "kind": kind, "key": key, "sha256": sha, "object": rel, "bytes": size, "raw_bytes": len(data),
                "seconds": None if seconds is None else round(float(seconds), 2), "version": version(notebook),
                "withheld": withheld or None,
                "made": {**made, "date": time.strftime("%Y-%m-%d", time.gmtime(_mtime(d)))},
                "made_at": round(_mtime(d), 3)}
            c["replaced" if before else "added"] += 1
            c["withheld"] += bool(withheld)
        record = {"notebook": notebook, "format": FORMAT, "version": version(notebook),
                  "code": fingerprint(notebook, notebooks),
                  "complete": finished(nb_dir, intact), "entries": dict(sorted(entries.items()))}
        if record != old:
            files.write_json(manifest_path(root, notebook), record)
        counts[notebook] = c
        log(f"store {notebook}: {c['added']} added, {c['replaced']} replaced, {c['kept']} as they were"
            + (f" ({c['withheld']} with their weights left out)" if c["withheld"] else "")
            + ("" if record["complete"] else "; its run has not finished: the store holds part of it"))
    _prune(root)
    return counts


def finished(nb_dir: Path, made) -> bool:
    """Whether the notebook's execution finished after the entries in `made` were written: the runner writes the
    notebook's state file (runs/<profile>/state/<notebook>.json) when it succeeds. The store of a run cut off part way
    keeps what that run made, marked incomplete: the next run, in any clone, reads those entries and makes the rest."""
    state = nb_dir.parent.parent / "state" / f"{nb_dir.name}.json"
    return state.is_file() and all(_mtime(d) <= state.stat().st_mtime for d in made)


def complete(man: dict) -> bool:
    """Whether a manifest holds a finished run's entries (manifests written before this mark: yes)."""
    return man.get("complete", True) is not False


def _mtime(d: Path) -> float:
    marker = d / ("meta.json" if (d / "meta.json").is_file() else "done.json")
    return marker.stat().st_mtime if marker.is_file() else time.time()


def _prune(root: Path) -> None:
    """Remove the objects no manifest names."""
    named = {e["object"] for m in root.glob("*.json") for e in files.read_json(m).get("entries", {}).values()}
    for obj in (root / "objects").glob("*/*.gz") if (root / "objects").is_dir() else []:
        if f"objects/{obj.parent.name}/{obj.name}" not in named:
            obj.unlink()


def accept(notebooks, root=None, log=print) -> None:
    """Record the current code's fingerprint in the notebooks' manifests, keeping their version: the statement that
    a change of that code changes none of its entries (module docstring)."""
    root = Path(root or default_root())
    for notebook in notebooks:
        man = manifest(root, notebook)
        if not man.get("entries"):
            raise StoreError(f"store accept {notebook}: the store has no entries of it")
        if man.get("version") != version(notebook):
            raise StoreError(f"store accept {notebook}: its entries are of version {man.get('version')}, the code is "
                             f"at {version(notebook)}; run the notebook and `store update` instead")
        files.write_json(manifest_path(root, notebook), {**man, "code": fingerprint(notebook)})
        log(f"store {notebook}: fingerprint recorded under version {man['version']}")


def verify(root=None, log=print) -> list:
    """Check every entry: its object is there and its contents match their sha256, a value entry is valid JSON made
    for its key's hash (its id), a run's files are the loop's. Returns the problems (one line each)."""
    root = Path(root or default_root())
    problems, n = [], 0
    for man_path in sorted(root.glob("*.json")):
        man = files.read_json(man_path)
        notebook = man.get("notebook", man_path.stem)
        for ident, entry in man.get("entries", {}).items():
            n += 1
            where = f"{notebook}/{ident}"
            try:
                if entry.get("kind") not in PLAIN:
                    raise StoreError(f"of kind {entry.get('kind')!r}, not plain data")
                data = _blob(root, entry)
                name = ident.split("/")[-1]
                if name.rsplit("-", 1)[-1] != files.digest(entry["key"]):
                    raise StoreError("its id does not carry its key's hash")
                value = json.loads(data)
                if entry["kind"] == "run" and set(value["files"]) - set(RUN_FILES):
                    raise StoreError("a training run with files the loop does not write")
            except (StoreError, ValueError, KeyError) as e:
                problems.append(f"{where}: {e}")
        if man.get("version") != version(notebook):
            problems.append(f"{notebook}: entries of version {man.get('version')}, the code is at "
                            f"{version(notebook)} (they are remade; `store update` after a run)")
    log(f"store {root}: {n} entries checked, {len(problems)} problems")
    for p in problems:
        log(f"  {p}")
    return problems
