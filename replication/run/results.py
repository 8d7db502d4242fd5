"""The results store's command line (`python -m replication store ...`) and its remake check.

`store verify --remake N` re-makes each notebook's N cheapest fp32 value entries from scratch and compares them with the
store: the notebook executes (default profile, a temporary run folder) reading everything else from the store, until
the entry it re-makes is written (store.REMAKE names it; the cache then stops the notebook). On the CPU that made it an
fp32 entry comes back with the same bytes; another CPU's kernels can add a sum's terms in another order, so its
numbers may differ in the last digits. same_values() accepts that much and nothing more: every string, integer, key and
length equal, every float within fp32 rounding (REL). A difference beyond it is reported with both CPUs.
bf16 entries are not re-made: their numbers depend on the instruction set (store_update.machine records it)."""
import json
import tempfile
import time
from pathlib import Path

from replication.core import config, files, store, store_update

REL = 1e-4       # floats agree when |a - b| <= REL * max(|a|, |b|) + FLOOR: far above fp32 rounding (about 1e-7
FLOOR = 1e-6     # relative, a few times that after a sum), far below any digit a figure or claim shows


def candidates(root: Path, notebook: str, n: int) -> list:
    """The notebook's n cheapest fp32 value entries (their keys name no bf16): those that took the fewest seconds to
    make (an entry without a time last), then in the order the run made them."""
    entries = store.manifest(root, notebook).get("entries", {})
    fp32 = [(e.get("seconds") is None, e.get("seconds") or 0, e.get("made_at") or 0, ident)
            for ident, e in entries.items() if e["kind"] in ("json", "frame") and "bfloat16" not in json.dumps(e["key"])]
    return [x[-1] for x in sorted(fp32)[:n]]


def remake(n: int, root: Path, only=None, log=print) -> list:
    """Re-make candidates(root, notebook, n) of every stored notebook (or `only`) and compare: the problems found."""
    from replication.run import runner

    problems = []
    notebooks = only or [p.stem for p in sorted(root.glob("*.json"))]
    for notebook in notebooks:
        if not store_update.complete(store.manifest(root, notebook)):
            log(f"store remake {notebook}: the store holds part of its run (cut off); nothing re-made")
            continue
        for ident in candidates(root, notebook, n):
            entry = store.manifest(root, notebook)["entries"][ident]
            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp, config.environ({
                    "REPLICATION_RUNS": f"{tmp}/runs", "REPLICATION_FIGURES": f"{tmp}/figures",
                    store.ENV: str(root), store.REMAKE: f"{notebook}/{ident}"}):
                try:
                    runner.execute(notebook, "default", log=lambda *_: None)
                except runner.RunError as e:
                    if store.Remade.__name__ not in str(e):
                        problems.append(f"{notebook}/{ident}: not re-made ({str(e).split(' | ')[0]})")
                        continue
                made = Path(tmp) / "runs/default/cache" / notebook / ident
                try:
                    meta = files.read_json(made / "meta.json")
                except OSError:
                    problems.append(f"{notebook}/{ident}: the notebook ended without making it")
                    continue
                new = (made / meta["file"]).read_bytes()
            old = store._blob(root, entry)
            where = f"made on CPU {entry['made'].get('cpu')!r}, re-made on {config.cpu_bf16()!r}"
            if meta["sha256"] == entry["sha256"]:
                verdict = "the same bytes"
            else:
                ok, text = same_values(json.loads(old), json.loads(new))
                verdict = f"{'the same values' if ok else 'DIFFERENT'}: {text} ({where})"
                if not ok:
                    problems.append(f"{notebook}/{ident}: re-made with other values: {text} ({where})")
            log(f"store remake {notebook}/{ident}: {verdict} ({time.perf_counter() - t0:.0f} s)")
    return problems


def same_values(old, new) -> tuple:
    """(agree, text): do two JSON values agree up to fp32 rounding? Strings, integers, booleans, keys and lengths must be
    equal; floats within REL (relative) or FLOOR (absolute). The text counts the floats that differ and names the
    largest difference, or the first place where the values disagree."""
    counts = {"floats": 0, "differ": 0, "largest": 0.0}

    def walk(a, b, where):
        if isinstance(a, float) or isinstance(b, float):
            if not (type(a) is float and type(b) is float):
                return f"{where}: {a!r} against {b!r}"
            counts["floats"] += 1
            if a == b or (a != a and b != b):       # equal, or both NaN
                return None
            gap = abs(a - b)
            counts["differ"] += 1
            counts["largest"] = max(counts["largest"], gap / max(abs(a), abs(b)))
            return None if gap <= REL * max(abs(a), abs(b)) + FLOOR else f"{where}: {a!r} against {b!r}"
        if isinstance(a, dict) and isinstance(b, dict):
            if a.keys() != b.keys():
                return f"{where}: keys {sorted(a.keys() ^ b.keys())} in one only"
            return next((w for k in a if (w := walk(a[k], b[k], f"{where}.{k}"))), None)
        if isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b):
                return f"{where}: {len(a)} items against {len(b)}"
            return next((w for i, (x, y) in enumerate(zip(a, b)) if (w := walk(x, y, f"{where}[{i}]"))), None)
        return None if type(a) is type(b) and a == b else f"{where}: {a!r} against {b!r}"

    first = walk(old, new, "value")
    if first:
        return False, first
    return True, (f"{counts['differ']:,} of {counts['floats']:,} floats differ in the last digits, the largest by "
                  f"{counts['largest']:.1e} of its value")


def main(argv=None) -> int:
    """`python -m replication store update|verify|accept|info`, with one-line errors."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m replication store", description="The committed results store.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("update", help="copy a default run's cache entries into the store (no weights); a run "
                       "cut off part way is stored as such, and the next run makes the rest")
    up.add_argument("--from", dest="source", default=None, help="the run's cache folder (default: runs/default/cache)")
    up.add_argument("--only", default=None, help="notebook numbers, e.g. 00,03")
    ve = sub.add_parser("verify", help="check every entry's checksum and key; --remake N re-makes entries and compares")
    ve.add_argument("--remake", type=int, default=0, metavar="N",
                    help="re-make each notebook's N cheapest fp32 entries from scratch and compare them")
    ve.add_argument("--only", default=None, help="notebook numbers for --remake, e.g. 00,03")
    ac = sub.add_parser("accept", help="record the code's fingerprint for notebooks whose change changes no entry")
    ac.add_argument("notebooks", nargs="+", help="notebook numbers or stems")
    info = sub.add_parser("info", help="the store's size and provenance")
    for p in (up, ve, ac, info):
        p.add_argument("--store", default=None, help="the store folder (default: results/default)")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "update":
            source = Path(args.source) if args.source else config.runs_dir() / "default" / "cache"
            store_update.update(source, args.store, only=_names(args.only))
        elif args.cmd == "verify":
            t0 = time.perf_counter()
            problems = store_update.verify(args.store)
            if args.remake:
                problems += remake(args.remake, Path(args.store or store.default_root()), _names(args.only))
            for p in problems:
                print(f"store verify: {p}")
            print(f"store verify: {time.perf_counter() - t0:.1f} s, {len(problems)} problems")
            return 1 if problems else 0
        elif args.cmd == "accept":
            store_update.accept([_stem(n) for n in args.notebooks], args.store)
        else:
            s = store.summary(args.store)
            print(f"{s['root']}: {s['entries']} entries, {store.size_text(s['bytes'])}, last changed by "
                  f"{s['commit'] or '(not in git)'} {s['date'] or ''}")
            root = Path(args.store or store.default_root())
            for notebook in config.list_notebooks():
                man = store.manifest(root, notebook)
                state = "part of a run (cut off)" if not store_update.complete(man) else "a finished run"
                n = len(man["entries"])
                print(f"  {notebook}: {n} entr{'y' if n == 1 else 'ies'}" + (f", {state}" if n else ""))
    except (store.StoreError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def _stem(name: str) -> str:
    hits = [v for v in config.list_notebooks() if v == name or v[:2] == name.zfill(2)]
    if not hits:
        raise store.StoreError(f"notebook {name!r} is not one of {', '.join(v[:2] for v in config.list_notebooks())}")
    return hits[0]


def _names(only):
    return None if not only else [_stem(n.strip()) for n in only.split(",")]
