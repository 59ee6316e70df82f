"""The space of valid schedules of a kernel, for a tuner to search.

:func:`space` lists, per :class:`~tailjit.schedule.Schedule` field, the values worth trying for one kernel
(the default schedule's value always among them, fields that cannot change its code held at the default);
:func:`compose` turns one value per field into a schedule, fitting the fields that depend on others (a split
axis's loops in the order, a loop written out only while it stays innermost); :func:`valid` says whether a
schedule compiles for the kernel; :func:`sample` draws a valid one.  Every schedule ``sample`` returns
compiles and computes what the default schedule computes (bit for bit unless the order of a float sum or
product, or which elements take a vector math call's vector or scalar variant, changes):
``tests/test_schedule_space.py`` checks it over random programs.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

from tailjit.fusion import LoopNest, _reduces
from tailjit.schedule import PARALLEL_WORK, Schedule, check_schedule, default_schedule, loop_names
from tailjit.te.expr import Binary, Select, TEError, walk

#: Split factors tried per axis: dividing small extents or not, and longer than most.
SPLIT_FACTORS = (2, 3, 8, 32)

#: The values of the fields that shape the loops inside (``schedule.TACTICS``), the default's among them.
TACTIC_VALUES: dict[str, tuple] = {
    "split": (1, 2, 4, 8),
    "split_min": (0, 64, 512, 4096),
    "tail": (4, 8, 16, 32),
    "sum_block": (256, 1024, 4096),
    "calls_plain": (True, False),
    "column_block": (8, 16, 64, 256),
    "column_min": (0, 4, 1 << 30),
    "pair_max": (0, 16, 64),
    "qdiv_min": (0, 64, 1 << 30),
    "unswitch_versions": (1, 2, 8, 32),
    "unswitch_total": (1, 8, 64, 256),
    "cut_min_saving": (0, 5, 1 << 30),
    "gather_cost": (0, 4, 16),
}

#: The fields a kernel merged with others (``tailjit.loop_merge``) keeps at the default: its members run in
#: the default loop nest (written out by rows, column sums in column blocks).
PLAIN = ("order", "splits", "vectorize", "unroll", "expand", "modulus", "fold", "column_min", "pair_max")


def space(kernel: LoopNest) -> dict[str, list]:
    """Per ``Schedule`` field, the values to try for ``kernel``, the default schedule's first.  ``order`` lists
    permutations of the unsplit loops and ``splits`` at most one split axis: :func:`compose` puts a split
    axis's outer and inner loops where the axis is in the order."""
    d = default_schedule(kernel)
    names = loop_names(kernel)
    exprs = kernel.exprs() + [m.body for m in kernel.merged] + [u.body for u in kernel.side]
    nodes = [n for e in exprs for n in walk(e)]
    reduces, selects = bool(_reduces(*exprs)), any(isinstance(n, Select) for n in nodes)
    divides = any(isinstance(n, Binary) and n.op == "truediv" for n in nodes)
    choices: dict[str, list] = {
        "order": _first(d.order, [list(p) for p in itertools.permutations(names)]),
        "splits": [{}] + [{a: f} for a in names for f in SPLIT_FACTORS],
        "parallel": _first(d.parallel, [True, False]),
        "parallel_work": _first(d.parallel_work, [1, PARALLEL_WORK, 1 << 40]),
        "vectorize": _first(d.vectorize, [True, False]),
        "unroll": [{}] + [{a: f} for a in names for f in (2, 4)],
        "expand": _first(d.expand, [None]),
        "modulus": _first(d.modulus, [None]),
        "fold": _first(d.fold, [None]),
    }
    held = set(PLAIN) if kernel.merged else set()
    if not reduces:  # what only reductions read
        held |= {"split", "split_min", "tail", "sum_block", "calls_plain", "column_block", "column_min", "pair_max"}
    if not selects:
        held |= {"unswitch_versions", "unswitch_total", "cut_min_saving", "gather_cost"}
    if not divides:
        held.add("qdiv_min")
    if not names:
        held |= {"order", "splits", "unroll"}
    for name, values in TACTIC_VALUES.items():
        choices[name] = _first(getattr(d, name), list(values))
    for name in held:
        choices[name] = [getattr(d, name)]
    return choices


def compose(kernel: LoopNest, choice: dict) -> Schedule:
    """The schedule of ``kernel`` with one value per field of :func:`space` (fields left out keep the default):
    each split axis's loops in its place in the order, unrolls of loops the order lacks dropped, and
    ``expand``, ``modulus`` and ``fold`` kept only on the default's innermost loop, unsplit and vectorised."""
    d = default_schedule(kernel)
    values = {f.name: getattr(d, f.name) for f in dataclasses.fields(Schedule)} | dict(choice)
    splits = dict(values["splits"])
    order = [ln for a in values["order"] for ln in ([f"{a}.o", f"{a}.i"] if a in splits else [a])]
    same_inner = bool(order) and bool(d.order) and order[-1] == d.order[-1]
    for name in ("expand", "modulus", "fold"):
        if not same_inner or (name != "expand" and not values["vectorize"]):
            values[name] = None
    values.update(
        order=order,
        splits=splits,
        unroll={ln: f for ln, f in values["unroll"].items() if ln in order},
        sequential=list(d.sequential),
    )
    return Schedule(**values)


def valid(kernel: LoopNest, schedule: Schedule) -> bool:
    """Whether ``schedule`` compiles for ``kernel``: ``check_schedule`` accepts it, and a kernel merged with
    others keeps its default loop nest."""
    try:
        check_schedule(kernel, schedule)
    except TEError:
        return False
    d = default_schedule(kernel)
    return not kernel.merged or all(getattr(schedule, name) == getattr(d, name) for name in PLAIN)


def sample(kernel: LoopNest, rng: random.Random, choices: dict[str, list] | None = None, tries: int = 100) -> Schedule:
    """A valid schedule of ``kernel`` drawn from ``choices`` (by default ``space(kernel)``), each field's value
    uniformly; the default schedule when ``tries`` draws found none."""
    choices = space(kernel) if choices is None else choices
    for _ in range(tries):
        schedule = compose(kernel, {name: rng.choice(values) for name, values in choices.items()})
        if valid(kernel, schedule):
            return schedule
    return default_schedule(kernel)


def _first(default, values: list) -> list:
    """``values`` with ``default`` first, once."""
    return [default] + [v for v in values if v != default]
