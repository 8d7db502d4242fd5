"""The committed results store: what the default profile's figures and claims are computed from, in the repository.

A notebook's cache (runs/<profile>/cache/<notebook>/) holds two kinds of entry: values made once per key
(core.cache: replies, tables, trees, traces) and training runs (lm.loop.RunFolder: config, step log, checkpoints).
The store keeps a copy of each, without model weights or optimizer states, under results/default/:

    results/default/<notebook>.json      the notebook's manifest: its producer version and code fingerprint, and
                                         each entry by its cache id (<name>-<hash of key>, training/<name>-<hash>):
                                         kind, key, sha256, sizes, seconds it took to make, and what made it
                                         (commit, date, torch, CPU bf16 instruction sets, bf16 kernels, machine)
    results/default/objects/ab/<sha256>.gz   the entries' contents, gzip-compressed, named by their sha256

A cache lookup that misses in the run folder asks the store (`fetch_value`, `fetch_run`) when the store is active
(`activate`: the default profile, unless --retrain); an intact entry made by the notebook's current producer
version is copied into the run folder's cache and read from there as any cached entry, marked as from the store.
A damaged or stale entry is never read: one line says why and the entry is made again. Writes go only to the run
folder; the store changes only through `update` (python -m replication store update) and `accept` (a manifest's
fingerprint).

Contents are plain data (JSON text; no pickles): a value entry's value.json bytes as the cache wrote them; a
training run's files (config, log, done and copied markers) and the loop state after each kept checkpoint; a cache
entry that held tensors (weights) keeps its structure with each tensor replaced by a marker (`Withheld` when read):
whatever needs those weights again and is not itself in the store stops with one line naming the entry and --retrain.

Producer versions: every entry of a notebook is made by that notebook's code, its cells and the package modules
they import (`fingerprint`, comments and docstrings left out). The manifest records the version and fingerprint its
entries were made under; `VERSIONS` holds the code's version. A changed fingerprint under the same version fails a
test (tests/test_store.py), so whoever changes that code says which it is: a change of results (bump VERSIONS: the
notebook's entries are stale and remade) or none (`store accept <notebook>` records the new fingerprint).
"""
import gzip
import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

from . import config, files

ENV = "REPLICATION_STORE"     # a store folder, or "off"; set by activate, inherited by a notebook's workers
FETCHED = "store.json"        # in a run folder's training run: it came from the store (provenance, loop states)
FORMAT = 1
RUN_FILES = ("config.json", "metrics.jsonl", "done.json", "copied.json")   # a training run's files the store keeps
PLAIN = ("json", "frame", "withheld", "run")   # the kinds of entry the store holds: JSON text, nothing to unpickle

# The producer version of each notebook's entries (module docstring): bump it when a change of that notebook's code
# changes what its entries hold.
VERSIONS = {"00_setup_and_baselines": 1, "01_noise_analysis": 1, "02_elo_dynamics": 1, "03_rlpr_debiasing": 1,
            "04_debate_judge_accuracy": 1, "05_malt_trajectory_trees": 1, "06_multi_agent_evolve": 1}


REMAKE = "REPLICATION_STORE_REMAKE"   # "<notebook>/<id>": that entry is not read but made, then the notebook stops


class Remade(RuntimeError):
    """Raised by the cache once it has made the entry REMAKE names: the notebook stops there (results.remake)."""


def remaking(path) -> bool:
    """Whether the cache path is the entry REMAKE names."""
    ident = entry_id(path)
    return ident is not None and os.environ.get(REMAKE) == "/".join(ident)


class WeightsMissing(RuntimeError):
    """A model whose trained weights the results store withheld was asked to compute (lm.models.withhold)."""


class StoreError(RuntimeError):
    """A store command cannot go on; the message is one line naming the fix."""


def version(notebook: str) -> int:
    """The code's producer version of a notebook's entries (VERSIONS; 1 for a notebook it does not list)."""
    return VERSIONS.get(notebook, 1)


def default_root() -> Path:
    return config.ROOT / "results" / "default"


def activate(profile: str) -> Path:
    """Which store this process and its workers read (workbook.start): REPLICATION_STORE when it names a folder,
    none when it says "off", else the committed store for the default profile and none for the others. Returns it
    (None: none), and sets the variable so the workers agree."""
    value = os.environ.get(ENV)
    if value is None:
        value = str(default_root()) if profile == "default" else "off"
        os.environ[ENV] = value
    return active()


def active():
    """The store this process reads (a folder), or None."""
    value = os.environ.get(ENV)
    return None if value in (None, "", "off") else Path(value)


def entry_id(path) -> tuple:
    """(notebook, id) of a cache entry's path: the parts after the run folder's `cache` folder, e.g.
    ('03_rlpr_debiasing', 'heldout-base-0123abcd') or (..., 'training/rlpr-s0-...'); None where there is none."""
    parts = Path(path).parts
    if "cache" not in parts:
        return None
    rest = parts[len(parts) - 1 - parts[::-1].index("cache") + 1:]
    return (rest[0], "/".join(rest[1:])) if len(rest) >= 2 else None


# ---------------------------------------------------------------- reading

def manifest_path(root, notebook: str) -> Path:
    return Path(root) / f"{notebook}.json"


_manifests = {}


def manifest(root, notebook: str) -> dict:
    """The notebook's manifest ({} entries where it has none), read once per process and file version."""
    path = manifest_path(root, notebook)
    try:
        stat = path.stat()
    except OSError:
        return {"notebook": notebook, "entries": {}}
    tag = (str(path), stat.st_mtime_ns, stat.st_size)
    if tag not in _manifests:
        _manifests.clear() if len(_manifests) > 32 else None
        _manifests[tag] = files.read_json(path)
    return _manifests[tag]


def _blob(root, entry: dict) -> bytes:
    """An entry's contents, checked against its sha256 (StoreError: missing or damaged)."""
    path = Path(root) / entry["object"]
    try:
        data = gzip.decompress(path.read_bytes())
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise StoreError(f"unreadable ({type(e).__name__})") from None
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise StoreError("contents do not match their checksum")
    return data


def _same_key(a, b) -> bool:
    return json.loads(json.dumps(a, default=files._jsonable)) == json.loads(json.dumps(b, default=files._jsonable))


def lookup(path, key, kind: str, log=print):
    """(entry, contents) of the store's entry for the cache path `path` made for `key`, or None: none there, or one
    that cannot be read (damaged, made for another key, by another producer version, or of another kind), which
    one line names."""
    root = active()
    ident = entry_id(path) if root is not None else None
    if ident is None:
        return None
    notebook, name = ident
    if remaking(path):
        return None
    man = manifest(root, notebook)
    entry = man.get("entries", {}).get(name)
    if entry is None:
        return None
    why = None
    current = version(notebook)
    if entry.get("version") != current:
        why = f"made by producer version {entry.get('version')}, the code is at {current} (store.VERSIONS)"
    elif entry.get("kind") not in PLAIN:
        why = f"of kind {entry.get('kind')!r}, not plain data (one of {', '.join(PLAIN)}): the store reads no pickles"
    elif (entry["kind"] == "run") != (kind == "run"):
        why = f"a {entry['kind']} entry where a {kind} was asked for"
    elif not _same_key(entry.get("key"), key):
        why = "made for a different key"
    if why is None:
        try:
            return entry, _blob(root, entry)
        except StoreError as e:
            why = str(e)
    if log:
        log(f"store {notebook}/{name}: not read ({why}); made again")
    return None


def auto_precision(root, notebook: str):
    """What a precision parameter of "auto" (lm.models.resolve_dtype) stood for where the notebook's stored entries
    were made: "bfloat16" on a machine with bf16 kernels (made.bf16_kernels; in older records a CPU flag set naming
    amx_bf16 or avx512_bf16), else "float32"; None where the store holds none of its entries or they disagree.
    A default-profile run reads "auto" as this (workbook.start), so a CPU of another kind finds the stored entries."""
    kinds = set()
    for entry in manifest(root, notebook).get("entries", {}).values():
        made = entry.get("made") or {}
        kernels = made.get("bf16_kernels")
        if kernels is None:
            kernels = any(flag in str(made.get("cpu", "")).split() for flag in ("amx_bf16", "avx512_bf16"))
        kinds.add("bfloat16" if kernels else "float32")
    return kinds.pop() if len(kinds) == 1 else None


def provenance(root, notebook: str) -> dict:
    """What the run folder records about a store entry it copied: the store's commit and date, and this execution."""
    from . import phases

    return {"store": str(root), "notebook": notebook, "execution": phases.execution(), "fetched": time.time()}


def fetch_value(path, key, log=print) -> bool:
    """Copy the store's entry for the cache path `path` and `key` into it (value file, then its meta, as
    core.cache.store writes them; the meta marked `store`). True when it did."""
    found = lookup(path, key, "value", log)
    if found is None:
        return False
    entry, data = found
    path = Path(path)
    notebook, _ = entry_id(path)
    name = "value.json"
    path.mkdir(parents=True, exist_ok=True)
    (path / "meta.json").unlink(missing_ok=True)
    files.write_bytes(path / name, data)
    meta = {"key": key, "kind": entry["kind"], "file": name, "sha256": entry["sha256"],
            "store": provenance(active(), notebook)}
    if entry.get("seconds") is not None:
        meta["seconds"] = entry["seconds"]
    files.write_json(path / "meta.json", meta)
    return True


def fetch_run(folder, key, log=print) -> bool:
    """Copy the store's finished training run for the run folder `folder` (made for `key`) into it: its config,
    step log, done and copied markers, and FETCHED (provenance and the loop state after each kept checkpoint); no
    checkpoint. Only into a folder that holds no log or checkpoint of its own. True when it did."""
    folder = Path(folder)
    if (folder / "metrics.jsonl").exists() or (folder / "checkpoints").exists() or (folder / "done.json").exists():
        return False
    found = lookup(folder, key, "run", log)
    if found is None:
        return False
    entry, data = found
    record = json.loads(data)
    notebook, _ = entry_id(folder)
    for name, text in record["files"].items():
        if name not in RUN_FILES:
            raise StoreError(f"store {notebook}: a training run's file {name!r} is not one of {', '.join(RUN_FILES)}")
        if name != "done.json":
            files.write_text(folder / name, text)
    files.write_json(folder / FETCHED, {**provenance(active(), notebook), "states": record.get("states", {})})
    files.write_text(folder / "done.json", record["files"]["done.json"])   # last: a torn copy reads as unfinished
    return True


class Withheld:
    """A tensor the store does not keep (a cache entry's weights): reading it is an error naming the entry."""

    def __init__(self, where: str, shape=None, dtype=None):
        self.where, self.shape, self.dtype = where, shape, dtype

    def __repr__(self):
        return f"Withheld({self.where!r}, shape={self.shape})"


def withheld_in(value) -> bool:
    """Whether a value read from the cache carries weights the store withheld."""
    if isinstance(value, Withheld):
        return True
    if isinstance(value, dict):
        return any(withheld_in(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(withheld_in(v) for v in value)
    return False


MARKER = "__withheld__"


def revive(value, where: str):
    """A withheld entry's JSON structure with each marker turned into a Withheld."""
    if isinstance(value, dict):
        if MARKER in value:
            return Withheld(where, value.get("shape"), value.get("dtype"))
        return {k: revive(v, where) for k, v in value.items()}
    if isinstance(value, list):
        return [revive(v, where) for v in value]
    return value


def missing_weights(what: str) -> str:
    """The one line a computation that needs weights the store withheld stops with (the cache adds the entry)."""
    return (f"{what} came from the results store without its weights, and a result made from them is not in the "
            f"store: rerun this notebook with `python -m replication run --retrain <notebook>` (or `make retrain`)")


def summary(root=None) -> dict:
    """The store's size and provenance, for the runner's first line and the README: entries, bytes, the newest
    commit and date that made an entry, and the commit that last changed the store (git; None outside a clone)."""
    root = Path(root or default_root())
    entries = [e for m in sorted(root.glob("*.json")) for e in files.read_json(m).get("entries", {}).values()]
    commit = None
    try:
        commit = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%h %cs", "--", "."],
                                capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    dates = sorted(e["made"].get("date") or "" for e in entries)
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.is_dir() else 0
    return {"root": str(root), "entries": len(entries), "bytes": size,
            "commit": commit.split()[0] if commit else None,
            "date": commit.split()[1] if commit else (dates[-1] if dates else None)}


def first_line(root=None) -> str:
    """The runner's first line when it reads the store."""
    s = summary(root)
    if not s["entries"]:
        return f"results store {s['root']} is empty: every result is computed now"
    return (f"results store of {s['commit'] or 'this checkout'}, {s['date']}, {s['entries']} entries "
            f"({size_text(s['bytes'])}); `--retrain` trains from scratch")


def size_text(n: int) -> str:
    """Bytes as MiB, or KiB under one MiB."""
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


# ---------------------------------------------------------------- counting (workbook.Run.finish)

def tally(cache_folder) -> dict:
    """What this execution (phases.execution) read from the store and made itself in a notebook's cache folder:
    {"from_store": entries copied from the store, "made_now": entries made, "store": the store's commit and date
    (None when none was read)}. Entries from earlier executions count in neither."""
    from . import phases

    token, folder = phases.execution(), Path(cache_folder)
    from_store = made = 0
    for meta_path in folder.glob("*/meta.json") if folder.is_dir() else []:
        try:
            meta = files.read_json(meta_path)
        except (OSError, ValueError):
            continue
        if (meta.get("store") or {}).get("execution") == token:
            from_store += 1
        elif meta.get("execution") == token:
            made += 1
    for run in (folder / "training").iterdir() if (folder / "training").is_dir() else []:
        try:
            if (run / FETCHED).is_file() and files.read_json(run / FETCHED).get("execution") == token:
                from_store += 1
            elif (run / "made.json").is_file() and token in files.read_json(run / "made.json"):
                made += 1
        except (OSError, ValueError):
            continue
    root = active()
    info = summary(root) if from_store and root is not None else None
    return {"from_store": from_store, "made_now": made,
            "store": None if info is None else {"commit": info["commit"], "date": info["date"]}}


SOURCES = ("results store", "computed now", "partly from the store")


def claim_source(evidence: str, counts: dict) -> str:
    """Where a claim's numbers come from: a real-model claim of a notebook that read every cached result it used from
    the store and made none is from the results store; one whose notebook also made some is partly from it; every
    other claim (simulation and arithmetic rows are computed in the notebook) is computed now."""
    if not counts.get("from_store") or evidence != "real model":
        return SOURCES[1]
    return SOURCES[0] if not counts.get("made_now") else SOURCES[2]
