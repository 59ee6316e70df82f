"""te.scatter: accumulating updates against PyTorch and a sequential reference.

Every program has symbolic sizes, so each is compiled once (cached below) and
called with several shapes, layouts and dtypes.
"""

import functools

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tailjit
from tailjit import te
from tailjit.codegen import PRELUDE_END

COMBINE_OF = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min"}
INDEX_GUARD = "err |= 1;"  # the code of a per-element target guard


@functools.cache
def scatter_dim(dim: int, combine: str, dtype: str = "float32"):
    """``x.scatter_reduce(dim, idx, src, combine)`` (include_self) for 2-d tensors."""
    n, m, a, b = te.var("n"), te.var("m"), te.var("a"), te.var("b")
    x = te.placeholder((n, m), dtype, name="x")
    idx = te.placeholder((a, b), "int64", name="idx")
    src = te.placeholder((a, b), dtype, name="src")

    def update(i, j):
        return ((idx[i, j], j) if dim == 0 else (i, idx[i, j])), src[i, j]

    out = te.scatter(x, (a, b), update, combine=combine, name=f"scatter_{dim}_{combine}_{dtype}")
    return tailjit.build(out, [x, idx, src])


def _scatter_args(dim, n, m, a, b, dtype=torch.float32, duplicates=True):
    x = torch.randn(n, m).to(dtype)
    src = (torch.randn(a, b) * 3).to(dtype)
    size = n if dim == 0 else m
    if duplicates:
        idx = torch.randint(0, max(size, 1), (a, b))
    elif dim == 0:  # distinct rows in every column
        idx = torch.stack([torch.randperm(size)[:a] for _ in range(b)], 1)
    else:  # distinct columns in every row
        idx = torch.stack([torch.randperm(size)[:b] for _ in range(a)], 0)
    return x, idx, src


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "amin"])
def test_scatter_reduce_matches_torch(dim, reduce):
    f = scatter_dim(dim, COMBINE_OF[reduce])
    for shape in ((5, 4, 7, 3), (1, 1, 1, 1), (6, 9, 6, 9), (3, 5, 0, 2), (3, 5, 2, 0)):
        n, m, a, b = shape if dim == 0 else (shape[1], shape[0], shape[3], shape[2])  # idx fits x off dim
        x, idx, src = _scatter_args(dim, n, m, a, b)
        torch.testing.assert_close(f(x, idx, src), x.scatter_reduce(dim, idx, src, reduce), rtol=1e-5, atol=1e-5)


def test_scatter_add_on_non_contiguous_inputs():
    f = scatter_dim(1, "add")
    x, idx, src = _scatter_args(1, 8, 6, 5, 4)
    xt, idxt, srct = (t.T.contiguous().T for t in (x, idx, src))  # column-major copies
    assert not xt.is_contiguous() and not idxt.is_contiguous()
    torch.testing.assert_close(f(xt, idxt, srct), x.scatter_add(1, idx, src))
    xs, idxs, srcs = x[::2, ::2], idx[1:4, 1:3], src[1:4, 1:3]
    torch.testing.assert_close(f(xs, idxs % 3, srcs), xs.scatter_add(1, idxs % 3, srcs))


@pytest.mark.parametrize("dim", [0, 1])
def test_scatter_assign_matches_torch_on_distinct_targets(dim):
    f = scatter_dim(dim, "assign")
    for shape in ((6, 5, 4, 3), (5, 6, 3, 4), (4, 4, 4, 4)):
        x, idx, src = _scatter_args(dim, *shape, duplicates=False)
        torch.testing.assert_close(f(x, idx, src), x.scatter(dim, idx, src), rtol=0, atol=0)


def test_scatter_assign_last_write_in_row_major_order_wins():
    f = scatter_dim(0, "assign")
    x, src = torch.zeros(3, 2), torch.arange(8.0).reshape(4, 2)
    idx = torch.tensor([[1, 0], [1, 2], [0, 2], [1, 2]])
    # column 0 writes rows 1 (0), 1 (2), 0 (4), 1 (6); column 1 writes rows 0 (1), 2 (3), 2 (5), 2 (7)
    torch.testing.assert_close(f(x, idx, src), torch.tensor([[4.0, 1.0], [6.0, 0.0], [0.0, 7.0]]))


def test_nan_and_inf_propagate_like_torch():
    x = torch.tensor([[0.0, 1.0], [float("nan"), -1.0], [2.0, float("inf")]])
    src = torch.tensor([[float("nan"), 5.0], [1.0, float("-inf")], [float("inf"), 2.0], [3.0, float("nan")]])
    idx = torch.tensor([[0, 1], [1, 2], [2, 2], [0, 0]])
    for reduce in ("sum", "prod", "amax", "amin"):
        got = scatter_dim(0, COMBINE_OF[reduce])(x, idx, src)
        torch.testing.assert_close(got, x.scatter_reduce(0, idx, src, reduce), equal_nan=True)


@pytest.mark.parametrize("dtype", ["int32", "int64", "bool"])
def test_integer_and_bool_dtypes(dtype):
    tdt = getattr(torch, dtype)
    idx = torch.randint(0, 5, (6, 3))
    for combine, reduce in (("add", "sum"), ("max", "amax"), ("min", "amin"), ("mul", "prod")):
        if dtype == "bool":
            x, src = torch.rand(5, 3) < 0.5, torch.rand(6, 3) < 0.5
        else:
            x, src = torch.randint(-5, 5, (5, 3), dtype=tdt), torch.randint(-5, 5, (6, 3), dtype=tdt)
        got = scatter_dim(0, combine, dtype)(x, idx, src)
        assert got.dtype == tdt
        if dtype == "bool" and combine == "add":  # torch: scatter_add on bool is a logical or
            torch.testing.assert_close(got, x.scatter_add(0, idx, src))
        elif dtype == "bool":  # scatter_reduce rejects bool: max is a logical or, min and prod an and
            want = x.clone()
            for i, j in np.ndindex(*idx.shape):
                t = idx[i, j]
                want[t, j] = (want[t, j] | src[i, j]) if combine == "max" else (want[t, j] & src[i, j])
            torch.testing.assert_close(got, want)
        else:
            torch.testing.assert_close(got, x.scatter_reduce(0, idx, src, reduce))


def test_integer_sums_wrap_like_torch():
    big = torch.full((2, 1), 2**31 - 1, dtype=torch.int32)
    idx, src = torch.zeros(3, 1, dtype=torch.int64), torch.full((3, 1), 2**30, dtype=torch.int32)
    torch.testing.assert_close(scatter_dim(0, "add", "int32")(big, idx, src), big.scatter_add(0, idx, src))


def test_value_is_converted_to_the_result_dtype():
    n, k = te.var("n"), te.var("k")
    base = te.placeholder((n,), "int32", name="base")
    idx, w = te.placeholder((k,), "int64", name="idx"), te.placeholder((k,), "float64", name="w")
    out = te.scatter(base, (k,), lambda i: (idx[i], w[i] * 2))  # a bare target for a 1-d result
    assert out.dtype == te.int32 and out.ndim == 1
    f = tailjit.build(out, [base, idx, w])
    b, i = torch.zeros(4, dtype=torch.int32), torch.tensor([0, 1, 1, 3])
    wv = torch.tensor([1.7, -2.6, 0.4, 3.0], dtype=torch.float64)
    torch.testing.assert_close(f(b, i, wv), b.index_add(0, i, (wv * 2).to(torch.int32)))


@functools.cache
def index_add_te():
    """``x.index_add(1, idx, src, alpha=0.5)``: ``out[i, idx[j]] += 0.5 * src[i, j]``."""
    n, m, k = te.var("n"), te.var("m"), te.var("k")
    x, src = te.placeholder((n, m), name="x"), te.placeholder((n, k), name="src")
    idx = te.placeholder((k,), "int64", name="idx")
    return tailjit.build(te.scatter(x, (n, k), lambda i, j: ((i, idx[j]), 0.5 * src[i, j])), [x, src, idx])


def test_index_add_matches_torch():
    f = index_add_te()
    for n, m, k in ((4, 6, 9), (3, 3, 0), (1, 5, 1), (0, 2, 3)):
        x, src, idx = torch.randn(n, m), torch.randn(n, k), torch.randint(0, m, (k,))
        torch.testing.assert_close(f(x, src, idx), x.index_add(1, idx, src, alpha=0.5))
    # the i part of the target is the domain's own loop over the rows: proven, so only idx[j] is guarded
    assert f.source.count(INDEX_GUARD) == 1


@functools.cache
def index_put_te(accumulate: bool):
    """``x.index_put_((rows,), vals, accumulate)`` for vals of shape (k, m)."""
    n, m, k = te.var("n"), te.var("m"), te.var("k")
    x, vals = te.placeholder((n, m), name="x"), te.placeholder((k, m), name="vals")
    rows = te.placeholder((k,), "int64", name="rows")
    out = te.scatter(x, (k, m), lambda i, j: ((rows[i], j), vals[i, j]), combine="add" if accumulate else "assign")
    return tailjit.build(out, [x, vals, rows])


def test_index_put_with_duplicate_indices():
    x, vals = torch.randn(4, 3), torch.randn(6, 3)
    rows = torch.tensor([2, 0, 2, 2, 1, 0])
    acc = index_put_te(True)(x, vals, rows)
    torch.testing.assert_close(acc, x.clone().index_put_((rows,), vals, accumulate=True))
    want = x.clone()
    for i, r in enumerate(rows.tolist()):  # sequential: the last write wins
        want[r] = vals[i]
    torch.testing.assert_close(index_put_te(False)(x, vals, rows), want, rtol=0, atol=0)


def test_embedding_bag_sum():
    n, d, k, bags = te.var("n"), te.var("d"), te.var("k"), te.var("bags")
    table = te.placeholder((n, d), name="table")
    ids, bag = te.placeholder((k,), "int64", name="ids"), te.placeholder((k,), "int64", name="bag")
    base = te.placeholder((bags,), "int64", name="bag_ids")  # binds the number of bags
    zeros = te.compute((bags, d), lambda b, j: 0.0, name="zeros")
    out = te.scatter(zeros, (k, d), lambda i, j: ((bag[i], j), table[ids[i], j]), name="embedding_bag")
    f = tailjit.build(out, [table, ids, bag, base])
    assert len(f.kernels) == 1
    w = torch.randn(10, 4)
    ids_v = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    offsets = torch.tensor([0, 2, 2, 5])  # bag 1 is empty
    bag_v = torch.bucketize(torch.arange(len(ids_v)), offsets, right=True) - 1
    want = torch.nn.functional.embedding_bag(ids_v, w, offsets, mode="sum")
    torch.testing.assert_close(f(w, ids_v, bag_v, torch.arange(4)), want)
    with pytest.raises(IndexError):  # an id outside the table: the guarded load
        f(w, ids_v.clone().fill_(10), bag_v, torch.arange(4))


def test_histogram_bincount():
    k = te.var("k")
    idx, w = te.placeholder((k,), "int64", name="idx"), te.placeholder((k,), "float64", name="w")
    counts = te.scatter(te.compute((16,), lambda i: 0, name="zeros"), (k,), lambda i: ((idx[i],), 1), name="bincount")
    weighted = te.scatter(te.compute((16,), lambda i: 0.0), (k,), lambda i: ((idx[i],), w[i]), name="weighted")
    assert counts.dtype == te.int64 and weighted.dtype == te.float32
    f = tailjit.build([counts, weighted], [idx, w])
    for size in (0, 1, 1000):
        iv, wv = torch.randint(0, 16, (size,)), torch.rand(size, dtype=torch.float64)
        c, h = f(iv, wv)
        torch.testing.assert_close(c, torch.bincount(iv, minlength=16))
        torch.testing.assert_close(h, torch.bincount(iv, wv, minlength=16).float())


def test_histogram_of_values_with_a_condition():
    """``torch.histc``-like: bin ``floor(x * bins)`` of values in [0, 1); others are skipped by cond."""
    k = te.var("k")
    x = te.placeholder((k,), name="x")
    zeros = te.compute((8,), lambda i: 0, name="zeros")
    hist = te.scatter(
        zeros, (k,), lambda i: (te.cast(te.floor(x[i] * 8), "int64"), 1, (x[i] >= 0) & (x[i] < 1)), name="hist"
    )
    f = tailjit.build(hist, [x])
    xv = torch.tensor([0.0, 0.99, 0.5, -0.2, 1.0, 3.0, 0.13, float("nan"), 0.125])
    inside = xv[(xv >= 0) & (xv < 1)]
    torch.testing.assert_close(f(xv), torch.bincount((inside * 8).floor().long(), minlength=8))


def test_out_of_range_targets_raise_and_write_nothing_outside():
    f = index_put_te(True)
    x, vals = torch.randn(3, 2), torch.randn(4, 2)
    for rows in (torch.tensor([0, 3, 1, 1]), torch.tensor([0, -1, 1, 1]), torch.tensor([2**40, 0, 0, 0])):
        big = torch.full((7, 2), 123.0)
        with pytest.raises(IndexError, match="out of bounds"):
            f(x, vals, rows, out=big[2:5])
        assert (big[:2] == 123).all() and (big[5:] == 123).all()
    g = scatter_dim(0, "add")
    with pytest.raises(IndexError, match="can fall outside"):  # the affine part j: checked before running
        g(torch.zeros(3, 2), torch.zeros(2, 3, dtype=torch.int64), torch.ones(2, 3))
    with pytest.raises(IndexError):  # an empty result with updates
        g(torch.zeros(0, 2), torch.zeros(1, 2, dtype=torch.int64), torch.ones(1, 2))
    torch.testing.assert_close(g(torch.zeros(0, 2), torch.zeros(0, 2, dtype=torch.int64), torch.ones(0, 2)),
                               torch.zeros(0, 2))  # fmt: skip


def test_affine_targets_are_proven_or_rejected():
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    flip = te.scatter(x, (n,), lambda i: ((n - 1 - i,), x[i]), combine="assign", name="flip")
    shift = te.scatter(x, (n,), lambda i: ((i - 1,), x[i], i > 0), name="shift")
    f = tailjit.build([flip, shift], [x])
    assert INDEX_GUARD not in f.source and "can fall outside" not in f.source
    xv = torch.randn(6)
    a, b = f(xv)
    torch.testing.assert_close(a, xv.flip(0))
    want = xv.clone()
    want[:-1] += xv[1:]
    torch.testing.assert_close(b, want)
    bad = te.scatter(x, (n,), lambda i: ((i + 1,), 1.0), name="bad")
    with pytest.raises(te.TEError, match=r"scatter 'bad': target index 0 .* is out of bounds"):
        tailjit.build(bad, [x])


def test_scatter_into_a_scalar():
    k = te.var("k")
    x = te.placeholder((k,), name="x")
    total = te.scatter(te.compute((), lambda: 0.0), (k,), lambda i: ((), x[i]), name="total")
    top = te.scatter(te.compute((), lambda: float("-inf")), (k,), lambda i: ((), x[i]), "max", name="top")
    f = tailjit.build([total, top], [x])
    xv = torch.randn(100)
    s, mx = f(xv)
    torch.testing.assert_close(s, xv.sum())
    torch.testing.assert_close(mx, xv.max())


def test_malformed_scatters():
    n = te.var("n")
    x = te.placeholder((n, n), name="x")
    idx = te.placeholder((n,), "int64", name="idx")
    with pytest.raises(te.TEError, match="2 dimension"):
        te.scatter(x, (n,), lambda i: ((idx[i],), 1.0))
    with pytest.raises(te.TEError, match="combine must be one of"):
        te.scatter(x, (n,), lambda i: ((idx[i], i), 1.0), combine="sum")
    with pytest.raises(te.TEError, match=r"\(targets, value\)"):
        te.scatter(idx, (n,), lambda i: idx[i])
    with pytest.raises(TypeError, match="cond must be a bool"):
        te.scatter(x, (n,), lambda i: ((idx[i], i), 1.0, idx[i]))
    with pytest.raises(TypeError, match="integer expression"):
        te.scatter(x, (n,), lambda i: ((idx[i], 0.5), 1.0))
    with pytest.raises(te.TEError, match="fupdate must take 2 index"):
        te.scatter(x, (n, n), lambda i: ((i, i), 1.0))
    with pytest.raises(te.TEError, match="base must be a te.Tensor"):
        te.scatter(3.0, (n,), lambda i: ((i,), 1.0))


# Fusion ---------------------------------------------------------------------------


def test_zeros_base_and_producers_fuse_into_one_kernel():
    k = te.var("k")
    x, idx = te.placeholder((k,), name="x"), te.placeholder((k,), "int64", name="idx")
    base = te.placeholder((te.var("n"),), name="like")
    zeros = te.compute(base.shape, lambda i: 0.0, name="zeros")
    y = te.compute((k,), lambda i: x[i] * 2, name="y")
    out = te.scatter(zeros, (k,), lambda i: ((idx[i],), y[i]), name="scatter_add")
    f = tailjit.build(out, [base, x, idx])
    assert len(f.kernels) == 1
    info = f.kernels[0]
    assert set(info.fused) == {"zeros", "y"} and info.body == "0.0"
    assert "(x[i] * 2)" in info.update and "idx[i]" in info.update
    assert "update (serial, row-major)" in f.describe()
    xv, iv = torch.randn(50), torch.randint(0, 7, (50,))
    torch.testing.assert_close(f(torch.empty(7), xv, iv), torch.zeros(7).index_add(0, iv, xv * 2))


def _doubled(a, idx):
    """``a`` with ``a[idx[i]] *= 2`` for every ``i``."""
    a = a.clone()
    for i in idx.tolist():
        a[i] *= 2
    return a


def _chain(read_base_again: bool):
    n, k = te.var("n"), te.var("k")
    x, idx = te.placeholder((n,), name="x"), te.placeholder((k,), "int64", name="idx")
    first = te.scatter(x, (k,), lambda i: ((idx[i],), 1.0), name="first")
    second = te.scatter(first, (k,), lambda i: ((idx[i],), 2.0), combine="mul", name="second")
    outs = [second]
    if read_base_again:
        outs.append(te.compute((n,), lambda i: first[i] + 1, name="again"))
    return tailjit.build(outs, [x, idx])


def test_a_temporary_base_read_once_is_updated_in_place():
    f = _chain(False)
    assert [k.name for k in f.kernels] == ["first", "second"]
    first, second = f.kernels
    assert "buffer of 'second'" in first.role and second.body == ""
    assert "copy:  none" in f.describe()
    assert "tj_temp_item" not in f.source.split(PRELUDE_END)[1]  # no temporary buffer at all
    xv, iv = torch.randn(5), torch.tensor([1, 1, 4, 0])
    torch.testing.assert_close(f(xv, iv), _doubled(xv.index_add(0, iv, torch.ones(4)), iv))


def test_a_base_read_elsewhere_is_copied():
    f = _chain(True)
    assert f.kernels[1].body and "buffer of" not in f.kernels[0].role
    xv, iv = torch.randn(5), torch.tensor([1, 1, 4, 0])
    first = xv.index_add(0, iv, torch.ones(4))
    second, again = f(xv, iv)
    torch.testing.assert_close(second, _doubled(first, iv))
    torch.testing.assert_close(again, first + 1)


def test_a_base_read_by_its_own_update_is_copied():
    n = te.var("n")
    x, idx = te.placeholder((n,), name="x"), te.placeholder((n,), "int64", name="idx")
    first = te.scatter(x, (n,), lambda i: ((idx[i],), 1.0), name="first")
    # every update reads the first scatter's value at i, before any update of the second
    second = te.scatter(first, (n,), lambda i: ((idx[i],), first[i]), name="second")
    f = tailjit.build(second, [x, idx])
    xv, iv = torch.randn(6), torch.tensor([1, 0, 0, 5, 2, 1])
    a = xv.index_add(0, iv, torch.ones(6))
    torch.testing.assert_close(f(xv, iv), a.index_add(0, iv, a))


def test_a_scan_base_is_computed_in_the_scatter_buffer_unless_it_is_an_output():
    n, m = te.var("n"), te.var("m")
    x, idx = te.placeholder((n, m), name="x"), te.placeholder((m,), "int64", name="idx")
    cs = te.scan((n, m), 1, lambda prev, i, j: prev + x[i, j], dtype="float32", name="cs")
    out = te.scatter(cs, (n, m), lambda i, j: ((i, idx[j]), x[i, j]), combine="max", name="out")
    f, g = tailjit.build(out, [x, idx]), tailjit.build([out, cs], [x, idx])
    assert "buffer of 'out'" in f.kernels[0].role and f.kernels[1].body == ""
    assert "buffer of" not in g.kernels[0].role and g.kernels[1].body == "cs[i0, i1]"
    xv, iv = torch.randn(5, 7), torch.randint(0, 7, (7,))
    c = xv.cumsum(1)
    want = c.scatter_reduce(1, iv.expand(5, 7), xv, "amax")
    torch.testing.assert_close(f(xv, iv), want)
    got, got_cs = g(xv, iv)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_cs, c)


def test_a_scatter_result_is_materialised_for_its_consumers():
    n = te.var("n")
    x, idx = te.placeholder((n,), name="x"), te.placeholder((n,), "int64", name="idx")
    s = te.scatter(x, (n,), lambda i: ((idx[i],), x[i]), name="s")
    y = te.compute((n,), lambda i: s[i] * s[n - 1 - i], name="y")
    f = tailjit.build(y, [x, idx])
    assert [k.name for k in f.kernels] == ["s", "y"] and f.kernels[0].role.startswith("temporary")
    xv, iv = torch.randn(9), torch.randint(0, 9, (9,))
    s_ref = xv.index_add(0, iv, xv)
    torch.testing.assert_close(f(xv, iv), s_ref * s_ref.flip(0))


def test_reduction_in_the_update_value():
    """Row sums scattered: the reduction is computed in the update loop, once per row."""
    n, m, g = te.var("n"), te.var("m"), te.var("g")
    x, group = te.placeholder((n, m), name="x"), te.placeholder((n,), "int64", name="group")
    base = te.placeholder((g,), name="base")
    k = te.reduce_axis(m, "k")
    rows = te.compute((n,), lambda i: te.sum(x[i, k], axis=k), name="rows")
    out = te.scatter(base, (n,), lambda i: ((group[i],), rows[i]))
    f = tailjit.build(out, [x, group, base])
    assert len(f.kernels) == 1 and "rows" in f.kernels[0].fused
    xv, gv, bv = torch.randn(20, 7), torch.randint(0, 3, (20,)), torch.randn(3)
    torch.testing.assert_close(f(xv, gv, bv), bv.index_add(0, gv, xv.sum(1)))


def test_one_compile_serves_several_sizes():
    f = scatter_dim(0, "add")
    for n, m, a, b in ((2, 3, 4, 3), (17, 5, 40, 5), (300, 8, 1000, 8)):
        x, idx, src = _scatter_args(0, n, m, a, b)
        torch.testing.assert_close(f(x, idx, src), x.scatter_add(0, idx, src), rtol=1e-5, atol=1e-5)


# Property test -------------------------------------------------------------------------


def _reference(combine, base, ti, tj, val, mask):
    """The sequential semantics: every domain point in row-major order."""
    out = base.copy()
    for p in np.ndindex(*ti.shape):
        if not mask[p]:
            continue
        t = (ti[p], tj[p])
        old, v = out[t], val[p]
        if combine == "add":
            out[t] = old + v
        elif combine == "mul":
            out[t] = old * v
        elif combine == "max":
            out[t] = v if (v > old or v != v) else old
        elif combine == "min":
            out[t] = v if (v < old or v != v) else old
        else:
            out[t] = v
    return out


def _base_and_values(rng, dtype: str, base_shape, val_shape):
    """A random base and update values: normal floats with a tenth of the values NaN, or small integers."""
    if dtype == "float64":
        base, val = rng.normal(size=base_shape), rng.normal(size=val_shape)
        val[rng.random(val_shape) < 0.1] = np.nan
        return base, val
    return rng.integers(-9, 9, base_shape), rng.integers(-3, 4, val_shape)


@functools.cache
def masked_scatter(combine: str, dtype: str):
    n, m, a, b = te.var("n"), te.var("m"), te.var("a"), te.var("b")
    base = te.placeholder((n, m), dtype, name="base")
    ti, tj = te.placeholder((a, b), "int64", name="ti"), te.placeholder((a, b), "int64", name="tj")
    val, mask = te.placeholder((a, b), dtype, name="val"), te.placeholder((a, b), "bool", name="mask")
    out = te.scatter(base, (a, b), lambda i, j: ((ti[i, j], tj[i, j]), val[i, j], mask[i, j]), combine)
    return tailjit.build(out, [base, ti, tj, val, mask])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    combine=st.sampled_from(["add", "mul", "max", "min", "assign"]),
    dtype=st.sampled_from(["float64", "int64"]),
    n=st.integers(1, 6),
    m=st.integers(1, 5),
    a=st.integers(0, 7),
    b=st.integers(0, 4),
    seed=st.integers(0, 2**31 - 1),
)
def test_random_scatters_match_a_sequential_reference(combine, dtype, n, m, a, b, seed):
    rng = np.random.default_rng(seed)
    ti, tj = rng.integers(0, n, (a, b)), rng.integers(0, m, (a, b))  # small ranges: many duplicates
    base, val = _base_and_values(rng, dtype, (n, m), (a, b))
    mask = rng.random((a, b)) < 0.8
    got = masked_scatter(combine, dtype)(*(torch.from_numpy(v) for v in (base, ti, tj, val, mask)))
    np.testing.assert_allclose(got.numpy(), _reference(combine, base, ti, tj, val, mask), rtol=1e-12)


@functools.cache
def row_scatter(combine: str, dtype: str):
    """Rows of ``val`` combined into the rows ``ti`` of ``base`` (``index_add``, a segment max)."""
    n, m, a = te.var("n"), te.var("m"), te.var("a")
    base, ti = te.placeholder((n, m), dtype, name="base"), te.placeholder((a,), "int64", name="ti")
    val = te.placeholder((a, m), dtype, name="val")
    out = te.scatter(base, (a, m), lambda i, j: ((ti[i], j), val[i, j]), combine, name=f"rows_{combine}_{dtype}")
    return tailjit.build(out, [base, ti, val])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    combine=st.sampled_from(["add", "mul", "max", "min", "assign"]),
    dtype=st.sampled_from(["float64", "int64"]),
    n=st.integers(1, 6),
    m=st.integers(0, 40),
    a=st.integers(0, 9),
    seed=st.integers(0, 2**31 - 1),
)
def test_row_scatters_match_a_sequential_reference(combine, dtype, n, m, a, seed):
    """An update whose last target index is its innermost loop writes whole rows: vectorised along the
    row, with each slot's values still combined in order (duplicate rows, NaN)."""
    rng = np.random.default_rng(seed)
    ti = rng.integers(0, n, (a,))
    base, val = _base_and_values(rng, dtype, (n, m), (a, m))
    f = row_scatter(combine, dtype)
    assert "row_" in f.source
    got = f(*(torch.from_numpy(v) for v in (base, ti, val)))
    want = _reference(
        combine, base, np.repeat(ti[:, None], m, 1), np.tile(np.arange(m), (a, 1)), val, np.ones((a, m), bool)
    )
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)


def test_a_row_scatter_past_the_last_row_raises():
    f = row_scatter("add", "float64")
    base, val = torch.zeros(3, 4, dtype=torch.float64), torch.ones(2, 4, dtype=torch.float64)
    for bad in (3, -1):
        with pytest.raises(IndexError, match="out of bounds"):
            f(base, torch.tensor([0, bad]), val)
