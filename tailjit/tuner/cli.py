"""``tailjit tune``: the tuning database's records, listed, exported and imported (``docs/tuning.md``)."""

from __future__ import annotations

import json
import sys

from tailjit.tunedb import db


def add_arguments(parser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--list", action="store_true", help="print every record")
    what.add_argument("--export", metavar="FILE", help="write every record to FILE (JSON lines)")
    what.add_argument("--import", dest="import_", metavar="FILE", help="add the records of FILE (JSON lines)")


def main(args) -> int:
    try:
        if args.export:
            print(f"{db.export(args.export)} records written to {args.export}")
        elif args.import_:
            n = db.import_(args.import_)
            print(f"{n} records read from {args.import_} into {db.database_path()}")
        else:
            _list(db.records())
    except (OSError, db.RecordError, db.DatabaseError) as e:
        print(f"tailjit tune: {e}", file=sys.stderr)
        return 2
    return 0


def _list(records: list[db.Record]) -> None:
    print(f"{len(records)} records in {db.database_path()}")
    for r in records:
        timing = f"{r.median * 1e6:.2f} us, {r.threads} threads" if r.median is not None else r.message
        print(f"{r.date}  {r.kernel}  {r.fingerprint[:12]} {r.bucket}  {r.status}: {timing}")
        print(f"    {json.dumps(r.schedule, sort_keys=True)}")
        print(f"    on {r.cpu}, {r.compiler}, tailjit {r.tailjit}")
