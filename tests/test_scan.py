"""te.scan: sequential recurrences against PyTorch and Python loops."""

import functools
import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tailjit
from tailjit import te
from tailjit.schedule import Schedule

INDEX_GUARD = "err |= 1"  # the code of a per-element index guard


@functools.cache
def cumulative(ndim: int, axis: int, dtype: str = "float32"):
    """cumsum, cumprod and cummax of one input along ``axis``, in one build."""
    sizes = [te.var(f"n{d}") for d in range(ndim)]
    x = te.placeholder(sizes, dtype, name="x")
    cs = te.scan(sizes, axis, lambda prev, *i: prev + x[i], dtype=dtype, name="cumsum")
    cp = te.scan(sizes, axis, lambda prev, *i: prev * x[i], initial=1, dtype=dtype, name="cumprod")
    lowest = float("-inf") if dtype.startswith("float") else -(2**31)
    cm = te.scan(sizes, axis, lambda prev, *i: te.maximum(prev, x[i]), initial=lowest, dtype=dtype, name="cummax")
    return tailjit.build([cs, cp, cm], [x])


CASES = [(2, 0), (2, 1), (3, 0), (3, 1), (3, 2)]


@pytest.mark.parametrize("ndim, axis", CASES)
def test_cumsum_cumprod_cummax_match_torch(ndim, axis):
    f = cumulative(ndim, axis)
    shapes = [(5, 7), (1, 1), (33, 3)] if ndim == 2 else [(4, 5, 6), (2, 1, 9), (1, 8, 3)]
    for shape in shapes:
        x = torch.randn(shape) * 0.9 + 0.3
        x.view(-1)[::5] = float("nan")  # NaN propagates through all three
        x.view(-1)[3::7] = float("inf")
        cs, cp, cm = f(x)
        torch.testing.assert_close(cs, torch.cumsum(x, axis), equal_nan=True, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(cp, torch.cumprod(x, axis), equal_nan=True, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(cm, torch.cummax(x, axis).values, equal_nan=True)


@pytest.mark.parametrize("ndim, axis", [(2, 0), (3, 2)])
def test_non_contiguous_and_empty(ndim, axis):
    f = cumulative(ndim, axis)
    shape = (6, 8) if ndim == 2 else (3, 4, 6)
    x = torch.randn(shape).transpose(0, -1).contiguous().transpose(0, -1)
    assert not x.is_contiguous()
    xs = x[..., ::2]
    for inp in (x, xs):
        cs, cp, cm = f(inp)
        torch.testing.assert_close(cs, torch.cumsum(inp, axis), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(cm, torch.cummax(inp, axis).values)
    for empty in [(0, 4), (4, 0)] if ndim == 2 else [(2, 0, 3), (2, 3, 0), (0, 1, 1)]:
        cs, cp, cm = f(torch.randn(empty))
        assert cs.shape == cp.shape == cm.shape == empty


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_scans(dtype):
    f = cumulative(2, 1, dtype)
    x = torch.randint(-3, 4, (4, 9), dtype=getattr(torch, dtype))
    cs, cp, cm = f(x)
    assert cs.dtype == getattr(torch, dtype)
    torch.testing.assert_close(cs, torch.cumsum(x, 1, dtype=x.dtype))
    torch.testing.assert_close(cp, torch.cumprod(x, 1, dtype=x.dtype))
    torch.testing.assert_close(cm, torch.cummax(x, 1).values)


def test_bool_scan_is_a_running_or():
    n = te.var("n")
    x = te.placeholder((n,), "bool", name="x")
    seen = te.scan((n,), 0, lambda prev, i: prev | x[i], initial=False, name="seen")
    assert seen.dtype == te.bool_
    f = tailjit.build(seen, [x])
    xv = torch.tensor([False, False, True, False, True])
    torch.testing.assert_close(f(xv), torch.cummax(xv.int(), 0).values.bool())


def test_state_dtype_follows_initial_or_dtype():
    n = te.var("n")
    x = te.placeholder((n,), "int32", name="x")
    assert te.scan((n,), 0, lambda prev, i: prev + x[i]).dtype == te.int64  # initial=0: int64
    assert te.scan((n,), 0, lambda prev, i: prev + x[i], initial=0.0).dtype == te.float32
    assert te.scan((n,), 0, lambda prev, i: prev + x[i], dtype="float64").dtype == te.float64
    y = te.placeholder((n,), "float64", name="y")
    assert te.scan((n,), 0, lambda prev, i: prev + x[i], initial=lambda i: y[n - 1]).dtype == te.float64
    # the update's result is converted to the state's dtype: here truncated to an integer each step
    halves = te.scan((n,), 0, lambda prev, i: prev + 1.5, dtype="int32", name="halves")
    f = tailjit.build(halves, [x])
    torch.testing.assert_close(f(torch.zeros(4, dtype=torch.int32)), torch.tensor([1, 2, 3, 4], dtype=torch.int32))


def test_float32_cumsum_accuracy():
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    f = tailjit.build(te.scan((n,), 0, lambda prev, i: prev + x[i], dtype="float32", name="cs"), [x])
    xv = torch.rand(100_000)
    want = torch.cumsum(xv.double(), 0)
    # sequential float32 rounding: relative error grows like sqrt(n) * eps, well under 1e-4 here
    rel = ((f(xv).double() - want).abs() / want).max().item()
    assert rel < 1e-4


# Reverse recurrences (RL) --------------------------------------------------------------------


def returns_ref(r, done, gamma, bootstrap):
    out, run = torch.empty_like(r), bootstrap.clone()
    for t in reversed(range(r.shape[0])):
        run = r[t] + gamma * (1 - done[t]) * run
        out[t] = run
    return out


def gae_ref(r, v, v_last, done, gamma, lam):
    out, adv = torch.empty_like(r), torch.zeros_like(v_last)
    for t in reversed(range(r.shape[0])):
        nxt = v[t + 1] if t + 1 < r.shape[0] else v_last
        delta = r[t] + gamma * nxt * (1 - done[t]) - v[t]
        adv = delta + gamma * lam * (1 - done[t]) * adv
        out[t] = adv
    return out


@functools.cache
def rl_programs():
    t_, b_ = te.var("T"), te.var("B")
    r, done, v = (te.placeholder((t_, b_), name=nm) for nm in ("r", "done", "v"))
    v_last = te.placeholder((b_,), name="v_last")
    gamma, lam = 0.99, 0.95
    ret = te.scan((t_, b_), 0, lambda prev, t, b: r[t, b] + gamma * (1 - done[t, b]) * prev,
                  initial=lambda t, b: v_last[b], reverse=True, name="returns")  # fmt: skip
    nxt = te.compute((t_, b_), lambda t, b: te.select(t + 1 < t_, v[t + 1, b], v_last[b]), name="next_value")
    delta = te.compute((t_, b_), lambda t, b: r[t, b] + gamma * nxt[t, b] * (1 - done[t, b]) - v[t, b], name="delta")
    adv = te.scan((t_, b_), 0, lambda prev, t, b: delta[t, b] + gamma * lam * (1 - done[t, b]) * prev,
                  initial=0.0, reverse=True, name="gae")  # fmt: skip
    return tailjit.build([ret, adv], [r, done, v, v_last])


def test_discounted_returns_and_gae_match_python_loops():
    f = rl_programs()
    assert len(f.kernels) == 2  # next_value and delta are inlined into the GAE scan
    assert "sequential" in f.describe() and "in reverse" in f.describe()
    for t, b in ((7, 3), (1, 1), (40, 17), (0, 4), (5, 0)):
        r, v, v_last = torch.randn(t, b), torch.randn(t, b), torch.randn(b)
        done = (torch.rand(t, b) < 0.2).float()
        ret, adv = f(r, done, v, v_last)
        torch.testing.assert_close(ret, returns_ref(r, done, 0.99, v_last))
        torch.testing.assert_close(adv, gae_ref(r, v, v_last, done, 0.99, 0.95))


def test_reverse_scan_along_the_last_axis_with_a_tensor_initial():
    n, m = te.var("n"), te.var("m")
    x, init = te.placeholder((n, m), name="x"), te.placeholder((n,), name="init")
    suffix = te.scan((n, m), 1, lambda prev, i, j: prev * 0.5 + x[i, j], initial=lambda i, j: init[i], reverse=True)
    f = tailjit.build(suffix, [x, init])
    xv, iv = torch.randn(4, 6), torch.randn(4)
    want, run = torch.empty(4, 6), iv.clone()
    for j in reversed(range(6)):
        run = run * 0.5 + xv[:, j]
        want[:, j] = run
    torch.testing.assert_close(f(xv, iv), want)


# Fusion, bounds and schedules --------------------------------------------------------------------


def test_cumsum_of_exp_is_one_kernel_and_needs_no_index_guard():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    e = te.compute((n, m), lambda i, j: te.exp(x[i, j]), name="e")
    cs = te.scan((n, m), 1, lambda prev, i, j: prev + e[i, j], dtype="float32", name="cs")
    f = tailjit.build(cs, [x])
    assert len(f.kernels) == 1 and f.kernels[0].fused == ("e",)
    # the previous element's load is proven in range by the first-position test
    assert INDEX_GUARD not in f.source and "can fall outside" not in f.source
    xv = torch.randn(5, 9)
    torch.testing.assert_close(f(xv), torch.cumsum(xv.exp(), 1))


def test_a_consumer_reads_the_materialised_scan():
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    cs = te.scan((n,), 0, lambda prev, i: prev + x[i], dtype="float32", name="cs")
    # reads the scan at two places; inlining would be wrong, not just slow
    y = te.compute((n,), lambda i: cs[i] - cs[n - 1 - i], name="y")
    f = tailjit.build(y, [x])
    assert [k.name for k in f.kernels] == ["cs", "y"] and f.kernels[0].role.startswith("temporary, scan")
    xv = torch.randn(10)
    c = torch.cumsum(xv, 0)
    torch.testing.assert_close(f(xv), c - c.flip(0))


def test_default_schedules_keep_the_scan_axis_sequential():
    f = cumulative(2, 0)
    s = f.kernels[0].schedule
    assert s.sequential == ["i0"] and not s.parallel and s.vectorize  # t outer in order, b inner simd
    g = cumulative(2, 1)
    s = g.kernels[0].schedule
    assert s.sequential == ["i1"] and s.parallel and not s.vectorize  # rows in parallel
    assert "sequential i1" in g.describe()


def _prefix_sums():
    t_, b_ = te.var("t"), te.var("b")
    x = te.placeholder((t_, b_), name="x")
    return [x], te.scan((t_, b_), 0, lambda prev, t, b: prev + x[t, b], dtype="float32", name="cs")


@pytest.mark.parametrize(
    "schedule",
    [
        Schedule(order=["b.o", "t", "b.i"], splits={"b": 4}, parallel_work=1, sequential=["t"]),
        Schedule(order=["b", "t"], parallel_work=1, vectorize=False, sequential=["t"]),
        Schedule(order=["t.o", "b", "t.i"], splits={"t": 3}, parallel=False, vectorize=False, sequential=["t"]),
    ],
    ids=["parallel-column-blocks", "columns-outer", "split-scan-axis"],
)
def test_legal_scan_schedules_agree(schedule):
    ins, cs = _prefix_sums()
    f = tailjit.build(cs, ins, schedules={"cs": schedule})
    torch.set_num_threads(2)
    for shape in ((1, 1), (10, 13), (64, 33), (0, 5)):
        x = torch.randn(shape)
        torch.testing.assert_close(f(x), torch.cumsum(x, 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "schedule, message",
    [
        (Schedule(order=["t", "b"], sequential=["t"]), "across threads"),
        (Schedule(order=["b", "t"], sequential=["t"]), "vectorise loop 't'"),
        (Schedule(order=["t.o", "b", "t.i"], splits={"t": 4}, sequential=["t"]), "across threads"),
        (Schedule(order=["b", "t"], vectorize=False), "must be listed in Schedule.sequential"),
        (Schedule(order=["b", "t"], vectorize=False, sequential=["z"]), "unknown axis 'z'"),
    ],
)
def test_schedules_that_break_the_recurrence_are_rejected(schedule, message):
    ins, cs = _prefix_sums()
    with pytest.raises(te.TEError, match=message):
        tailjit.build(cs, ins, schedules={"cs": schedule})


def test_large_parallel_scan():
    f = cumulative(2, 1)
    torch.set_num_threads(2)
    x = torch.randn(2000, 300)
    cs, _, cm = f(x)
    torch.testing.assert_close(cs, torch.cumsum(x, 1), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(cm, torch.cummax(x, 1).values)


def test_malformed_scans():
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    with pytest.raises(te.TEError, match="axis 1 is out of range"):
        te.scan((n,), 1, lambda prev, i: prev + x[i])
    with pytest.raises(te.TEError, match="prev and 1 index"):
        te.scan((n,), 0, lambda i: x[i])
    with pytest.raises(te.TEError, match="axis must be an int"):
        te.scan((n,), "0", lambda prev, i: prev)
    other = te.compute((n,), lambda j: x[j], name="other")
    with pytest.raises(te.TEError, match="belongs to another compute"):
        te.scan((n,), 0, lambda prev, i: prev, initial=lambda i: other.axes[0])


def test_one_compile_serves_several_sizes():
    f = cumulative(3, 1)
    for shape in ((2, 3, 4), (5, 1, 7), (3, 50, 2)):
        x = torch.randn(shape)
        torch.testing.assert_close(f(x)[0], torch.cumsum(x, 1), rtol=1e-5, atol=1e-5)


# Property test -----------------------------------------------------------------------------


@functools.cache
def linear_recurrence(axis: int, reverse: bool):
    """``out = a * prev + b`` along ``axis`` of a 2-d tensor, starting from ``init`` per row/column."""
    n, m = te.var("n"), te.var("m")
    a, b = te.placeholder((n, m), "float64", name="a"), te.placeholder((n, m), "float64", name="b")
    init = te.placeholder((m if axis == 0 else n,), "float64", name="init")
    out = te.scan((n, m), axis, lambda prev, i, j: a[i, j] * prev + b[i, j],
                  initial=lambda i, j: init[j if axis == 0 else i], reverse=reverse)  # fmt: skip
    return tailjit.build(out, [a, b, init])


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    axis=st.sampled_from([0, 1]),
    reverse=st.booleans(),
    n=st.integers(0, 9),
    m=st.integers(0, 9),
    transposed=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_random_scans_match_a_python_loop(axis, reverse, n, m, transposed, seed):
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=(n, m)), rng.normal(size=(n, m))
    init = rng.normal(size=(m if axis == 0 else n,))
    want = np.empty((n, m))
    for p in np.ndindex(m if axis == 0 else n):
        run = init[p]
        steps = range(n if axis == 0 else m)
        for s in reversed(steps) if reverse else steps:
            at = (s, p[0]) if axis == 0 else (p[0], s)
            run = a[at] * run + b[at]
            want[at] = run
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    if transposed:
        ta, tb = ta.T.contiguous().T, tb.T.contiguous().T
    got = linear_recurrence(axis, reverse)(ta, tb, torch.from_numpy(init))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


def test_row_buffer_and_reduction_initial_in_a_scan():
    """An expensive producer read at two places becomes a row buffer; the initial value is a row maximum."""
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    e = te.compute((n, m), lambda i, j: te.exp(x[i, j]) * 0.5, name="e")
    k = te.reduce_axis(m, "k")
    row_max = te.compute((n,), lambda i: te.max(x[i, k], axis=k), name="row_max")
    s = te.scan((n, m), 1, lambda prev, i, j: prev * 0.1 + e[i, j] - e[i, m - 1 - j], initial=lambda i, j: row_max[i])
    f = tailjit.build(s, [x])
    assert len(f.kernels) == 1 and set(f.kernels[0].fused) == {"row_max", "e (row buffer)"}
    xv = torch.randn(5, 7)
    ev, want, run = xv.exp() * 0.5, torch.empty(5, 7), xv.max(1).values
    for j in range(7):
        run = run * 0.1 + ev[:, j] - ev[:, 6 - j]
        want[:, j] = run
    torch.testing.assert_close(f(xv), want)


@functools.cache
def constant_start(axis: int, reverse: bool, initial: float):
    n, m = te.var("n"), te.var("m")
    a, b = te.placeholder((n, m), "float64", name="a"), te.placeholder((n, m), "float64", name="b")
    out = te.scan((n, m), axis, lambda prev, i, j: a[i, j] * prev + b[i, j], initial=initial, reverse=reverse,
                  dtype="float64")  # fmt: skip
    return tailjit.build(out, [a, b])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    axis=st.sampled_from([0, 1]),
    reverse=st.booleans(),
    initial=st.sampled_from([0.0, 1.0, -2.5, float("-inf"), float("nan")]),
    n=st.integers(0, 9),
    m=st.integers(0, 9),
    seed=st.integers(0, 2**31 - 1),
)
def test_a_constant_initial_starts_the_carried_value(axis, reverse, initial, n, m, seed):
    """A scan with a constant ``initial`` carries its previous element from that constant, without a
    select of the two on the loop-carried path; the values (inf and NaN starts included) still follow
    a Python loop."""
    f = constant_start(axis, reverse, initial)
    if axis == 1:  # the scan axis is the innermost loop: a carried register
        (update,) = [line for line in f.source.splitlines() if re.match(r"\s*carry_\d+ = ", line)]
        assert "tj_pick" not in update and "?" not in update
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=(n, m)), rng.normal(size=(n, m))
    want = np.empty((n, m))
    for p in range(m if axis == 0 else n):
        run = initial
        steps = range(n if axis == 0 else m)
        for s in reversed(steps) if reverse else steps:
            at = (s, p) if axis == 0 else (p, s)
            run = a[at] * run + b[at]
            want[at] = run
    got = f(torch.from_numpy(a), torch.from_numpy(b))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)
