"""OpInfo-style sweep of the lowered ATen ops: ``torch.compile(fn, backend="tailjit")`` against eager.

``OPS`` holds one entry per op (or overload family): a callable, an input
generator and the dtypes it allows.  A batch compiles every entry of a family
for one dtype, over contiguous, transposed and sliced inputs (random values
with NaN, inf and -0.0 planted in float inputs, broadcast operands, 0-d
operands), as one function: one Dynamo graph, one region, one C build.  The
default sweep packs the batch's results into one flat tensor per dtype (a C
kernel per output would dominate the run time); the slow sweep runs every
entry, dtype and layout on its own with every result a kernel output.

Each batch asserts that nothing fell back to eager (so a pass proves the
lowerings ran) and that the ATen ops an entry names in ``targets`` were in the
traced graph (so they were not decomposed into something else).  Dtypes,
shapes and NaN positions must match; integer and bool results, and entries
marked ``exact``, bit for bit.  ``differentiable`` marks the entries a
gradient sweep will cover.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._pytree import tree_leaves

import tailjit
import tailjit.frontend  # noqa: F401  (registers the backend)
from tailjit.codegen import PRELUDE_END
from tailjit.frontend.lower import lowering
from tailjit.frontend.lower.decompositions import decompositions
from tailjit.frontend.lower.index import EMPTY_CHECKS
from tailjit.frontend.plan.report import collect_reports
from tailjit.frontend.train import expr_grad
from tailjit.frontend.train.expr_grad import FAITHFUL, GradProbe, unchecked_ops

#: Every graph report of this module's tests (tailjit.frontend.REPORTS keeps the newest 64 only).
REPORTS: list = []


@pytest.fixture(autouse=True)
def _collect_reports():
    with collect_reports(REPORTS):
        yield


F32, F64, I64, I32, BOOL = torch.float32, torch.float64, torch.int64, torch.int32, torch.bool
FLOATS = (F32, F64)
NUM = FLOATS + (I64,)
ALL = NUM + (BOOL,)
INTS = (I64,)
LAYOUTS = ("contig", "transposed", "sliced")
#: the dimension size the zero-size sweep turns into 0
B = 4
NAN, INF = math.nan, math.inf


@dataclass(frozen=True)
class OpInfo:
    name: str
    family: str
    fn: Callable
    args: Callable  # args(make) -> tuple of input tensors
    dtypes: tuple = NUM
    targets: tuple = ()  # ATen overloads (as printed in the graph) that must reach the lowering
    exact: bool = False  # a copy or exact arithmetic: floats compared bit for bit too
    differentiable: bool = False
    empty: bool = True  # also swept with the size-B dimensions made 0
    tol: float | None = None  # float32 tolerance when looser than the default (ulp-level libm differences)
    values: bool = True  # False: only dtypes and shapes are defined (torch.empty)
    grad_special: bool = True  # False: the gradient sweep leaves NaN/inf out (eager's backward kernel and its
    # decomposition, which compiled graphs run, disagree there)


class Maker:
    """Random inputs in one dtype and layout; ``empty`` turns every size-B dimension into 0."""

    def __init__(self, dtype, layout, empty=False, gen=None, special=True):
        self.dtype, self.layout, self.empty, self.special = dtype, layout, empty, special
        self.gen = gen or torch.Generator().manual_seed(0)

    def shape(self, shape):
        return tuple(0 if (self.empty and s == B) else s for s in shape)

    def _lay(self, x):
        if self.layout == "transposed" and x.ndim >= 2:
            return x.transpose(-1, -2).contiguous().transpose(-1, -2)
        if self.layout in ("sliced", "transposed") and x.ndim >= 1:
            return torch.stack([x, torch.zeros_like(x)], -1)[..., 0]  # stride 2 in the last dimension
        return x

    def __call__(self, *shape, dtype=None, special=True, low=None, high=None, nonzero=False):
        dt = dtype or self.dtype
        special = special and self.special
        shape = self.shape(shape)
        g = self.gen
        if dt.is_floating_point:
            x = torch.randn(shape, generator=g, dtype=F64) * 3
            if low is not None:
                x = x.abs() + low
            x = x.to(dt)
            if special and x.numel() >= 8:
                flat = x.view(-1)
                pos = torch.randperm(x.numel(), generator=g)[:4]
                flat[pos] = torch.tensor([NAN, INF, -INF, -0.0], dtype=dt)
        elif dt == BOOL:
            x = torch.rand(shape, generator=g) > 0.5
        else:
            lo, hi = (-9 if low is None else low), (10 if high is None else high)
            x = torch.randint(lo, hi, shape, generator=g, dtype=dt)
            if nonzero:
                x = torch.where(x == 0, torch.ones_like(x), x)
        return self._lay(x)

    def index(self, *shape, n, negative=False):
        """int64 indices into a dimension of size ``n`` (from -n when ``negative``)."""
        x = torch.randint(-n if negative else 0, n, self.shape(shape), generator=self.gen)
        return self._lay(x)

    def mask(self, *shape):
        return self._lay(torch.rand(self.shape(shape), generator=self.gen) > 0.5)


OPS: list[OpInfo] = []


def op(name, family, fn, args, **kw):
    OPS.append(OpInfo(name, family, fn, args, **kw))


def x45(m):
    return (m(B, 5),)


def x456(m):
    return (m(B, 5, 6),)


# ---------------------------------------------------------------- unary (pointwise)

_UNARY = {
    "exp": torch.exp, "log": torch.log, "log1p": torch.log1p, "expm1": torch.expm1, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "erf": torch.erf, "log2": torch.log2, "log10": torch.log10, "exp2": torch.exp2,
    "reciprocal": torch.reciprocal, "atan": torch.atan,
}  # fmt: skip
for _n, _f in _UNARY.items():
    op(_n, "unary", _f, x45, dtypes=NUM, targets=(f"aten.{_n}.default",), differentiable=True, tol=2e-5)
for _n in ("abs", "floor", "ceil", "round", "trunc", "neg", "sign"):
    op(_n, "unary", getattr(torch, _n), x45, targets=(f"aten.{_n}.default",), exact=True, differentiable=True)
op("sgn", "unary", torch.sgn, x45, exact=True)
op("relu", "unary", torch.relu, x45, exact=True, differentiable=True)
op("isnan", "unary", torch.isnan, x45, dtypes=ALL, targets=("aten.isnan.default",))
op("isinf", "unary", torch.isinf, x45, dtypes=ALL, targets=("aten.isinf.default",))
op("isfinite", "unary", torch.isfinite, x45, dtypes=NUM)
op("logical_not", "unary", torch.logical_not, x45, dtypes=ALL, targets=("aten.logical_not.default",))
op("bitwise_not", "unary", torch.bitwise_not, x45, dtypes=INTS + (BOOL,), targets=("aten.bitwise_not.default",))
op("nan_to_num", "unary", torch.nan_to_num, x45, dtypes=FLOATS, exact=True)
op("nan_to_num_args", "unary", lambda x: torch.nan_to_num(x, nan=1.5, posinf=2.0, neginf=-3.0), x45, dtypes=FLOATS)
op("frac", "unary", torch.frac, x45, dtypes=FLOATS, differentiable=True)
op("square", "unary", torch.square, x45, targets=("aten.pow.Tensor_Scalar",), differentiable=True)
for _e in (0.5, 2, 3, -0.5, -1, -2, 1.7, 0, 1):
    op(f"pow_scalar_{_e}", "unary", lambda x, e=_e: x**e, x45, dtypes=FLOATS, targets=("aten.pow.Tensor_Scalar",),
       differentiable=True)  # fmt: skip
op("pow_int_scalar", "unary", lambda x: x**3, x45, dtypes=INTS, targets=("aten.pow.Tensor_Scalar",))
# no planted infinities: eager gelu(inf) is NaN on AVX-512 CPUs (a PyTorch bug)
op("gelu", "unary", F.gelu, lambda m: (m(B, 5, special=False),), dtypes=FLOATS, targets=("aten.gelu.default",),
   differentiable=True)  # fmt: skip
op("gelu_tanh", "unary", lambda x: F.gelu(x, approximate="tanh"), lambda m: (m(B, 5, special=False),), dtypes=FLOATS,
   differentiable=True)  # fmt: skip
op("leaky_relu", "unary", lambda x: F.leaky_relu(x, 0.2), x45, dtypes=FLOATS, targets=("aten.leaky_relu.default",),
   differentiable=True)  # fmt: skip
# Eager's hardtanh_backward and hardshrink_backward at NaN depend on the length (their vector path gives 0, their
# scalar tail passes the gradient through), so the gradient sweep leaves NaN out for them.
op("hardtanh", "unary", lambda x: F.hardtanh(x, -2.0, 1.5), x45, dtypes=FLOATS, targets=("aten.hardtanh.default",),
   differentiable=True, grad_special=False)  # fmt: skip
op("relu6", "unary", F.relu6, x45, dtypes=FLOATS, differentiable=True, grad_special=False)
op("elu", "unary", lambda x: F.elu(x, 0.7), x45, dtypes=FLOATS, targets=("aten.elu.default",), differentiable=True)
op("selu", "unary", F.selu, x45, dtypes=FLOATS, differentiable=True)
op("celu", "unary", F.celu, x45, dtypes=FLOATS, differentiable=True)
for _n in ("softplus", "silu", "mish", "hardsigmoid", "hardswish", "logsigmoid", "softsign", "tanhshrink"):
    op(_n, "unary", getattr(F, _n), x45, dtypes=FLOATS, differentiable=True)
op("threshold", "unary", lambda x: F.threshold(x, 0.1, 2.0), x45, dtypes=FLOATS, differentiable=True)
op("hardshrink", "unary", F.hardshrink, x45, dtypes=FLOATS, differentiable=True, grad_special=False)
# eager's logit_backward gives NaN at NaN, its decomposition 0 (Inductor's too)
op("logit", "unary", lambda x: torch.logit(x, 1e-3), x45, dtypes=FLOATS, differentiable=True, grad_special=False)
op("deg2rad", "unary", torch.deg2rad, x45, dtypes=FLOATS, differentiable=True)

# ---------------------------------------------------------------- binary (pointwise)


def ab(m):
    return m(B, 5), m(5)  # broadcast


def ab_col(m):
    return m(B, 5), m(B, 1)


def a_nz(m):
    return m(B, 5), m(5, nonzero=True)


def a0d(m):
    return m(B, 5), m(dtype=F64)  # a float64 0-d tensor: a scalar for type promotion


def a0d_int(m):
    return m(B, 5), m(dtype=I64)


for _n, _f in (("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("maximum", torch.maximum),
               ("minimum", torch.minimum)):  # fmt: skip
    op(_n, "binary", _f, ab, targets=(f"aten.{_n}.{'default' if 'imum' in _n else 'Tensor'}",), exact=True,
       differentiable=True)  # fmt: skip
# not exact: eager fuses a + alpha * b into an FMA in its vectorised loops only
op("add_alpha", "binary", lambda a, b: torch.add(a, b, alpha=2), ab_col, differentiable=True)
op("sub_alpha", "binary", lambda a, b: torch.sub(a, b, alpha=3), ab_col, differentiable=True)
op("add_scalar", "binary", lambda a: (a + 2, a * 0.5, 3 - a, a / 4, a + True), x45, differentiable=True)
op("add_0d", "binary", lambda a, s: (a + s, a * s, s - a, torch.maximum(a, s.to(a.dtype))), a0d)
op("add_0d_int", "binary", lambda a, s: (a + s, a * s, a - s, a == s), a0d_int)
op("0d_0d", "binary", lambda a, s: (a.sum() + s, (a.sum() * s).to(torch.float32)), a0d, dtypes=FLOATS)
op("div", "binary", torch.div, a_nz, targets=("aten.div.Tensor",), differentiable=True)
op("div_floor", "binary", lambda a, b: torch.div(a, b, rounding_mode="floor"), a_nz, targets=("aten.div.Tensor_mode",))
op("div_trunc", "binary", lambda a, b: torch.div(a, b, rounding_mode="trunc"), a_nz, targets=("aten.div.Tensor_mode",))
op("remainder", "binary", torch.remainder, a_nz, targets=("aten.remainder.Tensor",), differentiable=True)
op("remainder_scalar", "binary", lambda a: (torch.remainder(a, 3), torch.remainder(a, -2.5)), x45,
   targets=("aten.remainder.Scalar",), differentiable=True)  # fmt: skip
op("fmod", "binary", torch.fmod, a_nz, targets=("aten.fmod.Tensor",), exact=True)
op("fmod_scalar", "binary", lambda a: (torch.fmod(a, 3), torch.fmod(a, -2)), x45, targets=("aten.fmod.Scalar",),
   exact=True)  # fmt: skip
op("fmod_float_special", "binary", lambda a, b: torch.fmod(a, b), lambda m: (m(B, 5), m(B, 5)), dtypes=FLOATS,
   exact=True)  # fmt: skip
op("pow", "binary", torch.pow, lambda m: (m(B, 5, low=0.1), m(5)), dtypes=FLOATS, targets=("aten.pow.Tensor_Tensor",),
   differentiable=True)  # fmt: skip
op("pow_int", "binary", torch.pow, lambda m: (m(B, 5), m(5, low=0, high=5)), dtypes=INTS)
op("pow_scalar_base", "binary", lambda a: 2.5**a, x45, dtypes=FLOATS, targets=("aten.pow.Scalar",))
op("atan2", "binary", torch.atan2, ab, dtypes=FLOATS, targets=("aten.atan2.default",), differentiable=True)
op("hypot", "binary", torch.hypot, ab, dtypes=FLOATS, targets=("aten.hypot.default",), differentiable=True)
op("xlogy", "binary", torch.xlogy, ab, dtypes=FLOATS, differentiable=True)
op("bce_with_logits", "binary",
   lambda a, t: (F.binary_cross_entropy_with_logits(a, t, reduction="none"), F.binary_cross_entropy_with_logits(a, t)),
   lambda m: (m(B, 5), torch.sigmoid(m(B, 5))), dtypes=FLOATS, differentiable=True)  # fmt: skip
op("lerp", "binary", lambda a, b: torch.lerp(a, b, 0.3), ab, dtypes=FLOATS, differentiable=True)
op("lerp_tensor", "binary", lambda a, b, w: torch.lerp(a, b, w), lambda m: (m(B, 5), m(5), m(B, 1)), dtypes=FLOATS)
op("addcmul", "binary", lambda a, b, c: torch.addcmul(a, b, c, value=2), lambda m: (m(B, 5), m(5), m(B, 1)),
   differentiable=True)  # fmt: skip
op("addcdiv", "binary", lambda a, b, c: torch.addcdiv(a, b, c, value=0.5), lambda m: (m(B, 5), m(5), m(B, 1)),
   dtypes=FLOATS, differentiable=True)  # fmt: skip
for _n in ("eq", "ne", "lt", "le", "gt", "ge"):
    op(_n, "binary", getattr(torch, _n), ab, dtypes=ALL, targets=(f"aten.{_n}.Tensor",))
    op(f"{_n}_scalar", "binary", lambda a, n=_n: getattr(torch, n)(a, 1), x45, dtypes=ALL,
       targets=(f"aten.{_n}.Scalar",))  # fmt: skip
op("cmp_mixed", "binary", lambda a, b: (a < b, a == b), lambda m: (m(B, 5), m(5, dtype=F32)), dtypes=ALL)
for _n in ("logical_and", "logical_or", "logical_xor"):
    op(_n, "binary", getattr(torch, _n), ab, dtypes=ALL, targets=(f"aten.{_n}.default",))
for _n in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    op(_n, "binary", getattr(torch, _n), ab, dtypes=INTS + (BOOL,), targets=(f"aten.{_n}.Tensor",))


def shifts(m):
    return m(B, 5, low=-70, high=70), m(5, low=-3, high=66)


op("shift_left", "binary", lambda a, s: a << s, shifts, dtypes=INTS + (I32,), targets=("aten.__lshift__.Tensor",))
op("shift_right", "binary", lambda a, s: a >> s, shifts, dtypes=INTS + (I32,), targets=("aten.__rshift__.Tensor",))
op("shift_scalar", "binary", lambda a: (a << 3, a >> 2, torch.bitwise_left_shift(a, 62), a >> 70), x45,
   dtypes=INTS + (I32,))  # fmt: skip
op("bitwise_shift_fns", "binary", lambda a, s: (torch.bitwise_left_shift(a, s), torch.bitwise_right_shift(a, s)),
   shifts, dtypes=INTS)  # fmt: skip

# ---------------------------------------------------------------- select, clamp, masked_fill


op("where", "select", torch.where, lambda m: (m.mask(B, 5), m(B, 5), m(5)), dtypes=ALL, targets=("aten.where.self",),
   exact=True, differentiable=True)  # fmt: skip
op("where_scalars", "select", lambda c, a: (torch.where(c, a, 0), torch.where(c, 1.5, a), torch.where(c, 2, -1),
                                            torch.where(c, 0.5, 0)),
   lambda m: (m.mask(B, 5), m(B, 5)), dtypes=ALL, exact=True)  # fmt: skip
op("masked_fill", "select", lambda a, c: (a.masked_fill(c, 3), a.masked_fill(c, torch.tensor(-2))),
   lambda m: (m(B, 5), m.mask(5)), dtypes=ALL, exact=True, differentiable=True)  # fmt: skip
op("clamp", "select", lambda a: (a.clamp(-2, 3), a.clamp(min=0.5), a.clamp(max=-1)), x45, exact=True,
   differentiable=True)  # fmt: skip
op("clamp_min_max", "select", lambda a: (a.clamp_min(0.5), a.clamp_max(-1), a.clamp_min(0), F.relu6(a).clamp(0, 5)),
   x45, exact=True, differentiable=True)  # fmt: skip
op("clamp_tensor", "select", lambda a, lo, hi: (torch.clamp(a, lo, hi), torch.clamp(a, lo), torch.clamp(a, None, hi),
                                                a.clamp_min(lo), a.clamp_max(hi)),
   lambda m: (m(B, 5), m(5), m(B, 1)), exact=True, differentiable=True)  # fmt: skip
op("tril_triu", "select", lambda a: (a.tril(), a.triu(1), a.tril(-2)), x456, dtypes=ALL, exact=True,
   differentiable=True)  # fmt: skip

# ---------------------------------------------------------------- casts and fills


for _dt in (F32, F64, I64, I32, BOOL):
    op(f"to_{str(_dt)[6:]}", "cast", lambda a, dt=_dt: a.to(dt), lambda m: (m(B, 5),), dtypes=ALL + (I32,),
       targets=("aten._to_copy.default",), exact=True)  # fmt: skip
op("to_int_overflow", "cast", lambda a: (a.to(I32), a.to(I64)), lambda m: (m(B, 5) * 1e10,), dtypes=FLOATS,
   exact=True)  # fmt: skip
op("clone", "cast", lambda a: a.clone(), x45, dtypes=ALL, exact=True)
op("float_casts", "cast", lambda a: (a.float() * 2, a.double() - 1, a.to(F64 if a.dtype == F32 else F32) * 3), x45,
   dtypes=FLOATS, differentiable=True)  # fmt: skip
op("fills_times", "cast", lambda a: (torch.zeros_like(a) + a, torch.ones_like(a) * a, torch.full_like(a, 7) - a,
                                     torch.empty_like(a).fill_(2) * a, a.new_zeros(a.shape) + a.exp(),
                                     a * a.new_tensor([1.5, 2.0, -1.0, 0.5, 3.0])),
   x45, dtypes=FLOATS, differentiable=True)  # fmt: skip
op("fills", "cast", lambda a: (torch.zeros_like(a), torch.ones_like(a), torch.full_like(a, 7), a.new_full((2, 3), 2),
                               torch.zeros(3, dtype=a.dtype), torch.full((2,), True), torch.scalar_tensor(2.5)),
   x45, dtypes=ALL, exact=True)  # fmt: skip
op("empty", "cast", lambda a: (torch.empty_like(a), torch.empty(2, 3, dtype=a.dtype)), x45, dtypes=ALL, values=False)
op("arange_int", "cast", lambda a: (torch.arange(7), torch.arange(2, 9, 3), torch.arange(10, 0, -3),
                                    torch.arange(5, dtype=a.dtype) + a.sum()),
   x45, dtypes=NUM, exact=True)  # fmt: skip
# not exact: eager rounds some elements differently (see test_arange_float_formula)
op("arange_float", "cast", lambda a: (torch.arange(0, 1, 0.1), torch.arange(0.3, 10, 0.37),
                                      torch.arange(-5.1, 7.3, 0.013), torch.arange(1, 2.5, 0.5, dtype=F64),
                                      torch.arange(0.5, 5.5, 1.5, dtype=I64)),
   x45, dtypes=(F32,), empty=False)  # fmt: skip
op("linspace", "cast", lambda a: (torch.linspace(0, 1, 7), torch.linspace(-2, 3, 50, dtype=F64)), x45, dtypes=(F32,),
   empty=False)  # fmt: skip

# ---------------------------------------------------------------- reductions


def red_in(m):
    return (m(B, 5, 6),)


op("sum", "reduce", lambda x: (x.sum(), x.sum(1), x.sum((0, 2), keepdim=True)), red_in, dtypes=ALL,
   targets=("aten.sum.dim_IntList",), differentiable=True)  # fmt: skip
op("sum_dtype", "reduce", lambda x: x.sum(-1, dtype=F64), red_in, dtypes=ALL)
op("mean", "reduce", lambda x: (x.mean(), x.mean(1), x.mean((0, 2), keepdim=True)), red_in, dtypes=FLOATS,
   differentiable=True)  # fmt: skip
op("prod", "reduce", lambda x: (x.prod(1), x.prod()), lambda m: (m(B, 5, 3),), dtypes=NUM, differentiable=True)
op("amax_amin", "reduce", lambda x: (x.amax(1), x.amin((0, 2)), x.amax(-1, keepdim=True)), red_in, dtypes=ALL,
   exact=True, empty=False, differentiable=True)  # fmt: skip
op("max_min_all", "reduce", lambda x: (x.max(), x.min()), red_in, dtypes=ALL, exact=True, empty=False,
   targets=("aten.max.default", "aten.min.default"))  # fmt: skip
op("max_min_dim", "reduce", lambda x: (x.max(1), x.min(2, keepdim=True)), red_in, dtypes=NUM, exact=True,
   empty=False, differentiable=True)  # fmt: skip
op("argmax_argmin", "reduce", lambda x: (x.argmax(1), x.argmin(2, keepdim=True), x.argmax()), red_in, dtypes=NUM,
   empty=False)  # fmt: skip
op("any_all", "reduce", lambda x: (x.any(1), x.all(2), x.any(), x.all((0, 1))), red_in, dtypes=ALL)
op("count_nonzero", "reduce", lambda x: torch.count_nonzero(x, 1), red_in, dtypes=ALL)
op("var", "reduce", lambda x: (x.var(1), x.var((0, 2), keepdim=True, correction=0), x.var(), x.var(2, correction=7)),
   red_in, dtypes=FLOATS, targets=("aten.var.correction",), differentiable=True)  # fmt: skip
op("std", "reduce", lambda x: (x.std(1), x.std(-1, keepdim=True, correction=2.5)), red_in, dtypes=FLOATS,
   differentiable=True)  # fmt: skip
op("var_mean", "reduce", lambda x: (torch.var_mean(x, 2), torch.std_mean(x, 1, keepdim=True),
                                    torch.var_mean(x[:, 0].contiguous())),
   red_in, dtypes=FLOATS, targets=("aten.var_mean.correction",), differentiable=True)  # fmt: skip
op("logsumexp", "reduce", lambda x: (torch.logsumexp(x, 1), torch.logsumexp(x, (0, 2), keepdim=True)), red_in,
   dtypes=FLOATS, differentiable=True)  # fmt: skip
op("logsumexp_inf_rows", "reduce", lambda x: torch.logsumexp(x, 1),
   lambda m: (torch.tensor([[-INF, -INF, -INF], [INF, 1.0, 2.0], [INF, -INF, 0.0], [NAN, 1.0, 2.0], [1.0, 2.0, 3.0]],
                           dtype=m.dtype),), dtypes=FLOATS, empty=False)  # fmt: skip
op("nansum", "reduce", lambda x: (torch.nansum(x), torch.nansum(x, 1)), red_in, dtypes=FLOATS)
for _p in (2, 1, INF, -INF, 0, 3, 0.5):
    op(f"vector_norm_{_p}", "reduce", lambda x, p=_p: (torch.linalg.vector_norm(x, p),
                                                        torch.linalg.vector_norm(x, p, 1),
                                                        torch.linalg.vector_norm(x, p, (0, 2), keepdim=True)),
       red_in, dtypes=FLOATS, targets=("aten.linalg_vector_norm.default",), empty=not math.isinf(_p),
       differentiable=True)  # fmt: skip
op("norm_fns", "reduce", lambda x: (x.norm(), x.norm(p=1, dim=1), F.normalize(x, dim=-1)), red_in, dtypes=FLOATS,
   empty=False)  # fmt: skip
op("dot_mv_outer", "reduce", lambda a, v, w: (torch.dot(v, w), torch.mv(a, w), torch.outer(v, w), torch.vdot(v, w)),
   lambda m: (m(5, 6), m(6), m(6)), dtypes=FLOATS, differentiable=True)  # fmt: skip


def _filters(x, w1, w3, b3):
    """Convolutions with few products per output over one input channel each (lowered): a depthwise 1x3, a 3x3
    with padding, stride, dilation, bias and two output channels per group, a 1-d one."""
    c = x.size(1)
    return (
        F.conv2d(x, w1, groups=c),
        F.conv2d(x, w3, b3, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=c),
        F.conv1d(x[:, :, 0], w3[:, :, 0], padding=1, groups=c),
    )


op("conv", "reduce", _filters, lambda m: (m(B, 6, 7, 8), m(6, 1, 1, 3), m(12, 1, 3, 3), m(12)), dtypes=FLOATS,
   targets=("aten.convolution.default",), differentiable=True, tol=1e-5)  # fmt: skip
op("softmax", "reduce", lambda x: (torch.softmax(x, -1), torch.log_softmax(x, 1)), red_in, dtypes=FLOATS,
   targets=("aten._softmax.default",), differentiable=True)  # fmt: skip

# ---------------------------------------------------------------- views and movement


def v467(m):
    return (m(B, 6, 7),)


op("reshape", "view", lambda x: (x.reshape(-1), x.reshape(-1, 3, 7), x.flatten(1), x.unflatten(2, (7, 1))), v467,
   dtypes=ALL, exact=True, differentiable=True)  # fmt: skip
op("permute", "view", lambda x: (x.permute(2, 0, 1), x.transpose(0, 2), x.mT, torch.movedim(x, 0, -1)), v467,
   dtypes=ALL, exact=True, differentiable=True)  # fmt: skip
op("expand", "view", lambda x: (x[:, :1].expand(len(x), 3, 7), x[None].expand(2, -1, 6, 7),
                                torch.zeros(0, 1).expand(0, 3)),
   v467, dtypes=ALL, exact=True, differentiable=True)  # fmt: skip
op("slice_select", "view", lambda x: (x[:, 1:5:2], x[..., -3:], x[:, 2], x[:, -1], x[1:], x.narrow(2, 1, 3)), v467,
   dtypes=ALL, exact=True, differentiable=True)  # fmt: skip
op("squeeze", "view", lambda x: (x[:, :1].squeeze(1), x.unsqueeze(1), x[None].squeeze(0), x[:, :1].squeeze(),
                                 x[:, 0].t(), x[:, :1, :1].squeeze((1, 2))),
   v467, dtypes=ALL, exact=True, differentiable=True)  # fmt: skip
op("cat_stack", "view", lambda x: (torch.cat([x, x[:, :2]], 1), torch.stack([x, x], 0), torch.cat([x[:, 0], x[:, 1]])),
   v467, dtypes=ALL, exact=True, differentiable=True)  # fmt: skip
op("flip", "view", lambda x: (x.flip(0, 2), x.flip(-1), torch.rot90(x, 1, (1, 2))), v467, dtypes=ALL,
   targets=("aten.flip.default",), exact=True, differentiable=True)  # fmt: skip
op("roll", "view", lambda x: (x.roll((1, -2), (1, 2)), x.roll(3), x.roll(9, 2)), v467, dtypes=ALL, exact=True,
   differentiable=True)  # fmt: skip
op("split", "view", lambda x: (x.split(2, 1), x.split([1, 5], 1), x.chunk(3, 2), x.unbind(1), x.tensor_split(3, 2)),
   v467, dtypes=ALL, targets=("aten.split_with_sizes.default",), exact=True, differentiable=True)  # fmt: skip
op("repeat", "view", lambda x: (x.repeat(2, 1, 1, 2), x[:, :1].repeat(1, 3, 1), x.tile(2)), v467, dtypes=ALL,
   targets=("aten.repeat.default",), exact=True, differentiable=True)  # fmt: skip
op("pad", "view", lambda x: (F.pad(x, (1, -1, 2, 0)), F.pad(x, (-2, 3), value=2.5), F.pad(x, (0, 0, 0, 0, 1, 1))),
   v467, dtypes=FLOATS, targets=("aten.constant_pad_nd.default",), exact=True, differentiable=True)  # fmt: skip


def _edge_pads(mode):
    return lambda x: (F.pad(x, (2, 3), mode=mode), F.pad(x[None], (1, 2, 3, 1), mode=mode),
                      F.pad(x[None, None], (1, 0, 2, 2, 0, 1), mode=mode))  # fmt: skip


op("pad_reflect", "view", _edge_pads("reflect"), v467, dtypes=FLOATS, exact=True, differentiable=True, empty=False,
   targets=tuple(f"aten.reflection_pad{d}d.default" for d in (1, 2, 3)))  # fmt: skip
op("pad_replicate", "view", _edge_pads("replicate"), v467, dtypes=FLOATS, exact=True, differentiable=True,
   empty=False, targets=tuple(f"aten.replication_pad{d}d.default" for d in (1, 2, 3)))  # fmt: skip
op("pad_int", "view", lambda x: F.pad(x, (2, 1, -1, -2), value=-3), v467, dtypes=(I64, BOOL) if False else INTS,
   exact=True)  # fmt: skip
op("diagonal", "view", lambda x: (x.diagonal(1, 1, 2), x.diagonal(-2, 1, 2), x.diagonal(0, 0, 2), torch.diag(x[:, 0])),
   v467, dtypes=ALL, targets=("aten.diagonal.default",), exact=True, differentiable=True)  # fmt: skip
op("unfold", "view", lambda x: (x.unfold(2, 3, 2), x.unfold(1, 6, 1), x.unfold(2, 1, 3)), v467, dtypes=ALL,
   targets=("aten.unfold.default",), exact=True, differentiable=True)  # fmt: skip
op("as_strided", "view", lambda x: ((x * 1).contiguous().as_strided((3, 4), (2, 3)),
                                    (x + 0).contiguous().as_strided((2, 2, 3), (1, 5, 7), 4)),
   lambda m: (m(5, 6, 7),), dtypes=FLOATS + INTS, targets=("aten.as_strided.default",), exact=True)  # fmt: skip

# ---------------------------------------------------------------- indexing and injective scatters


def xi(m):
    return m(B, 6, 7), m.index(3, n=6, negative=True), m.index(2, 3, n=7, negative=True)


op("index_select", "index", lambda x, i, j: (x.index_select(1, i % 6), x.index_select(2, j[0] % 7)), xi,
   dtypes=ALL, targets=("aten.index_select.default",), exact=True, differentiable=True)  # fmt: skip
op("index_tensor", "index", lambda x, i, j, y, k: (x[:, i], x[:, i, j[0]], x[..., j], x[:, i[:, None], j[0]], x[1:3, i],
                                                   y[k, :, j[1, :2]], y[k[:, None], 2:, j[:, :2]], y[-1, i]),
   lambda m: xi(m) + (m(5, 6, 7), m.index(2, n=5, negative=True)), dtypes=ALL, targets=("aten.index.Tensor",),
   exact=True, differentiable=True)  # fmt: skip
op("index_int32", "index", lambda x, i, j: x[:, i.to(I32)], xi, dtypes=FLOATS, exact=True)
op("gather", "index", lambda x, g: (x.gather(2, g), torch.take_along_dim(x, g, 2)),
   lambda m: (m(B, 6, 7), m.index(B, 6, 3, n=7)), dtypes=ALL, targets=("aten.gather.default",), exact=True,
   differentiable=True)  # fmt: skip
op("nll_loss", "index", lambda x, t: (F.nll_loss(F.log_softmax(x, 1), t), F.nll_loss(x, t, reduction="sum"),
                                      F.nll_loss(x, t, reduction="none"), F.cross_entropy(x, t, ignore_index=2),
                                      F.nll_loss(x, t, weight=torch.linspace(0.5, 2, 6, dtype=x.dtype))),
   lambda m: (m(B, 6), m.index(B, n=6)), dtypes=FLOATS, differentiable=True)  # fmt: skip
op("embedding", "index", lambda w, i: F.embedding(i, w), lambda m: (m(9, B), m.index(2, 3, n=9)), dtypes=FLOATS,
   exact=True, differentiable=True)  # fmt: skip
op("one_hot", "index", lambda i: F.one_hot(i, 7), lambda m: (m.index(B, 3, n=7),), dtypes=(I64,), exact=True)
op("masked_index_put", "index", lambda x, c: (x.index_put((c,), torch.tensor(0, dtype=x.dtype)),
                                               x.index_put((c[:, :, 0],), torch.tensor(1, dtype=x.dtype)),
                                               x.index_put((c,), torch.tensor(2, dtype=x.dtype), accumulate=True)),
   lambda m: (m(B, 6, 7), m.mask(B, 6, 7)), dtypes=NUM, targets=("aten.index_put.default",), exact=True)  # fmt: skip
op("select_scatter", "index", lambda x: (torch.select_scatter(x, x[:, 0] * 2, 1, -1),
                                         torch.select_scatter(x, x[:, :, 0] + 1, 2, 3)),
   v467, dtypes=NUM, exact=True, differentiable=True)  # fmt: skip
op("slice_scatter", "index", lambda x: (torch.slice_scatter(x, x[:, ::2] * 3, 1, 0, None, 2),
                                        torch.slice_scatter(x, x[:, 1:4] + 1, 1, 1, 4),
                                        torch.slice_scatter(x, x[..., -2:] * 0, 2, -2)),
   v467, dtypes=NUM, targets=("aten.slice_scatter.default",), exact=True, differentiable=True)  # fmt: skip


def _copy_into_views(x, s):
    """``copy_`` into views of fresh tensors: a slice, a broadcast row, a cast source."""
    y = x * 1
    y[:, 1:3] = s[:, :2]
    z = x + 0
    z[:, 1, 2:5].copy_(s[:1, 0, :3])
    w = x * 2
    w[1:, 4].copy_(s[:-1, 0, :].to(torch.float32 if x.dtype == torch.float64 else torch.float64))
    return y, z, w


op("copy_into_views", "index", _copy_into_views, lambda m: (m(B, 6, 7), m(B, 6, 7)), dtypes=FLOATS,
   exact=True, differentiable=True)  # fmt: skip
op("diagonal_scatter", "index", lambda x: (torch.diagonal_scatter(x, x.diagonal(1, 1, 2) * 2, 1, 1, 2),
                                           torch.diagonal_scatter(x, x.diagonal(-2, 1, 2) + 1, -2, 1, 2)),
   v467, dtypes=NUM, targets=("aten.diagonal_scatter.default",), exact=True, differentiable=True)  # fmt: skip

# ---------------------------------------------------------------- scans (te.scan)


op("cumsum", "scan", lambda x: (x.cumsum(1), x.cumsum(0), x.cumsum(-1, dtype=F64), x.flip(2).cumsum(2).flip(2)), x456,
   dtypes=ALL, targets=("aten.cumsum.default",), differentiable=True)  # fmt: skip
op("cumprod", "scan", lambda x: (x.cumprod(1), x.cumprod(-1)), lambda m: (m(B, 5, 6, low=1, high=3),), dtypes=NUM,
   targets=("aten.cumprod.default",), differentiable=True)  # fmt: skip
op("cummax_cummin", "scan", lambda x: (torch.cummax(x, 1), torch.cummin(x, 2), torch.cummax(x, 0)), x456, dtypes=ALL,
   targets=("aten.cummax.default", "aten.cummin.default"), exact=True, differentiable=True)  # fmt: skip
op("logcumsumexp", "scan", lambda x: (torch.logcumsumexp(x, 1), torch.logcumsumexp(x, 2)), x456, dtypes=FLOATS,
   targets=("aten.logcumsumexp.default",), differentiable=True)  # fmt: skip

# ---------------------------------------------------------------- scatters (te.scatter)


def xs(m):
    """x, a scatter index along dim 2 (duplicates included), and a source."""
    return m(B, 6, 7), m.index(B, 6, 3, n=7), m(B, 6, 3)


op("scatter", "scatter", lambda x, g, s: (x.scatter(2, g, s), x.scatter(2, g, 2), x.scatter(1, g % 6, s)), xs,
   dtypes=ALL, targets=("aten.scatter.src", "aten.scatter.value"), exact=True, differentiable=True)  # fmt: skip
op("scatter_reduce_arg", "scatter", lambda x, g, s: (x.scatter(2, g, s, reduce="add"),
                                                     x.scatter(2, g, 3, reduce="multiply")),
   xs, dtypes=NUM, targets=("aten.scatter.reduce", "aten.scatter.value_reduce"))  # fmt: skip
op("scatter_add", "scatter", lambda x, g, s: x.scatter_add(2, g, s), xs, dtypes=NUM,
   targets=("aten.scatter_add.default",), differentiable=True)  # fmt: skip
for _r in ("sum", "prod", "mean", "amax", "amin"):
    op(f"scatter_reduce_{_r}", "scatter", lambda x, g, s, r=_r: (x.scatter_reduce(2, g, s, r),
                                                                 x.scatter_reduce(2, g, s, r, include_self=False)),
       xs, dtypes=NUM, targets=("aten.scatter_reduce.two",), exact=_r in ("amax", "amin"),
       differentiable=True)  # fmt: skip


def xp(m):
    """x, distinct indices into dim 0, indices into dims 0 and 1 with duplicates (negative ones count from the
    end), and values."""
    perm = torch.randperm(6, generator=m.gen)[:3] - 3
    return (m(6, 7, B), perm, m.index(5, n=6, negative=True), m.index(5, n=7, negative=True), m(3, 7, B), m(5, 7, B),
            m(5, B))  # fmt: skip


op("index_put", "scatter", lambda x, p, d, e, v, w, w2: (x.index_put((p,), v), x.index_put((p,), v[0, 0]),
                                                         x.index_put((d,), w, accumulate=True),
                                                         x.index_put((d, e), w2, accumulate=True)),
   xp, dtypes=NUM, targets=("aten.index_put.default",), differentiable=True)  # fmt: skip


def xd(m):
    return m(B, 6, 7), m.index(5, n=6), torch.randperm(6, generator=m.gen)[:3], m.index(4, n=7, negative=True)


op("index_add_copy_fill", "scatter", lambda x, d, p, e: (x.index_add(1, d, x[:, :5] * 2, alpha=2),
                                                         x.index_copy(1, p, x[:, :3] + 1), x.index_fill(2, e, -1.5),
                                                         x.index_fill(1, p[0], x.sum())),
   xd, dtypes=NUM, targets=("aten.index_add.default", "aten.index_copy.default", "aten.index_fill.int_Scalar"),
   differentiable=True)  # fmt: skip
op("masked_scatter", "scatter", lambda x, c, c2, s: (x.masked_scatter(c, s), x.masked_scatter(c2, s)),
   lambda m: (m(B, 6, 7), m.mask(B, 6, 7), m.mask(6, 7), m(B, 6, 7)), dtypes=ALL,
   targets=("aten.masked_scatter.default",), exact=True, differentiable=True)  # fmt: skip


def _setitem(x, p, c):
    y = x.clone()
    y[:, p] = 0
    y[c] = 1
    y[:, 1] = 2
    y[..., 2:4] = 3
    return y


op("setitem", "scatter", _setitem, lambda m: (m(B, 6, 7), torch.randperm(6, generator=m.gen)[:3], m.mask(B, 6, 7)),
   dtypes=NUM, exact=True, differentiable=True)  # fmt: skip

FAMILIES = sorted({o.family for o in OPS})


# ---------------------------------------------------------------- running and comparing


def _compare(name, got, want, exact, tol=None, values=True):
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype}, eager {want.dtype}"
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)}, eager {tuple(want.shape)}"
    if not values:
        return
    if want.dtype.is_floating_point:
        if exact:
            kw = dict(rtol=0, atol=0)
        elif want.dtype == F32:
            kw = dict(rtol=tol or 1e-5, atol=1e-5)
        else:
            kw = dict(rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(got, want, equal_nan=True, msg=lambda m: f"{name}: {m}", **kw)
    else:
        assert torch.equal(got, want), f"{name}: {got} != eager {want}"


#: calls compiled together: fusion's planning time grows faster than linearly with a region's size, so a
#: family's batch is compiled in chunks (each one Dynamo graph, one region, one C build)
CHUNK = 16


def run_batch(entries, dtype, layouts=LAYOUTS, empty=False, pack=True):
    """Compile ``entries`` for ``dtype`` over ``layouts`` (a chunk of calls per graph) and compare with eager."""
    calls = []
    gen = torch.Generator().manual_seed(1234)
    for o in entries:
        for layout in layouts:
            calls.append((o, layout, o.args(Maker(dtype, layout, empty, gen))))
    reports = []
    for k in range(0, len(calls), CHUNK):
        reports += _run_calls(calls[k : k + CHUNK], dtype, pack)
    return reports


def _run_calls(calls, dtype, pack):
    flat, spans = [], []
    for _, _, args in calls:
        spans.append((len(flat), len(flat) + len(args)))
        flat.extend(args)

    def results(*xs):
        return [tree_leaves(o.fn(*xs[a:b])) for (o, _, _), (a, b) in zip(calls, spans)]

    def fn(*xs):
        leaves = [r for rs in results(*xs) for r in rs]
        if not pack:
            return leaves
        groups = {}
        for r in leaves:
            groups.setdefault(r.dtype, []).append(r.reshape(-1))
        return [torch.cat(g) for g in groups.values()]

    torch._dynamo.reset()  # every chunk is the same code object: no recompile limit
    REPORTS.clear()
    got = torch.compile(fn, backend="tailjit")(*[x.clone() for x in flat])
    reports = list(REPORTS)
    assert reports, "the backend was not called"
    for r in reports:
        assert r.eager_reason is None, r.eager_reason
    # (an op on an empty tensor whose indices ATen checks stays ATen's: test_fuzz_found.py checks those)
    fallbacks = [str(f) for r in reports for f in r.fallbacks if EMPTY_CHECKS not in str(f)]
    assert not fallbacks, f"not lowered: {fallbacks}"
    aten = "\n".join(r.aten for r in reports)
    for o, _, _ in calls:
        for t in o.targets:
            assert t in aten, f"{o.name}: {t} is not in the ATen graph"

    want = results(*flat)
    if pack:  # unpack per dtype, in the order fn packed them
        packed = dict(zip(dict.fromkeys(r.dtype for rs in want for r in rs), got))
        cursor = dict.fromkeys(packed, 0)
        unpacked = []
        for rs in want:
            row = []
            for r in rs:
                c = cursor[r.dtype]
                row.append(packed[r.dtype][c : c + r.numel()].reshape(r.shape))
                cursor[r.dtype] = c + r.numel()
            unpacked.append(row)
    else:
        it = iter(got)
        unpacked = [[next(it) for _ in rs] for rs in want]
    for (o, layout, _), g, w in zip(calls, unpacked, want):
        assert len(g) == len(w)
        for k, (gk, wk) in enumerate(zip(g, w)):
            _compare(f"{o.name}[{layout}, {dtype}, output {k}]", gk, wk, o.exact, o.tol, o.values)
    return reports


def _entries(family, dtype, empty=False):
    return [o for o in OPS if o.family == family and dtype in o.dtypes and (o.empty or not empty)]


#: the default sweep: every layout in float32, one (non-contiguous where it can be) per other dtype
DEFAULT_LAYOUTS = {F32: LAYOUTS, F64: ("transposed",), I64: ("sliced",), BOOL: ("contig",)}


@pytest.mark.parametrize("dtype", list(DEFAULT_LAYOUTS), ids=str)
@pytest.mark.parametrize("family", FAMILIES)
def test_family(family, dtype):
    entries = _entries(family, dtype)
    if not entries:
        pytest.skip(f"no {family} op takes {dtype}")
    run_batch(entries, dtype, DEFAULT_LAYOUTS[dtype])


@pytest.mark.parametrize("family", FAMILIES)
def test_family_zero_size(family):
    entries = _entries(family, F32, empty=True) or _entries(family, I64, empty=True)
    run_batch(entries, entries[0].dtypes[0] if F32 not in entries[0].dtypes else F32, ("contig",), empty=True)


def run_gradients(entries, dtype, layout):
    """Forward and backward of ``entries`` compiled together through AOTAutograd (the backward graphs
    AOTAutograd derives, lowered by tailjit; tailjit's own gradients have the expression sweep below),
    against eager autograd: every float input's gradient for random output gradients, with no extern call
    in either graph."""
    gen = torch.Generator().manual_seed(99)
    calls = [(o, o.args(Maker(dtype, layout, gen=gen, special=o.grad_special))) for o in entries]

    def leaves(args):
        return [x.detach().clone().requires_grad_(x.is_floating_point()) for x in args]

    def per_op(fn_calls, arg_lists):
        return [
            [r.reshape(-1) for r in tree_leaves(o.fn(*a)) if r.requires_grad] for (o, _), a in zip(fn_calls, arg_lists)
        ]

    def run(fn_calls, arg_lists):
        return torch.cat([r for outs in per_op(fn_calls, arg_lists) for r in outs])

    eager_args = [leaves(a) for _, a in calls]
    want = run(calls, eager_args)
    sizes = [sum(r.numel() for r in outs) for outs in per_op(calls, eager_args)]
    head = torch.randn(want.shape, generator=gen, dtype=want.dtype)
    want.backward(head)

    spans, flat = [], []
    for args in eager_args:
        spans.append((len(flat), len(flat) + len(args)))
        flat += [x.detach().clone().requires_grad_(x.requires_grad) for x in args]

    def fn(*xs):
        return run(calls, [xs[a:b] for a, b in spans])

    torch._dynamo.reset()
    REPORTS.clear()
    with mock.patch.object(expr_grad, "FAITHFUL", frozenset()):  # this sweep checks AOTAutograd's graphs
        got = torch.compile(fn, backend="tailjit")(*flat)
        got.backward(head)
    kinds = [r.kind for r in REPORTS]
    assert "forward" in kinds and "backward" in kinds, kinds
    fallbacks = [f"{r.kind}: {f}" for r in REPORTS for f in r.fallbacks]
    assert not fallbacks, f"not lowered: {fallbacks}"
    for (o, _), g, w in zip(calls, got.detach().split(sizes), want.detach().split(sizes)):
        _compare(o.name, g, w, o.exact, o.tol, o.values)
    for i, ((o, _), args) in enumerate(zip(calls, eager_args)):
        a, b = spans[i]
        _compare_gradients(o.name, flat[a:b], args, dtype)


def _compare_gradients(name, got, want, dtype):
    """The gradients in ``got``'s inputs against eager's in ``want``'s (none where eager has none)."""
    tol = dict(rtol=1e-7, atol=1e-9) if dtype == F64 else dict(rtol=1e-4, atol=1e-5)
    for k, (x, y) in enumerate(zip(got, want)):
        what = f"{name} grad {k}"
        if y.grad is None:
            assert x.grad is None or not x.grad.any(), f"{what}: a gradient where eager has none"
            continue
        torch.testing.assert_close(x.grad, y.grad, equal_nan=True, msg=lambda m, w=what: f"{w}: {m}", **tol)


GRAD_FAMILIES = sorted({o.family for o in OPS if o.differentiable})


@pytest.mark.parametrize("family", GRAD_FAMILIES)
def test_family_gradients(family):
    """The backward half of the sweep: float64, transposed inputs, planted NaN/inf, one compile per chunk."""
    entries = [o for o in _entries(family, F64) if o.differentiable]
    for k in range(0, len(entries), CHUNK // 2):
        run_gradients(entries[k : k + CHUNK // 2], F64, "transposed")


@pytest.mark.slow
@pytest.mark.parametrize("family", GRAD_FAMILIES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_family_gradients_float32(family, layout):
    entries = [o for o in _entries(family, F32) if o.differentiable]
    for k in range(0, len(entries), CHUNK // 2):
        run_gradients(entries[k : k + CHUNK // 2], F32, layout)


def _probe_ops(o, args) -> set:
    """The ops autograd sees when ``o`` runs eagerly on ``args``."""
    with GradProbe() as probe:
        o.fn(*args)
    return probe.ops


def _grad_args(o, dtype, layout):
    gen = torch.Generator().manual_seed(99)
    args = o.args(Maker(dtype, layout, gen=gen, special=o.grad_special))
    return gen, [x.detach().clone().requires_grad_(x.is_floating_point()) for x in args]


#: the gradient sweep of tailjit.jit's own gradients: float64 with transposed inputs by default, float32 in the
#: slow run
EXPRESSION_CASES = [(F64, "transposed"), (F32, "contig")]


def run_expression_gradients(entries, dtype, layout):
    """Each entry alone through ``tailjit.jit`` in training: the route (tailjit's expression gradients, or
    AOTAutograd) is the one FAITHFUL predicts from the ops autograd sees, and values and gradients match
    eager either way."""
    for o in entries:
        gen, eager_args = _grad_args(o, dtype, layout)
        outs = tree_leaves(o.fn(*eager_args))
        keep = [k for k, r in enumerate(outs) if r.requires_grad]
        want = torch.cat([outs[k].reshape(-1) for k in keep])
        head = torch.randn(want.shape, generator=gen, dtype=want.dtype)
        want.backward(head)

        def fn(*xs, o=o, keep=keep):
            rs = tree_leaves(o.fn(*xs))
            return torch.cat([rs[k].reshape(-1) for k in keep])

        args = [x.detach().clone().requires_grad_(x.requires_grad) for x in eager_args]
        expected = not unchecked_ops(_probe_ops(o, [x.detach().requires_grad_(x.requires_grad) for x in eager_args]))
        with collect_reports() as reports:
            got = tailjit.jit(fn)(*args)
            got.backward(head)
        took = not any(r.kind == "forward" for r in reports)  # AOTAutograd's route always has a forward graph
        assert took == expected, f"{o.name}: {[r.note for r in reports]}"
        _compare(o.name, got.detach(), want.detach(), o.exact, o.tol, o.values)
        _compare_gradients(f"{o.name} ({'expression' if took else 'AOTAutograd'})", args, eager_args, dtype)


@pytest.mark.parametrize("family", GRAD_FAMILIES)
def test_expression_gradients(family):
    dtype, layout = EXPRESSION_CASES[0]
    run_expression_gradients([o for o in _entries(family, dtype) if o.differentiable], dtype, layout)


@pytest.mark.slow
@pytest.mark.parametrize("family", GRAD_FAMILIES)
def test_expression_gradients_float32(family):
    dtype, layout = EXPRESSION_CASES[1]
    run_expression_gradients([o for o in _entries(family, dtype) if o.differentiable], dtype, layout)


def test_every_faithful_op_is_checked_by_the_sweep():
    """Each op of FAITHFUL is used by an entry of the expression-gradient sweep that takes tailjit's route."""
    covered = set()
    for o in OPS:
        for dtype, layout in EXPRESSION_CASES:
            if o.differentiable and dtype in o.dtypes:
                ops = _probe_ops(o, _grad_args(o, dtype, layout)[1])
                if not unchecked_ops(ops):
                    covered |= ops
    assert not FAITHFUL - covered, sorted(map(str, FAITHFUL - covered))


def test_a_lowering_declares_its_gradient_faithful_at_registration(monkeypatch):
    monkeypatch.setattr(lowering, "LOWERINGS", {})
    monkeypatch.setattr(lowering, "FAITHFUL", set())
    faithful, other = torch.ops.aten.exp.default, torch.ops.aten.exp.out
    lowering.register(faithful, faithful=True)(lambda L, x: x)
    lowering.register(other)(lambda L, x: x)
    assert set(lowering.LOWERINGS) == {faithful, other}
    assert lowering.FAITHFUL == {faithful}


def test_decomposed_faithful_ops_have_no_lowering():
    """A decomposed op of DECOMPOSED_FAITHFUL that gains a lowering declares its faithfulness there instead."""
    assert not expr_grad.DECOMPOSED_FAITHFUL & set(lowering.LOWERINGS)
    assert expr_grad.DECOMPOSED_FAITHFUL <= set(decompositions())
    assert FAITHFUL is lowering.FAITHFUL


def test_every_entry_names_a_family_and_dtypes():
    names = [o.name for o in OPS]
    assert len(names) == len(set(names)), "duplicate entry names"
    for o in OPS:
        assert o.dtypes and all(isinstance(d, torch.dtype) for d in o.dtypes), o.name


_CASES = [(f, dt, lay) for f in FAMILIES for dt in ALL + (I32,) for lay in LAYOUTS if _entries(f, dt)]


@pytest.mark.slow
@pytest.mark.parametrize("family,dtype,layout", _CASES, ids=[f"{f}-{str(d)[6:]}-{lay}" for f, d, lay in _CASES])
def test_family_unpacked(family, dtype, layout):
    """The cross product: every family, dtype and layout, with every result a kernel output of its own."""
    run_batch(_entries(family, dtype), dtype, (layout,), pack=False)


@pytest.mark.slow
@pytest.mark.parametrize("family,dtype", sorted({(f, d) for f, d, _ in _CASES}, key=str), ids=str)
def test_family_zero_size_every_dtype(family, dtype):
    entries = _entries(family, dtype, empty=True)
    if entries:
        run_batch(entries, dtype, ("transposed",), empty=True, pack=False)


def test_symbolic_sizes():
    """One graph under dynamic=True serves several sizes for the new lowerings (no recompile, no extern call)."""

    def fn(x, i, c, g):
        n = x.shape[0]
        return (x.flip(0), x.roll(2, 0), x.split(2, 1), x.repeat(2, 1), F.pad(x, (1, -1, 2, 1)), x.diagonal(),
                x.tril(), x.unfold(1, 2, 1), x.index_select(0, i % n), x[i], x.gather(1, g), x.var(0),
                torch.var_mean(x, 1), torch.linalg.vector_norm(x, 3, 0), torch.fmod(x, 1.5), x.cumsum(0),
                torch.cummax(x, 0), x.scatter_add(1, g, x[:, :2]), x.index_put((i,), x[0], accumulate=True),
                torch.slice_scatter(x, x[1:] * 2, 0, 1), torch.diagonal_scatter(x, x.diagonal() * 0),
                x.masked_fill(c, 2), x.masked_scatter(c, x * 3), torch.arange(0.0, n, 0.5),
                x.split([1, n - 1], 0))  # fmt: skip

    compiled = _compiled_dynamic(fn)
    REPORTS.clear()
    gen = torch.Generator().manual_seed(0)
    for n in (5, 7, 9):
        x = torch.randn(n, 4, generator=gen)
        args = (x, torch.randint(-n, n, (3,), generator=gen), torch.rand(n, 4, generator=gen) > 0.5,
                torch.randint(0, 4, (n, 2), generator=gen))  # fmt: skip
        got, want = tree_leaves(compiled(*args)), tree_leaves(fn(*args))
        for k, (g, w) in enumerate(zip(got, want)):
            _compare(f"n={n} output {k}", g, w, exact=False)
    (r,) = REPORTS
    assert r.kernels and not r.fallbacks, r.fallbacks


def _compiled_dynamic(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="tailjit", dynamic=True)


# ---------------------------------------------------------------- dedicated checks


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="tailjit")


def test_arange_float_formula():
    """Float arange is start + i * step in float64, rounded once. Eager's vectorised kernel rounds each
    block's first element to the result type and adds lanes to it (with FMAs, and blocks that depend on the
    thread count), so it agrees to an ulp of the largest value."""
    ranges = [(0.0, 1.0, 0.1), (0.3, 10.0, 0.37), (-5.1, 7.3, 0.013), (1e6, 1e6 + 50, 0.7), (2.0, -3.0, -0.25)]
    for dt in FLOATS:

        def fn(x, dt=dt):
            return [torch.arange(a, b, c, dtype=dt) + x for a, b, c in ranges]

        REPORTS.clear()
        got = _compiled(fn)(torch.zeros((), dtype=dt))
        assert REPORTS and not [f for r in REPORTS for f in r.fallbacks]
        for (a, b, c), g in zip(ranges, got):
            ref = (a + c * torch.arange(len(g), dtype=F64)).to(dt)  # every step in float64, one rounding
            assert torch.equal(g, ref), (a, b, c, dt)
            w = torch.arange(a, b, c, dtype=dt)
            # eager rounds each vector block's first value to the result type: 1 ulp of the largest value
            assert g.shape == w.shape and bool(((g - w).abs() <= torch.finfo(dt).eps * max(abs(a), abs(b))).all())


def _same_error(fn, *args):
    """Compiled and eager raise the same exception type (the compiled graph's kernel guards)."""
    with pytest.raises(Exception) as eager:
        fn(*args)
    with pytest.raises(type(eager.value)):
        _compiled(fn)(*args)


def test_index_out_of_range_raises_like_eager():
    x = torch.randn(4, 5)
    for bad in (torch.tensor([0, 4]), torch.tensor([-5, 1])):
        _same_error(lambda x, i: x[i] * 2, x, bad)
        _same_error(lambda x, i: x[:, i] + 1, x.t(), bad)
    _same_error(lambda x, i: x.index_select(0, i) + 1, x, torch.tensor([1, -1]))
    _same_error(lambda x, i: F.embedding(i, x) * 2, x, torch.tensor([[0, 4]]))
    # within range (negative indices wrap): no error, same values
    i = torch.tensor([-4, 3, -1])
    torch.testing.assert_close(_compiled(lambda x, i: x[i] * 2)(x, i), x[i] * 2)


def test_gather_out_of_range_raises_like_eager():
    """Eager gather raises RuntimeError; the kernel's guard raises IndexError and the backend reruns the
    region eagerly to raise PyTorch's own error."""
    x = torch.randn(4, 5)
    _same_error(lambda x, i: x.gather(1, i) + 1, x, torch.tensor([[0, 5]] * 4))
    _same_error(lambda x, i: x.gather(1, i) + 1, x, torch.tensor([[0, -1]] * 4))


def test_integer_division_by_zero_raises_like_eager():
    a = torch.tensor([3, -7, 5])
    b = torch.tensor([1, 0, 2])
    _same_error(lambda a, b: torch.fmod(a, b) + 1, a, b)
    _same_error(lambda a, b: a // b + 1, a, b)


def test_scatter_out_of_range_raises_like_eager():
    x, src = torch.zeros(3, 4), torch.ones(2, 4)
    for bad in (torch.tensor([[0, 3, 1, 0]]), torch.tensor([[0, -1, 1, 0]])):
        _same_error(lambda x, i, s: x.scatter(0, i, s[:1]) + 1, x, bad, src)
        _same_error(lambda x, i, s: x.scatter_add(0, i, s[:1]) * 2, x, bad, src)
    for bad in (torch.tensor([0, 3]), torch.tensor([-4, 0])):
        _same_error(lambda x, i, s: x.index_put((i,), s) + 1, x, bad, src)
    _same_error(lambda x, i, s: x.index_add(0, i, s) + 1, x, torch.tensor([-1, 0]), src)  # eager: no wrapping
    _same_error(lambda x, i, s: x.index_copy(0, i, s) + 1, x, torch.tensor([0, 3]), src)
    _same_error(lambda x, m, s: x.masked_scatter(m, s) + 1, x, torch.ones(3, 4, dtype=BOOL), src)  # source too small


def test_integer_mean_raises_like_eager():
    _same_error(lambda x: x.mean() + 1, torch.arange(6))


def test_data_dependent_shapes_stay_extern():
    """x[mask] has a data-dependent size: it stays outside the compiled regions, which still run."""
    x = torch.randn(5, 4)
    REPORTS.clear()
    got = _compiled(lambda x: (x * 2)[x > 0].exp())(x)
    torch.testing.assert_close(got, (x * 2)[x > 0].exp())
    assert REPORTS and all(r.kernels for r in REPORTS)


def test_as_strided_reads_the_storage_of_views():
    """as_strided of a view reads its base's storage, as in eager (also outside the view's own elements)."""
    x = torch.randn(4, 6)

    def fn(x):
        y = x * 2
        return (y.t().as_strided((3, 2), (1, 3)) + 1, (x + 1).t().as_strided((2, 5), (5, 1), 3),
                y[:, ::2].as_strided((2, 2), (3, 1)) + 1, y[1:, 2:].as_strided((3, 3), (6, 1)) + 1,
                y.split(2, 1)[1].as_strided((2, 4), (6, 1)) + 1,
                y.expand(2, 4, 6).as_strided((5,), (4,), 1) + 1)  # fmt: skip

    REPORTS.clear()
    for g, w in zip(_compiled(fn)(x), fn(x)):
        torch.testing.assert_close(g, w)
    assert REPORTS and not [f for r in REPORTS for f in r.fallbacks]


def test_one_update_per_slice_scatters_fuse_and_check_their_indices():
    """A scatter along a dimension with one index per slice (gather's backward, one-hot targets) is an
    element-wise select that fuses with its base and its consumer, -0.0 in untouched elements included;
    an index out of range still raises eager's error."""
    x = torch.randn(6, 5)
    x[0, 1] = -0.0
    i, s = torch.tensor([[3], [0], [4], [1], [3], [2]]), torch.randn(6, 1)

    def fn(x, i, s):
        return (x.scatter_add(1, i, s) * 2, x.scatter(1, i, s).exp(), x.scatter(1, i, 1.5) + 1,
                torch.zeros_like(x).scatter_(1, i, 1.0, reduce="multiply"))  # fmt: skip

    REPORTS.clear()
    got = _compiled(fn)(x, i, s)
    for k, (g, w) in enumerate(zip(got, fn(x, i, s))):
        if k == 1:  # a vectorised expf may differ from torch's in the last place
            torch.testing.assert_close(g, w, rtol=3e-7, atol=0)
        else:
            assert torch.equal(g, w) and torch.equal(g.signbit(), w.signbit())
    (r,) = [r for r in REPORTS if r.kernels]
    assert not r.fallbacks and "scatter" not in r.kernels[0][0].describe()
    for bad in (torch.tensor([[0], [5], [1], [1], [1], [1]]), torch.tensor([[0], [-1], [1], [1], [1], [1]])):
        _same_error(lambda x, i, s: x.scatter_add(1, i, s) * 2, x, bad, s)
        _same_error(lambda x, i, s: x.scatter(1, i, s) * 2, x, bad, s)


_BOUNDS = st.sampled_from([None, -math.inf, -1.5, -0.0, 0.0, 2.0, math.inf, math.nan])
_SPECIAL = st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 0.0, -1.5, 2.0, 0.25, -7.0])


@settings(max_examples=25, deadline=None)
@given(_BOUNDS, _BOUNDS, st.lists(_SPECIAL, min_size=6, max_size=6), st.sampled_from([torch.float32, torch.float64]))
def test_clamps_to_number_bounds_follow_eager_on_special_values(lo, hi, values, dtype):
    """A clamp to a number drops its NaN arm in C (``codegen._drop_clamp_nan_arms``) unless the bound is NaN
    or a comparison reads the clamp (the inner one of two bounds): values (NaN, infinities, signed zeros, a
    bound equal to an element) and gradients (none through a NaN or a clamped element) stay eager's."""
    if lo is None and hi is None:
        lo = 0.0
    x = torch.tensor(values, dtype=dtype)

    def fn(x):
        return (x * 1.0).clamp(lo, hi) * 3

    for entry in (_compiled, tailjit.jit):
        REPORTS.clear()
        xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
        got, want = entry(fn)(xa), fn(xb)
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.signbit(), want.signbit())
        torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(xa.grad, xb.grad, equal_nan=True, rtol=0, atol=0)
        sources = [k.source.partition(PRELUDE_END)[2] for r in REPORTS for k, _ in r.kernels]
        nan_bound = any(b is not None and math.isnan(b) for b in (lo, hi))
        if nan_bound or lo is None or hi is None:  # the forward kernel's C
            assert ("NAN" in sources[0]) == nan_bound, sources[0]
