"""Row-wise kernels' code generation: quick exact division by a loop-invariant divisor,
row buffers held in the output row, and split max/min accumulators.

The quick division must give exactly the bits of a true division (IEEE, round to
nearest), including zeros' signs, infinities, NaN and subnormal results, so the
tests compare bitwise against torch's division (NaN against NaN)."""

import math
import re

import pytest
import torch

import tailjit
from tailjit import te
from tailjit.bench.core import softmax_program
from tailjit.schedule import Schedule


def _same_bits(got: torch.Tensor, want: torch.Tensor):
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan], want[~nan])
    assert torch.equal(torch.signbit(got[~nan]), torch.signbit(want[~nan]))  # -0.0 == 0.0 otherwise


def _kernel_fn(source: str) -> str:
    start = source.index("static int kern_")
    return source[start : source.index("int run_kern", start)]


def _divide_by_row_value(dtype: str):
    """y[i, j] = x[i, j] / d[i], d[i] read through a max over one column (a loop-invariant reduction)."""
    n, m, c = te.var("n"), te.var("m"), te.var("c")
    x = te.placeholder((n, m), dtype=dtype, name="x")
    d = te.placeholder((n, c), dtype=dtype, name="d")
    k = te.reduce_axis(c, "k")
    dmax = te.compute((n,), lambda i: te.max(d[i, k], axis=k), name="dmax")
    y = te.compute((n, m), lambda i, j: x[i, j] / dmax[i], name="y")
    return tailjit.build(y, [x, d], name=f"divide_{dtype}")


SPECIAL = [0.0, -0.0, 1.0, -1.0, 3.0, 0.1, math.inf, -math.inf, math.nan, 1e-45, -1e-45, 1e-40, 1.17e-38,
           3.4e38, -3.4e38, 1e30, 1e-30, 2.0**-100, 2.0**100, 1.9999999]  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_quick_division_gives_the_bits_of_true_division(dtype):
    f = _divide_by_row_value(str(dtype).split(".")[1])
    src = _kernel_fn(f.source)
    assert "tj_qdiv_" in src and "tj_fp_begin()" in src
    assert re.search(r"x_\d+\[[^]]*\] / divisor_\d+|\(x_\d+\[[^]]*\] / max_\d+\)", src)  # the fallback divides
    bits = torch.randint(-(2**31), 2**31, (4000,), dtype=torch.int64).to(torch.int32)
    random32 = bits.view(torch.float32).to(dtype)  # every exponent: subnormals, huge, inf, NaN
    scaled = torch.randn(4000, dtype=dtype) * torch.exp2(torch.randint(-140, 140, (4000,)).to(dtype))
    numerators = torch.cat([torch.tensor(SPECIAL, dtype=dtype), random32, scaled])
    divisors = SPECIAL + [1.5, -2.0, 7.0, 1.0 / 3.0, 1.9999998, 1.0000001, 1e-20, 1e20, 2.0**-126, 6.0e-39]
    rows = len(divisors)
    x = numerators.repeat(rows, 1)
    x[1::2] = x[1::2].flip(1)  # specials at the start of some rows, at the end of others
    d = torch.tensor(divisors, dtype=dtype)[:, None]
    _same_bits(f(x, d), x / d)
    # rows of ordinary values take the quick path for a whole row (no flag raised)
    x = torch.randn(64, 1000, dtype=dtype)
    d = torch.rand(64, 1, dtype=dtype) * 100 + 0.5
    _same_bits(f(x, d), x / d)
    _same_bits(f(x.t().contiguous().t(), d), x / d)  # the strided version of the loop


def test_quick_division_with_a_constant_and_a_size_divisor():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    y = te.compute((n, m), lambda i, j: x[i, j] / 3.0 + x[i, j] / m, name="y")
    f = tailjit.build(y, [x])
    assert len(re.findall(r"const float divisor_\d+ = ", _kernel_fn(f.source))) == 2
    xv = torch.randn(7, 300)
    _same_bits(f(xv), xv / 3.0 + xv / torch.tensor(300.0))


def test_divisor_read_from_a_tensor_or_under_a_select_is_divided():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    w = te.placeholder((n,), name="w")
    k = te.reduce_axis(m, "k")
    s = te.compute((n,), lambda i: te.sum(x[i, k], axis=k), name="s")
    y = te.compute((n, m), lambda i, j: x[i, j] / w[i] + te.select(j > 0, x[i, j] / s[i], 0.0), name="y")
    f = tailjit.build(y, [x, w])
    assert "tj_qdiv" not in _kernel_fn(f.source)
    xv, wv = torch.rand(5, 40) + 0.5, torch.rand(5) + 1
    want = xv / wv[:, None] + torch.where(torch.arange(40) > 0, xv / xv.sum(1, keepdim=True), 0.0)
    torch.testing.assert_close(f(xv, wv), want)


def _sqrt_over_row_max():
    """The row buffer sqrt(x) feeds a max and the output: held in the output row, and the
    quick division's fallback must fill it again."""
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    k = te.reduce_axis(m, "k")
    r = te.compute((n, m), lambda i, j: te.sqrt(x[i, j]), name="r")
    top = te.compute((n,), lambda i: te.max(r[i, k], axis=k), name="top")
    return tailjit.build(te.compute((n, m), lambda i, j: r[i, j] / top[i], name="y"), [x])


def test_row_buffer_in_the_output_row_and_the_quick_division_fallback():
    f = _sqrt_over_row_max()
    assert "r (row buffer)" in f.kernels[0].fused
    src = _kernel_fn(f.source)
    assert "malloc" not in src and re.search(r"r_row_\d+ = &y_\d+\[", src)
    fallback = src[src.index("tj_fp_end()) {") :]
    assert "sqrtf(" in fallback  # the row filled again before the true divisions
    x = torch.rand(9, 200) * 4
    x[1, 7] = 3e38  # with the tiniest value below: a subnormal quotient, underflow raised
    x[1, 8] = 1e-45
    x[2, 3] = math.inf  # x / inf: invalid raised (inf * 0)
    x[3, 5] = math.nan
    x[4] = 0.0  # 0 / 0
    x[5, :] = -1.0  # sqrt of negatives: NaN
    x[6, 0] = 1e-45
    r = torch.sqrt(x.double()).float()  # correctly rounded (torch's float sqrt need not be)
    want = r / r.amax(1, keepdim=True)
    _same_bits(f(x), want)
    _same_bits(f(x.t().contiguous().t()), want)


def test_softmax_kernel_structure():
    ins, y = softmax_program()
    f = tailjit.build(y, ins)
    src = _kernel_fn(f.source)
    assert "malloc" not in src  # exp(x - max) lives in the output row
    assert "tj_qdiv_f32(" in src
    assert "_lanes_" in src  # the row max runs on split accumulators
    x = torch.randn(37, 1001) * 30
    x[3] = -math.inf
    x[4, 5] = math.inf
    x[5, 6] = math.nan
    x[6] = torch.linspace(-200, 0, 1001)  # subnormal exponentials: the fallback path
    got, want = f(x), torch.softmax(x, 1)
    torch.testing.assert_close(got, want, equal_nan=True)


def test_row_buffer_read_at_another_index_keeps_its_own_memory():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    k = te.reduce_axis(m, "k")
    e = te.compute((n, m), lambda i, j: te.exp(x[i, j]), name="e")
    s = te.compute((n,), lambda i: te.sum(e[i, k], axis=k), name="s")
    y = te.compute((n, m), lambda i, j: e[i, m - 1 - j] / s[i], name="y")
    f = tailjit.build(y, [x])
    assert "e (row buffer)" in f.kernels[0].fused
    assert "malloc" in _kernel_fn(f.source)
    xv = torch.randn(6, 50)
    torch.testing.assert_close(f(xv), torch.softmax(xv, 1).flip(1))


def test_a_split_schedule_keeps_the_row_buffer_in_its_own_memory():
    ins, y = softmax_program()
    plain = tailjit.build(y, ins)
    sched = plain.kernels[0].schedule
    split = Schedule(order=["i", "j.o", "j.i"], splits={"j": 64}, parallel_work=sched.parallel_work)
    f = tailjit.build(y, ins, schedules={"softmax": split})
    assert "malloc" in _kernel_fn(f.source)
    x = torch.randn(11, 300)
    x[2, :150] = -1e4  # exp underflows to 0 on half the row
    _same_bits(f(x), plain(x))


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("m", [0, 1, 3, 4, 5, 17, 64, 255, 256, 257, 1000])
def test_split_max_and_min_accumulators(op, m):
    n, mv = te.var("n"), te.var("m")
    x = te.placeholder((n, mv), name="x")
    k = te.reduce_axis(mv, "k")
    f = tailjit.build(te.compute((n,), lambda i: getattr(te, op)(x[i, k], axis=k), name="r"), [x])
    assert "_lanes_" in _kernel_fn(f.source)
    xv = torch.randn(8 + m, m)
    for row in range(m):  # a NaN, then an extreme, at every position: in every lane array and in the tail
        xv[row, row] = math.nan
        xv[m + row if m + row < xv.shape[0] else row, row] = 1e30 if op == "max" else -1e30
    ref = getattr(torch, f"a{op}")
    want = ref(xv, 1) if m else torch.full((8,), -math.inf if op == "max" else math.inf)
    _same_bits(f(xv), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
@pytest.mark.parametrize("m", [0, 3, 4, 7, 300, 1023, 1024, 1025, 4099])
def test_split_sum_accumulators(dtype, m):
    n, mv = te.var("n"), te.var("m")
    x = te.placeholder((n, mv), dtype=str(dtype).split(".")[1], name="x")
    k = te.reduce_axis(mv, "k")
    f = tailjit.build(te.compute((n,), lambda i: te.sum(x[i, k], axis=k), name="s"), [x])
    assert "_lanes_" in _kernel_fn(f.source)
    xv = torch.randn(5, m, dtype=dtype) if dtype.is_floating_point else torch.randint(-9, 9, (5, m))
    if m > 3:
        xv[1, m // 2] = math.nan if dtype.is_floating_point else 2**62
    want = xv.sum(1, dtype=torch.float64).to(dtype) if dtype.is_floating_point else xv.sum(1)
    torch.testing.assert_close(f(xv), want, equal_nan=True)


def test_split_lanes_read_consecutive_vectors_and_skip_vector_math():
    """Lane array u takes the u-th vector of each group (one stream through the row); a body that
    calls vector math keeps one accumulator (the calls would spill the lanes around each call)."""
    n, mv = te.var("n"), te.var("m")
    x = te.placeholder((n, mv), name="x")
    k = te.reduce_axis(mv, "k")
    plain = _kernel_fn(tailjit.build(te.compute((n,), lambda i: te.sum(x[i, k], axis=k), name="s"), [x]).source)
    assert re.search(r"g_\d+ \* 64 \+ 16 \+ l_\d+", plain)
    k2 = te.reduce_axis(mv, "k2")
    f = tailjit.build(te.compute((n,), lambda i: te.sum(te.exp(x[i, k2]), axis=k2), name="s"), [x])
    assert "_lanes_" not in _kernel_fn(f.source)
    xv = torch.randn(3, 2000)
    torch.testing.assert_close(f(xv), xv.exp().sum(1))


def test_row_sum_of_exponentials_takes_its_own_pass():
    """The expf loop only fills the buffer: a sum riding in it would be saved and reloaded
    around every vector call."""
    ins, y = softmax_program()
    src = _kernel_fn(tailjit.build(y, ins).source)
    fill = src[: src.index("expf(")]
    assert "reduction(+" not in fill[fill.rindex("#pragma omp simd") :]
    assert re.search(r"acc_sum_\w+_lanes_\d+\[l_\d+\] \+= \(float\)e_row", src)  # its own pass, split


def test_quick_division_under_flush_denormal():
    """With denormals flushed (MXCSR FTZ/DAZ, torch.set_flush_denormal), the quick path and
    the true division flush alike."""
    f = _divide_by_row_value("float32")
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # the flag is the calling thread's
        x = torch.tensor([[1e-39, 1e-45, 3e-38, 1.0, -2e-38, 0.0] * 20] * 4)  # long enough for the quick path
        d = torch.tensor([[3.0], [1e-40], [0.5], [7e37]])
        _same_bits(f(x, d), x / d)
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)


@pytest.mark.parametrize("m", [1, 7, 8, 15, 16, 17, 63, 64, 65, 100])
def test_division_in_short_and_long_rows(m):
    """Rows shorter than QDIV_MIN divide plainly, longer ones take the quick path; the
    vector loops' remainders (gcc's epilogues, the plain reduction tails) are exact too."""
    f = _divide_by_row_value("float32")
    x = torch.randn(5, m) * torch.exp2(torch.randint(-30, 30, (5, m)).float())
    x[0, 0] = -0.0
    d = torch.tensor([[3.0], [-7.0], [1e-30], [0.0], [math.inf]])
    _same_bits(f(x, d), x / d)
    ins, y = softmax_program()
    sm = tailjit.build(y, ins)
    torch.testing.assert_close(sm(x), torch.softmax(x, 1))
