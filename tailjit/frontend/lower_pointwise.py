"""Element-wise ATen ops: math, comparisons, logic, where, clamp, casts, fills."""

from __future__ import annotations

import math

import torch

from tailjit import te
from tailjit.frontend.lowering import load_bcast, register
from tailjit.frontend.symbolic import Unsupported

aten = torch.ops.aten


def pointwise(L, operands, f):
    """The node's output: ``f`` of the operands' elements, broadcast to the node's shape."""
    for o in operands:
        if not isinstance(o, (te.Tensor, int, float, bool, te.Expr)):
            raise Unsupported(f"operand {o!r} is not a tensor or a scalar")
    return L.compute(L.out_shape(), lambda idx: f(*(load_bcast(o, idx) for o in operands)))


def _unary(op, f):
    @register(op)
    def lower(L, x):
        return pointwise(L, [x], f)


for _name in "exp log log1p expm1 sqrt rsqrt sin cos tan tanh sigmoid erf abs floor ceil trunc".split():
    _unary(getattr(aten, _name).default, getattr(te, _name))
_unary(aten.round.default, te.round)
_unary(aten.isnan.default, te.isnan)
_unary(aten.isinf.default, te.isinf)
_unary(aten.neg.default, lambda x: -x)
_unary(aten.reciprocal.default, lambda x: 1 / x)
_unary(aten.relu.default, lambda x: te.maximum(x, 0))
_unary(aten.logical_not.default, lambda x: x == 0)
_unary(aten.bitwise_not.default, lambda x: ~x)


@register(aten.gelu.default)
def _gelu(L, x, approximate="none"):
    if approximate == "none":
        return pointwise(L, [x], lambda v: 0.5 * v * (1 + te.erf(v * math.sqrt(0.5))))
    if approximate == "tanh":
        k = math.sqrt(2 / math.pi)
        return pointwise(L, [x], lambda v: 0.5 * v * (1 + te.tanh(k * (v + 0.044715 * v * v * v))))
    raise Unsupported(f"gelu approximate={approximate!r}")


def _binary(ops, f):
    @register(*ops)
    def lower(L, a, b):
        return pointwise(L, [a, b], f)


def _alpha(f):
    def lower(L, a, b, alpha=1):
        if alpha == 1:
            return pointwise(L, [a, b], f)
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
            raise Unsupported(f"alpha={alpha!r}")
        return pointwise(L, [a, b], lambda x, y: f(x, y * alpha))

    return lower


register(aten.add.Tensor, aten.add.Scalar)(_alpha(lambda a, b: a + b))
register(aten.sub.Tensor, aten.sub.Scalar)(_alpha(lambda a, b: a - b))
_binary((aten.mul.Tensor, aten.mul.Scalar), lambda a, b: a * b)
_binary((aten.div.Tensor, aten.div.Scalar), lambda a, b: a / b)
_binary((aten.remainder.Tensor, aten.remainder.Scalar), lambda a, b: a % b)
_binary((aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar), te.pow)
_binary((aten.maximum.default,), te.maximum)
_binary((aten.minimum.default,), te.minimum)
_binary((aten.atan2.default,), te.atan2)
for _name, _f in (("eq", lambda a, b: a == b), ("ne", lambda a, b: a != b), ("lt", lambda a, b: a < b),
                  ("le", lambda a, b: a <= b), ("gt", lambda a, b: a > b), ("ge", lambda a, b: a >= b)):  # fmt: skip
    _binary((getattr(aten, _name).Tensor, getattr(aten, _name).Scalar), _f)
_binary((aten.logical_and.default,), lambda a, b: (a != 0) & (b != 0))
_binary((aten.logical_or.default,), lambda a, b: (a != 0) | (b != 0))
_binary((aten.logical_xor.default,), lambda a, b: (a != 0) ^ (b != 0))
_binary((aten.bitwise_and.Tensor, aten.bitwise_and.Scalar), lambda a, b: a & b)
_binary((aten.bitwise_or.Tensor, aten.bitwise_or.Scalar), lambda a, b: a | b)
_binary((aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar), lambda a, b: a ^ b)


def _trunc_div(a, b):
    a, b = te.expr.as_expr(a), te.expr.as_expr(b)
    dt = te.dtypes.promote(a.dtype, a.weak, b.dtype, b.weak)[0]
    if dt.is_float:
        return te.trunc(a / b)
    q = a // b
    # floor and truncation differ when the division is inexact and the signs differ
    return te.select((q * b != a) & ((a < 0) != (b < 0)), q + 1, q)


@register(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(L, a, b, rounding_mode=None):
    if rounding_mode is None:
        return pointwise(L, [a, b], lambda x, y: x / y)
    if rounding_mode == "floor":
        return pointwise(L, [a, b], lambda x, y: x // y)
    if rounding_mode == "trunc":
        return pointwise(L, [a, b], _trunc_div)
    raise Unsupported(f"rounding_mode={rounding_mode!r}")


@register(aten.where.self)
def _where(L, c, a, b):
    def f(cv, av, bv):
        if not cv.dtype.is_bool:
            raise Unsupported("where condition is not bool")
        return te.select(cv, av, bv)

    return pointwise(L, [c, a, b], f)


def _clamp_fn(lo, hi):
    def f(x, *bounds):
        it = iter(bounds)
        if lo is not None:
            x = te.maximum(x, next(it))
        if hi is not None:
            x = te.minimum(x, next(it))
        return x

    return f


@register(aten.clamp.default, aten.clamp.Tensor)
def _clamp(L, x, min=None, max=None):  # noqa: A002
    return pointwise(L, [x] + [v for v in (min, max) if v is not None], _clamp_fn(min, max))


@register(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(L, x, lo):
    return pointwise(L, [x, lo], te.maximum)


@register(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(L, x, hi):
    return pointwise(L, [x, hi], te.minimum)


def _check_placement(device=None, layout=None, memory_format=None):
    if device is not None and torch.device(device).type != "cpu":
        raise Unsupported(f"device {device}")
    if layout not in (None, torch.strided):
        raise Unsupported(f"layout {layout}")


@register(aten._to_copy.default)
def _to_copy(L, x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    _check_placement(device, layout)
    dt = L.out_dtype()
    return pointwise(L, [x], lambda v: te.cast(v, dt))


@register(torch.ops.prims.convert_element_type.default)
def _convert(L, x, dtype):
    dt = L.out_dtype()
    return pointwise(L, [x], lambda v: te.cast(v, dt))


@register(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default, aten.detach.default)
def _copy(L, x, memory_format=None):
    return pointwise(L, [x], lambda v: v)


def _fill(L, value):
    if not isinstance(value, (int, float, bool)):
        raise Unsupported(f"fill value {value!r}")
    dt = L.out_dtype()
    return L.compute(L.out_shape(), lambda idx: te.cast(value, dt))


@register(aten.full.default)
def _full(L, size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    _check_placement(device, layout)
    return _fill(L, fill_value)


@register(aten.full_like.default)
def _full_like(L, x, fill_value, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _check_placement(device, layout)
    return _fill(L, fill_value)


@register(aten.scalar_tensor.default)
def _scalar_tensor(L, value, dtype=None, layout=None, device=None, pin_memory=None):
    _check_placement(device, layout)
    return _fill(L, value)


@register(aten.arange.default, aten.arange.start, aten.arange.start_step)
def _arange(L, *args, dtype=None, layout=None, device=None, pin_memory=None):
    _check_placement(device, layout)
    start, step = 0, 1
    if len(args) == 1:
        (end,) = args
    elif len(args) == 2:
        start, end = args
    else:
        start, end, step = args
    dt = L.out_dtype()
    if not dt.is_int or not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, step)):
        raise Unsupported("arange with a float or symbolic start/step")
    return L.compute(L.out_shape(), lambda idx: te.cast(start + idx[0] * step, dt))
