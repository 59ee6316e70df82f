"""te.gradient and differentiable built kernels, against torch autograd and finite differences.

Each test builds few kernels (a C compile costs ~0.3-0.9 s here): the adjoint
rules of all unary functions are the outputs of one program, the binary ones
of another, and so on.  ``check`` compares the values and the gradients
(for random output gradients) with torch autograd on the equivalent torch
expression, then runs ``torch.autograd.gradcheck`` in float64 on the built
kernel, whose backward is the compiled gradient.
"""

import math

import pytest
import torch
from autodiff_ops import CATALOGUE, SCATTER_CATALOGUE, layer_norm_program, matmul_program, softmax_program
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tailjit
from tailjit import te
from tailjit.te import primitives
from tailjit.te.expr import Reduce, walk

F64 = torch.float64


def check(kernel, args, reference, gradcheck=True, atol=1e-7):
    """Values and gradients of ``kernel`` match ``reference`` (torch) on ``args``; gradcheck passes."""
    args = [a.detach().requires_grad_(a.dtype.is_floating_point) for a in args]
    got = kernel(*args)
    want = reference(*args)
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w.to(g.dtype), atol=atol, rtol=1e-6, equal_nan=True)
    diff = [a for a in args if a.requires_grad]
    pairs = [(g, w) for g, w in zip(got, want) if g.dtype.is_floating_point]
    heads = [torch.randn_like(g) for g, _ in pairs]
    gg = torch.autograd.grad([g for g, _ in pairs], diff, heads, allow_unused=True)
    gw = torch.autograd.grad([w for _, w in pairs], diff, heads, allow_unused=True)
    for a, g, w in zip(diff, gg, gw):
        torch.testing.assert_close(g, torch.zeros_like(a) if w is None else w, atol=atol, rtol=1e-6, equal_nan=True)
    if gradcheck:
        assert torch.autograd.gradcheck(lambda *a: kernel(*a), diff if len(diff) == len(args) else args)
    return gg


def vec(name="x", dtype="float64"):
    n = te.var("n")
    return n, te.placeholder((n,), dtype, name)


# -- adjoint rules -----------------------------------------------------------------------------------

#: Each primitive of te.primitives under its name (``test_every_primitive_is_differentiated``), in a
#: domain where torch's gradient is defined, and compositions.
UNARY = {
    "neg": (lambda a: -a, torch.neg),
    "exp": (te.exp, torch.exp),
    "log": (te.log, torch.log),
    "log1p": (te.log1p, torch.log1p),
    "expm1": (te.expm1, torch.expm1),
    "sqrt": (te.sqrt, torch.sqrt),
    "rsqrt": (te.rsqrt, torch.rsqrt),
    "sin": (te.sin, torch.sin),
    "cos": (te.cos, torch.cos),
    "tan": (te.tan, torch.tan),
    "tanh": (te.tanh, torch.tanh),
    "sigmoid": (te.sigmoid, torch.sigmoid),
    "erf": (te.erf, torch.erf),
    "abs": (lambda a: te.abs(a - 0.55), lambda a: torch.abs(a - 0.55)),
    "floor": (lambda a: te.floor(a * 3), lambda a: torch.floor(a * 3)),
    "ceil": (lambda a: te.ceil(a * 3), lambda a: torch.ceil(a * 3)),
    "round": (lambda a: te.round(a * 3), lambda a: torch.round(a * 3)),
    "trunc": (lambda a: te.trunc(a * 3 - 1), lambda a: torch.trunc(a * 3 - 1)),
    "pow2": (lambda a: a**2, lambda a: a**2),
    "pow_half": (lambda a: a**0.5, lambda a: a**0.5),
    "pow3": (lambda a: te.pow(a, 3.0), lambda a: torch.pow(a, 3.0)),
    "pow0": (lambda a: a**0.0 + a, lambda a: a**0.0 + a),
    "exp2": (lambda a: 2.0**a, lambda a: 2.0**a),
    "chain": (
        lambda a: te.tanh(te.exp(a) * te.sin(a)) / (1 + a * a),
        lambda a: torch.tanh(a.exp() * a.sin()) / (1 + a * a),
    ),
    "via_int": (lambda a: te.cast(te.cast(a * 10, "int64"), "float64") * a, lambda a: (a * 10).long().double() * a),
}


def test_unary_rules():
    n, x = vec()
    outs = [te.compute((n,), lambda i, f=f: f(x[i]), name=name) for name, (f, _) in UNARY.items()]
    k = tailjit.build(outs, [x])
    xv = torch.rand(9, dtype=F64) * 0.6 + 0.2  # inside every domain, away from 0.55 and the rounding steps
    check(k, [xv], lambda a: tuple(t(a) for _, t in UNARY.values()))


BINARY = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "truediv": (lambda a, b: a / b, lambda a, b: a / b),
    "floordiv": (lambda a, b: a // b, lambda a, b: torch.div(a, b, rounding_mode="floor")),
    "pow": (te.pow, torch.pow),
    "maximum": (te.maximum, torch.maximum),
    "minimum": (te.minimum, torch.minimum),
    "atan2": (te.atan2, torch.atan2),
    "mod": (lambda a, b: a % b, torch.remainder),
    "select": (lambda a, b: te.select(a > b, a * a, b * 3), lambda a, b: torch.where(a > b, a * a, b * 3)),
    "select_int_cond": (
        lambda a, b: te.select(te.cast(a * 4, "int64") % 2 == 0, a, b),
        lambda a, b: torch.where((a * 4).long() % 2 == 0, a, b),
    ),
    "both": (lambda a, b: te.exp(a * b) - te.log(a) / b, lambda a, b: torch.exp(a * b) - torch.log(a) / b),
}


def test_binary_rules():
    n, a = vec("a")
    b = te.placeholder((n,), "float64", "b")
    outs = [te.compute((n,), lambda i, f=f: f(a[i], b[i]), name=name) for name, (f, _) in BINARY.items()]
    k = tailjit.build(outs, [a, b])
    av = torch.rand(11, dtype=F64) + 0.5
    bv = torch.rand(11, dtype=F64) * 1.5 + 0.3
    check(k, [av, bv], lambda x, y: tuple(t(x, y) for _, t in BINARY.values()))


def test_every_primitive_is_differentiated():
    assert set(UNARY) >= set(primitives.UNARY), "give a new unary primitive an entry in UNARY"
    assert set(BINARY) >= set(primitives.BINARY), "give a new binary primitive an entry in BINARY"


def test_float_casts_and_mixed_precision():
    n, x = vec()
    y = te.placeholder((n,), "float32", "y")
    out = te.compute((n,), lambda i: te.cast(te.cast(x[i], "float32") * y[i], "float64") + x[i] * y[i], name="out")
    k = tailjit.build(out, [x, y])
    xv, yv = torch.randn(7, dtype=F64), torch.randn(7)
    gx, gy = check(k, [xv, yv], lambda a, b: (a.float() * b).double() + a * b, gradcheck=False, atol=1e-5)
    assert gx.dtype == F64 and gy.dtype == torch.float32


def test_reduction_rules():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), "float64", "x")
    k, k2 = te.reduce_axis(m, "k"), te.reduce_axis(m, "k2")
    outs = [
        te.compute((n,), lambda i: te.sum(x[i, k] * x[i, k], axis=k), name="sum"),
        te.compute((n,), lambda i: te.max(te.sin(x[i, k]), axis=k), name="max"),
        te.compute((n,), lambda i: te.min(x[i, k], axis=k) * 2, name="min"),
        te.compute((n,), lambda i: te.prod(x[i, k], axis=k), name="prod"),
        te.compute((n, m), lambda i, j: x[i, j] * te.cast(te.argmax(x[i, k], axis=k), "float64"), name="argmax"),
        # a reduction inside an expression, over an expression with another reduction
        te.compute(
            (n, m), lambda i, j: x[i, j] / te.sum(te.exp(x[i, k] - te.max(x[i, k2], axis=k2)), axis=k), name="nest"
        ),
    ]
    kern = tailjit.build(outs, [x])

    def ref(a):
        return (
            (a * a).sum(1),
            a.sin().amax(1),
            a.amin(1) * 2,
            a.prod(1),
            a * a.argmax(1, keepdim=True).double(),
            a / (a - a.amax(1, keepdim=True)).exp().sum(1, keepdim=True),
        )

    check(kern, [torch.randn(4, 6, dtype=F64)], ref)


def test_ties_nan_and_edges_match_torch():
    """Where the formula defines them, torch's special values: ties split evenly, NaN rows,
    sqrt'(0) = inf, abs'(0) = 0, maximum of equal operands 0.5 / 0.5, prod with zeros."""
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), "float64", "x")
    k = te.reduce_axis(m, "k")
    outs = [
        te.compute((n,), lambda i: te.max(x[i, k], axis=k), name="amax"),
        te.compute((n,), lambda i: te.min(x[i, k], axis=k), name="amin"),
        te.compute((n,), lambda i: te.prod(x[i, k], axis=k), name="prod"),
        te.compute((n, m), lambda i, j: te.sqrt(x[i, j]), name="sqrt"),
        te.compute((n, m), lambda i, j: te.abs(x[i, j]), name="abs"),
        te.compute((n, m), lambda i, j: te.maximum(x[i, j], x[i, 0]), name="maximum"),
        te.compute((n, m), lambda i, j: te.minimum(x[i, j], x[i, 0]) * 3, name="minimum"),
    ]
    kern = tailjit.build(outs, [x])
    xv = torch.tensor(
        [[1.0, 3.0, 3.0, -2.0], [0.0, 0.0, 5.0, 5.0], [2.0, math.nan, 1.0, 0.0], [-1.0, -1.0, -1.0, 0.0]], dtype=F64
    )

    def ref(a):
        return (a.amax(1), a.amin(1), a.prod(1), a.sqrt(), a.abs(), torch.maximum(a, a[:, :1]),
                torch.minimum(a, a[:, :1]) * 3)  # fmt: skip

    gx = check(kern, [xv], ref, gradcheck=False)[0]
    assert torch.isinf(gx[1, 0]) and torch.isnan(gx[2]).all()


def test_an_extreme_kept_along_an_axis_it_does_not_read():
    """``amax(x, -1, keepdim=True)`` as a compute: its stored element ``y[i, j, 0]`` is read back at
    the kept axis's first position (it was an index variable of another compute in the gradient)."""
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), "float64", "x")
    k = te.reduce_axis(m, "k")
    outs = [
        te.compute((n, 1), lambda i, c: te.max(x[i, k], axis=k), name="amax"),
        te.compute((1, n), lambda c, i: te.min(x[i, k] * 2.0, axis=k), name="amin"),
    ]
    xv = torch.tensor([[1.0, 3.0, 3.0, -2.0], [0.0, 0.0, 5.0, 5.0], [2.0, -1.0, 1.0, 0.0]], dtype=F64)
    check(tailjit.build(outs, [x]), [xv], lambda a: (a.amax(1, keepdim=True), (a * 2).amin(1)[None]), gradcheck=False)


# -- load adjoints --------------------------------------------------------------------------------------


def grad_body(out, wrt, head=True):
    """The gradient's compute (for structure checks)."""
    h = te.placeholder(out.shape, out.dtype, "h") if head else None
    return te.gradient(out, wrt, h)[0]


def reduces(t) -> int:
    return sum(isinstance(e, Reduce) for e in walk(t.body))


def test_invertible_maps_are_gathers():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), "float64", "x")
    outs = [
        te.compute((n, m), lambda i, j: te.select(j + 1 < m, x[i, j + 1], 0.0), name="shift"),
        te.compute((n, m), lambda i, j: x[n - 1 - i, j] * 2, name="flip"),
        te.compute((m, n), lambda j, i: x[i, j] * x[i, j], name="transpose"),
        te.compute((n, m - 2), lambda i, j: x[i, j + 2] - x[i, j], name="diff2"),
    ]
    for o in outs:  # each gradient reads the output gradient at one place: no reduction, no scatter
        assert reduces(grad_body(o, x)) == 0, o.name
    k = tailjit.build(outs, [x])
    ref = (
        lambda a: (  # noqa: E731
            torch.cat([a[:, 1:], torch.zeros_like(a[:, :1])], 1),
            a.flip(0) * 2,
            (a * a).t(),
            a[:, 2:] - a[:, :-2],
        )
    )
    check(k, [torch.randn(4, 5, dtype=F64)], ref)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    extents=st.lists(st.integers(2, 4), min_size=2, max_size=3),
    gaps=st.lists(st.integers(0, 2), min_size=3, max_size=3),
    offset=st.integers(0, 3),
    reverse=st.booleans(),
)
def test_flattening_loads_are_gathers(extents, gaps, offset, reverse):
    # y[i, j, ...] = x[c0 * i + c1 * j + ... + offset], each coefficient at least the span below it (a
    # reshape when the gaps are 0, a padded row layout otherwise): each position of x is read at most
    # once, so its gradient reads dy at one place, its digits j // c, j % c, instead of summing over rows.
    coefs = [1]
    for e, gap in zip(reversed(extents[1:]), gaps):
        coefs.insert(0, coefs[0] * e + gap)
    size = sum(c * (e - 1) for c, e in zip(coefs, extents)) + offset + 1 + gaps[-1]
    x = te.placeholder((size,), "float64", "x")

    def at(*ix):
        flat = sum(c * i for c, i in zip(coefs, ix)) + offset
        return x[size - 1 - flat] if reverse else x[flat]

    y = te.compute(tuple(extents), lambda *ix: at(*ix) * 3.0, name="y")
    assert reduces(grad_body(y, x)) == 0
    index = torch.zeros(extents, dtype=torch.int64) + offset
    for d, c in enumerate(coefs):
        index += c * torch.arange(extents[d]).view([-1 if k == d else 1 for k in range(len(extents))])
    index = size - 1 - index if reverse else index
    check(tailjit.build(y, [x]), [torch.randn(size, dtype=F64)], lambda a: a[index] * 3.0)


def test_permutation_and_diagonal():
    a, b, c = te.var("a"), te.var("b"), te.var("c")
    x = te.placeholder((a, b, c), "float64", "x")
    sq = te.placeholder((a, a), "float64", "sq")
    outs = [
        te.compute((c, a, b), lambda k, i, j: te.sin(x[i, j, k]), name="permute"),
        te.compute((a,), lambda i: sq[i, i] * sq[i, i], name="diag"),
    ]
    assert reduces(grad_body(outs[0], x)) == 0 and reduces(grad_body(outs[1], sq)) == 0
    k = tailjit.build(outs, [x, sq])
    check(k, [torch.randn(2, 3, 4, dtype=F64), torch.randn(2, 2, dtype=F64)],
          lambda u, v: (u.permute(2, 0, 1).sin(), v.diagonal() ** 2))  # fmt: skip


def test_broadcast_and_reduced_loads_sum():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), "float64", "x")
    row, col = te.placeholder((n,), "float64", "row"), te.placeholder((m,), "float64", "col")
    k = te.reduce_axis(m, "k")
    outs = [
        te.compute((n, m), lambda i, j: x[i, j] * row[i] + col[j], name="bcast"),
        te.compute((n,), lambda i: te.sum(x[i, k] * col[k], axis=k), name="matvec"),
        te.compute((n, m), lambda i, j: te.exp(row[i] - col[j]), name="outer"),
    ]
    assert reduces(grad_body(outs[0], row)) == 1 and reduces(grad_body(outs[0], col)) == 1
    kern = tailjit.build(outs, [x, row, col])
    check(kern, [torch.randn(3, 5, dtype=F64), torch.randn(3, dtype=F64), torch.randn(5, dtype=F64)],
          lambda a, r, c: (a * r[:, None] + c, a @ c, (r[:, None] - c).exp()))  # fmt: skip


def test_broadcast_load_at_an_offset_keeps_its_guard_inside_the_sum():
    # bias[h + j] read by every row: dbias[k] sums dy[:, k - h] under the guard h <= k < 2h. The
    # code generator evaluates a sum before the selects around it, so the guard must sit inside
    # the sum; outside it, the call failed with "can fall outside [0, h)" (an LSTM's gate bias).
    n, h, m = te.var("n"), te.var("h"), te.var("m")
    bias, c = te.placeholder((m,), "float64", "bias"), te.placeholder((n, h), "float64", "c")
    y = te.compute((n, h), lambda i, j: c[i, j] * bias[h + j] + bias[j], name="y")
    kern = tailjit.build(y, [bias, c])
    check(kern, [torch.randn(7, dtype=F64), torch.randn(4, 3, dtype=F64)], lambda b, x: x * b[3:6] + b[:3])


def test_no_head_is_the_gradient_of_the_sum():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), "float64", "x")
    y = te.compute((n, m, 3), lambda i, j, c: x[i, j] * (c + 1), name="y")
    (g,) = te.gradient(y, x)  # the sum over c of (c + 1): folded, no head tensor
    f = tailjit.build(g, [x])
    torch.testing.assert_close(f(torch.randn(2, 3, dtype=F64)), torch.full((2, 3), 6.0, dtype=F64))


def test_strided_windowed_and_coarse_maps():
    n = te.var("n")
    x = te.placeholder((n,), "float64", "x")
    r = te.reduce_axis(3, "r")
    outs = [
        te.compute((n // 2,), lambda i: x[2 * i] * x[2 * i + 1], name="even_odd"),
        te.compute(((n - 3) // 2 + 1,), lambda i: te.sum(x[2 * i + r] * (r + 1), axis=r), name="window"),
        te.compute((2 * n,), lambda i: te.tanh(x[i // 2]), name="upsample"),
        te.compute((n - 1,), lambda i: x[n - 1 - i] - x[i], name="rev"),
    ]
    assert reduces(grad_body(outs[0], x)) == 0
    k = tailjit.build(outs, [x])
    w = torch.tensor([[[1.0, 2.0, 3.0]]], dtype=F64)

    def ref(a):
        return (
            a[0 : 2 * (len(a) // 2) : 2] * a[1 : 2 * (len(a) // 2) : 2],
            torch.nn.functional.conv1d(a[None, None], w, stride=2)[0, 0],
            a.repeat_interleave(2).tanh(),
            a.flip(0)[:-1] - a[:-1],
        )

    check(k, [torch.randn(9, dtype=F64)], ref)


def test_stacked_columns_and_triangular_sums():
    n = te.var("n")
    a, b = te.placeholder((n,), "float64", "a"), te.placeholder((n,), "float64", "b")

    def cumsum(i):
        k = te.reduce_axis((0, i + 1), "k")
        return te.sum(a[k] * b[k], axis=k)

    stack3 = lambda i, c: te.select(c == 0, a[i], te.select(c == 1, b[i] * 2, a[i] * b[i]))  # noqa: E731
    outs = [
        te.compute((n, 2), lambda i, c: te.select(c == 0, a[i] * 3, te.exp(b[i])), name="stack2"),
        te.compute((n, 3), stack3, name="stack3"),
        te.compute((n,), cumsum, name="cumsum"),
    ]
    # the column condition c == 0 is solved, not summed over: the gradient of a reads column 0
    # (b's, under c != 0, stays a two-term sum over c)
    assert reduces(grad_body(outs[0], a)) == 0 and reduces(grad_body(outs[1], a)) == 1
    k = tailjit.build(outs, [a, b])
    ref = lambda u, v: (torch.stack([u * 3, v.exp()], 1), torch.stack([u, v * 2, u * v], 1), (u * v).cumsum(0))  # noqa: E731
    check(k, [torch.randn(6, dtype=F64), torch.randn(6, dtype=F64)], ref)


def test_a_box_gradient_written_per_column_adds_no_absent_contribution():
    """An (N, 4) box read column by column: its gradient sums one contribution per read, each zero
    outside its column (``Absent``).  Written out per column, a column's sum keeps its own contributions
    and adds no zeros (gcc must keep ``x + 0.0``: -0.0 + 0.0 is +0.0); NaN, inf and -0.0 rows match torch."""
    n = te.var("n")
    b = te.placeholder((n, 4), "float32", "b")
    area = te.compute((n,), lambda i: (b[i, 2] - b[i, 0]) * (b[i, 3] - b[i, 1]) + b[i, 0] * b[i, 3], name="area")
    k = tailjit.build(area, [b])
    grad = k.gradient_kernel((True,))
    stores = [ln for ln in grad.source.splitlines() if "grad_" in ln and "] = " in ln and "tj_tensor_desc" not in ln]
    assert len(stores) == 4  # one statement per column
    assert not [ln for ln in stores if "+ 0x0.0p+0f" in ln or "0x0.0p+0f +" in ln]
    bv = torch.randn(7, 4)
    bv[0], bv[1], bv[2] = torch.tensor([-0.0, 1.0, -0.0, 0.0]), torch.tensor([float("nan"), 0.0, 1.0, 2.0]), torch.inf
    check(k, [bv], lambda u: (u[:, 2] - u[:, 0]) * (u[:, 3] - u[:, 1]) + u[:, 0] * u[:, 3], gradcheck=False)
    u = bv.clone().requires_grad_()
    got = torch.autograd.grad(k(u), u, torch.ones(7))[0]
    want = torch.autograd.grad((u[:, 2] - u[:, 0]) * (u[:, 3] - u[:, 1]) + u[:, 0] * u[:, 3], u, torch.ones(7))[0]
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)


def test_intermediate_read_several_ways_is_one_sum():
    n = te.var("n")
    x = te.placeholder((n,), "float64", "x")
    t = te.compute((n,), lambda i: te.exp(x[i]), name="t")
    y = te.compute(
        (n,), lambda i: t[i] * 2 + te.select(i > 0, t[i - 1], 0.0) + te.select(i + 1 < n, t[i + 1], 0.0), name="y"
    )
    g = grad_body(y, x)
    assert g.body is not None and reduces(g) == 0  # three contributions, one compute
    k = tailjit.build(y, [x])
    pad = torch.nn.functional.pad
    check(k, [torch.randn(7, dtype=F64)], lambda a: a.exp() * 2 + pad(a.exp(), (1, 0))[:-1] + pad(a.exp(), (0, 1))[1:])


def test_a_clamp_the_selecting_condition_makes_the_identity_is_a_gather():
    """Rotate-half, as slices and a cat lower it: each half reads the other through a clamp
    (``min(max(j, 0), 3) + 4``) that the select's condition ``j < 4`` makes the identity, so the map is
    affine there and the gradient a gather, not a serial scatter."""
    n = te.var("n")
    x = te.placeholder((n, 8), "float64", "x")

    def body(i, j):
        first = te.minimum(te.maximum(j, 0), 3)
        second = te.minimum(te.maximum(j - 4, 0), 3)
        return te.select(j < 4, -x[i, first + 4], x[i, second]) * 2.0

    k = tailjit.build(te.compute((n, 8), body, name="y"), [x])
    assert not any("scatter" in kk.role for kk in k.gradient_kernel((True,)).kernels)
    check(k, [torch.randn(3, 8, dtype=F64)], lambda a: torch.cat([-a[:, 4:], a[:, :4]], 1) * 2.0)


def test_data_dependent_and_non_affine_loads_scatter():
    n, v = te.var("n"), te.var("v")
    table = te.placeholder((v,), "float64", "table")
    idx, pad = te.placeholder((n,), "int64", "idx"), te.placeholder((n,), "int64", "pad")
    outs = [
        te.compute((n,), lambda i: table[idx[i]] * table[idx[i]], name="gather"),
        te.compute((v,), lambda i: table[(i * i) % v], name="square_index"),
        # a padding index (-1) reads nothing, so its update must not run either
        te.compute((n,), lambda i: te.select(pad[i] >= 0, te.exp(table[pad[i]]), 0.0), name="padded"),
    ]
    k = tailjit.build(outs, [table, idx, pad])
    assert any("scatter" in kk.role for kk in k.gradient_kernel((True, False, False)).kernels)
    t = torch.randn(5, dtype=F64)
    ix = torch.tensor([0, 3, 2, 3, 1, 0, 4, 2])
    px = torch.tensor([0, 3, -1, 3, 1, 0, 4, -1])

    def ref(a, j, p):
        return a[j] * a[j], a[torch.arange(5) ** 2 % 5], torch.where(p >= 0, a[p.clamp(min=0)].exp(), 0.0)

    check(k, [t, ix, px], ref)


@pytest.mark.parametrize("form", ["row", "column_of_one", "reduced"])
def test_one_element_read_per_row_at_a_data_index_is_a_gather(form):
    """Cross-entropy's target log-probability, ``x[i, t[i]]``: the other index fixes the row, so the data
    index is a guard, ``dx[i, c] = select(t[i] == c, dy[i], 0)``, a gather that fuses with the rest of
    the gradient instead of a serial scatter.  Also through ``gather(x, 1, t[:, None])``'s column of
    extent 1 (a variable only the data index reads), and inside a sum over the rows."""
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), "float64", "x")
    t = te.placeholder((n,), "int64", "t")
    r = te.reduce_axis(n, "r")
    if form == "row":
        y = te.compute((n,), lambda i: te.exp(x[i, t[i]]), name="y")
    elif form == "column_of_one":
        y = te.compute((n, 1), lambda i, z: te.exp(x[i, t[i + z]]), name="y")
    else:
        y = te.compute((), lambda: te.sum(te.exp(x[r, t[r]]), axis=r), name="y")
    k = tailjit.build(y, [x, t])
    assert not any("scatter" in kk.role for kk in k.gradient_kernel((True, False)).kernels)
    assert reduces(grad_body(y, x)) == 0
    tv = torch.tensor([2, 0, 4, 4, 1, 3])

    def ref(a, tt):
        picked = a.gather(1, tt[:, None]).exp()
        return {"row": picked[:, 0], "column_of_one": picked, "reduced": picked.sum()}[form]

    check(k, [torch.randn(6, 5, dtype=F64), tv], ref)


@pytest.mark.parametrize("first", ["column", "block"])
def test_the_columns_after_a_first_part_are_a_gather(first):
    """A ``cat`` whose first part is one column (InfoNCE's ``cat([l_pos, l_neg], 1)``) selects the second
    part where ``j != 0``, with the index clamped into it: that condition excludes an end of ``j``'s range,
    which bounds ``j - 1`` in the part, so its gradient is a gather rather than a serial scatter.  Also
    for a first part of two columns (``j >= 2``)."""
    n, m = te.var("n"), te.var("m")
    w = 1 if first == "column" else 2
    a = te.placeholder((n, w), "float64", "a")
    b = te.placeholder((n, m), "float64", "b")
    out = te.compute(
        (n, m + w),
        lambda i, j: te.select(
            j == 0 if w == 1 else j < w, a[i, te.minimum(j, w - 1)], b[i, te.minimum(te.maximum(j - w, 0), m - 1)]
        ),
        name="cat",
    )
    y = te.compute((n, m + w), lambda i, j: te.exp(out[i, j]) * 2.0, name="y")
    k = tailjit.build(y, [a, b])
    assert not any("scatter" in kk.role for kk in k.gradient_kernel((True, True)).kernels)
    check(k, [torch.randn(4, w, dtype=F64), torch.randn(4, 5, dtype=F64)], lambda p, q: torch.cat([p, q], 1).exp() * 2)


def test_data_indices_with_a_free_variable_stay_scatters():
    """``gather(x, 1, idx)`` with several indices per row: the column variable is fixed by nothing but the
    data index, so a guard would sit in a sum over it for every element; it stays a scatter."""
    n, m, k_ = te.var("n"), te.var("m"), te.var("k")
    x = te.placeholder((n, m), "float64", "x")
    idx = te.placeholder((n, k_), "int64", "idx")
    y = te.compute((n, k_), lambda i, j: x[i, idx[i, j]] * 3.0, name="y")
    k = tailjit.build(y, [x, idx])
    assert any("scatter" in kk.role for kk in k.gradient_kernel((True, False)).kernels)
    iv = torch.tensor([[0, 2, 2], [1, 1, 4], [3, 0, 1]])
    check(k, [torch.randn(3, 5, dtype=F64), iv], lambda a, ii: a.gather(1, ii) * 3.0)


def test_through_a_scatter_add():
    n, m, k = te.var("n"), te.var("m"), te.var("k")
    x, src = te.placeholder((n, m), "float64", "x"), te.placeholder((k, m), "float64", "src")
    idx = te.placeholder((k,), "int64", "idx")
    base = te.compute((n, m), lambda i, j: te.sin(x[i, j]), name="base")
    out = te.scatter(base, (k, m), lambda i, j: ((idx[i], j), src[i, j] * src[i, j], idx[i] >= 0), name="index_add")
    y = te.compute((n, m), lambda i, j: out[i, j] * x[i, j], name="y")
    kern = tailjit.build(y, [x, src, idx])

    def ref(a, s, i):
        ok = i >= 0
        return a.sin().index_add(0, i[ok], (s * s)[ok]) * a

    check(kern, [torch.randn(4, 3, dtype=F64), torch.randn(5, 3, dtype=F64), torch.tensor([0, 2, -1, 2, 3])], ref)
    with pytest.raises(tailjit.TEError, match="only 'add' and 'assign' are differentiable"):
        te.gradient(te.scatter(base, (k, m), lambda i, j: ((idx[i], j), src[i, j]), combine="max"), src)


def test_through_an_assigning_scatter():
    """index_copy with duplicate and skipped targets: the base's gradient is zero where an update
    writes, and every update (duplicates too) gets the gradient at its target, as in eager."""
    n, m, k = te.var("n"), te.var("m"), te.var("k")
    x, src = te.placeholder((n, m), "float64", "x"), te.placeholder((k, m), "float64", "src")
    idx = te.placeholder((k,), "int64", "idx")
    base = te.compute((n, m), lambda i, j: te.exp(x[i, j]), name="base")
    out = te.scatter(base, (k, m), lambda i, j: ((idx[i], j), src[i, j] * 3.0, idx[i] >= 0), combine="assign")
    y = te.compute((n, m), lambda i, j: out[i, j] * x[i, j], name="y")
    kern = tailjit.build(y, [x, src, idx])

    def ref(a, s, i):
        ok = i >= 0
        return a.exp().index_copy(0, i[ok], (s * 3.0)[ok]) * a

    idx_values = torch.tensor([0, 2, -1, 2, 4])
    gs = check(kern, [torch.randn(5, 3, dtype=F64), torch.randn(5, 3, dtype=F64), idx_values], ref, gradcheck=False)
    assert gs[1][1].abs().sum() > 0 and gs[1][3].abs().sum() > 0  # both writes to row 2 have a gradient
    assert not gs[1][2].any()  # the skipped update has none
    # gradcheck needs a unique winner per target: without duplicates the scatter is differentiable
    check(kern, [torch.randn(5, 3, dtype=F64), torch.randn(3, 3, dtype=F64), torch.tensor([4, -1, 1])], ref)


def test_through_scans():
    """A reverse linear recurrence (discounted returns with episode ends) and a nonlinear
    forward one (an RNN with an initial state): the adjoints are scans the other way."""
    t, b = te.var("t"), te.var("b")
    r, done, x = (te.placeholder((t, b), "float64", name) for name in ("r", "done", "x"))
    w, h0 = te.placeholder((b,), "float64", "w"), te.placeholder((b,), "float64", "h0")
    zero = te.cast(0.0, "float64")
    ret = te.scan((t, b), 0, lambda prev, i, j: r[i, j] + 0.9 * (1 - done[i, j]) * prev, initial=zero, reverse=True)
    rnn = te.scan((t, b), 0, lambda prev, i, j: te.tanh(w[j] * prev + x[i, j]), initial=lambda i, j: h0[j])
    out = te.compute((t, b), lambda i, j: ret[i, j] * rnn[i, j], name="out")
    kern = tailjit.build(out, [r, done, w, x, h0])
    assert reduces(grad_body(out, h0)) == 0  # the initial state's gradient is read at position 0, not summed

    def ref(r, done, w, x, h0):
        rets, acc = [], torch.zeros_like(r[0])
        for i in reversed(range(r.shape[0])):
            acc = r[i] + 0.9 * (1 - done[i]) * acc
            rets.insert(0, acc)
        hs, h = [], h0
        for i in range(r.shape[0]):
            h = torch.tanh(w * h + x[i])
            hs.append(h)
        return torch.stack(rets) * torch.stack(hs)

    g = torch.Generator().manual_seed(3)
    args = [torch.randn(6, 3, dtype=F64, generator=g), (torch.rand(6, 3, generator=g) > 0.7).double(),
            torch.randn(3, dtype=F64, generator=g), torch.randn(6, 3, dtype=F64, generator=g),
            torch.randn(3, dtype=F64, generator=g)]  # fmt: skip
    check(kern, args, ref)


# -- the operator catalogue ------------------------------------------------------------------------------


@pytest.mark.parametrize("op", CATALOGUE, ids=lambda o: o.name)
def test_catalogue_matches_torch(op):
    ins, out = op.program("float64")
    k = tailjit.build(out, ins)
    check(k, op.example(F64, torch.Generator().manual_seed(1)), op.torch)


@pytest.mark.parametrize("op", SCATTER_CATALOGUE, ids=lambda o: o.name)
def test_scatter_catalogue_matches_torch(op):
    ins, out = op.program("float64")
    k = tailjit.build(out, ins)
    check(k, op.example(F64, torch.Generator().manual_seed(1)), op.torch)


def test_max_pool_ties_split_like_amax():
    ins, out = next(o for o in CATALOGUE if o.name == "max_pool_k2_s2").program("float64")
    k = tailjit.build(out, ins)
    x = torch.tensor([[[[1.0, 1.0, 0.0, 2.0], [1.0, 0.0, 2.0, 2.0]]]], dtype=F64, requires_grad=True)
    k(x).sum().backward()
    windows = x.detach().unfold(2, 2, 2).unfold(3, 2, 2)  # amax over each window, as torch defines ties
    wx = windows.clone().requires_grad_()
    wx.amax((-1, -2)).sum().backward()
    want = wx.grad.permute(0, 1, 2, 4, 3, 5).reshape(1, 1, 2, 4)
    torch.testing.assert_close(x.grad, want)
    assert x.grad[0, 0, 0, 0] == pytest.approx(1 / 3)


# -- kernels of the gradients ------------------------------------------------------------------------------


def gradient_kernel(program, mask=None):
    ins, out = program("float32")
    k = tailjit.build(out, ins)
    return k, k.gradient_kernel(tuple(mask or [True] * len(ins)))


def test_softmax_gradient_is_one_kernel():
    # dx = (g / s + sum_j(-g y / s)) * e + (row-max term): the row sums, the row max and
    # its tie count are reductions per row, which fusion computes in registers before
    # the row's loop; exp(x - max) is a row buffer.
    k, g = gradient_kernel(softmax_program)
    assert len(g.kernels) == 1
    x = torch.randn(16, 33, requires_grad=True)
    k(x).backward(torch.ones(16, 33) + torch.arange(33.0))
    x2 = x.detach().requires_grad_()
    torch.softmax(x2, 1).backward(torch.ones(16, 33) + torch.arange(33.0))
    torch.testing.assert_close(x.grad, x2.grad, atol=1e-5, rtol=1e-4)


def test_stop_gradient_passes_values_but_no_gradient():
    n, x = vec()
    c = te.stop_gradient(x)
    k = tailjit.build(te.compute((n,), lambda i: x[i] * c[i] + te.exp(c[i]), name="y"), [x])
    check(k, [torch.randn(7, dtype=torch.float64)], lambda a: a * a.detach() + a.detach().exp(), gradcheck=False)
    with pytest.raises(tailjit.TEError, match="stop_gradient takes a te tensor"):
        te.stop_gradient(x[0])


def test_softmax_with_a_stopped_maximum_has_a_smaller_gradient():
    # the row maximum cancels out of softmax: stopped, the gradient drops two reductions per row, the
    # sum of the terms that cancel and the count of the maximum's ties (3 left of 5, the forward's
    # maximum and sum among them)
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), "float64", "x")
    k = te.reduce_axis(m, "k")
    mx = te.stop_gradient(te.compute((n,), lambda i: te.max(x[i, k], axis=k), name="row_max"))
    e = te.compute((n, m), lambda i, j: te.exp(x[i, j] - mx[i]), name="e")
    s = te.compute((n,), lambda i: te.sum(e[i, k], axis=k), name="s")
    y = te.compute((n, m), lambda i, j: e[i, j] / s[i], name="softmax")
    kern = tailjit.build(y, [x])
    a = torch.randn(5, 9, dtype=torch.float64)
    a[1, 3] = a[1, 5] = 4.0  # a tie at the maximum
    a[2, 0], a[3, 2], a[4, :] = math.inf, math.nan, -math.inf
    check(kern, [a], lambda t: torch.softmax(t, 1), gradcheck=False)
    check(kern, [torch.randn(4, 6, dtype=torch.float64)], lambda t: torch.softmax(t, 1))
    (grad,) = te.gradient(y, [x])
    _, full = softmax_program("float64")
    (unstopped,) = te.gradient(full, [full_input(full)])
    assert reductions(grad) < reductions(unstopped)


def full_input(t):
    from tailjit.te.graph import reachable

    return next(u for u in reachable([t]) if u.is_placeholder)


def reductions(t) -> int:
    from tailjit.te.graph import reachable

    return sum(
        isinstance(n, Reduce) for u in reachable([t]) if not u.is_placeholder for e in u.exprs() for n in walk(e)
    )


def test_layer_norm_gradient_kernels():
    # w.r.t. x alone: one kernel (mean, variance and the two row sums of the backward in
    # registers, dxc in a row buffer); with gamma and beta: their column sums are one more
    # loop nest (tailjit.loop_merge), and mean and variance, now read by two nests, are materialised.
    _, g = gradient_kernel(layer_norm_program, [True, False, False])
    assert len(g.kernels) == 1
    _, g = gradient_kernel(layer_norm_program)
    assert len(g.kernels) == 4
    assert sorted(k.name for k in g.kernels if k.role == "temporary") == ["mean", "var"]


def test_layer_norm_gradient_of_long_float32_rows_is_accurate():
    """The backward's row sums ride in the loop filling its row buffer, in float32 lanes per block of
    1024 elements, then in float64: on rows of 2500 (two blocks and a part) the gradient stays within
    float32 rounding of a float64 reference, NaN rows included."""
    ins, y = layer_norm_program("float32")
    f = tailjit.build(y, ins)
    gk = f.gradient_kernel((True, False, False))
    assert len(gk.kernels) == 1
    assert "+= (double)(" not in gk.source  # no float32 element converted and added in float64
    gen = torch.Generator().manual_seed(3)
    x, g, b = torch.randn(6, 2500, generator=gen) * 3 + 1, torch.randn(2500, generator=gen), torch.zeros(2500)
    x[4, 7] = math.nan
    head = torch.randn(6, 2500, generator=gen)
    (got,) = [gk(x, g, b, f(x, g, b), head)]
    x64 = x.double().requires_grad_()
    ref = torch.nn.functional.layer_norm(x64, (2500,), g.double(), b.double(), 1e-5)
    (want,) = torch.autograd.grad(ref, x64, head.double())
    assert got[4].isnan().all() and want[4].isnan().all()
    rows = [0, 1, 2, 3, 5]
    torch.testing.assert_close(got[rows], want[rows].float(), rtol=1e-4, atol=1e-5)


def test_matmul_gradient_is_two_matmuls():
    _, g = gradient_kernel(matmul_program)
    assert [k.role for k in g.kernels] == ["output", "output"]


def test_elementwise_chain_gradient_is_one_loop_nest():
    """One gradient is one kernel; both are one loop nest too, the first computed at each point before
    the second (``tailjit.loop_merge``)."""
    from tailjit.bench.core import chain_program

    ins, y = chain_program()
    k = tailjit.build(y, ins)
    assert len(k.gradient_kernel((True, False)).kernels) == 1
    (both,) = k.gradient_kernel((True, True)).kernels
    assert both.role == "output; hosts 'grad_a', computed first at each point"
    assert [(name, stored) for name, stored, *_ in both.merged] == [("grad_a", True)]


# -- differentiable kernels --------------------------------------------------------------------------------


def test_grad_kernel_built_once_per_mask_and_reused_across_sizes():
    n = te.var("n")
    a, b = te.placeholder((n,), name="a"), te.placeholder((n,), name="b")
    y = te.compute((n,), lambda i: a[i] * te.exp(b[i]), name="y")
    k = tailjit.build(y, [a, b])
    for size in (3, 17, 0):
        av, bv = torch.randn(size, requires_grad=True), torch.randn(size)
        k(av, bv).sum().backward()
        torch.testing.assert_close(av.grad, bv.exp())
    assert list(k._grad_kernels) == [(True, False)]
    av, bv = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    k(av, bv).sum().backward()
    torch.testing.assert_close(bv.grad, av.detach() * bv.detach().exp())
    assert len(k._grad_kernels) == 2


def test_an_output_gradient_that_is_an_input_gradient_is_handed_on():
    """In ``y = x + 2 * w`` the gradient of ``x`` is ``y``'s as it is: the backward hands it on, as eager's
    autograd does, where a kernel would copy it; ``w``'s is computed."""
    n = te.var("n")
    x, w = te.placeholder((n,), "float64", "x"), te.placeholder((n,), "float64", "w")
    k = tailjit.build(te.compute((n,), lambda i: x[i] + 2.0 * w[i], name="y"), [x, w])
    assert k.gradient_kernel((True, False)) is None
    assert k.backward((True, True)).through == (3, None)  # the head follows the inputs and the saved y
    xv, wv = (torch.randn(6, dtype=F64, requires_grad=True) for _ in range(2))
    head = torch.randn(6, dtype=F64)
    gx, gw = torch.autograd.grad(k(xv, wv), [xv, wv], head)
    assert gx.data_ptr() == head.data_ptr()
    torch.testing.assert_close(gw, 2 * head)
    k(xv, wv).sum().backward()  # an expanded head, handed on too
    torch.testing.assert_close(xv.grad, torch.ones(6, dtype=F64))
    check(k, [torch.randn(5, dtype=F64), torch.randn(5, dtype=F64)], lambda a, b: a + 2 * b)


def test_no_grad_gives_plain_outputs_and_non_contiguous_inputs():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    y = te.compute((n, m), lambda i, j: x[i, j] * x[i, j], name="y")
    k = tailjit.build(y, [x])
    xv = torch.randn(5, 4).t().requires_grad_()  # a transposed leaf
    with torch.no_grad():
        out = k(xv)
    assert out.grad_fn is None and not out.requires_grad
    out = k(xv)
    assert out.requires_grad
    out.backward(torch.randn(5, 4).t())  # a non-contiguous output gradient
    assert xv.grad is not None
    p = torch.nn.Parameter(torch.randn(2, 3))
    assert k(p).requires_grad and k(p.detach()).grad_fn is None


def test_integer_outputs_are_not_differentiable():
    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), "float64", "x")
    k_ = te.reduce_axis(m, "k")
    arg = te.compute((n,), lambda i: te.argmax(x[i, k_], axis=k_), name="arg")
    mx = te.compute((n,), lambda i: te.max(x[i, k_], axis=k_), name="mx")
    k = tailjit.build([arg, mx], [x])
    xv = torch.randn(3, 4, dtype=F64, requires_grad=True)
    a, b = k(xv)
    assert not a.requires_grad and b.requires_grad
    b.sum().backward()
    torch.testing.assert_close(xv.grad, torch.nn.functional.one_hot(xv.argmax(1), 4).double())


def test_gradient_of_unrelated_input_is_zeros():
    n = te.var("n")
    x, z = te.placeholder((n,), "float64", "x"), te.placeholder((n,), "float64", "z")
    y = te.compute((n,), lambda i: x[i] * 2, name="y")
    gx, gz = te.gradient(y, [x, z])
    f = tailjit.build([gx, gz], [x, z])
    a, b = f(torch.randn(3, dtype=F64), torch.randn(3, dtype=F64))
    assert a.tolist() == [2.0] * 3 and b.tolist() == [0.0] * 3
    k = tailjit.build(y, [x, z])
    xv, zv = torch.randn(3, dtype=F64, requires_grad=True), torch.randn(3, dtype=F64, requires_grad=True)
    k(xv, zv).sum().backward()
    assert zv.grad.tolist() == [0.0] * 3


def test_gradient_wrt_intermediate_and_output():
    n = te.var("n")
    x = te.placeholder((n,), "float64", "x")
    t = te.compute((n,), lambda i: te.sin(x[i]), name="t")
    y = te.compute((n,), lambda i: t[i] * t[i], name="y")
    gt, gy, gx = te.gradient(y, [t, y, x])
    f = tailjit.build([gt, gy, gx], [x])
    xv = torch.randn(4, dtype=F64)
    a, b, c = f(xv)
    torch.testing.assert_close(a, 2 * xv.sin())
    torch.testing.assert_close(b, torch.ones(4, dtype=F64))
    torch.testing.assert_close(c, 2 * xv.sin() * xv.cos())


# -- errors --------------------------------------------------------------------------------------------------


def test_errors():
    n = te.var("n")
    x = te.placeholder((n,), "float64", "x")
    ix = te.placeholder((n,), "int32", "ix")
    y = te.compute((n,), lambda i: x[i] * te.cast(ix[i], "float64"), name="y")
    with pytest.raises(tailjit.TEError, match="only floating inputs"):
        te.gradient(y, ix)
    with pytest.raises(tailjit.TEError, match="outputs must be computes"):
        te.gradient(x, x)
    with pytest.raises(tailjit.TEError, match="head"):
        te.gradient(y, x, te.placeholder((n, n), "float64", "h"))
    with pytest.raises(tailjit.TEError, match="2 head"):
        te.gradient(y, x, [None, None])


def test_double_backward_raises():
    n = te.var("n")
    x = te.placeholder((n,), "float64", "x")
    k = tailjit.build(te.compute((n,), lambda i: x[i] * x[i] * x[i], name="cube"), [x])
    xv = torch.randn(3, dtype=F64, requires_grad=True)
    (g,) = torch.autograd.grad(k(xv).sum(), xv, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        g.sum().backward()
    (g2,) = torch.autograd.grad(k(xv).sum(), xv)  # without create_graph: a plain tensor
    assert not g2.requires_grad


def test_out_with_grad_raises():
    n = te.var("n")
    x = te.placeholder((n,), name="x")
    k = tailjit.build(te.compute((n,), lambda i: x[i] + 1, name="y"), [x])
    with pytest.raises(RuntimeError, match="out=... arguments don.t support automatic differentiation"):
        k(torch.randn(3, requires_grad=True), out=torch.empty(3))
