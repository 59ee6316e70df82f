"""Broadcast (stride-0) inputs stay views: a kernel reads the one element a broadcast dimension holds.

``torch.ones(1).expand(2**31)`` is 4 bytes of memory; copying it contiguous for a kernel took 8 GiB.  Both
entries read such an input through ``host.code._broadcast_base`` instead, and fall back to the region's eager
path when a later call's input is not broadcast after all.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from unittest import mock

import pytest
import torch

import tailjit
import tailjit.frontend  # noqa: F401  (registers the backend)
from tailjit.frontend.host import code

ENTRIES = {
    "compile": lambda fn: torch.compile(fn, backend="tailjit", dynamic=True),
    "jit": tailjit.jit,
}


def _compiled(entry, fn):
    torch._dynamo.reset()
    return ENTRIES[entry](fn)


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_an_expanded_input_is_not_copied(entry):
    """Peak memory grows by far less than the dense size of a 2**27-element expanded input (512 MiB)."""
    n = 2**27
    script = textwrap.dedent(f"""
        import resource, torch, tailjit
        fn = lambda x: x.sum() * 2
        compiled = torch.compile(fn, backend="tailjit", dynamic=True) if {entry!r} == "compile" else tailjit.jit(fn)
        for m in (1000, 3000):  # the trace for any size, built before the measurement
            compiled(torch.ones(1).expand(m))
        x = torch.full((1,), 0.5).expand({n})
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        got = compiled(x)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        assert torch.equal(got, fn(x)), (got, fn(x))
        print(grown)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    grown_kib = int(done.stdout.split()[-1])
    assert grown_kib * 1024 < n * 4 / 8, f"peak memory grew by {grown_kib} KiB"


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_broadcast_inputs_give_eager_values(entry):
    """Inputs broadcast in several dimensions, beside a dense one, read by reductions and element-wise ops;
    the same trace later called with dense inputs of the same shapes (not broadcast: the eager path)."""

    def fn(x, y, z):
        return (x * y).sum(1), (x + z).amax(0), torch.relu(y - z) * 2

    row, col = torch.randn(1, 5), torch.randn(4, 1)
    args = (row.expand(4, 5), col.expand(4, 5), torch.randn(4, 5))
    views, original = [], code._broadcast_base

    def base(x, dims):
        views.append(original(x, dims))  # raises for an input that is not broadcast
        return views[-1]

    with mock.patch.object(code, "_broadcast_base", base):
        compiled = _compiled(entry, fn)
        got = compiled(*args)
        assert [v.shape for v in views] == [(1, 5), (4, 1)]  # the kernel read the two broadcast inputs' elements
        for g, w in zip(got, fn(*args)):
            torch.testing.assert_close(g, w)
        dense = tuple(a.contiguous() + torch.randn(4, 5) for a in args[:2]) + (args[2],)
        for g, w in zip(compiled(*dense), fn(*dense)):
            torch.testing.assert_close(g, w)


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_a_broadcast_input_that_requires_grad_gets_eager_gradients(entry):
    """A gradient flows into every element of a broadcast input that requires grad: it is read whole."""

    def fn(x, w):
        return (x * w).sum()

    x = torch.randn(1, 3).expand(4, 3).detach().requires_grad_()
    w = torch.randn(4, 3)
    xe = x.detach().clone().requires_grad_()
    _compiled(entry, fn)(x, w).backward()
    fn(xe, w).backward()
    torch.testing.assert_close(x.grad, xe.grad)
