"""Symbolic sizes: sympy expressions from Dynamo's shape environment to TE size expressions."""

from __future__ import annotations

import math

import sympy
import torch

from tailjit import te
from tailjit.te.expr import Expr


class Unsupported(Exception):
    """The lowering does not handle this node; it runs eagerly instead."""


def sym_expr(v):
    """The sympy expression of an int or SymInt (after the shape environment's replacements)."""
    if isinstance(v, torch.SymInt):
        return sympy.sympify(v.node.expr)
    if isinstance(v, bool):
        raise Unsupported(f"bool {v!r} used as a size")
    if isinstance(v, int):
        return sympy.Integer(v)
    raise Unsupported(f"not a size: {v!r}")


def convert(expr, leaf):
    """Rebuild ``expr`` with ``leaf(symbol)`` for its symbols, through +, *, //, % and integer powers.

    Works for TE expressions and for plain ints alike (the runtime evaluates sizes with it)."""
    if isinstance(expr, sympy.Integer):
        return int(expr)
    if isinstance(expr, sympy.Symbol):
        return leaf(expr)
    name = type(expr).__name__
    args = expr.args
    if isinstance(expr, sympy.Add):
        out = convert(args[0], leaf)
        for a in args[1:]:
            out = out + convert(a, leaf)
        return out
    if isinstance(expr, sympy.Mul):
        out = convert(args[0], leaf)
        for a in args[1:]:
            out = out * convert(a, leaf)
        return out
    if isinstance(expr, sympy.Pow) and isinstance(args[1], sympy.Integer) and int(args[1]) >= 1:
        base = convert(args[0], leaf)
        out = base
        for _ in range(int(args[1]) - 1):
            out = out * base
        return out
    if name in ("Min", "Max"):  # diagonal lengths, clamped slices
        out = convert(args[0], leaf)
        for a in args[1:]:
            out = _minmax(name, out, convert(a, leaf))
        return out
    if name == "CeilToInt" and type(args[0]).__name__ == "FloatTrueDiv":  # float arange: ceil(n / step)
        num, den = args[0].args
        if type(num).__name__ == "ToFloat" and isinstance(den, sympy.Float) and den > 0:
            n, c = convert(num.args[0], leaf), float(den)
            if c == int(c):  # the float quotient of an integer by an integer rounds on the right side of ceil
                return (n + int(c) - 1) // int(c)
            inv = 1 / c
            if inv == int(inv) and math.frexp(inv)[0] == 0.5:  # a power of two: the division is exact
                return n * int(inv)
    if name == "FloorDiv":
        return convert(args[0], leaf) // convert(args[1], leaf)
    if name in ("Mod", "PythonMod"):
        return convert(args[0], leaf) % convert(args[1], leaf)
    raise Unsupported(f"size expression {expr} ({name}) is not supported")


def _minmax(name, a, b):
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b) if name == "Min" else max(a, b)
    return te.minimum(a, b) if name == "Min" else te.maximum(a, b)


def to_te(expr, leaf) -> Expr | int:
    return convert(expr, leaf)


def evaluator(expr):
    """A function of the symbol values (a dict) that evaluates ``expr`` to an int."""
    if isinstance(expr, sympy.Integer):
        value = int(expr)
        return lambda vals: value
    if isinstance(expr, sympy.Symbol):
        return lambda vals: vals[expr]

    def run(vals):
        return convert(expr, lambda s: vals[s])

    return run


def te_const(value, dtype):
    """A typed (strong) TE constant."""
    return te.cast(value, dtype)
