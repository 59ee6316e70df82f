"""Special values through every lowered op, under both entries, bit for bit where eager is deterministic.

Each entry of ``test_ops.OPS`` runs on inputs whose float elements are all drawn from signed zeros, NaN,
infinities, subnormals, the smallest normal and the largest finite numbers (and a few ordinary ones),
compiled by ``torch.compile(backend="tailjit")`` and by ``tailjit.jit``.  Eager's result is taken twice:
on contiguous inputs (its vector loops, but for a tail) and on strided copies of them (its scalar loops).
Where the two differ eager defines nothing (``maximum(-0.0, 0.0)`` is either zero, ``fmod(3e38, 0.5)`` is NaN in
its vector loop and 0 in its scalar one) and the element is not compared.  Everywhere else the compiled
result has eager's NaN positions, infinities and signs, signed zeros included, and its values: bit for
bit for the entries marked ``exact``, within the sweep's tolerance for the others (libm's last place).
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._pytree import tree_leaves

import tailjit
from frontend.test_ops import FAMILIES, FLOATS, OPS, Maker
from tailjit.frontend.plan.report import collect_reports

#: Families whose results add or multiply many elements: the order of a sum or a product decides where it
#: overflows or underflows (``inf * tiny * tiny`` is inf or NaN), so their inputs leave the largest finite
#: numbers, the smallest normal ones and the subnormals out.
SUMS = {"reduce", "scan", "scatter"}
#: Eager's lerp is fused multiply-adds (explicit in its vector loop, contracted by gcc in its scalar one):
#: lerp(-0.0, max, -1.0) is -max where the unfused formula overflows, and an underflow keeps its sign;
#: tensor expressions have no fused multiply-add.
LEFT_OUT = {"lerp", "lerp_tensor"}
#: Entries with a maximum or minimum of two tensors: at a tie of -0.0 and 0.0 eager's vector loops return the
#: second operand, its scalar loops the first, and which loop an element gets depends on the shapes (a
#: broadcast operand keeps its inner loop scalar), so the sign of a zero result is not compared.
ZERO_TIES = {"maximum", "minimum", "add_0d", "clamp_tensor"}


def special_values(dtype, extremes=True):
    fi = torch.finfo(dtype)
    vals = [-0.0, 0.0, math.nan, math.inf, -math.inf, 1.0, -1.0, 0.5, -2.5, 3.0]
    if extremes:
        vals += [fi.max, -fi.max, fi.tiny, -fi.tiny, fi.smallest_normal / 4, -fi.smallest_normal / 4]
    return torch.tensor(vals, dtype=dtype)


class SpecialMaker(Maker):
    """Float inputs made of special values only (integers, indices and masks as ``Maker``'s)."""

    def __init__(self, dtype, gen, extremes):
        super().__init__(dtype, "contig", gen=gen)
        self.extremes = extremes

    def __call__(self, *shape, dtype=None, special=True, **kw):
        dt = dtype or self.dtype
        if not dt.is_floating_point or not special:  # special=False: an entry eager itself gets wrong on them
            return super().__call__(*shape, dtype=dtype, special=special, **kw)
        vals = special_values(dt, self.extremes)
        shape = self.shape(shape)
        # every value at least once where there are enough elements, in random places
        return vals[torch.randperm(math.prod(shape), generator=self.gen) % len(vals)].reshape(shape)


def strided(x):
    """A copy of ``x`` whose last dimension has stride 2: eager's element-wise loops run their scalar path."""
    return Maker(x.dtype, "sliced")._lay(x) if isinstance(x, torch.Tensor) else x


def same_bits(a, b):
    """Where ``a`` and ``b`` hold the same value, sign of zero and NaN included."""
    if not a.dtype.is_floating_point:
        return a == b
    return ((a == b) & (a.signbit() == b.signbit())) | (a.isnan() & b.isnan())


def check(name, got, want, defined, exact, tol, zero_ties=False):
    assert got.dtype == want.dtype and got.shape == want.shape, f"{name}: {got.dtype}{tuple(got.shape)}"
    g, w = got[defined], want[defined]
    if not w.dtype.is_floating_point:
        assert torch.equal(g, w), f"{name}: {g} != eager {w}"
        return

    def agree(ok, what):
        assert bool(ok.all()), f"{name}: {what} differ: " + ", ".join(
            f"{a!r} (eager {b!r})" for a, b in zip(g[~ok][:6].tolist(), w[~ok][:6].tolist())
        )

    agree(g.isnan() == w.isnan(), "NaN positions")
    g, w = g[~w.isnan()], w[~w.isnan()]
    # (an inexact entry's rounding noise around 0 may take either sign: its zeros' signs are compared)
    signed = torch.ones_like(w, dtype=torch.bool) if exact else (g == 0) & (w == 0)
    agree((g.signbit() == w.signbit()) | ~signed | (zero_ties & (w == 0)), "signs")
    agree(g.isinf() == w.isinf(), "infinities")
    if exact:
        agree(g == w, "values")
    else:
        rtol, atol = ((tol or 1e-5), 1e-5) if w.dtype == torch.float32 else (1e-9, 1e-12)  # test_ops' tolerances
        agree(((g - w).abs() <= atol + rtol * w.abs()) | (g == w), "values")


CHUNK = 16
CASES = [(f, dt) for f in FAMILIES for dt in FLOATS]


@pytest.mark.parametrize("entry", ["compile", "jit"])
@pytest.mark.parametrize("family,dtype", CASES, ids=[f"{f}-{str(dt)[6:]}" for f, dt in CASES])
def test_special_values_match_eager(family, dtype, entry):
    entries = [o for o in OPS if o.family == family and dtype in o.dtypes and o.values and o.name not in LEFT_OUT]
    gen = torch.Generator().manual_seed(7)
    calls = [(o, o.args(SpecialMaker(dtype, gen, family not in SUMS))) for o in entries]
    for k in range(0, len(calls), CHUNK):
        _run(calls[k : k + CHUNK], dtype, entry)


def _run(calls, dtype, entry):
    flat, spans = [], []
    for _, args in calls:
        spans.append((len(flat), len(flat) + len(args)))
        flat.extend(args)

    def per_call(*xs):
        return [tree_leaves(o.fn(*xs[a:b])) for (o, _), (a, b) in zip(calls, spans)]

    def fn(*xs):
        return [r for rs in per_call(*xs) for r in rs]

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="tailjit") if entry == "compile" else tailjit.jit(fn)
    with collect_reports() as reports:
        got = iter(compiled(*[x.clone() for x in flat]))
    assert reports and not [str(f) for r in reports for f in r.fallbacks], "an op was not lowered"
    runs = zip(per_call(*flat), per_call(*map(strided, flat)))
    for (o, _), (want, scalar) in zip(calls, runs):
        for k, (w, s) in enumerate(zip(want, scalar)):
            name = f"{o.name}[{str(dtype)[6:]}, {entry}, output {k}]"
            check(name, next(got), w, same_bits(w, s), o.exact, o.tol, o.name in ZERO_TIES)
