"""Atomic writes and content hashes: an interrupted run never leaves a half-written file."""
import hashlib
import json
import os
import secrets
from pathlib import Path


def write_bytes(path, data: bytes) -> Path:
    """Write bytes to path atomically (temporary file in the same folder, then rename).

    The file gets the permissions a plain open() would give it (0666 less the umask, so 0644 under the usual
    umask 022): results are meant to be read by others."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
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


def sha256(path) -> str:
    """Full sha256 of a file's bytes, read in chunks."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


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
