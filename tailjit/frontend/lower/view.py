"""Views and data movement: view/reshape, permute/transpose, expand, slice, select, (un)squeeze, cat, flip,
split, repeat, constant_pad_nd, diagonal, unfold, as_strided.

A view becomes a compute that reads its source at remapped indices; fusion
inlines it into its consumers, so no copy is made unless the result is a
region output (outputs are contiguous copies, see docs/frontend.md)."""

from __future__ import annotations

import math
import operator

import sympy
import torch

from tailjit import te
from tailjit.frontend.lower.lowering import UNDECOMPOSED, clamp_index, is_one, load_bcast, register, scalar_arg
from tailjit.frontend.lower.symbolic import Unsupported, sym_expr
from tailjit.frontend.lower.values import node_storage
from tailjit.te.expr import Const

aten = torch.ops.aten
I64 = te.int64


def _zero():
    return te.cast(0, I64)


def _tensor(x):
    if not isinstance(x, te.Tensor):
        raise Unsupported("view of a non-tensor")
    return x


def _const(e):
    return e.value if isinstance(e, Const) else None


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


RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _reshape_groups(node) -> tuple[list | None, list | None]:
    """The source sizes of the reshape ``node`` and its groups of dimensions (``_groups``); None for the
    groups when sympy cannot decide (one group covers all)."""
    try:
        src = [sym_expr(s) for s in node.args[0].meta["val"].shape]
        return src, _groups(src, [sym_expr(s) for s in node.meta["val"].shape])
    except Exception:  # noqa: BLE001 - sympy cannot decide: one group
        return None, None


def merges_dims(node) -> bool:
    """Whether the reshape ``node`` merges source dimensions (two of size other than 1 into one group): its
    lowering then indexes the source by quotients and remainders of the merged index."""
    src, groups = _reshape_groups(node)
    return groups is None or any(sum(1 for k in gi if src[k] != 1) > 1 for gi, _ in groups)


@register(aten.view.default, aten._unsafe_view.default, faithful=True)
@register(aten.reshape.default)
def _view(L, x, size):
    x = _tensor(x)
    out = L.out_shape()
    src = x.shape
    _, groups = _reshape_groups(L.node)
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


@register(aten.permute.default, faithful=True)
def _permute(L, x, dims):
    x = _tensor(x)
    perm = [_norm(d, x.ndim) for d in dims]
    inv = [perm.index(k) for k in range(x.ndim)]
    return L.compute(L.out_shape(), lambda idx: x[tuple(idx[inv[k]] for k in range(x.ndim))])


@register(aten.transpose.int, faithful=True)
def _transpose(L, x, d0, d1):
    x = _tensor(x)
    perm = list(range(x.ndim))
    if x.ndim:
        a, b = _norm(d0, x.ndim), _norm(d1, x.ndim)
        perm[a], perm[b] = perm[b], perm[a]
    return _permute(L, x, perm)


@register(aten.t.default, faithful=True)
def _t(L, x):
    x = _tensor(x)
    return _permute(L, x, list(range(x.ndim))[::-1])


@register(aten.expand.default, faithful=True)
def _expand(L, x, size, implicit=False):
    x = _tensor(x)
    return L.compute(L.out_shape(), lambda idx: load_bcast(x, idx))


@register(aten.slice.Tensor, faithful=True)
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


@register(aten.select.int, faithful=True)
def _select(L, x, dim, index):
    x = _tensor(x)
    d = _norm(dim, x.ndim)
    if not isinstance(index, int):
        raise Unsupported("symbolic select index")
    pos = te.cast(index, I64) if index >= 0 else x.shape[d] + index

    def body(idx):
        return x[tuple(idx[:d]) + (pos,) + tuple(idx[d:])]

    return L.compute(L.out_shape(), body)


@register(aten.unsqueeze.default, faithful=True)
def _unsqueeze(L, x, dim):
    x = _tensor(x)
    d = _norm(dim, x.ndim + 1)
    return L.compute(L.out_shape(), lambda idx: x[tuple(idx[:d]) + tuple(idx[d + 1 :])])


@register(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, faithful=True)
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


@register(aten.cat.default, faithful=True)
def _cat(L, tensors, dim=0):
    out = L.out_shape()
    dt = L.out_dtype()
    parts = [_tensor(t) for t in tensors]
    parts = [t for t in parts if not (t.ndim == 1 and len(out) != 1)]  # legacy empty 1-d inputs are skipped
    d = _norm(dim, len(out))
    # parts without rows along dim contribute nothing (and could not be loaded from)
    parts = [t for t in parts if not (t.ndim == len(out) and _const(t.shape[d]) == 0)] or parts[:1]
    if not parts or any(t.ndim != len(out) for t in parts):
        raise Unsupported("cat of tensors with different ranks")
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
                local = clamp_index(idx[d] - o, t.shape[d])
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


@register(aten.flip.default, faithful=True)
def _flip(L, x, dims):
    x = _tensor(x)
    flipped = {_norm(d, x.ndim) for d in dims}

    def body(idx):
        return x[tuple(x.shape[k] - 1 - idx[k] if k in flipped else idx[k] for k in range(x.ndim))]

    return L.compute(L.out_shape(), body)


def _offsets(L, sizes):
    """Running offsets of parts with ``sizes`` (Python ints while they are constants)."""
    out, off = [], 0
    for s in sizes:
        out.append(off)
        s = L.size(s)
        off = off + s.value if isinstance(s, Const) and isinstance(off, int) else off + s
    return out


@register(aten.split_with_sizes.default, faithful=True)
def _split_with_sizes(L, x, split_sizes, dim=0):
    x = _tensor(x)
    d = _norm(dim, x.ndim)
    parts = []
    for k, off in enumerate(_offsets(L, split_sizes)):

        def body(idx, off=off):
            return x[tuple(idx[j] + off if j == d else idx[j] for j in range(x.ndim))]

        parts.append(L.compute(L.out_shape(k), body, suffix=f"_{k}", dtype=x.dtype))
    return tuple(parts)


@register(aten.split.Tensor, faithful=True)
def _split(L, x, split_size, dim=0):
    x = _tensor(x)
    sizes = [L.val(k).shape[_norm(dim, x.ndim)] for k in range(len(L.node.meta["val"]))]
    return _split_with_sizes(L, x, sizes, dim)


@register(aten.repeat.default, faithful=True)
def _repeat(L, x, repeats):
    x = _tensor(x)
    out = L.out_shape()
    off = len(out) - x.ndim

    def body(idx):
        # x is aligned with the trailing dimensions; each is tiled
        return x[tuple(_zero() if is_one(x.shape[k]) else idx[off + k] % x.shape[k] for k in range(x.ndim))]

    return L.compute(out, body)


@register(aten.constant_pad_nd.default, faithful=True)
def _constant_pad_nd(L, x, pad, value=0):
    x = _tensor(x)
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise Unsupported(f"pad {pad!r}")
    value = scalar_arg(value, "pad value")
    if not all(isinstance(v, int) for v in pad):
        raise Unsupported("symbolic pad")
    lo = {x.ndim - 1 - k: pad[2 * k] for k in range(len(pad) // 2)}
    dt = L.out_dtype()

    if any(isinstance(d, Const) and d.value == 0 for d in x.shape):  # nothing to copy: all padding
        return L.compute(L.out_shape(), lambda idx: te.cast(value, dt))

    def body(idx):
        src, inside = [], None
        for k in range(x.ndim):
            if k not in lo:
                src.append(idx[k])
                continue
            j = x.ndim - 1 - k
            p_lo, p_hi = pad[2 * j], pad[2 * j + 1]
            i = idx[k] - p_lo
            # a cropping (negative) pad needs no check on its side: the output extent keeps i inside
            conds = ([i >= 0] if p_lo > 0 else []) + ([i < x.shape[k]] if p_hi > 0 else [])
            for c in conds:
                inside = c if inside is None else inside & c
            # clamped as well: the condition bounds i, but the bounds analysis cannot carry that through a
            # fused compound index (a reshape of the padded tensor)
            src.append(clamp_index(i, x.shape[k]) if conds else i)
        if inside is None:
            return x[tuple(src)]
        return te.select(inside, x[tuple(src)], te.cast(value, dt))

    return L.compute(L.out_shape(), body)


def _edge_pad(fold):
    """A lowering of a padding whose element at ``j`` before or after an edge of ``n`` elements is the input's
    at ``fold(j, n)``: no data is added, so the padding fuses into what reads it as index arithmetic (a
    blur's convolution), where the decomposition gathered through an index tensor with a bounds check."""

    def lower(L, x, padding, shape=None):
        x = _tensor(x)
        if len(padding) % 2 or len(padding) // 2 > x.ndim or not all(isinstance(v, int) for v in padding):
            raise Unsupported(f"pad {padding!r}")
        lo = {x.ndim - 1 - k: padding[2 * k] for k in range(len(padding) // 2)}

        def body(idx):  # (clamped too: the bounds analysis does not see a fold's range)
            return x[tuple(clamp_index(fold(i - lo[k], x.shape[k]), x.shape[k]) if k in lo else i
                           for k, i in enumerate(idx))]  # fmt: skip

        return L.compute(L.out_shape() if shape is None else shape, body, suffix="" if shape is None else "_pad")

    return lower


# Selects on ``j``, not ``abs`` or a clamp: codegen cuts the innermost loop where a select on its index changes
# truth, and the loads of the middle piece are then contiguous.
def _reflect(j, n):  # ... 2 1 | 0 1 2 ... n-1 | n-2 n-3 ...
    return te.select(j < 0, -j, te.select(j >= n, 2 * (n - 1) - j, j))


def _replicate(j, n):  # 0 0 | 0 1 2 ... n-1 | n-1 n-1
    return te.select(j < 0, te.cast(0, j.dtype), te.select(j >= n, n - 1, j))


# Their expression gradients match eager's, but a padding's is a serial scatter: training is faster through
# AOTAutograd's backward graph, which lowers the padding's backward apart from the rest.
register(aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default,
         faithful=False)(_edge_pad(_reflect))  # fmt: skip
_replication_pad = register(aten.replication_pad1d.default, aten.replication_pad2d.default,
                            aten.replication_pad3d.default, faithful=False)(_edge_pad(_replicate))  # fmt: skip


@register(aten.replication_pad1d_backward.default, aten.replication_pad2d_backward.default,
          aten.replication_pad3d_backward.default)  # fmt: skip
def _replication_pad_backward(L, grad, x, padding):
    """AOTAutograd's backward of a replication padding (no decomposition): ``te.gradient`` of its expression,
    the edge elements summing the gradient of their copies."""
    return te.gradient(_replication_pad(L, x, padding, grad.shape), [x], head=grad)[0]


UNDECOMPOSED.update({
    aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default,
    aten.replication_pad1d.default, aten.replication_pad2d.default, aten.replication_pad3d.default,
})  # fmt: skip


@register(aten.diagonal.default, faithful=True)
def _diagonal(L, x, offset=0, dim1=0, dim2=1):
    x = _tensor(x)
    d1, d2 = _norm(dim1, x.ndim), _norm(dim2, x.ndim)
    if not isinstance(offset, int):
        raise Unsupported("symbolic diagonal offset")
    rest = [k for k in range(x.ndim) if k not in (d1, d2)]
    r1, r2 = max(-offset, 0), max(offset, 0)

    def body(idx):
        pos = dict(zip(rest, idx))
        k = idx[-1]
        pos[d1], pos[d2] = k + r1, k + r2
        return x[tuple(pos[j] for j in range(x.ndim))]

    return L.compute(L.out_shape(), body)


@register(aten.unfold.default, faithful=True)
def _unfold(L, x, dimension, size, step):
    x = _tensor(x)
    d = _norm(dimension, max(x.ndim, 1))
    if not isinstance(step, int) or not isinstance(size, int):
        raise Unsupported("symbolic unfold size/step")

    def body(idx):
        if x.ndim == 0:
            return x[()]
        return x[tuple(idx[k] * step + idx[-1] if k == d else idx[k] for k in range(x.ndim))]

    return L.compute(L.out_shape(), body)


def _dense(sizes, strides) -> bool:
    """Whether dimensions (ordered by decreasing stride) tile their storage with no gap or overlap."""
    expected = 1
    for n, st in zip(reversed(sizes), reversed(strides)):
        if n and st != expected:
            return 0 in sizes
        expected *= n
    return True


def _storage_base(node):
    """The node that created ``node``'s storage: up the chain of views (the inputs sharing the storage)."""
    st = node_storage(node)
    while True:
        parents = list(node.all_input_nodes)
        if node.target is operator.getitem:  # an element of split & co: a view of the op's input
            parents = [a for p in parents for a in p.all_input_nodes]
        same = [p for p in parents if node_storage(p) == st]
        if not same:
            return node
        node = same[0]


@register(aten.as_strided.default)
def _as_strided(L, x, size, stride, storage_offset=None):
    """``as_strided`` reads the storage of its input, which a view shares with its base: the view's
    storage positions are unravelled into the indices of the node that created the storage, whose (fake)
    layout must be dense.  The positions must stay inside that base's elements."""
    _tensor(x)
    base_node = _storage_base(L.node.args[0])
    if base_node.op == "placeholder":  # a graph input's storage offset is not guarded by Dynamo
        raise Unsupported("as_strided of (a view of) a graph input")
    v = base_node.meta["val"]
    sizes, strides = list(v.shape), list(v.stride())
    if not all(isinstance(s, int) for s in sizes + strides + list(size) + list(stride)) or not isinstance(
        storage_offset or 0, int
    ):
        raise Unsupported("symbolic as_strided")
    # the base's dimensions from the largest stride to the smallest (size-1 dimensions are always index 0)
    order = sorted((k for k in range(len(sizes)) if sizes[k] != 1), key=lambda k: -strides[k])
    if not _dense([sizes[k] for k in order], [strides[k] for k in order]):
        raise Unsupported("as_strided over a storage its creator does not cover densely")
    first = L.node.args[0].meta["val"].storage_offset() if storage_offset is None else storage_offset
    offset = first - v.storage_offset()
    lo = offset + sum(min(0, (n - 1) * s) for n, s in zip(size, stride) if n)
    hi = offset + sum(max(0, (n - 1) * s) for n, s in zip(size, stride) if n)
    if math.prod(size) and (lo < 0 or hi >= math.prod(sizes)):
        raise Unsupported("as_strided reaches outside the storage's elements")
    base = _tensor(L.value(base_node))

    def body(idx):
        flat = te.cast(offset, I64)
        for i, s in zip(idx, stride):
            flat = flat + i * s
        pos = [_zero()] * base.ndim
        for k in order:
            q = flat // strides[k] if strides[k] != 1 else flat
            pos[k] = q % sizes[k] if k != order[0] else q
        return base[tuple(pos)]

    return L.compute(L.out_shape(), body)
