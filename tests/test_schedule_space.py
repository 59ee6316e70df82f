"""The schedule space: random programs built with random valid schedules from ``schedule_space.space`` compute
what the default schedules compute, bit for bit where no float sum or product changes its order and no vector
math call may take its scalar variant instead, within a tolerance otherwise."""

import dataclasses
import random
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_random_programs import Node, expressions

import tailjit
from tailjit import api, te
from tailjit.codegen import VECTOR_CALLS
from tailjit.fusion import partition
from tailjit.loop_merge import merge_loops
from tailjit.schedule import TACTICS, Schedule, default_schedule
from tailjit.schedule_space import compose, sample, space, valid
from tailjit.te.expr import Binary, Reduce, Unary, walk

KINDS = ["map", "row", "col", "pair", "cat", "catsum", "scan", "scatter", "merge"]


def _program(kind, body, epilogue, op, static, n, m, p):
    """``(outputs, inputs)``: a random element-wise ``body`` over ``x`` (n, m) and the row ``b`` in a program of
    ``kind``: alone, reduced over rows or columns (``op``), a column sum over a short trailing axis of a 3-d
    input, a ``cat`` along the rows (its reduction), a scan, a scatter, or stored once and read by two outputs
    and a column sum (kernels merged by ``tailjit.loop_merge``)."""
    nv, mv = (n, m) if static else (te.var("n"), te.var("m"))
    x = te.placeholder((nv, mv), name="x")
    b = te.placeholder((mv,), name="b")
    ix = te.placeholder((nv, mv), "int32", name="ix")
    x3 = te.placeholder((3, nv, p), name="x3")
    env = {"x": x, "b": b, "ix": ix, "m": mv}
    first = te.compute((nv, mv), lambda i, j: body.build(i, j, env), name="first")
    reduce = getattr(te, op)
    if kind == "map":
        outs = [first]
    elif kind == "row":
        k = te.reduce_axis(mv, "k")
        red = te.compute((nv,), lambda i: reduce(first[i, k], axis=k), name="red")
        outs = [te.compute((nv, mv), lambda i, j: epilogue.build(i, j, env) + red[i] + first[i, j], name="out"), red]
    elif kind == "col":
        k = te.reduce_axis(nv, "k")
        red = te.compute((mv,), lambda j: reduce(first[k, j], axis=k), name="red")
        outs = [red, te.compute((nv, mv), lambda i, j: first[i, j] * red[j], name="out")]
    elif kind == "pair":
        k = te.reduce_axis(3, "k")
        outs = [te.compute((nv, p), lambda i, j: reduce(x3[k, i, j] * x3[k, i, j] - x3[k, i, j], axis=k), name="pair")]
    elif kind in ("cat", "catsum"):

        def cat(i, j):  # loads clamped as the frontend's cat lowering clamps them
            return te.select(j < mv, first[i, te.minimum(j, mv - 1)], 2.0 * x[i, te.maximum(j - mv, 0)])

        if kind == "cat":
            outs = [te.compute((nv, mv * 2), cat, name="cat")]
        else:
            k = te.reduce_axis(mv * 2, "k")
            outs = [te.compute((nv,), lambda i: reduce(cat(i, k), axis=k), name="catred")]
    elif kind == "scan":
        outs = [te.scan((nv, mv), p % 2, lambda prev, i, j: prev * 0.5 + first[i, j], name="scan")]
    elif kind == "scatter":
        outs = [te.scatter(first, (nv, mv), lambda i, j: ((i, ix[i, j] % mv), x[i, j]), name="scatter")]
    else:  # costly enough to be stored once for its readers, which share its loop nest
        a = te.compute((nv, mv), lambda i, j: te.exp(te.tanh(first[i, j])) * te.log1p(te.abs(first[i, j])), name="a")
        k = te.reduce_axis(nv, "k")
        outs = [
            te.compute((nv, mv), lambda i, j: a[i, j] * 2.0 + x[i, j], name="c"),
            te.compute((nv, mv), lambda i, j: a[i, j] / (x[i, j] + 3.0), name="d"),
            te.compute((mv,), lambda j: reduce(a[k, j], axis=k), name="s"),
        ]
    return outs, [x, b, ix, x3]


def _inputs(n, m, p, seed):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(n, m, generator=g),
        torch.randn(m, generator=g),
        torch.randint(-20, 20, (n, m), generator=g, dtype=torch.int32),
        torch.randn(3, n, p, generator=g),
    )


def _exact(outs, ins) -> bool:
    """Whether every schedule must give the default's bits: no float sum or product (blocks, accumulators
    and cuts change their order) and no vector math call (a loop's remainder may call the scalar variant)."""
    program = partition(ins, outs)
    nodes = [n for k in program.kernels for e in k.exprs() for n in walk(e)]
    return not any(
        (isinstance(n, Reduce) and n.op in ("sum", "prod") and n.body.dtype.is_float)
        or (isinstance(n, (Unary, Binary)) and n.op in VECTOR_CALLS)
        for n in nodes
    )


def _same(got, want, exact: bool):
    if not exact:
        scale = 1.0 + float(want.abs().nan_to_num(0.0, 0.0, 0.0).max()) if want.numel() else 1.0
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * scale, equal_nan=True)
        return
    assert torch.equal(got.isnan(), want.isnan())
    # max and min keep whichever of 0.0 and -0.0 they meet first: the order of equal values may change
    keep = ~want.isnan()
    assert torch.equal((got[keep] + 0.0).view(torch.int32), (want[keep] + 0.0).view(torch.int32))


def _check(kind, body, epilogue, op, static, n, m, p, seed, draws):
    outs, ins = _program(kind, body, epilogue, op, static, n, m, p)
    args = _inputs(n, m, p, seed)
    want = tailjit.build(outs, ins)(*args)
    want = want if isinstance(want, tuple | list) else (want,)
    exact = _exact(outs, ins)
    rng = random.Random(seed)
    for _ in range(draws):
        drawn = {}

        def drawing(k, drawn=drawn):  # the tuner's route: each kernel of the build, after loop merging
            drawn[k.name] = s = sample(k, rng)
            return s

        with mock.patch.object(api, "default_schedule", drawing):
            f = tailjit.build(outs, ins)
        got = f(*args)
        got = got if isinstance(got, tuple | list) else (got,)
        for g, w in zip(got, want):
            try:
                _same(g, w, exact)
            except AssertionError as e:
                raise AssertionError(f"{kind}: schedules {[s.describe() for s in drawn.values()]}: {e}") from None


PROGRAMS = dict(
    kind=st.sampled_from(KINDS),
    body=expressions(),
    epilogue=expressions(),
    op=st.sampled_from(["sum", "max", "min"]),
    static=st.booleans(),
    n=st.sampled_from([1, 2, 3, 7, 9]),
    m=st.sampled_from([1, 2, 5, 16, 17, 33, 130, 600]),
    p=st.sampled_from([1, 2, 3, 4, 5]),
    seed=st.integers(0, 2**32 - 1),
)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**PROGRAMS)
def test_random_schedules_compute_what_the_default_does(kind, body, epilogue, op, static, n, m, p, seed):
    _check(kind, body, epilogue, op, static, n, m, p, seed, draws=2)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**PROGRAMS)
def test_many_random_schedules_compute_what_the_default_does(kind, body, epilogue, op, static, n, m, p, seed):
    _check(kind, body, epilogue, op, static, n, m, p, seed, draws=3)


def _kernels(kind, static=False):
    outs, ins = _program(kind, LEAF, LEAF, "sum", static, 3, 5, 2)
    return merge_loops(partition(ins, outs)).kernels


LEAF = Node(lambda i, j, e: e["x"][i, j], lambda e: e["x"])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("static", [False, True])
def test_the_space_starts_with_the_default_schedule(kind, static):
    """Each field's first value is the default schedule's; composed, they give the default schedule."""
    for k in _kernels(kind, static):
        choices = space(k)
        assert set(choices) == {f.name for f in dataclasses.fields(Schedule)} - {"sequential"}
        assert compose(k, {name: values[0] for name, values in choices.items()}) == default_schedule(k)
        assert valid(k, default_schedule(k))


def test_fields_a_kernel_cannot_use_hold_their_default():
    """An element-wise kernel without selects or divisions offers no reduction, cut or division choices (a
    tuner would measure the same code twice); a kernel with a row sum offers its accumulators."""
    (plain,) = _kernels("map")
    choices = space(plain)
    assert all(len(choices[name]) == 1 for name in TACTICS)
    assert len(choices["order"]) == 2 and len(choices["vectorize"]) == 2
    (row,) = _kernels("row")
    assert space(row)["split"] == [4, 1, 2, 8]


def test_compose_puts_a_split_axis_loops_in_its_place():
    (k,) = _kernels("map")
    s = compose(k, {"order": ["j", "i"], "splits": {"i": 3}, "unroll": {"j": 2}})
    assert s.order == ["j", "i.o", "i.i"] and s.splits == {"i": 3} and s.unroll == {"j": 2}
    assert valid(k, s)
    assert compose(k, {"splits": {"j": 8}, "unroll": {"j": 2}}).unroll == {}  # "j" is now "j.o" and "j.i"


def test_valid_rejects_what_the_code_generator_cannot_run():
    (scan,) = _kernels("scan")  # along axis 0: the outer loop carries the recurrence
    assert not valid(scan, compose(scan, {"parallel": True}))
    assert not valid(scan, compose(scan, {"order": ["j", "i"]}))  # the scan's axis would be vectorised
    assert valid(scan, compose(scan, {"order": ["j", "i"], "vectorize": False}))
    (host,) = [k for k in _kernels("merge") if k.merged]
    assert not valid(host, compose(host, {"order": ["j", "i"]}))  # its members run in the default loop nest
    assert not valid(host, compose(host, {"tail": 12}))  # not a power of two


def test_sample_draws_valid_schedules_and_varies():
    (k,) = _kernels("row")
    rng = random.Random(0)
    drawn = [sample(k, rng) for _ in range(30)]
    assert all(valid(k, s) for s in drawn)
    assert len({s.describe() for s in drawn}) > 20
