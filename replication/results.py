"""The results store's command line (`python -m replication store ...`) and its remake check.

`store verify --remake N` re-makes each notebook's N cheapest fp32 value entries from scratch and compares them with the
store byte for byte: the notebook executes (default profile, a temporary run folder) reading everything else from the
store, until the entry it re-makes is written (store.REMAKE names it; the cache then stops the notebook). fp32
entries come out the same on every CPU; bf16 ones depend on the instruction set (store_update.machine records it), so an
entry that differs is reported with both CPUs."""
import json
import tempfile
import time
from pathlib import Path

from replication.core import config, files, store, store_update


def candidates(root: Path, notebook: str, n: int) -> list:
    """The notebook's n cheapest fp32 value entries (their keys name no bf16): those that took the fewest seconds to
    make (an entry without a time last), then in the order the run made them."""
    entries = store.manifest(root, notebook).get("entries", {})
    fp32 = [(e.get("seconds") is None, e.get("seconds") or 0, e.get("made_at") or 0, ident)
            for ident, e in entries.items() if e["kind"] in ("json", "frame") and "bfloat16" not in json.dumps(e["key"])]
    return [x[-1] for x in sorted(fp32)[:n]]


def remake(n: int, root: Path, only=None, log=print) -> list:
    """Re-make candidates(root, notebook, n) of every stored notebook (or `only`) and compare: the problems found."""
    from replication import runner

    problems = []
    notebooks = only or [p.stem for p in sorted(root.glob("*.json"))]
    for notebook in notebooks:
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
            same = meta["sha256"] == entry["sha256"]
            here = config.cpu_bf16()
            log(f"store remake {notebook}/{ident}: {'the same bytes' if same else 'DIFFERENT bytes'} "
                f"({time.perf_counter() - t0:.0f} s)")
            if not same:
                problems.append(f"{notebook}/{ident}: re-made with other bytes (made on CPU "
                                f"{entry['made'].get('cpu')!r}, re-made on {here!r})")
    return problems


def main(argv=None) -> int:
    """`python -m replication store update|verify|accept|info`, with one-line errors."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m replication store", description="The committed results store.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("update", help="copy a finished default run's cache entries into the store (no weights)")
    up.add_argument("--from", dest="source", default=None, help="the run's cache folder (default: runs/default/cache)")
    up.add_argument("--only", default=None, help="notebook numbers, e.g. 00,03")
    ve = sub.add_parser("verify", help="check every entry's checksum and key; --remake N re-makes entries and compares")
    ve.add_argument("--remake", type=int, default=0, metavar="N",
                    help="re-make each notebook's N cheapest fp32 entries from scratch and compare bytes")
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
            print(f"store verify: {time.perf_counter() - t0:.1f} s, {len(problems)} problems")
            return 1 if problems else 0
        elif args.cmd == "accept":
            store_update.accept([_stem(n) for n in args.notebooks], args.store)
        else:
            s = store.summary(args.store)
            print(f"{s['root']}: {s['entries']} entries, {store.size_text(s['bytes'])}, last changed by "
                  f"{s['commit'] or '(not in git)'} {s['date'] or ''}")
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
