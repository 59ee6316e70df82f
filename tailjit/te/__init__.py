"""tailjit's tensor-expression language.

Define an operator as computes over symbolic sizes, then compile it with
:func:`tailjit.build`::

    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    k = te.reduce_axis(m, name="k")
    row_max = te.compute((n,), lambda i: te.max(x[i, k], axis=k), name="row_max")
    y = te.compute((n, m), lambda i, j: te.exp(x[i, j] - row_max[i]), name="y")

Semantics follow PyTorch: type promotion (Python scalars are weak), ``//``
and ``%`` round towards negative infinity, ``/`` is true division, ``max``
and ``min`` propagate NaN, ``argmax``/``argmin`` return the first extreme
position and treat NaN as the extreme.  A reduction over an empty range gives
its identity (0, 1, -inf/+inf or the integer limits).
"""

from __future__ import annotations

import inspect

from tailjit.te import dtypes
from tailjit.te.dtypes import DType, bool_, float32, float64, int32, int64
from tailjit.te.expr import (
    REDUCERS,
    Expr,
    IterVar,
    Reduce,
    SizeVar,
    TEError,
    Tensor,
    as_expr,
    as_size,
    binary,
    cast,
    fresh_name,
    select,
    unary,
)

__all__ = [
    "DType", "Expr", "IterVar", "SizeVar", "TEError", "Tensor",
    "bool_", "float32", "float64", "int32", "int64",
    "var", "placeholder", "compute", "reduce_axis", "select", "cast",
    "sum", "prod", "max", "min", "argmax", "argmin",
    "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "sigmoid", "erf",
    "abs", "floor", "ceil", "round", "trunc", "pow", "minimum", "maximum", "atan2", "isnan", "isinf",
    "gradient",
]  # fmt: skip


def var(name: str) -> SizeVar:
    """A symbolic size, bound from input shapes when the built kernel is called."""
    return SizeVar(name)


def placeholder(shape, dtype="float32", name: str | None = None) -> Tensor:
    """An input tensor of the given shape (ints or size expressions) and dtype."""
    name = name or fresh_name("x")
    dims = tuple(as_size(s, f"placeholder {name!r} dimension {d}") for d, s in enumerate(shape))
    return Tensor(dims, dtypes.dtype(dtype), name)


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


def _index_names(fcompute, ndim: int, name: str) -> list[str]:
    try:
        params = list(inspect.signature(fcompute).parameters.values())
    except (TypeError, ValueError):
        return [f"i{d}" for d in range(ndim)]
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return [f"i{d}" for d in range(ndim)]
    # parameters with defaults (lambda i, c=c: ...) are closures, not indices
    params = [p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(params) != ndim:
        raise TEError(f"compute {name!r}: shape has {ndim} dimension(s) but fcompute takes {len(params)} index(es)")
    return [p.name for p in params]


def _check_body(body: Expr, axes: tuple[IterVar, ...], name: str) -> None:
    """Every index variable is one of ``axes`` or a reduce axis inside its reduction."""
    own = {id(a) for a in axes}

    def visit(e: Expr, bound: frozenset[int]) -> None:
        if isinstance(e, IterVar):
            if e.kind == "spatial" and id(e) not in own:
                raise TEError(f"compute {name!r}: index variable {e.name!r} belongs to another compute")
            if e.kind == "reduce" and id(e) not in bound:
                raise TEError(f"compute {name!r}: reduction axis {e.name!r} is used outside a reduction over it")
            return
        if isinstance(e, Reduce):
            for ax in e.axes:
                if id(ax) in bound:
                    raise TEError(f"compute {name!r}: reduction axis {ax.name!r} is reduced twice")
                visit(ax.lo, bound)
                visit(ax.extent, bound)
            bound = bound | {id(ax) for ax in e.axes}
            visit(e.body, bound)
            return
        for c in e.children():
            visit(c, bound)

    visit(body, frozenset())


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


def _math(op: str):
    def fn(x) -> Expr:
        return unary(op, x)

    fn.__name__ = op
    fn.__doc__ = f"Element-wise {op}, with PyTorch's semantics."
    return fn


exp, log, log1p, expm1, sqrt, rsqrt = map(_math, ("exp", "log", "log1p", "expm1", "sqrt", "rsqrt"))
sin, cos, tan, tanh, sigmoid, erf = map(_math, ("sin", "cos", "tan", "tanh", "sigmoid", "erf"))
abs, floor, ceil, round, trunc = map(_math, ("abs", "floor", "ceil", "round", "trunc"))  # noqa: A001
isnan, isinf = _math("isnan"), _math("isinf")


def pow(a, b) -> Expr:  # noqa: A001
    """``a ** b`` with PyTorch's promotion (integer powers stay integer)."""
    return binary("pow", a, b)


def minimum(a, b) -> Expr:
    """Element-wise minimum; NaN propagates."""
    return binary("minimum", a, b)


def maximum(a, b) -> Expr:
    """Element-wise maximum; NaN propagates."""
    return binary("maximum", a, b)


def atan2(a, b) -> Expr:
    """Element-wise atan2(a, b) in floating point."""
    return binary("atan2", a, b)


from tailjit.te.autodiff import gradient  # noqa: E402 - uses compute and placeholder above
