"""Partial updates of values a graph computes are written into the part only (``tailjit/frontend/lower/reinplace.py``),
and only where no later node reads the old elements: values and gradients against eager."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tailjit
import tailjit.frontend  # noqa: F401  (registers the backend)
from tailjit.bench.ops import all_operators
from tailjit.frontend.plan.report import collect_reports
from tailjit.frontend.train import expr_grad

#: ``out[b, :n] = x[b, :n].flip(0)`` with ``n = lengths[b].item()``, per sequence of the batch
reverse_padded = all_operators()["reverse_padded_sequence"].fn


def _kernel_nodes(reports) -> list[str]:
    return [name for r in reports for _, names in r.kernels for name in names]


def test_updates_of_a_clone_write_the_part_only():
    """Each ``out[b, :n] = ...`` is a copy into the part: functionalised as it stands, each step was a kernel
    rebuilding the whole (B, T, D) tensor, quadratic in B."""
    f = tailjit.jit(reverse_padded)
    with collect_reports() as reports:
        for lengths in (torch.tensor([5, 8, 0, 1]), torch.tensor([8, 3, 2, 7])):
            x = torch.randn(4, 8, 3)
            torch.testing.assert_close(f(x, lengths), reverse_padded(x, lengths), rtol=0, atol=0)
    assert not any("scatter" in n for n in _kernel_nodes(reports)), _kernel_nodes(reports)
    copies = [fb for r in reports for fb in r.fallbacks if fb.target == "aten.copy_.default"]
    assert len(copies) == 4, reports[0].fallbacks


@pytest.mark.parametrize("route", ["aot", "expression"])
def test_updates_of_a_clone_differentiate_as_in_eager(route, monkeypatch):
    """Through AOTAutograd (made to by counting ``aten.copy`` as unchecked), the forward and backward graphs
    narrow their updates; a graph tailjit differentiates itself (the route ``aten.copy`` takes) does not: a
    write into a region's output would change what autograd saved of it.  Both give eager's gradient."""
    if route == "aot":
        monkeypatch.setattr(expr_grad, "FAITHFUL", expr_grad.FAITHFUL - {torch.ops.aten.copy.default})
    x, lengths, head = torch.randn(3, 6, 2), torch.tensor([4, 6, 0]), torch.randn(3, 6, 2)
    leaf, want = x.clone().requires_grad_(), x.clone().requires_grad_()
    f = tailjit.jit(reverse_padded)
    f(leaf, lengths).backward(head)
    reverse_padded(want, lengths).backward(head)
    torch.testing.assert_close(leaf.grad, want.grad, rtol=0, atol=0)
    assert ("expressions" in f.reports[0].note) == (route == "expression"), f.reports[0].note


def _same(got, want):
    got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def test_an_update_whose_old_value_is_read_afterwards_stays_whole():
    """Functional scatters whose base (or a view of it) is read after them: writing in place would change what
    those reads see."""

    def old_read(x, v, i):
        base = x * 2
        new = torch.select_scatter(base, v, 0, i.item())
        return new + base

    def old_view_read(x, v, i):
        base = x * 2
        row = base.select(0, i.item())
        new = torch.select_scatter(base, v, 0, i.item())
        return new * 1, row * 3

    x, v = torch.randn(3, 4), torch.randn(4)
    for fn in (old_read, old_view_read):
        f = tailjit.jit(fn)
        for i in (1, 2):
            _same(f(x, v, torch.tensor(i)), fn(x, v, torch.tensor(i)))


def test_a_value_sharing_the_updated_memory_is_not_copied_into_it():
    """A functional ``slice_scatter(out, out[:, :n], 1, 1, n + 1)``: the value is a view of the base itself, which
    a copy into the part would overlap (and, along rows, overwrite before reading); the update stays whole."""

    def shift(x, n):
        n = n.item()
        out = x * 2
        out = torch.slice_scatter(out, out[:, :n], 1, 1, n + 1)
        out[:, n:] = out[:, :-n] * 1  # a fresh value: written into the part
        return out

    f = tailjit.jit(shift)
    for n in (2, 4):
        x = torch.randn(6, 7)
        _same(f(x, torch.tensor(n)), shift(x, torch.tensor(n)))


# A random program of updates, reads and views of one computed value, at places read from data (``idx``), run
# through tailjit.jit and eager.
_STEP = st.one_of(
    st.tuples(st.just("set_row"), st.integers(0, 4), st.integers(0, 4)),  # out[idx[a]] = x[b] * 3
    st.tuples(st.just("add_part"), st.integers(0, 4), st.integers(0, 4)),  # out[a:idx[b]] += 1 (reads the old part)
    st.tuples(st.just("snapshot"), st.just(0), st.just(0)),  # outs.append(out * 1)
    st.tuples(st.just("functional"), st.integers(0, 4), st.integers(0, 4)),  # select_scatter, old value kept
    st.tuples(st.just("view"), st.integers(0, 4), st.just(0)),  # v = out[idx[a]] (a view), read at the end
)


def _program(steps):
    def fn(x, idx):
        out = x * 2
        outs, views, olds = [], [], []
        for kind, a, b in steps:
            if kind == "set_row":
                out[idx[a].item()] = x[b] * 3
            elif kind == "add_part":
                out[a : idx[b].item()] += 1
            elif kind == "snapshot":
                outs.append(out * 1)
            elif kind == "functional":
                olds.append(out)
                out = torch.select_scatter(out, x[b] - 1, 0, idx[a].item())
            else:
                views.append(out.select(0, idx[a].item()))
        return (out, *outs, *[v * 1 for v in views], *[o * 1 for o in olds])

    return fn


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_STEP, min_size=1, max_size=6))
def test_random_update_programs_match_eager(steps):
    fn = _program(steps)
    f = tailjit.jit(fn)
    for idx in (torch.tensor([4, 0, 2, 3, 1]), torch.tensor([1, 1, 4, 0, 2])):
        x = torch.randn(5, 3)
        _same(f(x, idx), fn(x, idx))
