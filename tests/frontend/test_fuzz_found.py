"""Bugs the differential fuzzer (``tailjit fuzz``, ``tailjit/fuzz/``) found, each with its minimal program."""

import math

import pytest
import torch
import torch.nn.functional as F

import tailjit

ENTRIES = [lambda f: torch.compile(f, backend="tailjit"), tailjit.jit]


@pytest.mark.parametrize("entry", ENTRIES, ids=["compile", "jit"])
@pytest.mark.parametrize(
    "fn",
    [lambda x, m: x - True, lambda x, m: x - m, lambda x, m: m - x, lambda x, m: torch.sub(x, m, alpha=2),
     lambda x, m: True - x, lambda x, m: 1 - m],
    ids=["minus-True", "minus-mask", "mask-minus", "sub-alpha", "True-minus", "rsub-mask"],
)  # fmt: skip
def test_subtracting_a_bool_raises_as_in_eager(entry, fn):
    torch._dynamo.reset()
    x, m = torch.randn(2, 2), torch.tensor([True, False])
    with pytest.raises(RuntimeError, match="with a bool tensor is not supported"):
        fn(x, m)
    with pytest.raises(RuntimeError, match="with a bool tensor is not supported"):
        entry(fn)(x, m)


@pytest.mark.parametrize("entry", ENTRIES, ids=["compile", "jit"])
@pytest.mark.parametrize(
    "fn", [lambda m: m.argmax(), lambda m: torch.argmin(m, 0), lambda m: m.argmax(0, keepdim=True)]
)
def test_argmax_of_a_bool_tensor_raises_as_in_eager(entry, fn):
    torch._dynamo.reset()
    m = torch.tensor([True, False, True])
    with pytest.raises(RuntimeError, match="does not support bool input"):
        fn(m)
    with pytest.raises(RuntimeError, match="does not support bool input"):
        entry(fn)(m)


@pytest.mark.parametrize("entry", ENTRIES, ids=["compile", "jit"])
def test_hypot_of_integers_raises_as_in_eager(entry):
    torch._dynamo.reset()
    a, b = torch.tensor([3, -4]), torch.tensor([4, 0])
    with pytest.raises(NotImplementedError, match="hypot"):
        torch.hypot(a, b)
    with pytest.raises(NotImplementedError, match="hypot"):
        entry(torch.hypot)(a, b)


@pytest.mark.parametrize("entry", ENTRIES, ids=["compile", "jit"])
@pytest.mark.parametrize(
    "fn",
    [lambda x: x.max(0).values, lambda x: x.min(0, keepdim=True).values, lambda x: x.max(0).indices,
     lambda x: x.max(), lambda x: x.min()],
    ids=["max.dim", "min.dim", "max.dim-indices", "max", "min"],
)  # fmt: skip
def test_max_over_an_empty_dimension_raises_as_in_eager(entry, fn):
    torch._dynamo.reset()
    x = torch.randn(0, 3)
    with pytest.raises((IndexError, RuntimeError)) as want:
        fn(x)
    with pytest.raises(type(want.value)):
        entry(fn)(x)
    y = torch.randn(2, 3)
    assert torch.equal(entry(fn)(y), fn(y))  # non-empty: as before


@pytest.mark.parametrize("entry", ENTRIES, ids=["compile", "jit"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_of_values_that_do_not_broadcast_raises_as_in_eager(entry, accumulate):
    torch._dynamo.reset()
    fn = lambda x, i, v: x.index_put((i,), v, accumulate=accumulate)
    x, i = torch.zeros(3, 4), torch.tensor([1])
    with pytest.raises(RuntimeError, match="shape mismatch"):
        fn(x, i, torch.ones(2, 4))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        entry(fn)(x, i, torch.ones(2, 4))
    torch._dynamo.reset()
    assert torch.equal(entry(fn)(x, i, torch.ones(1, 4)), fn(x, i, torch.ones(1, 4)))  # broadcasting: as before


@pytest.mark.parametrize("entry", ENTRIES, ids=["compile", "jit"])
@pytest.mark.parametrize("op", [torch.floor, torch.ceil, torch.round, torch.trunc, torch.abs, torch.relu])
def test_rounding_abs_and_relu_of_a_bool_tensor_raise_as_in_eager(entry, op):
    torch._dynamo.reset()
    m = torch.tensor([True, False])
    with pytest.raises((NotImplementedError, RuntimeError)) as want:
        op(m)
    with pytest.raises(type(want.value)):
        entry(op)(m)


@pytest.mark.parametrize("entry", ENTRIES, ids=["compile", "jit"])
@pytest.mark.parametrize("grad", [False, True], ids=["plain", "grad"])
@pytest.mark.parametrize(
    "fn",
    [lambda x: (x.split(1, 0)[0],), lambda x: tuple(x.split([2, 4], 1)), lambda x: (x.chunk(3, 1)[2],),
     lambda x: (x.split(2, 0)[1].t(),), lambda x: (x.split(2, 0)[0], x.split(2, 0)[1] * 2),
     lambda x: (x.unflatten(1, (2, 3)).split(1, 1)[1],)],
    ids=["split", "split-sizes", "chunk", "split-then-view", "split-and-compute", "view-then-split"],
)  # fmt: skip
def test_outputs_of_split_are_views_of_the_input_as_in_eager(entry, grad, fn):
    # a list of views reaches the output through getitem: it runs as the ATen view it is, not a kernel's copy
    torch._dynamo.reset()
    x = torch.randn(4, 6, requires_grad=grad)
    want, got = fn(x), entry(fn)(x)
    for w, g in zip(want, got, strict=True):
        assert torch.equal(g, w)
        shares = w.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert (g.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()) == shares
        if shares:
            assert (g.stride(), g.storage_offset()) == (w.stride(), w.storage_offset())


def _clone_update(update):
    def fn(x):
        y = x.clone()
        update(y)
        return y

    return fn


@pytest.mark.parametrize("entry", ENTRIES, ids=["compile", "jit"])
@pytest.mark.parametrize(
    "x, update",
    [(torch.tensor([True, False]), lambda y: y.mul_(2)), (torch.tensor([True, False]), lambda y: y.mul_(3.0)),
     (torch.tensor([[True], [False]]), lambda y: y[0].__imul__(0.5)), (torch.tensor([3, 4]), lambda y: y.div_(2)),
     (torch.tensor([3, 4], dtype=torch.int32), lambda y: y.mul_(torch.tensor([0.5, 1.5]))),
     (torch.tensor([3, 4]), lambda y: y.sqrt_())],
    ids=["bool-mul-int", "bool-mul-float", "bool-imul-part", "long-div", "int-mul-float-tensor", "long-sqrt"],
)  # fmt: skip
def test_an_in_place_update_to_a_narrower_dtype_raises_as_in_eager(entry, x, update):
    torch._dynamo.reset()
    fn = _clone_update(update)
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type"):
        fn(x)
    with pytest.raises(RuntimeError, match="cast"):  # (Dynamo words some of its own checks differently)
        entry(fn)(x)


@pytest.mark.parametrize("entry", ENTRIES, ids=["compile", "jit"])
@pytest.mark.parametrize(
    "x, update",
    [(torch.tensor([1.5, 2.0]), lambda y: y.mul_(torch.tensor([True, False]))),
     (torch.tensor([3, 4], dtype=torch.int32), lambda y: y.add_(torch.tensor([5, 6]))),
     (torch.tensor([3, 4]), lambda y: y.div_(2, rounding_mode="floor")),
     (torch.tensor([True, False]), lambda y: y.copy_(torch.tensor([0.5, 0.0])))],
    ids=["float-mul-mask", "int-add-long", "long-floordiv", "bool-copy-float"],
)  # fmt: skip
def test_an_in_place_update_that_casts_compiles_as_in_eager(entry, x, update):
    torch._dynamo.reset()
    fn = _clone_update(update)
    torch.testing.assert_close(entry(fn)(x), fn(x))


@pytest.mark.parametrize("entry", ENTRIES, ids=["compile", "jit"])
@pytest.mark.parametrize(
    "update",
    [lambda p: p.add_(p), lambda p: p.mul_(-1), lambda p: p.view(1).sub_(3.5), lambda p: p.add_(torch.ones(()))],
    ids=["add-self", "mul-scalar", "view-sub", "add-float32"],
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_an_in_place_update_of_a_0d_input_is_kept_as_in_eager(entry, update, dtype):
    # PyTorch's own AOTAutograd path drops these updates of a 0-d float64 input
    torch._dynamo.reset()

    def fn(p):
        update(p)
        return -p * 2

    want_in, got_in = torch.tensor(0.75, dtype=dtype), torch.tensor(0.75, dtype=dtype)
    want = fn(want_in)
    torch.testing.assert_close(entry(fn)(got_in), want)
    torch.testing.assert_close(got_in, want_in)


def _same_as_eager(entry, fn, *args):
    """``entry(fn)`` raises eager's exception type where eager raises, else returns eager's value."""
    try:
        want = fn(*args)
    except Exception as e:  # noqa: BLE001 - whatever eager raises, the entry must too
        with pytest.raises(type(e)):
            entry(fn)(*args)
        return
    torch.testing.assert_close(entry(fn)(*args), want, equal_nan=True)


def _i(*v):
    return torch.tensor(v, dtype=torch.int64)


@pytest.mark.parametrize("entry", ENTRIES, ids=["compile", "jit"])
@pytest.mark.parametrize(
    "shape,fn",
    [((0, 0, 5), lambda x: x[:, torch.zeros(1, 2, dtype=torch.int64)]), ((3, 0, 5), lambda x: x[:, _i(0, 0)]),
     ((0, 3, 5), lambda x: x[_i(0)]), ((2, 0), lambda x: x[_i(5), _i(0)]), ((2, 0), lambda x: x[_i(0, 1, 2, -3)]),
     ((0, 2), lambda x: x[:, _i(5, -3)]), ((0, 3, 5), lambda x: x[:, :, _i(5)]), ((2, 0, 3), lambda x: x[_i(1, 5)]),
     ((2, 3), lambda x: x[_i(5), _i()]), ((0, 3), lambda x: x[_i(), _i(1)]), ((2, 3), lambda x: x[_i(1, 5)])],
    ids=["empty-dim", "empty-dim-full", "first-empty", "two-indices", "wraps", "empty-result", "last-dim",
         "out-of-range-empty", "empty-index", "empty-index-empty-dim", "out-of-range"],
)  # fmt: skip
def test_an_index_into_an_empty_dimension_raises_as_in_eager(entry, shape, fn):
    torch._dynamo.reset()
    _same_as_eager(entry, fn, torch.randn(shape))


@pytest.mark.parametrize("entry", ENTRIES, ids=["compile", "jit"])
@pytest.mark.parametrize(
    "shape,dim,index",
    [((0, 3, 1), 2, _i(1)), ((0, 3, 1), 2, _i(-1)), ((0, 3, 1), 2, _i(0)), ((0, 3, 1), 0, _i(0)), ((2, 0), 0, _i(5)),
     ((2, 0), 1, _i(0)), ((2, 0), 0, _i()), ((0,), 0, _i(0)), ((2, 3), 0, _i(-1)), ((2, 3), 1, _i(3))],
)  # fmt: skip
def test_index_select_of_an_empty_tensor_checks_its_indices_as_in_eager(entry, shape, dim, index):
    torch._dynamo.reset()
    _same_as_eager(entry, lambda x, i: x.index_select(dim, i), torch.randn(shape), index)


def _masked_zero(t):
    t[t > 0] = 0


def _row_fill(t):
    t[0] = 5.0


@pytest.mark.parametrize("entry", ENTRIES, ids=["compile", "jit"])
@pytest.mark.parametrize("update", [_masked_zero, _row_fill, lambda t: t.add_(1)], ids=["masked", "row", "add"])
def test_an_in_place_update_of_an_expanded_input_runs_as_in_eager(entry, update):
    torch._dynamo.reset()

    def fn(t):
        update(t)
        return t * 2

    base = torch.tensor([[1.5, -2.0]])
    want_in, got_in = base.clone().expand(3, 2), base.clone().expand(3, 2)
    try:
        want = fn(want_in)
    except RuntimeError:  # add_: eager refuses to write a tensor whose elements share memory
        with pytest.raises(RuntimeError, match="single memory location"):
            entry(fn)(got_in)
    else:
        torch.testing.assert_close(entry(fn)(got_in), want)
    torch.testing.assert_close(got_in, want_in)


@pytest.mark.parametrize("entry", ENTRIES, ids=["compile", "jit"])
@pytest.mark.parametrize(
    "shape,fn",
    [((0, 5), lambda x, i: x.index_add(0, i, torch.ones(3, 5))),
     ((2, 0), lambda x, i: x.index_add(0, i, torch.ones(3, 0))), ((0,), lambda x, i: x.index_add(0, i, torch.ones(3))),
     ((0, 5), lambda x, i: x.index_copy(0, i, torch.ones(3, 5))), ((0, 5), lambda x, i: x.index_fill(0, i, 1.0)),
     ((2, 5), lambda x, i: x.index_add(0, i, torch.ones(3, 5)))],
    ids=["index_add", "index_add-empty-rows", "index_add-1d", "index_copy", "index_fill", "index_add-out-of-range"],
)  # fmt: skip
def test_index_add_copy_and_fill_into_an_empty_tensor_as_in_eager(entry, shape, fn):
    torch._dynamo.reset()
    _same_as_eager(entry, fn, torch.zeros(shape), _i(0, 7, 0))


def _grads(entry, fn, x):
    torch._dynamo.reset()
    x = x.clone().requires_grad_()
    out = entry(fn)(x)
    return (out.detach(), *torch.autograd.grad(out, x, torch.ones_like(out)))


@pytest.mark.parametrize("entry", ENTRIES, ids=["compile", "jit"])
@pytest.mark.parametrize(
    "fn",
    [lambda x: x.norm(dim=0), lambda x: x.norm(dim=1), lambda x: torch.linalg.vector_norm(x, 1, dim=0),
     lambda x: torch.linalg.vector_norm(x, 3, dim=1), lambda x: x.std(1), lambda x: torch.std_mean(x, 0)[0]],
    ids=["norm-column", "norm-row", "l1", "l3", "std", "std_mean"],
)  # fmt: skip
@pytest.mark.parametrize(
    "values",
    [
        [[1e20, 1.0], [2.0, 3.0]],
        [[1.5e19, 2e38], [1.5e19, 2e38]],
        [[1e-23, 1.0], [1e-23, 2.0]],
        [[1.0, 1.0], [1.0, 1.0]],
    ],
    ids=["huge", "sum-overflows", "square-underflows", "constant"],
)
def test_float32_norms_and_deviations_overflow_as_in_eager(entry, fn, values):
    # eager sums a float32 norm's terms in float32, and takes a deviation's root in float64; the gradient of a
    # norm or deviation of 0 is 0
    x = torch.tensor(values)
    for got, want in zip(_grads(entry, fn, x), _grads(lambda f: f, fn, x)):
        torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("entry", ENTRIES, ids=["compile", "jit"])
@pytest.mark.parametrize(
    "fn",
    [lambda x: torch.atan2(x, x), lambda x: torch.atan2(x, 2 * x), lambda x: torch.atan2(1 - x, x),
     lambda x: torch.floor(torch.exp(x)), lambda x: torch.round(torch.log(x)), lambda x: torch.ceil(1 / x),
     lambda x: torch.trunc(x * x) + x, lambda x: torch.sign(torch.exp(x))],
    ids=["atan2-same", "atan2-scaled", "atan2", "floor-exp", "round-log", "ceil-div", "trunc-plus", "sign-exp"],
)  # fmt: skip
def test_gradients_at_zero_inf_and_nan_are_eager_ones(entry, fn):
    # atan2's is 0 where x^2 + y^2 is 0; rounding's is a zero that the ops before multiply (0 * inf is NaN)
    _same_gradients(entry, fn, torch.tensor([0.0, -0.0, 1e-30, 1.0, -1.0, 1e20, 1000.0, math.inf, -math.inf, math.nan]))


def _same_gradients(entry, fn, x):
    for got, want in zip(_grads(entry, fn, x), _grads(lambda f: f, fn, x)):
        torch.testing.assert_close(got, want, equal_nan=True)
        number = ~want.isnan()
        assert torch.equal(got[number].signbit(), want[number].signbit())


@pytest.mark.parametrize("entry", ENTRIES, ids=["compile", "jit"])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelus_gradient_is_its_derivative_times_the_incoming_one(entry, approximate):
    # eager multiplies the incoming gradient by gelu's derivative as one factor (1 at 1e20: exp's inf stays inf);
    # the product rule's terms gave inf * 0 in one of them (NaN).  (No infinities in: eager's own vectorised
    # and scalar loops disagree on gelu(inf).)
    x = torch.tensor([0.0, -0.0, 1e-30, 1.0, -1.0, 1e20, -1e20, 80.0, 1000.0, math.nan])
    _same_gradients(entry, lambda v: torch.exp(F.gelu(v, approximate=approximate)), x)


@pytest.mark.parametrize("entry", ENTRIES, ids=["compile", "jit"])
def test_a_broadcast_input_of_a_training_graph_is_read_as_its_base(entry):
    # the training host code passed the expanded tensor itself to a kernel built for its first elements
    torch._dynamo.reset()

    def fn(i, x):
        return torch.exp(i) * 2, torch.exp(x @ x)

    i = torch.arange(4).reshape(1, 2, 2).expand(3, 2, 2)
    x = torch.randn(2, 2)
    for got, want in zip(_grads_of(entry, fn, i, x), _grads_of(lambda f: f, fn, i, x)):
        torch.testing.assert_close(got, want)


def _grads_of(entry, fn, i, x):
    x = x.clone().requires_grad_()
    a, b = entry(fn)(i, x)
    return (a, b.detach(), *torch.autograd.grad(b, x, torch.ones_like(b)))


@pytest.mark.parametrize("entry", ENTRIES, ids=["compile", "jit"])
@pytest.mark.parametrize(
    "shape,fn",
    [((0,), lambda x: x.scatter_add(0, _i(0), torch.ones(1))), ((0, 3), lambda x: x.scatter(0, _i(0, 0, 0)[None], 1.0)),
     ((0, 3), lambda x: x.scatter_reduce(0, _i(0, 0, 0)[None], torch.ones(1, 3), "amax")),
     ((2, 0), lambda x: x.scatter(1, _i(0)[None], 1.0)), ((0, 3), lambda x: x.scatter(0, _i().reshape(0, 3), 1.0))],
    ids=["scatter_add", "scatter", "scatter_reduce", "empty-columns", "empty-index"],
)  # fmt: skip
def test_a_scatter_into_an_empty_tensor_checks_its_indices_as_in_eager(entry, shape, fn):
    torch._dynamo.reset()
    _same_as_eager(entry, fn, torch.zeros(shape))
