"""Reductions against PyTorch, including NaN, ties, empty ranges and accuracy."""

import functools
import math
import re

import pytest
import torch

import tailjit
from tailjit import te


def _rowwise(op, dtype="float32"):
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), dtype=dtype, name="x")
    k = te.reduce_axis(m, "k")
    y = te.compute((n,), lambda i: getattr(te, op)(x[i, k], axis=k), name=f"row_{op}")
    return tailjit.build(y, [x], name=f"row_{op}_{dtype}")


REF = {
    "sum": lambda x: x.sum(1), "prod": lambda x: x.prod(1), "max": lambda x: x.amax(1),
    "min": lambda x: x.amin(1), "argmax": lambda x: x.argmax(1), "argmin": lambda x: x.argmin(1),
}  # fmt: skip


@pytest.mark.parametrize("op", list(REF))
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_row_reductions(op, dtype):
    f = _rowwise(op, dtype)
    tdt = getattr(torch, dtype)
    if tdt.is_floating_point:
        x = torch.randn(17, 33, dtype=tdt)
        x[3, 5] = math.nan
        x[4, :] = 2.0  # ties
        x[5, 7] = math.inf
        x[6, 1] = -math.inf
        x[7, 2:4] = math.nan
        if op == "prod":
            x = x.clamp(-1.5, 1.5)
    else:
        x = torch.randint(-3, 4, (17, 33), dtype=tdt)
    got, want = f(x), REF[op](x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-5, atol=1e-5)
    # non-contiguous input
    xt = x.t().contiguous().t()
    torch.testing.assert_close(f(xt), want, equal_nan=True, rtol=1e-5, atol=1e-5)


def test_bool_sum_counts():
    n = te.var("n")
    x = te.placeholder((n,), "bool", "x")
    k = te.reduce_axis(n, "k")
    f = tailjit.build(te.compute((), lambda: te.sum(x[k], axis=k), name="count"), [x])
    xv = torch.rand(100) > 0.3
    assert f(xv).dtype == torch.int64
    assert f(xv).item() == xv.sum().item()


def test_multi_axis_reductions_and_argmax_flat_position():
    n, m, p = te.var("n"), te.var("m"), te.var("p")
    x = te.placeholder((n, m, p), name="x")
    k1, k2 = te.reduce_axis(m, "k1"), te.reduce_axis(p, "k2")
    s = te.compute((n,), lambda i: te.sum(x[i, k1, k2], axis=[k1, k2]), name="s")
    am = te.compute((n,), lambda i: te.argmax(x[i, k1, k2], axis=[k1, k2]), name="am")
    f = tailjit.build([s, am], [x])
    xv = torch.randn(4, 5, 6)
    gs, gam = f(xv)
    torch.testing.assert_close(gs, xv.sum((1, 2)))
    assert torch.equal(gam, xv.reshape(4, -1).argmax(1))


@functools.cache
def _normalised_total():
    """``sum(x[r, c] / sum(x[r, :]) - max(x[r, :]))`` over rows and columns: nested row reductions inside a
    reduction over two axes (a KL divergence's softmax denominators in a scalar loss)."""
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    r, c, k, k2 = te.reduce_axis(n, "r"), te.reduce_axis(m, "c"), te.reduce_axis(m, "k"), te.reduce_axis(m, "k2")
    body = x[r, c] / te.sum(x[r, k], axis=k) - te.max(x[r, k2], axis=k2)
    return tailjit.build(te.compute((), lambda: te.sum(body, axis=[r, c]), name="total"), [x])


@pytest.mark.parametrize("shape", [(5, 37), (1, 1), (3, 0), (0, 4), (2, 1100)])
def test_nested_reductions_over_outer_axes_run_once_per_row(shape):
    """A reduction nested in a reduction over several axes that varies only with the outer ones is computed
    once per outer iteration, before the innermost loop, which is then vectorised; it had been recomputed at
    every element (kd_loss: 130 ms for 256 x 1000, O(n m^2)).  Values, NaN and empty ranges as torch."""
    f = _normalised_total()
    loop = re.search(r"#pragma omp simd[^\n]*\n\s*for \(int64_t c_", f.source)
    assert loop is not None  # the innermost loop over the columns is vectorised: no reduction inside it
    xv = torch.rand(shape) + 0.5
    if xv.numel() > 2:
        xv[0, 1] = float("nan")
    want = (xv / xv.sum(1, keepdim=True) - xv.amax(1, keepdim=True)).sum() if xv.shape[1] else xv.sum()
    torch.testing.assert_close(f(xv), want.to(xv.dtype), equal_nan=True)


@functools.cache
def _plane_sum():
    """A float32 sum over (rows, columns) per batch, its columns starting at an offset."""
    n, m, p = te.var("n"), te.var("m"), te.var("p")
    x = te.placeholder((n, m, p), name="x")
    k1, k2 = te.reduce_axis(m, "k1"), te.reduce_axis((1, p), "k2")
    return tailjit.build(te.compute((n,), lambda i: te.sum(x[i, k1, k2], axis=[k1, k2]), name="s"), [x])


@pytest.mark.parametrize("rows", [0, 1, 63, 64, 65, 200])
@pytest.mark.parametrize("width", [1, 2, 64, 65, 66, 1100])
def test_sums_over_short_rows_are_accurate_across_flushes(rows, width):
    """Rows of at most COLUMN_BLOCK elements accumulate per column and flush every ROWS_PER_FLUSH rows;
    longer ones take the blocked loop: both stay within float32 rounding of the exact sum, and NaN and inf
    propagate."""
    f = _plane_sum()
    assert "cols_" in f.source  # the column accumulators
    xv = torch.full((3, rows, width), 0.1) + torch.rand(3, rows, width) * 1e-3
    if rows and width > 1:
        xv[1, rows // 2, width - 1] = float("nan")
        xv[2, rows - 1, 1] = float("inf")
    got, exact = f(xv).double(), xv[:, :, 1:].double().sum((1, 2))
    torch.testing.assert_close(got, exact, rtol=1e-6, atol=1e-6, equal_nan=True)


def test_sums_of_vector_math_keep_one_version():
    """A body that calls vector math gains little from per-column accumulators and would cost gcc twice."""
    n, m, p = te.var("n"), te.var("m"), te.var("p")
    x = te.placeholder((n, m, p), name="x")
    k1, k2 = te.reduce_axis(m, "k1"), te.reduce_axis(p, "k2")
    f = tailjit.build(te.compute((n,), lambda i: te.sum(te.exp(x[i, k1, k2]), axis=[k1, k2]), name="s"), [x])
    assert "cols_" not in f.source
    xv = torch.randn(2, 70, 9)
    torch.testing.assert_close(f(xv), xv.exp().sum((1, 2)))


def test_argmax_over_empty_range_raises():
    f = _rowwise("argmax")
    with pytest.raises(ValueError, match="empty range"):
        f(torch.empty(3, 0))
    assert f(torch.empty(0, 0)).shape == (0,)


def test_long_float32_sum_is_accurate():
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    k = te.reduce_axis(n, "k")
    f = tailjit.build(te.compute((), lambda: te.sum(x[k], axis=k), name="total"), [x])
    xv = torch.full((1 << 22,), 0.1) + torch.rand(1 << 22) * 1e-3
    exact = xv.double().sum()
    assert abs(f(xv).double() - exact) / exact < 1e-6


def test_reduction_with_offset_range_and_epilogue():
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    k = te.reduce_axis((1, n), "k")
    y = te.compute((), lambda: te.sqrt(te.sum(x[k] * x[k], axis=k)) + 1, name="norm_tail")
    f = tailjit.build(y, [x])
    xv = torch.randn(50)
    torch.testing.assert_close(f(xv), xv[1:].norm() + 1)


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "argmax"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_column_reductions(op, dtype):
    """Reductions down columns (the reduce axis indexes rows): blocks of columns accumulate together,
    with the same order, precision, NaN and tie behaviour as PyTorch, for widths around the block size."""
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), dtype=dtype, name="x")
    b = te.placeholder((m,), dtype=dtype, name="b")
    k = te.reduce_axis(n, "k")
    y = te.compute((m,), lambda j: getattr(te, op)(x[k, j], axis=k) + b[j] * 2, name=f"col_{op}")
    f = tailjit.build(y, [x, b])
    assert ("jb_" in f.source) == (op != "argmax")
    tdt = getattr(torch, dtype)
    for rows, cols in ((5, 1), (9, 63), (4, 64), (7, 65), (3, 130), (0, 3)):
        if tdt.is_floating_point:
            xv = torch.randn(rows, cols, dtype=tdt)
            if rows * cols > 20:
                xv[1, 0], xv[2, cols - 1], xv[0, cols // 2] = math.nan, math.inf, -math.inf
            if op == "prod":
                xv = xv.clamp(-1.5, 1.5)
        else:
            xv = torch.randint(-3, 4, (rows, cols), dtype=tdt)
        bv = torch.ones(cols, dtype=tdt)
        if rows == 0 and op in ("max", "min", "argmax"):
            continue
        want = getattr(xv, {"max": "amax", "min": "amin"}.get(op, op))(0) + bv * 2
        for layout in (xv, xv.t().contiguous().t()):  # row-major and column-major inputs
            torch.testing.assert_close(f(layout, bv), want, equal_nan=True, check_dtype=False)


def test_column_reduction_with_per_row_factors():
    """Layer norm's gamma gradient: a column sum whose terms also read per-row values (``inv_std[k]``),
    the same across a block of columns, still runs by column blocks."""
    n, m = te.var("n"), te.var("m")
    g, x, s = te.placeholder((n, m), name="g"), te.placeholder((n, m), name="x"), te.placeholder((n,), name="s")
    k = te.reduce_axis(n, "k")
    y = te.compute((m,), lambda j: te.sum(g[k, j] * x[k, j] * te.rsqrt(s[k] + 1e-5), axis=k), name="dgamma")
    f = tailjit.build(y, [g, x, s])
    assert "jb_" in f.source
    gv, xv, sv = torch.randn(37, 70), torch.randn(37, 70), torch.rand(37)
    torch.testing.assert_close(f(gv, xv, sv), (gv * xv * torch.rsqrt(sv + 1e-5)[:, None]).sum(0), rtol=1e-5, atol=1e-5)


def test_column_reductions_in_a_kernel_with_outer_loops():
    """The column sum of each batch (the backward of a broadcast over rows), several reduce axes."""
    bsz, n, m = te.var("bsz"), te.var("n"), te.var("m")
    x = te.placeholder((bsz, n, m), name="x")
    k, l = te.reduce_axis(n, "k"), te.reduce_axis(bsz, "l")
    per_batch = te.compute((bsz, m), lambda i, j: te.sum(x[i, k, j] * x[i, k, j], axis=k), name="per_batch")
    total = te.compute((m,), lambda j: te.max(x[l, k, j], axis=[l, k]), name="total")
    f = tailjit.build([per_batch, total], [x])
    xv = torch.randn(3, 70, 100)
    xv[1, 5, 99] = math.nan
    got = f(xv)
    torch.testing.assert_close(got[0], (xv * xv).sum(1), equal_nan=True)
    torch.testing.assert_close(got[1], xv.amax((0, 1)), equal_nan=True)


@pytest.mark.parametrize("op", ["sum", "max"])
@pytest.mark.parametrize("width", [2, 3, 16, 17])
def test_column_reductions_over_a_short_last_dimension(op, width):
    """A reduction down the rows of an ``(n, m, K)`` value with a short static ``K`` (the gradient of
    ``(N, M, 2)`` box corners summed over ``N``): up to 16 columns, the block runs over ``m`` and ``K``
    flattened; the results match PyTorch, NaN included, for ``m * K`` around the block size."""
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m, width), name="x")
    c = te.placeholder((n, width), name="c")
    k = te.reduce_axis(n, "k")
    body = te.compute((n, m, width), lambda i, j, q: te.select(c[i, q] > 0, x[i, j, q] * 2.0, -x[i, j, q]), name="g")
    y = te.compute((1, m, width), lambda z, j, q: getattr(te, op)(body[k, j, q], axis=k) + 1.0, name="y")
    y2 = te.compute((m, width), lambda j, q: getattr(te, op)(body[k, j, q], axis=k) + 1.0, name="y2")
    f, f2 = tailjit.build(y, [x, c]), tailjit.build(y2, [x, c])  # y2's flattened loop is the parallel one
    assert ("jf_" in f.source) == ("jf_" in f2.source) == (width <= 16)
    for rows, cols in ((5, 1), (9, 31), (4, 32), (7, 33), (3, 70), (0, 3), (4, 0)):
        if rows == 0 and op == "max":
            continue
        xv, cv = torch.randn(rows, cols, width), torch.randn(rows, width)
        if rows * cols > 20:
            xv[1, 0, 0], xv[2, cols - 1, width - 1] = math.nan, math.inf
        g = torch.where(cv[:, None, :] > 0, xv * 2.0, -xv)
        want = (g.sum(0) if op == "sum" else g.amax(0)) + 1.0
        torch.testing.assert_close(f(xv, cv), want[None], equal_nan=True)
        torch.testing.assert_close(f2(xv, cv), want, equal_nan=True)


def test_column_reductions_at_an_offset_and_over_rows_apart():
    """Column sums whose loads read ``j`` plus a constant (a box's ``x2, y2`` columns, pairwise IoU's
    gradient) run by column blocks too, over ``(m, K)`` flattened; those over ``x[i, r, j]`` of a
    ``(b, f, K)`` tensor, whose rows of ``K`` lie ``f * K`` apart, by blocks of one ``i`` at a time."""
    n, m = te.var("n"), te.var("m")
    g, bx = te.placeholder((n, m, 2), name="g"), te.placeholder((n, 4), name="bx")
    k = te.reduce_axis(n, "k")
    y = te.compute((1, m, 2), lambda z, j, q: te.sum(g[k, j, q] * bx[k, 2 + q], axis=k), name="y")
    f = tailjit.build(y, [g, bx])
    assert "jf_" in f.source
    for rows, cols in ((5, 1), (9, 31), (4, 40), (0, 3)):
        gv, bv = torch.randn(rows, cols, 2), torch.randn(rows, 4)
        torch.testing.assert_close(f(gv, bv), (gv * bv[:, None, 2:]).sum(0, keepdim=True), rtol=1e-5, atol=1e-5)
    b, width = te.var("b"), 16
    x = te.placeholder((b, 40, width), name="x")
    r = te.reduce_axis(40, "r")
    s = te.compute((b, width), lambda i, j: te.sum(x[i, r, j], axis=r), name="s")
    f = tailjit.build(s, [x])
    assert "jb_" in f.source and "jf_" not in f.source
    xv = torch.randn(9, 40, width)
    torch.testing.assert_close(f(xv), xv.sum(1))


@pytest.mark.parametrize("op", ["sum", "max"])
def test_column_reductions_over_a_flattened_view(op):
    """The capsule routing's weighted sum ``s[b, j, d] = sum_r c[b, r, j] u[r, b, j * D + d]`` over a
    matrix product's ``(R, B, J * D)`` output: its loads step by one along ``d`` behind the offset
    ``j * D``, so it runs by column blocks (it had been one strided gather per term)."""
    nb, nr, nj = te.var("nb"), te.var("nr"), te.var("nj")
    width = 16
    u = te.placeholder((nr, nb, nj * width), name="u")
    c = te.placeholder((nb, nr, nj), name="c")
    r = te.reduce_axis(nr, "r")
    s = te.compute(
        (nb, nj, width),
        lambda b, j, d: getattr(te, op)(c[b, r, j] * u[r, b, j * width + d], axis=r),
        name="s",
    )
    f = tailjit.build(s, [u, c])
    assert "jb_" in f.source
    for b, rows, j in ((2, 5, 3), (3, 70, 1), (1, 1, 4), (2, 0, 2)):
        if rows == 0 and op == "max":
            continue
        uv, cv = torch.randn(rows, b, j * width), torch.rand(b, rows, j)
        if rows > 3:
            uv[1, 0, 5], uv[2, b - 1, (j - 1) * width + 1] = math.nan, math.inf
        prod = cv[..., None] * uv.view(rows, b, j, width).permute(1, 0, 2, 3)
        want = prod.sum(1) if op == "sum" else prod.amax(1)
        torch.testing.assert_close(f(uv, cv), want, equal_nan=True, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["sum", "max"])
def test_two_static_columns_reduce_by_their_own_loops(op):
    """An ``(n, 1, 2)`` gradient summed over the second box set: two static columns make no block (each
    lane of one would do a scalar's work); the reduction over ``m`` is vectorised instead."""
    n, m = te.var("n"), te.var("m")
    g, bx = te.placeholder((n, m, 2), name="g"), te.placeholder((m, 4), name="bx")
    k = te.reduce_axis(m, "k")
    y = te.compute((n, 1, 2), lambda i, z, q: getattr(te, op)(g[i, k, q] * bx[k, 2 + q], axis=k), name="y")
    f = tailjit.build(y, [g, bx])
    assert "jb_" not in f.source
    for rows, cols in ((5, 1), (9, 20), (4, 50)):
        gv, bv = torch.randn(rows, cols, 2), torch.randn(cols, 4)
        gv[0, 0, 1] = math.nan
        prod = gv * bv[None, :, 2:]
        want = (prod.sum(1) if op == "sum" else prod.amax(1))[:, None]
        torch.testing.assert_close(f(gv, bv), want, equal_nan=True, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64"])
def test_short_window_reductions_are_written_out(dtype):
    """3x3 window sums, products, maxima and minima (pooling, depthwise convolution) over a static
    window are expressions, not loops, with the loop's order, float64 accumulation and NaN rules."""
    n, h, w = te.var("n"), te.var("h"), te.var("w")
    x = te.placeholder((n, h, w), dtype=dtype, name="x")
    di, dj = te.reduce_axis(3, "di"), te.reduce_axis(3, "dj")
    outs = [
        te.compute(
            (n, h - 2, w - 2),
            lambda b, i, j, op=op: getattr(te, op)(x[b, i + di, j + dj], axis=[di, dj]),
            name=f"win_{op}",
        )  # fmt: skip
        for op in ("sum", "prod", "max", "min")
    ]
    f = tailjit.build(outs, [x])
    assert "acc_" not in f.source  # no accumulator loop left
    tdt = getattr(torch, dtype)
    xv = (
        (torch.randn(2, 7, 9, dtype=torch.float64) * 2).to(tdt)
        if tdt.is_floating_point
        else torch.randint(-3, 4, (2, 7, 9))
    )
    if tdt.is_floating_point:
        xv[0, 3, 4], xv[1, 0, 0] = math.nan, -math.inf
    win = xv.unfold(1, 3, 1).unfold(2, 3, 1).reshape(2, 5, 7, 9)
    want = [win.sum(-1), win.prod(-1), win.amax(-1), win.amin(-1)]
    for got, ref in zip(f(xv), want):
        torch.testing.assert_close(got, ref.to(got.dtype), equal_nan=True)


def test_a_reduction_over_a_range_given_backwards_runs_nothing():
    """``te.reduce_axis((lo, hi))`` with ``hi < lo`` at call time is an empty range: the max is -inf and
    no element is read (the vectorised loop's blocks would otherwise start below ``lo``)."""
    n, lo, hi = te.var("n"), te.var("lo"), te.var("hi")
    x = te.placeholder((n,), name="x")
    off = te.placeholder((lo,), name="off")
    end = te.placeholder((hi,), name="end")
    r = te.reduce_axis((lo, hi), "r")
    y = te.compute((), lambda: te.max(x[te.minimum(te.maximum(r, 0), n - 1)], axis=r), name="y")
    f = tailjit.build(y, [x, off, end])
    xv = torch.randn(50)
    for a, b in ((40, 3), (7, 7), (3, 40)):
        want = xv[a:b].max() if b > a else torch.tensor(-math.inf)
        torch.testing.assert_close(f(xv, torch.zeros(a), torch.zeros(b)), want)


def test_a_row_statistic_constant_along_a_leading_loop_is_stored_as_a_side_output():
    """``r[i, j]`` reads only ``x[i, :]``: its value is ready once loop ``i`` is open, but its element is
    stored under loop ``j`` (the build raised KeyError, and the capsule network's routing, whose squash norms
    are such statistics, ran as eager ops under ``tailjit.jit``)."""
    n, m, p = te.var("n"), te.var("m"), te.var("p")
    x, y = te.placeholder((n, p), name="x"), te.placeholder((n, m, p), name="y")
    k = te.reduce_axis(p, "k")
    r = te.compute((n, m), lambda i, j: te.sum(x[i, k] * x[i, k], axis=k), name="r")
    out = te.compute((n, m, p), lambda i, j, l: y[i, j, l] / r[i, j], name="out")
    kernel = tailjit.build([out, r], [x, y], name="statistic_along_j")
    assert len(kernel.kernels) == 1 and "also writes 'r'" in kernel.describe()
    xs, ys = torch.randn(3, 5), torch.randn(3, 4, 5)
    got_out, got_r = kernel(xs, ys)
    want_r = (xs * xs).sum(1)[:, None].expand(3, 4)
    torch.testing.assert_close(got_r, want_r)
    torch.testing.assert_close(got_out, ys / want_r[..., None])
