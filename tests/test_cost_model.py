"""The cost model (``tailjit.tuner.cost_model``) and the search ranking with it: features, what a model fit on
records ranks first, and how many candidates a search with it measures."""

import math
import random
import sys

import pytest
import test_tuner
from hypothesis import HealthCheck, given, settings
from test_schedule_space import PROGRAMS, _program
from test_tuner import cache, fake_measure, kernel_of, row_sums  # noqa: F401 (fixtures)

from tailjit.cli import main
from tailjit.fusion import partition
from tailjit.loop_merge import merge_loops
from tailjit.schedule import default_schedule
from tailjit.schedule_space import sample
from tailjit.tunedb import db
from tailjit.tuner import cost_model, search

pytest.importorskip("lightgbm")
pytest.importorskip("optuna")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**PROGRAMS)
def test_features_are_fixed_length_finite_and_the_same_for_the_same_program(
    kind, body, epilogue, op, static, n, m, p, seed
):
    rows = []
    for _ in range(2):  # built twice: other tensor objects, the same rows
        outs, ins = _program(kind, body, epilogue, op, static, n, m, p)
        rng = random.Random(seed)
        rows.append([
            cost_model.features(k, db.schedule_record(k, sample(k, rng)), {"n": n, "m": m})
            for k in merge_loops(partition(ins, outs)).kernels
        ])  # fmt: skip
    assert rows[0] == rows[1]
    for row in rows[0]:
        assert len(row) == len(cost_model.NAMES) and all(isinstance(v, float | int) and math.isfinite(v) for v in row)


def test_the_loop_points_count_the_reduction_at_the_given_sizes():
    y, x = row_sums()  # (n,) rows of a sum over 64
    features = dict(zip(cost_model.KERNEL_FEATURES, cost_model.kernel_features(kernel_of(y, x), {"n": 32})))
    assert features["log2_points"] == math.log2(32 * 64)
    assert (features["dims"], features["reduce_dims"], features["reductions"], features["math_calls"]) == (1, 1, 1, 1)
    assert cost_model.kernel_features(kernel_of(y, x), {})[0] == -1  # the size unknown


def split_decides(schedule, default) -> float:
    """Made-up seconds: the default 1 s; any schedule with 8 accumulators half that, others 1.5 s."""
    if schedule == default:
        return 1.0
    return 0.5 if schedule.split == 8 else 1.5


def test_a_model_fit_on_records_ranks_the_fast_schedules_first(cache):  # noqa: F811
    y, x = row_sums()
    kernel = kernel_of(y, x)
    default = default_schedule(kernel)
    rng = random.Random(0)
    assert cost_model.fit([kernel], db.records()) is None  # no records: nothing to rank by
    for _ in range(40):
        s = sample(kernel, rng)
        db.record(kernel, default, [1.0], 2, {"n": 100})
        db.record(kernel, s, [split_decides(s, default)], 2, {"n": 100})
    model = cost_model.fit([kernel], db.records())
    fresh = [sample(kernel, rng) for _ in range(30)]
    ranked = model.rank(kernel, fresh, {"n": 100})
    fast = sum(s.split == 8 for s in fresh)
    assert 0 < fast < len(fresh)
    assert all(s.split == 8 for s in ranked[:fast]) and sorted(map(id, ranked)) == sorted(map(id, fresh))


def test_records_of_other_kernels_and_failed_ones_are_not_rows(cache):  # noqa: F811
    y, x = row_sums()
    kernel = kernel_of(y, x)
    default = default_schedule(kernel)
    db.record(kernel, default, [2.0], 2, {"n": 100})
    db.record(kernel, default, [], 2, {"n": 100}, failure="RuntimeError: made up")
    rows, targets = cost_model.training_rows([kernel], db.records())
    assert len(rows) == 1 and targets == [0.0]
    assert cost_model.training_rows([], db.records()) == ([], [])


def test_the_search_with_the_model_measures_fewer_candidates_for_the_same_trials(cache, fake_measure, monkeypatch):  # noqa: F811
    monkeypatch.setattr(test_tuner, "fake_seconds", split_decides)
    y, x = row_sums()
    (plain,) = search.tune(y, [x], {"n": 100}, trials=60).values()
    measured_plain = len(fake_measure)
    assert measured_plain == plain.measured + plain.failed == 60 and plain.unmeasured == 0
    db.close()
    monkeypatch.setenv("TAILJIT_CACHE_DIR", str(cache.parent / "second"))  # the model starts from no records
    fake_measure.clear()
    (ranked,) = search.tune(y, [x], {"n": 100}, trials=60, cost_model=True).values()
    assert fake_measure[0] == default_schedule(kernel_of(y, x))  # the default is always measured
    assert len(fake_measure) == ranked.measured + ranked.failed < measured_plain / 2
    assert ranked.measured + ranked.failed + ranked.unmeasured == 60
    assert ranked.schedule.split == 8 == plain.schedule.split  # both reach a fast schedule


def test_the_cost_model_without_lightgbm_is_a_clear_error(cache, monkeypatch):  # noqa: F811
    monkeypatch.setitem(sys.modules, "lightgbm", None)  # not installed
    y, x = row_sums()
    with pytest.raises(search.TuneError, match="the cost model needs LightGBM: pip install"):
        search.tune(y, [x], {"n": 100}, cost_model=True)


def test_the_command_line_takes_the_cost_model(cache, tmp_path, fake_measure, capsys):  # noqa: F811
    path = test_tuner.program_file(tmp_path)
    assert main(["tune", "--program", str(path), "--sizes", "n=100", "--trials", "40", "--cost-model"]) == 0
    out = capsys.readouterr().out
    assert len(fake_measure) < 40 and f"{40 - len(fake_measure)} ranked out" in out
