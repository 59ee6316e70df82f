"""The expression IR: scalar expressions over index variables.

A tensor expression program is a graph of :class:`Tensor` objects.  A
placeholder is an input; a compute is ``shape`` plus a ``body`` expression
over its spatial index variables, built from loads of other tensors,
arithmetic, math calls, selects, casts and reductions over reduce axes.

Two kinds of compute are not pure gathers.  A *scatter* has a ``body`` that
copies its base and an :class:`Update` applied afterwards, point by point in
row-major order.  A *scan* has a ``body`` that loads the tensor itself at the
previous position along ``scan_axis``, under a select on the first position.

Nodes are immutable.  ``==`` builds a comparison expression, so structural
identity goes through :attr:`Expr.key` (a hash-consed :class:`Key`).
"""

from __future__ import annotations

import itertools
import math
import operator
import weakref

from tailjit.te import dtypes
from tailjit.te.dtypes import DType
from tailjit.te.primitives import BINARY, INFIX, UNARY


class TEError(ValueError):
    """A malformed tensor-expression program."""


class Key:
    """A node's structural identity, hash-consed: structurally equal nodes get the same ``Key`` object,
    so keys compare by identity and hash in constant time.  (Nested tuples would hash and compare the
    whole tree, once per path: exponential in an expression that shares sub-expressions, such as
    nested selects over one value.)  Interned weakly: a key lives as long as a node holding it, and so
    do the tensors and variables whose ids it holds."""

    __slots__ = ("parts", "_hash", "__weakref__")
    _interned: weakref.WeakValueDictionary[tuple, Key] = weakref.WeakValueDictionary()

    def __init__(self, parts: tuple):
        self.parts = parts  # the node's kind and fields, its children's keys
        self._hash = hash(parts)

    @classmethod
    def of(cls, parts: tuple) -> Key:
        key = cls._interned.get(parts)
        if key is None:
            key = cls._interned[parts] = cls(parts)
        return key

    def __hash__(self):
        return self._hash

    def __repr__(self):  # not the parts: they nest the whole tree
        return f"<Key {self.parts[0]} {self._hash & 0xFFFFFFFF:08x}>"


class Expr:
    __slots__ = ("dtype", "weak", "_key")
    __hash__ = object.__hash__

    def __init__(self, dtype: DType, weak: bool = False):
        self.dtype = dtype
        self.weak = weak
        self._key = None

    @property
    def key(self) -> Key:
        if self._key is None:
            self._key = Key.of(self._make_key())
        return self._key

    def __setstate__(self, state):
        # a pickled key names the pickling process's objects by id (and is not interned here): the copy makes
        # its own, so that equal copies share keys and fingerprints as nodes built here do
        attrs, slots = state if isinstance(state, tuple) else (state, None)
        for name, value in {**(attrs or {}), **(slots or {})}.items():
            object.__setattr__(self, name, value)
        self._key = None

    def _make_key(self) -> tuple:  # pragma: no cover - every node overrides
        raise NotImplementedError

    def _show(self, sub) -> str:  # pragma: no cover - every node overrides
        """The node's text, its children's given by ``sub``."""
        raise NotImplementedError

    def __repr__(self):
        return show(self)

    def children(self) -> tuple[Expr, ...]:
        return ()

    def __bool__(self):
        raise TypeError(
            "a tensor expression has no truth value at definition time; "
            "use te.select(cond, a, b) instead of Python if/and/or"
        )

    # Arithmetic -------------------------------------------------------
    def __add__(self, o):
        return binary("add", self, o)

    def __radd__(self, o):
        return binary("add", o, self)

    def __sub__(self, o):
        return binary("sub", self, o)

    def __rsub__(self, o):
        return binary("sub", o, self)

    def __mul__(self, o):
        return binary("mul", self, o)

    def __rmul__(self, o):
        return binary("mul", o, self)

    def __truediv__(self, o):
        return binary("truediv", self, o)

    def __rtruediv__(self, o):
        return binary("truediv", o, self)

    def __floordiv__(self, o):
        return binary("floordiv", self, o)

    def __rfloordiv__(self, o):
        return binary("floordiv", o, self)

    def __mod__(self, o):
        return binary("mod", self, o)

    def __rmod__(self, o):
        return binary("mod", o, self)

    def __pow__(self, o):
        return binary("pow", self, o)

    def __rpow__(self, o):
        return binary("pow", o, self)

    def __neg__(self):
        return unary("neg", self)

    def __pos__(self):
        return self

    def __abs__(self):
        return unary("abs", self)

    def __invert__(self):
        return unary("invert", self)

    # Comparisons and logic --------------------------------------------
    def __lt__(self, o):
        return binary("lt", self, o)

    def __le__(self, o):
        return binary("le", self, o)

    def __gt__(self, o):
        return binary("gt", self, o)

    def __ge__(self, o):
        return binary("ge", self, o)

    def __eq__(self, o):  # type: ignore[override]
        return binary("eq", self, o)

    def __ne__(self, o):  # type: ignore[override]
        return binary("ne", self, o)

    def __and__(self, o):
        return binary("and", self, o)

    def __rand__(self, o):
        return binary("and", o, self)

    def __or__(self, o):
        return binary("or", self, o)

    def __ror__(self, o):
        return binary("or", o, self)

    def __xor__(self, o):
        return binary("xor", self, o)

    def __rxor__(self, o):
        return binary("xor", o, self)


class Const(Expr):
    __slots__ = ("value",)

    def __init__(self, value, dtype: DType, weak: bool = False):
        super().__init__(dtype, weak)
        if dtype.is_bool:
            value = bool(value)
        elif dtype.is_int:
            value = int(value)
        else:
            value = float(value)
        self.value = value

    def _make_key(self):
        # repr distinguishes 0.0 / -0.0 and nan
        return ("const", repr(self.value), self.dtype.name, self.weak)

    def _show(self, sub) -> str:
        return repr(self.value)


class Absent(Const):
    """A gradient's "no contribution here" (the zero branch of a gradient's select): zero, and nothing at
    all where it is added, ``x + Absent`` being ``x`` (-0.0 included, where ``x + 0.0`` is +0.0), as
    gradient construction treats a missing contribution.  Once the code generator decides a condition
    (a column of an (N, 4) box's gradient, written out per column) the sum of contributions keeps those
    of that column only, instead of adding zeros that gcc must keep."""

    __slots__ = ()

    def __init__(self, dtype: DType):
        super().__init__(0.0, dtype)

    def _make_key(self):  # not a zero a program wrote: memo tables must not trade one for the other
        return ("absent", self.dtype.name)


class SizeVar(Expr):
    """A symbolic size, bound from the input shapes at call time."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        super().__init__(dtypes.int64)
        self.name = name

    def _make_key(self):
        return ("size", id(self))

    def _show(self, sub) -> str:
        return self.name


class IterVar(Expr):
    """A loop index: a spatial axis of a compute, or a reduce axis.

    It ranges over ``[lo, lo + extent)``.
    """

    __slots__ = ("name", "lo", "extent", "kind")
    _ids = itertools.count()

    def __init__(self, name: str, lo: Expr, extent: Expr, kind: str):
        super().__init__(dtypes.int64)
        self.name = name
        self.lo = lo
        self.extent = extent
        self.kind = kind

    def _make_key(self):
        return ("iv", id(self))

    def _show(self, sub) -> str:
        return self.name


class Load(Expr):
    __slots__ = ("tensor", "indices")

    def __init__(self, tensor: Tensor, indices: tuple[Expr, ...]):
        super().__init__(tensor.dtype)
        self.tensor = tensor
        self.indices = indices

    def _make_key(self):
        return ("load", id(self.tensor), tuple(i.key for i in self.indices))

    def children(self):
        return self.indices

    def _show(self, sub) -> str:
        return f"{self.tensor.name}[{', '.join(map(sub, self.indices))}]"


class Unary(Expr):
    __slots__ = ("op", "x")

    def __init__(self, op: str, x: Expr, dtype: DType):
        super().__init__(dtype, x.weak)
        self.op = op
        self.x = x

    def _make_key(self):
        return ("un", self.op, self.dtype.name, self.x.key)

    def children(self):
        return (self.x,)

    def _show(self, sub) -> str:
        return f"{self.op}({sub(self.x)})"


class Binary(Expr):
    __slots__ = ("op", "a", "b")

    def __init__(self, op: str, a: Expr, b: Expr, dtype: DType, weak: bool):
        super().__init__(dtype, weak)
        self.op = op
        self.a = a
        self.b = b

    def _make_key(self):
        return ("bin", self.op, self.dtype.name, self.a.key, self.b.key)

    def children(self):
        return (self.a, self.b)

    def _show(self, sub) -> str:
        sym = _INFIX.get(self.op)
        if sym:
            return f"({sub(self.a)} {sym} {sub(self.b)})"
        return f"{self.op}({sub(self.a)}, {sub(self.b)})"


class Select(Expr):
    __slots__ = ("cond", "a", "b")

    def __init__(self, cond: Expr, a: Expr, b: Expr, dtype: DType, weak: bool):
        super().__init__(dtype, weak)
        self.cond = cond
        self.a = a
        self.b = b

    def _make_key(self):
        return ("sel", self.dtype.name, self.cond.key, self.a.key, self.b.key)

    def children(self):
        return (self.cond, self.a, self.b)

    def _show(self, sub) -> str:
        return f"select({sub(self.cond)}, {sub(self.a)}, {sub(self.b)})"


class Cast(Expr):
    __slots__ = ("x",)

    def __init__(self, x: Expr, dtype: DType):
        super().__init__(dtype)
        self.x = x

    def _make_key(self):
        return ("cast", self.dtype.name, self.x.key)

    def children(self):
        return (self.x,)

    def _show(self, sub) -> str:
        return f"{self.dtype.name}({sub(self.x)})"


REDUCERS = ("sum", "prod", "max", "min", "argmax", "argmin")


class Reduce(Expr):
    """``op`` of ``body`` over the reduce ``axes``; arg-reductions give the
    row-major flat position over the axes of the first extreme element."""

    __slots__ = ("op", "body", "axes")

    def __init__(self, op: str, body: Expr, axes: tuple[IterVar, ...]):
        if op in ("argmax", "argmin"):
            dtype = dtypes.int64
        elif op in ("sum", "prod") and not body.dtype.is_float:
            dtype = dtypes.int64
        else:
            dtype = body.dtype
        super().__init__(dtype)
        self.op = op
        self.body = body
        self.axes = axes

    def _make_key(self):
        return ("red", self.op, tuple(id(a) for a in self.axes), self.body.key)

    def children(self):
        return (self.body,)

    def _show(self, sub) -> str:
        return f"{self.op}({sub(self.body)}, axis={list(self.axes)})"


_INFIX = {
    **INFIX,
    "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=",
    "and": "&", "or": "|", "xor": "^",
}  # fmt: skip

COMPARISONS = frozenset({"lt", "le", "gt", "ge", "eq", "ne"})
LOGICAL = frozenset({"and", "or", "xor"})


def as_expr(x) -> Expr:
    """Wrap a Python scalar as a weak constant; pass expressions through."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, bool):
        return Const(x, dtypes.bool_, weak=True)
    if isinstance(x, int):
        return Const(x, dtypes.int64, weak=True)
    if isinstance(x, float):
        return Const(x, dtypes.float32, weak=True)
    if isinstance(x, Tensor):
        raise TEError(f"tensor {x.name!r} used as a scalar: index it, e.g. {x.name}[i, j]")
    try:
        import numpy as np

        if isinstance(x, np.generic):
            return as_expr(x.item())
    except ImportError:  # pragma: no cover
        pass
    raise TypeError(f"cannot use {type(x).__name__} {x!r} in a tensor expression")


def binary(op: str, a, b) -> Expr:
    a, b = as_expr(a), as_expr(b)
    dt, weak = dtypes.promote(a.dtype, a.weak, b.dtype, b.weak)
    if op in LOGICAL:
        if dt.is_float:
            raise TypeError(f"'{_INFIX[op]}' needs bool or integer operands, got {a.dtype} and {b.dtype}")
    elif op in COMPARISONS:
        return Binary(op, a, b, dtypes.bool_, weak)
    elif op in BINARY:
        dt = BINARY[op].dtype(op, dt)
    else:
        raise TEError(f"unknown binary operation {op!r}: te's are {', '.join([*BINARY, *COMPARISONS, *LOGICAL])}")
    # PyTorch's rule for a Python-scalar exponent; a tensor's negative exponents compute (2 ** -1 = 0)
    if op == "pow" and dt.is_int and not a.weak and isinstance(b, Const) and b.weak and b.value < 0:
        raise TEError(f"Integers to negative integer powers are not allowed: {a!r} ** {b.value} ({dt}); "
                      "cast the base to a float dtype first")  # fmt: skip
    if a.weak and b.weak and isinstance(a, Const) and isinstance(b, Const):
        folded = _fold(op, a.value, b.value)
        if folded is not None:
            return Const(folded, dt, weak=True)
    return int_binary(op, a, b, dt, weak)


def int_binary(op: str, a: Expr, b: Expr, dt: DType, weak: bool) -> Expr:
    """``Binary(op, a, b)``, with integer index arithmetic folded: constants (``2 + 0 * 4`` once a
    strided slice's index is substituted), comparisons of two integer constants (``92 == 93`` once a
    row of an unrolled loop's tensor is substituted) and identities (``0 + i * 1`` from views) cost
    nothing."""
    if op in COMPARISONS and isinstance(a, Const) and isinstance(b, Const) and a.dtype.is_int and b.dtype.is_int:
        return Const(_COMPARE[op](a.value, b.value), dt)
    if dt.is_int and op in ("add", "sub", "mul"):
        if isinstance(a, Const) and isinstance(b, Const):
            folded = _fold(op, a.value, b.value)
            if folded is not None and -(2**63) <= folded < 2**63:
                return Const(folded, dt, weak=weak)
        for x, y in ((a, b), (b, a)) if op in ("add", "mul") else ((b, a),) if op == "sub" else ():
            if isinstance(x, Const) and x.value == (1 if op == "mul" else 0) and (y.dtype, y.weak) == (dt, weak):
                return y
    return Binary(op, a, b, dt, weak)


_COMPARE = {
    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge, "eq": operator.eq, "ne": operator.ne,
}  # fmt: skip


def _fold(op: str, a, b):
    """Fold an operation on two Python scalars the way Python computes it."""
    try:
        return {
            "add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
            "floordiv": lambda: a // b, "mod": lambda: a % b,
        }.get(op, lambda: None)()  # fmt: skip
    except (ZeroDivisionError, OverflowError):
        return None


def unary(op: str, x) -> Expr:
    x = as_expr(x)
    dt = x.dtype
    if op in UNARY:
        dt = UNARY[op].dtype(op, dt)
        if dt is None:  # the operation is the identity on this dtype (rounding an integer)
            return x
    elif op in ("isnan", "isinf"):
        dt = dtypes.bool_
    elif op == "invert":
        if dt.is_float:
            raise TypeError(f"'~' needs a bool or integer operand, got {dt}")
    else:
        raise TEError(f"unknown unary operation {op!r}: te's are {', '.join([*UNARY, 'isnan', 'isinf', 'invert'])}")
    return Unary(op, x, dt)


def select(cond, a, b) -> Expr:
    """``a`` where ``cond`` holds, else ``b`` (only the taken branch is evaluated)."""
    cond, a, b = as_expr(cond), as_expr(a), as_expr(b)
    if not cond.dtype.is_bool:
        raise TypeError(f"select condition must be bool, got {cond.dtype}; compare it first, e.g. c != 0")
    dt, weak = dtypes.promote(a.dtype, a.weak, b.dtype, b.weak)
    return Select(cond, a, b, dt, weak)


def cast(x, dtype) -> Expr:
    x = as_expr(x)
    dt = dtypes.dtype(dtype)
    if dt == x.dtype and not x.weak:
        return x
    if isinstance(x, Const):
        return Const(x.value, dt)
    return Cast(x, dt)


# Tensors ------------------------------------------------------------------

_names = itertools.count()


def fresh_name(prefix: str) -> str:
    return f"{prefix}{next(_names)}"


COMBINES = ("add", "mul", "max", "min", "assign")


class Update:
    """The update loop of a scatter: for every point of ``domain`` (its index
    variables, outermost first) in row-major order, where ``cond`` holds (or
    always, when it is None), ``out[targets] = combine(out[targets], value)``.
    ``value`` has the result's dtype."""

    __slots__ = ("domain", "targets", "value", "cond", "combine")

    def __init__(self, domain, targets, value, cond, combine: str):
        self.domain: tuple[IterVar, ...] = domain
        self.targets: tuple[Expr, ...] = targets
        self.value: Expr = value
        self.cond: Expr | None = cond
        self.combine = combine

    def exprs(self) -> tuple[Expr, ...]:
        """The targets, the value and the condition (when there is one)."""
        return (*self.targets, self.value, *((self.cond,) if self.cond is not None else ()))

    def with_exprs(self, exprs) -> Update:
        """The same update with ``exprs`` (in the order of :meth:`exprs`) replaced."""
        n = len(self.targets)
        cond = exprs[n + 1] if self.cond is not None else None
        return Update(self.domain, tuple(exprs[:n]), exprs[n], cond, self.combine)

    def __repr__(self):
        op = {"add": "+=", "mul": "*=", "max": "max=", "min": "min=", "assign": "="}[self.combine]
        where = f" where {self.cond!r}" if self.cond is not None else ""
        over = ", ".join(f"{v.name} < {v.extent!r}" for v in self.domain) or "()"
        return f"for {over} in order: out[{', '.join(map(repr, self.targets))}] {op} {self.value!r}{where}"


class Tensor:
    """A tensor of the program: a placeholder (``body is None``) or a compute.

    A scatter also has an ``update``; a scan has a ``scan_axis`` (and
    ``reverse``), and its body loads the tensor itself (see te.scan)."""

    __hash__ = object.__hash__

    def __init__(self, shape, dtype: DType, name: str, axes=(), body: Expr | None = None):
        self.shape: tuple[Expr, ...] = shape
        self.dtype = dtype
        self.name = name
        self.axes: tuple[IterVar, ...] = axes
        self.body = body
        # loop variables the contents depend on: set for row buffers, which
        # hold one row of a producer for the current values of these loops
        self.prefix: tuple[IterVar, ...] = ()
        self.update: Update | None = None  # a scatter's update loop, run after the body fills it
        self.scan_axis: int | None = None  # a scan's recurrence axis
        self.reverse = False  # a scan running from the last position to the first
        self.data = None  # a constant's values (a numpy array), compiled into the kernel
        # always computed into its own buffer, never inlined: set where consumers compare
        # its values for equality (a recomputation may round differently)
        self.materialize = False
        self.stop_gradient = False  # te.gradient treats its values as constants (see te.stop_gradient)
        self.far = False  # a placeholder whose values may lie far from zero (see te.analysis.FarValues)

    @property
    def is_placeholder(self) -> bool:
        return self.body is None

    @property
    def is_constant(self) -> bool:
        return self.data is not None

    @property
    def is_scatter(self) -> bool:
        return self.update is not None

    @property
    def is_scan(self) -> bool:
        return self.scan_axis is not None

    def exprs(self) -> tuple[Expr, ...]:
        """Every expression of the compute: the body, then a scatter's update expressions."""
        body = (self.body,) if self.body is not None else ()
        return body + (self.update.exprs() if self.update is not None else ())

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, index) -> Load:
        if not isinstance(index, tuple):
            index = (index,)
        if len(index) != len(self.shape):
            raise TEError(
                f"{self.name!r} has {len(self.shape)} dimension(s) but was indexed with {len(index)} index(es)"
            )
        idx = []
        for pos, i in enumerate(index):
            if isinstance(i, slice):
                raise TEError(f"{self.name!r}: slices are not supported in a load; index with expressions")
            e = as_expr(i)
            if not e.dtype.is_int:
                raise TypeError(f"index {pos} of {self.name!r} must be an integer expression, got {e.dtype}")
            idx.append(cast(e, dtypes.int64) if e.dtype != dtypes.int64 else e)
        return Load(self, tuple(idx))

    def __bool__(self):
        raise TypeError("a te.Tensor has no truth value")

    def __repr__(self):
        kind = "constant" if self.is_constant else "placeholder" if self.is_placeholder else "compute"
        kind = "scatter" if self.is_scatter else "scan" if self.is_scan else kind
        return f"<te.{kind} {self.name} shape={list(self.shape)} {self.dtype}>"


def is_size_expr(e: Expr) -> bool:
    """True when ``e`` is integer arithmetic over constants and size variables only."""
    if isinstance(e, (Const, SizeVar)):
        return e.dtype.is_int
    if isinstance(e, Binary) and e.op in ("add", "sub", "mul", "floordiv", "mod"):
        return is_size_expr(e.a) and is_size_expr(e.b)
    if isinstance(e, Binary) and e.op in ("maximum", "minimum"):
        return is_size_expr(e.a) and is_size_expr(e.b)
    return False


def as_size(x, what: str) -> Expr:
    if isinstance(x, int) and not isinstance(x, bool):
        if x < 0:
            raise TEError(f"{what}: negative size {x}")
        return Const(x, dtypes.int64)
    e = as_expr(x)
    if not is_size_expr(e):
        raise TEError(f"{what}: a size must be an int or arithmetic of te.var sizes, got {e!r}")
    if isinstance(e, Const):
        return as_size(e.value, what)
    return e


def walk(e: Expr):
    """Every node of ``e`` once (shared sub-trees are visited once)."""
    seen: set[int] = set()
    stack = [e]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        yield n
        stack.extend(n.children())
        if isinstance(n, Reduce):
            for ax in n.axes:
                stack.extend((ax.lo, ax.extent))


#: An expression larger than this many nodes written as a tree is printed with its shared
#: sub-expressions named instead (a loop of ``where(m, x, f(x))`` doubles the tree at each step).
SHOW_TREE_MAX = 2000


def show(e: Expr) -> str:
    """``e`` as text: as a tree when small, else with each sub-expression used more than once written
    once, as ``%k`` defined in a ``where`` clause after the expression."""
    tree: dict[Key, int] = {}  # the number of nodes in each sub-expression written as a tree
    order: list[Expr] = []  # post-order, each shared node once
    uses: dict[Key, int] = {}
    stack: list[tuple[Expr, bool]] = [(e, False)]
    while stack:
        n, done = stack.pop()
        if done:
            tree[n.key] = 1 + sum(tree[c.key] for c in n.children())
            order.append(n)
            continue
        uses[n.key] = uses.get(n.key, 0) + 1
        if uses[n.key] == 1:
            stack.append((n, True))
            stack.extend((c, False) for c in n.children())

    def plain(n: Expr) -> str:
        return n._show(plain)

    if tree[e.key] <= SHOW_TREE_MAX:
        return plain(e)
    names: dict[Key, str] = {}
    defs: list[str] = []

    def named(n: Expr) -> str:
        return names.get(n.key) or n._show(named)

    for n in order:
        if n is not e and uses[n.key] > 1 and n.children():
            defs.append(f"%{len(defs)} = {named(n)}")
            names[n.key] = f"%{len(defs) - 1}"
    return f"{named(e)} where {'; '.join(defs)}"


def const_value(e: Expr):
    return e.value if isinstance(e, Const) else None


INF = math.inf
