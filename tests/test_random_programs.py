"""Hypothesis-generated tensor-expression programs against PyTorch.

Each example draws a random expression over a 2-d input ``x``, a broadcast
row ``b`` and an integer tensor ``ix``: element-wise chains, broadcasts,
index arithmetic (flips, rolls), selects, casts, integer floor division and
modulo, and optionally a row reduction feeding an epilogue.  The same
program is evaluated with torch ops; values and NaN positions must agree.
"""

from dataclasses import dataclass

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tailjit
from tailjit import te


@dataclass
class Node:
    build: object  # (i, j, env) -> te expression
    ref: object  # env -> torch tensor of shape (n, m)


def leaves():
    return st.sampled_from(
        [
            Node(lambda i, j, e: e["x"][i, j], lambda e: e["x"]),
            Node(lambda i, j, e: e["b"][j], lambda e: e["b"].expand_as(e["x"])),
            Node(lambda i, j, e: e["x"][i, e["m"] - 1 - j], lambda e: e["x"].flip(1)),
            Node(lambda i, j, e: e["x"][i, (j + 1) % e["m"]], lambda e: e["x"].roll(-1, 1)),
            Node(lambda i, j, e: te.cast(e["ix"][i, j], "float32"), lambda e: e["ix"].float()),
            Node(lambda i, j, e: te.cast(j, "float32"), lambda e: torch.arange(e["m"]).float().expand_as(e["x"])),
            Node(lambda i, j, e: 0.5, lambda e: torch.full_like(e["x"], 0.5)),
            Node(lambda i, j, e: te.cast(e["ix"][i, j] // 3, "float32"),
                 lambda e: torch.div(e["ix"], 3, rounding_mode="floor").float()),
            Node(lambda i, j, e: te.cast(e["ix"][i, j] % 4, "float32"), lambda e: torch.remainder(e["ix"], 4).float()),
        ]
    )  # fmt: skip


UNARY = [
    (lambda a: -a, lambda a: -a),
    (te.abs, torch.abs),
    (lambda a: te.exp(te.tanh(a)), lambda a: torch.exp(torch.tanh(a))),
    (lambda a: te.sqrt(te.abs(a)), lambda a: torch.sqrt(torch.abs(a))),
    (te.floor, torch.floor),
    (te.sigmoid, torch.sigmoid),
]
BINARY = [
    (lambda a, b: a + b, lambda a, b: a + b),
    (lambda a, b: a - b, lambda a, b: a - b),
    (lambda a, b: a * b, lambda a, b: a * b),
    (lambda a, b: a / b, lambda a, b: a / b),
    # torch.maximum(0.0, -0.0) is +0.0 on eager's scalar path and -0.0 on its vector path (so 1 / it is
    # +inf or -inf by position); the reference spells out the vector path's rule, which tailjit follows
    (te.maximum, lambda a, b: torch.where((a > b) | a.isnan(), a, b)),
    (te.minimum, lambda a, b: torch.where((a < b) | a.isnan(), a, b)),
    (lambda a, b: te.select(a > b, a, b * 2), lambda a, b: torch.where(a > b, a, b * 2)),
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

    return st.recursive(leaves(), extend, max_leaves=8)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=expressions(),
    epilogue=expressions(),
    reduce_op=st.sampled_from([None, "sum", "max", "min"]),
    n=st.integers(0, 9),
    m=st.integers(1, 17),
    transposed=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_program_matches_torch(body, epilogue, reduce_op, n, m, transposed, seed):
    nv, mv = te.var("n"), te.var("m")
    x = te.placeholder((nv, mv), name="x")
    b = te.placeholder((mv,), name="b")
    ix = te.placeholder((nv, mv), "int32", name="ix")
    env = {"x": x, "b": b, "ix": ix, "m": mv}
    first = te.compute((nv, mv), lambda i, j: body.build(i, j, env), name="first")
    if reduce_op is None:
        out = first
    else:
        k = te.reduce_axis(mv, "k")
        red = te.compute((nv,), lambda i: getattr(te, reduce_op)(first[i, k], axis=k), name="red")
        # reading `first` twice (in the reduction and here) exercises recompute and row buffers
        out = te.compute((nv, mv), lambda i, j: epilogue.build(i, j, env) + red[i] + first[i, j], name="out")
    f = tailjit.build(out, [x, b, ix])

    g = torch.Generator().manual_seed(seed)
    xv = torch.randn(m, n, generator=g).t() if transposed else torch.randn(n, m, generator=g)
    bv = torch.randn(m, generator=g)
    iv = torch.randint(-20, 20, (n, m), generator=g, dtype=torch.int32)
    tenv = {"x": xv, "b": bv, "ix": iv, "m": m}
    want = body.ref(tenv)
    if reduce_op is not None:
        r = {"sum": lambda t: t.sum(1), "max": lambda t: t.amax(1), "min": lambda t: t.amin(1)}[reduce_op]
        red_v = r(want) if n > 0 else torch.zeros(0)
        want = epilogue.ref(tenv) + red_v[:, None] + want
    got = f(xv, bv, iv)
    torch.testing.assert_close(got, want.to(torch.float32), rtol=1e-4, atol=1e-4, equal_nan=True)
