"""The tuning database (``tailjit.tunedb.db``): what builds take from it, its safety, sharing and concurrency."""

import dataclasses
import json
import subprocess
import sys
import textwrap
import warnings

import pytest

import tailjit
from tailjit import api, te
from tailjit.cli import main
from tailjit.schedule import default_schedule
from tailjit.tunedb import db
from tailjit.tuner import measure

#: A program whose kernel's loops ``describe()`` shows: a row-wise exp over ``(n, 64)``
PROGRAM = textwrap.dedent(
    """
    import tailjit
    from tailjit import te
    x = te.placeholder((te.var("n"), 64), name="x")
    y = te.compute(x.shape, lambda i, j: te.exp(x[i, j]) * 2, name="y")
    """
)
TUNED = "unroll ix2"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh kernel cache (and so tuning database) for the test."""
    monkeypatch.setenv("TAILJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(db.LOOKUP_ENV, raising=False)
    yield tmp_path / "cache"
    db.close()


def program():
    ns: dict = {}
    exec(PROGRAM, ns)
    return ns["y"], ns["x"]


def kernel_of(y, x):
    return api.prepare(y, [x], None, None)[0].kernels[0]


def record_tuned(kernel, tuned_seconds=1.0, default_seconds=2.0):
    default = default_schedule(kernel)
    db.record(kernel, default, [default_seconds, default_seconds * 1.1], threads=2)
    tuned = dataclasses.replace(default, unroll={"i": 2})
    db.record(kernel, tuned, [tuned_seconds], threads=2, sizes={"n": 1000})
    return tuned


def loops(y, x) -> str:
    return tailjit.build(y, [x]).describe()


def test_a_later_build_in_a_new_process_uses_the_faster_recorded_schedule(cache):
    y, x = program()
    assert TUNED not in loops(y, x)
    record_tuned(kernel_of(y, x))
    script = PROGRAM + "import torch\nf = tailjit.build(y, [x])\nv = torch.randn(9, 64)\n" \
        "assert torch.allclose(f(v), torch.exp(v) * 2)\nprint(f.describe())"  # fmt: skip
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert TUNED in out


def test_renamed_programs_read_the_same_records(cache):
    y, x = program()
    record_tuned(kernel_of(y, x))
    a = te.placeholder((te.var("rows"), 64), name="a")
    b = te.compute(a.shape, lambda r, c: te.exp(a[r, c]) * 2, name="b")
    assert "unroll rx2" in loops(b, a)


def test_the_default_stays_where_it_is_faster_or_was_not_measured(cache, monkeypatch):
    y, x = program()
    k = kernel_of(y, x)
    record_tuned(k, tuned_seconds=3.0)
    assert TUNED not in loops(y, x)
    db.close()
    monkeypatch.setenv("TAILJIT_CACHE_DIR", str(cache) + "-2")
    db.record(k, dataclasses.replace(default_schedule(k), unroll={"i": 2}), [1.0], threads=2)
    assert db.best(k) is None  # no record of the default to compare with


def test_an_outlier_of_the_defaults_records_does_not_hide_a_faster_schedule(cache):
    # every measurement records the default again: one fast outlier among them is not the default's time
    y, x = program()
    k = kernel_of(y, x)
    default = default_schedule(k)
    for seconds in (8.0, 7.9, 8.1, 1.2, 8.0):
        db.record(k, default, [seconds], threads=2)
    tuned = dataclasses.replace(default, unroll={"i": 2})
    db.record(k, tuned, [2.4], threads=2)
    assert db.best(k) == tuned


def test_failed_records_are_kept_and_never_chosen(cache):
    y, x = program()
    k = kernel_of(y, x)
    record_tuned(k, tuned_seconds=3.0)
    db.record(k, dataclasses.replace(default_schedule(k), parallel=False), [], threads=2, failure="crash: SIGSEGV")
    assert db.best(k) is None
    assert [r.status for r in db.records()] == ["ok", "ok", "failed"]


def test_the_lookup_can_be_turned_off(cache, monkeypatch):
    y, x = program()
    record_tuned(kernel_of(y, x))
    monkeypatch.setenv(db.LOOKUP_ENV, "0")
    assert TUNED not in loops(y, x)


def test_a_schedule_given_by_the_caller_wins(cache):
    y, x = program()
    k = kernel_of(y, x)
    record_tuned(k)
    mine = dataclasses.replace(default_schedule(k), vectorize=False)
    assert "simd" not in tailjit.build(y, [x], schedules={"y": mine}).describe()


@pytest.mark.parametrize(
    "change, why",
    [
        (lambda s: {**s, "no_such_field": 1}, "unexpected keyword argument 'no_such_field'"),
        (lambda s: {**s, "order": ["#0", "#7"]}, "not a permutation"),
    ],
)
def test_a_record_invalid_for_its_kernel_is_skipped_with_a_warning(cache, tmp_path, monkeypatch, change, why):
    y, x = program()
    record_tuned(kernel_of(y, x))
    exported = tmp_path / "records.jsonl"
    db.export(exported)
    lines = [json.loads(line) for line in exported.read_text().splitlines()]
    lines.append(lines[1] | {"schedule": change(lines[1]["schedule"]), "median": 0.5})
    exported.write_text("".join(json.dumps(r) + "\n" for r in lines))
    db.close()
    monkeypatch.setenv("TAILJIT_CACHE_DIR", str(cache) + "-imported")
    db.import_(exported)
    with pytest.warns(db.TuneWarning, match=why):
        described = loops(y, x)
    assert TUNED in described  # the next fastest, valid record


WRITER = textwrap.dedent(
    """
    import sys, dataclasses
    from tailjit import api
    from tailjit.schedule import default_schedule
    from tailjit.tunedb import db
    exec(sys.argv[2])
    k = api.prepare(y, [x], None, None)[0].kernels[0]
    for n in range(25):  # distinct samples: an identical record (same second) is stored once
        db.record(k, dataclasses.replace(default_schedule(k), parallel_work=n + 1), [n + int(sys.argv[1]) / 8], 2)
    """
)


def test_concurrent_writers_lose_nothing(cache):
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(p), PROGRAM]) for p in range(4)]
    assert [p.wait(timeout=300) for p in procs] == [0] * 4
    assert len(db.records()) == 100


def test_export_and_import_round_trip(cache, tmp_path, monkeypatch):
    y, x = program()
    record_tuned(kernel_of(y, x))
    first = db.records()
    path = tmp_path / "records.jsonl"
    assert db.export(path) == 2
    db.close()
    monkeypatch.setenv("TAILJIT_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert db.records() == []
    assert db.import_(path) == 2
    db.import_(path)  # twice: nothing doubled
    assert db.records() == first
    assert TUNED in loops(y, x)


@pytest.mark.parametrize(
    "line, why",
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "a JSON object"),
        ('{"fingerprint": "x"}', "missing"),
    ],
)
def test_a_malformed_import_is_an_error_naming_its_line(cache, tmp_path, line, why):
    y, x = program()
    record_tuned(kernel_of(y, x))
    path = tmp_path / "records.jsonl"
    db.export(path)
    path.write_text(path.read_text() + line + "\n")
    with pytest.raises(db.RecordError, match=f"line 3: .*{why}"):
        db.import_(path)
    assert len(db.records()) == 2  # all or nothing


def test_a_wrongly_typed_field_is_named():
    good = {f: "" for f in db.FIELDS} | {"schedule": {}, "samples": [1.0], "median": 1.0, "threads": 2,
                                           "sizes": {}, "status": "ok"}  # fmt: skip
    assert db.parse_record(json.dumps(good)).threads == 2
    with pytest.raises(db.RecordError, match="'threads' has the wrong type"):
        db.parse_record(json.dumps(good | {"threads": "2"}))
    with pytest.raises(db.RecordError, match="status must be one of"):
        db.parse_record(json.dumps(good | {"status": "great"}))
    with pytest.raises(db.RecordError, match="has samples and a median"):
        db.parse_record(json.dumps(good | {"median": None}))


def test_a_database_others_may_write_is_refused(cache):
    y, x = program()
    record_tuned(kernel_of(y, x))
    db.close()
    (cache / db.DB_NAME).chmod(0o666)
    with pytest.warns(tailjit.CacheWarning, match="writable by group or others"):
        described = loops(y, x)
    assert TUNED not in described  # and its records are not read


def test_a_database_with_no_faster_record_changes_no_generated_c(cache):
    y, x = program()
    before = tailjit.build(y, [x]).source
    k = kernel_of(y, x)
    db.record(k, default_schedule(k), [1.0], threads=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tailjit.build(y, [x]).source == before


#: In the measuring worker only (it runs with the lookup off, this test process with it on): the candidate's
#: program crashes or hangs there, and nowhere else
IN_WORKER = f"import os\nin_worker = os.environ.get({db.LOOKUP_ENV!r}) == '0'\n"


def candidate(kernel="y", **fields):
    source = PROGRAM + "outputs, inputs = y, [x]\n"
    k = api.prepare(*(lambda ns: (exec(source, ns), ns["outputs"], ns["inputs"])[1:])({}), None, None)[0].kernels[0]
    schedule = dataclasses.replace(default_schedule(k), **fields)
    return measure.Candidate(source, kernel, schedule, {"n": 300}, repeats=3, batch_s=0.002)


def test_a_measured_candidate_records_itself_and_the_default(cache):
    worker = measure.measuring_worker()
    try:
        records = measure.measure(candidate(unroll={"i": 2}), worker)
    finally:
        worker.close()
    assert [r.status for r in records] == ["ok", "ok"]
    assert [r.schedule["unroll"] for r in records] == [{}, {"#0": 2}]
    assert all(len(r.samples) == 3 and r.threads >= 1 and r.sizes == {"n": 300} for r in records)
    assert db.records() == records


@pytest.mark.parametrize(
    "prologue, why",
    [
        ("", "TEError: schedule would share loop 'i'"),  # an invalid schedule: an error in the worker
        (IN_WORKER + "import ctypes\nif in_worker: ctypes.string_at(0)\n", "crash: the worker died: signal SIGSEGV"),
        (IN_WORKER + "import time\nif in_worker: time.sleep(600)\n", "hang: no answer in 20 s"),
    ],
)
def test_a_failing_crashing_or_hanging_candidate_is_a_failed_record(cache, prologue, why):
    bad = candidate(sequential=["i"]) if not prologue else candidate(unroll={"i": 2})
    bad = dataclasses.replace(bad, source=prologue + bad.source)
    worker = measure.measuring_worker(timeout=20)
    try:
        (record,) = measure.measure(bad, worker)
        assert (record.status, record.median, record.samples) == ("failed", None, [])
        assert record.message.startswith(why)
        assert len(measure.measure(candidate(unroll={"i": 4}), worker)) == 2  # the next one is measured
    finally:
        worker.close()


def test_the_command_line_lists_exports_and_imports(cache, tmp_path, monkeypatch, capsys):
    y, x = program()
    record_tuned(kernel_of(y, x))
    path = tmp_path / "records.jsonl"
    assert main(["tune", "--export", str(path)]) == 0
    assert main(["tune", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "2 records in" in listed and '"unroll": {"#0": 2}' in listed and "2 threads" in listed
    db.close()
    monkeypatch.setenv("TAILJIT_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert main(["tune", "--import", str(path)]) == 0
    assert len(db.records()) == 2
    path.write_text("{}\n")
    assert main(["tune", "--import", str(path)]) == 2
    assert "line 1: fields" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["tune"])  # one of --list, --export, --import


def test_a_corrupt_database_leaves_builds_their_defaults_and_names_itself(cache):
    y, x = program()
    record_tuned(kernel_of(y, x))
    db.close()
    for f in cache.glob(db.DB_NAME + "*"):
        f.unlink()
    (cache / db.DB_NAME).write_bytes(b"not a database, " * 100)
    (cache / db.DB_NAME).chmod(0o600)
    with pytest.warns(db.TuneWarning, match="default schedules for this build: the tuning database .* cannot be used"):
        assert TUNED not in loops(y, x)
    with pytest.raises(db.DatabaseError, match="remove it"):
        db.records()
