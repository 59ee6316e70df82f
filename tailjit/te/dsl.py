"""The tensor-expression language's constructors: sizes, placeholders, computes, scatters, scans,
reductions and element-wise math (re-exported by :mod:`tailjit.te`, whose docstring describes the language).
Kept apart from the package's ``__init__`` so that ``te.autodiff``, which builds gradients with these
constructors and which the package re-exports, imports them without an import cycle."""

from __future__ import annotations

import inspect

from tailjit.te import dtypes
from tailjit.te.dtypes import int64
from tailjit.te.expr import (
    COMBINES,
    REDUCERS,
    Expr,
    IterVar,
    Load,
    Reduce,
    SizeVar,
    TEError,
    Tensor,
    Update,
    as_expr,
    as_size,
    binary,
    cast,
    fresh_name,
    select,
    unary,
)
from tailjit.te.primitives import PRIMITIVES, Primitive


def var(name: str) -> SizeVar:
    """A symbolic size, bound from input shapes when the built kernel is called."""
    return SizeVar(name)


def placeholder(shape, dtype="float32", name: str | None = None) -> Tensor:
    """An input tensor of the given shape (ints or size expressions) and dtype."""
    name = name or fresh_name("x")
    dims = tuple(as_size(s, f"placeholder {name!r} dimension {d}") for d, s in enumerate(shape))
    return Tensor(dims, dtypes.dtype(dtype), name)


#: Constants larger than this belong in an input: they are compiled into the C source.
MAX_CONSTANT = 4096


def constant(values, dtype=None, name: str | None = None) -> Tensor:
    """A small tensor of known values (a nested list, numpy array or torch tensor), compiled into
    the kernel as a static array: no argument at call time, and loads of it fuse like any other."""
    import numpy as np

    if hasattr(values, "detach"):  # a torch tensor
        values = values.detach().cpu().numpy()
    arr = np.asarray(values)
    dt = dtypes.dtype(dtype if dtype is not None else ("float32" if arr.dtype.kind == "f" else arr.dtype))
    if arr.size > MAX_CONSTANT:
        raise TEError(f"te.constant: {arr.size} values is too many to compile in (at most {MAX_CONSTANT}); "
                      "pass it as a placeholder input")  # fmt: skip
    name = name or fresh_name("c")
    t = Tensor(tuple(as_size(int(d), f"constant {name!r}") for d in arr.shape), dt, name)
    t.data = np.ascontiguousarray(arr.astype(dt.numpy))
    return t


def reduce_axis(extent, name: str | None = None) -> IterVar:
    """A reduction axis over ``range(extent)`` or, given ``(lo, hi)``, over ``range(lo, hi)``."""
    name = name or fresh_name("k")
    if isinstance(extent, tuple):
        if len(extent) != 2:
            raise TEError(f"reduce_axis {name!r}: give an extent or a (lo, hi) pair, got {extent!r}")
        lo, hi = (as_expr(v) for v in extent)
        if not (lo.dtype.is_int and hi.dtype.is_int):
            raise TEError(f"reduce_axis {name!r}: bounds must be integers")
        return IterVar(name, lo, binary("sub", hi, lo), "reduce")
    ext = as_expr(extent)
    if not ext.dtype.is_int:
        raise TEError(f"reduce_axis {name!r}: extent must be an integer, got {ext.dtype}")
    return IterVar(name, as_expr(0), ext, "reduce")


def compute(shape, fcompute, name: str | None = None) -> Tensor:
    """A tensor whose element at index ``(i, j, ...)`` is ``fcompute(i, j, ...)``."""
    name = name or fresh_name("t")
    dims = tuple(as_size(s, f"compute {name!r} dimension {d}") for d, s in enumerate(shape))
    params = _index_names(fcompute, len(dims), name)
    axes = tuple(IterVar(p, as_expr(0), d, "spatial") for p, d in zip(params, dims))
    body = as_expr(fcompute(*axes))
    _check_body(body, axes, name)
    return Tensor(dims, body.dtype, name, axes, body)


def stop_gradient(t: Tensor, name: str | None = None) -> Tensor:
    """``t``'s values, through which :func:`gradient` passes no gradient (JAX's ``stop_gradient``).

    For a value the result does not depend on mathematically, such as the row
    maximum that a softmax subtracts for stability: its exact gradient is zero,
    but the derived expression would sum terms that cancel, with a reduction per
    row and a rounding error where they do not quite."""
    if not isinstance(t, Tensor):
        raise TEError(f"te.stop_gradient takes a te tensor, got {t!r}")
    out = compute(t.shape, lambda *i: t[i], name=name or f"{t.name}_nograd")
    out.stop_gradient = True
    return out


def _index_names(fcompute, ndim: int, name: str, what: str = "compute", lead: int = 0) -> list[str]:
    """Names of the ``ndim`` index parameters of ``fcompute``, after ``lead`` other ones."""
    default = [f"i{d}" for d in range(ndim)]
    try:
        params = list(inspect.signature(fcompute).parameters.values())
    except (TypeError, ValueError):
        return default
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return default
    # parameters with defaults (lambda i, c=c: ...) are closures, not indices
    params = [p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(params) != ndim + lead:
        fn = {"compute": "fcompute", "scatter": "fupdate", "scan": "fupdate"}[what]
        takes = f"{fn} takes {len(params)} parameter(s)"
        need = f"{ndim} index(es)" if not lead else f"prev and {ndim} index(es)"
        raise TEError(f"{what} {name!r}: {'the domain' if what == 'scatter' else 'shape'} has {ndim} "
                      f"dimension(s), so {fn} must take {need}; {takes}")  # fmt: skip
    return [p.name for p in params[lead:]]


def _check_body(body: Expr, axes: tuple[IterVar, ...], name: str, what: str = "compute") -> None:
    """Every index variable is one of ``axes`` or a reduce axis inside its reduction."""
    own = {id(a) for a in axes}

    # iterative, each (node, bound axes) once: bodies can be deep (a traced loop) and share sub-trees
    seen: set[tuple[int, frozenset[int]]] = set()
    stack: list[tuple[Expr, frozenset[int]]] = [(body, frozenset())]
    while stack:
        e, bound = stack.pop()
        if (id(e), bound) in seen:
            continue
        seen.add((id(e), bound))
        if isinstance(e, IterVar):
            if e.kind == "spatial" and id(e) not in own:
                raise TEError(f"{what} {name!r}: index variable {e.name!r} belongs to another compute")
            if e.kind == "reduce" and id(e) not in bound:
                raise TEError(f"{what} {name!r}: reduction axis {e.name!r} is used outside a reduction over it")
        elif isinstance(e, Reduce):
            for ax in e.axes:
                if id(ax) in bound:
                    raise TEError(f"{what} {name!r}: reduction axis {ax.name!r} is reduced twice")
                stack += [(ax.lo, bound), (ax.extent, bound)]
            stack.append((e.body, bound | {id(ax) for ax in e.axes}))
        else:
            stack.extend((c, bound) for c in e.children())


def scatter(base: Tensor, domain, fupdate, combine: str = "add", name: str | None = None) -> Tensor:
    """``base`` with accumulating updates: a tensor of ``base``'s shape and dtype.

    ``fupdate(*idx)`` over the index variables of ``domain`` (a shape: ints or
    size expressions) returns ``(targets, value)`` or ``(targets, value, cond)``:
    ``targets`` has one integer index expression per result dimension (a bare
    expression for a 1-d result), ``value`` is converted to the result dtype as
    a store would, and ``cond`` (bool) skips the update where it is false
    (then neither the targets nor the value are evaluated).

    The result is ``base`` copied, then, for every domain point in row-major
    order where ``cond`` holds, ``out[targets] = combine(out[targets], value)``
    with ``combine`` one of ``"add"`` (logical or on bool), ``"mul"`` (and on
    bool), ``"max"``, ``"min"`` (both propagate NaN, like ``te.maximum``) or
    ``"assign"`` (the last write in row-major order wins).  The updates run
    sequentially, so duplicate targets behave exactly like PyTorch's CPU
    ``scatter_add``/``index_put(accumulate=True)``.  A target outside the
    result (negative included: wrap negative indices before) raises
    ``IndexError`` when the kernel is called, and nothing is written there::

        hist = te.scatter(zeros, (n,), lambda i: ((idx[i],), 1))           # bincount
        out = te.scatter(x, (k, m), lambda i, j: ((idx[i], j), src[i, j]))  # index_add along dim 0
    """
    name = name or fresh_name("scatter")
    if not isinstance(base, Tensor):
        raise TEError(f"scatter {name!r}: base must be a te.Tensor (a placeholder or compute), got {base!r}")
    if combine not in COMBINES:
        raise TEError(f"scatter {name!r}: combine must be one of {', '.join(COMBINES)}; got {combine!r}")
    if isinstance(domain, (int, Expr)):
        domain = (domain,)
    dims = tuple(as_size(s, f"scatter {name!r} domain dimension {d}") for d, s in enumerate(domain))
    params = _index_names(fupdate, len(dims), name, "scatter")
    dom = tuple(IterVar(p, as_expr(0), d, "spatial") for p, d in zip(params, dims))
    res = fupdate(*dom)
    if not isinstance(res, tuple) or len(res) not in (2, 3):
        raise TEError(f"scatter {name!r}: fupdate must return (targets, value) or (targets, value, cond), got {res!r}")
    targets, value = res[0], res[1]
    if not isinstance(targets, (tuple, list)):
        targets = (targets,)
    if len(targets) != base.ndim:
        raise TEError(
            f"scatter {name!r}: the result {base.name!r} has {base.ndim} dimension(s) but fupdate gave "
            f"{len(targets)} target index(es)"
        )
    tgts = []
    for d, tg in enumerate(targets):
        e = as_expr(tg)
        if not e.dtype.is_int:
            raise TypeError(f"scatter {name!r}: target index {d} must be an integer expression, got {e.dtype}")
        tgts.append(cast(e, int64))
    val = cast(as_expr(value), base.dtype)
    cond = None
    if len(res) == 3:
        cond = as_expr(res[2])
        if not cond.dtype.is_bool:
            raise TypeError(f"scatter {name!r}: cond must be a bool expression, got {cond.dtype}; compare it first")
    update = Update(dom, tuple(tgts), val, cond, combine)
    for e in update.exprs():
        _check_body(e, dom, name, "scatter")
    axes = tuple(IterVar(f"i{d}", as_expr(0), s, "spatial") for d, s in enumerate(base.shape))
    out = Tensor(base.shape, base.dtype, name, axes, base[axes])
    out.update = update
    return out


def scan(shape, axis: int, fupdate, initial=0, dtype=None, reverse: bool = False, name: str | None = None) -> Tensor:
    """A sequential recurrence along ``axis``: ``out[idx] = fupdate(prev, *idx)``.

    ``prev`` stands for ``out`` at the previous position along ``axis``
    (``idx[axis] - 1``; ``idx[axis] + 1`` when ``reverse``); at the first
    position (0, or the last one when ``reverse``) it is ``initial``: a scalar,
    or a callable of the index tuple giving an expression (evaluated at that
    first position, e.g. a bootstrap value ``lambda b, t: v_last[b]``).

    The state (and result) dtype is ``dtype`` if given, else ``initial``'s,
    where Python scalars take their default type: ``0`` gives int64, ``0.0``
    float32, ``True`` bool.  ``fupdate``'s result and ``initial`` are converted
    to it.  The ``axis`` loop always runs in order; the other axes may run in
    parallel or vectorised::

        csum = te.scan(x.shape, 1, lambda prev, i, j: prev + x[i, j], dtype=x.dtype)
        ret = te.scan((t, b), 0, lambda prev, i, j: r[i, j] + 0.99 * (1 - done[i, j]) * prev,
                      initial=0.0, reverse=True)  # discounted returns
    """
    name = name or fresh_name("scan")
    dims = tuple(as_size(s, f"scan {name!r} dimension {d}") for d, s in enumerate(shape))
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TEError(f"scan {name!r}: axis must be an int, got {axis!r}")
    if not -len(dims) <= axis < len(dims):
        raise TEError(f"scan {name!r}: axis {axis} is out of range for {len(dims)} dimension(s)")
    axis %= len(dims)
    params = _index_names(fupdate, len(dims), name, "scan", lead=1)
    axes = tuple(IterVar(p, as_expr(0), d, "spatial") for p, d in zip(params, dims))
    init = as_expr(initial(*axes) if callable(initial) else initial)
    _check_body(init, axes, name, "scan")
    dt = dtypes.dtype(dtype) if dtype is not None else init.dtype  # a weak scalar's dtype is its default one
    out = Tensor(dims, dt, name, axes)
    ax = axes[axis]
    # not at the first position: then prev is the neighbour, which the analysis proves in range
    later = binary("lt", binary("add", ax, 1), dims[axis]) if reverse else binary("gt", ax, 0)
    step = binary("add", ax, 1) if reverse else binary("sub", ax, 1)
    prev = select(later, Load(out, tuple(step if a is ax else a for a in axes)), cast(init, dt))
    body = cast(as_expr(fupdate(prev, *axes)), dt)
    _check_body(body, axes, name, "scan")
    out.body, out.scan_axis, out.reverse = body, axis, bool(reverse)
    return out


def _reducer(op: str):
    def reduce(expr, axis) -> Reduce:
        axes = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
        if not axes:
            raise TEError(f"te.{op}: give at least one reduce axis")
        for ax in axes:
            if not (isinstance(ax, IterVar) and ax.kind == "reduce"):
                raise TEError(f"te.{op}: axis must come from te.reduce_axis, got {ax!r}")
        if len({id(a) for a in axes}) != len(axes):
            raise TEError(f"te.{op}: an axis is listed twice")
        if op in ("argmax", "argmin") and expr is not None and as_expr(expr).dtype.is_bool:
            expr = cast(expr, int64)
        return Reduce(op, as_expr(expr), axes)

    reduce.__name__ = op
    reduce.__doc__ = f"The {op} of ``expr`` over the reduce axis (or list of axes) ``axis``."
    return reduce


sum, prod, max, min, argmax, argmin = (_reducer(op) for op in REDUCERS)  # noqa: A001


def _function(p: Primitive):
    """The ``te.<name>`` function of the primitive ``p``."""
    if p.arity == 1:

        def fn(x) -> Expr:
            return unary(p.name, x)
    else:

        def fn(a, b) -> Expr:
            return binary(p.name, a, b)

    fn.__name__, fn.__qualname__, fn.__doc__ = p.name, p.name, p.doc
    return fn


#: The element-wise math functions (``te.exp``, ``te.maximum``, ...): one per primitive that is not written
#: as a Python operator, made from its entry in ``te.primitives``.
FUNCTIONS = {p.name: _function(p) for p in PRIMITIVES.values() if p.doc is not None}
globals().update(FUNCTIONS)


def isnan(x) -> Expr:
    """Element-wise isnan, with PyTorch's semantics."""
    return unary("isnan", x)


def isinf(x) -> Expr:
    """Element-wise isinf, with PyTorch's semantics."""
    return unary("isinf", x)
