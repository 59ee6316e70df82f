"""Hypothesis-generated tensor-expression programs: compiled gradients against torch autograd.

Each example draws an expression over a 2-d input ``x`` and a broadcast row
``b``: element-wise chains of smooth functions, broadcasts, index shifts and
flips, selects, and optionally a row reduction (sum, max, min) feeding an
epilogue that reads the first stage again.  ``te.gradient`` of the program
with respect to ``x`` and ``b`` (for a random output gradient) is built and
compared with torch autograd on the same program written with torch ops.
Functions are kept finite (no log or sqrt of negatives) so that NaN
conventions are not what is compared.
"""

from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tailjit
from tailjit import te


@dataclass
class Node:
    build: object  # (i, j, env) -> te expression
    ref: object  # env -> torch tensor of shape (n, m)


def _shift(t):
    return torch.cat([t[:, 1:], torch.zeros_like(t[:, :1])], 1)


LEAVES = [
    Node(lambda i, j, e: e["x"][i, j], lambda e: e["x"]),
    Node(lambda i, j, e: e["b"][j], lambda e: e["b"].expand_as(e["x"])),
    Node(lambda i, j, e: e["x"][i, e["m"] - 1 - j], lambda e: e["x"].flip(1)),
    Node(lambda i, j, e: te.select(j + 1 < e["m"], e["x"][i, j + 1], 0.0), lambda e: _shift(e["x"])),
    Node(lambda i, j, e: e["x"][e["n"] - 1 - i, j] * e["b"][e["m"] - 1 - j], lambda e: e["x"].flip(0) * e["b"].flip(0)),
    Node(
        lambda i, j, e: te.cast(j, "float64") * 0.25, lambda e: torch.arange(e["m"]).double().expand_as(e["x"]) * 0.25
    ),
    # a strong float64 constant: te.sin(0.5) of a Python float would compute in float32
    Node(lambda i, j, e: te.cast(0.5, "float64"), lambda e: torch.full_like(e["x"], 0.5)),
]

UNARY = [
    (lambda a: -a, lambda a: -a),
    (te.tanh, torch.tanh),
    (te.sigmoid, torch.sigmoid),
    (te.sin, torch.sin),
    (lambda a: te.exp(te.tanh(a)), lambda a: torch.exp(torch.tanh(a))),
    (lambda a: a * a, lambda a: a * a),
    (te.abs, torch.abs),
    (lambda a: te.floor(a) + a, lambda a: torch.floor(a) + a),
]
BINARY = [
    (lambda a, b: a + b, lambda a, b: a + b),
    (lambda a, b: a - b, lambda a, b: a - b),
    (lambda a, b: a * b, lambda a, b: a * b),
    (lambda a, b: a / (1 + b * b), lambda a, b: a / (1 + b * b)),
    (te.maximum, torch.maximum),
    (te.minimum, torch.minimum),
    (lambda a, b: te.select(a > b, a * b, b - 1), lambda a, b: torch.where(a > b, a * b, b - 1)),
]


def expressions():
    def extend(children):
        un = st.tuples(st.sampled_from(UNARY), children).map(
            lambda t: Node(lambda i, j, e, t=t: t[0][0](t[1].build(i, j, e)), lambda e, t=t: t[0][1](t[1].ref(e)))
        )
        bi = st.tuples(st.sampled_from(BINARY), children, children).map(
            lambda t: Node(
                lambda i, j, e, t=t: t[0][0](t[1].build(i, j, e), t[2].build(i, j, e)),
                lambda e, t=t: t[0][1](t[1].ref(e), t[2].ref(e)),
            )
        )
        return un | bi

    return st.recursive(st.sampled_from(LEAVES), extend, max_leaves=6)


def run_program(body, epilogue, reduce_op, n, m, seed):
    nv, mv = te.var("n"), te.var("m")
    x = te.placeholder((nv, mv), "float64", name="x")
    b = te.placeholder((mv,), "float64", name="b")
    env = {"x": x, "b": b, "m": mv, "n": nv}
    first = te.compute((nv, mv), lambda i, j: body.build(i, j, env), name="first")
    if reduce_op is None:
        out = first
    else:
        k = te.reduce_axis(mv, "k")
        red = te.compute((nv,), lambda i: getattr(te, reduce_op)(first[i, k], axis=k), name="red")
        out = te.compute((nv, mv), lambda i, j: epilogue.build(i, j, env) * red[i] + first[i, j], name="out")
    head = te.placeholder(out.shape, "float64", name="head")
    gx, gb = te.gradient(out, [x, b], head)
    f = tailjit.build([gx, gb], [x, b, head])

    g = torch.Generator().manual_seed(seed)
    xv = torch.randn(n, m, generator=g, dtype=torch.float64, requires_grad=True)
    bv = torch.randn(m, generator=g, dtype=torch.float64, requires_grad=True)
    hv = torch.randn(n, m, generator=g, dtype=torch.float64)
    tenv = {"x": xv, "b": bv, "m": m, "n": n}
    want = body.ref(tenv)
    if reduce_op is not None:
        r = {"sum": lambda t: t.sum(1), "max": lambda t: t.amax(1), "min": lambda t: t.amin(1)}[reduce_op]
        want = epilogue.ref(tenv) * r(want)[:, None] + want
    wx, wb = torch.autograd.grad(want, [xv, bv], hv, allow_unused=True) if want.requires_grad else (None, None)
    wx = torch.zeros_like(xv) if wx is None else wx
    wb = torch.zeros_like(bv) if wb is None else wb
    got_x, got_b = f(xv.detach(), bv.detach(), hv)
    torch.testing.assert_close(got_x, wx, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(got_b, wb, rtol=1e-6, atol=1e-8)


PROGRAMS = dict(
    body=expressions(),
    epilogue=expressions(),
    reduce_op=st.sampled_from([None, "sum", "max", "min"]),
    n=st.integers(1, 5),
    m=st.integers(1, 7),
    seed=st.integers(0, 2**16),
)


def _binary(fs, a, b):
    return Node(lambda i, j, e: fs[0](a.build(i, j, e), b.build(i, j, e)), lambda e: fs[1](a.ref(e), b.ref(e)))


@pytest.mark.parametrize("n, m", [(1, 1), (2, 1), (3, 4)])
def test_a_flipped_shift_in_a_cut_loop_is_not_refused_for_one_column(n, m):
    """A case hypothesis found: the gradient of a max over a shift (``j + 1 < m``) and flips loads
    ``x[i, m - i1]`` under ``m - i1 < m``; the loop is cut in pieces, and the last piece's range forgot the
    earlier cut's ``i1 >= 1`` (two bounds it could not compare: ``1`` and ``m - 1``), so for ``m = 1`` the
    call-time check thought the dead load could run and raised IndexError."""
    add, maximum = BINARY[0], (te.maximum, torch.maximum)
    x, flip1, shift, flip_product = LEAVES[0], LEAVES[2], LEAVES[3], LEAVES[4]
    epilogue = _binary(maximum, _binary(add, shift, flip_product), _binary(add, x, flip1))
    run_program(x, epilogue, "sum", n, m, 0)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**PROGRAMS)
def test_random_program_gradients_match_torch(body, epilogue, reduce_op, n, m, seed):
    run_program(body, epilogue, reduce_op, n, m, seed)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**PROGRAMS)
def test_random_program_gradients_match_torch_sweep(body, epilogue, reduce_op, n, m, seed):
    run_program(body, epilogue, reduce_op, n, m, seed)
