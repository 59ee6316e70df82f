"""Accumulating writes (``te.scatter``): scatter, scatter_add, scatter_reduce, index_put with integer
indices, masked_scatter.

``te.scatter`` applies the updates in row-major order of their domain on a
copy of the base, as PyTorch's CPU kernels do, so duplicate indices
accumulate (add, mul, max, min) or the last write wins (assign).  A target
outside the tensor raises ``IndexError`` in the kernel; the host function
then runs the region eagerly, which raises PyTorch's own error."""

from __future__ import annotations

import math

import torch

from tailjit import te
from tailjit.frontend.lower.index import (
    EMPTY_CHECKS,
    _empty,
    _index_layout,
    _index_tensor,
    _wrap,
    index_source,
    masked_index_put,
)
from tailjit.frontend.lower.lowering import UNDECOMPOSED, is_one, load_bcast, register, scalar_arg
from tailjit.frontend.lower.symbolic import Unsupported
from tailjit.te.expr import Const

aten = torch.ops.aten
I64 = te.int64
COMBINE = {"sum": "add", "add": "add", "prod": "mul", "multiply": "mul", "amax": "max", "amin": "min"}


def _tensor(x):
    if not isinstance(x, te.Tensor):
        raise Unsupported("scatter of a non-tensor")
    return x


def _scatter(L, base, domain, fupdate, combine, suffix=""):
    out = te.scatter(base, domain, fupdate, combine, name=L.name(suffix))
    if not suffix and out.dtype != L.out_dtype():
        raise Unsupported(f"scatter gives {out.dtype}, PyTorch gives {L.out_dtype()}")
    return out


def _along(x, d, index):
    """Targets of a scatter along ``d``: the domain point with ``index[point]`` at ``d`` (no wrapping:
    PyTorch rejects negative indices here)."""

    def targets(idx):
        return tuple(index[tuple(idx)] if k == d else idx[k] for k in range(x.ndim))

    return targets


def _dim_args(x, dim, index):
    x, index = _tensor(x), _index_tensor(index)
    if x.ndim == 0 or index.ndim != x.ndim:
        raise Unsupported("scatter of a 0-d tensor")
    if _empty(x) and not _empty(index):  # ATen checks the indices against it (RuntimeError); no write would
        raise Unsupported(f"a scatter {EMPTY_CHECKS}")
    return x, (dim + x.ndim if dim < 0 else dim), index


def _value_fn(src):
    if isinstance(src, te.Tensor):
        return lambda idx: src[tuple(idx)]
    v = scalar_arg(src, "scatter value")
    return lambda idx: v


@register(aten.scatter.src, aten.scatter.value, faithful=True)
@register(aten.scatter.reduce, aten.scatter.value_reduce)
def _scatter_op(L, x, dim, index, src, *, reduce=None):
    x, d, index = _dim_args(x, dim, index)
    combine = "assign" if reduce is None else COMBINE.get(reduce)
    if combine is None:
        raise Unsupported(f"scatter reduce={reduce!r}")
    targets, value = _along(x, d, index), _value_fn(src)
    if _one_per_slice(x, d, index) and combine in ("assign", "add", "mul"):
        return _one_update_per_slice(L, x, d, index, value, combine)
    return _scatter(L, x, index.shape, lambda *idx: (targets(idx), value(idx)), combine)


@register(aten.scatter_add.default, faithful=True)
def _scatter_add(L, x, dim, index, src):
    x, d, index = _dim_args(x, dim, index)
    if _one_per_slice(x, d, index):
        return _one_update_per_slice(L, x, d, index, lambda idx: _tensor(src)[tuple(idx)], "add")
    targets = _along(x, d, index)
    return _scatter(L, x, index.shape, lambda *idx: (targets(idx), src[idx]), "add")


def _one_per_slice(x, d, index) -> bool:
    """Whether a scatter along ``d`` updates exactly one element of every slice of ``x`` along ``d``: the
    index has extent 1 there and ``x``'s extents elsewhere (the backward of ``gather``, one-hot targets)."""
    same = [getattr(a, "key", a) == getattr(b, "key", b) for a, b in zip(index.shape, x.shape)]
    return is_one(index.shape[d]) and all(ok for k, ok in enumerate(same) if k != d)


def _one_update_per_slice(L, x, d, index, value, combine):
    """Such a scatter as an element-wise select, ``x[.., j, ..]`` updated where ``j`` is the slice's index:
    it fuses with its base and its consumers instead of filling a buffer and updating it serially.  The
    index is read through a materialised ``arange`` so that an index out of range still fails its
    bounds guard (and the region reruns eagerly to raise PyTorch's error)."""
    positions = te.compute((x.shape[d],), lambda c: c, name=L.name("_positions"))
    positions.materialize = True
    dt = x.dtype

    def body(idx):
        at = tuple(te.cast(0, I64) if k == d else idx[k] for k in range(x.ndim))
        old, new = x[tuple(idx)], te.cast(value(at), dt)
        updated = new if combine == "assign" else (old + new if combine == "add" else old * new)
        return te.select(idx[d] == positions[(index[at],)], updated, old)

    return L.compute(x.shape, body)


def _identity(combine, dt):
    if combine == "add":
        return te.cast(0, dt)
    if combine == "mul":
        return te.cast(1, dt)
    if dt.is_float:
        return te.cast(-math.inf if combine == "max" else math.inf, dt)
    if dt.is_bool:
        return te.cast(combine == "min", dt)
    lim = 2 ** (dt.bits - 1)
    return te.cast(-lim if combine == "max" else lim - 1, dt)


@register(aten.scatter_reduce.two, faithful=True)
def _scatter_reduce(L, x, dim, index, src, reduce, *, include_self=True):
    x, d, index = _dim_args(x, dim, index)
    src = _tensor(src)
    dt = L.out_dtype()
    targets = _along(x, d, index)

    def update(*idx):
        return targets(idx), src[idx]

    def touched():  # which elements some update writes
        none = L.compute(x.shape, lambda idx: te.cast(False, te.bool_), suffix="_none", dtype=te.bool_)
        return _scatter(L, none, index.shape, lambda *idx: (targets(idx), True), "add", "_touched")

    if reduce == "mean":
        base = x if include_self else L.compute(x.shape, lambda idx: te.cast(0, dt), suffix="_zeros", dtype=dt)
        total = _scatter(L, base, index.shape, update, "add", "_sum")
        ones = L.compute(x.shape, lambda idx: te.cast(1 if include_self else 0, I64), suffix="_self", dtype=I64)
        count = _scatter(L, ones, index.shape, lambda *idx: (targets(idx), 1), "add", "_count")

        def mean(idx):  # untouched elements keep x (count 0 without self); integers round down, as PyTorch
            c = count[tuple(idx)]
            s = total[tuple(idx)]
            q = s / te.cast(c, dt) if dt.is_float else s // c
            return te.select(c == 0, x[tuple(idx)], te.cast(q, dt))

        return L.compute(x.shape, mean)
    combine = COMBINE.get(reduce)
    if combine is None:
        raise Unsupported(f"scatter_reduce reduce={reduce!r}")
    if include_self:
        return _scatter(L, x, index.shape, update, combine)
    # written elements start from the combine's identity instead of their own value
    hit = touched()
    ident = _identity(combine, dt)
    base = L.compute(x.shape, lambda idx: te.select(hit[tuple(idx)], ident, x[tuple(idx)]), suffix="_base", dtype=dt)
    return _scatter(L, base, index.shape, update, combine)


@register(aten.index_put.default, faithful=True)
def _index_put(L, x, indices, values, accumulate=False):
    x = _tensor(x)
    if any(isinstance(t, te.Tensor) and t.dtype.is_bool for t in indices):
        return masked_index_put(L, x, indices, values, accumulate)
    layout = _index_layout(L, x, indices, L.node.args[1])
    dt = L.out_dtype()
    if isinstance(values, te.Tensor) and any(_differ(v, s) for v, s in zip(values.shape[::-1], layout[3][::-1])):
        # the meta function lets values through that do not broadcast to the indexed shape; eager raises
        raise Unsupported("index_put values of a shape that does not broadcast (eager raises)")

    def update(*p):
        return index_source(x, layout, p), te.cast(load_bcast(values, p), dt)

    # duplicate indices: accumulate adds them all; otherwise the last write in row-major order wins, as on the CPU
    return _scatter(L, x, layout[3], update, "add" if accumulate else "assign")


def _differ(a, b) -> bool:
    """Whether sizes ``a`` (not 1) and ``b`` are constants that differ."""
    return isinstance(a, Const) and isinstance(b, Const) and a.value not in (1, b.value)


def _index_dim(L, x, dim, index, source, value, combine):
    """index_add/index_copy: ``source``'s slice ``i`` along ``dim`` goes to ``x``'s slice ``index[i]``
    (no wrapping: eager rejects negative indices)."""
    x, index, source = _tensor(x), _index_tensor(index), _tensor(source)
    if x.ndim == 0 or index.ndim != 1 or source.ndim != x.ndim:
        raise Unsupported("index_add/index_copy of 0-d tensors")
    if _empty(x) and not _empty(index):  # ATen's index_add returns an empty tensor of 2 or more dims unchecked
        raise Unsupported(f"index_add/index_copy {EMPTY_CHECKS}")
    d = dim + x.ndim if dim < 0 else dim

    def update(*idx):
        return tuple(index[idx[d]] if k == d else idx[k] for k in range(x.ndim)), value(source[idx])

    return _scatter(L, x, source.shape, update, combine)


@register(aten.index_add.default, faithful=True)
def _index_add(L, x, dim, index, source, *, alpha=1):
    a = scalar_arg(alpha, "alpha")
    return _index_dim(L, x, dim, index, source, (lambda v: v) if a == 1 else (lambda v: v * a), "add")


@register(aten.index_copy.default, faithful=True)
def _index_copy(L, x, dim, index, source):
    return _index_dim(L, x, dim, index, source, lambda v: v, "assign")


@register(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor, faithful=True)
def _index_fill(L, x, dim, index, value):
    """``x`` with the slices ``index`` (negative ones wrap, as in eager) along ``dim`` set to ``value``."""
    x, index = _tensor(x), _index_tensor(index)
    if index.ndim > 1:
        raise Unsupported("index_fill with a multi-dimensional index")
    d = dim + x.ndim if dim < 0 and x.ndim else dim
    if x.ndim == 0:
        raise Unsupported("index_fill of a 0-d tensor")
    if _empty(x) and not _empty(index):
        raise Unsupported(f"index_fill {EMPTY_CHECKS}")
    if isinstance(value, te.Tensor):
        if value.ndim:
            raise Unsupported("index_fill with a non-0-d value tensor")
        v = value[()]
    else:
        v = scalar_arg(value, "fill value")
    n = index.shape[0] if index.ndim else 1
    domain = tuple(n if k == d else x.shape[k] for k in range(x.ndim))

    def update(*idx):
        i = index[idx[d]] if index.ndim else index[()]
        return tuple(_wrap(i, x.shape[d]) if k == d else idx[k] for k in range(x.ndim)), v

    return _scatter(L, x, domain, update, "assign")


# index_fill decomposes into index_copy, and both into index_put, which wraps negative indices
UNDECOMPOSED.update({aten.index_add.default, aten.index_copy.default, aten.index_fill.int_Scalar,
                     aten.index_fill.int_Tensor})  # fmt: skip


def _unravel(f, dims):
    """Row-major indices of flat position ``f`` in a tensor of shape ``dims``."""
    out, rest = [], f
    for k in range(len(dims) - 1, -1, -1):
        out.append(rest % dims[k] if k else rest)
        rest = rest // dims[k]
    return tuple(reversed(out))


def _ravel(idx, dims):
    f = te.cast(0, I64)
    for i, s in zip(idx, dims):
        f = f * s + i
    return f


def _mask_count(L, mask, shape):
    """For every position of ``shape`` (row-major), the number of masked elements up to and including it."""
    n = te.cast(1, I64)
    for s in shape:
        n = n * s
    flat_mask = L.compute((n,), lambda f: te.cast(load_bcast(mask, _unravel(f[0], shape)), I64), "_flatmask", I64)
    return te.scan((n,), 0, lambda prev, f: prev + flat_mask[f], initial=te.cast(0, I64), dtype=I64,
                   name=L.name("_count"))  # fmt: skip


@register(aten.masked_scatter.default, faithful=True)
def _masked_scatter(L, x, mask, source):
    """``x`` with its masked elements, in row-major order, taken from ``source``'s elements in order:
    an element's source position is the number of masked elements before it (a scan of the mask)."""
    x, mask, source = _tensor(x), _tensor(mask), _tensor(source)
    if not mask.dtype.is_bool or source.ndim == 0:
        raise Unsupported("masked_scatter with a non-bool mask or a 0-d source")
    dt = L.out_dtype()
    shape = L.out_shape()
    count = _mask_count(L, mask, shape)

    def body(idx):
        k = count[_ravel(idx, shape)] - 1  # masked elements up to and including this one, minus one
        return te.select(load_bcast(mask, idx), te.cast(source[_unravel(k, source.shape)], dt),
                         te.cast(load_bcast(x, idx), dt))  # fmt: skip

    return L.compute(shape, body)


@register(aten.masked_scatter_backward.default)
def _masked_scatter_backward(L, grad, mask, sizes):
    """The source's gradient: the masked elements of ``grad``, in row-major order, at the source's first
    positions (zeros after them)."""
    grad, mask = _tensor(grad), _tensor(mask)
    if not mask.dtype.is_bool:
        raise Unsupported("masked_scatter_backward with a non-bool mask")
    dt = L.out_dtype()
    out = L.out_shape()
    count = _mask_count(L, mask, grad.shape)
    zeros = L.compute(out, lambda idx: te.cast(0, dt), "_zeros", dt)

    def update(*idx):
        k = count[_ravel(idx, grad.shape)] - 1
        return _unravel(k, out), grad[idx], load_bcast(mask, idx)

    return te.scatter(zeros, grad.shape, update, combine="assign", name=L.name())
