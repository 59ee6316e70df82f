"""Reductions (sum, mean, prod, amax/amin, max/min.dim, argmax/argmin, any/all) and softmax."""

from __future__ import annotations

import torch

from tailjit import te
from tailjit.frontend.lowering import register
from tailjit.frontend.symbolic import Unsupported

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


@register(aten.sum.dim_IntList)
def _sum_dim(L, x, dim=None, keepdim=False, dtype=None):
    return reduction(L, x, dim, keepdim, _summer("sum", dtype, L))


@register(aten.sum.default)
def _sum(L, x, dtype=None):
    return reduction(L, x, None, False, _summer("sum", dtype, L))


@register(aten.prod.dim_int)
def _prod_dim(L, x, dim, keepdim=False, dtype=None):
    return reduction(L, x, dim, keepdim, _summer("prod", dtype, L))


@register(aten.prod.default)
def _prod(L, x, dtype=None):
    return reduction(L, x, None, False, _summer("prod", dtype, L))


@register(aten.mean.dim, aten.mean.default)
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


@register(aten.amax.default)
def _amax(L, x, dim=(), keepdim=False):
    return reduction(L, x, dim, keepdim, _extreme(te.max))


@register(aten.amin.default)
def _amin(L, x, dim=(), keepdim=False):
    return reduction(L, x, dim, keepdim, _extreme(te.min))


def _arg(op):
    def f(e, axes):
        if axes is None:
            return te.cast(0, te.int64)
        return op(e, axes)

    return f


@register(aten.argmax.default)
def _argmax(L, x, dim=None, keepdim=False):
    return reduction(L, x, dim, keepdim, _arg(te.argmax))


@register(aten.argmin.default)
def _argmin(L, x, dim=None, keepdim=False):
    return reduction(L, x, dim, keepdim, _arg(te.argmin))


def _value_index(val_op, arg_op):
    def lower(L, x, dim, keepdim=False):
        if x.ndim == 0:
            raise Unsupported("max/min.dim of a 0-d tensor")
        values = reduction(L, x, dim, keepdim, _extreme(val_op), out=0, suffix="_values")
        indices = reduction(L, x, dim, keepdim, _arg(arg_op), out=1, suffix="_indices")
        return values, indices

    return lower


register(aten.max.dim)(_value_index(te.max, te.argmax))
register(aten.min.dim)(_value_index(te.min, te.argmin))


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
    mx = L.compute(red_shape, lambda r: te.max(x[put(r, k1)], k1), suffix="_max", dtype=dt)
    e = L.compute(shape, lambda idx: te.exp(x[idx] - mx[drop(idx)]), suffix="_exp", dtype=dt)
    k2 = L.axis(x.shape[d])
    s = L.compute(red_shape, lambda r: te.sum(e[put(r, k2)], k2), suffix="_sum", dtype=dt)
    return x, mx, e, s, drop


@register(aten._softmax.default)
def _softmax(L, x, dim, half_to_float=False):
    if half_to_float:
        raise Unsupported("half_to_float")
    x, mx, e, s, drop = _softmax_parts(L, x, dim)
    return L.compute(L.out_shape(), lambda idx: e[idx] / s[drop(idx)])


@register(aten._log_softmax.default)
def _log_softmax(L, x, dim, half_to_float=False):
    if half_to_float:
        raise Unsupported("half_to_float")
    x, mx, e, s, drop = _softmax_parts(L, x, dim)
    return L.compute(L.out_shape(), lambda idx: x[idx] - mx[drop(idx)] - te.log(s[drop(idx)]))
