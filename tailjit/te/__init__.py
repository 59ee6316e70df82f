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

Beyond gathers, :func:`scatter` applies accumulating updates to a copy of a
base tensor (``scatter_add``, ``index_put``, histograms) and :func:`scan`
computes a sequential recurrence along one axis (``cumsum``, discounted
returns)::

    hist = te.scatter(zeros, (n,), lambda i: ((idx[i],), 1))
    csum = te.scan((n, m), 1, lambda prev, i, j: prev + x[i, j], dtype=x.dtype)
"""

from tailjit.te import dtypes
from tailjit.te.autodiff import gradient
from tailjit.te.dsl import (
    FUNCTIONS,
    MAX_CONSTANT,
    argmax,
    argmin,
    compute,
    constant,
    isinf,
    isnan,
    max,
    min,
    placeholder,
    prod,
    reduce_axis,
    scan,
    scatter,
    stop_gradient,
    sum,
    var,
)
from tailjit.te.dtypes import DType, bool_, float32, float64, int32, int64
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

__all__ = [
    "DType", "Expr", "IterVar", "SizeVar", "TEError", "Tensor",
    "bool_", "float32", "float64", "int32", "int64",
    "var", "placeholder", "compute", "scatter", "scan", "reduce_axis", "select", "cast",
    "sum", "prod", "max", "min", "argmax", "argmin", "isnan", "isinf",
    "gradient", "stop_gradient",
    *FUNCTIONS,  # the element-wise math of te.primitives: exp, log, ..., maximum, atan2, pow
]  # fmt: skip
globals().update(FUNCTIONS)
