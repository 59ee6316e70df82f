"""tailjit.jit against eager PyTorch: signatures, guards, autograd, fallback, explain."""

from __future__ import annotations

import copy
import importlib
import logging
import math
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tailjit
from tailjit.bench.ops import all_operators
from tailjit.frontend.trace import captures
from tailjit.frontend.train import expr_grad
from tailjit.runtime import compiler


def _same(got, want):
    if isinstance(want, (tuple, list)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
    elif isinstance(want, dict):
        assert got.keys() == want.keys()
        for k in want:
            _same(got[k], want[k])
    else:
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, equal_nan=True)


def box_decode(boxes, deltas, max_ratio: float = 4.135):
    w = boxes[:, 2] - boxes[:, 0]
    h = boxes[:, 3] - boxes[:, 1]
    cx, cy = boxes[:, 0] + 0.5 * w, boxes[:, 1] + 0.5 * h
    dw, dh = deltas[:, 2].clamp(max=max_ratio), deltas[:, 3].clamp(max=max_ratio)
    px, py = cx + deltas[:, 0] * w, cy + deltas[:, 1] * h
    pw, ph = w * dw.exp(), h * dh.exp()
    return torch.stack([px - 0.5 * pw, py - 0.5 * ph, px + 0.5 * pw, py + 0.5 * ph], 1)


def _boxes(n):
    xy = torch.rand(n, 2) * 10
    return torch.cat([xy, xy + torch.rand(n, 2) * 5 + 0.1], 1)


def test_values_and_two_traces_for_many_sizes():
    """A static trace first; the second size traces with symbols, and every later size reuses
    that trace and its kernel (no new trace, no C compile)."""
    f = tailjit.jit(box_decode)
    a, d = _boxes(8), torch.randn(8, 4)
    _same(f(a, d), box_decode(a, d))
    assert len(f.reports) == 1 and not f.reports[0].fallbacks and len(f.reports[0].kernels) == 1
    assert "static sizes" in f.reports[0].note
    for m in (3, 17, 64, 8):
        a, d = _boxes(m), torch.randn(m, 4)
        _same(f(a, d), box_decode(a, d))
    assert len(f.reports) == 2 and "symbolic sizes" in f.reports[1].note
    loaded = len(compiler._loaded)
    a, d = _boxes(5), torch.randn(5, 4)
    g = tailjit.jit(box_decode)  # a new function: its traces reuse the kernels compiled above
    _same(g(a, d), box_decode(a, d))
    _same(g(a[:3], d[:3]), box_decode(a[:3], d[:3]))
    assert len(g.reports) == 2 and len(compiler._loaded) == loaded + 1  # only the static kernel for 5 is new


def test_a_static_trace_guards_exact_sizes():
    f = tailjit.jit(lambda x: x.reshape(-1, 2).sum(1))
    x = torch.randn(3, 4)
    _same(f(x), x.reshape(-1, 2).sum(1))
    y = torch.randn(4, 3)  # same numel, other shape: the static trace must not serve it
    _same(f(y), y.reshape(-1, 2).sum(1))
    _same(f(x), x.reshape(-1, 2).sum(1))
    assert len(f.reports) == 2


def test_signature_changes_trace_again():
    f = tailjit.jit(lambda x, y: (x * y).sum(-1))
    x32, y32 = torch.randn(4, 5), torch.randn(4, 5)
    _same(f(x32, y32), (x32 * y32).sum(-1))
    _same(f(x32.double(), y32.double()), (x32.double() * y32.double()).sum(-1))  # dtype
    x3 = torch.randn(2, 4, 5)
    _same(f(x3, y32), (x3 * y32).sum(-1))  # rank
    assert len(f.reports) == 3
    _same(f(x32[:, :3], y32[:, :3]), (x32[:, :3] * y32[:, :3]).sum(-1))  # a new size: a symbolic trace
    _same(f(x32[:2, 1:4], y32[:2, :3]), (x32[:2, 1:4] * y32[:2, :3]).sum(-1))  # sizes and strides: no new trace
    assert len(f.reports) == 4


def test_size_one_broadcast_and_equal_sizes_are_guarded():
    f = tailjit.jit(lambda x, y: x + y)
    x, y = torch.randn(5, 4), torch.randn(5, 4)
    _same(f(x, y), x + y)
    y1 = torch.randn(1, 4)  # a broadcast dimension: the first trace assumed equal sizes
    _same(f(x, y1), x + y1)
    y2 = torch.randn(5, 1)
    _same(f(x, y2), x + y2)
    assert len(f.reports) == 3
    with pytest.raises(RuntimeError, match="must match|size"):
        f(x, torch.randn(3, 4))


def test_python_loop_over_a_size_specialises_on_it():
    def discounted(r, gamma: float = 0.9):
        out, acc = [], torch.zeros_like(r[0])
        for t in range(r.shape[0] - 1, -1, -1):
            acc = r[t] + gamma * acc
            out.append(acc)
        return torch.stack(out[::-1])

    f = tailjit.jit(discounted)
    for t in (4, 6, 4):
        r = torch.randn(t, 3)
        _same(f(r), discounted(r))
    assert len(f.reports) == 2  # one trace per length: the loop unrolled


def test_static_arguments():
    def scale(x, k, mode="mul"):
        return x * k if mode == "mul" else x + k

    f = tailjit.jit(scale, static_argnums=(1,), static_argnames=("mode",))
    x = torch.randn(6)
    _same(f(x, 2), x * 2)
    _same(f(x, 3), x * 3)
    _same(f(x, 3, mode="add"), x + 3)
    _same(f(x, k=3, mode="add"), x + 3)  # static by position, passed by keyword
    assert len(f.reports) == 3
    with pytest.raises(TypeError, match="hashable"):
        tailjit.jit(lambda x, opts: x * len(opts))(x, bytearray(b"ab"))


def test_pytree_arguments_and_outputs():
    def fn(xs, d, *, scale):
        return {"sum": xs[0] + xs[1] * scale, "pair": (d["w"].exp(), d["w"] > 0)}

    f = tailjit.jit(fn)
    xs, d = [torch.randn(3), torch.randn(3)], {"w": torch.randn(2, 2)}
    _same(f(xs, d, scale=2.0), fn(xs, d, scale=2.0))
    _same(f(xs, d, scale=2.0), fn(xs, d, scale=2.0))
    assert len(f.reports) == 1


def test_autograd_compiles_the_backward():
    def loss(pred, target, w):
        d = pred - target
        return (w * torch.where(d * d < 1, 0.5 * d * d, d.exp() - 0.5)).sum()

    f = tailjit.jit(loss)
    p, t, w = torch.randn(6, 4, requires_grad=True), torch.randn(6, 4), torch.rand(4, requires_grad=True)
    out = f(p, t, w)
    assert out.requires_grad
    out.backward()
    gp, gw = p.grad.clone(), w.grad.clone()
    p.grad = w.grad = None
    loss(p, t, w).backward()
    torch.testing.assert_close(gp, p.grad)
    torch.testing.assert_close(gw, w.grad)
    # one trace, differentiated by tailjit: the forward kernel and its gradient kernel, built together
    (report,) = f.reports
    assert report.kind == "jit" and "differentiated by its tensor expressions" in report.note
    (forward, _), (backward, _) = report.kernels
    assert backward.name.endswith("_backward") and backward.source is forward.source
    assert not report.fallbacks
    with torch.no_grad():  # grad mode off: the inference trace, plain outputs
        assert not f(p, t, w).requires_grad
    for n in (9, 5):  # a new size: one symbolic trace, then reused
        p2 = torch.randn(n, 4, requires_grad=True)
        f(p2, torch.randn(n, 4), w).backward()
        assert p2.grad is not None
    assert [r.kind for r in f.reports] == ["jit", "jit", "jit"]
    assert "symbolic sizes" in f.reports[-1].note


def _training_route(fn, *args):
    """Run ``fn`` through tailjit.jit forward and backward against eager; the first report's note."""
    f = tailjit.jit(fn)
    leaves = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    got = f(*leaves)
    got.sum().backward()
    want = fn(*args)
    want.sum().backward()
    torch.testing.assert_close(got, want)
    for a, b in zip(leaves, args):
        if b.requires_grad:
            torch.testing.assert_close(a.grad, b.grad)
    return f.reports[0].note


def test_training_takes_aot_autograd_where_a_forward_trace_loses_autograd():
    """A forward-only trace does not see what autograd would do differently; those functions go through
    AOTAutograd, with the reason in the report, and their gradients are eager's."""

    def view_under_no_grad(x):
        with torch.no_grad():
            s = x[1:]
        return x[:-1] * s

    def custom_function(x):
        return _Twice.apply(x) * x

    def custom_function_enabling_grad(x):
        return _EnablesGrad.apply(x) * x

    cases = {
        view_under_no_grad: "grad mode off",
        custom_function: "custom autograd.Function",
        custom_function_enabling_grad: "custom autograd.Function",
        lambda x: x * x.data: "Tensor.data cuts",
        lambda x: torch.nn.functional.hardswish(x) * 2: "aten.hardswish.default is not checked",
        _write_after_detach: "writes in place to memory a detach()ed value shares",
    }
    for fn, why in cases.items():
        note = _training_route(fn, torch.randn(5, requires_grad=True))
        assert "AOTAutograd because" in note and why in note, note


def _write_after_detach(x):
    y = x * 2
    d = y.detach()  # shares y's memory in eager: the write below changes it
    y.add_(1)
    return x * d


def test_detach_is_a_stop_gradient_on_tailjits_route():
    """``detach()`` in a training trace becomes a stop-gradient of the tensor expressions: the gradient
    through the rest is eager's, a detached output has no grad_fn (and ``x ** 0``, which reads no input,
    keeps one, as in eager), and an op whose values reach the outputs only through the detach
    (``max.dim``, whose expression gradient is not eager's) does not send the graph to AOTAutograd."""

    def stable_softmax(x):
        m, _ = x.max(dim=1, keepdim=True)
        e = (x - m.detach()).exp()
        return e / e.sum(1, keepdim=True)

    def weighted(x, t):
        w = ((x - t).abs() * 3).detach()
        return (x - t) ** 2 * w

    def detached_out(x):
        return x.exp(), torch.detach(x * 2), x**0

    x = torch.randn(4, 6, requires_grad=True)
    assert "differentiated by its tensor expressions" in _training_route(stable_softmax, x)
    assert "differentiated by its tensor expressions" in _training_route(weighted, x, torch.randn(4, 6))
    for f in (tailjit.jit(detached_out), torch.compile(detached_out, backend="tailjit")):
        got, want = f(x), detached_out(x)
        assert [g.requires_grad for g in got] == [w.requires_grad for w in want] == [True, False, True]
        torch.testing.assert_close(got, want)
        (gx,) = torch.autograd.grad(got[0].sum() + got[2].sum(), x)
        torch.testing.assert_close(gx, x.detach().exp())


def test_no_grad_blocks_are_stop_gradients_on_tailjits_route():
    """A value computed under ``torch.no_grad()`` (CIoU's ``alpha``) is cut off as by a ``detach()``; a
    custom ``autograd.Function`` called inside the block records nothing, as in eager, and
    ``torch.enable_grad()`` inside it differentiates again."""

    def ciou_like(x, y):
        v = (x - y) ** 2
        with torch.no_grad():
            alpha = v / (1 + v)
            twice = _Twice.apply(x)
            with torch.enable_grad():
                again = x.sin()
        return v * alpha + twice * x + again

    note = _training_route(ciou_like, torch.randn(4, 5, requires_grad=True), torch.randn(4, 5))
    assert "differentiated by its tensor expressions" in note, note


class _Twice(torch.autograd.Function):
    @staticmethod
    def forward(x):
        return x * 2

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        return g * 3  # not the derivative: tailjit's own gradient of the forward would give 2


class _EnablesGrad(_Twice):
    """``_Twice`` whose forward turns grad mode back on and off: ops after that still run with it off (by
    the Function's apply), where a probe that only watched ``torch.no_grad()`` would take them for a block."""

    @staticmethod
    def forward(x):
        with torch.enable_grad():
            pass
        return x * 2


def test_training_with_in_place_ops_on_intermediates_takes_tailjits_route():
    """The training trace is functionalised after the probe saw the ops autograd sees: ``sub_`` counts as
    ``sub``, and binary_cross_entropy_with_logits (which functionalisation would decompose) as itself."""

    def fn(x, t):
        y = x * 2
        y.sub_(1)
        return torch.nn.functional.binary_cross_entropy_with_logits(y, t, reduction="none") * y.exp()

    note = _training_route(fn, torch.randn(3, 4, requires_grad=True), torch.rand(3, 4, requires_grad=True))
    assert "differentiated by its tensor expressions" in note, note


def test_a_constant_table_filled_in_place_keeps_tailjits_route():
    """Ops none of whose inputs requires grad (a position table filled slice by slice: ``arange``, a
    ``copy_`` into a slice) are no part of eager's backward, so they do not send the graph to AOTAutograd;
    the same fill with a value that requires grad is checked: ``copy_`` is faithful, an unchecked op
    (``hardswish``) on the way sends the graph to AOTAutograd."""
    op = all_operators()["sinusoidal_positional_encoding"]
    (x,) = op.inputs("small", 0)
    note = _training_route(op.fn, x[:2, :16].clone().requires_grad_())
    assert "differentiated by its tensor expressions" in note, note

    def fill_with_x(x, act=torch.sin):
        table = torch.zeros(x.shape[0], 2 * x.shape[1])
        table[:, 0::2] = act(x)
        return table * 3

    note = _training_route(fill_with_x, torch.randn(4, 3, requires_grad=True))
    assert "differentiated by its tensor expressions" in note, note
    x = torch.randn(4, 3, requires_grad=True)
    note = _training_route(lambda x: fill_with_x(x, torch.nn.functional.hardswish), x)
    assert "AOTAutograd because" in note and "aten.hardswish.default" in note, note


def _update_chain(x, w):
    d = x * 2
    before = d.sum()  # the old value, read before the updates
    d.sub_(w).div_(w + 3)
    return d * before


def _update_masked(x, w):
    d = x * w
    d.masked_fill_(x > 0, 0.5)
    return d.exp()


def _update_seen_by_a_view(x, w):
    d = x * 2
    row = d[0]  # a view: it sees the update
    d.add_(w)
    return row * w


def _update_of_another_dtype(x, w):
    d = x * 2
    d.add_(w.double())  # stays float32 in place; the out-of-place add would be float64
    return d


def _update_of_an_input(x, w):
    w.mul_(2)
    return x * w


@pytest.mark.parametrize(
    "fn, rewritten",
    [(_update_chain, True), (_update_masked, True), (_update_seen_by_a_view, False),
     (_update_of_another_dtype, False), (_update_of_an_input, False)],
)  # fmt: skip
def test_in_place_updates_of_unshared_values_become_values_without_a_retrace(fn, rewritten):
    """A training trace's in-place ops on memory nothing else shares are rewritten out of place in the graph
    (the retrace that functionalises the rest cost 60 ms for bbox2delta); the others leave it untouched."""
    from torch.fx.experimental.proxy_tensor import make_fx

    x, w = torch.randn(3, 4), torch.randn(3, 4)
    gm = make_fx(fn, tracing_mode="fake")(x, w.clone())
    code = gm.code
    assert expr_grad._values_for_updates(gm) is rewritten
    if not rewritten:
        assert gm.code == code
        return
    assert not any(n.op == "call_function" and n.target._schema.is_mutable for n in gm.graph.nodes)
    _same(gm(x, w), fn(x, w))
    leaves = [t.clone().requires_grad_() for t in (x, w)]
    tailjit.jit(fn)(*leaves).sum().backward()
    want = [t.clone().requires_grad_() for t in (x, w)]
    fn(*want).sum().backward()
    _same([t.grad for t in leaves], [t.grad for t in want])


def test_training_with_an_extern_call_differentiates_the_rest():
    """The regions get tailjit's gradients; the matmul between them (an extern call through the dispatcher)
    gets eager's."""
    note = _training_route(lambda a, b: torch.tanh(a @ b.exp()).clamp(min=0), torch.randn(3, 4, requires_grad=True),
                           torch.randn(4, 2, requires_grad=True))  # fmt: skip
    assert "differentiated by its tensor expressions" in note


def test_training_that_writes_to_an_input_takes_aot_autograd():
    def fn(x, counts):
        counts.add_(1)
        return x * counts

    x, counts, ref = torch.randn(4, requires_grad=True), torch.zeros(4), torch.zeros(4)
    f = tailjit.jit(fn)
    f(x, counts).sum().backward()
    fn(x.detach().requires_grad_(), ref)
    assert torch.equal(counts, ref) and torch.equal(x.grad, torch.ones(4))
    assert "AOTAutograd because" in f.reports[0].note and "writes to the input" in f.reports[0].note


def test_training_saves_what_static_sizes_would(monkeypatch):
    """With symbolic sizes the backward reads intermediates' sizes; those reads must not make the
    partitioner save the (N, M, 2) intersection, which it recomputes from the boxes (through AOTAutograd,
    which tailjit's own gradients would otherwise replace here)."""
    monkeypatch.setattr(expr_grad, "FAITHFUL", frozenset())

    def pairwise_iou(b1, b2):
        lt = torch.max(b1[:, None, :2], b2[None, :, :2])
        rb = torch.min(b1[:, None, 2:], b2[None, :, 2:])
        wh = (rb - lt).clamp(min=0)
        inter = wh[:, :, 0] * wh[:, :, 1]
        area1 = (b1[:, 2] - b1[:, 0]) * (b1[:, 3] - b1[:, 1])
        area2 = (b2[:, 2] - b2[:, 0]) * (b2[:, 3] - b2[:, 1])
        return (inter / (area1[:, None] + area2[None, :] - inter).clamp(min=1e-6)).sum()

    b1, b2 = torch.rand(7, 4) * 5, torch.rand(5, 4) * 5
    b1[:, 2:] += b1[:, :2]
    b2[:, 2:] += b2[:, :2]
    b1.requires_grad_()
    f = tailjit.jit(pairwise_iou)
    f(b1[:3].detach().requires_grad_(), b2)  # one size first: the trace below is the symbolic one
    (got,) = torch.autograd.grad(f(b1, b2), b1)
    (want,) = torch.autograd.grad(pairwise_iou(b1, b2), b1)
    torch.testing.assert_close(got, want)
    forward = [r for r in f.reports if r.kind == "forward"][-1]
    assert "symbolic sizes" in forward.note
    saved = forward.captured.split("return (")[-1]
    assert saved.count(",") == 2 and "primals_1" in saved, saved  # the loss and the two inputs


def test_training_reads_the_reductions_the_forward_buffers():
    """A reduction the forward kernel writes to a buffer of its own (the routing's softmax sums, read
    by several kernels) becomes an extra output of that kernel, which the backward reads instead of
    recomputing; one that fusion keeps in registers stays there."""

    def routing(u, b):
        c = torch.softmax(b, dim=1)  # (N, J): the row sum is read by the output and by v
        s = (c[..., None] * u).sum(1)
        v = s * s.norm(dim=-1, keepdim=True)
        return v, c

    u, b = torch.randn(6, 5, 3, requires_grad=True), torch.randn(6, 5, requires_grad=True)
    f = tailjit.jit(routing)
    got = f(u, b)
    heads = (torch.randn(6, 3), torch.randn(6, 5))
    grads = torch.autograd.grad(got, (u, b), heads)
    want = torch.autograd.grad(routing(u, b), (u, b), heads)
    for g, w in zip(grads, want):
        torch.testing.assert_close(g, w)
    (report,) = f.reports
    (forward, _), (backward, _) = report.kernels
    assert forward.n_saved > 0
    kept = forward.output_names[-forward.n_saved :]
    assert [f"{n}_saved" for n in kept] == backward.input_names[-len(kept) - 2 : -2]  # before the 2 heads
    # a backward for fewer inputs (built on first use) reads the same saved values
    # (the region orders its inputs and outputs its own way; here their shapes tell them apart)
    ins = sorted([u.detach(), b.detach()], key=lambda t: [p.ndim for p in forward._inputs].index(t.ndim))
    outs = forward(*ins)
    assert len(outs) == 2 + forward.n_saved
    only_b = forward.gradient_kernel(tuple(t.ndim == 2 for t in ins))  # b alone
    assert only_b is not backward
    head_of = {tuple(h.shape): h for h in heads}
    torch.testing.assert_close(only_b(*ins, *outs, *(head_of[tuple(o.shape)] for o in outs[:2])), want[1])


@pytest.mark.parametrize("rows", [8, 40])
def test_a_loss_saves_its_row_statistics_from_inside_its_mean(rows):
    """The whole loss is one kernel, the row maximum and sum computed per row inside the mean over rows:
    that loop stores them for the backward (no loop nest more), unless it is written out (8 rows)."""

    def lsce(x, y):
        logp = x.log_softmax(dim=1)
        return (-0.9 * logp.gather(1, y[:, None]).squeeze(1) - 0.1 * logp.mean(dim=1)).mean()

    x, y = torch.randn(rows, 11, requires_grad=True), torch.randint(0, 11, (rows,))
    x.data[1, 2], x.data[3, :] = float("inf"), float("-inf")
    f = tailjit.jit(lsce)
    for _ in range(2):
        (g,) = torch.autograd.grad(f(x, y), x)
        (w,) = torch.autograd.grad(lsce(x, y), x)
        torch.testing.assert_close(g, w, equal_nan=True)
        x.data[1, 2], x.data[3, :] = 0.5, 0.25
    (forward, _), (backward, _) = f.reports[0].kernels
    assert len(forward.kernels) == 1
    assert forward.n_saved == (0 if rows == 8 else 2)
    if rows == 40:
        assert not any("max(" in k.body for k in backward.kernels)


def test_row_statistics_computed_per_row_are_saved_as_side_outputs():
    """A softmax's row maximum and sum (keepdim) are computed once per row in the one forward loop nest,
    which also stores them for the backward: no loop nest more in the forward, none to recompute them in
    the backward."""

    def softmax_scaled(x, w):
        e = torch.exp(x - x.amax(1, keepdim=True))
        return e / e.sum(1, keepdim=True) * w

    x, w = torch.randn(8, 11, requires_grad=True), torch.randn(11, requires_grad=True)
    x.data[2, 3] = float("-inf")
    f = tailjit.jit(softmax_scaled)
    head = torch.randn(8, 11)
    got = torch.autograd.grad(f(x, w), (x, w), head)
    want = torch.autograd.grad(softmax_scaled(x, w), (x, w), head)
    for g, ref in zip(got, want):
        torch.testing.assert_close(g, ref)
    (forward, _), (backward, _) = f.reports[0].kernels
    assert forward.n_saved == 2 and len(forward.kernels) == 1
    assert "also writes" in forward.kernels[0].role
    assert not any("max(" in k.body or "sum(exp" in k.body for k in backward.kernels)


def test_in_place_mutation_and_aliasing_follow_eager():
    def fn(x, y):
        x.mul_(2)
        return y.t(), x + 1

    f = tailjit.jit(fn)
    x, y = torch.randn(3), torch.randn(2, 3)
    xe = x.clone()
    t, z = f(x, y)
    fn(xe, y)
    assert torch.equal(x, xe)
    assert t.data_ptr() == y.data_ptr() and torch.equal(z, xe + 1)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64])
def test_augmented_bitwise_assignments_trace_without_a_fallback(dtype):
    """``m &= k`` calls ``aten.__iand__``, whose schema functionalisation rejects: the trace runs it as
    ``bitwise_and_``, also into a view and into an input."""

    def fn(a, b):
        m = a.clone()
        m &= b
        m[1:] |= a[:-1]
        m ^= b
        b &= a
        return m

    f = tailjit.jit(fn)
    a, b = torch.randint(0, 4, (2, 9)).to(dtype)
    got_b, want_b = b.clone(), b.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _same(f(a, got_b), fn(a, want_b))
    _same(got_b, want_b)
    assert f.fallback is None


def test_the_same_tensor_passed_twice_is_traced_as_two_inputs():
    """``f(x, x)`` used to trace both arguments as one placeholder, and a later ``f(x, y)`` read ``y``
    twice; training too."""

    def axpy(a, b):
        return a + 2 * b

    f = tailjit.jit(axpy)
    x, y = torch.ones(3), torch.arange(3.0)
    _same(f(x, x), axpy(x, x))
    _same(f(x, y), axpy(x, y))
    g = tailjit.jit(axpy)
    w, v = torch.ones(3, requires_grad=True), torch.arange(3.0, requires_grad=True)
    g(w, w).sum().backward()
    _same(w.grad, torch.full((3,), 3.0))
    w.grad = None
    g(w, v).sum().backward()
    _same((w.grad, v.grad), (torch.ones(3), torch.full((3,), 2.0)))


def test_a_write_into_an_input_that_shares_memory_with_another_follows_eager():
    """A trace that writes into its inputs assumes they do not share memory; a call where they do takes a
    trace of its own through AOTAutograd, which keeps eager's meaning."""

    def bump_then_read(a, b):
        a.add_(1)
        return b * 2

    f = tailjit.jit(bump_then_read)
    for same in (False, True, False, True):
        x, y = torch.zeros(3), torch.arange(3.0)
        xe, ye = x.clone(), y.clone()
        got = f(x, x) if same else f(x, y)
        want = bump_then_read(xe, xe) if same else bump_then_read(xe, ye)
        _same(got, want)
        _same(x, xe)
    assert len(f.reports) == 2


def _paths(f) -> int:
    return sum(e.speculative for entries in f.entries.values() for e in entries)


def _jit_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "tailjit.jit" in str(w.message)]


@pytest.mark.parametrize("outer", ["jit", "compile", "functionalize", "vmap"])
def test_a_jit_function_called_inside_a_trace_or_a_transform_joins_it(outer):
    """Inside another trace or a torch.func transform the tensors hold no data: the jitted function runs
    as its Python there, so its ops join the outer trace (its compiled kernels used to read the tensors'
    null data pointers, a segfault)."""
    inner = tailjit.jit(lambda x: torch.tanh(x) * 2)

    def fn(x):
        return inner(x) + 1

    x = torch.rand(3, 4)
    _same(inner(x), torch.tanh(x) * 2)  # compiled, with an entry the outer calls would match
    wrap = {"jit": tailjit.jit, "compile": lambda f: torch.compile(f, backend="tailjit"),
            "functionalize": torch.func.functionalize, "vmap": torch.vmap}[outer]  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = wrap(fn)
        _same(f(x), torch.tanh(x) * 2 + 1)
    assert not _jit_warnings(caught)
    if outer == "jit":
        assert f.fallback is None and "tanh" in f.reports[0].captured


def test_control_flow_on_values_is_traced_speculatively_one_path_per_outcome(caplog, monkeypatch):
    """``if x.sum() > 0`` takes one trace per outcome, each guarded by the value it read; a call whose
    guard fails drops its outputs and runs the other path.  Torch's log line for each branch a hint
    decides is not printed."""

    def fn(x):
        if x.sum() > 0:
            return x * 2
        return x - 5

    f = tailjit.jit(fn)
    pos, neg = torch.ones(5), -torch.ones(5)
    shapes_log = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    monkeypatch.setattr(shapes_log, "handlers", [*shapes_log.handlers, caplog.handler])  # torch's do not propagate
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x in (pos, pos, neg, neg, pos, neg, pos):
            _same(f(x), fn(x))
    assert not _jit_warnings(caught) and f.fallback is None
    assert _paths(f) == 2 and f.misses == 3  # the first neg; then each pos tries the newer neg path first
    assert re.search(r"speculating on \d+ assertions on values read from data", f.reports[0].note)
    assert not [r for r in caplog.records if "propagate_real_tensors" in r.getMessage()]


def _top_positives(x):
    idx = torch.nonzero(x > 0).squeeze(1)
    if idx.numel() > 3:
        idx = idx[:3]
    return x[idx] * 2


@settings(max_examples=15, deadline=None)
@given(st.lists(st.lists(st.sampled_from([-1.0, 0.5, 2.0]), min_size=8, max_size=8), min_size=2, max_size=5))
def test_a_branch_on_a_size_read_from_data_asserts_its_outcome_not_the_size(calls):
    """``if idx.numel() > 3`` after ``nonzero`` is asserted as ``u0 > 3`` (or its negation): one trace
    serves every count on the same side, and a count on the other side takes another path."""
    f = tailjit.jit(_top_positives)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for values in calls:
            x = torch.tensor(values)
            _same(f(x), _top_positives(x))
    sides = {sum(v > 0 for v in values) > 3 for values in calls}
    if f.fallback is None:
        assert _paths(f) == len(sides), _jit_warnings(caught)
    else:  # the sides alternated more often than a path was reused
        assert f.misses > 0 and "SpeculationMissed" in f.fallback_reason


def test_sizes_two_masked_selections_must_share_follow_eager():
    """Adding two masked selections needs their counts equal: a call with other counts gets eager's
    error, not a kernel's, and equal counts eager's values."""

    def add_selected(x, y):
        return x[x > 0] + y[y > 0]

    f = tailjit.jit(add_selected)
    x = torch.tensor([1.0, -1.0, 2.0, 3.0, -2.0, 4.0, 5.0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _same(f(x, x.roll(1)), add_selected(x, x.roll(1)))
        with pytest.raises(RuntimeError, match="must match the size"):
            f(x, x.clamp(max=2.5) - 1)
        _same(f(x.flip(0), x * 3), add_selected(x.flip(0), x * 3))


def test_values_read_from_data_that_change_at_every_call_fall_back_once_with_the_line():
    """Paths that miss more often than they hit (a read that differs at every call) stop speculation: the
    function takes the torch.compile path, once, with a warning naming the line of the read."""

    def fn(x):
        n = int(x.argmax())
        return x[: n + 1] * 2

    f = tailjit.jit(fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in (2, 5, 3, 7):
            x = torch.arange(8.0).roll(k - 7)  # argmax k
            _same(f(x), fn(x))
    msgs = _jit_warnings(caught)
    assert len(msgs) == 1 and f.fallback is not None, msgs
    assert "SpeculationMissed" in msgs[0] and "n = int(x.argmax())" in msgs[0] and "test_jit.py" in msgs[0]
    assert {w.filename for w in caught if "tailjit.jit" in str(w.message)} == {__file__}  # warned at the call


def _clip_to_image(boxes, hw):
    h, w = hw.tolist()
    x = boxes[:, 0::2].clamp(0, w)
    y = boxes[:, 1::2].clamp(0, h)
    out = torch.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], 1)
    return out.flip(0) if h > w else out


def _normalise_by_read_sum(x):
    return x / max(float(x.abs().sum()), 1.0)  # a float read: compiled sums may round it otherwise


def _nan_aware_max(x):
    m = float(x.max())
    return x * 0 if m != m else x / m


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([_clip_to_image, _normalise_by_read_sum, _nan_aware_max]), st.data())
def test_speculative_traces_follow_eager_over_any_sequence_of_calls(fn, data):
    """Whatever the reads return, whichever path or fallback a call takes, values follow eager."""
    f = tailjit.jit(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(data.draw(st.integers(2, 5))):
            if fn is _clip_to_image:
                hw = torch.tensor(data.draw(st.sampled_from([(4, 6), (6, 4), (5, 5)])))
                args = (_boxes(6), hw)
            else:
                vals = data.draw(st.lists(st.sampled_from([-2.0, 0.5, 3.0, float("nan")]), min_size=4, max_size=4))
                args = (torch.tensor(vals),)
            _same(f(*args), fn(*args))


def test_a_float_read_from_data_is_asserted_equal_nan_included():
    """A float read is traced as the constant it was and asserted equal to it by the graph, NaN as NaN:
    torch reasons about floats as reals (``m != m`` is False to it), so no branch is decided on a symbol."""
    finite, nan = torch.tensor([1.0, 2.0]), torch.tensor([1.0, float("nan")])
    f = tailjit.jit(_nan_aware_max)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for x in (finite, finite, nan, nan, finite):
            _same(f(x), _nan_aware_max(x))
    assert not _jit_warnings(caught) and f.fallback is None
    assert _paths(f) == 2 and f.misses == 2  # the first nan; then the finite call tries the nan path first


def _writes_input(x):
    if x.sum() > 0:
        x.add_(1)
    return x * 2


def _random_after_read(x):
    return x + torch.rand_like(x) if x.sum() > 0 else x


def _reads_through_numpy(x):
    return x[: int(x.numpy().argmax()) + 1]


@pytest.mark.parametrize(
    "fn, why",
    [(_writes_input, "writes into its inputs"), (_random_after_read, "a random op"),
     (_reads_through_numpy, "reads tensor data through numpy")],
)  # fmt: skip
def test_what_speculation_cannot_guard_falls_back_with_the_reason(fn, why):
    """A rerun after a failed guard would repeat a write into an input; a random op's values differ between
    the recording run and the call; data read through numpy() bypasses the guards."""
    f = tailjit.jit(fn)
    x, y = torch.ones(4), torch.ones(4)
    # (said once where the plain trace's failure was speculation's own)
    with pytest.warns(UserWarning, match=f"(not traced speculatively either|Unspeculable): it .*{why}"):
        got = f(x)
    want = fn(y)
    if fn is not _random_after_read:
        _same(got, want)
        _same(x, y)  # written once, as eager writes it
    assert f.fallback is not None and _paths(f) == 0


@tailjit.op
def _doubled_tanh(x):
    (n,) = x.shape
    return tailjit.te.compute((n,), lambda i: tailjit.te.tanh(x[i]) * 2.0, name="y")


def _branch_around_an_op(x):
    if x.sum() > 0:
        return _doubled_tanh(x) * 2
    return _doubled_tanh(x) - 1


def test_a_fallback_of_training_calls_leaves_inference_calls_compiled():
    """A branch on a value around a @tailjit.op traces speculatively for inference, but its training
    trace goes through AOTAutograd, which drops runtime assertions: only the training calls take the
    torch.compile path (one warning saying so); inference calls keep their traces and paths."""
    f, x = tailjit.jit(_branch_around_an_op), torch.rand(5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):  # a path that hits before another is traced
            _same(f(x), _branch_around_an_op(x))
        for sign in (1.0, -1.0, 1.0):
            xs, xe = (sign * x).requires_grad_(), (sign * x).requires_grad_()
            got, want = f(xs), _branch_around_an_op(xe)
            _same(got, want)
            _same(torch.autograd.grad(got.sum(), xs), torch.autograd.grad(want.sum(), xe))
            _same(f(-sign * x), _branch_around_an_op(-sign * x))
    msgs = _jit_warnings(caught)
    assert len(msgs) == 1 and "for its training calls" in msgs[0], msgs
    assert f.fallen == {True} and _paths(f) == 2 and all(not fast.training for fast in f.fast)


def test_training_through_a_speculative_trace_follows_eager_on_both_paths():
    def fn(x, w):
        s = (x * w).sum()
        if s > 0:
            return (x * w).tanh().sum()
        return ((x - w) ** 2).mean()

    f = tailjit.jit(fn)
    for sign in (1.0, 1.0, -1.0, -1.0):
        x, w = torch.rand(3, 4) * sign, torch.rand(3, 4)
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        xe, we = x.clone().requires_grad_(), w.clone().requires_grad_()
        got, want = f(xs, ws), fn(xe, we)
        _same(got, want)
        got.backward()
        want.backward()
        _same((xs.grad, ws.grad), (xe.grad, we.grad))
    assert _paths(f) == 2 and f.fallback is None


@pytest.mark.parametrize("steps, traced", [(4, True), (6, False)])
def test_a_loop_reading_many_values_from_data_falls_back_with_the_line(steps, traced, monkeypatch):
    """Each value read from data is a symbolic size, whose reasoning slows every later step of the trace;
    past ``MAX_DATA_READS`` of them (lowered here) the function takes the torch.compile path, once, with a
    warning naming the line.  Values follow eager either way."""
    monkeypatch.setattr(importlib.import_module("tailjit.frontend.jit"), "MAX_DATA_READS", 4)
    monkeypatch.setattr(importlib.import_module("tailjit.frontend.trace.speculate"), "MAX_GUARDS", 4)
    x, lengths = torch.randn(steps, 5, 3), torch.randint(0, 6, (steps,))
    reverse_each = all_operators()["reverse_padded_sequence"].fn  # ``n = lengths[b].item()`` per sequence
    f = tailjit.jit(reverse_each)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _same(f(x, lengths), reverse_each(x, lengths))
        _same(f(x, lengths.flip(0)), reverse_each(x, lengths.flip(0)))
    msgs = _jit_warnings(caught)
    if traced:
        assert f.fallback is None and not msgs, msgs
    else:
        assert f.fallback is not None and len(msgs) == 1, msgs
        assert "TooManyDataReads" in msgs[0] and "n = lengths[b].item()" in msgs[0]


@pytest.mark.parametrize("error", ["CompileError", "CompilerNotFound", "IndexError"])
def test_a_region_the_c_compiler_fails_on_runs_eagerly_with_a_warning(error, monkeypatch):
    """A region whose C compile fails or whose build raises an internal error (tailjit bugs: a KeyError in the
    code generator silently sent the capsule network's routing to eager ops) or finds no compiler runs as
    eager ATen calls, with the same values, and says so in a warning: the report alone would hide it."""
    from tailjit.frontend.plan import planner

    def fail(*args, **kwargs):
        raise getattr(tailjit, error, IndexError)(f"{error} for the test\ncompiler output")

    monkeypatch.setattr(planner, "build_many", fail)
    monkeypatch.setattr(planner, "build", fail)
    x = torch.randn(5)
    with pytest.warns(UserWarning, match=f"runs eagerly: {error}: {error} for the test$"):
        got = tailjit.jit(lambda x: torch.tanh(x) * 3)(x)
    _same(got, torch.tanh(x) * 3)


@pytest.mark.parametrize(
    "w, why",
    [((4, 6, 3, 5), "convolution of 90 products per output (lowered up to 64)"),
     ((4, 3, 1, 1), "convolution over 3 input channels per group (lowered up to 1)")],
)  # fmt: skip
def test_a_convolution_of_many_products_or_channels_per_output_stays_torchs(w, why):
    """Past ``CONV_MAX_TERMS`` products per output, or over more than one input channel (a 1x1 convolution
    is a matrix product), a convolution is an extern call to torch's (oneDNN's blocked kernels); the rest of
    the graph still compiles."""
    x, w = torch.randn(2, 6, 7, 8), torch.randn(*w)
    groups = 6 // w.shape[1]

    def f(x, w):
        return torch.tanh(torch.nn.functional.conv2d(x * 2, w, padding=1, groups=groups))

    g = tailjit.jit(f)
    torch.testing.assert_close(g(x, w), f(x, w))
    (report,) = g.reports
    assert [str(b) for b in report.fallbacks] == [f"convolution (aten.convolution.default): {why}"]
    assert len(report.kernels) == 2
    # training: torch's autograd differentiates the extern call, so the graph keeps tailjit's own gradients
    # (any convolution sent it through AOTAutograd: ShiftNet's step under tailjit.jit at 0.56-0.60x of eager's)
    ours, ref = [(x.clone().requires_grad_(), w.clone().requires_grad_()) for _ in range(2)]
    _same(torch.autograd.grad(g(*ours).sum(), ours), torch.autograd.grad(f(*ref).sum(), ref))
    assert "differentiated by its tensor expressions" in g.reports[-1].note


@pytest.mark.parametrize("mode", ["replicate", "reflect"])
def test_a_filter_over_an_edge_padding_is_one_loop_nest_cut_at_the_edges(mode):
    """An edge padding lowers to selects on the index (no index tensor), which fuse into the convolution
    reading it; the innermost loop is cut where they change truth, so that the middle piece reads the image
    contiguously instead of by 9 gathers per element (a gather counts toward the cut's saving)."""

    def sobel(img):
        kernel = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]]).view(1, 1, 3, 3)
        return torch.nn.functional.conv2d(torch.nn.functional.pad(img, (1, 1, 1, 1), mode=mode), kernel).abs()

    f = tailjit.jit(sobel)
    img = torch.randn(2, 1, 20, 33)
    torch.testing.assert_close(f(img), sobel(img))
    ((k, nodes),) = f.reports[0].kernels
    assert "convolution" in nodes and "_cut" in k.source


def _blend(x, alpha, beta=2.0):
    return torch.sigmoid(x) * alpha + (1 - alpha) * x * beta - alpha * beta


def _exp_scale(x, alpha, beta=2.0):
    return x * math.exp(alpha) + beta  # a Python number: baked into each trace


def _branch(x, alpha, beta=2.0):
    return x * alpha if alpha > 0.5 else x - beta  # a branch on it: baked too


@settings(max_examples=10, deadline=None)
@given(
    st.sampled_from([_blend, _exp_scale, _branch]),
    st.lists(st.tuples(st.sampled_from([0.25, 0.75, -1.5, 3.0]), st.sampled_from([2.0, -0.5])), min_size=2, max_size=6),
    st.booleans(),
)
def test_a_float_argument_that_takes_new_values_is_read_by_one_trace(fn, calls, grad):
    """A float argument is baked into the first trace; once it takes a second value it is passed as a tensor
    whose value the trace reads, and the arithmetic on it joins the kernel (``1 - alpha``): every later value
    reuses that trace.  Code that needs a Python number (``math.exp``, a branch) keeps a trace per value.
    Values and gradients are eager's, and nothing falls back."""
    f = tailjit.jit(fn)
    for alpha, beta in calls:
        x = torch.randn(5, 4, requires_grad=grad)
        got, want = f(x, alpha, beta=beta), fn(x, alpha, beta=beta)
        torch.testing.assert_close(got, want)
        if grad:
            torch.testing.assert_close(*(torch.autograd.grad(y.sum(), x) for y in (got, want)))
    assert not f.fallen
    traces = sum(len(es) for es in f.entries.values())
    changed = sum(len({c[k] for c in calls}) > 1 for k in range(2))  # float arguments that took a new value
    if fn is _blend:  # the first trace, then one more per argument turned into a tensor
        assert traces <= 1 + changed
        if changed and not grad:
            assert len(f.reports[-1].kernels) == 1 and not f.reports[-1].fallbacks
    else:  # ``alpha`` baked: a trace per value, or per branch and value
        assert traces <= len(set(calls)) + changed


_DIVISOR = 0.0


def _divide(x, d):
    return x / d, x / _DIVISOR


@pytest.mark.parametrize("order", [(0.0, -0.0, 0.0), (-0.0, 0.0, -0.0), (float("nan"), -0.0, float("nan"))])
def test_signed_zeros_and_nans_are_told_apart_in_baked_and_captured_floats(order):
    """``-0.0 == 0.0`` but ``1 / -0.0`` is ``-inf``: a trace baked with one zero served the other (a float
    argument, or a captured one), with the infinities' signs wrong."""
    f = tailjit.jit(_divide)
    x = torch.tensor([1.0, -2.0, 0.0])
    with pytest.MonkeyPatch.context() as monkeypatch:
        for d in order:
            monkeypatch.setattr(sys.modules[__name__], "_DIVISOR", -d)
            torch.testing.assert_close(f(x, d), _divide(x, d), equal_nan=True)


_OFFSET = torch.zeros(3)
_GAIN = 2.0


def _shifted(x):
    return (x - _OFFSET) * _GAIN


@settings(max_examples=8, deadline=None)
@given(st.lists(st.sampled_from(["in place", "rebind", "resize", "gain", "grad"]), max_size=5))
def test_tensors_and_numbers_a_function_captures_are_read_at_every_call(changes):
    """Globals and closure variables the function's code reads are inputs (tensors) or keys (numbers) of
    its traces: an in-place update, a rebinding, a new size, a new number and a tensor that requires grad are
    seen as eager sees them, with no warning."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        _read_at_every_call(monkeypatch, changes)


def _read_at_every_call(monkeypatch, changes):
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "_OFFSET", torch.randn(3))
    monkeypatch.setattr(module, "_GAIN", 2.0)
    scale = torch.rand(3) + 0.5

    def scaled(x):
        return _shifted(x) * scale + 1.0

    f, g = tailjit.jit(_shifted), tailjit.jit(scaled)
    assert type(f).__name__ == "JitClosure" and [s.name for s in g.sources] == ["scale", "_shifted", "_GAIN", "_OFFSET"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for change in ["call", *changes]:
            if change == "in place":
                with torch.no_grad():
                    _OFFSET.add_(1.0)
                scale.mul_(0.5)
            elif change == "rebind":
                monkeypatch.setattr(module, "_OFFSET", torch.randn(3))
            elif change == "resize":
                monkeypatch.setattr(module, "_OFFSET", torch.randn(1))
            elif change == "gain":
                monkeypatch.setattr(module, "_GAIN", _GAIN + 1.5)
            elif change == "grad":
                monkeypatch.setattr(module, "_OFFSET", torch.randn(3, requires_grad=True))
            x = torch.randn(4, 3)
            got, want = f(x), _shifted(x)
            _same(got, want)
            _same(g(x), scaled(x))
            if want.requires_grad:
                (want_grad,) = torch.autograd.grad(want.sum(), _OFFSET)
                (got_grad,) = torch.autograd.grad(got.sum(), _OFFSET)
                _same(got_grad, want_grad)
    assert not _jit_warnings(caught) and not f.fallen


# A module whose jitted function is defined above the helper and the constants it reads, and which calls
# a function of another module that reads that module's number.
_LATE_MODULE = """
import torch
import tailjit

@tailjit.jit
def loss(x):
    out = helper(x) * SCALE
    if OFFSET is not None:
        out = out + OFFSET
    return out + scaled(x)

def helper(x):
    return torch.sigmoid(x) + BIAS

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x) * SCALE
"""
_OTHER_MODULE = """
GAIN = 2.0

def scaled(x):
    return x * GAIN
"""


@settings(max_examples=10, deadline=None)
@given(st.lists(st.sampled_from(["scale", "bias", "offset", "no offset", "gain"]), max_size=6))
def test_names_bound_after_jit_and_other_modules_numbers_are_read_at_every_call(changes):
    """A constant or helper defined below the decorated function, a global set later, and a number that a
    function of another module reads: each change is seen as eager sees it (the numbers were baked into
    the first trace: a later ``SCALE = 3.0`` was silently ignored), with no warning."""
    other: dict = {}
    exec(compile(_OTHER_MODULE, "<other module>", "exec"), other)  # noqa: S102
    env = {"scaled": other["scaled"]}
    exec(compile(_LATE_MODULE, "<late module>", "exec"), env)  # noqa: S102
    f = env["loss"]
    assert type(f).__name__ == "JitClosure"
    env.update(SCALE=2.0, BIAS=0.5, OFFSET=None)
    net = env["Net"]()
    g = tailjit.jit(net)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for change in ["call", *changes]:
            if change == "scale":
                env["SCALE"] += 1.0
            elif change == "bias":
                env["BIAS"] -= 0.25
            elif change == "offset":
                env["OFFSET"] = torch.randn(3)
            elif change == "no offset":
                env["OFFSET"] = None
            elif change == "gain":
                other["GAIN"] *= -1.5
            x = torch.randn(4, 3)
            _same(f(x), f.fn(x))
            _same(g(x), net(x))
    assert not _jit_warnings(caught)


def test_a_tensor_a_modules_forward_reads_from_its_globals_falls_back_with_a_clear_reason():
    """A module's trace takes its tensors from its parameters and buffers: a global the forward reads that
    becomes a tensor makes the call fall back (the values stay eager's), with a warning that says so."""
    env: dict = {}
    exec(compile(_LATE_MODULE, "<late module>", "exec"), env)  # noqa: S102
    env["SCALE"] = 2.0
    net = env["Net"]()
    g = tailjit.jit(net)
    x = torch.randn(4, 3)
    _same(g(x), net(x))
    env["SCALE"] = torch.randn(3)
    with pytest.warns(UserWarning, match="not a parameter or buffer"):
        _same(g(x), net(x))


def test_containers_of_tensors_a_function_captures_are_read_at_every_call():
    """A captured list or dict of tensors (with numbers among them): its tensors are inputs, its other leaves
    key the traces; an element rebound, updated in place or requiring grad, and a new number, are seen."""
    layers = [torch.randn(3, 3), torch.randn(3)]
    extra = {"scale": 2.0, "shift": torch.randn(3)}

    def affine(x):
        return (x @ layers[0] + layers[1]) * extra["scale"] + extra["shift"]

    f = tailjit.jit(affine)
    for change in ("call", "in place", "rebind", "number", "grad"):
        if change == "in place":
            layers[1].add_(1.0)
        elif change == "rebind":
            layers[0] = torch.randn(3, 3)
        elif change == "number":
            extra["scale"] = -0.5
        elif change == "grad":
            extra["shift"] = torch.randn(3, requires_grad=True)
        x = torch.randn(4, 3)
        got, want = f(x), affine(x)
        _same(got, want)
        if want.requires_grad:
            _same(*(torch.autograd.grad(y.sum(), extra["shift"]) for y in (got, want)))


class _Tempered(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.temperature = torch.nn.Linear(4, 4), 1.0

    def forward(self, x):
        return torch.softmax(self.lin(x) / self.temperature, -1)


_TAU = 0.5


def _tau_sigmoid(x):
    return torch.sigmoid(x / _TAU) * (1 - _TAU)


def _tau_exp(x):
    return x * math.exp(_TAU)  # a Python number: baked into a trace per value


@settings(max_examples=6, deadline=None)
@given(st.lists(st.sampled_from([0.5, 1.5, 2.0, -0.0, 3.25]), min_size=2, max_size=6), st.booleans())
def test_captured_floats_that_change_are_read_by_one_trace(values, grad):
    """A module's float setting (an annealed ``self.temperature``) and a global float, changed between
    calls: once one changes it is passed to the trace as an argument that it reads, so every later value
    reuses one trace (each new value traced again before, and a module's setting was not even seen).  Code
    that needs a Python number keeps a trace per value.  Values and gradients are eager's."""
    torch.manual_seed(0)
    net = _Tempered()
    f, g, h = tailjit.jit(net), tailjit.jit(_tau_sigmoid), tailjit.jit(_tau_exp)
    with pytest.MonkeyPatch.context() as monkeypatch, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for v in values:
            net.temperature = v + 0.25
            monkeypatch.setattr(sys.modules[__name__], "_TAU", v)
            x = torch.randn(3, 4, requires_grad=grad)
            for jitted, eager in ((f, net), (g, _tau_sigmoid), (h, _tau_exp)):
                got, want = jitted(x), eager(x)
                torch.testing.assert_close(got, want, equal_nan=True)
                if grad:
                    grads = [torch.autograd.grad(y.sum(), x) for y in (got, want)]
                    torch.testing.assert_close(*grads, equal_nan=True)
    assert not _jit_warnings(caught)
    for jitted in (f, g):
        assert len(jitted.traces) == 1 and len(jitted.jitted.entries) <= 2 + grad
    assert len(h.traces) == 1 and sum(map(len, h.jitted.entries.values())) == len(set(map(str, values)))


class _FocalLoss:
    """A loss as a plain callable object (not a module), with settings."""

    def __init__(self, gamma: float):
        self.gamma, self.mean = gamma, True

    def __call__(self, p, y):
        loss = -((1 - p) ** self.gamma) * torch.log(p) * y
        return loss.mean() if self.mean else loss.sum()

    def doubled(self, p, y):
        return self(p, y) * 2


@settings(max_examples=8, deadline=None)
@given(st.lists(st.sampled_from(["gamma", "mean", "new attribute"]), max_size=6))
def test_a_callable_object_and_a_plain_objects_method_see_their_settings(changes):
    """``tailjit.jit`` of a callable object (a loss class) or of a method of a plain object: the object's
    number, string and flag attributes are watched as a module's settings are (a later ``loss.gamma = 3.0``
    was served by the trace of 2.0, a silent wrong answer); its floats are read by one trace."""
    loss = _FocalLoss(2.0)
    f, g = tailjit.jit(loss), tailjit.jit(loss.doubled)
    p, y = torch.rand(8) * 0.9 + 0.05, (torch.rand(8) > 0.5).float()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for change in ["call", *changes]:
            if change == "gamma":
                loss.gamma += 0.5
            elif change == "mean":
                loss.mean = not loss.mean
            elif change == "new attribute":
                loss.note = "added"
            _same(f(p, y), loss(p, y))
            _same(g(p, y), loss.doubled(p, y))
    assert not _jit_warnings(caught)
    assert type(f).__name__ == type(g).__name__ == "JitClosure"


class _Scheduled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.epoch = torch.nn.Linear(3, 3), 0

    def forward(self, x):
        return self.lin(x) * min(self.epoch, 5)


def test_a_function_that_traces_again_at_every_call_is_told_so_once():
    """An integer setting or argument that changes at every call is baked into each trace: the function is
    told, once, what keeps changing and what to do, instead of silently tracing at every call."""
    net, x = _Scheduled(), torch.randn(2, 3)
    f, g = tailjit.jit(net), tailjit.jit(lambda x, k: x * k)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(18):
            net.epoch = i
            _same(f(x), net(x))
            _same(g(x, i), x * i)
    (told_f,) = [m for m in _jit_warnings(caught) if "traced 8 times" in m]
    (told_g,) = [m for m in _jit_warnings(caught) if "traced 16 times" in m]
    assert "_Scheduled.epoch" in told_f and "pass a value that changes as an argument" in told_f
    assert "non-tensor arguments" in told_g and len(_jit_warnings(caught)) == 2


class _Affine(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.register_buffer("shift", torch.zeros(3))

    def forward(self, x):
        return self.lin(x) + self.shift

    def loss(self, x, y):
        return (self(x) - y).square().mean()


def test_modules_a_function_captures_and_a_methods_module_are_traced_with_their_parameters():
    """A module in a closure and the module of a bound method: their parameters and buffers are inputs, so
    training gives eager's gradients and an optimizer's steps are seen."""
    torch.manual_seed(0)
    ours, ref = _Affine(), _Affine()
    ref.load_state_dict(ours.state_dict())

    def make(model):
        return lambda x, y: model.loss(x, y) + model.lin.weight.abs().sum() * 0.01

    f, loss = tailjit.jit(make(ours)), tailjit.jit(ours.loss)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ours, ref)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            x, y = torch.randn(5, 3), torch.randn(5, 3)
            got, want = (f if step % 2 else loss)(x, y), make(ref)(x, y) if step % 2 else ref.loss(x, y)
            _same(got, want)
            for value, opt in zip((got, want), opts):
                opt.zero_grad()
                value.backward()
            _same({n: p.grad for n, p in ours.named_parameters()}, {n: p.grad for n, p in ref.named_parameters()})
            for opt in opts:
                opt.step()
            ours.shift.add_(0.5), ref.shift.add_(0.5)
    assert not _jit_warnings(caught) and not loss.fallen and not f.fallen
    x, y = torch.randn(5, 3), torch.randn(5, 3)
    _same(copy.copy(loss)(x, y), ref.loss(x, y))  # (``copy`` looked up attributes before ``__init__``'s ran)


def test_a_function_that_captures_a_tensor_and_branches_on_data_takes_a_path_per_branch():
    """The captured values' generated call tries the speculative traces' fast paths and, where one's
    assertion fails, hands the call to the JitFunction, which takes the other path."""
    table = torch.tensor([1.0, 2.0, 3.0])

    def pick(x, flag):
        return x * table if flag.item() > 0 else x - table

    f, x = tailjit.jit(pick), torch.randn(4, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for v in (1, 1, -1, -1, 1, -1):
            _same(f(x, torch.tensor(v)), pick(x, torch.tensor(v)))
    assert not _jit_warnings(caught) and _paths(f) == 2 and f.misses == 2


class _Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls = self.calls + 1  # a new tensor, not an in-place update
        return x * self.calls


class _ObjectCounter:
    def __init__(self):
        self.calls = 0

    def __call__(self, x):
        self.calls += 1
        return x * self.calls


class _IntCounter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0  # a setting, which keys the traces

    def forward(self, x):
        self.calls += 1
        return x * self.calls


_STEP = 0


def _global_step(x):
    global _STEP
    _STEP += 1
    return x * _STEP


def _counting():
    count = torch.zeros(())

    def step(x):
        nonlocal count
        count = count + 1
        return x * count

    return step


@pytest.mark.parametrize("kind", ["module buffer", "module setting", "object setting", "closure variable", "global"])
def test_a_captured_value_the_function_rebinds_makes_it_fall_back_with_eagers_state(kind):
    """A trace cannot carry an assignment to a captured value out of the call (it used to drop it: the
    buffer stayed 0 and every call returned ``x * 1``): such a function falls back once, with one warning,
    and the torch.compile path keeps eager's values and state.  (A setting or a global number keys the
    traces: every call made a new trace that fell back again, and the traced call's own increment was
    kept, so the count ran ahead of eager's.)"""
    make = {"module buffer": _Counter, "module setting": _IntCounter, "object setting": _ObjectCounter,
            "closure variable": _counting}.get(kind)  # fmt: skip
    ours, ref = (make(), make()) if make else (_global_step, None)
    globals()["_STEP"] = 0
    f, x = tailjit.jit(ours), torch.ones(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(1, 4):
            want = x * step if ref is None else ref(x)
            _same(f(x), want)
    (warned,) = _jit_warnings(caught)
    assert re.search(r"assigns a new value to (_Counter\.calls|_IntCounter\.calls|self\.calls|count|_STEP)", warned)
    if kind.endswith("setting") or kind == "module buffer":
        assert torch.equal(torch.as_tensor(ours.calls), torch.as_tensor(ref.calls))


def test_a_tensor_read_from_outside_the_traced_code_falls_back_with_a_clear_reason():
    """A tensor read where tailjit.jit does not look (a module attribute that is not a buffer) is not
    traced (a constant would go stale when its owner updates it in place): the function takes the
    torch.compile path, with a warning that says what to do."""
    holder = torch.nn.Module()
    holder.scale = torch.tensor([1.0, 2.0, 3.0])  # a plain attribute, not a buffer

    def scaled(x):
        return x * holder.scale

    f = tailjit.jit(scaled)
    x = torch.randn(4, 3)
    with pytest.warns(UserWarning, match="reads a tensor that is not one of its arguments .* pass the tensor as an"):
        _same(f(x), scaled(x))
    holder.scale.mul_(2)  # the torch.compile path guards on the tensor it reads, as eager reads it
    _same(f(x), scaled(x))


def test_explain_jit():
    text = tailjit.explain(box_decode, _boxes(4), torch.randn(4, 4), entry="jit")
    assert "jit graph: 1 compiled region(s), 0 extern call(s)" in text
    assert "def tailjit_graph" in text and "tj_call" in text and "loop nest" in text


def _masked_sorted_softmax(x, m):
    s, _ = torch.sort(x.masked_fill(m, float("-inf")), dim=-1, descending=True)
    return torch.softmax(s, -1)


def _sorted_softmax(x):
    s, _ = torch.sort(x[:, 1:] * 2, dim=-1)
    return torch.softmax(s, -1)


def test_values_a_constant_put_far_from_zero_stay_far_through_extern_calls():
    """The softmax of logits masked with -inf, then sorted by an extern call, guards its exp (tj_exp_far,
    off libmvec's per-lane scalar path) as it would inside one kernel; the softmax of a sorted input does
    not, an int argument such as a slice's end not counting as a value.  Values follow eager, rows masked
    whole (NaN) included."""
    kernels = "/* tailjit: kernel */"
    x, m = torch.randn(6, 40), torch.rand(6, 40) < 0.7
    m[2] = True
    text = tailjit.explain(_masked_sorted_softmax, x, m, entry="jit")
    assert "1 extern call(s)" in text and "tj_exp_far_f32(" in text.split(kernels, 1)[1]
    _same(tailjit.jit(_masked_sorted_softmax)(x, m), _masked_sorted_softmax(x, m))
    text = tailjit.explain(_sorted_softmax, x, entry="jit")
    assert "1 extern call(s)" in text and "tj_exp_far_f32(" not in text.split(kernels, 1)[1]
    _same(tailjit.jit(_sorted_softmax)(x), _sorted_softmax(x))


def test_explain_training_shows_both_graphs():
    x = torch.randn(3, 4, requires_grad=True)
    text = tailjit.explain(lambda x: torch.tanh(x).sum(), x, source=False)
    assert "training graph" in text and "tailjit_region_backward" in text and "tj_call" not in text
    text = tailjit.explain(lambda x: torch.nn.functional.hardswish(x).sum(), x, source=False)  # AOTAutograd
    assert "forward graph" in text and "backward graph" in text


@pytest.mark.slow  # a fresh interpreter importing torch and Dynamo
def test_debug_environment_variable_prints_reports():
    code = "import torch, tailjit\nprint(tailjit.jit(lambda x: x.exp() + 1)(torch.randn(3)))\n"
    env = dict(os.environ, TAILJIT_DEBUG="1", PYTHONPATH=os.pathsep.join(sys.path))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "jit graph: 1 compiled region(s)" in res.stderr and "tj_call" in res.stderr


def test_a_view_of_a_mutated_input_is_a_view_of_the_input():
    def fn(x):
        x.add_(1)
        return x[1:], x * 2

    f = tailjit.jit(fn)
    x = torch.randn(4)
    xe = x.clone()
    view, y = f(x)
    fn(xe)
    assert torch.equal(x, xe) and torch.equal(y, xe * 2)
    x[2] = 100.0
    assert view[1] == 100.0  # it shares memory with x, as in eager
    assert [r.kind for r in f.reports] == ["inference"]  # this one takes AOTAutograd


def test_in_place_updates_in_a_loop_take_one_trace():
    def fn(x):
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            out[t] = x[t] * (t + 1)
        return out

    f = tailjit.jit(fn)
    x = torch.randn(6, 3)
    _same(f(x), fn(x))
    assert [r.kind for r in f.reports] == ["jit"]  # functionalised while traced, no AOTAutograd


def test_item_feeding_element_wise_ops_is_lowered():
    """A 0-d tensor where a number is expected (``clamp(max=img_hw[1])``) is an ``item()``: lowered as the
    element, so the graph stays one region; a value that also leaves the graph is written out."""

    def clip(boxes, img_hw):
        x = boxes[:, 0::2].clamp(min=0, max=img_hw[1])
        y = boxes[:, 1::2].clamp(min=0, max=img_hw[0])
        return torch.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], -1)

    f = tailjit.jit(clip)
    b, hw = torch.randn(50, 4) * 100, torch.tensor([30.0, 40.0])
    _same(f(b, hw), clip(b, hw))
    (r,) = f.reports
    assert not r.fallbacks and len(r.kernels) == 1, [str(x) for x in r.fallbacks]
    hw2 = torch.tensor([5.0, 70.0])
    _same(f(b, hw2), clip(b, hw2))  # the bound is data, read at every call

    def scaled(x, s):
        k = s.item()
        return x * k, k

    g = tailjit.jit(scaled)
    x, s = torch.randn(6), torch.tensor(2.5, dtype=torch.float64)
    got, k = g(x, s)
    _same(got, x * 2.5)
    assert k == 2.5 and type(k) is float
    assert not g.reports[0].fallbacks


@pytest.mark.parametrize("route", ["expression", "aot"])
def test_a_value_read_from_data_traces_with_symbols_not_a_fallback(route, monkeypatch):
    """``.item()`` as a clamp bound (a box decoder clipping to the image size): a static AOTAutograd trace
    cannot hold it, so its first trace is the symbolic one, which gives it an unbacked symbol; tailjit's
    own route keeps it as a node of the static trace."""
    if route == "aot":
        monkeypatch.setattr(expr_grad, "FAITHFUL", frozenset())

    def clip(boxes, hw):
        return torch.stack([boxes[:, 0].clamp(0, hw[1].item()), boxes[:, 1].clamp(0, hw[0].item())], 1) * 2

    f = tailjit.jit(clip)
    b, hw = (torch.randn(6, 2) * 10).requires_grad_(), torch.tensor([5.0, 7.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning
        out = f(b, hw)
    assert f.fallback is None
    assert ("symbolic sizes" if route == "aot" else "differentiated by its tensor expressions") in f.reports[0].note
    (g,) = torch.autograd.grad(out.sum(), b)
    (want,) = torch.autograd.grad(clip(b, hw).sum(), b)
    torch.testing.assert_close(out, clip(b, hw))
    torch.testing.assert_close(g, want)


_REVERSE_EACH = tailjit.jit(all_operators()["reverse_padded_sequence"].fn)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(-10, 10), min_size=4, max_size=4))
def test_rows_sliced_by_values_read_from_the_inputs_are_one_region(lengths):
    """``out[b, :n] = x[b, :n].flip(0)`` with ``n = lengths[b].item()`` per row: the values are read from the
    inputs before any region, and the slices' lengths follow from them as torch clamps them, so the training
    trace is one forward and one gradient kernel, where it was a region (and an autograd node) per row.
    Values and gradients match eager for any lengths; a negative one runs the region's nodes through autograd
    (whose functional ``aten.copy`` has no derivative of its own)."""
    reverse_each = all_operators()["reverse_padded_sequence"].fn
    x, n = torch.randn(4, 8, 3, requires_grad=True), torch.tensor(lengths)
    head = torch.randn(4, 8, 3)
    want = reverse_each(x, n)
    (want_grad,) = torch.autograd.grad(want, x, head)
    got = _REVERSE_EACH(x, n)
    (got_grad,) = torch.autograd.grad(got, x, head)
    _same(got, want)
    _same(got_grad, want_grad)
    _same(_REVERSE_EACH(x.detach(), n), want.detach())
    training = next(r for r in _REVERSE_EACH.reports if "differentiated" in r.note)
    assert len(training.kernels) == 2 and not training.fallbacks, [str(f) for f in training.fallbacks]


def test_values_read_after_a_write_into_an_input_keep_their_place():
    """Reads of input values run first only up to the first write into an input (the traces tailjit routes
    are functionalised, with such writes at the end; the planner does not rely on it).  A write into a
    tensor of the graph's own does not stop them."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from tailjit.frontend.plan.planner import input_reads

    def f(x, n):
        tail = n[1:]  # a view taken before the write
        a = n[0].item()
        y = x.clone()
        y.mul_(2)
        b = tail[0].item()
        n.add_(1)
        c = tail[1].item()
        return y[:a], y[:b], y[:c]

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(10), torch.tensor([3, 4, 5]))
    reads = [n for n in input_reads(gm) if n.target is torch.ops.aten._local_scalar_dense.default]
    assert len(reads) == 2


def test_a_size_read_from_data_is_a_kernel_size():
    """``segment_ids[-1].item() + 1`` rows (a segment sum): the size is bound at call time from the value
    the ``item()`` step read, so ``full`` and ``index_add`` are one kernel; the row count follows the
    data at every call, and an id past the last row raises eager's error."""

    def segment_sum(data, ids):
        out = data.new_zeros(ids[-1].item() + 1, data.size(1))
        return out.index_add_(0, ids, data)

    f = tailjit.jit(segment_sum)
    data = torch.randn(40, 5)
    for hi in (7, 2, 30):
        ids = torch.randint(0, hi, (40,)).sort().values
        _same(f(data, ids), segment_sum(data, ids))
    r = f.reports[-1]
    assert not [x for x in r.fallbacks if x.target != "<built-in function add>"], [str(x) for x in r.fallbacks]
    assert any("index_add" in nodes for _, nodes in r.kernels)
    bad = torch.arange(40).flip(0)  # the last id is 0: one row, and ids up to 39 fall outside it
    for fn in (segment_sum, f):  # eager's own error: the kernel's bad index reruns the region eagerly
        with pytest.raises(RuntimeError, match="out of bounds"):
            fn(data, bad)
    # a negative value read (the kernel's size is it plus one) runs the region eagerly: eager's result or error
    for last in (-1, -3):
        ids = torch.zeros(40, dtype=torch.long)
        ids[-1] = last
        try:
            want = segment_sum(data, ids)
        except RuntimeError as e:
            with pytest.raises(RuntimeError, match=re.escape(str(e)[:30])):
                f(data, ids)
        else:
            _same(f(data, ids), want)


def test_an_index_expanded_by_an_earlier_region_is_lowered_again():
    """segment_max's training trace: ``ids.unsqueeze(1).expand_as(x)`` falls in the region of ``ids.max()``
    and runs as a view before it; the scatter's region reads ``ids[i]`` through the view's own index
    arithmetic (by rows), not the expanded view through its runtime strides.  Values and gradients match."""

    def segment_max(data, ids):
        index = ids.unsqueeze(1).expand_as(data)
        out = data.new_zeros(ids.max().item() + 1, data.size(1))
        return out.scatter_reduce(0, index, data, reduce="amax", include_self=False)

    f = tailjit.jit(segment_max)
    data, ids = torch.randn(60, 7), torch.randint(0, 9, (60,))
    data[3, 2] = float("nan")
    x, y = data.clone().requires_grad_(), data.clone().requires_grad_()
    got, want = f(x, ids), segment_max(y, ids)
    torch.testing.assert_close(got, want, equal_nan=True)
    g = torch.randn_like(want)
    got.backward(g)
    want.backward(g)
    torch.testing.assert_close(x.grad, y.grad, equal_nan=True)
    forward = f.reports[0]
    scatter = next(k for k, nodes in forward.kernels if "scatter_reduce" in nodes)
    assert "row_" in scatter.source  # the update by rows, possible only with ids[i] as the row index
    assert not [x for x in forward.fallbacks if "scatter" in x.target]


def test_nested_report_collectors_each_get_every_report():
    from tailjit.frontend.plan.report import collect_reports

    with collect_reports() as outer:
        with collect_reports() as inner:  # an equal list to outer's until the block ends
            tailjit.jit(lambda x: x * 3)(torch.randn(2))
        tailjit.jit(lambda x: x - 3)(torch.randn(2))
    assert len(inner) == 1 and len(outer) == 2


def test_extern_calls_as_tensor_methods_and_indexing_follow_eager():
    """The host calls extern views and ops as Tensor methods and indexing (``x[:, 1:k:2]``): negative dims,
    steps, bounds read from data and out-of-range bounds, values and gradients."""

    def fn(a, b, n):
        k = n.item()
        x = a[:, 1:k:2]  # slice.Tensor: dim 1, a step, an end read from data (clamped when past the size)
        c = b[1]
        y = c.select(-1, 2).unsqueeze(1)[1:]  # select.int at a negative dim
        z = c.narrow(-2, 1, 3).t().flip(0)  # slice.Tensor at a negative dim
        products = torch.mm(x.t(), x), torch.mm(z.permute(1, 0), y.expand(4, 3)), torch.bmm(b, b.transpose(1, 2))
        return *products, torch.addmm(b[0], b[1], b[2].t() @ b[3])

    f = tailjit.jit(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # traced, not a fallback
        for k in (5, 9, 40):
            a, b = torch.randn(4, 12), torch.randn(4, 5, 4)
            _same(f(a, b, torch.tensor(k)), fn(a, b, torch.tensor(k)))
    a1, b1 = torch.randn(4, 12, requires_grad=True), torch.randn(4, 5, 4, requires_grad=True)
    a2, b2 = (t.detach().clone().requires_grad_() for t in (a1, b1))
    heads = [torch.ones(3, 3), torch.ones(3, 3), torch.ones(4, 5, 5), torch.ones(5, 4)]
    torch.autograd.backward(f(a1, b1, torch.tensor(7)), heads)
    torch.autograd.backward(fn(a2, b2, torch.tensor(7)), heads)
    _same((a1.grad, b1.grad), (a2.grad, b2.grad))
    source = "".join(r.host for r in f.reports)
    assert ".mm(" in source and ".addmm(" in source and "[:, 1:" in source, source


def _three_reads(x, t):
    a = t[1, 2].item()
    b = t.t()[3, 0].item()
    c = t[:, 1:][2, 0].item()
    return x * 2 + c if a > b else x - c


@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=12, max_size=12), st.booleans())
def test_elements_read_from_a_small_input_come_from_one_list_of_them(values, transposed):
    """Numbers read through views of a small input (``t[1, 2].item()``, ``t.t()[3, 0]``) in a trace with
    static sizes are its elements at the positions the views give (6, 3 and 9), read once a call
    (``tolist()``), not a slice, a squeeze and an ``item()`` each; values follow eager whatever the input's
    strides and whichever path the values take."""
    t = torch.tensor(values).view(4, 3).t() if transposed else torch.tensor(values).view(3, 4)
    x = torch.randn(10)
    f = tailjit.jit(_three_reads)
    for u in (t, t, t.flip(0), t.flip(1).contiguous()):
        _same(f(x, u), _three_reads(x, u))
    host = f.reports[0].host
    read = re.findall(r"= (v\d+)\[(\d+)\]\n", host)
    assert len({v for v, _ in read}) == 1 and sorted(int(k) for _, k in read) == [3, 6, 9], host


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["ghm_c_loss", "ghm_r_loss", "keypoint_oks", "max_iou_assign", "lovasz_softmax", "ctc_greedy_decode"]
)
def test_suite_tasks_that_specialise_on_their_values_take_a_path_per_input_set(name):
    """Values that differ between the suite's input sets (a float count, per-box values, sequence lengths)
    take a second speculative path for the second set, and calls alternating between the sets take one of
    the two: no fallback, values as eager's."""
    op = all_operators()[name]
    f = tailjit.jit(op.fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for s in (0, 0, 1, 1, 0):
            args = op.inputs("small", s)
            _same(f(*args), op.fn(*args))
    assert not _jit_warnings(caught) and not f.fallen
    assert _paths(f) == 2 and f.misses == 2


class _ScaledCell(torch.nn.Module):
    def __init__(self, count_calls: bool):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.scale = torch.nn.Parameter(torch.linspace(0.5, 1.5, 3))
        self.register_buffer("calls", torch.zeros(()))
        self.count_calls = count_calls

    def forward(self, x):
        if self.count_calls:
            self.calls.add_(1)  # a buffer updated in place, as a running statistic is
        y = torch.tanh(self.lin(x)) * self.scale
        return y * 0.5 if self.training else y


@pytest.mark.parametrize("count_calls", [False, True])
def test_a_module_is_traced_with_its_parameters_and_buffers_as_inputs(count_calls):
    """``tailjit.jit(module)``: the parameters and buffers are inputs at every call, so an optimizer's steps,
    a buffer's in-place update and a newly assigned parameter are seen, training gives the parameters eager's
    gradients, and ``eval()`` traces again."""
    torch.manual_seed(0)
    ours, ref = _ScaledCell(count_calls), _ScaledCell(count_calls)
    ref.load_state_dict(ours.state_dict())
    f = tailjit.jit(ours)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ours, ref)]
    for _ in range(3):
        x = torch.randn(5, 4)
        got = f(x).square().sum()
        want = ref(x).square().sum()
        _same(got, want)
        for loss, opt in zip((got, want), opts):
            opt.zero_grad()
            loss.backward()
            opt.step()
        _same(dict(ours.named_parameters()), dict(ref.named_parameters()))
        _same(dict(ours.named_buffers()), dict(ref.named_buffers()))
    ours.scale = torch.nn.Parameter(torch.full((3,), 2.0))
    ref.scale = torch.nn.Parameter(torch.full((3,), 2.0))
    ours.eval(), ref.eval()
    x = torch.randn(5, 4)
    with torch.no_grad():
        _same(f(x), ref(x))
    assert [len(j.entries) for j in f.traces.values()] == [1, 1] and not any(j.fallen for j in f.traces.values())
    names = tuple(n for n, _ in (*ours.named_parameters(), *ours.named_buffers()))
    settings = tuple(tuple((k, captures.value_key(v)) for k, v in captures._settings(m)) for m in ours.modules())
    assert f.jitted is f.traces[("module", ours, tuple(m.training for m in ours.modules()), names, settings),]


class _Half(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.factor, self.hard = 0.5, False  # settings a trace bakes

    def forward(self, x):
        y = x * self.factor + getattr(self, "offset", 0.0) if self.training else x
        return y.relu() if self.hard else y


class _Tree(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.halve = torch.nn.Linear(3, 3), torch.nn.Linear(3, 3), _Half()
        self.register_buffer("shift", torch.zeros(3))

    def forward(self, x):
        return self.halve(self.b(torch.tanh(self.a(x)))) + self.shift


def _change(m: _Tree, change: str):
    with torch.no_grad():
        if change == "step":
            m.a.weight.add_(0.1)
        elif change == "new parameter":
            m.a.weight = torch.nn.Parameter(torch.randn(3, 3))
        elif change == "new submodule":
            m.b = torch.nn.Linear(3, 3)
        elif change == "tie":
            m.b.weight = m.a.weight
        elif change == "new buffer":
            m.shift = torch.randn(3)
        elif change == "through the dictionary":  # no registration hook sees this
            m.a._parameters["bias"] = torch.nn.Parameter(torch.randn(3))
        elif change == "factor":  # a float setting, to the other zero and back
            m.halve.factor = -0.0 if m.halve.factor else 0.25
        elif change == "integer factor":  # the same value as another type
            m.halve.factor = int(m.halve.factor) if type(m.halve.factor) is float else float(m.halve.factor)
        elif change == "hard":
            m.halve.hard = not m.halve.hard
        elif change == "offset":  # a setting added, then removed
            if hasattr(m.halve, "offset"):
                del m.halve.offset
            else:
                m.halve.offset = 1.5
        else:  # a submodule's flag apart from the root's
            m.halve.train(change == "submodule train")


_TREE_CHANGES = ["step", "new parameter", "new submodule", "tie", "new buffer", "through the dictionary",
                 "submodule eval", "submodule train", "factor", "integer factor", "hard", "offset"]  # fmt: skip


@settings(max_examples=10, deadline=None)
@given(st.lists(st.sampled_from(_TREE_CHANGES), max_size=5))
def test_a_jitted_module_sees_every_change_to_its_tree(changes):
    """The generated check of a module's tree (each submodule, parameter and buffer the same object, each
    dictionary the same size, every ``training`` flag the same, each setting such as ``self.factor`` of the
    same type and value) misses on any change, and the walk that follows passes the new tensors or traces
    again: calls give eager's values after each change (a changed setting used to be served by the trace
    that baked the old one)."""
    torch.manual_seed(0)
    m = _Tree()
    f, x = tailjit.jit(m), torch.randn(4, 3)
    with torch.no_grad():
        for change in ["step", *changes]:
            _change(m, change)
            _same(f(x), m(x))
            _same(f(x), m(x))  # through the generated check
    got = torch.autograd.grad(f(x).sum(), list(m.parameters()))
    want = torch.autograd.grad(m(x).sum(), list(m.parameters()))
    _same(got, want)


def _by_direction(x, direction):
    d = direction.item()  # (``int(direction)`` would pin the value: one assertion in both cases)
    if d == 1:
        return x.flip(0)
    elif d == 2:
        return x * 2
    elif d == 3:
        return x - 1
    return x


@pytest.mark.parametrize("direction, asserted", [(2, 1), (5, 3)])
def test_a_value_an_assertion_pins_is_not_asserted_again(direction, asserted):
    """``d == 2`` taken after ``d == 1`` was not: ``Eq(u0, 2)`` implies ``Ne(u0, 1)`` and the range
    ``2 <= u0 <= 2``, so one assertion tests the read; past every branch, the three ``Ne`` stay.  Other
    values still miss the path.  (A symbolic trace read the 0-d input's value as a symbol of its own and
    dropped its guard, so ``d = 1`` took the ``d == 2`` branch: ``UnguardedValue`` sends it to
    speculation.)"""
    f, x = tailjit.jit(_by_direction), torch.arange(4.0)
    for d in (direction, direction, 1, direction, 1):
        k = torch.tensor(d)
        _same(f(x, k), _by_direction(x, k))
    assert f"speculating on {asserted} assertions" in f.reports[0].note
    assert f.fallback is None


def _writes_then_branches_on_a_0d_input(x, k):
    x.add_(1)  # a write into an input: traced through AOTAutograd
    return x * 2 if k.item() == 2 else x - 1


def test_a_branch_on_a_0d_input_through_aotautograd_is_not_trusted():
    """The AOTAutograd route's symbolic trace drops the guard on a 0-d input's value as the plain one did
    (``UnguardedValue``); speculation refuses a function that writes into its inputs, so it falls back,
    with eager's values and writes for every value, and a warning naming the line of the first read."""
    f = tailjit.jit(_writes_then_branches_on_a_0d_input)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for v in (2, 2, 1):
            x, k = torch.arange(4.0), torch.tensor(v)
            want_x = x.clone()
            _same(f(x, k), _writes_then_branches_on_a_0d_input(want_x, k))
            _same(x, want_x)
    msgs = _jit_warnings(caught)
    assert len(msgs) == 1 and "UnguardedValue" in msgs[0] and not f.reports
    assert "(return x * 2 if k.item() == 2 else x - 1)" in msgs[0]  # the line of the first read


def _shifted_copies(x, a, b):
    """Slice assignments of views of ``x`` into zeros, through two or three nested views (ShiftNet's shift)."""
    out = torch.zeros_like(x)
    out[:, 0::2, max(a, 0) : x.shape[2] + min(a, 0), 1:] = x[:, 0::2, max(-a, 0) : x.shape[2] + min(-a, 0), :-1]
    out[:, 1::2, :, max(b, 0) : x.shape[3] + min(b, 0)] = x[:, 1::2, :, max(-b, 0) : x.shape[3] + min(-b, 0)]
    out[:, 1, 0] = x[:, 1, -1]
    return out


@settings(max_examples=12, deadline=None)
@given(st.integers(1, 3), st.integers(1, 5), st.integers(2, 6), st.integers(2, 6), st.integers(-1, 1),
       st.integers(-1, 1))  # fmt: skip
def test_slice_assignments_through_nested_views_write_the_part_alone(n, c, h, w, a, b):
    """A value written through nested views (two or three scatters) is one write into the base's buffer
    through the composed views, where each scatter level used to make its part of the base anew (ShiftNet's
    shift took 20 ms against eager's 0.4): values and gradients as eager's."""
    x = torch.randn(n, c + 1, h, w)
    f = tailjit.jit(_shifted_copies, static_argnums=(1, 2))
    with torch.no_grad():
        _same(f(x, a, b), _shifted_copies(x, a, b))
    ((kernel, _),) = f.reports[-1].kernels
    # the zero fill is the one loop nest over the base; each assignment a scatter nest over its part
    assert len(re.findall(r"for \(int64_t i0_\d+ = lo0", kernel.source)) == 1
    assert len(re.findall(r"for \(int64_t u0_\d+ = 0", kernel.source)) == 3
    xg, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = f(xg, a, b), _shifted_copies(xe, a, b)
    _same(got, want)
    head = torch.randn_like(want)
    _same(torch.autograd.grad(got, xg, head), torch.autograd.grad(want, xe, head))


def test_a_function_that_returns_none_and_falls_back_runs_once():
    """The call that falls back runs the function once, as eager does, also where it returns None (which
    used to read as no outputs, and the torch.compile path ran it a second time)."""

    def bump(t):  # .numpy() stops the trace
        t.add_(t.numpy().shape[0] * 0 + 1)

    t = torch.zeros(3)
    with pytest.warns(UserWarning, match="could not trace"):
        assert tailjit.jit(bump)(t) is None
    _same(t, torch.ones(3))
