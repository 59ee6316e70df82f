"""Explicit schedules: every legal schedule computes the same values."""

import dataclasses
import functools
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tailjit
from tailjit import te
from tailjit.schedule import UNSWITCH_TOTAL, UNSWITCH_VERSIONS, Schedule
from tailjit.te.expr import Const


def _program():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    b = te.placeholder((m,), name="b")
    k = te.reduce_axis(m, "k")
    mean = te.compute((n,), lambda i: te.sum(x[i, k], axis=k) / m, name="mean")
    y = te.compute((n, m), lambda i, j: te.tanh(x[i, j] - mean[i]) * b[j], name="y")
    return [x, b], y


def _ref(x, b):
    return torch.tanh(x - x.mean(1, keepdim=True)) * b


@pytest.mark.parametrize(
    "schedule",
    [
        Schedule(order=["j", "i"]),
        Schedule(order=["i.o", "j", "i.i"], splits={"i": 4}),
        Schedule(order=["i", "j.o", "j.i"], splits={"j": 8}, unroll={"j.i": 4}),
        Schedule(order=["i", "j"], parallel=True, parallel_work=1),
        Schedule(order=["i", "j"], parallel=False, vectorize=False),
        Schedule(order=["i", "j"], modulus=2),
        Schedule(order=["j", "i"], modulus=3),
        Schedule(order=["i", "j"], fold=4),
        Schedule(order=["j", "i"], fold=3),
    ],
    ids=[
        "reordered",
        "split-outer",
        "split-inner-unrolled",
        "always-parallel",
        "serial-scalar",
        "residues",
        "reordered-residues",
        "folded",
        "reordered-folded",
    ],
)
def test_schedules_agree(schedule):
    ins, y = _program()
    f = tailjit.build(y, ins, schedules={"y": schedule})
    torch.set_num_threads(2)
    for n, m in ((1, 1), (7, 13), (64, 33), (0, 5)):
        x, b = torch.randn(n, m), torch.randn(m)
        torch.testing.assert_close(f(x, b), _ref(x, b), rtol=1e-5, atol=1e-6)
    assert schedule.describe() in f.describe()


def test_parallel_default_is_used_on_large_inputs():
    ins, y = _program()
    f = tailjit.build(y, ins)
    torch.set_num_threads(2)
    x, b = torch.randn(2000, 300), torch.randn(300)
    torch.testing.assert_close(f(x, b), _ref(x, b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "schedule, message",
    [
        (Schedule(order=["i"]), "not a permutation"),
        (Schedule(order=["i.i", "i.o", "j"], splits={"i": 2}), "outer loop must come before"),
        (Schedule(order=["i", "j"], splits={"z": 2}), "splits unknown axis"),
        (Schedule(order=["i.o", "i.i", "j"], splits={"i": 0}), "positive int"),
        (Schedule(order=["i", "j"], split=0), "split must be an int >= 1, got 0"),
        (Schedule(order=["i", "j"], column_block=True), "column_block must be an int >= 1, got True"),
        (Schedule(order=["i", "j"], qdiv_min=-1), "qdiv_min must be an int >= 0"),
        (Schedule(order=["i", "j"], tail=12), "tail must be a power of two"),
        (Schedule(order=["i", "j"], sum_block=8192), "sum_block must be a power of two from tail"),
        (Schedule(order=["i", "j"], tail=32, sum_block=16), "sum_block must be a power of two from tail"),
        (Schedule(order=["i", "j"], calls_plain=1), "calls_plain must be a bool"),
    ],
)
def test_invalid_schedules(schedule, message):
    ins, y = _program()
    with pytest.raises(te.TEError, match=message):
        tailjit.build(y, ins, schedules={"y": schedule})


def test_schedule_for_unknown_kernel():
    ins, y = _program()
    with pytest.raises(te.TEError, match="not a kernel"):
        tailjit.build(y, ins, schedules={"mean": Schedule(order=["i"])})


def _stacked_columns():
    """``torch.stack([...], -1)`` of four computed columns: the innermost loop picks a branch by its index."""
    n = te.var("n")
    x = te.placeholder((n, 4), name="x")
    lo = te.placeholder((2,), name="lo")
    w = te.compute((n,), lambda i: te.exp(te.minimum(te.maximum(x[i, 2], -4.0), 4.0)), name="w")
    cx = te.compute((n,), lambda i: (x[i, 0] + x[i, 1]) * 0.5, name="cx")

    def col(c, i):
        v = cx[i] - w[i] * 0.5 if c % 2 == 0 else cx[i] + w[i] * 0.5
        return te.minimum(te.maximum(te.minimum(te.maximum(v, lo[0]), lo[1]), -1e3), 1e3)

    def body(i, j):  # as the frontend lowers stack: one pinned branch per column
        v = te.select(j == 3, col(3, i), 0.0)
        for c in (2, 1, 0):
            v = te.select(j == c, col(c, i), v)
        return v

    y = te.compute((n, 4), body, name="y")
    return [x, lo], y


def _stacked_ref(x, lo):
    w = torch.exp(x[:, 2].clamp(-4, 4))
    cx = (x[:, 0] + x[:, 1]) * 0.5
    cols = [cx - w * 0.5, cx + w * 0.5, cx - w * 0.5, cx + w * 0.5]
    return torch.stack([torch.clamp(torch.clamp(c, lo[0], lo[1]), -1e3, 1e3) for c in cols], -1)


def test_a_stack_of_columns_expands_its_short_inner_loop():
    ins, y = _stacked_columns()
    f = tailjit.build(y, ins)
    (k,) = f.kernels
    assert "expand" in k.describe()
    # each column written once with its own branch; the shared exp bound to one local (not once per column)
    loop = f.source[f.source.index("static int kern_") :]
    loop = loop[: loop.index("int run_kern_")]
    assert loop.count("expf(") == 1  # one version: every buffer is contiguous
    vectorised = loop.split("#pragma omp simd", 1)[1]
    assert not [ln for ln in vectorised.splitlines() if "? " in ln and "const" not in ln]  # no select left
    for n in (0, 1, 5, 1000):
        x = torch.randn(n, 4) * 3
        x[::7, 2] = float("nan")
        lo = torch.tensor([-2.0, 40.0])
        torch.testing.assert_close(f(x, lo), _stacked_ref(x, lo), equal_nan=True)
        torch.testing.assert_close(f(x.t().contiguous().t(), lo), _stacked_ref(x, lo), equal_nan=True)


def test_loops_of_one_iteration_are_left_out():
    """A stack of columns over one class, ``(n, 1, 4)`` (delta2bbox with one class): the class loop runs
    once, so the boxes are the vector loop (vectorised over the class, it ran 35x slower), and a kernel
    whose every loop runs once is a straight line."""
    ins, y = _stacked_columns()
    n = y.shape[0]
    z = te.compute((n, 1, 4), lambda i, c, j: y[i, j] * 2.0, name="z")
    f = tailjit.build(z, ins)
    loop = f.source[f.source.index("static int kern_") :]
    loop = loop[: loop.index("int run_kern_")]
    assert loop.count("for (") == 1 and "#pragma omp simd" in loop
    for rows in (0, 1, 5, 1000):
        x = torch.randn(rows, 4) * 3
        lo = torch.tensor([-2.0, 40.0])
        torch.testing.assert_close(f(x, lo), (_stacked_ref(x, lo) * 2.0)[:, None], equal_nan=True)
    a = te.placeholder((1, 1), name="a")
    one = tailjit.build(te.compute((1, 1), lambda i, j: a[i, j] * 3.0 + 1.0, name="one"), [a])
    assert "for (" not in one.source[one.source.index("static int kern_") : one.source.index("int run_kern_")]
    torch.testing.assert_close(one(torch.tensor([[2.0]])), torch.tensor([[7.0]]))


def test_expanding_is_only_for_static_short_loops():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    y = te.compute((n, m), lambda i, j: te.select(j == 0, x[i, j] * 2, x[i, j]), name="y")  # symbolic extent
    z = te.compute((n, 16), lambda i, j: te.select(j == 0, x[i, 0], x[i, 1]), name="z")  # too long
    f = tailjit.build([y, z], [x])
    assert all("expand" not in k.describe() for k in f.kernels)
    xv = torch.randn(5, 3)
    torch.testing.assert_close(f(xv)[0], torch.cat([xv[:, :1] * 2, xv[:, 1:]], 1))


def test_expand_must_be_the_innermost_loop():
    ins, y = _program()
    with pytest.raises(te.TEError, match="expands"):
        tailjit.build(y, ins, schedules={"y": Schedule(order=["i", "j"], expand="i")})


def test_nested_clamps_keep_the_source_linear():
    """NaN-propagating max/min take each operand once: twenty nested clamps are twenty calls, not 3**20 copies."""
    n = te.var("n")
    x = te.placeholder((n,), name="x")

    def nest(i):
        v = x[i]
        for k in range(20):
            v = te.minimum(te.maximum(v * 1.5, -float(k + 1)), float(k + 1))
        return v

    f = tailjit.build(te.compute((n,), nest, name="y"), [x])
    assert len(f.source) < 200_000
    xv = torch.tensor([0.3, -7.0, float("nan"), float("inf")])
    want = xv.clone()
    for k in range(20):
        want = torch.clamp(want * 1.5, -(k + 1.0), k + 1.0)
    torch.testing.assert_close(f(xv), want, equal_nan=True)


def test_selects_on_outer_loops_are_tested_once_per_row():
    """Gates picked by an outer index (one (B, 3, H) tensor of LSTM-style gates) and a ``cat`` along an
    outer dimension: the innermost loop is unswitched on the outer conditions, so the vector lanes do not
    evaluate every branch, and the loads in each version stay in bounds (checked at call time)."""
    n, h = te.var("n"), te.var("h")
    g = te.placeholder((n, 3, h), name="g")

    def gate(i, c, j):
        return te.select(c == 0, te.sigmoid(g[i, c, j]), te.select(c == 1, te.tanh(g[i, c, j]), te.exp(g[i, c, j])))

    y = te.compute((n, 3, h), gate, name="gates")
    a, b = te.placeholder((n, h), name="a"), te.placeholder((n, h), name="b")
    cat = te.compute((n * 2, h), lambda i, j: te.select(i < n, a[te.minimum(i, n - 1), j], b[te.maximum(i - n, 0), j]),
                     name="cat")  # fmt: skip
    f = tailjit.build([y, cat], [g, a, b])
    loops = f.source[f.source.index("static int kern_gates") : f.source.index("int run_kern_gates")]
    simd = loops.split("#pragma omp simd")[1:]
    assert len(simd) == 3  # one loop per gate
    assert all(s.count("expf(") + s.count("tanhf(") == 1 for s in simd)  # each loop evaluates its own gate
    for rows, cols in ((4, 10), (1, 1), (0, 3)):
        gv, av, bv = torch.randn(rows, 3, cols), torch.randn(rows, cols), torch.randn(rows, cols)
        got_y, got_cat = f(gv, av, bv)
        torch.testing.assert_close(got_y, torch.stack([gv[:, 0].sigmoid(), gv[:, 1].tanh(), gv[:, 2].exp()], 1))
        torch.testing.assert_close(got_cat, torch.cat([av, bv]))


@pytest.mark.parametrize("gates", [4, 7])
def test_exclusive_gate_conditions_each_get_their_own_loop(gates):
    """The gradient of stacked gates is a sum of ``select(k == c, adjoint_c, 0)``: the true branch of each
    condition decides the others, so a chain of ``gates`` conditions needs ``gates`` loop versions, not
    ``2 ** gates`` (the last of four gates had kept its select and stayed scalar); the version where no
    condition holds is unreachable, as each ``k != c`` takes an end off ``k``'s range until none is left.
    Independent conditions are bounded by the same number of versions."""
    n, h = te.var("n"), te.var("h")
    g = te.placeholder((n, gates, h), name="g")
    fns = [te.sigmoid, te.tanh, te.exp, te.log1p, te.expm1, te.sin, te.cos]

    def body(i, k, j):
        terms = [te.select(k == c, fns[c](g[i, k, j]), 0.0) for c in range(gates)]
        return functools.reduce(lambda a, b: a + b, terms)

    y = te.compute((n, gates, h), body, name="y")
    both = te.compute((n, gates, h), lambda i, k, j: functools.reduce(lambda a, b: a + b, [
        te.select((i + c) % (c + 2) == 0, te.sigmoid(g[i, k, j] * (c + 1.0)), 0.0) for c in range(4)]),
        name="both")  # fmt: skip
    f, f_both = tailjit.build(y, [g]), tailjit.build(both, [g])  # apart: one domain would merge them
    calls = re.compile(r"\b(expf|tanhf|log1pf|expm1f|sinf|cosf)\(")
    loops = f.source[f.source.index("static int kern_y") : f.source.index("int run_kern_y")]
    simd = [part.split("}")[0] for part in loops.split("#pragma omp simd")[1:]]
    assert len(simd) == gates
    assert sorted(len(calls.findall(s)) for s in simd) == [1] * gates
    loops = f_both.source[f_both.source.index("static int kern_both") : f_both.source.index("int run_kern_both")]
    assert loops.count("#pragma omp simd") <= UNSWITCH_VERSIONS
    gv = torch.randn(3, gates, 5)
    want = torch.stack([getattr(torch, fn.__name__)(gv[:, c]) for c, fn in enumerate(fns[:gates])], 1)
    got_y, got_both = f(gv), f_both(gv)
    torch.testing.assert_close(got_y, want, equal_nan=True)  # log1p below -1
    rows = torch.arange(3)[:, None, None]
    torch.testing.assert_close(got_both, sum(torch.where((rows + c) % (c + 2) == 0, torch.sigmoid(gv * (c + 1.0)), 0.0)
                                             for c in range(4)))  # fmt: skip


def _simd_loops(f, name: str) -> list[str]:
    loops = f.source[f.source.index(f"static int kern_{name}") : f.source.index(f"int run_kern_{name}")]
    return [part.split("}")[0] for part in loops.split("#pragma omp simd")[1:]]


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(0, 3), n1=st.integers(0, 9), n2=st.integers(0, 9), n3=st.integers(0, 9))
def test_selects_on_the_innermost_loop_cut_it_into_pieces(rows, n1, n2, n3):
    """A ``cat`` along the innermost axis, ``select(j < n1, a, select(j < n1 + n2, b, c))``, runs as one loop
    per piece of the range, each evaluating its own branch; a padding's ``j - 1 >= 0`` and ``j + 1 < w``
    cut off the first and last positions.  Pieces of any size, empty ones included, compute what torch does.
    (A cut pays only where a piece saves enough work: ``schedule.CUT_MIN_SAVING``.)"""
    n, s1, s2, s3 = (te.var(v) for v in "n s1 s2 s3".split())
    a, b, c = (te.placeholder((n, s), name=nm) for s, nm in ((s1, "a"), (s2, "b"), (s3, "c")))

    def body(i, j):  # loads clamped as the frontend's cat lowering clamps them, so every one is in bounds
        def at(x, k, size):
            return x[i, te.minimum(te.maximum(k, 0), size - 1)]

        return te.select(
            j < s1,
            te.exp(at(a, j, s1)),
            te.select(j < s1 + s2, te.tanh(at(b, j - s1, s2)), te.sigmoid(at(c, j - s1 - s2, s3))),
        )

    cat = te.compute((n, s1 + s2 + s3), body, name="cat")
    w = s1
    pad = te.compute((n, w), lambda i, j: te.select(j - 1 >= 0, te.exp(a[i, te.maximum(j - 1, 0)]), 0.0)
                     + te.select(j + 1 < w, te.tanh(a[i, te.minimum(j + 1, w - 1)]), 0.0), name="pad")  # fmt: skip
    f, f_pad = tailjit.build(cat, [a, b, c]), tailjit.build(pad, [a])
    simd = _simd_loops(f, "cat")
    assert len(simd) == 3 and all(len(re.findall(r"\b(expf|tanhf)\(", s)) == 1 for s in simd)
    assert not any("?" in s for s in _simd_loops(f_pad, "pad"))  # each piece knows which terms it has
    av, bv, cv = torch.randn(rows, n1), torch.randn(rows, n2), torch.randn(rows, n3)
    torch.testing.assert_close(f(av, bv, cv), torch.cat([av.exp(), bv.tanh(), cv.sigmoid()], 1))
    want = torch.zeros(rows, n1)
    want[:, 1:] += av[:, :-1].exp()
    want[:, :-1] += av[:, 1:].tanh()
    torch.testing.assert_close(f_pad(av), want)


def test_a_cut_threaded_loop_keeps_each_thread_to_its_share():
    """The innermost loop of a 1-d output is the one its threads share: each cuts its own share of the range."""
    n1, n2 = te.var("n1"), te.var("n2")
    a, b = te.placeholder((n1,), name="a"), te.placeholder((n2,), name="b")
    cat = te.compute((n1 + n2,), lambda j: te.select(j < n1, te.exp(a[te.minimum(j, n1 - 1)]),
                                                     te.tanh(b[te.maximum(j - n1, 0)])), name="cat")  # fmt: skip
    f = tailjit.build(cat, [a, b], schedules={"cat": Schedule(order=["j"], parallel=True, parallel_work=1)})
    assert len(_simd_loops(f, "cat")) == 2
    cheap = te.compute((n1 + n2,), lambda j: te.select(j < n1, a[te.minimum(j, n1 - 1)],
                                                       -b[te.maximum(j - n1, 0)]), name="cheap")  # fmt: skip
    assert len(_simd_loops(tailjit.build(cheap, [a, b]), "cheap")) == 1  # a load saved: not worth a loop
    for sizes in ((100001, 99999), (3, 0), (0, 5), (1, 1)):
        av, bv = torch.randn(sizes[0]), torch.randn(sizes[1])
        torch.testing.assert_close(f(av, bv), torch.cat([av.exp(), bv.tanh()]))


def _selects_or_clamps(loop: str, op: str) -> bool:
    """Whether a loop's C clamps an index or selects (a max or min loop's update is a select of its own)."""
    return "tj_m" in loop or "tj_pick" in loop or ("?" in loop and op in ("sum", "prod", "lse"))


def _reductions_of_a_cat(n, s1, s2, lo) -> tuple[list, list]:
    """Sums, products, maxima and minima from ``lo`` over a ``cat`` of ``a`` (n, s1) and ``b`` (n, s2)
    along their rows, clamped as the frontend clamps: the outputs and the inputs."""
    a, b = te.placeholder((n, s1), name="a"), te.placeholder((n, s2), name="b")

    def cat(i, r):
        return te.select(r < s1, a[i, te.minimum(te.maximum(r, 0), s1 - 1)],
                         b[i, te.minimum(te.maximum(r - s1, 0), s2 - 1)])  # fmt: skip

    outs = []
    for op in ("sum", "prod", "max", "min"):
        r = te.reduce_axis((lo, s1 + s2), f"r_{op}")
        outs.append(te.compute((n,), lambda i, r=r, op=op: getattr(te, op)(cat(i, r), axis=r), name=op))
    return outs, [a, b]


def test_selects_on_a_reduce_index_cut_the_reduction():
    """A reduction over a ``cat`` of two rows, ``r < s1 ? a[i, r] : b[i, r - s1]``, reduces each piece on
    its own, the select decided and the clamps folded: contiguous loads of one input, not gathers of both."""
    f = tailjit.build(*_reductions_of_a_cat(3, 40, 70, 1))
    for op in ("sum", "prod", "max", "min"):
        loops = [loop for loop in _simd_loops(f, op) if "_0[" in loop or "_1[" in loop]
        assert loops and not any(_selects_or_clamps(loop, op) for loop in loops), op
        assert not any("a_0[" in loop and "b_1[" in loop for loop in loops), op


def test_a_reduction_over_contiguous_pieces_of_cheap_values_stays_whole():
    """Without clamps both sides of ``r < s1 ? a[i, r] : b[i, r - s1]`` are contiguous loads already: a cut
    would save one load per element (below ``CUT_MIN_SAVING``) and gathers none, so the sum stays one loop."""
    n, s1, s2 = te.var("n"), te.var("s1"), te.var("s2")
    a, b = te.placeholder((n, s1), name="a"), te.placeholder((n, s2), name="b")
    r = te.reduce_axis(s1 + s2, "r")
    total = te.compute((n,), lambda i: te.sum(te.select(r < s1, a[i, r], b[i, r - s1]), axis=r), name="total")
    f = tailjit.build(total, [a, b])
    assert any("a_0[" in loop and "b_1[" in loop for loop in _simd_loops(f, "total"))
    av, bv = torch.randn(3, 20), torch.randn(3, 30)
    torch.testing.assert_close(f(av, bv), torch.cat([av, bv], 1).sum(1))


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(0, 3), n1=st.integers(0, 40), n2=st.integers(0, 40), lo=st.integers(0, 2))
def test_reductions_cut_into_pieces_of_any_size_compute_what_torch_does(rows, n1, n2, lo):
    """Cut reductions over symbolic sizes: pieces of any size, empty ones included, give torch's values."""
    f = tailjit.build(*_reductions_of_a_cat(te.var("n"), te.var("s1"), te.var("s2"), lo))
    av, bv = torch.randn(rows, n1), torch.randn(rows, n2)
    x = torch.cat([av, bv], 1)[:, lo:]
    got = dict(zip(("sum", "prod", "max", "min"), f(av, bv)))
    torch.testing.assert_close(got["sum"], x.sum(1))
    torch.testing.assert_close(got["prod"], x.prod(1))
    if x.shape[1]:
        torch.testing.assert_close(got["max"], x.amax(1))
        torch.testing.assert_close(got["min"], x.amin(1))


def test_a_cross_entropy_over_a_cat_reduces_the_first_logit_apart():
    """InfoNCE's logits ``cat([pos, neg], 1)``: the row max and the sum of exponentials select on
    ``r == 0``, the first position, and reduce the negatives contiguously apart from it."""
    n, c = te.var("n"), te.var("c")
    pos, neg = te.placeholder((n, 1), name="pos"), te.placeholder((n, c), name="neg")

    def logit(i, r):
        return te.select(r == 0, pos[i, 0], neg[i, te.minimum(te.maximum(r - 1, 0), c - 1)]) / 0.07

    r1, r2 = te.reduce_axis(c + 1, "r1"), te.reduce_axis(c + 1, "r2")
    top = te.compute((n,), lambda i: te.max(logit(i, r1), axis=r1), name="top")
    lse = te.compute((n,), lambda i: top[i] + te.log(te.sum(te.exp(logit(i, r2) - top[i]), axis=r2)), name="lse")
    f = tailjit.build([top, lse], [pos, neg])
    assert not any(_selects_or_clamps(loop, k) for k in ("top", "lse") for loop in _simd_loops(f, k))
    for cols in (1, 2, 4097):
        pv, nv = torch.randn(3, 1), torch.randn(3, cols)
        logits = torch.cat([pv, nv], 1) / 0.07
        got_top, got_lse = f(pv, nv)
        torch.testing.assert_close(got_top, logits.amax(1))
        torch.testing.assert_close(got_lse, torch.logsumexp(logits, 1))


def test_outer_loop_invariants_are_computed_before_the_vectorised_loop():
    """``c * 9 // k`` for a channel ``c`` is computed once per row, outside the vectorised loop; its
    division by zero still raises when the loop runs, and not when it does not."""
    n, c, w, k = te.var("n"), te.var("c"), te.var("w"), te.var("k")
    x, s = te.placeholder((n, c, w), name="x"), te.placeholder((k,), name="s")
    y = te.compute((n, c, w), lambda b, ch, j: x[b, ch, j] * te.cast(ch * 9 // k, "float32"), name="y")
    f = tailjit.build(y, [x, s])
    loop = f.source[f.source.index("static int kern_y") : f.source.index("int run_kern_y")]
    assert all("tj_fdiv" not in part.split("}")[0] for part in loop.split("#pragma omp simd")[1:])
    xv = torch.randn(2, 6, 5)
    torch.testing.assert_close(f(xv, torch.zeros(4)), xv * (torch.arange(6) * 9 // 4).float()[None, :, None])
    with pytest.raises(ZeroDivisionError):
        f(xv, torch.zeros(0))
    assert f(torch.randn(2, 6, 0), torch.zeros(0)).shape == (2, 6, 0)


def test_a_0d_input_is_read_once_before_the_loops():
    """A 0-d input (a loss's output gradient) read in a select's branch: loaded inside the vectorised
    loop, gcc made it a masked load of one address and left the loop scalar (the backward of
    gaussian_focal_loss); it is read once, before the loops."""
    n = te.var("n")
    x, g = te.placeholder((n,), name="x"), te.placeholder((), name="g")
    y = te.compute((n,), lambda i: te.select(x[i] > 0.5, te.log(x[i]) * g[()], 0.0), name="y")
    f = tailjit.build(y, [x, g])
    loop = f.source[f.source.index("static int kern_y") : f.source.index("int run_kern_y")]
    head, body = loop.split("#pragma omp simd", 1)
    assert "_held = " in head and "_held" in body and "g_1[0]" not in body
    xv, gv = torch.rand(50), torch.tensor(3.0)
    torch.testing.assert_close(f(xv, gv), torch.where(xv > 0.5, xv.log() * 3.0, 0.0))


def test_reductions_and_row_buffers_compute_their_row_invariants_once():
    """The per-row ``1 / sqrt(var[i] + eps)`` of a layer norm's backward, inside a row reduction and a row
    buffer's filling loop, is computed once per row before those loops; an invariant division by zero
    raises when the loop runs, and not over an empty row."""
    from tailjit.bench.autodiff import _layer_norm

    ins, y = _layer_norm()
    x, g, b = ins
    dx = tailjit.build(te.gradient([y], [x]), ins)
    loops = dx.source[dx.source.index("static int kern_grad_x") : dx.source.index("int run_kern_grad_x")]
    sqrt_lines = [ln.strip() for ln in loops.splitlines() if "sqrtf(" in ln]
    assert sqrt_lines and all(ln.startswith("const float inv") for ln in sqrt_lines)
    xv, gv, bv = torch.randn(5, 37, dtype=torch.float32), torch.randn(37), torch.randn(37)
    leaf = xv.clone().requires_grad_()
    want = torch.autograd.grad(_layer_norm_ref(leaf, gv, bv).sum(), leaf)[0]
    torch.testing.assert_close(dx(xv, gv, bv), want, rtol=1e-4, atol=1e-4)

    n, m = te.var("n"), te.var("m")
    a, d = te.placeholder((n, m), "int64", name="a"), te.placeholder((n,), "int64", name="d")
    k = te.reduce_axis(m, "k")
    s = te.compute((n,), lambda i: te.sum(a[i, k] + 7 // d[i], axis=k), name="s")
    f = tailjit.build(s, [a, d])
    assert f(torch.ones(3, 4, dtype=torch.int64), torch.full((3,), 2)).tolist() == [16, 16, 16]
    with pytest.raises(ZeroDivisionError):
        f(torch.ones(3, 4, dtype=torch.int64), torch.zeros(3, dtype=torch.int64))
    assert f(torch.ones(3, 0, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)).tolist() == [0, 0, 0]


def _layer_norm_ref(x, g, b):
    xc = x - x.mean(1, keepdim=True)
    return xc * torch.rsqrt((xc * xc).mean(1, keepdim=True) + 1e-5) * g + b


def test_guards_the_loop_ranges_decide_fold_away():
    """A slice's guard and clamp over the whole loop range (``i >= 0 & i < n``, ``min(max(i, 0), n - 1)``)
    are decided by the loop's range: no branch or clamp is left in the C; float ``+ 0.0`` stays (-0.0)."""
    n = te.var("n")
    x = te.placeholder((n, 2), name="x")
    clamp = lambda i: te.minimum(te.maximum(i, 0), n - 1)  # noqa: E731
    y = te.compute(
        (n, 2),
        lambda i, j: te.select((i >= 0) & (i < n), x[clamp(i), j], 0.0) + 0.0,
        name="y",
    )
    f = tailjit.build(y, [x])
    loop = f.source[f.source.index("static int kern_y") : f.source.index("int run_kern_y")]
    assert "tj_min_i64" not in loop and "tj_max_i64" not in loop and " ? " not in loop
    xv = torch.tensor([[-0.0, 1.0], [2.0, -0.0]])
    got = f(xv)
    assert torch.equal(got, xv + 0.0) and not torch.signbit(got).any()  # -0.0 + 0.0 is +0.0, as in eager


def _upsample(k: int, cut: int):
    """A nearest upsampling by ``k`` along the last axis, less the last ``cut`` positions, mixed with a
    full-resolution input and the position's phase: the body divides its innermost index by ``k``."""
    n, m = te.var("n"), te.var("m")
    x, z = te.placeholder((n, m), name="x"), te.placeholder((n, m * k - cut), name="z")
    y = te.compute(
        (n, m * k - cut),
        lambda i, j: te.select(j % k == 0, x[i, j // k] * 2.0, x[i, j // k] - z[i, j] * te.cast(j % k, "float32")),
        name="y",
    )
    return [x, z], y


def _upsample_ref(x, z, k):
    up = x.repeat_interleave(k, 1)[:, : z.shape[1]]
    phase = (torch.arange(z.shape[1]) % k).float()
    return torch.where(phase == 0, up * 2.0, up - z * phase)


@settings(max_examples=25, deadline=None)
@given(k=st.integers(2, 5), cut=st.integers(0, 1), n=st.integers(0, 3), m=st.integers(1, 9), data=st.data())
def test_an_index_divided_by_a_constant_runs_by_residues(k, cut, n, m, data):
    f = _built_upsample(k, cut)
    (kern,) = f.kernels
    assert f"residues mod {k}" in kern.describe()
    x, z = torch.randn(n, m), torch.randn(n, m * k - cut)
    if data.draw(st.booleans()):
        x[:, 0] = float("nan")
    torch.testing.assert_close(f(x, z), _upsample_ref(x, z, k), equal_nan=True)
    zt = torch.randn(m * k - cut, n).t()  # a strided input takes the general version
    torch.testing.assert_close(f(x, zt), _upsample_ref(x, zt, k), equal_nan=True)


@functools.cache  # hypothesis draws the same program many times
def _built_upsample(k, cut):
    ins, y = _upsample(k, cut)
    return tailjit.build(y, ins)


def test_residues_make_the_strided_loads_contiguous():
    f = _built_upsample(2, 0)
    loop = f.source[f.source.index("static int kern_") :]
    vectorised = loop.split("#pragma omp simd", 1)[1].split("}", 1)[0]
    assert "tj_fdiv" not in vectorised and "tj_fmod" not in vectorised  # j // 2 is the loop counter


@settings(max_examples=25, deadline=None)
@given(k=st.sampled_from([9, 16, 33]), cut=st.integers(0, 1), n=st.integers(0, 3), m=st.integers(1, 5), data=st.data())
def test_an_index_divided_by_a_longer_constant_runs_folded(k, cut, n, m, data):
    """Past EXPAND_MAX (a flattened view's ``(J, 16)`` pairs) the loop runs over ``q = j // k`` around a vector
    loop over ``j % k``: the values, NaN and a last partial ``q`` included, are those of the plain loop."""
    f = _built_upsample(k, cut)
    (kern,) = f.kernels
    assert f"folded by {k}" in kern.describe()
    loop = f.source[f.source.index("static int kern_") :]
    vectorised = loop.split("#pragma omp simd", 1)[1].split("}", 1)[0]
    assert "tj_fdiv" not in vectorised and "tj_fmod" not in vectorised  # j // k is the outer loop's counter
    x, z = torch.randn(n, m), torch.randn(n, m * k - cut)
    if data.draw(st.booleans()):
        x[:, 0] = float("nan")
    torch.testing.assert_close(f(x, z), _upsample_ref(x, z, k), equal_nan=True)
    zt = torch.randn(m * k - cut, n).t()
    torch.testing.assert_close(f(x, zt), _upsample_ref(x, zt, k), equal_nan=True)


def test_the_gradient_of_a_strided_max_pool_runs_by_residues():
    """Each input position of a 3x3, stride-2 max pool reads the windows ``(i // 2) - r``: its gradient kernel
    runs over pairs of positions, with ties split evenly as torch's amax does, NaN and odd sizes included."""
    from tailjit.bench.autodiff import _max_pool, _max_pool_torch

    ins, y = _max_pool()
    grad = tailjit.build(y, ins).gradient_kernel((True,))
    assert any("residues mod 2" in k.describe() for k in grad.kernels)
    for shape in [(2, 3, 7, 9), (1, 1, 3, 3), (2, 2, 8, 5), (1, 2, 3, 4), (1, 1, 5, 3)]:
        for x in (torch.randn(shape), torch.randint(0, 3, shape).float()):
            x[0, 0, 0, 0] = float("nan") if shape[0] == 2 else x[0, 0, 0, 0]
            leaf = x.clone().requires_grad_()
            out = _max_pool_torch(leaf)
            head = torch.randn(out.shape)
            (want,) = torch.autograd.grad(out, leaf, head)
            torch.testing.assert_close(grad(x, out.detach(), head), want, equal_nan=True)


@pytest.mark.parametrize(
    "schedule",
    [
        Schedule(order=["i", "j"], modulus=1),
        Schedule(order=["i", "j"], modulus=2, vectorize=False),
        Schedule(order=["i", "j.o", "j.i"], splits={"j": 4}, modulus=2),
    ],
)
def test_residues_need_an_unsplit_innermost_loop(schedule):
    ins, y = _program()
    with pytest.raises(te.TEError, match="modulus"):
        tailjit.build(y, ins, schedules={"y": schedule})


@pytest.mark.parametrize(
    "schedule",
    [
        Schedule(order=["i", "j"], fold=1),
        Schedule(order=["i", "j"], fold=16, vectorize=False),
        Schedule(order=["i", "j.o", "j.i"], splits={"j": 4}, fold=16),
        Schedule(order=["i", "j"], fold=16, modulus=2),
    ],
)
def test_a_fold_needs_an_unsplit_vectorised_innermost_loop(schedule):
    ins, y = _program()
    with pytest.raises(te.TEError, match="fold"):
        tailjit.build(y, ins, schedules={"y": schedule})


@functools.cache
def _strided_depthwise_gradient(stride, pad):
    n, c, hv, wv = (te.var(s) for s in "nchw")
    x, wt = te.placeholder((n, c, hv, wv), name="x"), te.placeholder((c, 3, 3), name="wt")
    rh, rw = te.reduce_axis(3, "rh"), te.reduce_axis(3, "rw")

    def body(b, ch, i, j):
        hh, ww = i * stride + rh - pad, j * stride + rw - pad
        inside = (hh >= 0) & (hh < hv) & (ww >= 0) & (ww < wv)
        return te.sum(te.select(inside, x[b, ch, hh, ww], 0.0) * wt[ch, rh, rw], axis=[rh, rw])

    shape = (n, c, (hv + 2 * pad - 3) // stride + 1, (wv + 2 * pad - 3) // stride + 1)
    return tailjit.build(te.compute(shape, body, name="dw"), [x, wt]).gradient_kernel((True, True))


@settings(max_examples=12, deadline=None)
@given(stride=st.integers(2, 3), pad=st.integers(0, 2), h=st.integers(3, 12), w=st.integers(3, 12))
def test_a_padded_strided_depthwise_gradient_runs_by_residues(stride, pad, h, w):
    """The input gradient of a padded, strided 3x3 depthwise convolution reads ``(j + pad) // stride``."""
    grad = _strided_depthwise_gradient(stride, pad)
    assert any(f"residues mod {stride}" in k.describe() for k in grad.kernels)
    xv, wv_ = torch.randn(2, 3, h, w), torch.randn(3, 3, 3)
    leaves = xv.clone().requires_grad_(), wv_.clone().requires_grad_()
    out = torch.nn.functional.conv2d(leaves[0], leaves[1][:, None], stride=stride, padding=pad, groups=3)
    head = torch.randn(out.shape)
    for got, want in zip(grad(xv, wv_, out.detach(), head), torch.autograd.grad(out, leaves, head)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_each_gate_of_a_long_chain_gets_its_own_versions():
    """A gate's true branch does not take from the budget of the gates after it: with a condition of its
    own under each of 12 gates (two versions each), the old shared budget of eight versions left the last
    nine gates in one version, which evaluated every gate's ``exp`` per element (``reverse_padded_sequence``'s
    rows assigned in a Python loop).  Each version now decides its gate, within ``UNSWITCH_TOTAL``."""
    gates = 12
    n, h, m = te.var("n"), te.var("h"), te.var("m")
    g = te.placeholder((n, gates, h), name="g")

    def body(i, k, j):
        terms = [te.select(k == c, te.select(i < m, te.exp(g[i, k, j] * (c + 1.0)), g[i, k, j] * c), 0.0)
                 for c in range(gates)]  # fmt: skip
        return functools.reduce(lambda a, b: a + b, terms)

    y = te.compute((n, gates, h), body, name="y")
    size = te.placeholder((m, 0), dtype="bool", name="size_m")
    f = tailjit.build(y, [g, size])
    simd = _simd_loops(f, "y")
    assert len(simd) <= UNSWITCH_TOTAL
    assert max(len(re.findall(r"\bexpf\(", s)) for s in simd) == 1
    gv = torch.randn(5, gates, 3)
    scale = torch.arange(1.0, gates + 1)[None, :, None]
    for rows in (0, 2, 5):
        want = torch.where(torch.arange(5)[:, None, None] < rows, torch.exp(gv * scale), gv * (scale - 1))
        torch.testing.assert_close(f(gv, torch.empty(rows, 0, dtype=torch.bool)), want)


def _row_sum(f=lambda v: v, torch_f=lambda v: v):
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    k = te.reduce_axis(m, "k")
    return [x], te.compute((n,), lambda i: te.sum(f(x[i, k]), axis=k), name="y"), lambda x: torch_f(x).sum(1)


def _column_sum(columns=None):
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, columns or m), name="x")
    k = te.reduce_axis(n, "k")
    return [x], te.compute((columns or m,), lambda j: te.sum(x[k, j], axis=k), name="y"), lambda x: x.sum(0)


def _pair_sum():
    n, r = te.var("n"), te.var("r")
    x = te.placeholder((r, n, 20), name="x")
    k = te.reduce_axis(r, "k")
    return [x], te.compute((n, 20), lambda i, j: te.sum(x[k, i, j], axis=k), name="y"), lambda x: x.sum(0)


def _row_quotient():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    k = te.reduce_axis(m, "k")
    s = te.compute((n,), lambda i: te.sum(x[i, k], axis=k), name="s")
    return [x], te.compute((n, m), lambda i, j: x[i, j] / s[i], name="y"), lambda x: x / x.sum(1, keepdim=True)


def _gates():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")

    def body(i, j):
        return te.select(i == 0, x[i, j] * 2.0, te.select(i == 1, x[i, j] * 3.0, x[i, j]))

    def ref(x):
        return x * torch.tensor(([2.0, 3.0] + [1.0] * len(x))[: len(x)])[:, None]

    return [x], te.compute((n, m), body, name="y"), ref


def _cat():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")

    def body(i, j):  # loads clamped as the frontend's cat lowering clamps them
        return te.select(j < m, x[i, te.minimum(j, m - 1)], -x[i, te.maximum(j - m, 0)])

    return [x], te.compute((n, m * 2), body, name="y"), lambda x: torch.cat([x, -x], 1)


def _cat_sum():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    k = te.reduce_axis(m * 2, "k")

    def row(i):  # the sum over cat([x, 2 * x], 1)
        return te.sum(te.select(k < m, x[i, te.minimum(k, m - 1)], x[i, te.maximum(k - m, 0)] * 2.0), axis=k)

    return [x], te.compute((n,), row, name="y"), lambda x: x.sum(1) * 3


@pytest.mark.parametrize(
    "field, value, program",
    [
        ("split", 2, _row_sum),
        ("split", 1, _row_sum),
        ("split_min", 64, _row_sum),
        ("tail", 8, _row_sum),
        ("sum_block", 256, _row_sum),
        ("calls_plain", False, lambda: _row_sum(te.exp, torch.exp)),
        ("column_block", 16, _column_sum),
        ("column_min", 0, lambda: _column_sum(2)),
        ("pair_max", 32, _pair_sum),
        ("qdiv_min", 1, _row_quotient),
        ("unswitch_versions", 1, _gates),
        ("unswitch_total", 1, _gates),
        ("cut_min_saving", 0, _cat),
        ("cut_min_saving", 1 << 30, _cat_sum),
        ("gather_cost", 0, _cat_sum),
    ],
)
def test_each_loop_shaping_field_changes_the_code_not_the_values(field, value, program):
    """Each field that shapes the loops inside is read by the emitter (its C differs from the default's) and
    the values stay right, on shapes that reach the blocks, splits and tails it sizes."""
    ins, y, ref = program()
    default = tailjit.build(y, ins)
    schedule = dataclasses.replace(default.kernels[0].schedule, **{field: value})
    f = tailjit.build(y, ins, schedules={"y": schedule})
    assert f.source != default.source
    assert f"{field}={value}" in f.describe()
    g = torch.Generator().manual_seed(0)
    shapes = [(4, 3, 20), (1, 5, 20)] if program is _pair_sum else [(1, 1), (3, 7), (5, 2), (2, 2000)]
    for shape in shapes:
        if isinstance(ins[0].shape[-1], Const):  # a static number of columns
            shape = (*shape[:-1], ins[0].shape[-1].value)
        x = torch.randn(*shape, generator=g)
        torch.testing.assert_close(f(x), ref(x), rtol=1e-5, atol=1e-4)
