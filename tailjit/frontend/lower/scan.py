"""Cumulative ops along a dimension (``te.scan``): cumsum, cumprod, cummax, cummin, logcumsumexp.

As in PyTorch's CPU kernels, float32 accumulates in float64 and each element
is rounded once; integer and bool inputs give int64 (unless ``dtype``)."""

from __future__ import annotations

import math

import torch

from tailjit import te
from tailjit.frontend.lower.lowering import register
from tailjit.frontend.lower.symbolic import Unsupported

aten = torch.ops.aten
F64 = te.float64


def _input(x, dim):
    if not isinstance(x, te.Tensor) or x.ndim == 0:
        raise Unsupported("scan of a 0-d tensor")
    return dim + x.ndim if dim < 0 else dim


def _acc(dt):
    return F64 if dt == te.float32 else dt


def _scan(L, x, d, step, initial, acc, suffix=""):
    """``step(prev, element)`` along ``d`` in dtype ``acc``, then rounded to the node's dtype."""
    dt = L.out_dtype()
    s = te.scan(x.shape, d, lambda prev, *idx: step(prev, te.cast(x[idx], acc)), initial=initial, dtype=acc,
                name=L.name(suffix or ("_acc" if acc != dt else "")))  # fmt: skip
    if acc == dt:
        return s
    return L.compute(x.shape, lambda idx: te.cast(s[tuple(idx)], dt))


@register(aten.cumsum.default, faithful=True)
def _cumsum(L, x, dim, dtype=None):
    d = _input(x, dim)
    dt = L.out_dtype()
    acc = _acc(dt)
    return _scan(L, x, d, lambda prev, v: prev + v, te.cast(0, acc), acc)


@register(aten.cumprod.default, faithful=False)  # the expression's gradient at inf is not eager's
def _cumprod(L, x, dim, dtype=None):
    d = _input(x, dim)
    acc = _acc(L.out_dtype())
    return _scan(L, x, d, lambda prev, v: prev * v, te.cast(1, acc), acc)


def _log_add_exp(a, b):
    """log(exp(a) + exp(b)) without overflow; NaN propagates, equal infinities stay themselves."""
    hi, lo = te.maximum(a, b), te.minimum(a, b)
    nan = te.cast(math.nan, a.dtype)
    same_inf = (hi == lo) & te.isinf(hi)
    return te.select(te.isnan(a) | te.isnan(b), nan, te.select(same_inf, hi, hi + te.log1p(te.exp(lo - hi))))


@register(aten.logcumsumexp.default, faithful=False)  # the expression's gradient at inf is not eager's
def _logcumsumexp(L, x, dim):
    d = _input(x, dim)
    dt = L.out_dtype()
    if not dt.is_float:
        raise Unsupported("logcumsumexp of a non-float tensor")
    acc = _acc(dt)
    return _scan(L, x, d, _log_add_exp, te.cast(-math.inf, acc), acc)


def _lowest(dt, largest):
    """The value no element compares past: -inf/+inf, the integer limits, False/True."""
    if dt.is_float:
        return te.cast(-math.inf if largest else math.inf, dt)
    if dt.is_bool:
        return te.cast(not largest, dt)
    lim = 2 ** (dt.bits - 1)
    return te.cast(-lim if largest else lim - 1, dt)


def _cum_extreme(largest):
    def lower(L, x, dim):
        d = _input(x, dim)
        dt = L.out_dtype(0)
        if x.dtype != dt:
            raise Unsupported("cummax/cummin with a dtype change")

        def takes(v, prev):
            # PyTorch's kernel: a NaN element, or (no NaN so far and) v >= the running value (<= for cummin),
            # replaces it; so ties move the index forward and the first NaN sticks
            if not dt.is_float:
                return v >= prev if largest else v <= prev
            better = v >= prev if largest else v <= prev
            return te.isnan(v) | (~te.isnan(prev) & better)

        lowest = _lowest(dt, largest)
        values = te.scan(x.shape, d, lambda prev, *idx: te.select(takes(x[idx], prev), x[idx], prev), initial=lowest,
                         dtype=dt, name=L.name("_values"))  # fmt: skip

        def index_step(prev, *idx):
            before = tuple(idx[k] - 1 if k == d else idx[k] for k in range(x.ndim))
            running = te.select(idx[d] > 0, values[before], lowest)  # the running value before this element
            return te.select(takes(x[idx], running), idx[d], prev)

        indices = te.scan(x.shape, d, index_step, initial=te.cast(0, te.int64), dtype=te.int64, name=L.name("_indices"))
        return values, indices

    return lower


register(aten.cummax.default, faithful=True)(_cum_extreme(True))
register(aten.cummin.default, faithful=True)(_cum_extreme(False))
