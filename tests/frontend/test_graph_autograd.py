"""Training graphs run as one autograd node (``tailjit/frontend/host/graph_autograd.py``): values and gradients
against eager PyTorch, on random graphs of matrix products (extern calls) and element-wise regions (kernels)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tailjit

ONE_NODE = "TailjitGraphFunctionBackward"


def _grads(fn, args, head_seed=0):
    args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    out = fn(*args)
    outs = out if isinstance(out, tuple) else (out,)
    gen = torch.Generator().manual_seed(head_seed)
    floats = [o for o in outs if o.requires_grad]
    heads = [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in floats]
    wanting = [a for a in args if a.requires_grad]
    return outs, torch.autograd.grad(floats, wanting, heads, allow_unused=True)


def _check(fn, args, one_node=True):
    g = tailjit.jit(fn)
    got_out, got = _grads(g, args)
    want_out, want = _grads(fn, args)
    for a, b in zip(got_out, want_out):
        torch.testing.assert_close(a, b, equal_nan=True)
        assert a.requires_grad == b.requires_grad
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, equal_nan=True, atol=1e-5, rtol=1e-4)
    names = {type(o.grad_fn).__name__ for o in got_out if o.grad_fn is not None}
    assert (ONE_NODE in names) == one_node, names
    return g


def _rnn(x, h, w, u, b):
    """An Elman RNN unrolled over the steps of ``x``: a product, a kernel and a product per step."""
    for t in range(x.shape[0]):
        h = torch.tanh(x[t] @ w + h @ u + b)
    return h


def _rnn_inputs(seed: int, steps: int = 3, batch: int = 2, features: int = 3, hidden: int = 4) -> list:
    """``_rnn``'s sequence and first state, and its parameters (requiring grad)."""
    gen = torch.Generator().manual_seed(seed)
    x, h = torch.randn(steps, batch, features, generator=gen), torch.randn(batch, hidden, generator=gen)
    shapes = ((features, hidden), (hidden, hidden), (hidden,))
    return [x, h] + [torch.randn(*s, generator=gen).requires_grad_() for s in shapes]


def test_an_unrolled_rnn_trains_as_one_autograd_node():
    g = _check(_rnn, _rnn_inputs(0, steps=5, batch=4, hidden=6))
    assert "as one autograd node" in g.reports[-1].note
    assert "def backward(ctx" in g.reports[-1].host


def test_a_value_read_by_several_steps_sums_its_gradients_and_leaves_the_heads_alone():
    """``w`` is read by three products and ``h`` by two kernels: the sums are made in place, on tensors of
    their own (an output's gradient handed on as it is must not be written)."""

    def f(x, w):
        h = x @ w
        a, b = torch.sigmoid(h) @ w.t(), torch.tanh(h) @ w.t()
        return a * b, h

    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(4, 5, generator=gen, requires_grad=True), torch.randn(5, 5, generator=gen, requires_grad=True)
    g = tailjit.jit(f)
    out = g(x, w)
    heads = [torch.randn(o.shape, generator=gen) for o in out]
    kept = [h.clone() for h in heads]
    got = torch.autograd.grad(out, (x, w), heads)
    want = torch.autograd.grad(f(x, w), (x, w), kept)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert all(torch.equal(h, k) for h, k in zip(heads, kept))
    assert type(out[0].grad_fn).__name__ == ONE_NODE


def test_outputs_without_gradient_and_unused_outputs():
    """An integer output (argmax) and a detached one come back without grad_fn, as in eager; an output the loss
    does not read gets no gradient (its head is None in the backward)."""

    def f(x, w):
        y = torch.relu(x @ w)
        z = torch.exp(y) @ w
        return y, z, z.argmax(1), (y * 2).detach()

    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(3, 4, generator=gen), torch.randn(4, 4, generator=gen, requires_grad=True)
    g = _check(f, [x, w])
    y, z, idx, cut = g(x, w)
    assert not idx.requires_grad and not cut.requires_grad and idx.grad_fn is None
    (gw,) = torch.autograd.grad(z.sum(), w)  # y's head is None
    (want,) = torch.autograd.grad(f(x, w)[1].sum(), w)
    torch.testing.assert_close(gw, want, atol=1e-5, rtol=1e-4)


def test_a_dropout_mask_is_read_from_the_forward_not_drawn_again():
    """The product of ``native_dropout`` reads its mask: the saved one, so the gradient matches eager's and the
    generator stands where eager leaves it."""

    def f(x, w):
        return torch.nn.functional.dropout(torch.tanh(x @ w), 0.5, training=True) @ w

    x, w = torch.randn(8, 8), torch.randn(8, 8, requires_grad=True)
    g = tailjit.jit(f)
    g(x, w)  # traced
    torch.manual_seed(3)
    out = g(x, w)
    assert type(out.grad_fn).__name__ == ONE_NODE
    (got,) = torch.autograd.grad(out.sum(), w)
    after = torch.rand(3)
    torch.manual_seed(3)
    (want,) = torch.autograd.grad(f(x, w).sum(), w)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(after, torch.rand(3))


def test_double_backward_and_a_second_backward_raise_clear_errors():
    x, h, w, u, b = _rnn_inputs(4)
    g = tailjit.jit(_rnn)
    out = g(x, h, w, u, b).sum()
    (gw,) = torch.autograd.grad(out, w, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward is not supported"):
        gw.sum().backward()
    out = g(x, h, w, u, b).sum()
    out.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.backward()


def test_an_input_changed_in_place_before_the_backward_is_refused_as_in_eager():
    x, h, w, u, b = _rnn_inputs(5)
    g = tailjit.jit(_rnn)
    out = g(x, h, w, u, b).sum()
    with torch.no_grad():
        u.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward()


_UNARY = {
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu, "square": lambda v: v * v,
    "sort": lambda v: torch.sort(v, dim=1)[0], "softmax": lambda v: torch.softmax(v, 1),
    "flip": lambda v: v.flip(0), "cummax": lambda v: torch.cummax(v, 1)[0],
}  # fmt: skip


@st.composite
def _programs(draw):
    """A random straight-line program over a (4, 5) input and two (5, 5) weights: each statement a product
    with a weight, an element-wise function, or a sum of two earlier values."""
    stmts = []
    for k in range(draw(st.integers(2, 7))):
        kind = draw(st.sampled_from(["mm", "unary", "add"]))
        a = draw(st.integers(0, k))  # value 0 is the input
        if kind == "mm":
            stmts.append(("mm", a, draw(st.integers(0, 1)), draw(st.booleans())))
        elif kind == "unary":
            stmts.append(("unary", a, draw(st.sampled_from(sorted(_UNARY)))))
        else:
            stmts.append(("add", a, draw(st.integers(0, k))))
    outputs = draw(st.lists(st.integers(1, len(stmts)), min_size=1, max_size=3, unique=True))
    return stmts, outputs


def _run(program, x, w0, w1):
    stmts, outputs = program
    values, weights = [x], (w0, w1)
    for s in stmts:
        if s[0] == "mm":
            w = weights[s[2]]
            values.append(values[s[1]] @ (w.t() if s[3] else w))
        elif s[0] == "unary":
            values.append(_UNARY[s[2]](values[s[1]]))
        else:
            values.append(values[s[1]] + values[s[2]])
    return tuple(values[k] for k in outputs)


@settings(max_examples=40, deadline=None)
@given(_programs(), st.integers(0, 2**16))
def test_random_programs_of_products_and_kernels_match_eagers_gradients(program, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 5, generator=gen, requires_grad=True)
    w0, w1 = (torch.randn(5, 5, generator=gen, requires_grad=True) for _ in range(2))

    def f(x, w0, w1):
        return _run(program, x, w0, w1)

    g = tailjit.jit(f)
    got_out, got = _grads(g, [x, w0, w1], seed)
    want_out, want = _grads(f, [x, w0, w1], seed)
    for a, b in zip(got_out, want_out):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    for a, b in zip(got, want):
        if b is None:
            assert a is None or not a.any()
        else:
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_extern_products_that_read_the_ops_outputs():
    """``sort``'s gradient reads its indices, which the function never takes out of the tuple; ``inv``'s reads
    its result: both from the forward, not recomputed."""

    def f(x, w):
        values = torch.sort(torch.tanh(x @ w), dim=1)[0]
        return torch.linalg.inv(w @ w.t() + torch.eye(4)) @ values.t()

    gen = torch.Generator().manual_seed(6)
    x, w = torch.randn(5, 4, generator=gen, requires_grad=True), torch.randn(4, 4, generator=gen, requires_grad=True)
    g = _check(f, [x, w])
    assert "v" in g.reports[-1].host


def test_the_dynamo_backends_training_graphs_take_one_node_too():
    """``torch.compile(backend="tailjit")`` compiles a training graph inside Dynamo's tracing context: the
    products are traced outside it.  In its fake mode, their guards joined Dynamo's shape environment, which
    could not express them: ``lovasz_softmax``, which ``tailjit.jit`` hands to ``torch.compile`` (a branch
    on data), raised IndexError while Dynamo built its guards."""
    from tailjit.bench.ops import all_operators

    op = all_operators()["lovasz_softmax"]
    probs, labels = op.inputs("small", 0)
    torch._dynamo.reset()
    compiled = torch.compile(op.fn, backend="tailjit")
    ours, ref = probs.clone().requires_grad_(), probs.clone().requires_grad_()
    torch.testing.assert_close(torch.autograd.grad(compiled(ours, labels), ours)[0],
                               torch.autograd.grad(op.fn(ref, labels), ref)[0], atol=1e-6, rtol=1e-5)  # fmt: skip
    notes = [r.note for r in tailjit.frontend.REPORTS[-8:]]
    assert any("as one autograd node" in n for n in notes), notes


def test_bad_data_raises_pytorchs_error_and_draws_random_numbers_once():
    """An index out of range: the node's kernel refuses it, the per-node host function runs the ops eagerly
    and raises PyTorch's error, from the generator state the call began with (dropout's numbers are drawn
    once, as in eager); the next good call takes the one node again."""

    def f(x, w, idx):
        return torch.nn.functional.dropout(torch.tanh(x @ w), 0.3)[idx] @ w

    gen = torch.Generator().manual_seed(8)
    x, w = torch.randn(6, 4, generator=gen), torch.randn(4, 4, generator=gen, requires_grad=True)
    good, bad = torch.tensor([0, 5, 2]), torch.tensor([0, 6, 2])
    g = tailjit.jit(f)
    g(x, w, good)
    generators = []
    for fn in (g, f):
        torch.manual_seed(9)
        with pytest.raises(IndexError, match="out of bounds"):
            fn(x, w, bad)
        generators.append(torch.rand(4))
    torch.testing.assert_close(*generators)
    torch.manual_seed(10)
    out = g(x, w, good)
    assert type(out.grad_fn).__name__ == ONE_NODE
    (got,) = torch.autograd.grad(out.sum(), w)
    torch.manual_seed(10)
    (want,) = torch.autograd.grad(f(x, w, good).sum(), w)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_a_graph_of_extern_calls_alone_keeps_eagers_nodes_and_their_second_derivatives():
    def f(x, w):
        return (x @ w) @ w.t()

    gen = torch.Generator().manual_seed(11)
    x, w = torch.randn(3, 4, generator=gen), torch.randn(4, 4, generator=gen, requires_grad=True)
    g = tailjit.jit(f)
    hessian_vector = []
    for fn in (g, f):
        out = fn(x, w)
        assert type(out.grad_fn).__name__ != ONE_NODE
        (gw,) = torch.autograd.grad(out.pow(2).sum(), w, create_graph=True)
        hessian_vector.append(torch.autograd.grad(gw.sum(), w)[0])
    torch.testing.assert_close(*hessian_vector)


def test_two_backwards_through_one_node_with_retain_graph():
    """``loss1.backward(retain_graph=True); loss2.backward()`` (two heads of a multi-task model, a GAN's two
    losses): the node keeps what it saved for the second backward, as eager's nodes do."""
    x, h, *params = _rnn_inputs(12)
    g = tailjit.jit(_rnn)
    grads = []
    for fn in (g, _rnn):
        out = fn(x, h, *params)
        out.sum().backward(retain_graph=True)
        out.pow(2).sum().backward()
        grads.append([p.grad.clone() for p in params])
        for p in params:
            p.grad = None
    assert type(g(x, h, *params).grad_fn).__name__ == ONE_NODE
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_an_extern_whose_backward_reads_outputs_made_in_grad_mode_only():
    """The CPU LSTM (``mkldnn_rnn_layer``) returns its workspace, which its backward reads, only with grad
    mode on; the one node's forward runs with it off, so such an extern runs in grad mode (below autograd)."""
    lstm = torch.nn.LSTM(3, 4, batch_first=True)
    params = [p.detach().clone().requires_grad_() for p in lstm.parameters()]

    def fn(x, *ps):
        out, _ = torch.func.functional_call(lstm, dict(zip(dict(lstm.named_parameters()), ps)), (x,))
        return torch.tanh(out) * 2

    x = torch.randn(2, 5, 3, generator=torch.Generator().manual_seed(0))
    g = _check(fn, [x, *params])
    assert "mkldnn_rnn_layer" in g.reports[-1].captured + g.reports[-1].aten
