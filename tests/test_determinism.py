"""Same config, same numbers: every notebook, run twice in the smoke profile into two runs folders (no
shared cache), writes the same metrics JSON (claims, measurements, parameters) and the same figure bytes.

The first run is the session's smoke run (conftest.smoke_run, whose outputs tests/test_notebooks.py checks);
the second goes into another folder, with another PYTHONHASHSEED for its kernels so that anything hanging on
string-hash order shows up. Left out of the comparison, and nothing else:
- the keys in TIMING_KEYS (with everything under them): wall-clock measurements and the interpreter's version;
- the figures in digests.TIMED_FIGURES (they plot timings).
"""
import json
import math
import os
import re
from pathlib import Path

import pytest

from replication.ledger import digests, provenance

from replication.run import runner

STEMS = runner.list_notebooks()

# A key matching one of these holds a measurement of time (or names the interpreter), not a result.
TIMING_KEYS = (
    r".+_s",            # seconds: wall_time_s, load_s, first_load_s, cached_load_s, train_wall_s, tokens_per_s
    r"seconds",         # seconds by phase (04 debate/judging, 06 loop)
    r".+_seconds",      # seconds by part (02 part2_seconds)
    r"tokens/s",        # 00 generation throughput
    r"batched_speedup",  # 00: a ratio of two throughputs
    r"python",          # interpreter version (top level and 00's environment)
    r"package_version",
)
_TIMING = re.compile("|".join(f"(?:{p})" for p in TIMING_KEYS))


def excluded(key) -> bool:
    return bool(_TIMING.fullmatch(str(key)))


def _label(item, i):
    """How a list item is named in a difference: its claim or name if it has one, else its index."""
    if isinstance(item, dict):
        for k in ("claim", "name", "notebook"):
            if isinstance(item.get(k), str):
                return f"[{item[k][:60]!r}]"
    return f"[{i}]"


def differences(a, b, path: str = "") -> list:
    """'key path: first != second' wherever two metrics records differ (TIMING_KEYS skipped; nan equals nan)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            where = f"{path}.{k}" if path else str(k)
            if excluded(k):
                continue
            if k not in a or k not in b:
                out.append(f"{where}: only in the {'second' if k in b else 'first'} run")
            else:
                out += differences(a[k], b[k], where)
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, path + _label(x, i))]
    nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    return [] if a == b and type(a) is type(b) or nan else [f"{path}: {str(a)[:100]!r} != {str(b)[:100]!r}"]


def test_differences_name_the_key_and_skip_timings():
    a = {"wall_time_s": 1.0, "python": "3.11.7", "metrics": {"x": [1, 2.5, float("nan")], "seconds": {"a": 1}},
         "claims": [{"claim": "c1", "measured": "0.5"}]}
    b = {"wall_time_s": 2.0, "python": "3.11.8", "metrics": {"x": [1, 2.5, float("nan")], "seconds": {"a": 2}},
         "claims": [{"claim": "c1", "measured": "0.5"}]}
    assert differences(a, b) == []
    b["metrics"]["x"][1], b["claims"][0]["measured"], b["metrics"]["y"] = 2.6, "0.6", 0
    assert differences(a, b) == ["claims['c1'].measured: '0.5' != '0.6'", "metrics.x[1]: '2.5' != '2.6'",
                                 "metrics.y: only in the second run"]
    assert differences({"n": 1}, {"n": 1.0}) == ["n: '1' != '1.0'"]
    assert [k for k in ("wall_time_s", "train_wall_s", "tokens/s", "load_s", "part2_seconds", "seeds", "steps")
            if excluded(k)] == ["wall_time_s", "train_wall_s", "tokens/s", "load_s", "part2_seconds"]


def cache_differences(first, second) -> list:
    """The cached results (entries with a meta.json, under first and second) whose stored value differs between two
    runs, in the order they were made: the first of them is where the runs parted (what later results were made
    from), e.g. 'trees-a110... (value.json)'. Entries only one run has are named as such."""
    first, second = Path(first), Path(second)
    entries = lambda root: {m.parent.relative_to(root) for m in root.rglob("meta.json")} if root.is_dir() else set()
    made = lambda r: next((x / r / "meta.json").stat().st_mtime for x in (first, second) if (x / r / "meta.json").exists())
    out = []
    for rel in sorted(entries(first) | entries(second), key=lambda r: (made(r), str(r))):
        a, b = first / rel, second / rel
        if not (a / "meta.json").exists() or not (b / "meta.json").exists():
            out.append(f"{rel} (only in the {'second' if (b / 'meta.json').exists() else 'first'} run)")
            continue
        names = sorted(({p.name for p in a.iterdir()} | {p.name for p in b.iterdir()}) - {"meta.json"})
        changed = [n for n in names if not (a / n).is_file() or not (b / n).is_file()
                   or digests.file_sha256(a / n) != digests.file_sha256(b / n)]
        if changed:
            out.append(f"{rel} ({', '.join(changed)})")
    return out


def test_cache_differences_name_the_entry_where_two_runs_part(tmp_path):
    for run, trees, later in (("a", b'{"g": ["12 + 58 = 70"]}', b"1"), ("b", b'{"g": ["12 + 58 = 71"]}', b"2")):
        for name, value in (("eval-3", later), ("base-1", b"[0.5]"), ("trees-2", trees), ("extra-4", b"0")):
            if name == "extra-4" and run == "a":
                continue
            (tmp_path / run / name).mkdir(parents=True)
            (tmp_path / run / name / "value.json").write_bytes(value)
            (tmp_path / run / name / "meta.json").write_text(json.dumps({"seconds": 1.0 if run == "a" else 2.0}))
            made = {"base-1": 1000, "trees-2": 1001, "eval-3": 1002, "extra-4": 1003}[name]   # the order they were made
            os.utime(tmp_path / run / name / "meta.json", (made, made))
    assert cache_differences(tmp_path / "a", tmp_path / "b") == [
        "trees-2 (value.json)", "eval-3 (value.json)", "extra-4 (only in the second run)"]
    assert cache_differences(tmp_path / "a", tmp_path / "a") == []


@pytest.fixture(scope="module")
def second_run(smoke_run, run_all, tmp_path_factory):
    """The same smoke run again, into its own folder, with a PYTHONHASHSEED the first run did not have
    (papermill's kernels inherit it)."""
    seed = "12345" if os.environ.get("PYTHONHASHSEED") != "12345" else "54321"
    return run_all(tmp_path_factory.mktemp("smoke-second"), env={"PYTHONHASHSEED": seed})


@pytest.mark.slow
@pytest.mark.parametrize("stem", STEMS)
def test_same_config_gives_the_same_numbers(stem, smoke_run, second_run):
    (first, _), (second, _) = smoke_run, second_run
    stamps = [json.loads((r / "smoke/state" / f"{stem}.json").read_text())["stamp"] for r in (first, second)]
    if stamps[0] != stamps[1]:
        pytest.fail(f"{stem}: the notebook, its parameters or the package changed between the two runs; "
                    "nothing to compare (rerun the test on a tree nobody edits meanwhile)")
    a, b = (json.loads((r / "smoke/metrics" / f"{stem}.json").read_text()) for r in (first, second))
    diff = differences(a, b)
    if diff:   # what a reader needs to find the cause: where the runs parted, and the CPU they ran on
        parted = cache_differences(first / "smoke/cache" / stem, second / "smoke/cache" / stem)
        pytest.fail(f"{stem}: two runs of one config differ at {len(diff)} key(s):\n  " + "\n  ".join(diff[:40]) +
                    f"\ncached results that differ, oldest first: {parted[:10] or 'none'}"
                    f"\nCPU: {provenance.machine()}; bf16 instruction sets: {runner.cpu_bf16()}")
    figs = [n for f in a["figures"] for n in f["files"] if n.rsplit(".", 1)[0] not in digests.TIMED_FIGURES]
    changed = [n for n in figs if digests.file_sha256(first / "smoke/figures" / n) !=
               digests.file_sha256(second / "smoke/figures" / n)]
    assert not changed, f"{stem}: the same config drew different figures: {changed}"
