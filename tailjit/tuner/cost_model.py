"""A learned cost model that ranks candidate schedules before they are measured (``docs/tuning.md``).

Each row is a kernel and a schedule as a fixed-length numeric vector (:func:`features`): the kernel's number of
loop points at the measured sizes, its dims, loads, reductions, selects and vector math calls (from the IR), and
every ``Schedule`` field as a number (loops by position, so a record of one kernel says something about
another).  The target is the record's median time over its kernel's default schedule's (log), so kernels of
different sizes share one scale.  The model is retrained from the tuning database's records on each round of a
search (:func:`fit`): there is no model file to go stale.

Why LightGBM: maintained gradient-boosted trees, which take mixed numeric and yes/no features without scaling,
train in milliseconds on a few hundred rows, and offer ranking objectives as well as regression (a regression
on the log ratio ranks candidates of one kernel and keeps the scale across kernels).  It is the ``tune`` extra.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re

import numpy as np

from tailjit import fusion
from tailjit.codegen import VECTOR_CALLS
from tailjit.schedule import Schedule, default_schedule
from tailjit.te.expr import Binary, Const, Load, Reduce, Select, SizeVar, Unary, walk
from tailjit.tunedb import db
from tailjit.tunedb.fingerprint import fingerprint, size_bucket

#: Rows (ok records with their kernel's default recorded) a model needs before it ranks anything.
MIN_ROWS = 8

_POSITION = re.compile(r"#(\d+)")

#: The Schedule fields that are numbers or yes/no, each one feature.
_SCALARS = tuple(f.name for f in dataclasses.fields(Schedule) if f.type in ("int", "bool", "int | None"))

KERNEL_FEATURES = ("log2_points", "dims", "reduce_dims", "loads", "reductions", "selects", "math_calls")
SCHEDULE_FEATURES = (
    "loops",
    "order_sorted",
    "innermost_axis",
    "outermost_axis",
    "split_axis",
    "log2_split",
    "unroll_axis",
    "unroll",
    "expand",
    *_SCALARS,
)
#: The names of :func:`features`' values, in order.
NAMES = KERNEL_FEATURES + SCHEDULE_FEATURES


def kernel_features(kernel: fusion.LoopNest, sizes: dict[str, int]) -> list[float]:
    """The kernel's part of a row (``KERNEL_FEATURES``): its loop points at ``sizes`` (log2; -1 where an extent
    is not a sum or product of constants and the size variables given) and counts from its IR."""
    exprs = kernel.exprs() + [m.body for m in kernel.merged] + [u.body for u in kernel.side]
    nodes = {id(n): n for e in exprs for n in walk(e)}.values()
    reduces = [n for n in nodes if isinstance(n, Reduce)]
    reduce_axes = {id(a): a for r in reduces for a in r.axes}.values()
    extents = [_value(e, sizes) for e in kernel.tensor.shape] + [_value(a.extent, sizes) for a in reduce_axes]
    points = -1.0 if None in extents else math.log2(max(math.prod(extents), 1))
    return [
        points,
        len(kernel.tensor.shape),
        len(reduce_axes),
        sum(isinstance(n, Load) for n in nodes),
        len(reduces),
        sum(isinstance(n, Select) for n in nodes),
        sum(isinstance(n, (Unary, Binary)) and n.op in VECTOR_CALLS for n in nodes),
    ]


def schedule_features(fields: dict) -> list[float]:
    """A schedule's part of a row (``SCHEDULE_FEATURES``), from its fields with loops named by position (as
    ``db.schedule_record`` writes them): which axes are innermost and outermost, the split and unrolled axis
    and their factors (0 where none), and each scalar field."""
    axes = [_axis(name) for name in fields["order"]]
    (split_axis, split), (unroll_axis, unroll) = (_first_item(fields[f]) for f in ("splits", "unroll"))
    return [
        len(axes),
        float(axes == sorted(axes)),
        axes[-1] if axes else -1,
        axes[0] if axes else -1,
        split_axis,
        math.log2(split) if split else 0.0,
        unroll_axis,
        unroll,
        float(fields["expand"] is not None),
        *(_number(fields[name]) for name in _SCALARS),
    ]


def features(kernel: fusion.LoopNest, fields: dict, sizes: dict[str, int]) -> list[float]:
    """One row: the kernel's features at ``sizes`` and the schedule's (fields by position)."""
    return kernel_features(kernel, sizes) + schedule_features(fields)


class CostModel:
    """Gradient-boosted trees predicting a schedule's log time over its kernel's default."""

    def __init__(self, booster):
        self._booster = booster

    def predict(self, kernel: fusion.LoopNest, schedules: list[Schedule], sizes: dict[str, int]) -> list[float]:
        """The predicted log time over the default of each of ``schedules`` of ``kernel`` (lower is faster)."""
        rows = [features(kernel, db.schedule_record(kernel, s), sizes) for s in schedules]
        return [float(p) for p in self._booster.predict(np.asarray(rows, dtype=np.float64))]

    def rank(self, kernel: fusion.LoopNest, schedules: list[Schedule], sizes: dict[str, int]) -> list[Schedule]:
        """``schedules`` predicted fastest first (ties in their order)."""
        predicted = self.predict(kernel, schedules, sizes)
        return [schedules[i] for i in sorted(range(len(schedules)), key=predicted.__getitem__)]


def training_rows(kernels: list[fusion.LoopNest], records: list[db.Record]) -> tuple[list[list[float]], list[float]]:
    """Rows and targets from the ``ok`` records of ``kernels`` measured on this machine (the database keeps no
    IR, so a record of a kernel not given has no kernel features and is left out): each record's log median
    over the median of its kernel's default records at the same sizes; records with no default beside them are
    left out."""
    by_key = {(fingerprint(k), size_bucket(k)): k for k in kernels}
    here = db.machine()
    defaults: dict[tuple, list[float]] = {}
    mine = []
    for r in records:
        kernel = by_key.get((r.fingerprint, r.bucket))
        if kernel is None or r.status != "ok" or (r.cpu, r.compiler, r.tailjit) != here:
            continue
        at = (r.fingerprint, r.bucket, json.dumps(r.sizes, sort_keys=True))
        mine.append((kernel, at, r))
        if r.schedule == db.schedule_record(kernel, default_schedule(kernel)):
            defaults.setdefault(at, []).append(r.median)
    rows, targets = [], []
    for kernel, at, r in mine:
        if at in defaults:
            rows.append(features(kernel, r.schedule, r.sizes))
            targets.append(math.log(r.median / sorted(defaults[at])[len(defaults[at]) // 2]))
    return rows, targets


def fit(kernels: list[fusion.LoopNest], records: list[db.Record], seed: int = 0) -> CostModel | None:
    """A model trained on the records of ``kernels`` (:func:`training_rows`); None with fewer than
    ``MIN_ROWS`` rows, too few to rank by."""
    rows, targets = training_rows(kernels, records)
    if len(rows) < MIN_ROWS:
        return None
    import lightgbm  # the tune extra: imported only when a model is trained (search.py checks it is there)

    params = {
        "objective": "regression",
        "learning_rate": 0.1,
        "num_leaves": 15,
        "min_data_in_leaf": 2,  # a few hundred rows at most: leaves of the default 20 would learn nothing
        "min_data_in_bin": 1,
        "num_threads": 1,  # the machine is measuring: training must not take its cores
        "deterministic": True,
        "seed": seed,
        "verbose": -1,
    }
    data = lightgbm.Dataset(
        np.asarray(rows, dtype=np.float64),
        np.asarray(targets),
        feature_name=list(NAMES),
        params={"min_data_in_bin": 1, "verbose": -1},
    )
    return CostModel(lightgbm.train(params, data, num_boost_round=100))


def _value(e, sizes: dict[str, int]) -> int | None:
    """An extent's value: constants and the size variables in ``sizes`` under + - * //; None otherwise."""
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, SizeVar):
        return sizes.get(e.name)
    if isinstance(e, Binary) and e.op in ("add", "sub", "mul", "floordiv"):
        a, b = _value(e.a, sizes), _value(e.b, sizes)
        if a is None or b is None or (e.op == "floordiv" and b == 0):
            return None
        return {"add": a + b, "sub": a - b, "mul": a * b, "floordiv": a // max(b, 1)}[e.op]
    return None


def _axis(loop: str) -> int:
    """The axis position of a loop named by position (``#2``, ``#2.o``); -1 for another name."""
    m = _POSITION.match(loop)
    return int(m.group(1)) if m else -1


def _first_item(loops: dict) -> tuple[int, int]:
    """(axis position, factor) of a splits or unroll dict's first entry; (-1, 0) for an empty one."""
    return next(((_axis(k), int(v)) for k, v in sorted(loops.items())), (-1, 0))


def _number(value) -> float:
    """A scalar field as a feature: a flag 0 or 1, a count on a log scale (they span 1 to 2^40), None -1."""
    if value is None:
        return -1.0
    if isinstance(value, bool):
        return float(value)
    return math.log2(1 + value)
