"""The tuning database: measured schedules, in SQLite beside the kernel cache, which every build consults.

A record's key is the kernel's fingerprint and size bucket (``tailjit.tunedb.fingerprint``) and the machine: the
CPU (model and ISA flags), the C compiler's version and tailjit's.  Its row holds the schedule (the fields of
:class:`~tailjit.schedule.Schedule`, with loop names written by position, ``#0`` for the kernel's first axis,
``#0.o`` and ``#0.i`` for its split, so that a renamed kernel reads the same record), whether it was measured
(``ok``) or failed (``failed``, with why), the per-call seconds of every sample and their median, the thread
count, the sizes measured at, the date.

A build takes, for each kernel it was given no schedule for, the fastest recorded schedule of its key when the
default schedule was recorded under that key too and is slower; else the default.  A record that no longer
makes a valid schedule (a field renamed, a combination ``check_schedule`` rejects) is skipped with a
:class:`TuneWarning`.  ``TAILJIT_TUNE_DB=0`` turns the lookup off.

The database is code too (a schedule decides what C is emitted), so it is trusted as the kernel cache is
(``tailjit.runtime.cachefiles``): made mode 0600 in the cache's private folder, and where it (or its WAL) is
owned by another user or writable by group or others, the process warns once (``CacheWarning``) and uses its
private folder instead.  WAL mode and a busy timeout let several processes read and write it at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import json
import os
import platform
import re
import sqlite3
import statistics
import warnings
from collections.abc import Iterable
from pathlib import Path

from tailjit.fusion import LoopNest
from tailjit.runtime.cachefiles import CacheRefused, cache_dir, give_up, owned
from tailjit.runtime.compiler import cpu_id, toolchain
from tailjit.schedule import Schedule, check_schedule, default_schedule, loop_names
from tailjit.te.expr import TEError
from tailjit.tunedb.fingerprint import fingerprint, size_bucket
from tailjit.version import __version__

DB_NAME = "tune.sqlite3"
LOOKUP_ENV = "TAILJIT_TUNE_DB"
BUSY_TIMEOUT_S = 30.0
KEY = ("fingerprint", "bucket", "cpu", "compiler", "tailjit")
#: A record's fields, as columns, in exports and in ``Record``
FIELDS = (*KEY, "kernel", "schedule", "status", "message", "median", "samples", "threads", "sizes", "date")
STATUSES = ("ok", "failed")

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS records (
    fingerprint TEXT NOT NULL, bucket TEXT NOT NULL, cpu TEXT NOT NULL, compiler TEXT NOT NULL,
    tailjit TEXT NOT NULL, kernel TEXT NOT NULL, schedule TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN {STATUSES}), message TEXT NOT NULL, median REAL,
    samples TEXT NOT NULL, threads INTEGER NOT NULL, sizes TEXT NOT NULL, date TEXT NOT NULL,
    UNIQUE ({", ".join(FIELDS)})
);
CREATE INDEX IF NOT EXISTS records_by_time ON records ({", ".join(KEY)}, status, median);
CREATE INDEX IF NOT EXISTS records_by_schedule ON records (fingerprint, bucket, schedule);
"""


class TuneWarning(UserWarning):
    """A tuning record was skipped: it no longer makes a valid schedule for its kernel."""


class RecordError(ValueError):
    """A malformed tuning record (in a file being imported)."""


class DatabaseError(RuntimeError):
    """The tuning database cannot be read or written (a corrupt file, a read-only one, a lock held too long)."""


@contextlib.contextmanager
def _sqlite_errors(path: Path):
    """SQLite's errors as a DatabaseError that names the file and what to do."""
    try:
        yield
    except sqlite3.Error as e:
        raise DatabaseError(
            f"the tuning database {path} cannot be used ({type(e).__name__}: {e}); remove it (its records are "
            "lost: `tailjit tune --export` them first if it still reads) or point TAILJIT_CACHE_DIR elsewhere"
        ) from e


@dataclasses.dataclass(frozen=True)
class Record:
    fingerprint: str
    bucket: str
    cpu: str
    compiler: str
    tailjit: str
    kernel: str  # the kernel's name where it was measured (for people: the key does not use it)
    schedule: dict  # Schedule's fields, loop names by position
    status: str  # "ok" or "failed"
    message: str  # why it failed; empty when ok
    median: float | None  # seconds per call; None when failed
    samples: list[float]
    threads: int
    sizes: dict[str, int]  # the size variables' values it was measured at
    date: str  # ISO 8601, UTC


@functools.cache
def machine() -> tuple[str, str, str]:
    """This machine's part of the key: the CPU (its model and a hash of its model and ISA flags), the C
    compiler's version, tailjit's version."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    return f"{model} [{cpu_id()}]", toolchain().version, __version__


def database_path() -> Path:
    return cache_dir() / DB_NAME


# Schedules by position ------------------------------------------------------------------------------------

_POSITION = re.compile(r"#(\d+)(\.[oi])?")


def schedule_record(kernel: LoopNest, schedule: Schedule) -> dict:
    """``schedule``'s fields with the kernel's loop names written by position (``#k``, ``#k.o``, ``#k.i``)."""
    names = {n: f"#{d}" for d, n in enumerate(loop_names(kernel))}

    def by_position(s: str) -> str:
        axis, dot, part = s.rpartition(".")
        if dot and part in ("o", "i") and axis in names:
            return f"{names[axis]}.{part}"
        return names.get(s, s)

    return _map_strings(dataclasses.asdict(schedule), by_position)


def schedule_of(kernel: LoopNest, fields: dict) -> Schedule:
    """The schedule a record's ``fields`` make for ``kernel``, validated; TEError (or TypeError for a field
    Schedule does not have) where it makes none."""
    names = loop_names(kernel)

    def by_name(s: str) -> str:
        m = _POSITION.fullmatch(s)
        if m is None or int(m[1]) >= len(names):
            return s
        return names[int(m[1])] + (m[2] or "")

    schedule = Schedule(**_map_strings(fields, by_name))
    check_schedule(kernel, schedule)
    return schedule


def _map_strings(value, f):
    """``value`` (JSON data) with every string, dictionary keys included, replaced by ``f(string)``."""
    if isinstance(value, str):
        return f(value)
    if isinstance(value, dict):
        return {_map_strings(k, f): _map_strings(v, f) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_map_strings(v, f) for v in value]
    return value


def _text(fields: dict) -> str:
    return json.dumps(fields, sort_keys=True)


# The connection -------------------------------------------------------------------------------------------

#: (database path, process id) -> its open connection: a connection does not cross a fork
_connections: dict[tuple[Path, int], sqlite3.Connection] = {}


def _connect(create: bool) -> sqlite3.Connection | None:
    """This process's connection to the cache's database; None where there is none and ``create`` is False.
    Where the file (or its WAL) is someone else's, the cache is given up for the process's private folder, as
    ``cachefiles`` does for a refused kernel."""
    while True:
        path = database_path()
        conn = _connections.get((path, os.getpid()))
        if conn is not None:
            return conn
        try:
            if not _trusted(path):
                if not create:
                    return None
                os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
                _trusted(path)
            with _sqlite_errors(path):
                conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
                try:
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.executescript(SCHEMA)
                except sqlite3.Error:
                    conn.close()
                    raise
        except (OSError, CacheRefused) as e:
            if not give_up(path.parent, e):
                raise
            continue  # the private folder's database
        _connections[(path, os.getpid())] = conn
        return conn


def _trusted(path: Path) -> bool:
    """Whether the database ``path`` exists; CacheRefused where it or its WAL files are someone else's."""
    found = owned(path)
    for suffix in ("-wal", "-shm") if found else ():
        owned(path.with_name(path.name + suffix))
    return found


def close() -> None:
    """Close this process's connections (a test removing its cache folder, a process about to exit)."""
    for key in [k for k in _connections if k[1] == os.getpid()]:
        _connections.pop(key).close()


# Writing and reading --------------------------------------------------------------------------------------


def record(
    kernel: LoopNest,
    schedule: Schedule,
    samples: list[float],
    threads: int,
    sizes: dict[str, int] | None = None,
    failure: str | None = None,
) -> Record:
    """Store a measurement of ``schedule`` on ``kernel``: its per-call seconds ``samples`` with ``threads``
    threads, or, given ``failure`` (why), a failed candidate."""
    if failure is None and not samples:
        raise ValueError("a measured record needs at least one sample (or a failure)")
    rec = Record(
        fingerprint(kernel),
        size_bucket(kernel),
        *machine(),
        kernel=kernel.name,
        schedule=schedule_record(kernel, schedule),
        status="ok" if failure is None else "failed",
        message=failure or "",
        median=statistics.median(samples) if failure is None else None,
        samples=[float(s) for s in samples],
        threads=int(threads),
        sizes=dict(sizes or {}),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
    _insert([rec])
    return rec


def _insert(records: list[Record]) -> None:
    conn = _connect(create=True)
    rows = [_row(r) for r in records]
    with _sqlite_errors(database_path()), conn:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(f"INSERT OR IGNORE INTO records VALUES ({', '.join('?' * len(FIELDS))})", rows)


def _row(r: Record) -> tuple:
    return (*(getattr(r, f) for f in FIELDS[:6]), _text(r.schedule), r.status, r.message, r.median,
            json.dumps(r.samples), r.threads, _text(r.sizes), r.date)  # fmt: skip


def records() -> list[Record]:
    """Every record, oldest first."""
    conn = _connect(create=False)
    if conn is None:
        return []
    with _sqlite_errors(database_path()):
        rows = conn.execute(f"SELECT {', '.join(FIELDS)} FROM records ORDER BY rowid").fetchall()
    return [_from_row(r) for r in rows]


def _from_row(row: tuple) -> Record:
    values = dict(zip(FIELDS, row))
    for f in ("schedule", "samples", "sizes"):
        values[f] = json.loads(values[f])
    return Record(**values)


def best(kernel: LoopNest) -> Schedule | None:
    """The recorded schedule a build uses for ``kernel`` (see the module's docstring), or None for the default."""
    return tuned([kernel]).get(kernel.name)


def tuned(kernels: Iterable[LoopNest]) -> dict[str, Schedule]:
    """The recorded schedules a build uses, by kernel name, for those of ``kernels`` that have one: one query.
    Nothing (not even a fingerprint) where ``TAILJIT_TUNE_DB=0`` or there is no database."""
    kernels = list(kernels)
    if not kernels or os.environ.get(LOOKUP_ENV, "1") == "0":
        return {}
    try:
        conn = _connect(create=False)
        if conn is None:
            return {}
        keys = {(fingerprint(k), size_bucket(k)): k for k in kernels}
        wanted = [(*key, _text(schedule_record(k, default_schedule(k)))) for key, k in keys.items()]
        params = dict(zip(("cpu", "compiler", "tailjit"), machine()))
        params.update({f"{c}{n}": v for n, w in enumerate(wanted) for c, v in zip("fbs", w)})
        with _sqlite_errors(database_path()):
            rows = conn.execute(_faster_query(len(wanted)), params).fetchall()
    except DatabaseError as e:  # a build goes on with its default schedules
        warnings.warn(f"tailjit: default schedules for this build: {e}", TuneWarning, stacklevel=2)
        return {}
    faster: dict[tuple[str, str], list[str]] = {}
    for f, b, schedule in rows:
        faster.setdefault((f, b), []).append(schedule)
    chosen = {}
    for key, texts in faster.items():
        schedule = _first_valid(keys[key], texts)
        if schedule is not None:
            chosen[keys[key].name] = schedule
    return chosen


@functools.lru_cache(maxsize=64)
def _faster_query(n: int) -> str:
    """The query of the schedules measured faster than the default, fastest first, under this machine's key and
    ``n`` kernels' (``:f<k>``, ``:b<k>``: fingerprint and bucket; ``:s<k>``: the default's schedule text).  The
    indexes make it a lookup of each key's rows faster than its default, however many records the key has.
    The default's time is the mean of its records' medians: every measurement records the default again, so
    their minimum is an outlier of a long search (a loaded moment), which no candidate measured once beats."""
    values = ", ".join(f"(:f{k}, :b{k}, :s{k})" for k in range(n))
    machine = "r.cpu = :cpu AND r.compiler = :compiler AND r.tailjit = :tailjit AND r.status = 'ok'"
    return f"""
    WITH want(fingerprint, bucket, schedule) AS (VALUES {values}),
    default_time AS (
        SELECT fingerprint, bucket, schedule AS default_schedule, AVG(r.median) AS median FROM want JOIN records r
        USING (fingerprint, bucket, schedule) WHERE {machine} GROUP BY fingerprint, bucket
    )
    SELECT fingerprint, bucket, r.schedule FROM default_time d JOIN records r USING (fingerprint, bucket)
    WHERE {machine} AND r.schedule != d.default_schedule AND r.median < d.median ORDER BY r.median
    """


def _first_valid(kernel: LoopNest, texts: list[str]) -> Schedule | None:
    """The first of the schedule record ``texts`` that makes a valid schedule for ``kernel``; a
    ``TuneWarning`` for each one before it."""
    for text in texts:
        try:
            return schedule_of(kernel, json.loads(text))
        except (TypeError, TEError) as e:
            warnings.warn(
                f"tailjit: a tuning record for kernel {kernel.name!r} is skipped: {e}. It was made by another "
                f"version of the schedule; `tailjit tune --list` shows the records ({database_path()}).",
                TuneWarning,
                stacklevel=2,
            )
    return None


# Sharing ----------------------------------------------------------------------------------------------------


def export(path: str | os.PathLike) -> int:
    """Write every record to ``path`` as JSON lines; the number written."""
    recs = records()
    with open(path, "w") as f:
        for r in recs:
            f.write(json.dumps(dataclasses.asdict(r), sort_keys=True) + "\n")
    return len(recs)


def import_(path: str | os.PathLike) -> int:
    """Add the records of the JSON-lines file ``path`` (as ``export`` writes) to the database, all or none:
    RecordError naming the line of the first malformed one.  The number of lines read (a record already
    there is not added twice)."""
    recs = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    recs.append(parse_record(line))
                except RecordError as e:
                    raise RecordError(f"{path}, line {n}: {e}") from None
    if recs:
        _insert(recs)
    return len(recs)


_TYPES = {
    "median": (float, int, type(None)), "samples": list, "threads": int, "sizes": dict, "schedule": dict,
}  # fmt: skip


def parse_record(line: str) -> Record:
    """A record from one exported JSON line, checked field by field."""
    try:
        values = json.loads(line)
    except json.JSONDecodeError as e:
        raise RecordError(f"not JSON ({e})") from None
    if not isinstance(values, dict):
        raise RecordError(f"a record is a JSON object, got {type(values).__name__}")
    if set(values) != set(FIELDS):
        missing, extra = sorted(set(FIELDS) - set(values)), sorted(set(values) - set(FIELDS))
        raise RecordError(f"fields {FIELDS} expected; missing {missing}, unknown {extra}")
    for f in FIELDS:
        kind = _TYPES.get(f, str)
        if not isinstance(values[f], kind) or isinstance(values[f], bool):
            raise RecordError(f"field {f!r} has the wrong type: {values[f]!r}")
    if values["status"] not in STATUSES:
        raise RecordError(f"status must be one of {STATUSES}, got {values['status']!r}")
    if not all(isinstance(s, int | float) and not isinstance(s, bool) for s in values["samples"]):
        raise RecordError(f"samples must be numbers, got {values['samples']!r}")
    measured = values["status"] == "ok"
    if measured != (values["median"] is not None) or (measured and not values["samples"]):
        raise RecordError("a record measured ('ok') has samples and a median; a failed one has no median")
    return Record(**values)
