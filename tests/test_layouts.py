"""Input layouts: kernels read an input whose last dimension is contiguous in place, at the row strides
the entry point passes (``tailjit.fusion.row_strided``); other layouts are copied first."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tailjit
from tailjit import te
from tailjit.runtime.kernel import Kernel


@pytest.fixture
def slow_calls(monkeypatch):
    """How many calls the C entry point sent to the Python side (which copies what it cannot read)."""
    count = [0]
    slow = Kernel._slow_call

    def counted(self, args, out):
        count[0] += 1
        return slow(self, args, out)

    monkeypatch.setattr(Kernel, "_slow_call", counted)
    return count


def _scale_add_and_row_sum():
    n, m = te.var("n"), te.var("m")
    x, y = te.placeholder((n, m), name="x"), te.placeholder((n, m), name="y")
    k = te.reduce_axis(m, "k")
    z = te.compute((n, m), lambda i, j: x[i, j] * 2 + y[i, j], name="z")
    s = te.compute((n,), lambda i: te.sum(x[i, k] * y[i, k], axis=k), name="s")
    return tailjit.build([z, s], [x, y])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.integers(0, 9),
    cols=st.integers(1, 70),
    start=st.integers(0, 3),
    step=st.integers(1, 3),
    lo=st.integers(0, 5),
    width=st.integers(0, 40),
    expand_y=st.booleans(),
)
def test_row_strided_views_are_read_in_place(slow_calls, rows, cols, start, step, lo, width, expand_y):
    f = _scale_add_and_row_sum()
    base = torch.randn(rows * step + start, lo + width + cols)
    base[::3, ::7] = float("nan")
    x = base[start::step, lo : lo + width]  # rows apart by step * row length, a window of each row
    y = torch.randn(1, width).expand(x.shape[0], width) if expand_y else base[start::step, lo + 1 : lo + 1 + width]
    slow_calls[0] = 0
    z, s = f(x, y)
    torch.testing.assert_close(z, x * 2 + y, equal_nan=True)
    torch.testing.assert_close(s, (x * y).sum(1), equal_nan=True)
    assert slow_calls[0] == 0


def test_the_gates_of_an_unbind_are_read_in_place(slow_calls):
    f = _scale_add_and_row_sum()
    pre = torch.randn(32, 4 * 128)
    gates = pre.view(32, 4, 128).unbind(1)
    z, s = f(gates[1], gates[3])
    torch.testing.assert_close(z, gates[1] * 2 + gates[3])
    torch.testing.assert_close(s, (gates[1] * gates[3]).sum(1))
    assert slow_calls[0] == 0


def test_other_layouts_are_copied(slow_calls):
    f = _scale_add_and_row_sum()
    x = torch.randn(33, 20).t()  # the last dimension strides by 20
    y = torch.randn(20, 33)
    z, s = f(x, y)
    torch.testing.assert_close(z, x * 2 + y)
    torch.testing.assert_close(s, (x * y).sum(1))
    assert slow_calls[0] == 1


def test_static_short_rows_keep_their_compile_time_stride():
    """A box's 4 coordinates: the loop over them is written out, so the row stride is a constant and a
    view of the boxes (the first 4 of 5 columns) is copied."""

    def area(b):
        return (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])

    boxes = torch.rand(100, 5)
    torch.testing.assert_close(tailjit.jit(area)(boxes[:, :4]), area(boxes[:, :4]))
    entry = tailjit.explain(area, boxes[:, :4]).split("tj_tensor_desc tj_inputs[]")[1]
    assert '"in0", "input \'in0\'", 3, 2, TJ_DENSE}' in entry and "TJ_ROWS" not in entry


def test_an_input_read_in_flat_order_is_contiguous_and_indexed_flat(slow_calls):
    """``flatten(1)`` of an image reads ``x[b, i // w, i % w]``: such an input is taken contiguous, so
    the two indices address ``i`` itself (a contiguous load, not a division and a gather); a view of it
    is copied first."""
    n, h, w = te.var("n"), 5, 40  # static sizes, as tailjit.jit traces them: the indices are proven in range
    x = te.placeholder((n, h, w), name="x")
    y = te.compute((n, h * w), lambda b, i: te.sigmoid(x[b, i // w, i % w]), name="y")
    f = tailjit.build(y, [x])
    loop = f.source[f.source.index("static int kern_y") : f.source.index("int run_kern_y")]
    assert "tj_fdiv" not in loop and "tj_fmod" not in loop
    xv = torch.randn(3, 5, 40)
    torch.testing.assert_close(f(xv), xv.flatten(1).sigmoid())
    assert slow_calls[0] == 0
    view = torch.randn(3, 5, 50)[:, :, 3:43]
    torch.testing.assert_close(f(view), view.flatten(1).sigmoid())
    assert slow_calls[0] == 1
    assert ", 3, TJ_DENSE}" in f.source and "TJ_ROWS}" not in f.source


def test_an_op_trains_on_the_gates_of_an_unbind():
    @tailjit.op
    def cell(gate_a, gate_b, c):
        n, h = c.shape
        return te.compute((n, h), lambda i, j: c[i, j] * te.sigmoid(gate_a[i, j]) + te.tanh(gate_b[i, j]), name="c2")

    pre = torch.randn(8, 2 * 40, dtype=torch.float64, requires_grad=True)
    c = torch.randn(8, 40, dtype=torch.float64, requires_grad=True)

    def ours(pre, c):
        return cell(*pre.view(8, 2, 40).unbind(1), c)

    def eager(pre, c):
        a, b = pre.view(8, 2, 40).unbind(1)
        return c * torch.sigmoid(a) + torch.tanh(b)

    torch.testing.assert_close(ours(pre, c), eager(pre, c))
    g = torch.randn(8, 40, dtype=torch.float64)
    want = torch.autograd.grad(eager(pre, c), (pre, c), g)
    got = torch.autograd.grad(ours(pre, c), (pre, c), g)
    torch.testing.assert_close(got, want)
    assert torch.autograd.gradcheck(ours, (pre, c))
