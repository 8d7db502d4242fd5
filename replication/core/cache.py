"""The one cache: an expensive result made once per key, stored with its key and a checksum.

`cached(folder, name, key, make)` returns make()'s value, stored under folder/<name>-<hash of key>.
A stored value is used only if its key matches and its checksum holds; a missing, stale or corrupt
entry is rebuilt and one line says why. Values: JSON-able data, a pandas DataFrame (stored as JSON
records), or tensors in plain containers (state dicts: torch.save, read back with weights_only=True), chosen by what
make() returns. Where the results store is active (core.store), an entry the folder lacks is first copied from it;
one that came from the store without its tensors reads them as store.Withheld.
"""
import hashlib
import json
import time
from pathlib import Path

from . import files, phases, store as results


def _plain(x):
    """JSON for numpy values and paths only: tensors go to torch.save, so they come back as tensors."""
    if type(x).__module__.startswith("torch"):
        raise TypeError("a torch value")
    return files._jsonable(x)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def path_for(folder, name: str, key) -> Path:
    """folder/<name>-<hash of key>: the same key finds the same entry."""
    if not name or "/" in name:
        raise ValueError(f"name={name!r} is not allowed; use a short name without '/'")
    return Path(folder) / f"{name}-{files.digest(key)}"


def load(path: Path, key):
    """(value, 'ok') if the entry at path is intact and made for key; else (None, why not)."""
    value, status, _ = _load(path, key)
    return value, status


def _check(path: Path, key):
    """(status, meta, data) of the entry at path: status 'ok' when it is intact and made for key (meta and data
    None otherwise); nothing is decoded. An entry not intact here is copied from the results store where it has
    one (core.store.fetch_value)."""
    status, meta, data = _check_here(path, key)
    if status != "ok" and results.active() is not None and results.fetch_value(path, key):
        status, meta, data = _check_here(path, key)
    return status, meta, data


def _check_here(path: Path, key):
    meta_path = path / "meta.json"
    if not meta_path.is_file():
        return "missing", None, None
    try:
        meta = files.read_json(meta_path)
        data = (path / meta["file"]).read_bytes()
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable ({type(e).__name__})", None, None
    if meta.get("key") != json.loads(json.dumps(key, default=files._jsonable)):
        return "made for a different key", None, None
    if meta.get("sha256") != _sha(data):
        return "contents do not match their checksum", None, None
    if meta.get("store") and results.active() is None:
        return "copied from the results store, which this run does not read (--retrain)", None, None
    return "ok", meta, data


def intact(folder, name: str, key) -> bool:
    """cached(folder, name, key, ...) would load its entry (intact and made for key) rather than make it; checked
    without decoding the value."""
    return _check(path_for(folder, name, key), key)[0] == "ok"


def _load(path: Path, key):
    """load's (value, status) and the entry's meta (None unless intact), read once."""
    status, meta, data = _check(path, key)
    if status != "ok":
        return None, status, None
    if meta["kind"] == "torch":
        import io

        import torch

        return torch.load(io.BytesIO(data), weights_only=True), "ok", meta
    value = json.loads(data)
    if meta["kind"] == "withheld":
        return results.revive(value, f"cache entry {path.name}"), "ok", meta
    if meta["kind"] == "frame":
        import pandas as pd

        value = pd.DataFrame(value)
    return value, "ok", meta


def store(path: Path, key, value, seconds: float = None) -> str:
    """Write value and its meta (key, kind, checksum, and `seconds`: how long it took to make) atomically; the meta
    goes last, so a torn write reads as missing."""
    import pandas as pd

    if isinstance(value, pd.DataFrame):
        kind, data = "frame", json.dumps(value.to_dict("records"), default=files._jsonable).encode()
    else:
        try:
            kind, data = "json", json.dumps(value, default=_plain).encode()
        except TypeError:
            import io

            import torch

            buf = io.BytesIO()
            torch.save(value, buf)
            kind, data = "torch", buf.getvalue()
    name = "value.pt" if kind == "torch" else "value.json"
    path.mkdir(parents=True, exist_ok=True)
    (path / "meta.json").unlink(missing_ok=True)
    files.write_bytes(path / name, data)
    meta = {"key": key, "kind": kind, "file": name, "sha256": _sha(data), "execution": phases.execution()}
    if seconds is not None:
        meta["seconds"] = round(float(seconds), 2)
    files.write_json(path / "meta.json", meta)
    return kind


def cached(folder, name: str, key, make, log=print):
    """make()'s value, computed once per key and reloaded afterwards (see the module docstring). A reloaded value
    counts its making time to the phase profile's reused tally (phases.reused)."""
    path = path_for(folder, name, key)
    value, status, meta = _load(path, key)
    if status == "ok":
        phases.reused(meta.get("seconds"))
        return value
    if status != "missing" and log:
        log(f"cache {name}: rebuilt ({status})")
    t0 = time.perf_counter()
    try:
        value = make()
    except results.WeightsMissing as e:   # name the entry that needed them
        if "(the missing entry:" in str(e):
            raise
        raise results.WeightsMissing(f"{e} (the missing entry: {path.parent.name}/{path.name})") from None
    kind = store(path, key, value, seconds=time.perf_counter() - t0)
    if results.remaking(path):   # `store verify --remake`: this entry was the one to make
        raise results.Remade(f"{path.name} re-made")
    if kind == "json":  # hand back exactly what a later load returns (tuples as lists...)
        value = json.loads(json.dumps(value, default=_plain))
    return value
