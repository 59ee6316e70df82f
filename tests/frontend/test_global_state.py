"""torch's global settings that a trace bakes in besides grad mode: the default dtype and autocast.  A call
under other settings than its trace's traces again, as Dynamo's global-state guard makes torch.compile do;
each case served the old trace before (a dtype error under autocast, float32 values where eager computes in
float64)."""

from __future__ import annotations

import pytest
import torch

import tailjit

ENTRIES = [lambda f: tailjit.jit(f), lambda f: torch.compile(f, backend="tailjit", dynamic=False)]
IDS = ["jit", "compile"]


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    yield
    torch.set_default_dtype(torch.float32)


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_a_new_default_dtype_traces_again(entry):
    def f(t):
        return t.double() + torch.ones(4) * 0.1 + torch.arange(4) / 3

    x = torch.randn(4)
    g = entry(f)
    torch.testing.assert_close(g(x), f(x), rtol=0, atol=0)
    torch.set_default_dtype(torch.float64)
    torch.testing.assert_close(g(x), f(x), rtol=0, atol=0)
    torch.set_default_dtype(torch.float32)
    torch.testing.assert_close(g(x), f(x), rtol=0, atol=0)


@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_autocast_entered_and_left_after_a_call(entry, grad):
    def f(a, b):
        return torch.sigmoid(a @ b).sum(1) * 2

    a, b = torch.randn(8, 16, requires_grad=grad), torch.randn(16, 4)
    g = entry(f)
    for autocast in (False, True, False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            want, got = f(a, b), g(a, b)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
        if grad:
            (want_grad,) = torch.autograd.grad(want.float().sum(), a)
            (got_grad,) = torch.autograd.grad(got.float().sum(), a)
            torch.testing.assert_close(got_grad, want_grad, rtol=2e-2, atol=2e-2)
