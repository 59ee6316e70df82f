"""torch.compile(fn, backend="tailjit") against eager PyTorch.

Every check compiles a graph of several ops (one tailjit build per region keeps
the number of C compiles, about 0.4 s each, low) and asserts that no node fell
back to eager, so a passing test really ran the lowering."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import tailjit
import tailjit.frontend  # noqa: F401  (registers the backend)
from tailjit.frontend import explain_graph
from tailjit.frontend.plan.report import collect_reports

#: Every graph report of this module's tests (tailjit.frontend.REPORTS keeps the newest 64 only).
REPORTS: list = []


@pytest.fixture(autouse=True)
def _collect_reports():
    with collect_reports(REPORTS):
        yield


FLOATS = [torch.float32, torch.float64]


def _compile(fn, dynamic=None):
    return torch.compile(fn, backend="tailjit", dynamic=dynamic, fullgraph=False)


def _assert_same(got, want):
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype, (i, g.dtype, w.dtype)
        assert g.shape == w.shape, (i, g.shape, w.shape)
        if w.dtype.is_floating_point:
            tol = dict(rtol=1e-5, atol=1e-5) if w.dtype == torch.float32 else {}
            torch.testing.assert_close(g, w, equal_nan=True, msg=lambda m, i=i: f"output {i}: {m}", **tol)
        else:
            assert torch.equal(g, w), (i, g, w)


def check(fn, *args, fallbacks=0, dynamic=None):
    """Compile ``fn``, compare with eager; every node lowered unless ``fallbacks`` says otherwise."""
    start = len(REPORTS)
    got = _compile(fn, dynamic)(*args)
    _assert_same(got, fn(*args))
    reports = REPORTS[start:]
    assert reports, "the backend was not called"
    for r in reports:
        assert r.eager_reason is None, r.eager_reason
    if fallbacks is not None:
        fb = [str(f) for r in reports for f in r.fallbacks]
        assert len(fb) == fallbacks, fb
    return reports


def _special(x):
    """x with NaN, inf and -inf planted."""
    x = x.clone()
    flat = x.view(-1) if x.is_contiguous() else None
    if flat is not None and flat.numel() >= 4:
        flat[0], flat[1], flat[2] = float("nan"), float("inf"), float("-inf")
    return x


def _layout(x, layout):
    if layout == "noncontig":
        return x.t().contiguous().t()  # same values, transposed strides
    if layout == "sliced":
        return torch.cat([x, x], dim=1)[:, ::2]
    return x


# ---------------------------------------------------------------- pointwise


UNARY_FLOAT = [torch.exp, torch.log, torch.log1p, torch.expm1, torch.sqrt, torch.rsqrt, torch.sin, torch.cos,
               torch.tan, torch.tanh, torch.sigmoid, torch.erf, torch.abs, torch.floor, torch.ceil, torch.round,
               torch.trunc, torch.isnan, torch.isinf, torch.neg, torch.reciprocal, torch.relu,
               torch.logical_not]  # fmt: skip
# eager gelu(inf) is inf on some CPUs and nan on others (AVX-512): compared on finite values and NaN only
GELU = [torch.nn.functional.gelu, lambda x: torch.nn.functional.gelu(x, approximate="tanh")]


@pytest.mark.parametrize("dtype,layout", [(torch.float32, "contig"), (torch.float64, "noncontig")])
def test_unary_float(dtype, layout):
    x = _layout(_special(torch.randn(5, 7, dtype=dtype) * 3), layout)
    finite = torch.where(x.isinf(), 40 * x.sign(), x)

    def fn(x, finite):
        return tuple(op(x) for op in UNARY_FLOAT) + tuple(op(finite) for op in GELU)

    check(fn, x, finite)


def test_unary_int_and_bool():
    x = torch.randint(-9, 9, (4, 6))
    b = torch.rand(4, 6) > 0.5

    def fn(x, b):
        return (torch.abs(x), torch.neg(x), torch.floor(x), torch.relu(x), ~x, torch.logical_not(x),
                torch.bitwise_not(b), torch.logical_not(b), torch.exp(x), torch.sqrt(x.abs()),
                torch.reciprocal(x))  # fmt: skip

    check(fn, x, b)


def _binary_ops(a, b):
    return (a + b, a - b, a * b, torch.add(a, b, alpha=2), torch.sub(a, b, alpha=3), torch.maximum(a, b),
            torch.minimum(a, b), a == b, a != b, a < b, a <= b, a > b, a >= b)  # fmt: skip


@pytest.mark.parametrize("dtype", FLOATS)
def test_binary_float_broadcast(dtype):
    a = _layout(_special(torch.randn(6, 5, dtype=dtype)), "noncontig")
    b = torch.randn(5, dtype=dtype) + 0.1
    c = torch.randn(6, 1, dtype=dtype).abs() + 0.5

    def fn(a, b, c):
        return _binary_ops(a, b) + (a / b, a // b, a % b, torch.pow(c, b), a**2, 2.0**a, torch.atan2(a, c),
                                    torch.div(a, b, rounding_mode="trunc"), torch.div(a, b, rounding_mode="floor"),
                                    a * 0.1, 3 - a, a / 7, a + c)  # fmt: skip

    check(fn, a, b, c)


def test_binary_int():
    a = torch.randint(-20, 20, (6, 5))
    b = torch.randint(1, 7, (5,)) * torch.where(torch.rand(5) > 0.5, 1, -1)
    i32 = torch.randint(-5, 5, (6, 5), dtype=torch.int32)

    def fn(a, b, i32):
        return _binary_ops(a, b) + (a // b, a % b, a / b, torch.div(a, b, rounding_mode="trunc"), a & b, a | b,
                                    a ^ b, a * 3, a + 0.5, i32 + 1, i32 * a, a**2, i32.float())  # fmt: skip

    check(fn, a, b, i32)


def test_logical_and_bool():
    a = torch.rand(4, 5) > 0.5
    b = torch.rand(1, 5) > 0.5
    x = torch.randn(4, 5)
    x[0, 0] = float("nan")

    def fn(a, b, x):
        return (a & b, a | b, a ^ b, torch.logical_and(a, x), torch.logical_or(x, b), torch.logical_xor(a, b),
                a == b, a + b, a * b, x > 0)  # fmt: skip

    check(fn, a, b, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_where_clamp_casts_fills(dtype):
    x = (torch.randn(5, 6) * 4).to(dtype)
    y = (torch.randn(6) * 4).to(dtype)
    c = torch.rand(5, 1) > 0.5
    lo = torch.full((5, 1), -1).to(dtype)

    def fn(x, y, c, lo):
        return (torch.where(c, x, y), torch.where(x > 0, x, 0), torch.clamp(x, min=-2, max=3), torch.clamp(x, min=lo),
                torch.clamp(x, max=y), x.clamp_min(1), x.clamp_max(0.5), x.to(torch.float64), x.to(torch.int32),
                x.to(torch.bool), x.float(), torch.zeros_like(x), torch.ones_like(x), torch.full_like(x, 7),
                x.clone(), torch.arange(x.shape[1]) + x)  # fmt: skip

    check(fn, x, y, c, lo)


def test_nan_in_clamp_and_where():
    x = _special(torch.randn(3, 4))
    check(lambda x: (torch.clamp(x, -1, 1), torch.where(x > 0, x, -x), torch.relu(x), torch.maximum(x, x.flip(1))),
          x)  # fmt: skip


# ---------------------------------------------------------------- reductions


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64])
def test_reductions(dtype):
    x = (torch.randn(4, 5, 6) * 3).to(dtype)
    if dtype.is_floating_point:
        x[0, 0, 0] = float("nan")
        x[1, 2, 3] = float("inf")
    x = x.transpose(0, 2)

    def fn(x):
        out = (x.sum(), x.sum(1), x.sum((0, 2), keepdim=True), x.sum(-1, dtype=torch.float64), x.amax(1),
               x.amin((0, 1)), x.max(1).values, x.max(2, keepdim=True).indices, x.min(0).values, x.min(0).indices,
               x.argmax(1), x.argmin(2, keepdim=True), x.argmax(), x.prod(1), x.any(1), x.all(2))  # fmt: skip
        if x.dtype.is_floating_point:
            out += (x.mean(1), x.mean((0, 2), keepdim=True), x.mean())
        return out

    check(fn, x)


def test_bool_reductions():
    b = torch.rand(5, 7) > 0.6
    b[2] = False
    check(lambda b: (b.any(), b.all(), b.any(1), b.all(0, keepdim=True), b.sum(1), b.sum()), b)


@pytest.mark.parametrize("dtype", FLOATS)
def test_softmax(dtype):
    x = torch.randn(5, 8, dtype=dtype) * 5
    x[1] = float("-inf")
    x[2, 3] = float("inf")
    x = _layout(x, "noncontig")

    def fn(x):
        return torch.softmax(x, -1), torch.log_softmax(x, 1), torch.softmax(x, 0), torch.log_softmax(x, 0)

    check(fn, x)


# ---------------------------------------------------------------- views


@pytest.mark.parametrize("layout", ["contig", "sliced"])
def test_views(layout):
    x = _layout(torch.randn(6, 4), layout)
    z = torch.randn(2, 3, 4)

    def fn(x, z):
        return (x.reshape(3, 8), x.reshape(-1), x.view(2, 3, 4) if x.is_contiguous() else x.reshape(2, 3, 4),
                x.t(), x.permute(1, 0) + 1, x.transpose(0, 1).reshape(-1), x[1:5:2], x[:, -3:], x[2], x[:, 1],
                x[-1], x.unsqueeze(1), x.unsqueeze(-1).squeeze(-1), x[None].squeeze(0), x[:, None, :].expand(6, 3, 4),
                z.reshape(6, 4) * x, z.permute(2, 0, 1).reshape(4, 6), z.flatten(1), z[:, None].expand(2, 5, 3, 4),
                x.reshape(2, 3, 4)[1])  # fmt: skip

    check(fn, x, z)


def test_cat_and_stack():
    a = torch.randn(3, 4)
    b = torch.randn(2, 4).t().contiguous().t()
    c = torch.randint(0, 5, (3, 2))

    def fn(a, b, c):
        return (torch.cat([a, b]), torch.cat([a, c], 1), torch.stack([a, a * 2], 0), torch.stack([a, a + 1], -1),
                torch.cat([a, b, a], 0).sum(0))  # fmt: skip

    check(fn, a, b, c)


def test_scalar_tensor_inputs():
    x = torch.tensor(2.5)
    y = torch.randn(3)
    check(lambda x, y: (x * 2, x.exp(), (x + 1).reshape(1), x.unsqueeze(0), y.sum() + 1), x, y)


# ---------------------------------------------------------------- long-tail functions


def bbox2delta(p, g, means=(0.0, 0.0, 0.0, 0.0), stds=(0.1, 0.1, 0.2, 0.2)):
    pw, ph = p[:, 2] - p[:, 0], p[:, 3] - p[:, 1]
    px, py = p[:, 0] + 0.5 * pw, p[:, 1] + 0.5 * ph
    gw, gh = g[:, 2] - g[:, 0], g[:, 3] - g[:, 1]
    gx, gy = g[:, 0] + 0.5 * gw, g[:, 1] + 0.5 * gh
    d = torch.stack([(gx - px) / pw, (gy - py) / ph, torch.log(gw / pw), torch.log(gh / ph)], dim=-1)
    return (d - d.new_tensor(means)) / d.new_tensor(stds)


def pairwise_iou(a, b, eps=1e-6):
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return inter / (area_a[:, None] + area_b[None, :] - inter + eps)


def focal_loss(logits, targets, alpha=0.25, gamma=2.0):
    p = torch.sigmoid(logits)
    ce = -(targets * torch.log(p.clamp(min=1e-12)) + (1 - targets) * torch.log((1 - p).clamp(min=1e-12)))
    p_t = p * targets + (1 - p) * (1 - targets)
    a_t = alpha * targets + (1 - alpha) * (1 - targets)
    return (a_t * (1 - p_t) ** gamma * ce).mean()


def sequence_mask(lengths, max_len: int):
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def _boxes(n):
    xy = torch.rand(n, 2) * 10
    return torch.cat([xy, xy + torch.rand(n, 2) * 5 + 0.1], 1)


def test_long_tail_functions():
    (r,) = check(bbox2delta, _boxes(7), _boxes(7))
    ((kernel, _),) = r.kernels
    assert len(kernel.kernels) == 1  # the whole box coder, stacked columns included, is one loop nest
    check(pairwise_iou, _boxes(5), _boxes(4))
    check(focal_loss, torch.randn(6, 3), (torch.rand(6, 3) > 0.7).float())
    check(sequence_mask, torch.tensor([3, 1, 5, 0]), 6)


def test_long_tail_dynamic_sizes_reuse_kernels():
    fn = _compile(pairwise_iou)
    start = len(REPORTS)
    for n, m in ((3, 4), (6, 5), (9, 11), (17, 2)):
        a, b = _boxes(n), _boxes(m)
        _assert_same(fn(a, b), pairwise_iou(a, b))
    # the first size is specialised, the second re-traces with symbolic sizes, the rest reuse that graph
    assert len(REPORTS) - start == 2
    assert all(not r.fallbacks for r in REPORTS[start:])


def test_dynamic_true_one_graph_three_sizes():
    start = len(REPORTS)
    fn = _compile(lambda x, y: (torch.softmax(x * y, -1).sum(0), x.reshape(-1, 2) + 1), dynamic=True)
    for n in (4, 6, 10):
        x, y = torch.randn(n, 6), torch.randn(6)
        _assert_same(fn(x, y), (torch.softmax(x * y, -1).sum(0), x.reshape(-1, 2) + 1))
    assert len(REPORTS) - start == 1
    ((kernel, _),) = REPORTS[-1].kernels
    assert kernel.build_info.cache in ("compiled", "disk", "memory")


# ---------------------------------------------------------------- fallback and explain


def _with_sort(x):
    y = torch.sort(x * 2 + 1, dim=-1).values
    return (y - y.mean(-1, keepdim=True)).exp().sum(-1), torch.sinh(x)  # sort and sinh have no lowering


def test_unsupported_op_runs_eagerly_between_regions():
    x = torch.randn(5, 6)
    (r,) = check(_with_sort, x, fallbacks=None)
    names = " ".join(str(f) for f in r.fallbacks)
    assert "sort" in names and "sinh" in names
    assert len(r.kernels) == 2  # x * 2 + 1 before the sort, the normalisation after it


def test_explain_graph():
    text = explain_graph(_with_sort, torch.randn(4, 3))
    assert "aten.sort.default" in text and "no lowering" in text
    assert "tailjit kernel 'tailjit_region'" in text and "loop nest" in text
    assert "tj_call" in text  # the generated C
    assert "--- ATen ---" in text


def test_unsupported_dtype_falls_back():
    x = torch.randn(3, 4, dtype=torch.float16)
    (r,) = check(lambda x: x * 2 + 1, x, fallbacks=2)
    assert "float16" in str(r.fallbacks[0])


def test_training_compiles_forward_and_backward():
    x = torch.randn(3, 4, requires_grad=True)
    start = len(REPORTS)
    out = _compile(lambda x: (x * 2).exp().sum())(x)
    out.backward()
    torch.testing.assert_close(x.grad, 2 * (x.detach() * 2).exp())
    (report,) = REPORTS[start:]  # differentiated by tailjit: the forward kernel and its gradient kernel
    assert report.kind == "training" and "differentiated by its tensor expressions" in report.note
    assert [k.name for k, _ in report.kernels] == ["tailjit_region", "tailjit_region_backward"]
    assert not report.fallbacks
    with torch.no_grad():
        check(lambda x: (x * 3).exp(), x)


def test_training_with_an_unchecked_gradient_goes_through_aot_autograd():
    x = torch.randn(3, 4, requires_grad=True)
    start = len(REPORTS)
    out = _compile(lambda x: torch.nn.functional.hardswish(x * 2).sum())(x)
    out.backward()
    y = x.detach().clone().requires_grad_()
    torch.nn.functional.hardswish(y * 2).sum().backward()
    torch.testing.assert_close(x.grad, y.grad)
    kinds = [r.kind for r in REPORTS[start:]]
    assert kinds == ["dynamo", "forward", "backward"], kinds
    assert "aten.hardswish.default" in REPORTS[start].note
    assert all(r.kernels and not r.fallbacks for r in REPORTS[start + 1 :])


def test_options_are_refused_rather_than_ignored():
    torch._dynamo.reset()
    f = torch.compile(lambda x: x.sin() + 1, backend="tailjit", options={"compile": "background"})
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="the tailjit backend takes no options") as err:
        f(torch.ones(3))
    assert isinstance(err.value.inner_exception, ValueError) and "compile='background'" in str(err.value)


def test_backend_is_registered():
    assert "tailjit" in torch._dynamo.list_backends()


def test_tuple_values_and_eager_nodes_interleave():
    def fn(x):
        m = x.max(1)
        s = torch.sort(x, 1).values
        return m.values + s[:, 0], m.indices, s * 2

    (r,) = check(fn, torch.randn(5, 6), fallbacks=1)
    assert len(r.kernels) == 1  # the sort does not need the open region, so it stays one region


def test_in_place_mutation_is_functionalised():
    def fn(x, y):
        x.add_(1)
        y[1:] = 0
        return x * 2

    x, y = torch.randn(3), torch.randn(4)
    xe, ye = x.clone(), y.clone()
    start = len(REPORTS)
    got = _compile(fn)(x, y)
    assert torch.equal(got, fn(xe, ye))
    assert torch.equal(x, xe) and torch.equal(y, ye)  # the inputs were mutated as in eager
    assert "mutates" in REPORTS[start].note
    (r,) = [r for r in REPORTS[start:] if r.kind == "inference"]
    assert r.kernels and sum("copy_" in f.target for f in r.fallbacks) == 2, r.fallbacks  # write-backs into x, y


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_partial_update_of_an_input_writes_the_part_only(dynamic):
    """``heat[c][y0:y1, x0:x1] = max(...)``: functionalised into a scatter of the whole input and a copy back,
    it is compiled as a copy into the part (CenterNet's target drawing ran 100 times slower otherwise)."""

    def draw(heat, c, y0, x0, blob):
        part = heat[c][y0 : y0 + 3, x0 : x0 + 3]
        heat[c][y0 : y0 + 3, x0 : x0 + 3] = torch.maximum(part, blob.exp())
        return heat

    f = _compile(draw, dynamic)
    for c, y0, x0 in [(1, 2, 4), (3, 0, 5)]:
        heat, blob = torch.rand(4, 8, 9), torch.randn(3, 3)
        want = draw(heat.clone(), c, y0, x0, blob)
        start = len(REPORTS)
        got = f(heat, c, y0, x0, blob)
        assert got is heat  # updated in place, returned as eager returns it
        torch.testing.assert_close(heat, want)
        for r in [r for r in REPORTS[start:] if r.kind == "inference"]:
            assert not any("scatter" in name for _, names in r.kernels for name in names), r.kernels
            targets = [f.target for f in r.fallbacks]  # symbolic slice starts are ATen views too
            assert "aten.copy_.default" in targets and not any("scatter" in t for t in targets), targets


def test_a_partial_update_from_the_input_itself_is_not_narrowed():
    """The value is a view of the updated input: a copy into the part could overlap its own source."""

    def shift(x):
        x[1:] = x[:-1] * 1  # a fresh value: narrowed
        x[:2] = x[2:4]  # a view of x: the whole-tensor update stays
        return x

    x = torch.randn(6)
    want = shift(x.clone())
    assert torch.equal(_compile(shift)(x), want) and torch.equal(x, want)


def test_outputs_alias_inputs_as_in_eager():
    def fn(x):
        return x.t(), x[1:], x.view(-1), x * 2

    x = torch.randn(3, 4)
    t, s, v, y = _compile(fn)(x)
    x[1, 1] = 100.0  # the returned views see the change, as eager views do
    assert t[1, 1] == 100 and s[0, 1] == 100 and v[5] == 100 and y[1, 1] != 100
    assert len(REPORTS[-1].views) == 3


def test_views_feeding_extern_calls_stay_views():
    """A transpose read only by a matrix product runs as the ATen view (no copy in a region)."""

    def fn(a, b):
        return torch.mm(a.t(), b.permute(1, 0)) * 2

    (r,) = check(fn, torch.randn(5, 3), torch.randn(4, 5), fallbacks=1)
    assert len(r.views) == 2 and len(r.kernels) == 1  # t and permute; the product's scaling


def test_a_region_of_views_only_is_not_compiled():
    """An index expanded for ``scatter_reduce`` (left extern by its data-dependent output size) stays a view:
    a kernel would only copy it, and torch's fast path needs the stride-0 index (segment_max was 12x slower
    than eager with the copy)."""

    def fn(data, ids):
        index = ids.unsqueeze(1).expand_as(data)
        out = data.new_zeros(ids.max().item() + 1, data.size(1))
        return out.scatter_reduce(0, index, data, reduce="amax", include_self=False)

    data, ids = torch.randn(40, 3), torch.randint(0, 5, (40,)).sort().values
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        reports = check(fn, data, ids, fallbacks=None)

    def copies_the_index(r):  # a kernel (ids.max()'s is one) holding the view nodes
        return any({"unsqueeze", "expand"} & set(nodes) for _, nodes in r.kernels)

    assert not any(map(copies_the_index, reports))
    assert any({"unsqueeze", "expand"} <= set(r.views) for r in reports)
    f = tailjit.jit(fn)
    torch.testing.assert_close(f(data, ids), fn(data, ids))
    assert not copies_the_index(REPORTS[-1]) and {"unsqueeze", "expand"} <= set(REPORTS[-1].views)


def test_a_flattening_view_of_an_input_runs_before_the_kernel():
    """``mask.view(B, -1)`` of a (B, 1, H, W) input is an ATen reshape before the kernel, which reads it flat
    instead of by ``// W`` and ``% W`` per element (tversky_loss 115 -> 42 us); an input whose strides allow
    no view is copied by the reshape, as eager's reshape would."""

    def fn(x, m):
        return (x.sigmoid() * m.reshape(m.shape[0], -1)).sum(1)

    x, m = torch.randn(4, 60), torch.rand(4, 1, 6, 10)
    (r,) = check(fn, x, m, fallbacks=0)
    assert "view" in r.views and all("//" not in k.describe() for k, _ in r.kernels)
    f = tailjit.jit(fn)
    torch.testing.assert_close(f(x, m), fn(x, m))
    strided = torch.rand(4, 1, 10, 6).transpose(2, 3)  # (4, 1, 6, 10), no flat view of it exists
    torch.testing.assert_close(f(x, strided), fn(x, strided))


def test_training_graph_transposes_for_products_stay_views():
    x = torch.randn(6, 5, requires_grad=True)
    w = torch.randn(4, 5, requires_grad=True)

    def fn(x, w):
        return (x @ w.t()).tanh().sum()

    start = len(REPORTS)
    loss = _compile(fn)(x, w)
    got = torch.autograd.grad(loss, (x, w))
    want = torch.autograd.grad(fn(x, w), (x, w))
    torch.testing.assert_close(loss, fn(x, w))
    torch.testing.assert_close(got, want)
    assert any("permute" in r.views for r in REPORTS[start:])  # the weight's transpose, read by the product


@pytest.mark.slow  # a fresh interpreter importing torch and Dynamo: about 15 s
def test_entry_point_without_import(tmp_path):
    """backend="tailjit" with no tailjit import, through a torch_dynamo_backends entry point (the one
    pyproject.toml should declare; simulated here with a dist-info folder on the path)."""
    dist = tmp_path / "tailjit_entry_point_probe-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tailjit-entry-point-probe\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(
        "[torch_dynamo_backends]\ntailjit = tailjit.frontend.backend:tailjit_backend\n"
    )
    code = (
        "import sys, torch\n"
        "assert 'tailjit' not in sys.modules and 'tailjit.frontend' not in sys.modules\n"
        "f = torch.compile(lambda x: torch.softmax(x * 2, -1), backend='tailjit')\n"
        "x = torch.randn(3, 5)\n"
        "torch.testing.assert_close(f(x), torch.softmax(x * 2, -1))\n"
        "from tailjit.frontend import REPORTS\n"
        "assert REPORTS and REPORTS[-1].kernels and not REPORTS[-1].fallbacks\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path)] + sys.path))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-3000:]


def _symbolic_mix(x, y, lengths):
    n = x.shape[0]
    return (x.view(n, -1).sum(1) / x.shape[1], torch.cat([x, y], 0)[1:, -2:] * 2,
            x[:, :, -1].expand(2, n, x.shape[1]), torch.arange(n)[None, :] < lengths[:, None],
            torch.cat([x.reshape(-1), y.reshape(-1)]).mean(), x.permute(2, 0, 1).reshape(x.shape[2], -1).amax(-1),
            x.new_zeros(n, 2) + n)  # fmt: skip


def test_symbolic_size_arithmetic():
    """Sizes used as values, in view/expand/arange arguments and sym_numel // s: one region, every size."""
    fn = _compile(_symbolic_mix, dynamic=True)
    start = len(REPORTS)
    for n, m in ((5, 9), (8, 7)):  # no size equal to another dimension: duck sizing would unify them
        args = (torch.randn(n, 4, 3), torch.randn(m, 4, 3), torch.randint(0, 9, (6,)))
        _assert_same(fn(*args), _symbolic_mix(*args))
    (r,) = REPORTS[start:]
    assert not r.fallbacks and len(r.kernels) == 1


def test_region_runs_eagerly_when_its_kernel_refuses_the_sizes():
    """The host function's fallback path (the kernels' call-time bounds check is conservative for
    some fused compound indices), forced here by a kernel that always refuses."""

    def refuse(*args):
        raise IndexError("tailjit kernel: index 0 of the load x[i] can fall outside [0, n) for these input sizes")

    a, b = _boxes(6), _boxes(6)
    jf = tailjit.jit(bbox2delta, adapt=False)  # (the entry's call is the host function itself, not a trial)
    jf(a, b)
    ((kernel, _),) = jf.reports[0].kernels
    host = next(iter(jf.entries.values()))[0].call.__globals__
    name = next(k for k, v in host.items() if v is kernel)
    host[name] = refuse
    try:
        _assert_same(jf(a, b), bbox2delta(a, b))
    finally:
        host[name] = kernel
