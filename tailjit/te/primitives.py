"""The element-wise primitives of the tensor-expression language, each declared once with its rules.

A :class:`Primitive` gives everything the compiler knows about one operation: its arity, its dtype rule,
its cost for the fusion policy, its C spelling (and the libm functions with libmvec vector versions that
the C calls), its gradient, and the ``te.<name>`` function the DSL makes of it.  ``te.expr`` builds
nodes with the dtype rule, ``te.analysis`` weighs the cost, ``te.autodiff`` differentiates with the
adjoint, ``te.dsl`` makes the function and the C emitter (``tailjit/codegen.py``) formats the spelling
and declares the vector functions.  Adding a primitive is one entry here and its line in each of
tests/test_te_math.py and tests/test_autodiff.py (``tests/test_te_primitives.py`` checks the entry).

Operations that are not element-wise math stay where their structure is handled: the comparisons
(``lt le gt ge eq ne``: a bool result computed in the operands' promoted dtype, with IEEE NaN rules),
the logical and bitwise ``and or xor invert`` (bool or integer only), ``isnan``/``isinf`` (a test of the
input, not a function computed in the result dtype) in ``te.expr`` and ``CodeGen.unary``/``binary``;
``select``, ``cast`` and reductions are nodes of their own.  None of them carries a gradient (their
results are never floating), so ``te.autodiff`` needs no rule for them.

The table sits below ``te.expr``, which reads the dtype rules, so an adjoint cannot call ``te.expr``'s
constructors by name.  Instead its parameters name what it uses, and ``te.autodiff`` passes them:
``grad`` (the incoming gradient: ``*`` and ``/`` scale it, moving the factor inside a gradient's
zero-branch select, and ``-`` negates it), ``self``, ``other`` and ``result`` (the operands and the
value, as in PyTorch's ``tools/autograd/derivatives.yaml``, whose formulas the adjoints copy so that
gradients match eager's), any unary primitive by its name (``cos(self)``), and the helpers of
``te.autodiff.FORMULA_HELPERS`` (``sgn``, ``where`` with None for no gradient, ``zeros_like``, and the
backward functions of ``pow`` and ``atan2``, named as in PyTorch).  A unary adjoint returns the gradient of
``self``, a binary one the pair for ``self`` and ``other``; None is no gradient.  ``adjoint=None``
declares a primitive that passes no gradient at all (integer division); the rounding functions pass
torch's ``zeros_like(grad)``, a zero that NaN and inf gradients below still turn to NaN.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from tailjit.te import dtypes
from tailjit.te.dtypes import DType

# -- dtype rules: the result dtype from the operand dtype (unary) or the operands' promoted one (binary) --


def float_math(op: str, dt: DType) -> DType:
    """Computed in floating point: integer and bool operands promote to float32."""
    return dtypes.to_float(dt)


def same(op: str, dt: DType) -> DType:
    """The operand's dtype (the promoted one for two operands)."""
    return dt


def numeric(op: str, dt: DType) -> DType:
    """The operand's dtype, which must not be bool."""
    if dt.is_bool:
        if op == "neg":
            raise TypeError("negation of a bool expression is not supported; use ~ for logical not")
        raise TypeError(f"'{INFIX.get(op, op)}' is not supported on two bool operands")
    return dt


def rounding(op: str, dt: DType) -> DType | None:
    """The operand's dtype; None (the operand itself) for an integer or bool one, which is already whole."""
    return dt if dt.is_float else None


#: Python's operator for the primitives written as one, as ``te.expr`` prints them.
INFIX = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%"}

#: The cost of a libm transcendental call, vectorised by libmvec, in units of an add.
MATH_COST = 4


@dataclass(frozen=True)
class Primitive:
    """One element-wise operation: ``name`` as ``Unary.op``/``Binary.op`` carry it."""

    name: str
    arity: int
    #: ``(op, dtype) -> dtype``, raising TypeError for an operand dtype the operation refuses; for a binary
    #: primitive ``dtype`` is the operands' promoted one (``dtypes.promote``)
    dtype: Callable[[str, DType], DType | None]
    #: the cost of one evaluation for the fusion policy (``te.analysis.cost``), in units of an add
    cost: int
    #: the C expression, by the kind of the result dtype (``"float"``, ``"int"``, ``"bool"``; ``"any"`` for
    #: all): a ``str.format`` template over ``x`` (``y``) the operands converted to the result dtype, ``f`` the
    #: libm suffix (``"f"`` for float32), ``s`` the dtype's helper suffix (``f32``, ``i64``, ``b8``, ...),
    #: ``one`` the literal 1, ``exp`` the exp function (a variant for arguments far below zero) and
    #: ``zerodiv`` the expression that reports a division by zero and gives 0
    c: dict[str, str]
    #: the libm functions (double names: ``exp`` is ``expf`` for float32) the C calls that glibc's libmvec
    #: has vector versions of: the C prelude declares them ``omp declare simd``, and a loop calling them is
    #: scheduled as vector math
    libmvec: tuple[str, ...] = ()
    #: the gradient (see the module docstring); None for a piecewise-constant primitive
    adjoint: Callable | None = None
    #: the docstring of the ``te.<name>`` function; None for a primitive written as a Python operator
    doc: str | None = None
    #: the names the adjoint takes, which ``te.autodiff`` passes
    formula_args: tuple[str, ...] = field(init=False)

    def __post_init__(self):
        args = tuple(inspect.signature(self.adjoint).parameters) if self.adjoint is not None else ()
        object.__setattr__(self, "formula_args", args)

    def c_template(self, dt: DType) -> str | None:
        """The C template for a result of dtype ``dt``, None where the primitive has none."""
        kind = "float" if dt.is_float else "int" if dt.is_int else "bool"
        return self.c.get(kind, self.c.get("any"))


def _math(name: str, **kw) -> Primitive:
    """A unary function computed in floating point, a ``te.<name>`` function of PyTorch's semantics."""
    kw.setdefault("c", {"any": f"{name}{{f}}({{x}})"})
    kw.setdefault("libmvec", (name,))
    doc = f"Element-wise {name}, with PyTorch's semantics."
    return Primitive(name, 1, dtype=float_math, cost=MATH_COST, doc=doc, **kw)


def _rounding(name: str, c: str) -> Primitive:
    return Primitive(
        name,
        1,
        dtype=rounding,
        cost=1,
        c={"any": c},
        adjoint=lambda grad, zeros_like: zeros_like(grad),
        doc=f"Element-wise {name}, with PyTorch's semantics.",
    )


_TWO_OVER_SQRT_PI = 2 / math.sqrt(math.pi)

_UNARY = [
    _math("exp", c={"any": "{exp}({x})"}, adjoint=lambda grad, result: grad * result),
    _math("log", adjoint=lambda grad, self: grad / self),
    _math("log1p", adjoint=lambda grad, self: grad / (self + 1)),
    _math("expm1", adjoint=lambda grad, result: grad * (result + 1)),
    _math("sqrt", libmvec=(), adjoint=lambda grad, result: grad / (2 * result)),
    _math(
        "rsqrt",
        c={"any": "({one} / sqrt{f}({x}))"},
        libmvec=(),
        adjoint=lambda grad, result: -0.5 * grad * (result * result * result),
    ),
    _math("sin", adjoint=lambda grad, self, cos: grad * cos(self)),
    _math("cos", adjoint=lambda grad, self, sin: grad * -sin(self)),
    _math("tan", adjoint=lambda grad, result: grad * (1 + result * result)),
    _math("tanh", adjoint=lambda grad, result: grad * (1 - result * result)),
    _math(
        "sigmoid",
        c={"any": "({one} / ({one} + {exp}(-({x}))))"},
        libmvec=("exp",),
        adjoint=lambda grad, result: grad * (1 - result) * result,
    ),
    _math("erf", adjoint=lambda grad, self, exp: grad * _TWO_OVER_SQRT_PI * exp(-(self * self))),
    Primitive(
        "abs",
        1,
        dtype=same,
        cost=1,
        c={"float": "fabs{f}({x})", "int": "({x} < 0 ? -{x} : {x})", "bool": "{x}"},
        adjoint=lambda grad, self, sgn: grad * sgn(self),
        doc="Element-wise abs, with PyTorch's semantics.",
    ),
    Primitive("neg", 1, dtype=numeric, cost=1, c={"any": "(-({x}))"}, adjoint=lambda grad: -grad),
    _rounding("floor", "floor{f}({x})"),
    _rounding("ceil", "ceil{f}({x})"),
    _rounding("round", "rint{f}({x})"),
    _rounding("trunc", "trunc{f}({x})"),
]


def _extreme(name: str) -> Primitive:
    """maximum or minimum: the winning operand takes the gradient, equal operands split it (torch)."""

    def adjoint(grad, self, other, where):
        self_loses, other_loses = (self < other, self > other) if name == "maximum" else (self > other, self < other)
        return (
            where(self_loses, None, where(self == other, grad * 0.5, grad)),
            where(other_loses, None, where(self == other, grad * 0.5, grad)),
        )

    c = {"any": f"tj_{name[:3]}_{{s}}({{x}}, {{y}})"}
    return Primitive(name, 2, dtype=same, cost=1, c=c, adjoint=adjoint, doc=f"Element-wise {name}; NaN propagates.")


_INT_DIVMOD = "({y} == 0 ? {zerodiv} : tj_%s_{s}({x}, {y}))"

_BINARY = [
    Primitive(
        "add", 2, dtype=same, cost=1, c={"bool": "({x} | {y})", "any": "({x} + {y})"}, adjoint=lambda grad: (grad, grad)
    ),
    Primitive("sub", 2, dtype=numeric, cost=1, c={"any": "({x} - {y})"}, adjoint=lambda grad: (grad, -grad)),
    Primitive(
        "mul",
        2,
        dtype=same,
        cost=1,
        c={"bool": "({x} & {y})", "any": "({x} * {y})"},
        adjoint=lambda grad, self, other: (grad * other, grad * self),
    ),
    Primitive(
        "truediv",
        2,
        dtype=float_math,
        cost=2,
        c={"any": "({x} / {y})"},
        adjoint=lambda grad, other, result: (grad / other, -grad * (result / other)),
    ),
    Primitive("floordiv", 2, dtype=numeric, cost=3, c={"float": "tj_fdiv_{s}({x}, {y})", "int": _INT_DIVMOD % "fdiv"}),
    Primitive(
        "mod",
        2,
        dtype=numeric,
        cost=3,
        c={"float": "tj_fmod_{s}({x}, {y})", "int": _INT_DIVMOD % "fmod"},
        adjoint=lambda grad, self, other: (grad, -grad * (self // other)),
    ),
    _extreme("maximum"),
    _extreme("minimum"),
    Primitive(
        "atan2",
        2,
        dtype=float_math,
        cost=4,
        c={"any": "atan2{f}({x}, {y})"},
        libmvec=("atan2",),
        adjoint=lambda grad, self, other, atan2_backward: atan2_backward(grad, self, other),
        doc="Element-wise atan2(a, b) in floating point.",
    ),
    Primitive(
        "pow",
        2,
        dtype=numeric,
        cost=6,
        c={"float": "pow{f}({x}, {y})", "int": "tj_ipow_{s}({x}, {y})"},
        libmvec=("pow",),
        adjoint=lambda grad, self, other, result, pow_backward: pow_backward(grad, self, other, result),
        doc="``a ** b`` with PyTorch's promotion (integer powers stay integer).",
    ),
]

#: Every primitive by name, unary ones first.
PRIMITIVES: dict[str, Primitive] = {p.name: p for p in _UNARY + _BINARY}
UNARY = {n: p for n, p in PRIMITIVES.items() if p.arity == 1}
BINARY = {n: p for n, p in PRIMITIVES.items() if p.arity == 2}
