"""``tailjit tune``: search a program's schedules, or list, export and import the tuning database's records
(``docs/tuning.md``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tailjit.te.expr import TEError
from tailjit.tunedb import db
from tailjit.tuner.search import TuneError, tune_source


def add_arguments(parser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--program", metavar="FILE", help="search the schedules of FILE.py's kernels (it defines "
                      "outputs and inputs, as tailjit.build takes them) and record every measurement")  # fmt: skip
    what.add_argument("--list", action="store_true", help="print every record")
    what.add_argument("--export", metavar="FILE", help="write every record to FILE (JSON lines)")
    what.add_argument("--import", dest="import_", metavar="FILE", help="add the records of FILE (JSON lines)")
    search = parser.add_argument_group("searching (with --program)")
    search.add_argument("--sizes", default="", metavar="N=V,...", help="the size variables' values, e.g. n=4096")
    search.add_argument("--trials", type=int, default=20, help="schedules measured per kernel, the default's "
                        "included (default 20)")  # fmt: skip
    search.add_argument("--seed", type=int, default=0, help="the search's seed (default 0)")
    search.add_argument("--timeout", type=float, default=300.0, help="seconds per measurement (default 300)")
    search.add_argument("--cost-model", action="store_true", help="rank each round's drawn schedules with a model "
                        "trained on the records and measure only the most promising (needs LightGBM)")  # fmt: skip


def main(args) -> int:
    try:
        if args.program:
            return _search(args)
        if args.export:
            print(f"{db.export(args.export)} records written to {args.export}")
        elif args.import_:
            n = db.import_(args.import_)
            print(f"{n} records read from {args.import_} into {db.database_path()}")
        else:
            _list(db.records())
    except (OSError, ValueError, TEError, TuneError, db.DatabaseError) as e:  # RecordError is a ValueError
        print(f"tailjit tune: {e}", file=sys.stderr)
        return 2
    return 0


def _search(args) -> int:
    source = Path(args.program).read_text()
    found = tune_source(source, parse_sizes(args.sizes), args.trials, seed=args.seed, timeout=args.timeout,
                        report=print, cost_model=args.cost_model)  # fmt: skip
    for name, t in found.items():
        counts = f"{t.measured} measured, {t.failed} failed, {t.invalid} invalid, {t.unmeasured} ranked out"
        print(f"{name}: not searched: {t.skipped}" if t.skipped else f"{name}: {counts}")
        speed = "" if t.speedup is None else f" ({t.speedup:.2f}x the default in the same rounds)"
        print(f"    a build now uses{speed}: {t.schedule.describe()}")
    return 0


def parse_sizes(text: str) -> dict[str, int]:
    """``n=4096,m=80`` as ``{"n": 4096, "m": 80}``; ValueError naming the malformed part."""
    sizes = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = part.partition("=")
        if not eq or not name.strip().isidentifier() or not value.strip().isdigit():
            raise ValueError(f"--sizes: {part!r} is not NAME=INTEGER (e.g. --sizes n=4096,m=80)")
        sizes[name.strip()] = int(value)
    return sizes


def _list(records: list[db.Record]) -> None:
    print(f"{len(records)} records in {db.database_path()}")
    for r in records:
        timing = f"{r.median * 1e6:.2f} us, {r.threads} threads" if r.median is not None else r.message
        print(f"{r.date}  {r.kernel}  {r.fingerprint[:12]} {r.bucket}  {r.status}: {timing}")
        print(f"    {json.dumps(r.schedule, sort_keys=True)}")
        print(f"    on {r.cpu}, {r.compiler}, tailjit {r.tailjit}")
