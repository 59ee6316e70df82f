"""Data-dependent indexing (index_select, gather, index.Tensor, masked index_put) and the injective
scatters (select_scatter, slice_scatter, diagonal_scatter).

A load at an index read from a tensor is guarded by the core: an index outside
the tensor reads nothing and the call raises ``IndexError``, as eager PyTorch
does for ``x[idx]`` and ``index_select`` (``gather`` raises RuntimeError in eager)."""

from __future__ import annotations

import operator

import torch

from tailjit import te
from tailjit.frontend.lower.lowering import SCALAR_OPS, UNDECOMPOSED, clamp_index, load_bcast, register
from tailjit.frontend.lower.reinplace import unwrap
from tailjit.frontend.lower.symbolic import Unsupported
from tailjit.te.expr import Const

aten = torch.ops.aten
I64 = te.int64


#: Why an op on an empty tensor stays an ATen call: a loop over its empty result reads no index, where ATen
#: checks (or skips) them by rules of its own per op.
EMPTY_CHECKS = "on an empty tensor, ATen's index checks"


def _tensor(x, what="operand"):
    if not isinstance(x, te.Tensor):
        raise Unsupported(f"{what} is not a tensor")
    return x


def _norm(d, nd):
    return d + nd if d < 0 else d


def _index_tensor(t):
    t = _tensor(t, "index")
    if not t.dtype.is_int:
        raise Unsupported(f"index of dtype {t.dtype} (boolean masks give a data-dependent shape)")
    return t


def _wrap(v, n):
    """A negative index counts from the end, as in PyTorch's advanced indexing."""
    return te.select(v < 0, v + n, v)


@register(aten.index_select.default, faithful=True)
def _index_select(L, x, dim, index):
    x, index = _tensor(x), _index_tensor(index)
    if x.ndim == 0 or index.ndim > 1:
        raise Unsupported("index_select of a 0-d tensor or with a multi-dimensional index")
    d = _norm(dim, x.ndim)
    if x.ndim > 1 and _empty(x) and not _empty(index):
        # ATen checks each index against an empty tensor's dimension (a RuntimeError), where a loop over
        # the empty result reads none
        raise Unsupported(f"index_select {EMPTY_CHECKS}")

    def body(idx):
        # no wrapping: PyTorch's index_select rejects negative indices (IndexError)
        v = index[idx[d]] if index.ndim else index[()]
        return x[tuple(v if k == d else idx[k] for k in range(x.ndim))]

    return L.compute(L.out_shape(), body)


@register(aten.gather.default, faithful=True)
def _gather(L, x, dim, index, sparse_grad=False):
    x, index = _tensor(x), _index_tensor(index)
    if x.ndim == 0 or index.ndim != x.ndim:
        raise Unsupported("gather of a 0-d tensor")
    d = _norm(dim, x.ndim)

    def body(idx):
        return x[tuple(index[tuple(idx)] if k == d else idx[k] for k in range(x.ndim))]

    return L.compute(L.out_shape(), body)


def _index_layout(L, x, indices, nodes):
    """Advanced indexing of ``x`` by ``indices`` (index tensors or None per leading dimension):
    (index tensors by dimension, where the broadcast index dimensions go, their rank, the result shape).

    Adjacent index tensors put the broadcast dimensions in their place, separated ones put them first."""
    indices = list(indices)
    if len(indices) > x.ndim:
        raise Unsupported("too many indices")
    pos = [k for k, t in enumerate(indices) if t is not None]
    if not pos:
        raise Unsupported("index without index tensors")
    tensors = {k: _index_tensor(indices[k]) for k in pos}
    first = pos[0] if pos == list(range(pos[0], pos[-1] + 1)) else 0
    bshape = torch.broadcast_shapes(*(nodes[k].meta["val"].shape for k in pos))
    if any(_empty_dim(x.shape[k]) for k in pos) and not any(isinstance(s, int) and s == 0 for s in bshape):
        # ATen's rule: an index into a dimension of size 0 is out of bounds (IndexError) even where the
        # result is empty and a loop over it reads no index
        raise Unsupported(f"an index into a dimension of size 0 {EMPTY_CHECKS}")
    rest = [x.shape[k] for k in range(x.ndim) if k not in tensors]
    shape = tuple(rest[:first]) + tuple(L.size(s) for s in bshape) + tuple(rest[first:])
    return tensors, first, len(bshape), shape


def index_source(x, layout, p):
    """The index into ``x`` that result position ``p`` of an advanced indexing reads (negative indices wrap)."""
    tensors, first, nb, _ = layout
    bidx = tuple(p[first : first + nb])
    rest = iter(tuple(p[:first]) + tuple(p[first + nb :]))
    return tuple(_wrap(load_bcast(tensors[k], bidx), x.shape[k]) if k in tensors else next(rest) for k in range(x.ndim))


@register(aten.index.Tensor, faithful=True)
def _index(L, x, indices):
    x = _tensor(x)
    layout = _index_layout(L, x, indices, L.node.args[1])
    if len(layout[3]) != len(L.out_shape()):
        raise Unsupported("index result rank")
    return L.compute(L.out_shape(), lambda p: x[index_source(x, layout, p)])


def _empty_dim(d) -> bool:
    return isinstance(d, Const) and d.value == 0


def _empty(t) -> bool:
    return any(_empty_dim(d) for d in t.shape)


def _numel_one(v) -> bool:
    return all(isinstance(d, Const) and d.value == 1 for d in v.shape)


def masked_index_put(L, x, indices, values, accumulate=False):
    """Boolean-mask index_put with a single value (``x[mask] = v``): an element-wise select.
    (Several values take the masked elements' data-dependent count: not lowered.)"""
    if len(indices) != 1 or not isinstance(indices[0], te.Tensor) or not indices[0].dtype.is_bool:
        raise Unsupported("index_put mixing boolean and other indices")
    mask = indices[0]
    if not isinstance(values, te.Tensor) or not _numel_one(values):
        raise Unsupported("masked index_put with several values (data-dependent)")
    if mask.ndim > x.ndim:
        raise Unsupported("mask with more dimensions than the tensor")
    dt = L.out_dtype()

    def body(idx):
        v = te.cast(values[tuple(te.cast(0, I64) for _ in values.shape)], dt)
        old = x[tuple(idx)]
        new = old + v if accumulate else v
        return te.select(mask[tuple(idx[: mask.ndim])], te.cast(new, dt), old)

    return L.compute(L.out_shape(), body)


# their decompositions (a where over an arange) hide the write that _in_place turns into a buffer update
UNDECOMPOSED.update({aten.select_scatter.default, aten.slice_scatter.default})


@register(aten.select_scatter.default, faithful=True)
def _select_scatter(L, x, src, dim, index):
    x, src = _tensor(x), _tensor(src)
    d = _norm(dim, x.ndim)
    if not isinstance(index, int):
        raise Unsupported("symbolic select_scatter index")
    p = te.cast(index, I64) if index >= 0 else x.shape[d] + index
    dt = L.out_dtype()
    if _in_place(L, x):
        return _write_in_place(L, x)

    def body(idx):
        inner = tuple(idx[:d]) + tuple(idx[d + 1 :])
        return te.select(idx[d] == p, te.cast(src[inner], dt), x[tuple(idx)])

    return L.compute(L.out_shape(), body)


def _in_place(L, base) -> bool:
    """Whether to write ``x[t] = v`` (functionalised to a select/slice_scatter) as an update of ``base``'s
    buffer: when nothing else reads the base and it is computed in this region, the core's scatter reuses
    the buffer, so a Python loop's chain of writes (GAE's ``advantages[t] = ...``) costs one pass over what
    it writes instead of a copy of the whole tensor per iteration."""
    node = L.node.args[0]
    chain = _chain_views(L.node)
    return not base.is_placeholder and all(u is L.node or u in chain or _shape_only(u, node) for u in node.users)


def _chain_views(top) -> set:
    """The views of the base through which the scatter chain ``top`` tops writes (``out[:, 1::2, 1:] = v``:
    ``slice(out)`` and ``slice(slice(out))``), where they are read by the chain alone: each an inner scatter's
    base (read to be written back unchanged) and the next view's, each inner scatter read by its outer one
    alone.  ``_write_in_place`` writes through them, so they do not read the base's old elements."""
    views = set()
    scatters = _static_chain(top)[1]
    for outer, inner in zip(scatters, scatters[1:]):
        if set(inner.users) != {outer}:
            break
        views.add(inner.args[0])
    ok = set()
    for view in views:
        if all(u in views or (u.target in _SCATTERS and u.args[0] is view) for u in view.users):
            ok.add(view)
    return ok if ok == views else set()


_SCATTERS = (aten.slice_scatter.default, aten.select_scatter.default)


_VIEWS = (aten.select.int, aten.slice.Tensor)


def _write_in_place(L, x):
    """The scatter chain this node tops (``out[:, g::9, 1:, :-1] = v``: a slice_scatter of a slice_scatter of a
    slice_scatter of ``v``, each into the same view of its base) as one write of ``v`` into ``x``'s buffer
    through the composed views: one pass over ``v``, where scatter by scatter each level's part of the base
    would be made anew (ShiftNet's shift: 20 ms against eager's 0.4 ms)."""
    chain, scatters = _static_chain(L.node)
    shapes = [L.node.args[0].meta["val"]]
    for view, extra in chain[:-1]:
        shapes.append(view(shapes[-1], *extra))
    positions = [_position(view, extra, [L.size(n) for n in parent.shape])
                 for (view, extra), parent in zip(chain, shapes)]  # fmt: skip
    value, dt = _tensor(L.value(scatters[-1].args[1])), L.out_dtype()
    return te.scatter(x, value.shape, lambda *j: (_outer(j, positions), te.cast(value[j], dt)), combine="assign",
                      name=L.name())  # fmt: skip


def _static_chain(top) -> tuple[list, list]:
    """The views (op, arguments after self) from ``top``'s base down through which the scatter chain it tops
    writes, as far as their starts, steps and indices are static (the lowering checked the top one's), and
    the scatter node of each of those levels."""
    chain, _ = unwrap(top, top.args[0])
    chain = chain[: next((k for k, (_, extra) in enumerate(chain) if not all(_static(a) for a in extra)), len(chain))]
    scatters = [top]
    for _ in chain[1:]:
        scatters.append(scatters[-1].args[1])
    return chain, scatters


def _static(a) -> bool:
    return isinstance(a, (int, type(None)))


def _outer(j: tuple, positions: list) -> tuple:
    for position in reversed(positions):
        j = position(j)
    return j


def _position(view, extra: tuple, shape: list):
    """The index in a view's base of the element at index ``j`` of the view (``select`` or ``slice``)."""
    dim = extra[0] % len(shape) if extra[0] is not None else 0
    if view is aten.select.int:
        index = extra[1]
        p = te.cast(index, I64) if index >= 0 else shape[dim] + index
        return lambda j: j[:dim] + (p,) + j[dim:]
    start, step = extra[1] or 0, extra[3]
    n = shape[dim]
    first = te.cast(start, I64) if start >= 0 else te.maximum(n + start, 0)
    return lambda j: j[:dim] + (first + j[dim] * step,) + j[dim + 1 :]


def _shape_only(user, node) -> bool:
    """Whether ``user`` takes only ``node``'s shape: the destination of a functional ``copy`` (which
    returns the source broadcast to it), or a view whose users all do."""
    if user.target is aten.copy.default:
        return user.args[0] is node and user.args[1] is not node
    return user.target in _VIEWS and user.args[0] is node and all(_shape_only(u, user) for u in user.users)


@register(aten.slice_scatter.default, faithful=True)
def _slice_scatter(L, x, src, dim=0, start=None, end=None, step=1):
    x, src = _tensor(x), _tensor(src)
    d = _norm(dim, x.ndim)
    if not isinstance(step, int) or step < 1 or not isinstance(start, (int, type(None))):
        raise Unsupported("slice_scatter with a symbolic start or step")
    n = x.shape[d]
    start = start or 0
    # where the slice begins: a negative start counts from the end (clamped at 0); past the end, src is empty
    first = te.cast(start, I64) if start >= 0 else te.maximum(n + start, 0)
    count = src.shape[d]
    dt = L.out_dtype()
    if _empty(src):
        return L.compute(L.out_shape(), lambda idx: x[tuple(idx)])
    if _in_place(L, x):
        return _write_in_place(L, x)

    def body(idx):
        j = idx[d] - first
        cond = (j >= 0) & (j < count * step) if step == 1 else (j >= 0) & (j < count * step) & (j % step == 0)
        # clamped: the condition keeps the index inside src, which the bounds analysis cannot always see
        k = clamp_index(j if step == 1 else j // step, count)
        s = src[tuple(k if a == d else idx[a] for a in range(x.ndim))]
        return te.select(cond, te.cast(s, dt), x[tuple(idx)])

    return L.compute(L.out_shape(), body)


@register(aten.diagonal_scatter.default, faithful=True)
def _diagonal_scatter(L, x, src, offset=0, dim1=0, dim2=1):
    x, src = _tensor(x), _tensor(src)
    d1, d2 = _norm(dim1, x.ndim), _norm(dim2, x.ndim)
    if not isinstance(offset, int):
        raise Unsupported("symbolic diagonal_scatter offset")
    rest = [k for k in range(x.ndim) if k not in (d1, d2)]
    dt = L.out_dtype()
    if _empty(src):
        return L.compute(L.out_shape(), lambda idx: x[tuple(idx)])

    def body(idx):
        on = idx[d2] - idx[d1] == offset
        # position along the diagonal, clamped into src: the branch condition keeps it inside, but the
        # bounds analysis cannot see that through the two variables
        k = idx[d1] if offset >= 0 else idx[d2]
        k = clamp_index(k, src.shape[-1])
        s = src[tuple(idx[j] for j in rest) + (k,)]
        return te.select(on, te.cast(s, dt), x[tuple(idx)])

    return L.compute(L.out_shape(), body)


@register(aten.embedding.default, faithful=True)
def _embedding(L, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    weight, indices = _tensor(weight), _index_tensor(indices)
    if weight.ndim != 2:
        raise Unsupported("embedding of a non-2-d weight")

    def body(idx):  # no wrapping: a negative index is out of range, as in eager
        return weight[indices[tuple(idx[:-1])], idx[-1]]

    return L.compute(L.out_shape(), body)


@register(aten._local_scalar_dense.default)
def _item(L, x):
    """``x.item()`` (also what a 0-d tensor passed where a number is expected turns into): the element as a
    scalar expression, which the ops reading it treat as a Python number, as eager does."""
    if not isinstance(x, te.Tensor) or any(not (isinstance(d, Const) and d.value == 1) for d in x.shape):
        raise Unsupported("item() of a tensor that is not statically one element")
    return x[tuple(te.cast(0, te.int64) for _ in x.shape)]


SCALAR_OPS.add(aten._local_scalar_dense.default)

#: Python's arithmetic on a float read from data, exact in double precision as Python's (division and powers
#: stay on the host, which raises ZeroDivisionError or gives a complex number where Python does).
_FLOAT_ARITHMETIC = (operator.add, operator.sub, operator.mul, operator.neg)


@register(*_FLOAT_ARITHMETIC)
def _float_arithmetic(L, *args):
    """``1 - alpha`` on a float ``tailjit.jit`` passes as a tensor and the trace reads: the scalar expression, so
    the kernels that use it stay one (the host used to compute it between them)."""
    if not isinstance(L.node.meta.get("val"), torch.SymFloat):
        raise Unsupported("arithmetic on sizes runs on the host")
    return L.node.target(*(te.cast(a, te.float64) if isinstance(a, te.Expr) else float(a) for a in args))


SCALAR_OPS.update(_FLOAT_ARITHMETIC)
