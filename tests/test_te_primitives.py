"""The table of element-wise primitives (tailjit/te/primitives.py) is complete and consistent.

A new primitive is one entry in the table and one line in each of tests/test_te_math.py (its torch function,
compared over every dtype and special values) and tests/test_autodiff.py (its gradient against torch
autograd); the tests here check the entry itself."""

import pytest

from tailjit import codegen, te
from tailjit.te import dtypes, primitives
from tailjit.te.autodiff import FORMULA_HELPERS
from tailjit.te.primitives import PRIMITIVES

RULES = {primitives.float_math, primitives.same, primitives.numeric, primitives.rounding}
#: What a C template may name (``Primitive.c``)
C_FIELDS = {"x", "y", "f", "s", "one", "exp", "zerodiv"}


def _result_dtypes(p):
    """The result dtypes of ``p`` over every operand dtype its rule accepts."""
    out = set()
    for dt in dtypes.ALL:
        try:
            got = p.dtype(p.name, dt)
        except TypeError:
            continue
        out.add(got)
    return out - {None}


@pytest.mark.parametrize("name", PRIMITIVES)
def test_entry_is_complete(name):
    p = PRIMITIVES[name]
    assert p.arity in (1, 2)
    assert p.dtype in RULES, "a dtype rule is one of te.primitives' named rules"
    assert isinstance(p.cost, int) and p.cost >= 1
    results = _result_dtypes(p)
    assert results, "the rule accepts some dtype"
    fields = {k: "v" for k in C_FIELDS}
    for dt in results:
        template = p.c_template(dt)
        assert template is not None, f"{name} has no C spelling for a {dt} result"
        template.format(**fields)  # names only the documented fields
    assert set(p.c) <= {"float", "int", "bool", "any"}
    operands = {"grad", "self", "result"} | ({"other"} if p.arity == 2 else set())
    assert set(p.formula_args) <= operands | set(FORMULA_HELPERS), "the adjoint names only what autodiff passes"
    assert p.adjoint is None or "grad" in p.formula_args


def test_functions_are_the_table_entries_with_a_docstring():
    named = {n for n, p in PRIMITIVES.items() if p.doc is not None}
    assert set(te.FUNCTIONS) == named
    for name in named:
        assert getattr(te, name) is te.FUNCTIONS[name] and name in te.__all__
        assert getattr(te, name).__doc__ == PRIMITIVES[name].doc


def test_vector_math_is_declared_and_scheduled():
    assert codegen.VECTOR_CALLS == {n for n, p in PRIMITIVES.items() if p.libmvec}
    for p in PRIMITIVES.values():
        for fn in p.libmvec:
            args = ", ".join(["float"] * p.arity)
            assert f"#pragma omp declare simd notinbranch\nfloat {fn}f({args});\n" in codegen.PRELUDE


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda x: te.unary("cosh", x), "unknown unary operation 'cosh': te's are exp, log"),
        (lambda x: te.binary("hypot", x, x), "unknown binary operation 'hypot': te's are add, sub"),
    ],
)
def test_unknown_operations_are_refused(build, message):
    x = te.placeholder((3,), name="x")
    with pytest.raises(te.TEError, match=message):
        build(x[0])
