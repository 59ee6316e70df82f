"""Differential tests of every element-wise operation against PyTorch."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tailjit
from tailjit import te
from tailjit.te.expr import COMPARISONS, LOGICAL
from tailjit.te.primitives import BINARY, UNARY

#: PyTorch's function for each unary primitive of te.primitives (and the tests isnan, isinf):
#: test_unary_functions compares every entry, test_every_primitive_is_compared checks that none is missing.
TORCH_UNARY = {
    "exp": torch.exp, "log": torch.log, "log1p": torch.log1p, "expm1": torch.expm1, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "erf": torch.erf, "abs": torch.abs, "neg": torch.neg, "floor": torch.floor,
    "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc, "isnan": torch.isnan, "isinf": torch.isinf,
}  # fmt: skip

SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1e-30, 88.0, 89.0, -100.0, 1e30,
           math.inf, -math.inf, math.nan]  # fmt: skip


def _values(dtype, n=200):
    if dtype.is_floating_point:
        x = torch.cat([torch.tensor(SPECIAL, dtype=dtype), torch.randn(n, dtype=dtype) * 5])
        return x
    if dtype == torch.bool:
        return torch.tensor([True, False] * (n // 2))
    return torch.randint(-50, 50, (n,), dtype=dtype)


def assert_same(got, want, rtol=None, atol=None):
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.dtype.is_floating_point:
        tol = dict(rtol=2e-6, atol=1e-6) if want.dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
        if rtol is not None:
            tol = dict(rtol=rtol, atol=atol)
        torch.testing.assert_close(got, want, equal_nan=True, **tol)
    else:
        assert torch.equal(got, want)


def test_every_primitive_is_compared():
    assert set(TORCH_UNARY) == {*UNARY, "isnan", "isinf"}, "give a new unary primitive's torch function"
    assert set(TORCH_BINARY) == {*BINARY, *COMPARISONS, *LOGICAL}, "give a new binary primitive's torch function"


def _te_op(name: str):
    """The te function of an operation: ``te.<name>``, or the constructor for one written as an operator."""
    return getattr(te, name, None) or (lambda *xs: (te.unary if len(xs) == 1 else te.binary)(name, *xs))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64, torch.bool])
def test_unary_functions(dtype):
    n = te.var("n")
    x = te.placeholder((n,), dtype=str(dtype).removeprefix("torch."), name="x")
    names = [u for u in TORCH_UNARY if not (dtype == torch.bool and u in ("abs", "neg"))]
    outs = [te.compute((n,), lambda i, u=u: _te_op(u)(x[i]), name=f"y_{u}") for u in names]
    # integer rounding returns the input itself, not a compute: give it a compute to build
    outs = [o if not o.is_placeholder else te.compute((n,), lambda i: x[i]) for o in outs]
    f = tailjit.build(outs, [x], name=f"unary_{dtype}")
    xv = _values(dtype)
    got = f(xv)
    for u, g in zip(names, got):
        if u in ("floor", "ceil", "round", "trunc") and not dtype.is_floating_point:
            want = xv
        else:
            keeps_int = u in ("isnan", "isinf", "abs", "neg")
            xin = xv if dtype.is_floating_point or keeps_int else xv.to(torch.float32)
            want = TORCH_UNARY[u](xin)
        # libm and torch's SLEEF differ by an ulp or two on transcendentals
        assert_same(g, want, rtol=1e-5, atol=1e-6) if dtype != torch.float64 else assert_same(g, want, 1e-10, 1e-12)


#: PyTorch's function for each binary primitive of te.primitives and each comparison and logical operation
TORCH_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "truediv": torch.true_divide,
    "floordiv": torch.floor_divide, "mod": torch.remainder, "pow": torch.pow, "minimum": torch.minimum,
    "maximum": torch.maximum, "atan2": torch.atan2, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "eq": torch.eq, "ne": torch.ne, "and": torch.bitwise_and, "or": torch.bitwise_or, "xor": torch.bitwise_xor,
}  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64])
def test_binary_operations(dtype):
    n = te.var("n")
    name = str(dtype).removeprefix("torch.")
    a, b = te.placeholder((n,), dtype=name, name="a"), te.placeholder((n,), dtype=name, name="b")
    ops = [k for k in TORCH_BINARY if not (dtype.is_floating_point and k in LOGICAL)]
    outs = [te.compute((n,), lambda i, k=k: _te_op(k)(a[i], b[i]), name=f"y_{k}") for k in ops]
    f = tailjit.build(outs, [a, b], name=f"binary_{name}")
    if dtype.is_floating_point:
        av = torch.cat([torch.tensor(SPECIAL * len(SPECIAL), dtype=dtype), torch.randn(300, dtype=dtype) * 4])
        bv = torch.cat([torch.tensor(SPECIAL, dtype=dtype).repeat_interleave(len(SPECIAL)),
                        torch.randn(300, dtype=dtype) * 4])  # fmt: skip
    else:
        av = torch.randint(-20, 20, (400,), dtype=dtype)
        bv = torch.randint(-6, 6, (400,), dtype=dtype)
        bv[bv == 0] = 3  # division by zero is tested separately
    got = f(av, bv)
    for k, g in zip(ops, got):
        if k == "pow" and not dtype.is_floating_point:
            bpos = bv.abs()
            g = f(av, bpos)[ops.index("pow")]
            want = av**bpos
        else:
            want = TORCH_BINARY[k](av, bv)
        if k in ("mod", "floordiv") and dtype.is_floating_point:
            # where a / b overflows, torch's vectorised remainder loses the exact
            # fmod result (NaN); tailjit keeps fmod's exact value
            ok = torch.isfinite(av / bv) | ~torch.isfinite(av) | ~torch.isfinite(bv)
            g, want = g[ok], want[ok]
        assert_same(g, want)


def test_integer_floor_division_and_modulo_signs():
    n = te.var("n")
    a, b = te.placeholder((n,), "int64", "a"), te.placeholder((n,), "int64", "b")
    q = te.compute((n,), lambda i: a[i] // b[i], name="q")
    r = te.compute((n,), lambda i: a[i] % b[i], name="r")
    f = tailjit.build([q, r], [a, b])
    av = torch.tensor([7, -7, 7, -7, 0, 1, -1, 2**62, -(2**63)])
    bv = torch.tensor([2, 2, -2, -2, 3, -5, 5, -3, -1])
    gq, gr = f(av, bv)
    assert torch.equal(gq, torch.div(av, bv, rounding_mode="floor"))
    assert torch.equal(gr, torch.remainder(av, bv))


def test_integer_division_by_zero_raises():
    n = te.var("n")
    a, b = te.placeholder((n,), "int32", "a"), te.placeholder((n,), "int32", "b")
    f = tailjit.build(te.compute((n,), lambda i: a[i] // b[i], name="q"), [a, b])
    with pytest.raises(ZeroDivisionError, match="division or modulo by zero"):
        f(torch.tensor([1, 2], dtype=torch.int32), torch.tensor([1, 0], dtype=torch.int32))


def test_type_promotion_follows_pytorch():
    n = te.var("n")
    i32 = te.placeholder((n,), "int32", "i32")
    f32 = te.placeholder((n,), "float32", "f32")
    b = te.placeholder((n,), "bool", "b")
    cases = {
        "i32_plus_int": (lambda i: i32[i] + 3, lambda x, y, z: x + 3),
        "i32_plus_float": (lambda i: i32[i] + 0.5, lambda x, y, z: x + 0.5),
        "i32_div": (lambda i: i32[i] / 2, lambda x, y, z: x / 2),
        "f32_times_i32": (lambda i: f32[i] * i32[i], lambda x, y, z: y * x),
        "bool_plus_int": (lambda i: b[i] + 1, lambda x, y, z: z + 1),
        "bool_and": (lambda i: b[i] & (i32[i] > 0), lambda x, y, z: z & (x > 0)),
        "index_plus_i32": (lambda i: i32[i] + i, lambda x, y, z: x + torch.arange(len(x))),
        "float_literal": (lambda i: f32[i] * 0.1, lambda x, y, z: y * 0.1),
    }
    outs = [te.compute((n,), fn, name=k) for k, (fn, _) in cases.items()]
    f = tailjit.build(outs, [i32, f32, b])
    xv = torch.randint(-5, 5, (40,), dtype=torch.int32)
    yv = torch.randn(40)
    zv = torch.rand(40) > 0.5
    for (_, ref), g in zip(cases.values(), f(xv, yv, zv)):
        assert_same(g, ref(xv, yv, zv))


def test_select_cast_and_constants():
    n = te.var("n")
    x = te.placeholder((n,), "float32", "x")
    y = te.compute((n,), lambda i: te.select(te.isnan(x[i]), -1.0, te.select(x[i] > 0, x[i], 0.0)), name="y")
    c = te.compute((n,), lambda i: te.cast(x[i] * 10, "int32"), name="c")
    inf = te.compute((n,), lambda i: te.minimum(x[i], float("inf")) + float("-inf") * 0, name="inf")
    f = tailjit.build([y, c, inf], [x])
    xv = torch.tensor([1.5, -2.0, math.nan, 0.0, 3.25, math.inf])
    gy, gc, ginf = f(xv)
    assert_same(gy, torch.where(torch.isnan(xv), -1.0, torch.where(xv > 0, xv, 0.0)))
    finite = torch.isfinite(xv)
    assert torch.equal(gc[finite], (xv * 10).to(torch.int32)[finite])
    assert_same(ginf, torch.minimum(xv, torch.tensor(math.inf)) + float("-inf") * 0)


def test_strided_broadcast_and_numpy_inputs():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    b = te.placeholder((m,), name="b")
    y = te.compute((n, m), lambda i, j: x[i, j] * 2 + b[j], name="y")
    f = tailjit.build(y, [x, b])
    base = torch.randn(12, 10)
    # kernels read contiguous buffers: strided inputs are copied first; a size-1 row of a wider
    # tensor and empty tensors are contiguous whatever their strides say
    odd = (torch.randn(1, 40)[:, :10], torch.empty(0, 6).t(), base[:0, ::3])
    for xv in (base, base.t(), base[::2, 1::3], torch.randn(1, 5).expand(7, 5), base[:0], *odd):
        bv = torch.randn(xv.shape[1])
        assert_same(f(xv, bv), xv * 2 + bv)
    # numpy in, numpy out
    xn, bn = np.random.rand(3, 4).astype(np.float32), np.random.rand(4).astype(np.float32)
    got = f(xn, bn)
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, xn * 2 + bn, rtol=1e-6)
    np.testing.assert_allclose(f(xn.T.copy().T, bn), xn * 2 + bn, rtol=1e-6)


def test_out_buffers():
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: x[i] + 1, name="y")
    z = te.compute((n,), lambda i: x[i] * 3, name="z")
    f = tailjit.build([y, z], [x])
    xv = torch.randn(9)
    oy, oz = torch.empty(9), torch.empty(9)
    ry, rz = f(xv, out=(oy, oz))
    assert ry is oy and rz is oz
    assert_same(oy, xv + 1)
    assert_same(oz, xv * 3)
    # strided out, and out aliasing the input: computed aside, then copied
    big = torch.zeros(9, 2)
    f(xv, out=(big[:, 0], big[:, 1]))
    assert_same(big[:, 0].contiguous(), xv + 1)
    xv2 = xv.clone()
    f(xv2, out=(xv2, oz))
    assert_same(xv2, xv + 1)
    with pytest.raises(ValueError, match="dimension 0 must be 9, got 3"):
        f(xv, out=(torch.empty(3), torch.empty(3)))
    with pytest.raises(ValueError, match="needs 2 buffer"):
        f(xv, out=oy)


def test_empty_sizes():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    k = te.reduce_axis(m, "k")
    s = te.compute((n,), lambda i: te.sum(x[i, k], axis=k), name="s")
    mx = te.compute((n,), lambda i: te.max(x[i, k], axis=k), name="mx")
    f = tailjit.build([s, mx], [x])
    gs, gm = f(torch.empty(0, 5))
    assert gs.shape == (0,) and gm.shape == (0,)
    gs, gm = f(torch.empty(3, 0))
    assert torch.equal(gs, torch.zeros(3))
    assert torch.equal(gm, torch.full((3,), -math.inf))


def test_negated_negative_constants_compile():
    """-(c) and sigmoid(c) of a negative literal: the C must not read `--0x1p-1f` as a decrement."""
    x = te.placeholder((3,), name="x")
    y = te.compute((3,), lambda i: x[i] + te.sigmoid(te.cast(-0.5, "float32")) - (-te.cast(-2.0, "float32")), name="y")
    a = torch.randn(3)
    torch.testing.assert_close(tailjit.build(y, [x])(a), a + torch.sigmoid(torch.tensor(-0.5)) - 2.0)


@pytest.mark.parametrize("op", ["add", "sub", "mul", "floordiv", "mod", "maximum", "minimum"])
def test_integer_constants_and_table_entries_fold_as_the_kernel_computes_them(op):
    """``simplify`` folds integer arithmetic on constants (floor division and modulo, as the C does) and a
    constant table's entry at a constant index; never a division by zero or a result C would wrap."""
    from tailjit.te.autodiff import simplify
    from tailjit.te.expr import Binary, Const, binary

    big = 2**62
    for x, y in [(7, 2), (-7, 2), (7, -2), (-7, -2), (5, -1), (0, 3), (big, 3), (-(2**63), 1)]:
        e = binary(op, Const(x, te.int64), Const(y, te.int64))
        got = simplify(e, floats=False)
        want = {"add": x + y, "sub": x - y, "mul": x * y, "floordiv": x // y, "mod": x % y,
                "maximum": max(x, y), "minimum": min(x, y)}[op]  # fmt: skip
        if -(2**63) <= want < 2**63:
            assert isinstance(got, Const) and got.value == want and got.dtype == te.int64
        else:
            assert isinstance(got, Binary)
    if op in ("floordiv", "mod"):
        assert isinstance(simplify(binary(op, Const(3, te.int64), Const(0, te.int64))), Binary)
    table = te.constant([0.5, -0.0, float("nan")], name="table")
    for k, v in enumerate([0.5, -0.0, float("nan")]):
        got = simplify(table[binary(op, Const(k, te.int64), Const(0, te.int64))] if op in ("add", "sub") else table[k])
        assert isinstance(got, Const) and repr(got.value) == repr(v)
    assert not isinstance(simplify(table[Const(3, te.int64)]), Const)  # out of range: the load stays


@settings(max_examples=40, deadline=None)
@given(c=st.integers(2, 7), m=st.integers(1, 4), shift=st.integers(-9, 3), rows=st.integers(0, 6))
def test_quotient_and_remainder_of_a_scaled_sum_split(c, m, shift, rows):
    """``(x * c + j) // (c * m)`` is ``x // m`` and ``% (c * m)`` is ``(x % m) * c + j`` for ``j`` in
    ``[0, c)``, with floor semantics for a negative ``x``: the kernel computes the same values without the
    division (a reshape's index), and ``simplify`` leaves it alone when ``j`` may reach ``c``."""
    from tailjit.te.autodiff import simplify
    from tailjit.te.expr import Binary, walk

    n = te.var("n")
    d = c * m

    def body(i, j):
        flat = (i + shift) * c + j
        return flat // d * 1000 + flat % d

    y = te.compute((n, c), body, name="y")
    f = tailjit.build(y, [te.placeholder((n,), name="x")])
    i = torch.arange(rows)[:, None] + shift
    flat = i * c + torch.arange(c)[None, :]
    assert torch.equal(f(torch.zeros(rows)), flat.div(d, rounding_mode="floor") * 1000 + flat % d)
    i_ax, j_ax = y.axes
    ranges = {ax: (te.analysis.Affine.of(0), te.analysis.Affine.of(e - 1)) for ax, e in ((i_ax, 50), (j_ax, c))}
    divisions = [e for e in walk(simplify(y.body, ranges, floats=False)) if isinstance(e, Binary)
                 and e.op in ("floordiv", "mod") and getattr(e.b, "value", None) == d]  # fmt: skip
    assert not divisions
    wide = {**ranges, j_ax: (te.analysis.Affine.of(0), te.analysis.Affine.of(c))}  # j may equal c: kept
    assert any(isinstance(e, Binary) and e.op == "floordiv" for e in walk(simplify(y.body, wide, floats=False)))


def test_a_select_of_memory_its_condition_does_not_read_is_bitwise():
    """``where(cond, g[:, 3], 0)`` over boxes picks bitwise (``tj_pick``: gcc cannot move the strided load
    into a branch, which kept such loops scalar), exact for NaN, inf and -0.0; a clamp, whose sides read
    what its condition reads, stays a ternary, and a load that may be out of bounds stays inside its branch."""
    n = te.var("n")
    x, g = te.placeholder((n, 4), name="x"), te.placeholder((n, 4), name="g")
    picked = te.compute((n,), lambda i: te.select(x[i, 0] < x[i, 2], g[i, 3] + g[i, 1], 0.0), name="picked")
    clamped = te.compute((n,), lambda i: te.select(x[i, 1] < 0.0, 0.0, x[i, 1]), name="clamped")
    shifted = te.compute((n,), lambda i: te.select(i + 1 < n, g[te.minimum(i + 1, n), 0], -1.0), name="shifted")
    f = tailjit.build([picked, clamped, shifted], [x, g])
    (pick,) = [ln for ln in f.source.splitlines() if "tj_pick_f32(" in ln]  # only picked's select
    assert "picked" in pick and "clamped" not in pick and "shifted" not in pick
    gen = torch.Generator().manual_seed(0)
    xv, gv = torch.randn(37, 4, generator=gen), torch.randn(37, 4, generator=gen)
    gv[:5, 3] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0])
    gv[:5, 1] = torch.tensor([1.0, 2.0, 3.0, -0.0, -0.0])
    xv[:5, 0], xv[:5, 2] = -1.0, 1.0  # the first five take the g side
    got = f(xv, gv)
    want = (
        torch.where(xv[:, 0] < xv[:, 2], gv[:, 3] + gv[:, 1], 0.0),
        torch.where(xv[:, 1] < 0, 0.0, xv[:, 1]),
        torch.cat([gv[1:, 0], torch.tensor([-1.0])]),
    )
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, equal_nan=True, rtol=0, atol=0)
        assert torch.equal(torch.signbit(a), torch.signbit(b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exp_of_values_a_constant_puts_far_from_zero(dtype):
    """exp and sigmoid of a score masked with -inf (or a -1e9 padding) take tj_exp_far, which keeps glibc's
    vector exp off its scalar path: the values over the whole range (the shifted band, the underflow point,
    inf, NaN) stay within a few ulp of the exact ones, and zero where exp underflows."""
    n = te.var("n")
    x = te.placeholder((n,), dtype=str(dtype).removeprefix("torch."), name="x")
    m = te.placeholder((n,), dtype="bool", name="m")
    masked = te.compute((n,), lambda i: te.select(m[i], -math.inf, x[i]), name="masked")
    padded = te.compute((n,), lambda i: te.select(m[i], -1e9, x[i]), name="padded")
    outs = [
        te.compute((n,), lambda i: te.exp(masked[i]), name="e"),
        te.compute((n,), lambda i: te.sigmoid(-masked[i]), name="s"),
        te.compute((n,), lambda i: te.exp(padded[i] - 1.0), name="p"),
    ]
    f = tailjit.build(outs, [x, m], name=f"exp_far_{dtype}")
    assert f.source.count("tj_exp_far_f") >= 3 + 2  # the three calls and the prelude's two definitions
    lo, hi, edges = (
        (-120, 100, [-104, -103.97, -87.4, -87.3, -80, -79.99])
        if dtype == torch.float32
        else (-800, 720, [-746, -745.2, -745.1, -708.4, -700, -699.99])
    )
    xv = torch.cat([torch.linspace(lo, hi, 100_003, dtype=dtype), torch.tensor(SPECIAL + edges, dtype=dtype)])
    mv = torch.rand(xv.shape, generator=torch.Generator().manual_seed(0)) < 0.3
    e, s, p = f(xv, mv)
    exact = torch.exp(xv.masked_fill(mv, -math.inf).double())  # float32: rounded once, from float64
    info = torch.finfo(dtype)
    ulp = dict(rtol=4 * info.eps, atol=2 * info.smallest_normal * info.eps)  # a few ulp; subnormals absolute
    want = exact.to(dtype) if dtype == torch.float32 else torch.exp(xv.masked_fill(mv, -math.inf))
    torch.testing.assert_close(e, want, equal_nan=True, **ulp)
    assert torch.equal(e[mv], torch.zeros_like(e[mv]))
    assert_same(s, torch.sigmoid(-xv.masked_fill(mv, -math.inf)))
    torch.testing.assert_close(p, torch.exp(xv.masked_fill(mv, -1e9) - 1), equal_nan=True, **ulp)


def test_exp_of_inputs_alone_calls_the_plain_vector_exp():
    """Only values the program's constants put far from zero pay for tj_exp_far; a row max starts from -inf
    but ends on an element, so a softmax of an input keeps the plain call, and so does the exp of a clamp
    whose NaN branch passes on an input's NaN (the frontend's relu)."""
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    r = te.reduce_axis(n, "r")
    top = te.compute((), lambda: te.max(x[r], axis=r), name="top")
    e = te.compute((n,), lambda i: te.exp(x[i] - top[()]), name="e")
    relu = te.compute((n,), lambda i: te.select(x[i] < 0, 0.0, te.select(x[i] >= 0, x[i], math.nan)), name="relu")
    g = te.compute((n,), lambda i: te.exp(-relu[i]), name="g")
    f = tailjit.build([e, g], [x], name="exp_plain")
    assert "tj_exp_far_f32(" not in f.source.split("/* tailjit: kernel */", 1)[1]
    xv = torch.randn(1000)
    got_e, got_g = f(xv)
    assert_same(got_e, torch.exp(xv - xv.max()))
    assert_same(got_g, torch.exp(-xv.relu()))
