"""Figure digests: the sha256 of every figure file a run wrote, with the stamp parts of that run, so a rerun says
which figures changed and why (code, parameters, data/, the machine, the CPU's bf16 instruction set, the device the
models computed on: the CPU or a GPU), and calls a change with none of these a determinism bug."""
from pathlib import Path

from replication.core import files
from replication.core.config import Paths

# Figures that plot wall-clock measurements: they change on every run, and that is expected.
TIMED_FIGURES = ("00b_generation_throughput",)
REASONS = {"notebook": "code (the notebook)", "package": "code (the package)", "params": "parameters",
           "data": "data (data/)", "machine": "the machine or its thread count",
           "cpu_bf16": "the CPU's bf16 instruction set", "accelerator": "the device the models computed on"}
NAMED = ("cpu_bf16", "accelerator")   # parts whose change is shown as before -> after


def digests_path(profile: str, name: str = None) -> Path:
    """digests.json beside the index: figures/digests.json for the default profile."""
    return Paths(profile, name).figures / "digests.json"


file_sha256 = files.sha256


def why_changed(before: dict, parts: dict) -> list:
    """The stamp parts (notebook, params, package, data, machine, CPU bf16 instruction set, device) that differ from
    the run recorded before; a change of CPU names both instruction sets, a change of device both devices (a record
    older than the part: 'not recorded')."""
    out = []
    for k in parts:
        if before.get(k) != parts[k]:
            out.append(f"{REASONS[k]} ({before.get(k) or 'not recorded'} -> {parts[k]})" if k in NAMED
                       else REASONS.get(k, k))
    return out


def record_digests(profile: str, stem: str, parts: dict, stamp: str, names, log=print, name: str = None) -> dict:
    """Store the sha256 of each figure file a notebook wrote, with the stamp parts of the run that wrote it,
    in digests.json (one entry per notebook; the others are kept), and log each figure whose digest changed
    since the recorded run with the reason: the code (notebook or package), the parameters, data/, the machine
    (CPU numerics depend on the thread count), the CPU's bf16 instruction set, the device (the CPU or a GPU), or none
    of them: a determinism bug, logged loudly.
    Returns {figure file: reason}."""
    path = digests_path(profile, name)
    book = files.read_json(path) if path.is_file() else {}
    entries = book.get("notebooks", {})
    old = entries.get(stem)
    new = {n: file_sha256(Paths(profile, name).figures / n) for n in sorted(names)}
    changed = {}
    if old is not None:
        causes = why_changed(old.get("parts", {}), parts)
        for file, sha in new.items():
            was = old["figures"].get(file)
            if was == sha:
                continue
            if was is None:
                changed[file] = "new figure"
            elif causes:
                changed[file] = "changed: " + ", ".join(causes)
            elif Path(file).stem in TIMED_FIGURES:
                changed[file] = "changed: it plots measured timings (expected)"
            else:
                changed[file] = "DETERMINISM BUG"
        changed.update({n: "no longer written" for n in old["figures"] if n not in new})
    for file, why in changed.items():
        if why == "DETERMINISM BUG":
            log(f"[{stem}] DETERMINISM BUG: {file} changed although the notebook, its parameters, the package, data/ "
                f"and the machine did not: unseeded randomness, or a cache entry made by older code")
        else:
            log(f"[{stem}] figure {file}: {why}")
    if old is None:
        log(f"[{stem}] {len(new)} figure digests recorded in {path} (no earlier record to compare with)")
    elif not changed:
        log(f"[{stem}] all {len(new)} figure files identical to the recorded run")
    entries[stem] = {"stamp": stamp, "parts": dict(parts), "figures": new}
    files.write_json(path, {"about": "sha256 of each figure file and the stamp parts (digests of the notebook, its "
                                     "parameters, the package source and data/; the machine, its CPU's bf16 instruction "
                                     "sets and the device the models computed on) of the run that wrote "
                                     "it; written by python -m replication run",
                            "notebooks": dict(sorted(entries.items()))})
    return changed
