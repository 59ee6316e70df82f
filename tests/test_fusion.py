"""The fusion policy: kernel counts of representative programs, and results."""

import pytest
import torch

import tailjit
from tailjit import te
from tailjit.codegen import PRELUDE_END
from tailjit.te.graph import reachable


def softmax_te():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    k = te.reduce_axis(m, "k")
    row_max = te.compute((n,), lambda i: te.max(x[i, k], axis=k), name="row_max")
    e = te.compute((n, m), lambda i, j: te.exp(x[i, j] - row_max[i]), name="e")
    s = te.compute((n,), lambda i: te.sum(e[i, k], axis=k), name="s")
    y = te.compute((n, m), lambda i, j: e[i, j] / s[i], name="softmax")
    return x, y


def layer_norm_te(eps=1e-5):
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    g, b = te.placeholder((m,), name="g"), te.placeholder((m,), name="b")
    k = te.reduce_axis(m, "k")
    mean = te.compute((n,), lambda i: te.sum(x[i, k], axis=k) / m, name="mean")
    xc = te.compute((n, m), lambda i, j: x[i, j] - mean[i], name="xc")
    var = te.compute((n,), lambda i: te.sum(xc[i, k] * xc[i, k], axis=k) / m, name="var")
    y = te.compute((n, m), lambda i, j: xc[i, j] * te.rsqrt(var[i] + eps) * g[j] + b[j], name="layer_norm")
    return [x, g, b], y


def box_coder_te():
    """bbox2delta (Faster R-CNN): proposals and ground truth to (dx, dy, dw, dh)."""
    n = te.var("n")
    p, gt = te.placeholder((n, 4), name="proposals"), te.placeholder((n, 4), name="gt")
    pw = te.compute((n,), lambda i: p[i, 2] - p[i, 0], name="pw")
    ph = te.compute((n,), lambda i: p[i, 3] - p[i, 1], name="ph")
    px = te.compute((n,), lambda i: (p[i, 0] + p[i, 2]) * 0.5, name="px")
    py = te.compute((n,), lambda i: (p[i, 1] + p[i, 3]) * 0.5, name="py")
    gw = te.compute((n,), lambda i: gt[i, 2] - gt[i, 0], name="gw")
    gh = te.compute((n,), lambda i: gt[i, 3] - gt[i, 1], name="gh")
    gx = te.compute((n,), lambda i: (gt[i, 0] + gt[i, 2]) * 0.5, name="gx")
    gy = te.compute((n,), lambda i: (gt[i, 1] + gt[i, 3]) * 0.5, name="gy")
    d = te.compute(
        (n, 4),
        lambda i, j: te.select(
            j == 0, (gx[i] - px[i]) / pw[i],
            te.select(j == 1, (gy[i] - py[i]) / ph[i],
                      te.select(j == 2, te.log(gw[i] / pw[i]), te.log(gh[i] / ph[i])))),
        name="deltas",
    )  # fmt: skip
    return [p, gt], d


def bbox2delta_ref(p, gt):
    pw, ph = p[:, 2] - p[:, 0], p[:, 3] - p[:, 1]
    px, py = (p[:, 0] + p[:, 2]) * 0.5, (p[:, 1] + p[:, 3]) * 0.5
    gw, gh = gt[:, 2] - gt[:, 0], gt[:, 3] - gt[:, 1]
    gx, gy = (gt[:, 0] + gt[:, 2]) * 0.5, (gt[:, 1] + gt[:, 3]) * 0.5
    return torch.stack([(gx - px) / pw, (gy - py) / ph, torch.log(gw / pw), torch.log(gh / ph)], 1)


def random_boxes(n):
    xy = torch.rand(n, 2) * 100
    return torch.cat([xy, xy + 1 + torch.rand(n, 2) * 50], 1)


def chain_te(length=10):
    n = te.var("n")
    a, b = te.placeholder((n,), name="a"), te.placeholder((n,), name="b")
    prev = a
    for step in range(length):
        prev = te.compute((n,), lambda i, prev=prev, step=step: prev[i] * 1.01 + b[i] * step, name=f"s{step}")
    return [a, b], prev


def chain_ref(a, b, length=10):
    for step in range(length):
        a = a * 1.01 + b * step
    return a


def test_softmax_is_one_kernel():
    x, y = softmax_te()
    f = tailjit.build(y, [x])
    assert len(f.kernels) == 1
    # exp(x - max) is needed by the row sum and the output: computed once per row into a
    # buffer, which is the output row itself (each output element reads only its own)
    assert set(f.kernels[0].fused) == {"row_max", "e (row buffer)", "s"}
    assert "malloc" not in f.source.split(PRELUDE_END)[1].split("int run_kern")[0]
    xv = torch.randn(33, 130) * 10
    torch.testing.assert_close(f(xv), torch.softmax(xv, 1))


def test_layer_norm_is_one_kernel():
    ins, y = layer_norm_te()
    f = tailjit.build(y, ins)
    assert len(f.kernels) == 1
    xv, gv, bv = torch.randn(20, 64), torch.randn(64), torch.randn(64)
    want = torch.nn.functional.layer_norm(xv, (64,), gv, bv, 1e-5)
    torch.testing.assert_close(f(xv, gv, bv), want, rtol=1e-4, atol=1e-5)


def test_box_coder_is_one_kernel():
    ins, d = box_coder_te()
    f = tailjit.build(d, ins)
    assert len(f.kernels) == 1
    p, g = random_boxes(128), random_boxes(128)
    torch.testing.assert_close(f(p, g), bbox2delta_ref(p, g))


def test_ten_op_chain_is_one_kernel():
    ins, y = chain_te()
    f = tailjit.build(y, ins)
    assert len(f.kernels) == 1
    assert len(f.kernels[0].fused) == 9
    a, b = torch.randn(1000), torch.randn(1000)
    torch.testing.assert_close(f(a, b), chain_ref(a, b))


def test_expensive_value_reused_across_a_loop_is_materialised():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    v = te.placeholder((m,), name="v")
    ev = te.compute((m,), lambda j: te.exp(te.sin(v[j])) * te.log1p(te.abs(v[j])), name="ev")
    y = te.compute((n, m), lambda i, j: x[i, j] * ev[j], name="y")
    f = tailjit.build(y, [x, v])
    assert [k.name for k in f.kernels] == ["ev", "y"]
    assert f.kernels[0].role == "temporary"
    xv, vv = torch.randn(8, 16), torch.randn(16)
    torch.testing.assert_close(f(xv, vv), xv * (torch.exp(torch.sin(vv)) * torch.log1p(vv.abs())))


def test_temporaries_kept_between_calls_serve_any_size_and_concurrent_calls():
    """A temporary's buffer is kept for the next call: a larger call grows it, a smaller one reuses it,
    and calls running at once on threads (the GIL released) each get a buffer of their own."""
    import concurrent.futures

    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    v = te.placeholder((m,), name="v")
    ev = te.compute((m,), lambda j: te.exp(te.sin(v[j])) * te.log1p(te.abs(v[j])), name="ev")
    f = tailjit.build(te.compute((n, m), lambda i, j: x[i, j] * ev[j], name="y"), [x, v])
    assert "static const size_t tj_temp_item[] = {sizeof(float)}" in f.source  # ev is a temporary

    def check(rows, cols, seed):
        g = torch.Generator().manual_seed(seed)
        xv, vv = torch.randn(rows, cols, generator=g), torch.randn(cols, generator=g)
        torch.testing.assert_close(f(xv, vv), xv * (torch.exp(torch.sin(vv)) * torch.log1p(vv.abs())))

    for rows, cols in [(3, 5), (4, 3000), (2, 7), (1, 0), (5, 4001)]:
        check(rows, cols, rows)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # 40000+ elements: the GIL is released
        list(pool.map(lambda s: check(20, 2000 + 500 * (s % 3), s), range(24)))


def test_reused_reduce_axis_is_not_captured():
    """The same reduce axis object in producer and consumer (users do this)."""
    n = te.var("n")
    x = te.placeholder((n, n), name="x")
    k = te.reduce_axis(n, "k")
    rowsum = te.compute((n,), lambda i: te.sum(x[i, k], axis=k), name="rowsum")
    total = te.compute((), lambda: te.sum(rowsum[k] * rowsum[k], axis=k), name="total")
    f = tailjit.build(total, [x])
    xv = torch.randn(6, 6, dtype=torch.float32)
    torch.testing.assert_close(f(xv), (xv.sum(1) ** 2).sum())


def test_one_compile_serves_every_size():
    from tailjit.runtime import compiler

    ins, y = chain_te(3)
    before = len(compiler._loaded)
    f = tailjit.build(y, ins, name="sizes_reuse")
    for size in (1, 100, 12345):
        a, b = torch.randn(size), torch.randn(size)
        torch.testing.assert_close(f(a, b), chain_ref(a, b, 3))
    assert len(compiler._loaded) == before + 1
    assert f.build_info.cache == "compiled"
    assert "12345" not in f.source


def test_row_buffer_for_expensive_value_read_twice_per_row():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    k = te.reduce_axis(m, "k")
    g = te.compute((n, m), lambda i, j: te.tanh(x[i, j]) * te.exp(x[i, j] * 0.1), name="g")
    norm = te.compute((n,), lambda i: te.sqrt(te.sum(g[i, k] * g[i, k], axis=k)), name="norm")
    y = te.compute((n, m), lambda i, j: g[i, j] / (norm[i] + 1e-6), name="y")
    f = tailjit.build(y, [x])
    assert len(f.kernels) == 1 and "g (row buffer)" in f.kernels[0].fused
    torch.set_num_threads(2)
    for xv in (torch.randn(7, 13), torch.randn(300, 500).t(), torch.randn(3000, 64)):
        gv = torch.tanh(xv) * torch.exp(xv * 0.1)
        torch.testing.assert_close(f(xv), gv / (gv.norm(dim=1, keepdim=True) + 1e-6), rtol=1e-5, atol=1e-6)


def test_log_softmax_read_by_a_gather_and_a_row_mean_is_not_materialised():
    """Label-smoothed cross-entropy: log-softmax feeds a gather (one element per row) and a row mean;
    its row statistics are shared by both sites, so no (n, m) temporary is written."""
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    lab = te.placeholder((n,), dtype="int64", name="lab")
    k, j = te.reduce_axis(m, "k"), te.reduce_axis(m, "j")
    mx = te.compute((n,), lambda i: te.max(x[i, k], axis=k), name="mx")
    lse = te.compute((n,), lambda i: te.log(te.sum(te.exp(x[i, k] - mx[i]), axis=k)), name="lse")
    logp = te.compute((n, m), lambda i, c: x[i, c] - mx[i] - lse[i], name="logp")
    r = te.reduce_axis(n, "r")
    loss = te.compute((), lambda: te.sum(-0.9 * logp[r, lab[r]] - 0.1 * te.sum(logp[r, j], axis=j) / m, axis=r) / n,
                      name="loss")  # fmt: skip
    kern = tailjit.build(loss, [x, lab])
    assert len(kern.kernels) == 1
    a, t = torch.randn(7, 5), torch.randint(0, 5, (7,))
    lp = torch.log_softmax(a, 1)
    want = (-0.9 * lp.gather(1, t[:, None])[:, 0] - 0.1 * lp.mean(1)).mean()
    torch.testing.assert_close(kern(a, t), want)


def test_a_size_one_loop_is_no_reuse():
    """A chain over one-column slices (``x[:, 2::4]`` with four columns) fuses into its consumer: a loop of
    extent 1 around a load repeats nothing."""
    n = te.var("n")
    x = te.placeholder((n, 4), name="x")
    col = te.compute((n, 1), lambda i, j: x[i, 2 + j * 4], name="col")
    clamped = te.compute((n, 1), lambda i, j: te.minimum(te.maximum(col[i, 0], -4.0), 4.0), name="clamped")
    e = te.compute((n, 1), lambda i, j: te.exp(clamped[i, 0]), name="e")
    y = te.compute((n, 1), lambda i, j: e[i, 0] * x[i, 0], name="y")
    f = tailjit.build(y, [x])
    assert len(f.kernels) == 1
    xv = torch.randn(50, 4) * 3
    torch.testing.assert_close(f(xv), torch.exp(xv[:, 2:3].clamp(-4, 4)) * xv[:, :1])


def test_cheap_value_read_by_a_row_sum_and_per_element_gets_a_row_buffer():
    """log-softmax's backward (``g - exp(y) * sum(g)``) with ``g`` a few cheap operations: recomputing
    ``g`` at both sites costs more than the policy allows, but a row buffer beats a round trip of the
    whole tensor through memory."""
    n, m = te.var("n"), te.var("m")
    a, b, y = (te.placeholder((n, m), name=s) for s in "aby")
    k = te.reduce_axis(m, "k")
    g = te.compute((n, m), lambda i, j: a[i, j] / (b[i, j] + 2.0) * 0.5 - a[i, j] * 0.25, name="g")
    s = te.compute((n,), lambda i: te.sum(g[i, k], axis=k), name="s")
    out = te.compute((n, m), lambda i, j: g[i, j] - te.exp(y[i, j]) * s[i], name="out")
    f = tailjit.build(out, [a, b, y])
    assert len(f.kernels) == 1 and "g (row buffer)" in f.kernels[0].fused
    av, bv, yv = torch.randn(5, 9), torch.rand(5, 9), torch.randn(5, 9)
    gv = av / (bv + 2.0) * 0.5 - av * 0.25
    torch.testing.assert_close(f(av, bv, yv), gv - torch.exp(yv) * gv.sum(1, keepdim=True))


def test_columns_read_once_each_are_one_sweep():
    """A stack of the four columns of a computed ``(n, 4)`` tensor reads each column once: one sweep
    over it in all, so it is inlined (not buffered or materialised), and the stack is expanded into
    one loop whose strides are constants (a strided input is copied first)."""
    n = te.var("n")
    d, s = te.placeholder((n, 4), name="d"), te.placeholder((4,), name="s")
    den = te.compute((n, 4), lambda i, j: d[i, j] * s[j] + s[j] * 0.5 - d[i, j] / 3.0, name="den")

    def body(i, j):
        v = te.select(j == 3, te.exp(den[i, 3]), 0.0)
        for c in (2, 1, 0):
            v = te.select(j == c, te.exp(den[i, c]) if c % 2 else den[i, c] * 2.0, v)
        return v

    out = te.compute((n, 4), body, name="out")
    f = tailjit.build(out, [d, s])
    assert len(f.kernels) == 1 and "den" in f.kernels[0].fused
    kernel = f.source[f.source.index("static int kern_") : f.source.index("int run_kern_")]
    assert kernel.count("expf(") == 2  # columns 1 and 3, written once
    dv, sv = torch.randn(9, 4), torch.randn(4)
    den_v = dv * sv + sv * 0.5 - dv / 3.0
    want = torch.stack([den_v[:, 0] * 2, den_v[:, 1].exp(), den_v[:, 2] * 2, den_v[:, 3].exp()], 1)
    torch.testing.assert_close(f(dv, sv), want)
    torch.testing.assert_close(f(dv.t().contiguous().t(), sv), want)


@pytest.mark.parametrize("bounded", [True, False])
def test_halves_read_under_their_selects_are_one_sweep(bounded):
    """Rotate-half's gradient (``cat((-g[..., 32:], g[..., :32]))`` as two selects): each select reads
    one half of ``g``, so the two together sweep it once and ``g`` is inlined; before, it counted as two
    sweeps and became a row buffer, which kept the kernel from sharing a loop nest.  Selects on data
    bound nothing: there each site may read all of ``g``, and the row buffer stays."""
    n = te.var("n")
    a, b = te.placeholder((n, 64), name="a"), te.placeholder((n, 64), name="b")
    g = te.compute((n, 64), lambda i, j: (a[i, j] * b[i, j] + a[i, j]) * (a[i, j] - b[i, j] * 0.25), name="g")

    def body(i, j):
        if bounded:
            return te.select(j < 32, -g[i, j + 32], g[i, j - 32])
        return te.select(a[i, j] > 0, -g[i, 63 - j], g[i, j])

    y = te.compute((n, 64), body, name="y")
    f = tailjit.build(y, [a, b])
    assert len(f.kernels) == 1
    assert ("g (row buffer)" in f.kernels[0].fused) is not bounded, f.kernels[0].fused
    av, bv = torch.randn(5, 64), torch.randn(5, 64)
    gv = (av * bv + av) * (av - bv * 0.25)
    if bounded:
        want = torch.cat([-gv[:, 32:], gv[:, :32]], 1)
    else:
        want = torch.where(av > 0, -gv.flip(1), gv)
    torch.testing.assert_close(f(av, bv), want)


def test_rows_of_an_unrolled_loop_fold_their_constant_selects():
    """A Python loop writing row ``k`` at step ``k`` (``out[seg] = ...`` in ``segment_mean``) has a
    gradient that zeroes one row per step: ``g_k = select(i == k, 0, g_{k-1})``, read at row ``k + 1``.
    Inlined there, each condition compares two constants and folds, only the taken branch walked; before,
    every row kept the whole chain (``select(92 == 93, 0, select(92 == 94, ...))``), and partitioning
    segment_mean's backward (100 steps) took 35 s."""
    m = te.var("m")
    x = te.placeholder((8, m), name="x")
    g = te.compute((8, m), lambda i, j: x[i, j] * 3.0, name="g0")
    rows = []
    for k in range(8):
        rows.append(te.compute((m,), lambda j, g=g, k=k: g[k, j] / 2.0, name=f"row{k}"))
        g = te.compute((8, m), lambda i, j, g=g, k=k: te.select(i == k, 0.0, g[i, j]), name=f"g{k + 1}")
    f = tailjit.build(rows, [x])
    for k in f.kernels:
        assert "select" not in k.body, (k.name, k.body)
    xv = torch.randn(8, 5)
    for k, got in enumerate(f(xv)):
        torch.testing.assert_close(got, xv[k] * 1.5)


def test_views_of_an_input_cost_what_they_read():
    """A slice of an unsqueezed input, read again for every column of the consumer, is a load with
    composed indices: inlined, not a temporary (pairwise IoU's ``boxes1[:, None, 2:]``)."""
    n, m = te.var("n"), te.var("m")
    a, b = te.placeholder((n, 4), name="a"), te.placeholder((m, 4), name="b")
    ua = te.compute((n, 1, 4), lambda i, z, k: a[i, k], name="ua")
    sa = te.compute((n, 1, 2), lambda i, z, k: ua[i, z, k + 2], name="sa")
    ub = te.compute((1, m, 4), lambda z, j, k: b[j, k], name="ub")
    sb = te.compute((1, m, 2), lambda z, j, k: ub[z, j, k + 2], name="sb")
    rb = te.compute((n, m, 2), lambda i, j, k: te.minimum(sa[i, 0, k], sb[0, j, k]), name="rb")
    f = tailjit.build(rb, [a, b])
    assert [k.name for k in f.kernels] == ["rb"]
    av, bv = torch.randn(7, 4), torch.randn(5, 4)
    assert torch.equal(f(av, bv), torch.minimum(av[:, None, 2:], bv[None, :, 2:]))


def test_a_second_look_inlines_what_a_materialised_producer_made_cheap():
    """``g`` selects over an expensive ``h`` that ends up stored; ``g`` is read by a sum down the rows
    and a sum along them.  Decided while ``h`` still counted as inlined, ``g`` looked expensive; over
    the stored ``h`` it is a select and a halving, inlined into both sums."""
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    h = te.compute((n, m), lambda i, j: te.exp(te.sin(x[i, j])) * te.log1p(te.abs(x[i, j])), name="h")
    g = te.compute((n, m), lambda i, j: te.select(x[i, j] > 0, h[i, j] / 2.0, -h[i, j]), name="g")
    r, c = te.reduce_axis(n, "r"), te.reduce_axis(m, "c")
    down = te.compute((m,), lambda j: te.sum(g[r, j], axis=r), name="down")
    along = te.compute((n,), lambda i: te.sum(g[i, c], axis=c), name="along")
    twice = te.compute((n, m), lambda i, j: h[i, j] * h[i, j] + 1.0, name="twice")
    f = tailjit.build([down, along, twice], [x])
    stored = [k.name for k in f.kernels] + [n for k in f.kernels for n, store, *_ in k.merged if store]
    assert "h" in stored and "g" not in stored  # h shares twice's loop nest (tailjit.loop_merge)
    xv = torch.randn(9, 6)
    hv = torch.exp(torch.sin(xv)) * torch.log1p(xv.abs())
    gv = torch.where(xv > 0, hv / 2.0, -hv)
    for got, want in zip(f(xv), (gv.sum(0), gv.sum(1), hv * hv + 1.0)):
        torch.testing.assert_close(got, want)


def test_no_row_buffer_of_a_few_static_elements():
    """A box gradient: an expensive ``(n, 2)`` value read twice per element of an ``(n, 4)`` output that
    picks its columns by index.  A 2-element row buffer would keep the output's 4-column loop from being
    written out (and the rows from being vectorised); the value becomes a temporary instead."""
    n = te.var("n")
    x = te.placeholder((n, 4), name="x")
    w = te.compute((n, 2), lambda i, j: te.exp(x[i, j + 2] - x[i, j]) + te.tanh(x[i, j]), name="w")

    def pick(i, j):  # a select_scatter and two slice_scatters: the columns of a box gradient
        return te.select(j == 0, w[i, 0] * w[i, 1], te.select(j >= 2, w[i, j - 2] * 2.0, w[i, j] - 1.0))

    y = te.compute((n, 4), pick, name="y")
    f = tailjit.build(y, [x])
    assert not any("row buffer" in name for k in f.kernels for name in k.fused), [k.fused for k in f.kernels]
    assert f.kernels[-1].schedule.expand
    xv = torch.randn(37, 4)
    wv = torch.exp(xv[:, 2:] - xv[:, :2]) + torch.tanh(xv[:, :2])
    want = torch.cat([wv[:, :1] * wv[:, 1:], wv[:, 1:] - 1, wv * 2], 1)
    torch.testing.assert_close(f(xv), want)


def softmax_stats_te():
    """The softmax, its row sums and its row maxima, as outputs."""
    x, y = softmax_te()
    made = {t.name: t for t in reachable([y])}
    return x, [y, made["s"], made["row_max"]]


def test_output_reductions_are_side_outputs_of_their_reader():
    """A softmax asked for its row sum and maximum too is still one loop nest: the kernel stores each
    row's statistics where it computes them."""
    x, outs = softmax_stats_te()
    f = tailjit.build(outs, [x])
    assert len(f.kernels) == 1
    assert "also writes 's', 'row_max'" in f.kernels[0].role
    xv = torch.randn(37, 130) * 10
    xv[3, 5], xv[4, :] = float("nan"), float("-inf")
    xv[5, 7] = float("inf")
    y, s, mx = f(xv)
    torch.testing.assert_close(y, torch.softmax(xv, 1), equal_nan=True)
    torch.testing.assert_close(mx, xv.amax(1), equal_nan=True)
    torch.testing.assert_close(s, torch.exp(xv - xv.amax(1, keepdim=True)).sum(1), equal_nan=True)
    for shape in [(0, 5), (4, 0), (1, 1)]:  # an empty row's sum is 0 and its maximum -inf, as in torch
        xv = torch.randn(shape)
        _, s, mx = f(xv)
        assert s.shape == mx.shape == (shape[0],)
        if shape[0]:
            torch.testing.assert_close(s, torch.exp(xv - xv.amax(1, keepdim=True)).sum(1) if shape[1] else s * 0)
            if shape[1]:
                torch.testing.assert_close(mx, xv.amax(1))


def test_layer_norm_statistics_are_side_outputs():
    ins, y = layer_norm_te()
    mean, var = (next(t for t in reachable([y]) if t.name == name) for name in ("mean", "var"))
    f = tailjit.build([y, mean, var], ins)
    assert len(f.kernels) == 1
    xv, gv, bv = (
        torch.randn(20, 64, dtype=torch.float64),
        torch.randn(64, dtype=torch.float64),
        torch.randn(64, dtype=torch.float64),
    )
    got = f(xv.float(), gv.float(), bv.float())
    torch.testing.assert_close(got[1], xv.float().mean(1))
    torch.testing.assert_close(got[2], xv.float().var(1, unbiased=False), rtol=1e-4, atol=1e-6)


def test_a_side_output_read_by_two_kernels_gets_its_own():
    """A reduction read by two loop nests cannot be written by one of them: a kernel of its own."""
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    k = te.reduce_axis(m, "k")
    s = te.compute((n,), lambda i: te.sum(x[i, k], axis=k), name="s")
    a = te.compute((n, m), lambda i, j: x[i, j] - s[i], name="a")
    b = te.compute((m, n), lambda j, i: x[i, j] * s[i], name="b")
    f = tailjit.build([a, b, s], [x])
    assert [k.name for k in f.kernels] == ["s", "a", "b"]
    xv = torch.randn(5, 6)
    ga, gb, gs = f(xv)
    torch.testing.assert_close(gs, xv.sum(1))
    torch.testing.assert_close(gb, (xv * xv.sum(1, keepdim=True)).t())


def test_a_schedule_must_compute_side_outputs_outside_the_innermost_loop():
    from tailjit.schedule import Schedule

    x, outs = softmax_stats_te()
    with pytest.raises(te.TEError, match="also writes.*innermost loop 'i' must be another one"):
        tailjit.build(outs, [x], schedules={"softmax": Schedule(order=["j", "i"])})
    f = tailjit.build(outs, [x], schedules={"softmax": Schedule(order=["i.o", "i.i", "j"], splits={"i": 4})})
    xv = torch.randn(10, 7)
    y, s, mx = f(xv)
    torch.testing.assert_close(mx, xv.amax(1))
    torch.testing.assert_close(y, torch.softmax(xv, 1))


def test_a_keepdim_reduction_is_a_side_output():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    k = te.reduce_axis(m, "k")
    s = te.compute((n, 1), lambda i, z: te.sum(x[i, k] * x[i, k], axis=k), name="sq")
    y = te.compute((n, m), lambda i, j: x[i, j] * te.rsqrt(s[i, 0] + 1e-6), name="y")
    f = tailjit.build([y, s], [x])
    assert len(f.kernels) == 1
    xv = torch.randn(6, 33)
    gy, gs = f(xv)
    torch.testing.assert_close(gs, (xv * xv).sum(1, keepdim=True))
    torch.testing.assert_close(gy, xv * torch.rsqrt(gs + 1e-6))


def test_row_statistics_inside_a_scalars_reduction_are_side_outputs():
    """A loss's kernel computes each row's maximum and sum inside its mean over rows: that loop stores
    them (a short static loop is written out instead, and then they get kernels of their own)."""
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    k, r = te.reduce_axis(m, "k"), te.reduce_axis(n, "r")
    mx = te.compute((n, 1), lambda i, z: te.max(x[i, k], axis=k), name="mx")
    s = te.compute((n, 1), lambda i, z: te.sum(te.exp(x[i, k] - mx[i, 0]), axis=k), name="s")
    loss = te.compute((), lambda: te.sum(te.log(s[r, 0]) + mx[r, 0] - x[r, 0], axis=r) / n, name="loss")
    f = tailjit.build([loss, mx, s], [x])
    assert len(f.kernels) == 1 and "also writes 's', 'mx'" in f.kernels[0].role
    xv = torch.randn(37, 9)
    xv[2, 3], xv[4, :] = float("inf"), float("-inf")
    got_loss, got_mx, got_s = f(xv)
    torch.testing.assert_close(got_mx, xv.amax(1, keepdim=True))
    torch.testing.assert_close(got_s, torch.exp(xv - got_mx).sum(1, keepdim=True), equal_nan=True)
    torch.testing.assert_close(got_loss, (torch.logsumexp(xv, 1) - xv[:, 0]).mean(), equal_nan=True)
    xv = torch.randn(0, 3)
    got_loss, got_mx, got_s = f(xv)
    assert got_mx.shape == got_s.shape == (0, 1)


@pytest.mark.parametrize("fields", [3, 39])
def test_column_sums_read_by_a_reduction_over_their_columns_get_kernels(fields):
    """fm's ``((x.sum(1) ** 2) - (x * x).sum(1)).sum(1)`` over ``(b, f, k)``: inlined, each column sum
    would run a column at a time inside the sum over ``k``, striding through ``x``; materialised, the
    code generator accumulates blocks of columns.  Sums short enough to be written out stay inlined."""
    b, f, k = te.var("b"), fields, te.var("k")
    x = te.placeholder((b, f, k), name="x")
    r, c = te.reduce_axis(f, "r"), te.reduce_axis(k, "c")
    s = te.compute((b, k), lambda i, j: te.sum(x[i, r, j], axis=r), name="s")
    q = te.compute((b, k), lambda i, j: te.sum(x[i, r, j] * x[i, r, j], axis=r), name="q")
    y = te.compute((b,), lambda i: te.sum(s[i, c] * s[i, c] - q[i, c], axis=c) * 0.5, name="fm")
    fn = tailjit.build(y, [x])
    assert (len(fn.kernels) == 3) == (fields > 8)
    assert ("jb_" in fn.source) == (fields > 8)
    for shape in ((5, fields, 16), (3, fields, 70), (0, fields, 4), (2, fields, 0)):
        xv = torch.randn(shape)
        if xv.numel() > 20:
            xv[1, 2, 3] = float("nan")
        want = 0.5 * (xv.sum(1) ** 2 - (xv * xv).sum(1)).sum(1)
        torch.testing.assert_close(fn(xv), want, equal_nan=True, rtol=1e-5, atol=1e-5)
