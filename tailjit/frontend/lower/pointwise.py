"""Element-wise ATen ops: math, comparisons, logic, shifts, where, clamp, activations, casts, fills.

Operands are cast to the dtype PyTorch computes in (``result_type``: 0-d
tensors and Python scalars count like PyTorch's "wrapped" operands) before the
op is applied, so the result has exactly the node's dtype, as in TensorIterator.
"""

from __future__ import annotations

import math

import torch

from tailjit import te
from tailjit.frontend.lower.lowering import UNDECOMPOSED, load_bcast, refuse_bool, register, result_type, scalar_arg
from tailjit.frontend.lower.stop_gradient import STOP_GRADIENT
from tailjit.frontend.lower.symbolic import Unsupported

aten = torch.ops.aten
F64 = te.float64


def compute_dtype(L, operands):
    """The dtype the node computes in: the operands' promoted dtype, lifted to the result's float
    dtype for ops that turn integers into floats (``sqrt(int)``, ``int / int``)."""
    ct = result_type(*operands)
    out = L.out_dtype()
    if out.is_float and not ct.is_float:
        ct = out
    return ct


def pointwise(L, operands, f, cast=True):
    """The node's output: ``f`` of the operands' elements (cast to the compute dtype unless
    ``cast`` is False), broadcast to the node's shape."""
    for o in operands:
        if not isinstance(o, (te.Tensor, int, float, bool, te.Expr)):
            raise Unsupported(f"operand {o!r} is not a tensor or a scalar")
    ct = compute_dtype(L, operands) if cast else None

    def body(idx):
        vals = [load_bcast(o, idx) for o in operands]
        if ct is not None:
            vals = [te.cast(v, ct) for v in vals]
        return f(*vals)

    return L.compute(L.out_shape(), body)


def signbit(x):
    """Whether float ``x`` is negative, -0.0 included (NaN counts as positive)."""
    return (x < 0) | ((x == 0) & (1 / x < 0))


#: Ops eager has no bool kernel for, whose meta functions take a bool tensor all the same
_NO_BOOL = {aten.abs.default, aten.floor.default, aten.ceil.default, aten.trunc.default, aten.round.default,
            aten.relu.default}  # fmt: skip


def _unary(op, f, faithful=False):
    @register(op, faithful=faithful)
    def lower(L, x):
        if op in _NO_BOOL:
            refuse_bool(x, what=str(op))
        return pointwise(L, [x], f)


for _name in "exp log log1p expm1 sqrt rsqrt sin cos tan tanh sigmoid erf abs floor ceil trunc".split():
    _unary(getattr(aten, _name).default, getattr(te, _name), faithful=True)
_unary(aten.round.default, te.round, faithful=True)
_unary(aten.isnan.default, te.isnan)
_unary(aten.isinf.default, te.isinf)
_unary(aten.neg.default, lambda x: -x, faithful=True)
_unary(aten.reciprocal.default, lambda x: 1 / x, faithful=True)


def _tie(x, bound):
    """``x`` where it equals the number ``bound``, as constants (no gradient, even an inf one): eager's clamps
    keep the operand at a tie, which for a zero bound is ``x``'s own signed zero, else the bound itself."""
    if bound != 0 or not x.dtype.is_float:
        return te.cast(bound, x.dtype)
    return te.select(1 / x < 0, te.cast(-0.0, x.dtype), te.cast(0.0, x.dtype))


def _below(x, bound, otherwise):
    """``bound`` where ``x < bound``, ``x`` at a tie (no gradient there, as torch's ``threshold_backward``
    and ``hardtanh_backward``), else ``otherwise`` (NaN included)."""
    return te.select(x <= bound, te.select(x < bound, te.cast(bound, x.dtype), _tie(x, bound)), otherwise)


def _above(x, bound, otherwise):
    return te.select(x >= bound, te.select(x > bound, te.cast(bound, x.dtype), _tie(x, bound)), otherwise)


# selects, not maximum(x, 0): relu(-0.0) is -0.0 as in eager, the gradient is threshold_backward's (0 at
# x = 0, where maximum splits the tie) and NaN passes through
_unary(aten.relu.default, lambda x: _below(x, 0, x), faithful=True)
_unary(aten.logical_not.default, lambda x: x == 0)
_unary(aten.bitwise_not.default, lambda x: ~x)


# torch's gradient is a zero that the ops before multiply (0 * inf is NaN); the lowering's selects give none
@register(aten.sign.default, faithful=False)
def _sign(L, x):
    def f(v):
        if v.dtype.is_bool:
            return v
        # (0 < v) - (v < 0), as PyTorch: NaN and -0.0 give 0
        return te.select(v > 0, te.cast(1, v.dtype), te.select(v < 0, te.cast(-1, v.dtype), te.cast(0, v.dtype)))

    return pointwise(L, [x], f)


def _exact_log(base):
    """log2 / log10. float32 goes through float64 and rounds once; float64 divides by ln(base) and
    snaps to the integer k when base**k is exactly x, so exact powers give exact results, as libm."""
    inv = 1 / math.log(base)

    def f(v):
        if v.dtype == te.float32:
            return te.cast(te.log(te.cast(v, F64)) * inv, te.float32)
        r = te.log(v) * inv
        k = te.round(r)
        return te.select(te.pow(float(base), k) == v, k, r)

    return f


# not faithful: the expression's gradient at -0.0 is not eager's
_unary(aten.log2.default, _exact_log(2), faithful=False)
_unary(aten.log10.default, _exact_log(10), faithful=False)
_unary(aten.exp2.default, lambda v: te.pow(te.cast(2, v.dtype), v), faithful=True)
# the vectorised atan2 (libmvec), whose gradient in y at x = 1 is atan's, 1 / (1 + y * y)
_unary(aten.atan.default, lambda v: te.atan2(v, te.cast(1, v.dtype)), faithful=True)


# not faithful: autodiff sends the incoming gradient through each term of the product rule (inf * 0 in one of
# them at a large x, NaN), where eager's gelu_backward (AOTAutograd's backward, its decomposition lowered)
# multiplies it by the derivative as one factor
@register(aten.gelu.default, faithful=False)
def _gelu(L, x, approximate="none"):
    if approximate == "none":
        return pointwise(L, [x], lambda v: 0.5 * v * (1 + te.erf(v * math.sqrt(0.5))))
    if approximate == "tanh":
        k = math.sqrt(2 / math.pi)
        return pointwise(L, [x], lambda v: 0.5 * v * (1 + te.tanh(k * (v + 0.044715 * v * v * v))))
    raise Unsupported(f"gelu approximate={approximate!r}")


@register(aten.leaky_relu.default, faithful=True)
def _leaky_relu(L, x, negative_slope=0.01):
    slope = scalar_arg(negative_slope, "negative_slope")
    return pointwise(L, [x], lambda v: te.select(v > 0, v, v * slope))


@register(aten.hardtanh.default, faithful=True)
def _hardtanh(L, x, min_val=-1, max_val=1):
    lo, hi = scalar_arg(min_val), scalar_arg(max_val)

    # PyTorch's forward is clamp(v, lo, hi) (a tie keeps v, -0.0 included; NaN passes through), its
    # backward passes nothing at a tie
    def f(v):
        return _below(v, lo, _above(v, hi, v))

    return pointwise(L, [x], f)


@register(aten.elu.default, faithful=True)
def _elu(L, x, alpha=1, scale=1, input_scale=1):
    a, s, i = scalar_arg(alpha), scalar_arg(scale), scalar_arg(input_scale)
    neg, pos = a * s, s
    return pointwise(L, [x], lambda v: te.select(v <= 0, te.expm1(v * i) * neg, v * pos))


# faithful: lowered whole, where its decomposition's ``where`` over separate tensors gave the branch not taken
# ``0 * inf`` where ``exp`` overflows
@register(aten.softplus.default, faithful=True)
def _softplus(L, x, beta=1, threshold=20):
    """PyTorch's kernel, in one expression: its decomposition's ``where`` over separate tensors would give
    the branch not taken a gradient of ``0 * inf`` (NaN) where ``exp`` overflows."""
    b, t = scalar_arg(beta), scalar_arg(threshold)
    return pointwise(L, [x], lambda v: te.select(v * b > t, v, te.log1p(te.exp(v * b)) / b))


UNDECOMPOSED.add(aten.softplus.default)


def _binary(ops, f, faithful=False):
    @register(*ops, faithful=faithful)
    def lower(L, a, b):
        return pointwise(L, [a, b], f)


def _alpha(f):
    def lower(L, a, b, alpha=1):
        if alpha == 1:
            return pointwise(L, [a, b], f)
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
            raise Unsupported(f"alpha={alpha!r}")
        return pointwise(L, [a, b], lambda x, y: f(x, y * te.cast(alpha, y.dtype)))

    return lower


_add = _alpha(lambda a, b: a + b)
register(aten.add.Tensor, faithful=True)(_add)
register(aten.add.Scalar)(_add)
_sub = _alpha(lambda a, b: a - b)


@register(aten.sub.Tensor, faithful=True)
@register(aten.sub.Scalar)
def _sub_not_bool(L, a, b, alpha=1):
    refuse_bool(a, b, what="sub")  # (the meta function only refuses two bool tensors)
    return _sub(L, a, b, alpha)


_binary((aten.mul.Tensor,), lambda a, b: a * b, faithful=True)
_binary((aten.mul.Scalar,), lambda a, b: a * b)
_binary((aten.div.Tensor,), lambda a, b: a / b, faithful=True)
_binary((aten.div.Scalar,), lambda a, b: a / b)
_binary((aten.remainder.Tensor, aten.remainder.Scalar), lambda a, b: a % b, faithful=True)
_binary((aten.maximum.default,), te.maximum, faithful=True)
_binary((aten.minimum.default,), te.minimum, faithful=True)
_binary((aten.atan2.default,), te.atan2, faithful=True)
for _name, _f in (("eq", lambda a, b: a == b), ("ne", lambda a, b: a != b), ("lt", lambda a, b: a < b),
                  ("le", lambda a, b: a <= b), ("gt", lambda a, b: a > b), ("ge", lambda a, b: a >= b)):  # fmt: skip
    _binary((getattr(aten, _name).Tensor, getattr(aten, _name).Scalar), _f)
_binary((aten.logical_and.default,), lambda a, b: (a != 0) & (b != 0))
_binary((aten.logical_or.default,), lambda a, b: (a != 0) | (b != 0))
_binary((aten.logical_xor.default,), lambda a, b: (a != 0) ^ (b != 0))
_binary((aten.bitwise_and.Tensor, aten.bitwise_and.Scalar), lambda a, b: a & b)
_binary((aten.bitwise_or.Tensor, aten.bitwise_or.Scalar), lambda a, b: a | b)
_binary((aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar), lambda a, b: a ^ b)


def _pow_scalar(x, e):
    """x ** e for a Python exponent, with the special cases of PyTorch's CPU kernel (which
    round differently from, and for -inf and -0.0 differ from, a call to pow)."""
    if not x.dtype.is_float:
        return te.pow(x, te.cast(e, x.dtype))
    one = te.cast(1, x.dtype)
    special = {0.5: lambda: te.sqrt(x), 2: lambda: x * x, 3: lambda: x * x * x, -0.5: lambda: te.rsqrt(x),
               -1: lambda: one / x, -2: lambda: one / (x * x), 0: lambda: one, 1: lambda: x}  # fmt: skip
    if e in special:
        return special[e]()
    return te.pow(x, te.cast(e, x.dtype))


@register(aten.pow.Tensor_Scalar, faithful=True)
def _pow_ts(L, x, e):
    e = scalar_arg(e, "exponent")
    if not L.out_dtype().is_float and isinstance(e, int) and e < 0:
        raise Unsupported("integer to a negative integer power (PyTorch raises)")
    return pointwise(L, [x, e], lambda v, ev: _pow_scalar(v, e))


@register(aten.pow.Tensor_Tensor, faithful=True)
@register(aten.pow.Scalar)
def _pow(L, a, b):
    return pointwise(L, [a, b], te.pow)


@register(aten.fmod.Tensor, aten.fmod.Scalar)
def _fmod(L, a, b):
    def f(x, y):
        if x.dtype.is_float:
            # C fmod: the magnitude is |x| mod |y| (both positive, so floor and truncation agree), x's sign
            m = te.abs(x) % te.abs(y)
            return te.select(signbit(x), -m, m)
        r = x % y  # floor remainder (raises on y == 0); truncation differs when the signs differ
        return te.select((r != 0) & ((r < 0) != (x < 0)), r - y, r)

    return pointwise(L, [a, b], f)


def _shift(left):
    def f(x, s):
        if not x.dtype.is_int:
            raise Unsupported("shift of a non-integer tensor")
        bits = x.dtype.bits
        zero, minus1 = te.cast(0, x.dtype), te.cast(-1, x.dtype)
        two = te.cast(2, x.dtype)
        if left:
            # x * 2**s wraps exactly like the unsigned shift PyTorch does; out-of-range shifts give 0
            return te.select((s < 0) | (s >= bits), zero, x * te.pow(two, s))
        # arithmetic shift = floor division by 2**s (2**(bits-1) would overflow: that case is the sign)
        return te.select((s < 0) | (s >= bits - 1), te.select(x < 0, minus1, zero), x // te.pow(two, s))

    return f


for _left, _name in ((True, "left"), (False, "right")):
    _shift_ops = (getattr(aten, f"bitwise_{_name}_shift"), getattr(aten, f"__{_name[0]}shift__"))
    _binary([getattr(_shift_ops[0], o) for o in ("Tensor", "Tensor_Scalar", "Scalar_Tensor")]
            + [_shift_ops[1].Tensor, _shift_ops[1].Scalar], _shift(_left))  # fmt: skip


@register(aten.hypot.default, faithful=False)  # the expression's gradient at -0.0 is not eager's
def _hypot(L, a, b):
    if not L.out_dtype().is_float:
        raise Unsupported("hypot of integers (eager raises)")  # the meta function lets them through

    def f(x, y):
        inf = te.cast(math.inf, x.dtype)
        if x.dtype == te.float32:  # no overflow or underflow in float64, one rounding at the end
            h = te.cast(te.sqrt(te.cast(x, F64) * te.cast(x, F64) + te.cast(y, F64) * te.cast(y, F64)), te.float32)
        else:
            ax, ay = te.abs(x), te.abs(y)
            hi, lo = te.maximum(ax, ay), te.minimum(ax, ay)
            r = lo / hi
            # hi == 0 would give 0 / 0
            h = te.select(hi == 0, te.cast(0, x.dtype), hi * te.sqrt(1 + r * r))
        return te.select(te.isinf(x) | te.isinf(y), inf, h)  # hypot(inf, nan) is inf

    return pointwise(L, [a, b], f)


def _trunc_div(a, b):
    if a.dtype.is_float:
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


@register(aten.where.self, faithful=True)
@register(aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(L, c, a, b):
    ct = result_type(a, b)
    if ct != L.out_dtype():
        raise Unsupported(f"where computes in {ct}, PyTorch gives {L.out_dtype()}")

    def body(idx):
        cv = load_bcast(c, idx)
        if not isinstance(cv, te.Expr) or not cv.dtype.is_bool:
            raise Unsupported("where condition is not a bool tensor")
        return te.select(cv, te.cast(load_bcast(a, idx), ct), te.cast(load_bcast(b, idx), ct))

    return L.compute(L.out_shape(), body)


def _at_least(x, lo):
    """torch's clamp_min on floats as selects: NaN stays NaN (a constant, so that no gradient flows
    there), and the gradient is clamp_backward's ``where(x >= lo, grad, 0)`` (maximum would split a tie
    and pass a NaN's)."""
    if not x.dtype.is_float:
        return te.maximum(x, lo)
    return te.select(x < lo, lo, te.select(x >= lo, x, te.cast(math.nan, x.dtype)))


def _at_most(x, hi):
    if not x.dtype.is_float:
        return te.minimum(x, hi)
    return te.select(x > hi, hi, te.select(x <= hi, x, te.cast(math.nan, x.dtype)))


def _clamp_fn(lo, hi, low, high):
    def f(x, *bounds):
        it = iter(bounds)
        if lo is not None:
            x = low(x, next(it))
        if hi is not None:
            x = high(x, next(it))
        return x

    return f


@register(aten.clamp.default, faithful=True)
def _clamp(L, x, min=None, max=None):  # noqa: A002
    return pointwise(L, [x] + [v for v in (min, max) if v is not None], _clamp_fn(min, max, _at_least, _at_most))


# tensor bounds keep maximum/minimum: their gradients are not torch's
@register(aten.clamp.Tensor, faithful=False)
def _clamp_tensor(L, x, min=None, max=None):  # noqa: A002
    return pointwise(L, [x] + [v for v in (min, max) if v is not None], _clamp_fn(min, max, te.maximum, te.minimum))


@register(aten.clamp_min.default, faithful=True)
def _clamp_min(L, x, lo):
    return pointwise(L, [x, lo], _at_least)


@register(aten.clamp_max.default, faithful=True)
def _clamp_max(L, x, hi):
    return pointwise(L, [x, hi], _at_most)


@register(aten.clamp_min.Tensor, faithful=False)  # as clamp.Tensor
def _clamp_min_tensor(L, x, lo):
    return pointwise(L, [x, lo], te.maximum)


@register(aten.clamp_max.Tensor, faithful=False)  # as clamp.Tensor
def _clamp_max_tensor(L, x, hi):
    return pointwise(L, [x, hi], te.minimum)


def _check_placement(device=None, layout=None, memory_format=None):
    if device is not None and torch.device(device).type != "cpu":
        raise Unsupported(f"device {device}")
    if layout not in (None, torch.strided):
        raise Unsupported(f"layout {layout}")


@register(aten._to_copy.default, faithful=True)
def _to_copy(L, x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    _check_placement(device, layout)
    dt = L.out_dtype()
    # C casts are PyTorch's: float -> int truncates, nonzero (NaN included) -> True
    return pointwise(L, [x], lambda v: te.cast(v, dt), cast=False)


@register(torch.ops.prims.convert_element_type.default)
def _convert(L, x, dtype):
    dt = L.out_dtype()
    return pointwise(L, [x], lambda v: te.cast(v, dt), cast=False)


@register(aten.copy.default, faithful=True)
def _copy_into(L, x, src, non_blocking=False):
    """The functional ``copy_``: ``src`` broadcast to ``x``'s shape, in ``x``'s dtype."""
    dt = L.out_dtype()
    return L.compute(L.out_shape(), lambda idx: te.cast(load_bcast(src, idx), dt))


@register(aten.clone.default, faithful=True)
@register(aten.alias.default, aten.lift_fresh_copy.default, aten.detach.default)
def _copy(L, x, memory_format=None):
    return pointwise(L, [x], lambda v: v)


@register(STOP_GRADIENT)
def _stop_gradient(L, x):
    """A ``detach()``: the value, through which tailjit's gradients pass nothing."""
    return te.stop_gradient(x, name=f"{L.node.name}_nograd")


def _fill(L, value):
    if not isinstance(value, (int, float, bool, te.Expr)):
        raise Unsupported(f"fill value {value!r}")
    dt = L.out_dtype()
    return L.compute(L.out_shape(), lambda idx: te.cast(value, dt))


@register(aten.full.default)
def _full(L, size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    _check_placement(device, layout)
    return _fill(L, fill_value)


@register(aten.full_like.default, faithful=True)
def _full_like(L, x, fill_value, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _check_placement(device, layout)
    return _fill(L, fill_value)


@register(
    aten.empty.memory_format,
    aten.empty_permuted.default,
    aten.empty_strided.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
)
def _empty(L, size, *args, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    # uninitialised memory may hold anything; zeros are as good as any (outputs are contiguous, so the
    # requested strides or permutation are not kept)
    _check_placement(device, layout)
    return _fill(L, 0)


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
    for v in (start, step):
        if not isinstance(v, (int, float, te.Expr)) or isinstance(v, bool):
            raise Unsupported("arange with a symbolic float start/step")
    if dt.is_int:
        # PyTorch converts start and step to the (integer) result type first
        s0, st = (te.cast(math.trunc(v) if isinstance(v, float) else v, te.int64) for v in (start, step))
        return L.compute(L.out_shape(), lambda idx: te.cast(s0 + idx[0] * st, dt))
    if not dt.is_float:
        raise Unsupported(f"arange of {dt}")
    # start + step * i in float64 (PyTorch's accumulate type), rounded once to the result type
    s0, st = te.cast(start, F64), te.cast(step, F64)
    return L.compute(L.out_shape(), lambda idx: te.cast(s0 + st * te.cast(idx[0], F64), dt))
