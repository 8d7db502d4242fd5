"""Atomic writes and content hashes: an interrupted run never leaves a half-written file."""
import hashlib
import json
import os
import tempfile
from pathlib import Path


def write_bytes(path, data: bytes) -> Path:
    """Write bytes to path atomically (temporary file in the same folder, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text(path, text: str) -> Path:
    """Write text to path atomically."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path, obj) -> Path:
    """Write obj as indented JSON atomically."""
    return write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_jsonable) + "\n")


def read_json(path):
    """Read a JSON file."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def digest(*parts) -> str:
    """Short sha256 of strings, bytes or JSON-able objects, in order."""
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, bytes):
            h.update(p)
        elif isinstance(p, str):
            h.update(p.encode())
        else:
            h.update(json.dumps(p, sort_keys=True, default=_jsonable).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _jsonable(x):
    """Turn numpy scalars and arrays, and paths, into plain JSON values."""
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"cannot write {type(x).__name__} as JSON")
