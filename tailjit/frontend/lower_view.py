"""Views and data movement: view/reshape, permute/transpose, expand, slice, select, (un)squeeze, cat.

A view becomes a compute that reads its source at remapped indices; fusion
inlines it into its consumers, so no copy is made unless the result is a
region output (outputs are contiguous copies, see docs/frontend.md)."""

from __future__ import annotations

import sympy
import torch

from tailjit import te
from tailjit.frontend.lowering import is_one, load_bcast, register
from tailjit.frontend.symbolic import Unsupported, sym_expr
from tailjit.te.expr import Const

aten = torch.ops.aten
I64 = te.int64


def _zero():
    return te.cast(0, I64)


def _tensor(x):
    if not isinstance(x, te.Tensor):
        raise Unsupported("view of a non-tensor")
    return x


def _norm(d, nd):
    return d + nd if d < 0 else d


def _groups(src, out):
    """Split the dimensions of a reshape into groups of equal size products: [(src dims, out dims)].

    ``src``/``out`` are sympy sizes; None when no grouping is found (one group covers all)."""
    groups, i, j = [], 0, 0
    while i < len(src) or j < len(out):
        if i < len(src) and src[i] == 1:
            groups.append(([i], []))
            i += 1
            continue
        if j < len(out) and out[j] == 1:
            groups.append(([], [j]))
            j += 1
            continue
        if i >= len(src) or j >= len(out):
            return None
        gi, gj, pi, pj = [i], [j], src[i], out[j]
        i, j = i + 1, j + 1
        while sympy.simplify(pi - pj) != 0:
            if sympy.fraction(sympy.cancel(pi / pj))[1] == 1 and j < len(out):
                pj, gj = pj * out[j], gj + [j]
                j += 1
            elif i < len(src):
                pi, gi = pi * src[i], gi + [i]
                i += 1
            else:
                return None
        groups.append((gi, gj))
    return groups


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(L, x, size):
    x = _tensor(x)
    out = L.out_shape()
    src = x.shape
    try:
        groups = _groups([sym_expr(s) for s in L.node.args[0].meta["val"].shape], [sym_expr(s) for s in L.val().shape])
    except Exception:  # sympy cannot decide: one group
        groups = None
    if groups is None:
        groups = [(list(range(len(src))), list(range(len(out))))]

    def body(idx):
        pos = [None] * len(src)
        for gi, gj in groups:
            flat = None
            for j in gj:
                flat = idx[j] if flat is None else flat * out[j] + idx[j]
            for n, k in enumerate(gi):
                if is_one(src[k]) or flat is None:
                    pos[k] = _zero()
                    continue
                stride = None
                for s in src[k + 1 : gi[-1] + 1]:
                    stride = s if stride is None else stride * s
                q = flat if stride is None else flat // stride
                pos[k] = q if n == 0 else q % src[k]
        return x[tuple(pos)]

    return L.compute(out, body)


@register(aten.permute.default)
def _permute(L, x, dims):
    x = _tensor(x)
    perm = [_norm(d, x.ndim) for d in dims]
    inv = [perm.index(k) for k in range(x.ndim)]
    return L.compute(L.out_shape(), lambda idx: x[tuple(idx[inv[k]] for k in range(x.ndim))])


@register(aten.transpose.int)
def _transpose(L, x, d0, d1):
    x = _tensor(x)
    perm = list(range(x.ndim))
    if x.ndim:
        a, b = _norm(d0, x.ndim), _norm(d1, x.ndim)
        perm[a], perm[b] = perm[b], perm[a]
    return _permute(L, x, perm)


@register(aten.t.default)
def _t(L, x):
    x = _tensor(x)
    return _permute(L, x, list(range(x.ndim))[::-1])


@register(aten.expand.default)
def _expand(L, x, size, implicit=False):
    x = _tensor(x)
    return L.compute(L.out_shape(), lambda idx: load_bcast(x, idx))


@register(aten.slice.Tensor)
def _slice(L, x, dim=0, start=None, end=None, step=1):
    x = _tensor(x)
    d = _norm(dim, x.ndim)
    if not isinstance(step, int) or step < 1:
        raise Unsupported(f"slice step {step!r}")
    if start is None:
        start = 0
    if not isinstance(start, int):
        raise Unsupported("symbolic slice start")
    n = x.shape[d]
    # start beyond the end gives an empty result (no loads), so only negative starts need clamping
    first = te.cast(start, I64) if start >= 0 else te.maximum(n + start, 0)

    def body(idx):
        return x[tuple(first + idx[k] * step if k == d else idx[k] for k in range(x.ndim))]

    return L.compute(L.out_shape(), body)


@register(aten.select.int)
def _select(L, x, dim, index):
    x = _tensor(x)
    d = _norm(dim, x.ndim)
    if not isinstance(index, int):
        raise Unsupported("symbolic select index")
    pos = te.cast(index, I64) if index >= 0 else x.shape[d] + index

    def body(idx):
        return x[tuple(idx[:d]) + (pos,) + tuple(idx[d:])]

    return L.compute(L.out_shape(), body)


@register(aten.unsqueeze.default)
def _unsqueeze(L, x, dim):
    x = _tensor(x)
    d = _norm(dim, x.ndim + 1)
    return L.compute(L.out_shape(), lambda idx: x[tuple(idx[:d]) + tuple(idx[d + 1 :])])


@register(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def _squeeze(L, x, dim=None):
    x = _tensor(x)
    if dim is None:
        dims = list(range(x.ndim))
    else:
        dims = [dim] if isinstance(dim, int) else list(dim)
    gone = {_norm(d, x.ndim) for d in dims if x.ndim and is_one(x.shape[_norm(d, x.ndim)])}
    kept = [k for k in range(x.ndim) if k not in gone]
    if len(kept) != len(L.out_shape()):
        raise Unsupported("squeeze of a symbolic dimension")

    def body(idx):
        pos = dict(zip(kept, idx))
        return x[tuple(pos.get(k, _zero()) for k in range(x.ndim))]

    return L.compute(L.out_shape(), body)


@register(aten.cat.default)
def _cat(L, tensors, dim=0):
    out = L.out_shape()
    dt = L.out_dtype()
    parts = [_tensor(t) for t in tensors]
    parts = [t for t in parts if not (t.ndim == 1 and len(out) != 1)]  # legacy empty 1-d inputs are skipped
    if not parts or any(t.ndim != len(out) for t in parts):
        raise Unsupported("cat of tensors with different ranks")
    d = _norm(dim, len(out))
    offsets, off = [], 0  # Python ints while the sizes along dim are constants
    for t in parts:
        offsets.append(off)
        size = t.shape[d]
        off = off + size.value if isinstance(size, Const) and isinstance(off, int) else off + size

    def body(idx):
        def at(k):
            t, o = parts[k], offsets[k]
            if is_one(t.shape[d]):
                local = _zero()
            else:
                # the branch conditions bound idx[d], but the bounds analysis cannot carry that through a
                # fused compound index (a reshape of the cat), so the index is clamped into the part
                local = te.minimum(te.maximum(idx[d] - o, 0), t.shape[d] - 1)
            return te.cast(t[tuple(local if j == d else idx[j] for j in range(len(out)))], dt)

        last = len(parts) - 1
        e = at(last)
        if is_one(parts[last].shape[d]) and last > 0:  # never taken: idx[d] < the total size
            e = te.select(idx[d] == offsets[last], e, te.cast(0, dt))
        for k in range(last - 1, -1, -1):
            # a one-wide part is selected by equality, which fusion reads as covering idx[d] (stacked columns)
            cond = idx[d] == offsets[k] if is_one(parts[k].shape[d]) else idx[d] < offsets[k + 1]
            e = te.select(cond, at(k), e)
        return e

    return L.compute(out, body)
