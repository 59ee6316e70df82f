"""The schedule search (``tailjit.tuner.search``, ``tailjit tune --program``): what it measures and records, and
what builds take afterwards."""

import dataclasses
import json
import sys

import pytest
import torch

import tailjit
from tailjit import api, te
from tailjit.cli import main
from tailjit.schedule import default_schedule
from tailjit.schedule_space import valid
from tailjit.tunedb import db
from tailjit.tuner import measure, search
from tailjit.tuner.cli import parse_sizes

pytest.importorskip("optuna")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh kernel cache (and so tuning database) for the test."""
    monkeypatch.setenv("TAILJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(db.LOOKUP_ENV, raising=False)
    yield tmp_path / "cache"
    db.close()


def row_sums():
    """A row-wise sum of exponentials over ``(n, 64)``: a reduction, so most of the space is open."""
    x = te.placeholder((te.var("n"), 64), name="x")
    k = te.reduce_axis((0, 64), name="k")
    return te.compute((x.shape[0],), lambda i: te.sum(te.exp(x[i, k]), axis=k), name="s"), x


def kernel_of(y, x):
    return api.prepare(y, [x], None, None)[0].kernels[0]


def fake_seconds(schedule, default) -> float:
    """A made-up time per schedule (the default 1 s; others 0.5 s to 1.5 s by their text): a deterministic
    stand-in for measuring."""
    if schedule == default:
        return 1.0
    return 0.5 + (sum(json.dumps(dataclasses.asdict(schedule), sort_keys=True).encode()) % 11) / 10


@pytest.fixture
def fake_measure(monkeypatch):
    """``search``'s measuring replaced by recording made-up times through ``db.record``; the candidates
    measured, in order.  A candidate with ``vectorize`` off fails, as a candidate that errs in the worker does."""
    measured = []

    def measure(candidate, worker):
        ns: dict = {}
        exec(candidate.source, ns)
        kernel = kernel_of(ns["outputs"], ns["inputs"][0])
        assert valid(kernel, candidate.schedule)  # the search measures only valid compositions
        measured.append(candidate.schedule)
        if not candidate.schedule.vectorize:
            return [db.record(kernel, candidate.schedule, [], 2, candidate.sizes, failure="RuntimeError: made up")]
        default = default_schedule(kernel)
        return [
            db.record(kernel, default, [fake_seconds(default, default)], 2, candidate.sizes),
            db.record(kernel, candidate.schedule, [fake_seconds(candidate.schedule, default)], 2, candidate.sizes),
        ]

    monkeypatch.setattr(search, "measure", measure)
    return measured


def test_the_search_records_the_default_and_every_candidate_and_builds_take_the_fastest(cache, fake_measure):
    y, x = row_sums()
    kernel = kernel_of(y, x)
    default = default_schedule(kernel)
    (found,) = search.tune(y, [x], {"n": 100}, trials=8, seed=1).values()
    assert fake_measure[0] == default  # the default first
    assert len(fake_measure) == len({json.dumps(dataclasses.asdict(s), sort_keys=True) for s in fake_measure}) == 8
    assert (found.measured, found.failed) == (8 - sum(not s.vectorize for s in fake_measure), sum(
        not s.vectorize for s in fake_measure))  # fmt: skip
    recorded = [db.schedule_of(kernel, r.schedule) for r in db.records()]
    assert all(s in recorded for s in fake_measure)
    ok = [s for s in fake_measure if s.vectorize]
    best = min(fake_seconds(s, default) for s in ok)
    assert found.speedup == pytest.approx(1 / fake_seconds(found.schedule, default))
    assert fake_seconds(found.schedule, default) == min(best, 1.0) and found.schedule in ok  # a tie takes any
    assert api.prepare(y, [x], None, None)[1]["s"] == found.schedule  # what a later build takes


def test_the_seeded_search_draws_the_same_candidates(cache, fake_measure):
    y, x = row_sums()
    search.tune(y, [x], {"n": 100}, trials=6, seed=3)
    first = list(fake_measure)
    db.close()
    fake_measure.clear()
    search.tune(y, [x], {"n": 100}, trials=6, seed=3)
    assert fake_measure == first


def test_a_slower_search_leaves_builds_their_default(cache, fake_measure, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "fake_seconds", lambda s, d: 1.0 if s == d else 2.0)
    y, x = row_sums()
    (found,) = search.tune(y, [x], {"n": 100}, trials=4).values()
    assert (found.schedule, found.speedup) == (default_schedule(kernel_of(y, x)), 1.0)
    assert search.tune(y, [x], {"n": 100}, trials=1).popitem()[1].speedup == 1.0  # the default: measured again
    assert api.prepare(y, [x], None, None)[1]["s"] == default_schedule(kernel_of(y, x))


def test_a_faster_schedule_recorded_earlier_stays_the_choice(cache, fake_measure):
    y, x = row_sums()
    kernel = kernel_of(y, x)
    earlier = dataclasses.replace(default_schedule(kernel), unroll={"i": 2})
    db.record(kernel, earlier, [0.1], threads=2)
    (found,) = search.tune(y, [x], {"n": 100}, trials=1).values()  # measures the default only
    assert (found.schedule, found.speedup) == (earlier, None)


def test_invalid_compositions_are_failed_trials_never_measured(cache, fake_measure, monkeypatch):
    y, x = row_sums()
    kernel = kernel_of(y, x)
    monkeypatch.setattr(search, "valid", lambda k, s: s == default_schedule(kernel) or s.unroll == {})
    (found,) = search.tune(y, [x], {"n": 100}, trials=3).values()
    assert found.invalid > 0 and all(s.unroll == {} for s in fake_measure)


def test_a_kernel_hosting_merged_ones_is_not_searched(cache, fake_measure):
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    a = te.compute((n, m), lambda i, j: te.exp(te.tanh(x[i, j])) * te.log1p(te.abs(x[i, j])), name="a")
    c = te.compute((n, m), lambda i, j: a[i, j] * 2.0 + x[i, j], name="c")
    d = te.compute((n, m), lambda i, j: a[i, j] / (x[i, j] + 3.0), name="d")
    found = search.tune([c, d], [x], {"n": 4, "m": 4}, trials=3)
    assert found["d"].skipped.startswith("its loop nest hosts merged kernels") and fake_measure == []


def test_a_real_search_measures_and_records_in_a_worker(cache):
    y, x = row_sums()
    (found,) = search.tune(y, [x], {"n": 300}, trials=3, repeats=3, batch_s=0.002).values()
    assert found.measured + found.failed == 3 and found.measured >= 1
    records = db.records()
    default = db.schedule_record(kernel_of(y, x), default_schedule(kernel_of(y, x)))
    assert any(r.schedule == default and r.status == "ok" for r in records)
    assert len({json.dumps(r.schedule, sort_keys=True) for r in records}) == 3
    assert tailjit.tune is search.tune


def test_bad_requests_are_clear_errors(cache, monkeypatch):
    y, x = row_sums()
    with pytest.raises(ValueError, match=r"no value for the size variables \['n'\]"):
        search.tune(y, [x], {}, trials=3)
    with pytest.raises(ValueError, match="trials must be at least 1"):
        search.tune(y, [x], {"n": 4}, trials=0)
    monkeypatch.setitem(sys.modules, "optuna", None)  # not installed
    with pytest.raises(search.TuneError, match=r"pip install 'tailjit\[tune\]'"):
        search.tune(y, [x], {"n": 4})


def program_file(tmp_path):
    """:func:`row_sums` as a file for ``tailjit tune --program``."""
    path = tmp_path / "program.py"
    path.write_text(
        "from tailjit import te\n"
        "x = te.placeholder((te.var('n'), 64), name='x')\n"
        "k = te.reduce_axis((0, 64), name='k')\n"
        "outputs, inputs = te.compute((x.shape[0],), lambda i: te.sum(te.exp(x[i, k]), axis=k), name='s'), [x]\n"
    )
    return path


def test_the_command_line_searches_a_program_file(cache, tmp_path, fake_measure, capsys):
    path = program_file(tmp_path)
    assert main(["tune", "--program", str(path), "--sizes", "n=100", "--trials", "3"]) == 0
    out = capsys.readouterr().out
    assert "s #1: 1.00x the default" in out and "a build now uses (" in out and len(fake_measure) == 3
    assert main(["tune", "--program", str(path), "--sizes", "n=x"]) == 2
    assert "'n=x' is not NAME=INTEGER" in capsys.readouterr().err
    assert main(["tune", "--program", str(tmp_path / "missing.py")]) == 2
    path.write_text("from tailjit import te\nx = te.placeholder((4,), name='x')\n")
    assert main(["tune", "--program", str(path)]) == 2
    assert "the program defines no outputs and no inputs" in capsys.readouterr().err


def test_a_candidate_may_round_as_a_sum_in_another_order_does_and_no_more():
    expected = torch.tensor([64.0, 1e-3, float("nan"), float("inf")])  # a column sum that cancels to near zero
    measure.check_agrees(expected + torch.tensor([0.0, 5e-5, 0.0, 0.0]), expected)
    nan, inf = float("nan"), float("inf")
    for wrong in ([64.0, 0.1, nan, inf], [64.0, nan, nan, inf], [65.0, 1e-3, nan, inf], [64.0, 1e-3, nan, -inf]):
        with pytest.raises(AssertionError):
            measure.check_agrees(torch.tensor(wrong), expected)
    with pytest.raises(AssertionError):  # no finite magnitude: the plain tolerance
        measure.check_agrees(torch.tensor([float("inf"), 1.001]), torch.tensor([float("inf"), 1.0]))


def test_sizes_parse():
    assert parse_sizes("n=4096, m=80") == {"n": 4096, "m": 80}
    assert parse_sizes("") == {}
    for bad in ("n", "n=", "=3", "n=-1", "1n=3"):
        with pytest.raises(ValueError, match="is not NAME=INTEGER"):
            parse_sizes(bad)
