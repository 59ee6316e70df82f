"""Lowering ATen nodes to tensor expressions.

Each lowered node becomes one ``te.compute`` (or a few: softmax), named after
the node, inside the region being built; ``tailjit.build`` then fuses the
region.  Op lowerings live in this package's family modules (``pointwise``,
``reduce``, ``view``, ...) and register themselves in :data:`LOWERINGS` (ATen
overload -> function); importing the package imports them all.  A lowering
raises :class:`Unsupported` for cases it does not handle; the node then runs
eagerly (see ``backend.py``).

Shapes always come from the node's fake value (``node.meta["val"]``), whose
sizes are ints or SymInts of Dynamo's shape environment, so a lowering never
has to re-derive PyTorch's shape rules, and dtypes are checked against the
fake value: a TE result of another dtype is a lowering bug and is refused.
"""

from __future__ import annotations

import torch

from tailjit import te
from tailjit.frontend.lower.symbolic import Unsupported, sym_expr, to_te
from tailjit.te.expr import Const, Expr, Tensor

#: ATen overload -> lowering ``fn(L, *args, **kwargs)`` returning a te.Tensor (or a tuple of them).
LOWERINGS: dict = {}

#: Ops lowered as themselves, whose core-ATen decomposition the backend skips: the decomposition changes
#: behaviour (index_add/index_copy through index_put wrap negative indices, which eager rejects).
UNDECOMPOSED: set = set()

#: Ops whose value is a number (a SymInt/SymFloat/SymBool in the graph), lowered to a scalar expression.
SCALAR_OPS: set = set()

SUPPORTED_DTYPES = {torch.bool: te.bool_, torch.int32: te.int32, torch.int64: te.int64,
                    torch.float32: te.float32, torch.float64: te.float64}  # fmt: skip


#: The ops whose expression gradient, through their decomposition and lowering, equals eager autograd's, ties,
#: NaN and inf included: every entry of the gradient sweep (``test_expression_gradients`` in
#: tests/frontend/test_ops.py) that uses them matches eager.  A lowering joins it at registration
#: (``register(..., faithful=True)``; one left out says why there); ``train.expr_grad`` adds the decomposed ops of
#: its ``DECOMPOSED_FAITHFUL``.
FAITHFUL: set = set()


def register(*ops, faithful: bool = False):
    """Make the decorated function the lowering of ``ops``.  ``faithful`` declares that the gradient of the
    lowered expression equals eager autograd's, ties, NaN and inf included (the gradient sweep of
    tests/frontend/test_ops.py checks it): the ops join :data:`FAITHFUL`, and a training graph whose
    differentiated ops are all faithful trains on tailjit's expression gradients instead of AOTAutograd's.
    An op that is differentiable but not faithful says ``faithful=False`` with a comment saying why."""

    def deco(fn):
        for op in ops:
            LOWERINGS[op] = fn
            if faithful:
                FAITHFUL.add(op)
        return fn

    return deco


def te_dtype(dt: torch.dtype):
    try:
        return SUPPORTED_DTYPES[dt]
    except KeyError:
        raise Unsupported(f"dtype {dt} is not supported by tailjit") from None


def is_one(d) -> bool:
    return isinstance(d, Const) and d.value == 1


def refuse_bool(*operands, what: str):
    """Leave the node to eager where it has a bool operand that eager refuses but the op's meta function lets
    through (``x - mask``, ``mask.argmax()``): run eagerly, it raises eager's error."""
    if any(isinstance(o, bool) or isinstance(o, (Tensor, Expr)) and o.dtype.is_bool for o in operands):
        raise Unsupported(f"{what} of a bool operand (eager raises)")


class NodeLowering:
    """What an op lowering sees: the node, its output metadata and helpers."""

    def __init__(self, node: torch.fx.Node, size, value=None):
        self.node = node
        self._size = size  # sympy expr -> TE size expression (records symbol use)
        self._value = value  # fx node -> its TE value in the region (a placeholder if it comes from outside)
        self._n = 0

    def value(self, node: torch.fx.Node):
        """The TE value of another node of the graph (for lowerings that look past their arguments)."""
        if self._value is None:
            raise Unsupported("no access to other nodes' values")
        return self._value(node)

    def size(self, v) -> Expr:
        """A TE size expression for an int, SymInt or TE expression."""
        if isinstance(v, Expr):
            return v
        e = to_te(sym_expr(v), self._size)
        return te.cast(e, te.int64) if isinstance(e, int) else e

    def val(self, i: int | None = None):
        v = self.node.meta.get("val")
        if i is not None:
            v = v[i]
        if not isinstance(v, torch.Tensor):
            raise Unsupported("output is not a tensor")
        return v

    def out_shape(self, i: int | None = None) -> tuple:
        return tuple(self.size(d) for d in self.val(i).shape)

    def out_dtype(self, i: int | None = None):
        return te_dtype(self.val(i).dtype)

    def name(self, suffix: str = "") -> str:
        return f"{self.node.name}{suffix}"

    def axis(self, extent, tag: str = "r"):
        self._n += 1
        return te.reduce_axis(self.size(extent), name=f"{self.node.name}_{tag}{self._n}")

    def compute(self, shape, fcompute, suffix: str = "", dtype=None) -> Tensor:
        """A compute named after the node; its dtype must equal ``dtype`` (default: the node's)."""
        want = dtype
        if want is None and not suffix:
            want = self.out_dtype()

        def body(*idx):
            return fcompute(idx)

        t = te.compute(tuple(shape), body, name=self.name(suffix))
        if want is not None and t.dtype != want:
            raise Unsupported(f"lowering gives {t.dtype}, PyTorch gives {want}")
        return t


def load_bcast(t, idx):
    """Element of ``t`` (a te.Tensor or a scalar) at output index ``idx``, broadcasting right-aligned.

    A dimension of size 1 (a specialised constant) broadcasts; every symbolic
    size is >= 2 under Dynamo's 0/1 specialisation, so it equals the output's."""
    if not isinstance(t, Tensor):
        return t
    off = len(idx) - t.ndim
    if off < 0:
        raise Unsupported("operand has more dimensions than the result")
    return t[tuple(te.cast(0, te.int64) if is_one(d) else idx[off + k] for k, d in enumerate(t.shape))]


# PyTorch's type promotion ------------------------------------------------------


def _promote(a, b):
    """``torch.promote_types`` on TE dtypes (None is "no operand yet")."""
    if a is None or b is None:
        return a or b
    return te.dtypes.promote(a, False, b, False)[0]


def _combine(higher, lower):
    # c10's combine_categories: a lower-priority operand only counts when its category is higher
    if higher is None:
        return lower
    if higher.is_float or lower is None:
        return higher
    if higher.is_bool or lower.is_float:
        return _promote(higher, lower)
    return higher


def result_type(*operands):
    """The dtype PyTorch computes an element-wise op of ``operands`` in (``torch.result_type``).

    Tensors with dimensions decide; a 0-d tensor counts only when its category
    (bool < integer < float) is higher, and then with its own width; a Python
    scalar (or a symbolic size) likewise, as int64 or the default float32."""
    dim = zero = wrapped = None
    for o in operands:
        if isinstance(o, Tensor):
            if o.ndim:
                dim = _promote(dim, o.dtype)
            else:
                zero = _promote(zero, o.dtype)
        elif isinstance(o, bool):
            wrapped = _promote(wrapped, te.bool_)
        elif isinstance(o, int):
            wrapped = _promote(wrapped, te.int64)
        elif isinstance(o, float):
            wrapped = _promote(wrapped, te.float32)
        elif isinstance(o, Expr):
            wrapped = _promote(wrapped, te.dtypes.DEFAULT[o.dtype.category])
        elif o is not None:
            raise Unsupported(f"operand {o!r} is not a tensor or a scalar")
    out = _combine(dim, _combine(zero, wrapped))
    if out is None:
        raise Unsupported("no operands")
    return out


def scalar_arg(v, what: str = "scalar"):
    """A Python number argument (not a tensor, not a symbolic float)."""
    if isinstance(v, (bool, int, float)):
        return v
    raise Unsupported(f"{what} {v!r} is not a Python number")


def clamp_index(i, n):
    """``i`` clamped into ``[0, n)``: for a load that an enclosing select already keeps inside ``n``,
    when the bounds analysis cannot carry the select's condition through a fused compound index."""
    return te.minimum(te.maximum(i, 0), n - 1)


def lower_node(L: NodeLowering, args, kwargs):
    fn = LOWERINGS.get(L.node.target)
    if fn is None:
        raise Unsupported(f"no lowering for {L.node.target}")
    return fn(L, *args, **kwargs)
