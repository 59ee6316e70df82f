"""@tailjit.op: tensor-expression functions as differentiable torch operators, eagerly,
in nn.Modules and inside torch.compile graphs (as one opaque custom op)."""

import importlib
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tailjit
from tailjit import te

F64 = torch.float64


@tailjit.op
def gated(x, h, alpha, shift=(0, 1)):
    """A small LLTM-like cell: a row reduction, element-wise math, a static shift."""
    n, m = x.shape
    k = te.reduce_axis(m, "k")
    s = te.compute((n,), lambda i: te.sum(x[i, k] * h[i, k], axis=k), name="s")

    def body(i, j):
        shifted = te.select(j + shift[1] < m, h[i, j + shift[1]], 0.0)
        return te.tanh(x[i, j] * alpha) + te.sigmoid(s[i]) * shifted

    y = te.compute((n, m), body, name="y")
    best = te.compute((n,), lambda i: te.argmax(y[i, k], axis=k), name="best")
    return y, best


def gated_ref(x, h, alpha, shift=(0, 1)):
    s = (x * h).sum(1, keepdim=True)
    shifted = torch.cat([h[:, shift[1] :], torch.zeros_like(h[:, : shift[1]])], 1)
    y = torch.tanh(x * alpha) + torch.sigmoid(s) * shifted
    return y, y.argmax(1)


def inputs(n=3, m=5, dtype=F64):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, m, generator=g, dtype=dtype, requires_grad=True),
            torch.randn(n, m, generator=g, dtype=dtype, requires_grad=True))  # fmt: skip


def test_eager_values_gradients_and_cache():
    x, h = inputs()
    y, best = gated(x, h, 0.5)
    wy, wbest = gated_ref(x, h, 0.5)
    torch.testing.assert_close(y, wy)
    assert torch.equal(best, wbest) and not best.requires_grad
    assert torch.autograd.gradcheck(lambda a, b: gated(a, b, 0.5)[0], (x, h))
    entries = len(gated._entries)
    gated(*inputs(4, 7), 0.5)  # another size: same build
    gated(*inputs(4, 7), alpha=0.5, shift=(0, 1))  # keywords and the default: same signature
    assert len(gated._entries) == entries
    gated(*inputs(), 0.25)  # a static argument is part of the key
    gated(*inputs(dtype=torch.float32), 0.5)  # so is the dtype
    assert len(gated._entries) == entries + 2


def test_program_exposes_the_tensor_expressions():
    x, h = inputs()
    prog = gated.program(x, h, 0.5)
    assert [p.name for p in prog.inputs] == ["x", "h"]
    assert [o.name for o in prog.outputs] == ["y", "best"]
    assert prog.inputs[0].shape[0].name == "x_0" and prog.inputs[0].dtype == te.float64
    assert gated.program(x.detach(), h.detach(), 0.5) is prog


def test_inside_a_module_with_parameters():
    class Cell(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.h = torch.nn.Parameter(torch.randn(3, 5, dtype=F64))

        def forward(self, x):
            return gated(x, self.h, 2.0)[0].sum()

    cell = Cell()
    x = torch.randn(3, 5, dtype=F64)
    cell(x).backward()
    h = cell.h.detach().requires_grad_()
    gated_ref(x, h, 2.0)[0].sum().backward()
    torch.testing.assert_close(cell.h.grad, h.grad)


def test_eager_call_paths():
    # __call__ keys its entries cheaply; an unhashable static argument (a list) takes the general
    # path to the same signature, and a tensor subclass still gets the kernel's clear error
    x, h = inputs()
    y_list, _ = gated(x, h, 0.5, [0, 1])
    y_tuple, _ = gated(x, h, 0.5, (0, 1))
    torch.testing.assert_close(y_list, y_tuple)
    assert y_list.requires_grad
    with torch.no_grad():
        assert not gated(x, h, 0.5)[0].requires_grad

    class Sub(torch.Tensor):
        pass

    with pytest.raises(TypeError, match="pass a plain torch.Tensor"):
        gated(x.detach().as_subclass(Sub).requires_grad_(), h, 0.5)


@tailjit.op
def scaled_rows(a, b):
    """``a * b[:m] + b[0]`` for ``a`` (n, m) and ``b`` at least m long."""
    n, m = a.shape
    return te.compute((n, m), lambda i, j: a[i, j] * b[j] + b[0], name="scaled_rows")


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 4), m=st.integers(1, 4), extra=st.integers(0, 2))
def test_equal_sizes_share_a_variable(n, m, extra):
    # duck sizing: a build per pattern of equal sizes, so b's length is m's variable exactly when they are
    # equal (its gradient then needs no bounds test); values and gradients match eager for every pattern
    g = torch.Generator().manual_seed(n * 100 + m * 10 + extra)
    a = torch.randn(n, m, dtype=F64, generator=g, requires_grad=True)
    b = torch.randn(m + extra, dtype=F64, generator=g, requires_grad=True)
    y = scaled_rows(a, b)
    want = a * b[:m] + b[0]
    torch.testing.assert_close(y, want)
    head = torch.randn(n, m, dtype=F64, generator=g)
    for got, ref in zip(torch.autograd.grad(y, (a, b), head), torch.autograd.grad(want, (a, b), head)):
        torch.testing.assert_close(got, ref)
    pa, pb = scaled_rows.program(a, b).inputs
    assert (pb.shape[0] is pa.shape[1]) == (extra == 0)
    assert (pa.shape[0] is pa.shape[1]) == (n == m)


def test_the_per_call_lookup_is_bounded(monkeypatch):
    monkeypatch.setattr(importlib.import_module("tailjit.op"), "FAST_KEYS", 3)
    scaled_rows._fast.clear()
    for m in range(1, 9):  # eight shapes, one pattern of equal sizes (b as long as a's rows)
        a, b = torch.randn(2, m + 2), torch.randn(m + 2)
        torch.testing.assert_close(scaled_rows(a, b), a * b + b[0])
        assert len(scaled_rows._fast) <= 3
    patterns = {sig for sig in scaled_rows._entries if sig[0][1] == 2 and sig[0][2] == "float32"}
    assert len(patterns) == 1


@pytest.mark.parametrize(
    "loss",
    [
        lambda y: y.sum(),  # the head is an expanded scalar: copied
        lambda y: (torch.cat([y, y[:, :2]], 1) ** 2).sum(),  # a narrowed row of the cat's gradient: read in place
        lambda y: (y.t() * torch.arange(y.shape[0], dtype=y.dtype)).sum(),  # a transposed head: copied
    ],
    ids=["expanded", "narrowed", "transposed"],
)
def test_backward_takes_any_head_layout(loss):
    x, h = inputs(4, 6)
    loss(gated(x, h, 0.5)[0]).backward()
    x2, h2 = (t.detach().requires_grad_() for t in (x, h))
    loss(gated_ref(x2, h2, 0.5)[0]).backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(h.grad, h2.grad)


@tailjit.op
def shifted(x, w):
    return te.compute(x.shape, lambda i, j: x[i, j] + w[i, j] * w[i, j], name="y")


@pytest.mark.parametrize("compiled", [False, True])
def test_an_output_gradient_handed_on(compiled):
    """``x``'s gradient is the output's as it is: called eagerly, the op hands it on as eager's autograd
    does; in a compiled graph its backward custom op, which may not return an alias of an input, a copy."""
    fn = torch.compile(shifted, backend="tailjit", fullgraph=True) if compiled else shifted
    x, w = inputs(3, 4)
    head = torch.randn(3, 4, dtype=F64)
    gx, gw = torch.autograd.grad(fn(x, w), [x, w], head)
    torch.testing.assert_close(gx, head)
    torch.testing.assert_close(gw, 2 * w.detach() * head)
    assert (gx.data_ptr() == head.data_ptr()) != compiled


def test_functorch_transforms_get_a_clear_error():
    x, h = inputs()
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.grad(lambda a: gated(a, h, 0.5)[0].sum())(x)


def test_bad_static_argument():
    x, h = inputs()
    with pytest.raises(TypeError, match="argument 'alpha' is a dict"):
        gated(x, h, {"a": 1})
    with pytest.raises(TypeError, match="missing argument 'alpha'"):
        gated(x, h)


class _Recorder:
    """A Dynamo backend that keeps the graphs it is given and runs them eagerly."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def _targets(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def fn(x, h):
    y, best = gated(x, h, 0.5)
    return (y.sin() * 2).sum() + best.sum()


def fn_ref(x, h):
    y, best = gated_ref(x, h, 0.5)
    return (y.sin() * 2).sum() + best.sum()


def test_torch_compile_sees_one_opaque_op():
    rec = _Recorder()
    x, h = inputs()
    out = torch.compile(fn, backend=rec, fullgraph=True)(x, h)
    torch.testing.assert_close(out, fn_ref(x, h))
    (gm,) = rec.graphs
    ours = [t for t in _targets(gm) if "tailjit" in t]
    assert len(ours) == 1, _targets(gm)


@pytest.mark.parametrize("backend", ["aot_eager", "tailjit"])
def test_torch_compile_training_and_inference(backend):
    x, h = inputs()
    cf = torch.compile(fn, backend=backend, fullgraph=True, dynamic=True)
    for n, m in ((3, 5), (4, 6)):
        x, h = inputs(n, m)
        out = cf(x, h)
        gx, gh = torch.autograd.grad(out, [x, h])
        wx, wh = torch.autograd.grad(fn_ref(x, h), [x, h])
        torch.testing.assert_close(out, fn_ref(x, h))
        torch.testing.assert_close(gx, wx)
        torch.testing.assert_close(gh, wh)
        with torch.no_grad():
            torch.testing.assert_close(cf(x, h), fn_ref(x, h))


def test_tailjit_graphs_call_the_op_functions_directly(monkeypatch):
    """In a graph tailjit compiles, the op's forward and backward run as their Python functions,
    not through the dispatcher (``tailjit.op.DIRECT``); the results are those of eager."""
    from tailjit.op import DIRECT

    calls = []

    def counting(overload):
        run = DIRECT[overload]

        def counted(*args):
            calls.append(overload.name())
            return run(*args)

        return counted

    for overload in (gated._fwd._opoverload, gated._bwd._opoverload):
        monkeypatch.setitem(DIRECT, overload, counting(overload))
    x, h = inputs(4, 7)
    cf = torch.compile(fn, backend="tailjit", fullgraph=True)
    out = cf(x, h)
    gx, gh = torch.autograd.grad(out, [x, h])
    wx, wh = torch.autograd.grad(fn_ref(x, h), [x, h])
    torch.testing.assert_close(out, fn_ref(x, h))
    torch.testing.assert_close((gx, gh), (wx, wh))
    assert sorted(calls) == sorted([gated._fwd._opoverload.name(), gated._bwd._opoverload.name()])


def test_inside_tailjit_jit_and_torch_func_transforms():
    """Under a trace (tailjit.jit's make_fx) or a functorch transform the op's tensors hold no data: it goes
    through the dispatcher as one custom op (it used to run its kernel on them, a segfault), and vmap gets
    a clear error."""
    f = tailjit.jit(fn)
    for n, m in ((3, 5), (4, 6)):
        x, h = inputs(n, m)
        with torch.no_grad():
            torch.testing.assert_close(f(x, h), fn_ref(x, h))
        out = f(x, h)
        torch.testing.assert_close(out, fn_ref(x, h))
        torch.testing.assert_close(torch.autograd.grad(out, [x, h]), torch.autograd.grad(fn_ref(x, h), [x, h]))
    assert f.fallback is None and f.reports
    x, h = inputs()
    first = lambda a, b: gated(a, b, 0.5)[0]  # noqa: E731
    torch.testing.assert_close(torch.func.functionalize(first)(x, h), gated_ref(x, h, 0.5)[0])
    with pytest.raises(RuntimeError, match="Batching rule not implemented"):
        torch.vmap(first)(x[None], h[None])


@pytest.mark.slow
def test_torch_compile_inductor():
    cf = torch.compile(fn, fullgraph=True)
    x, h = inputs()
    out = cf(x, h)
    gx, gh = torch.autograd.grad(out, [x, h])
    wx, wh = torch.autograd.grad(fn_ref(x, h), [x, h])
    torch.testing.assert_close(out, fn_ref(x, h))
    torch.testing.assert_close(gx, wx)
    torch.testing.assert_close(gh, wh)


@tailjit.op
def softmax_lse(x):
    """Softmax and log-sum-exp of rows: both read the row maximum and sum, which the kernel keeps in
    buffers."""
    n, m = x.shape
    k = te.reduce_axis(m, "k")
    mx = te.stop_gradient(te.compute((n,), lambda i: te.max(x[i, k], axis=k), name="mx"))
    s = te.compute((n,), lambda i: te.sum(te.exp(x[i, k] - mx[i]), axis=k), name="s")
    y = te.compute((n, m), lambda i, j: te.exp(x[i, j] - mx[i]) / s[i], name="softmax")
    return y, te.compute((n,), lambda i: te.log(s[i]) + mx[i], name="lse")


def softmax_lse_ref(x):
    return torch.softmax(x, 1), torch.logsumexp(x, 1)


@pytest.mark.parametrize("route", ["eager", "tailjit", "aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_saved_reductions_feed_the_backward(route):
    """The row maximum and sum are extra outputs of the kernel (after the op's own), kept for the
    backward; the op's callers never see them, eagerly or in a compiled graph."""
    x = torch.randn(6, 9, dtype=F64)
    x[2, 4] = float("-inf")
    heads = torch.randn(6, 9, dtype=F64), torch.randn(6, dtype=F64)
    fn = softmax_lse if route == "eager" else torch.compile(softmax_lse, backend=route, fullgraph=True)
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = fn(a), softmax_lse_ref(b)
    assert len(got) == 2
    torch.testing.assert_close(got, want, equal_nan=True)
    torch.autograd.backward(got, heads)
    torch.autograd.backward(want, heads)
    torch.testing.assert_close(a.grad, b.grad, equal_nan=True)
    kernel = softmax_lse.kernel(x)
    assert kernel.n_saved == 2 and kernel.output_names[-2:] == ["mx", "s"]  # both read by two loop nests
    assert [k.role for k in kernel.kernels if k.name in ("mx", "s")] == ["output kept for the backward"] * 2
    assert [t.name for t in softmax_lse.program(x).saved] == ["mx", "s"]
    with torch.no_grad():
        assert len(softmax_lse(x)) == 2
    assert torch.autograd.gradcheck(lambda t: softmax_lse(t), torch.randn(3, 4, dtype=F64, requires_grad=True))


def test_custom_op_names_follow_the_code(tmp_path, monkeypatch):
    """The custom op's name changes with the file defining the op (Inductor's caches find compiled
    graphs by op names), is the same in another process, and stays unique in this one."""
    import importlib
    import subprocess
    import sys

    src = (
        "import tailjit\nfrom tailjit import te\n\n@tailjit.op\ndef double(x):\n"
        "    return te.compute(x.shape, lambda *i: x[i] * {k}, name='y')\n"
    )
    (tmp_path / "opmod.py").write_text(src.format(k=2))
    monkeypatch.syspath_prepend(str(tmp_path))
    first = importlib.import_module("opmod").double._qualname
    again = tailjit.op(importlib.import_module("opmod").double.fn)._qualname
    assert again.startswith(first) and again != first
    probe = "import opmod; print(opmod.double._qualname)"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    other = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert other.stdout.strip() == first
    (tmp_path / "opmod.py").write_text(src.format(k=3))
    changed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert changed.stdout.strip() != first


def test_fake_implementations_match_the_kernels_strides():
    # the kernels return contiguous gradients whatever the inputs' strides; the backward's fake
    # implementation must say so, or Inductor's stride assertions fail on a transposed input
    x, h = (t.detach().t().contiguous().t() for t in inputs(4, 6))  # column-major
    key = gated._key((True, True, False), (0, 0, 0.5))
    y, best = gated(x, h, 0.5)
    head = torch.randn_like(y)
    torch.library.opcheck(gated._fwd, ([x, h], key), test_utils=("test_faketensor",))
    # the backward reads the float outputs, then the reductions the forward saved for it (the row sums)
    _, _, *kept = gated._fwd([x, h], key)
    assert len(kept) == 1
    torch.library.opcheck(gated._bwd, ([x, h], [y, *kept], [head], key, 3), test_utils=("test_faketensor",))


@tailjit.op
def softmax_rows(x):
    n, m = x.shape
    k = te.reduce_axis(m, "k")
    mx = te.stop_gradient(te.compute((n,), lambda i: te.max(x[i, k], axis=k), name="mx"))
    e = te.compute((n, m), lambda i, j: te.exp(x[i, j] - mx[i]), name="e")
    s = te.compute((n,), lambda i: te.sum(e[i, k], axis=k), name="s")
    return te.compute((n, m), lambda i, j: e[i, j] / s[i], name="softmax")


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_softmax_backward_reads_its_exponentials_back_from_the_output(dtype):
    """The backward reads exp(x - max) as y * s from the saved output and row sum (no exp, no pass over
    x); rows whose sum is 0, inf or NaN give NaN gradients, as torch's do."""
    x = torch.randn(7, 40, dtype=dtype) * 5
    x[1, 3], x[2, :], x[3, 5], x[4, :] = float("inf"), float("-inf"), float("nan"), -1e30
    x[4, 0] = 0.0
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    head = torch.randn(7, 40, dtype=dtype)
    got, want = softmax_rows(a), torch.softmax(b, 1)
    torch.testing.assert_close(got, want, equal_nan=True)
    torch.autograd.backward(got, head)
    torch.autograd.backward(want, head)
    torch.testing.assert_close(a.grad, b.grad, equal_nan=True)
    kernel = softmax_rows.kernel(x)
    assert kernel.output_names == ["softmax", "s"] and kernel.n_saved == 1  # the maximum is not read
    backward = kernel.gradient_kernel((True,))
    assert "exp(" not in backward.describe() and backward.input_names == [
        "x",
        "softmax_saved",
        "s_saved",
        "grad_softmax",
    ]
    assert torch.autograd.gradcheck(softmax_rows, torch.randn(3, 5, dtype=F64, requires_grad=True))
