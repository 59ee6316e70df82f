"""Reductions (sum, mean, prod, amax/amin, max/min.dim, argmax/argmin, any/all, var, vector norms), softmax, and
convolutions with few products per output (filters)."""

from __future__ import annotations

import functools
import math

import torch

from tailjit import te
from tailjit.frontend.lower.lowering import UNDECOMPOSED, refuse_bool, register
from tailjit.frontend.lower.symbolic import Unsupported
from tailjit.te.expr import Const

aten = torch.ops.aten


def _dims(x, dim):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(x.ndim))
    dims = [dim] if isinstance(dim, int) else list(dim)
    nd = max(x.ndim, 1)
    out = sorted({d + nd if d < 0 else d for d in dims})
    if x.ndim == 0:
        return []
    return out


def reduction(L, x, dim, keepdim, fn, out: int | None = None, suffix: str = ""):
    """A compute reducing ``x`` over ``dim`` with ``fn(element_expr, axes)``."""
    if not isinstance(x, te.Tensor):
        raise Unsupported("reduction of a non-tensor")
    dims = _dims(x, dim)
    axes = {d: L.axis(x.shape[d]) for d in dims}
    kept = [d for d in range(x.ndim) if d not in axes]

    def body(idx):
        if keepdim:
            src = [axes[d] if d in axes else idx[d] for d in range(x.ndim)]
        else:
            pos = dict(zip(kept, idx))
            src = [axes[d] if d in axes else pos[d] for d in range(x.ndim)]
        elem = x[tuple(src)] if x.ndim else x[()]
        if not axes:
            return fn(elem, None)
        return fn(elem, [axes[d] for d in dims])

    shape = L.out_shape(out)
    return L.compute(shape, body, suffix=suffix, dtype=L.out_dtype(out))


def _summer(op, dtype_arg, L):
    dt = L.out_dtype()

    def f(e, axes):
        if dtype_arg is not None:
            e = te.cast(e, dt)
        if axes is None:
            return te.cast(e, dt) if op == "sum" or op == "prod" else e
        r = (te.sum if op == "sum" else te.prod)(e, axes)
        return te.cast(r, dt) if r.dtype != dt else r

    return f


@register(aten.sum.dim_IntList, faithful=True)
def _sum_dim(L, x, dim=None, keepdim=False, dtype=None):
    return reduction(L, x, dim, keepdim, _summer("sum", dtype, L))


@register(aten.sum.default, faithful=True)
def _sum(L, x, dtype=None):
    return reduction(L, x, None, False, _summer("sum", dtype, L))


@register(aten.prod.dim_int, faithful=True)
def _prod_dim(L, x, dim, keepdim=False, dtype=None):
    return reduction(L, x, dim, keepdim, _summer("prod", dtype, L))


@register(aten.prod.default, faithful=True)
def _prod(L, x, dtype=None):
    return reduction(L, x, None, False, _summer("prod", dtype, L))


@register(aten.mean.dim, aten.mean.default, faithful=True)
def _mean(L, x, dim=None, keepdim=False, dtype=None):
    # a dtype argument is the output dtype, which the elements are cast to
    dt = L.out_dtype()
    if not dt.is_float:
        raise Unsupported("mean of a non-float tensor")
    count = 1
    for d in _dims(x, dim):
        count = count * x.shape[d]

    def f(e, axes):
        e = te.cast(e, dt)
        if axes is None:
            return e
        return te.cast(te.sum(e, axes) / te.cast(count, dt), dt)

    return reduction(L, x, dim, keepdim, f)


def _extreme(op):
    def f(e, axes):
        return e if axes is None else op(e, axes)

    return f


# ``x.max()`` and ``x.min()`` are the extreme of all elements, as ``amax`` over no dims (their gradients split
# ties as amax's do, but a NaN maximum sends its gradient to the NaN elements: not faithful, so their training
# graphs take AOTAutograd)
def _nonempty(x, dim, what: str):
    """Leave max/min over an empty dimension to eager, which raises, where the meta function (of ``max.dim``,
    of ``max()``) gives a shape instead (a size 0 is static: Dynamo and the jit's first trace specialise it)."""
    if isinstance(x, te.Tensor) and any(isinstance(x.shape[d], Const) and x.shape[d].value == 0
                                        for d in _dims(x, dim)):  # fmt: skip
        raise Unsupported(f"{what} over an empty dimension (eager raises)")


@register(aten.amax.default, faithful=True)
@register(aten.max.default)
def _amax(L, x, dim=(), keepdim=False):
    _nonempty(x, dim, "max")
    return reduction(L, x, dim, keepdim, _extreme(te.max))


@register(aten.amin.default, faithful=True)
@register(aten.min.default)
def _amin(L, x, dim=(), keepdim=False):
    _nonempty(x, dim, "min")
    return reduction(L, x, dim, keepdim, _extreme(te.min))


def _arg(op):
    def f(e, axes):
        if axes is None:
            return te.cast(0, te.int64)
        return op(e, axes)

    return f


@register(aten.argmax.default)
def _argmax(L, x, dim=None, keepdim=False):
    refuse_bool(x, what="argmax")
    return reduction(L, x, dim, keepdim, _arg(te.argmax))


@register(aten.argmin.default)
def _argmin(L, x, dim=None, keepdim=False):
    refuse_bool(x, what="argmin")
    return reduction(L, x, dim, keepdim, _arg(te.argmin))


def _value_index(val_op, arg_op):
    def lower(L, x, dim, keepdim=False):
        if x.ndim == 0:
            raise Unsupported("max/min.dim of a 0-d tensor")
        _nonempty(x, dim, "max/min.dim")
        values = reduction(L, x, dim, keepdim, _extreme(val_op), out=0, suffix="_values")
        indices = reduction(L, x, dim, keepdim, _arg(arg_op), out=1, suffix="_indices")
        return values, indices

    return lower


# not faithful: torch sends the gradient to the one index it returns, the expression splits it between ties and
# spreads a NaN over the row
register(aten.max.dim, faithful=False)(_value_index(te.max, te.argmax))
register(aten.min.dim, faithful=False)(_value_index(te.min, te.argmin))


def _anyall(is_any):
    def lower(L, x, dim=None, keepdim=False):
        def f(e, axes):
            hit = e != 0 if is_any else e == 0
            if axes is None:
                return hit if is_any else ~hit
            count = te.sum(te.cast(hit, te.int64), axes)
            return count > 0 if is_any else count == 0

        if L.out_dtype() != te.bool_:
            raise Unsupported("any/all with a non-bool result")
        return reduction(L, x, dim, keepdim, f)

    return lower


register(aten.any.dim, aten.any.dims, aten.any.default)(_anyall(True))
register(aten.all.dim, aten.all.dims, aten.all.default)(_anyall(False))


def _softmax_parts(L, x, dim):
    if not isinstance(x, te.Tensor) or x.ndim == 0:
        raise Unsupported("softmax of a 0-d tensor")
    dt = L.out_dtype()
    if x.dtype != dt:
        raise Unsupported("softmax with a dtype change")
    d = dim + x.ndim if dim < 0 else dim
    shape = L.out_shape()
    red_shape = shape[:d] + shape[d + 1 :]

    def put(r, k):  # a reduced index with k inserted at d
        return tuple(r[:d]) + (k,) + tuple(r[d:])

    def drop(idx):
        return tuple(idx[:d]) + tuple(idx[d + 1 :])

    k1 = L.axis(x.shape[d])
    # the result does not depend on the maximum it subtracts: no gradient through it (eager's formula has none)
    mx = te.stop_gradient(L.compute(red_shape, lambda r: te.max(x[put(r, k1)], k1), suffix="_max", dtype=dt))
    e = L.compute(shape, lambda idx: te.exp(x[idx] - mx[drop(idx)]), suffix="_exp", dtype=dt)
    k2 = L.axis(x.shape[d])
    s = L.compute(red_shape, lambda r: te.sum(e[put(r, k2)], k2), suffix="_sum", dtype=dt)
    return x, mx, e, s, drop


@register(aten._softmax.default, faithful=True)
def _softmax(L, x, dim, half_to_float=False):
    if half_to_float:
        raise Unsupported("half_to_float")
    x, mx, e, s, drop = _softmax_parts(L, x, dim)
    return L.compute(L.out_shape(), lambda idx: e[idx] / s[drop(idx)])


@register(aten._log_softmax.default, faithful=True)
def _log_softmax(L, x, dim, half_to_float=False):
    if half_to_float:
        raise Unsupported("half_to_float")
    x, mx, e, s, drop = _softmax_parts(L, x, dim)
    return L.compute(L.out_shape(), lambda idx: x[idx] - mx[drop(idx)] - te.log(s[drop(idx)]))


def _count(x, dims):
    n = te.cast(1, te.int64)
    for d in dims:
        n = n * x.shape[d]
    return n


def _moments(L, x, dim, correction, keepdim, out=None, root=False):
    """(variance, or with ``root`` the standard deviation; mean) over ``dim`` with PyTorch's divisor
    ``max(0, N - correction)``: two passes, float32 computed in float64 and rounded once (after the root,
    as in eager, so a float32 deviation whose variance is past the largest float is finite)."""
    if not isinstance(x, te.Tensor) or not x.dtype.is_float:
        raise Unsupported("var/std of a non-float tensor")
    dt = L.out_dtype(out)
    if dt != x.dtype:
        raise Unsupported("var with a dtype change")
    c = 1 if correction is None else correction
    if not isinstance(c, (int, float)) or isinstance(c, bool):
        raise Unsupported(f"correction={correction!r}")
    dims = _dims(x, dim)
    n = te.cast(_count(x, dims), te.float64)
    k1 = {d: L.axis(x.shape[d]) for d in dims}
    kept = [d for d in range(x.ndim) if d not in k1]

    def at(idx, axes):  # x's index from a kept-dims index and the reduce axes
        pos = dict(zip(kept, idx))
        return tuple(axes[d] if d in axes else pos[d] for d in range(x.ndim))

    def kept_idx(idx):  # an output index (keepdim or not) to the kept-dims index
        return tuple(idx[d] for d in kept) if keepdim else tuple(idx)

    red_shape = tuple(x.shape[d] for d in kept)
    mean = L.compute(
        red_shape, lambda r: te.sum(te.cast(x[at(r, k1)], te.float64), list(k1.values())) / n, "_mean", te.float64
    )
    k2 = {d: L.axis(x.shape[d]) for d in dims}

    def dev2(r):
        d = te.cast(x[at(r, k2)], te.float64) - mean[r]
        return d * d

    ss = L.compute(red_shape, lambda r: te.sum(dev2(r), list(k2.values())), "_ss", te.float64)
    divisor = te.maximum(n - c, 0.0)
    shape = L.out_shape(out)

    def finish(v):  # the select: eager's gradient of std is 0 where std is (autodiff's sqrt would divide by it)
        return te.select(v == 0, te.cast(0.0, te.float64), te.sqrt(v)) if root else v

    var = L.compute(
        shape, lambda idx: te.cast(finish(ss[kept_idx(idx)] / divisor), dt), "_var" if out is not None else "", dt
    )
    return var, mean, kept_idx, shape, dt


# lowered whole: decomposed, the root is taken of the variance rounded to the result type
UNDECOMPOSED.update({aten.std.correction, aten.std_mean.correction})


@register(aten.var.correction, aten.std.correction, faithful=True)
def _var(L, x, dim=None, *, correction=None, keepdim=False):
    if not isinstance(x, te.Tensor) or x.ndim == 0:
        raise Unsupported("var of a 0-d tensor")
    return _moments(L, x, dim, correction, keepdim, root=L.node.target == aten.std.correction)[0]


@register(aten.var_mean.correction, aten.std_mean.correction, faithful=False)  # its expression gradient is not eager's
def _var_mean(L, x, dim=None, *, correction=None, keepdim=False):
    if not isinstance(x, te.Tensor) or x.ndim == 0:
        raise Unsupported("var_mean of a 0-d tensor")
    dims = _dims(x, dim)
    if len(dims) > 1 and not L.node.args[0].meta["val"].is_contiguous():
        raise Unsupported("var_mean over several dimensions of a non-contiguous tensor")
    root = L.node.target == aten.std_mean.correction
    var, mean, kept_idx, shape, dt = _moments(L, x, dim, correction, keepdim, out=0, root=root)
    # PyTorch's mean here comes from Welford's running mean, which turns NaN once an infinite element
    # is followed by any other (in memory order: row-major for one dimension or a contiguous tensor)
    axes = {d: L.axis(x.shape[d]) for d in dims}
    kept = [d for d in range(x.ndim) if d not in axes]
    flat = te.cast(0, te.int64)
    for d in dims:
        flat = flat * x.shape[d] + axes[d]
    last = _count(x, dims) - 1

    def early_inf(r):
        pos = dict(zip(kept, r))
        e = x[tuple(axes[d] if d in axes else pos[d] for d in range(x.ndim))]
        return te.sum(te.cast(te.isinf(e) & (flat < last), te.int64), list(axes.values())) > 0

    red_shape = tuple(x.shape[d] for d in kept)
    poisoned = L.compute(red_shape, early_inf, "_early_inf", te.bool_)
    nan = te.cast(math.nan, dt)
    m = L.compute(
        L.out_shape(1),
        lambda idx: te.select(poisoned[kept_idx(idx)], nan, te.cast(mean[kept_idx(idx)], dt)),
        "_mean_out",
        L.out_dtype(1),
    )
    return var, m


@register(aten.linalg_vector_norm.default, faithful=True)
def _vector_norm(L, x, ord=2, dim=None, keepdim=False, *, dtype=None):  # noqa: A002
    if not isinstance(x, te.Tensor):
        raise Unsupported("norm of a non-tensor")
    dt = L.out_dtype()
    if not dt.is_float:
        raise Unsupported("norm with a non-float result")
    if not isinstance(ord, (int, float)) or isinstance(ord, bool):
        raise Unsupported(f"ord={ord!r}")
    p = float(ord)
    dims = _dims(x, dim)
    if math.isinf(p) and any(isinstance(x.shape[d], Const) and x.shape[d].value == 0 for d in dims):
        raise Unsupported("inf norm of an empty tensor (PyTorch raises)")

    def total(terms, axes):
        # eager sums float32 terms in float32, so a sum past the largest float is inf there (and under
        # 1e-45, 0): summed in float64, rounded once to the result type before the root, it is too
        return te.cast(te.sum(te.cast(terms, te.float64), axes), dt)

    def f(e, axes):
        a = te.abs(te.cast(e, dt))
        if axes is None:  # nothing reduced: |x|, or (x != 0) for ord 0
            return te.cast(e != 0, dt) if p == 0 else a
        if p == math.inf:
            return te.max(a, axes)
        if p == -math.inf:
            return te.min(a, axes)
        if p == 0:
            return te.cast(te.sum(te.cast(e != 0, te.int64), axes), dt)
        if p == 1:
            return total(a, axes)
        if p == 2:  # the select: eager's gradient is 0 where the norm is (autodiff's sqrt would divide by it)
            squares = total(a * a, axes)
            return te.select(squares == 0, te.cast(0.0, dt), te.sqrt(squares))
        return te.pow(total(te.pow(a, p), axes), 1.0 / p)

    return reduction(L, x, dim, keepdim, f)


#: A convolution is lowered when each output sums at most this many products over at most
#: ``CONV_MAX_CHANNELS`` input channel of its group (a depthwise or single-channel filter: a blur, a Sobel, a
#: box filter), so that its padding and neighbours fuse with it.  A larger one, or a sum over channels (a 1x1
#: convolution is a matrix product), stays an extern call to torch's convolution, whose blocked kernels a loop
#: nest of this kind does not match: lowered, ShiftNet's 1x1 convolutions over 32 and 64 channels and its 3x3
#: stem over 3 made its training step 2.6x slower than eager's (``tailjit bench --suite networks``).
CONV_MAX_TERMS = 64
CONV_MAX_CHANNELS = 1


def conv_refusal(window) -> str | None:
    """Why a convolution whose weight has ``window`` = (channels per group, *kernel) sizes stays torch's, or
    None where it is lowered."""
    terms = math.prod(window)
    if terms > CONV_MAX_TERMS:
        return f"convolution of {terms} products per output (lowered up to {CONV_MAX_TERMS})"
    if window[0] > CONV_MAX_CHANNELS:
        return f"convolution over {window[0]} input channels per group (lowered up to {CONV_MAX_CHANNELS})"
    return None


# its expression gradient matches eager's, but training is faster through AOTAutograd's backward graph, which
# lowers convolution_backward (below) apart from the rest
@register(aten.convolution.default, faithful=False)
def _convolution(L, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """``out[n, o, p] = bias[o] + sum(x[n, g(o) * c + i, p * stride - padding + k * dilation] * weight[o, i, k])``
    over the group's input channels ``i`` and the kernel offsets ``k``, zero outside the input."""
    return _filter(L, L.out_shape(), x, weight, bias, stride, padding, dilation, transposed, groups)


@register(aten.convolution_backward.default)
def _convolution_backward(L, grad, x, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
                          groups, output_mask):  # fmt: skip
    """The gradients of such a convolution (AOTAutograd's backward graphs), derived from its expression by
    ``te.gradient``; None where ``output_mask`` asks for none."""
    out = _filter(L, grad.shape, x, weight, None, stride, padding, dilation, transposed, groups)
    wanted = [t for t, m in zip((x, weight), output_mask) if m]
    grads = iter(te.gradient(out, wanted, head=grad) if wanted else ())
    grad_x, grad_w = (next(grads) if m else None for m in output_mask[:2])
    if not output_mask[2]:
        return grad_x, grad_w, None
    summed = [0, *range(2, grad.ndim)]  # all but the channels
    return grad_x, grad_w, reduction(L, grad, summed, False, lambda e, axes: te.sum(e, axes), out=2, suffix="_b")


def _filter(L, shape, x, weight, bias, stride, padding, dilation, transposed, groups):
    if not (isinstance(x, te.Tensor) and isinstance(weight, te.Tensor)) or transposed:
        raise Unsupported("transposed convolution" if transposed else "convolution of a non-tensor")
    if not (x.dtype.is_float and weight.dtype == x.dtype and (bias is None or bias.dtype == x.dtype)):
        raise Unsupported("convolution of mixed or non-float dtypes")
    nd = weight.ndim - 2
    window = weight.shape[1:]  # (channels per group, *kernel)
    if x.ndim != nd + 2 or not all(isinstance(d, Const) for d in window):
        raise Unsupported("convolution with a kernel of symbolic size")
    why = conv_refusal([d.value for d in window])
    if why is not None:
        raise Unsupported(why)
    stride, padding, dilation = (list(v) * nd if len(v) == 1 else list(v) for v in (stride, padding, dilation))
    axes = [L.axis(d.value) if d.value > 1 else 0 for d in window]  # (an extent-1 axis is index 0)
    per_group = weight.shape[0] // groups if groups > 1 else None

    def body(n, o, *p):
        first = (o // per_group) * window[0].value if per_group is not None else 0
        at = [p[d] * stride[d] - padding[d] + axes[1 + d] * dilation[d] for d in range(nd)]
        inside = [(a >= 0) & (a < x.shape[2 + d]) for d, a in enumerate(at) if padding[d] > 0]
        term = x[(n, first + axes[0], *at)]
        if inside:
            term = te.select(functools.reduce(lambda a, b: a & b, inside), term, te.cast(0, x.dtype))
        term = term * weight[(o, *axes)]
        summed = [a for a in axes if not isinstance(a, int)]
        total = te.sum(term, summed) if summed else term
        return total + bias[o] if bias is not None else total

    return te.compute(tuple(shape), body, name=L.name("_conv"))
