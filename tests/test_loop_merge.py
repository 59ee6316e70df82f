"""Kernels over one domain sharing one loop nest (``tailjit.loop_merge``): which merge, which must not,
and random programs of several materialised computes against PyTorch."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tailjit
from tailjit import te
from tailjit.bench.ops import all_operators
from tailjit.frontend.plan.report import collect_reports
from tailjit.schedule import Schedule


def _heavy(e):
    """Costly enough that fusion stores it rather than recompute it in each reader."""
    return te.exp(te.tanh(e)) * te.log1p(te.abs(e))


def _heavy_ref(v):
    return torch.exp(torch.tanh(v)) * torch.log1p(v.abs())


def _program():
    """``a``, costly, read by two kernels: fusion stores it rather than compute it in each."""
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    a = te.compute((n, m), lambda i, j: _heavy(x[i, j]), name="a")
    return n, m, x, a


def _merged(kernel, host: str) -> list[tuple[str, bool]]:
    (k,) = [k for k in kernel.kernels if k.name == host]
    return [(name, store) for name, store, *_ in k.merged]


def _two_readers(schedules=None):
    """``c`` and ``d``, outputs reading ``a`` at their point, built."""
    n, m, x, a = _program()
    c = te.compute((n, m), lambda i, j: a[i, j] * 2.0 + x[i, j], name="c")
    d = te.compute((n, m), lambda i, j: a[i, j] / (x[i, j] + 3.0), name="d")
    return tailjit.build([c, d], [x], schedules=schedules)


def _check_two_readers(f, rows: int, cols: int):
    xv = torch.randn(rows, cols)
    av = _heavy_ref(xv)
    got_c, got_d = f(xv)
    torch.testing.assert_close(got_c, av * 2.0 + xv)
    torch.testing.assert_close(got_d, av / (xv + 3.0))


def test_temporaries_read_at_the_point_become_locals():
    f = _two_readers()
    assert [k.name for k in f.kernels] == ["d"]
    assert _merged(f, "d") == [("a", False), ("c", True)]
    assert "first: a (a local: no buffer" in f.describe()
    _check_two_readers(f, 7, 5)


def test_a_reduction_between_keeps_the_reader_apart():
    """``c`` reads ``a`` at its point but also ``s``, a sum down ``a``'s columns: ``s`` needs all of
    ``a`` first, so ``c`` cannot run in ``a``'s loop nest."""
    n, m, x, a = _program()
    r = te.reduce_axis(n, "r")
    s = te.compute((m,), lambda j: te.sum(a[r, j], axis=r), name="s")
    c = te.compute((n, m), lambda i, j: a[i, j] - s[j], name="c")
    f = tailjit.build([c, s], [x])
    assert sorted(k.name for k in f.kernels) == ["a", "c", "s"]
    xv = torch.randn(6, 4)
    av = _heavy_ref(xv)
    got_c, got_s = f(xv)
    torch.testing.assert_close(got_c, av - av.sum(0))
    torch.testing.assert_close(got_s, av.sum(0))


def test_a_read_elsewhere_than_the_point_keeps_the_reader_apart():
    n, m, x, a = _program()
    c = te.compute((n, m), lambda i, j: a[i, m - 1 - j] * x[i, j], name="c")
    d = te.compute((n, m), lambda i, j: a[i, j] + x[i, j], name="d")
    f = tailjit.build([c, d], [x])
    assert sorted(k.name for k in f.kernels) == ["a", "d"] and _merged(f, "d") == [("c", True)]
    xv = torch.randn(5, 6)
    av = _heavy_ref(xv)
    got_c, got_d = f(xv)
    torch.testing.assert_close(got_c, av.flip(1) * xv)
    torch.testing.assert_close(got_d, av + xv)


def test_a_kernel_given_a_schedule_stays_its_own():
    f = _two_readers(schedules={"a": Schedule(order=["i", "j"], vectorize=False)})
    assert sorted(k.name for k in f.kernels) == ["a", "d"]
    _check_two_readers(f, 3, 9)


def test_giou_backward_is_one_loop_nest():
    """The IoU loss's backward: ten loop nests over the boxes before merging, of shapes (N,), (N, 2) and (N, 4),
    written out a box at a time in one."""
    op = all_operators()["giou"]
    pred, target = op.inputs("small", 0)
    pred.requires_grad_()
    ours = pred.detach().clone().requires_grad_()
    with collect_reports() as reports:
        out = tailjit.jit(op.fn)(ours, target)
    out.sum().backward()
    op.fn(pred, target).sum().backward()
    torch.testing.assert_close(ours.grad, pred.grad)
    (backward,) = [k for r in reports for k, _ in r.kernels if k.name.endswith("backward")]
    (nest,) = backward.kernels
    assert len(nest.merged) == 9 and not any(stored for _, stored, *_ in nest.merged)  # no temporary at all


READS = ["point", "flip", "roll", "rowsum", "colsum"]
OPS = [
    (lambda a, b: a + b, lambda a, b: a + b),
    (lambda a, b: a * b, lambda a, b: a * b),
    (lambda a, b: te.select(a > b, a, b * 2.0), lambda a, b: torch.where(a > b, a, b * 2.0)),
    (lambda a, b: a / b, lambda a, b: a / b),
]


def test_column_sums_share_a_pass_over_the_rows():
    """Layer norm's gamma and beta gradients, two sums down the columns, are one loop nest: one pass over
    the rows, reading the output gradient once."""
    from tailjit.bench.autodiff import _layer_norm

    ins, y = _layer_norm()
    head = te.placeholder(y.shape, y.dtype, name="head")
    f = tailjit.build(te.gradient([y], ins, head=head), [*ins, head])
    assert [k.name for k in f.kernels] == ["mean", "var", "grad_x", "grad_beta"]
    assert _merged(f, "grad_beta") == [("grad_gamma", True)]
    xv, gv, bv, hv = (torch.randn(s) for s in ((7, 70), (70,), (70,), (7, 70)))
    leaves = [t.clone().requires_grad_() for t in (xv, gv, bv)]
    xc = leaves[0] - leaves[0].mean(1, keepdim=True)
    out = xc * torch.rsqrt((xc * xc).mean(1, keepdim=True) + 1e-5) * leaves[1] + leaves[2]
    want = torch.autograd.grad(out, leaves, hv)
    for got, w in zip(f(xv, gv, bv, hv), want):
        torch.testing.assert_close(got, w, rtol=1e-4, atol=1e-4)


def test_column_sums_over_different_rows_and_a_sum_of_a_sum():
    """Column reductions over different row counts share the nest (a pass over each one's rows), NaN
    propagating through a max; one that reads another's result needs all of it first and stays apart."""
    n, p, m = te.var("n"), te.var("p"), te.var("m")
    x, z = te.placeholder((n, m), name="x"), te.placeholder((p, m), name="z")
    r, q = te.reduce_axis(n, "r"), te.reduce_axis(p, "q")
    s1 = te.compute((m,), lambda j: te.sum(x[r, j] * 2.0, axis=r), name="s1")
    s2 = te.compute((m,), lambda j: te.max(z[q, j], axis=q), name="s2")
    s3 = te.compute((m,), lambda j: te.sum(x[r, j] * s1[j], axis=r) + s2[j], name="s3")
    f = tailjit.build([s1, s2, s3], [x, z])
    assert len(f.kernels) == 2 and _merged(f, "s2") == [("s1", True)]
    xv, zv = torch.randn(5, 131), torch.randn(3, 131)
    zv[1, 7] = float("nan")
    got = f(xv, zv)
    w1, w2 = (xv * 2).sum(0), zv.amax(0)
    for g, w in zip(got, (w1, w2, (xv * w1).sum(0) + w2)):
        torch.testing.assert_close(g, w, equal_nan=True, rtol=1e-5, atol=1e-5)
    assert all(g[7].isnan() for g in got[1:])


def _read(t, how, i, j, n, m, sums):
    """``t`` at the point, flipped, rolled, or its row's or column's sum (a reduction kernel between the
    reader and ``t``: a column sum needs all of ``t`` first)."""
    if how in ("rowsum", "colsum"):
        if (t, how) not in sums:
            r = te.reduce_axis(m if how == "rowsum" else n, "r")
            if how == "rowsum":
                sums[t, how] = te.compute((n,), lambda a: te.sum(t[a, r], axis=r), name=f"{t.name}_rows")
            else:
                sums[t, how] = te.compute((m,), lambda b: te.sum(t[r, b], axis=r), name=f"{t.name}_cols")
        return sums[t, how][i] if how == "rowsum" else sums[t, how][j]
    return t[i, j] if how == "point" else t[i, m - 1 - j] if how == "flip" else t[i, (j + 1) % m]


def _read_ref(v, how):
    if how in ("rowsum", "colsum"):
        return v.sum(1 if how == "rowsum" else 0, keepdim=True).expand_as(v)
    return v if how == "point" else v.flip(1) if how == "flip" else v.roll(-1, 1)


@st.composite
def dags(draw):
    """Computes over one ``(n, m)`` domain, each an operation on two earlier ones (or ``x``) read at the
    point, flipped, rolled or summed along a row or a column, some heavy (stored by fusion when read
    twice), some outputs."""
    count = draw(st.integers(3, 7))
    nodes = []
    for k in range(count):
        a, b = (draw(st.integers(-1, k - 1)) for _ in range(2))
        nodes.append((a, b, draw(st.sampled_from(READS)), draw(st.sampled_from(READS)),
                      draw(st.integers(0, len(OPS) - 1)), draw(st.booleans())))  # fmt: skip
    outs = sorted({count - 1} | set(draw(st.lists(st.integers(0, count - 1), max_size=3))))
    return nodes, outs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags(), st.integers(1, 6), st.integers(1, 9))
def test_random_programs_match_torch(dag, rows, cols):
    nodes, outs = dag
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    xv = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows * 10 + cols))
    xv[0, 0] = float("nan") if rows * cols > 3 else xv[0, 0]
    made, refs, sums = [], [], {}
    for k, (a, b, ra, rb, op, heavy) in enumerate(nodes):
        ta, tb = (x if p < 0 else made[p] for p in (a, b))
        va, vb = (xv if p < 0 else refs[p] for p in (a, b))
        build, ref = OPS[op]

        def body(i, j, ta=ta, tb=tb, ra=ra, rb=rb, build=build, heavy=heavy):
            e = build(_read(ta, ra, i, j, n, m, sums), _read(tb, rb, i, j, n, m, sums))
            return _heavy(e) if heavy else e

        made.append(te.compute((n, m), body, name=f"c{k}"))
        v = ref(_read_ref(va, ra), _read_ref(vb, rb))
        refs.append(_heavy_ref(v) if heavy else v)
    f = tailjit.build([made[k] for k in outs], [x])
    got = f(xv)
    got = got if isinstance(got, tuple) else (got,)
    for g, k in zip(got, outs):
        torch.testing.assert_close(g, refs[k], equal_nan=True, rtol=1e-4, atol=1e-5)


@st.composite
def row_dags(draw):
    """Computes of shapes ``(n,)``, ``(n, 2)`` and ``(n, 4)`` (box-like), each an operation on two earlier
    ones (or ``x``, ``(n, 4)``) read in its own row at any column (its own, shifted, a constant) or in the
    next row."""
    count = draw(st.integers(3, 7))
    nodes = []
    for k in range(count):
        cols = draw(st.sampled_from([0, 2, 4]))
        srcs = [(draw(st.integers(-1, k - 1)), draw(st.integers(0, 3)), draw(st.booleans())) for _ in range(2)]
        nodes.append((cols, srcs, draw(st.integers(0, len(OPS) - 1)), draw(st.booleans())))
    outs = sorted({count - 1} | set(draw(st.lists(st.integers(0, count - 1), max_size=3))))
    return nodes, outs


def _row_read(src, src_cols, how, next_row, i, j, n):
    """``src`` read in row ``i`` (or the next one) at a column picked by ``how`` from ``j`` (None: the reader
    is 1-d); the torch reference takes the same columns."""
    row = (i + 1) % n if next_row else i
    if src_cols == 0:
        return src[row]
    col = how % src_cols if j is None else (j + how) % src_cols
    return src[row, col]


def _row_read_ref(v, src_cols, how, next_row, cols):
    v = v.roll(-1, 0) if next_row else v
    if src_cols == 0:
        return v if cols == 0 else v[:, None].expand(-1, cols)
    if cols == 0:
        return v[:, how % src_cols]
    return v[:, [(j + how) % src_cols for j in range(cols)]]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(row_dags(), st.integers(1, 9))
def test_random_row_programs_match_torch(dag, rows):
    nodes, outs = dag
    n = te.var("n")
    x = te.placeholder((n, 4), name="x")
    xv = torch.randn(rows, 4, generator=torch.Generator().manual_seed(rows))
    xv[0, 1] = float("inf")
    made, refs, shapes = [], [], []
    for k, (cols, srcs, op, heavy) in enumerate(nodes):
        picked = [(x, 4, xv) if p < 0 else (made[p], shapes[p], refs[p]) for p, _, _ in srcs]
        build, ref = OPS[op]

        def body(i, j=None, picked=picked, srcs=srcs, build=build, heavy=heavy):
            a, b = (_row_read(t, c, how, nxt, i, j, n) for (t, c, _), (_, how, nxt) in zip(picked, srcs))
            e = build(a, b)
            return _heavy(e) if heavy else e

        fn = (lambda i, body=body: body(i)) if cols == 0 else (lambda i, j, body=body: body(i, j))
        made.append(te.compute((n,) if cols == 0 else (n, cols), fn, name=f"c{k}"))
        shapes.append(cols)
        va, vb = (_row_read_ref(v, c, how, nxt, cols) for (_, c, v), (_, how, nxt) in zip(picked, srcs))
        v = ref(va, vb)
        refs.append(_heavy_ref(v) if heavy else v)
    f = tailjit.build([made[k] for k in outs], [x])
    got = f(xv)
    got = got if isinstance(got, tuple) else (got,)
    for g, k in zip(got, outs):
        torch.testing.assert_close(g, refs[k], equal_nan=True, rtol=1e-5, atol=1e-5)
