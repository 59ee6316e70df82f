"""Expressions that share sub-expressions along exponentially many paths (a Python loop of
``torch.where(m, x, f(x))``, nested selects on index variables) cost the compiler work linear in
their size, not in their paths: in the fusion walk, substitution, simplification, the bounds check,
the C source and the printed form."""

import pytest
import torch

import tailjit
from tailjit import te
from tailjit.te.expr import SHOW_TREE_MAX


def where_steps(x, masks):
    for m in masks:  # each step reads x in both branches
        x = torch.where(m > 0, x, x * 2 + 1)
    return x


def index_select_chain(k: int):
    """``y[i] = exp(x[i])``, doubled once per index that is 1: ``k`` nested selects over one value,
    each on another index variable (the path conditions refine a different range each)."""
    x = te.placeholder((2,) * k, name="x")

    def body(*i):
        e = te.exp(x[i])
        for j in range(k):
            e = te.select(i[j] == 0, e, e * 2.0)
        return e

    return x, te.compute((2,) * k, body, name="y")


@pytest.mark.timeout(120)
def test_where_loop_compiles_in_linear_work():
    sources = {}
    for steps in (20, 40):
        x, masks = torch.randn(257), torch.randn(steps, 257)
        f = tailjit.jit(lambda x, masks: where_steps(x, masks.unbind(0)))
        torch.testing.assert_close(f(x, masks), where_steps(x, masks.unbind(0)))
        (report,) = f.reports
        sources[steps] = sum(len(k.source) for k, _ in report.kernels)
    # written as a tree, 20 more steps would multiply the source by 2**20
    assert sources[40] < 3 * sources[20]


@pytest.mark.timeout(120)
def test_nested_index_selects_build_in_linear_work():
    sizes = {}
    for k in (6, 12):
        x, y = index_select_chain(k)
        f = tailjit.build([y], [x])
        sizes[k] = len(f.source)
        xv = torch.rand((2,) * k) + 0.5
        ref = torch.exp(xv)
        for j in range(k):
            ref.narrow(j, 1, 1).mul_(2)
        torch.testing.assert_close(f(xv), ref)
    assert sizes[12] < 3 * sizes[6]


def test_more_than_sixteen_dimensions():
    # the runtime once sized an output's strides for at most 16 dimensions (a segfault beyond)
    x = torch.rand((1,) * 16 + (3, 2))
    torch.testing.assert_close(tailjit.jit(lambda x: x * 2 + 1)(x), x * 2 + 1)
    shape = (1,) * 15 + (2, 2, 2)  # and a te program of 18 dimensions
    big = te.placeholder(shape, name="big")
    out = te.compute(shape, lambda *i: big[i] + 1.0, name="out")
    xv = torch.rand(shape)
    torch.testing.assert_close(tailjit.build([out], [big])(xv), xv + 1)


def test_printing_names_shared_subexpressions():
    x = te.placeholder((4,), name="x")
    small = te.compute((4,), lambda i: te.select(i == 0, x[i], x[i] * 2), name="small")
    assert repr(small.body) == "select((i == 0), x[i], (x[i] * 2))"  # small: as a tree
    _, y = index_select_chain(30)  # 2**30 leaves as a tree
    text = repr(y.body)
    assert len(text) < 100 * SHOW_TREE_MAX
    assert text.startswith("select(") and " where %0 = " in text


def test_nested_row_buffers_are_walked_once_each():
    from tailjit.fusion import RowBuffer, _all_loads

    x = te.placeholder((8,), name="x")
    prev = x
    for k in range(12):  # each row buffer's body reads the previous one twice
        c = te.compute((8,), lambda i, prev=prev: prev[i] + prev[(i + 1) % 8], name=f"c{k}")
        prev = RowBuffer(c, ())
    loads = list(_all_loads(prev[0]))
    assert len(loads) == 1 + 2 * 12  # once per path would be 2**13 - 1
