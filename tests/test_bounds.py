"""The symbolic bounds behind out-of-bounds proofs: ``Affine.sign`` over size variables and
their quotients (``(h - 3) // 2 + 1``, a strided window's output size), checked against
evaluation over a grid of sizes."""

import itertools

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import tailjit
from tailjit import te
from tailjit.te.analysis import Affine, Quotient, affine, quotient

H, W = te.var("h"), te.var("w")


def _value(a: Affine, env: dict) -> int:
    out = a.const
    for v, c in a.terms:
        out += c * (_value(v.num, env) // v.k if isinstance(v, Quotient) else env[v])
    return out


@st.composite
def affines(draw, depth=2):
    out = Affine.of(draw(st.integers(-6, 6)))
    for v in (H, W):
        out += Affine.of(0, v).scale(draw(st.integers(-3, 3)))
    if depth and draw(st.booleans()):
        out += quotient(draw(affines(depth=depth - 1)), draw(st.integers(1, 4))).scale(draw(st.integers(-4, 4)))
    return out


@settings(max_examples=400, deadline=None)
@given(affines())
def test_sign_claims_hold_for_every_size(a):
    values = [_value(a, {H: h, W: w}) for h, w in itertools.product(range(0, 24), repeat=2)]
    s = a.sign()
    if s == 1:
        assert min(values) >= 0, a
    elif s == -1:
        assert max(values) < 0, a


@settings(max_examples=400, deadline=None)
@given(
    st.integers(-6, 6),
    st.integers(1, 3),
    st.integers(1, 4),
    st.integers(-6, 6),
    st.integers(-6, 6),
    st.sampled_from([-2, -1, 1, 2]),
)
def test_sign_near_the_edge(a0, a1, k, d, e, m):
    # m * (A + e - k * ((A + d) // k)): within k - 1 of m * (e - d), so the claims are borderline
    big_a = Affine.of(a0) + Affine.of(0, H).scale(a1)
    a = (big_a + Affine.of(e) - quotient(big_a + Affine.of(d), k).scale(k)).scale(m)
    test_sign_claims_hold_for_every_size.hypothesis.inner_test(a)
    assert a.sign() is not None or k > 1  # without a quotient the form is a constant


def test_a_strided_window_output_size_proves_its_loads():
    # 2 * ((h - 3) // 2) + 2 <= h - 1: the forward loads need neither a guard nor a call-time check
    assert (affine(H) - Affine.of(1) - (affine((H - 3) // 2).scale(2) + Affine.of(2))).sign() == 1
    n, c = te.var("n"), te.var("c")
    x = te.placeholder((n, c, H, W), name="x")
    rh, rw = te.reduce_axis(3, "rh"), te.reduce_axis(3, "rw")
    y = te.compute(
        (n, c, (H - 3) // 2 + 1, (W - 3) // 2 + 1),
        lambda b, ch, i, j: te.max(x[b, ch, i * 2 + rh, j * 2 + rw], axis=[rh, rw]),
        name="pool",
    )
    f = tailjit.build(y, [x])
    assert "err |= 1" not in f.source and "can fall outside" not in f.source
    for shape in [(1, 1, 3, 3), (2, 3, 9, 10), (1, 2, 4, 5)]:
        xv = torch.randn(shape)
        assert torch.equal(f(xv), F.max_pool2d(xv, 3, 2))
    # the gradient's window sums: the selects around each term bound its loads
    dy = te.placeholder(y.shape, name="dy")
    g = tailjit.build(te.gradient([y], [x], head=[dy]), [x, dy])
    assert "err |= 1" not in g.source
    xv = torch.randn(2, 3, 11, 8, dtype=torch.float64).float().requires_grad_()
    out = F.max_pool2d(xv, 3, 2)
    d = torch.randn_like(out)
    torch.testing.assert_close(g(xv.detach(), d), torch.autograd.grad(out, xv, d)[0])
