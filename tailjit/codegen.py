"""Render a partitioned, scheduled program as one C translation unit.

The unit holds one function per kernel (its loop nest over a range of the
outermost loop), a dispatcher per kernel that runs it serially or across
OpenMP threads depending on the work, and ``tj_call``: the CPython entry
point (METH_FASTCALL) that validates the arguments, binds the symbolic sizes,
allocates outputs and temporaries and runs the kernels.  Sizes and strides
are arguments, never constants, so one compiled unit serves every shape.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from tailjit.abi import API_STRUCT, ERR_EMPTY, ERR_INDEX, ERR_NOMEM, ERR_ZERODIV, KERNEL_SIDE, MODULE_INIT
from tailjit.fusion import (
    LoopNest,
    LoopProgram,
    RowBuffer,
    _all_loads,
    _reduces,
    _same_size,
    column_reduces,
    row_strided_inputs,
    split_pairs,
    written_out,
)
from tailjit.kernel_sharing import share_kernels
from tailjit.schedule import Schedule, check_schedule, divided_index, loop_names
from tailjit.te import dtypes
from tailjit.te.analysis import (
    Affine,
    FarValues,
    FreeVars,
    Interval,
    NodeMemo,
    Quotient,
    affine,
    axis_range,
    bounds,
    cost,
    refine,
    rewrite,
    substitute,
    var_ranges,
)
from tailjit.te.autodiff import _linear, decide, simplify
from tailjit.te.dtypes import DType
from tailjit.te.expr import (
    COMPARISONS,
    Binary,
    Cast,
    Const,
    Expr,
    IterVar,
    Load,
    Reduce,
    Select,
    SizeVar,
    TEError,
    Tensor,
    Unary,
    binary,
    is_size_expr,
    walk,
)
from tailjit.te.primitives import PRIMITIVES

#: Operations compiled to calls of vector math functions (libmvec), not instructions.
VECTOR_CALLS = frozenset(p.name for p in PRIMITIVES.values() if p.libmvec)

#: Marks where the shared prelude ends; the runtime precompiles what comes before.
PRELUDE_END = "/* end of the tailjit prelude */"

#: Mark the parts of a unit's body, so that the runtime can compile its kernels in two translation units
#: at once (``compiler.split_units``): constants (needed by both), a kernel's functions, and the rest
#: (entry points and the module definition, which call the kernels through their prototypes).
SHARED_MARK, KERNEL_MARK, ENTRY_MARK = "/* tailjit: shared */", "/* tailjit: kernel */", "/* tailjit: entry */"

#: Entry points (argument checks, output allocation, calls into the kernels and the runtime module) are
#: compiled unoptimised: they hold no data loops (those are kernels, scatter updates included) but half of
#: a small unit's C, and -O2 spent a quarter of the unit's gcc time on them (bbox2delta's training unit
#: 0.19 -> 0.14 s, its forward 0.12 -> 0.10 s; the call itself, 2.1 us for tailjit.jit, did not change).
ENTRY_OPTIMIZE = '#pragma GCC push_options\n#pragma GCC optimize ("O0")'

#: How a kernel's outer functions are declared: callable from another translation unit of the same library.
KERNEL_LINKAGE = '__attribute__((visibility("hidden")))'

#: How a parallel kernel's loop nest is declared.  Its dispatcher calls it from two places, the serial path
#: and the threads' region: inlined or cloned into both, gcc would optimise and vectorise the loops twice
#: (bbox2delta's training unit: 0.146 -> 0.136 s of gcc; 2% over seven units).  A kernel called from one
#: place is inlined there, with its bounds known.
PARALLEL_BODY = "__attribute__((noinline, noclone)) static int"

#: The parameters of a kernel function shared by kernels equal up to their constants (``kernel_sharing.py``).
PARAMS = "const int64_t *restrict P"

#: Where Python's headers end in the prelude: a translation unit of kernels alone (``compiler.split_units``)
#: precompiles and includes the rest, which names ``PyObject`` without defining it (a unit holding only the
#: precompiled prelude: 18.5 -> 15.4 ms of gcc here).
PYTHON_END = "/* end of Python's headers */"


def _libmvec_declarations() -> str:
    """The float and double prototypes of every libm function a primitive calls that libmvec has vector
    versions of, declared ``omp declare simd`` so that gcc vectorises loops calling them."""
    functions = {fn: p.arity for p in PRIMITIVES.values() for fn in p.libmvec}  # first use's order
    lines = []
    for fn, arity in functions.items():
        for suffix, c in (("f", "float"), ("", "double")):
            lines += ["#pragma omp declare simd notinbranch", f"{c} {fn}{suffix}({', '.join([c] * arity)});"]
    return "".join(line + "\n" for line in lines)


PRELUDE = (
    r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
"""
    + PYTHON_END
    + r"""
typedef struct _object PyObject;
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <omp.h>

#ifdef TJ_MVEC
/* Vector variants from glibc's libmvec (linked with -lmvec); NaN and inf
   semantics are those of the scalar functions. */
"""
    + _libmvec_declarations()
    + r"""#endif

/* exp of an argument that may lie far below zero (a score masked with -inf): libmvec's vector exp computes
   each lane below about -87 (expf) or -708 (exp) with a scalar call, so a row half masked cost five times
   a finite one.  Such lanes are shifted into range by an exact addition and the result scaled back by
   the exp of the shift (one more rounding, for results below 2^-115); lanes past the underflow point give
   0 from exp(0) * 0, since gcc computes each product and blends (a scaled product below the normal range
   would take a microcode assist and raise underflow).  Without a select around the call: gcc would move
   the call into branches. */
static inline float tj_exp_far_f32(float x) {
  const float z = (x < -104.0f ? -64.0f : x) + (x < -80.0f ? 64.0f : 0.0f);
  return expf(z) * (x < -104.0f ? 0.0f : x < -80.0f ? 0x1.969d48p-93f /* e^-64 */ : 1.0f);
}
static inline double tj_exp_far_f64(double x) {
  const double z = (x < -746.0 ? -512.0 : x) + (x < -700.0 ? 512.0 : 0.0);
  return exp(z) * (x < -746.0 ? 0.0 : x < -700.0 ? 0x1.44109edb20931p-739 /* e^-512 */ : 1.0);
}

/* torch.maximum / torch.minimum (NaN wins), as functions so that each operand is evaluated and written
   once: nested clamps would otherwise repeat their operands' text exponentially. */
#define TJ_MINMAX(T, S, NAN_WINS)                                                \
  static inline T tj_max_##S(T a, T b) { return (a > b || NAN_WINS) ? a : b; }   \
  static inline T tj_min_##S(T a, T b) { return (a < b || NAN_WINS) ? a : b; }
TJ_MINMAX(float, f32, a != a)
TJ_MINMAX(double, f64, a != a)
TJ_MINMAX(int64_t, i64, 0)
TJ_MINMAX(int32_t, i32, 0)
TJ_MINMAX(bool, b8, 0)

/* Size arithmetic that records overflow in ``*o`` instead of wrapping: the size logic checks ``*o`` before
   a size is used (a wrapped element count would make a small block that the kernels overrun).
   ``tj_ck_count`` multiplies an element count by a dimension, a negative dimension counting as empty. */
#define TJ_CHECKED(OP)                                         \
  static inline int64_t tj_ck_##OP(int64_t a, int64_t b, int *o) { \
    int64_t r;                                                     \
    *o |= __builtin_##OP##_overflow(a, b, &r);                     \
    return r;                                                      \
  }
TJ_CHECKED(add)
TJ_CHECKED(sub)
TJ_CHECKED(mul)
static inline int64_t tj_ck_count(int64_t n, int64_t d, int *o) { return tj_ck_mul(n, d > 0 ? d : 0, o); }
/* The bytes of ``count`` items of ``item`` bytes, plus one (malloc(0) may give NULL). */
static inline size_t tj_ck_bytes(int64_t count, size_t item, int *o) {
  size_t r;
  *o |= __builtin_mul_overflow((size_t)count, item, &r);
  *o |= __builtin_add_overflow(r, (size_t)1, &r);
  return r;
}

/* PyTorch's floor division and remainder. */
#define TJ_INT_DIVMOD(T, S)                                                      \
  static inline T tj_fdiv_##S(T a, T b) {                                        \
    if (b == -1) return (T)(0 - (uint64_t)a); /* no overflow trap on MIN / -1 */ \
    T q = a / b;                                                                 \
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;                     \
  }                                                                              \
  static inline T tj_fmod_##S(T a, T b) {                                        \
    if (b == -1) return 0;                                                       \
    T r = a % b;                                                                 \
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;                         \
  }                                                                              \
  static inline T tj_ipow_##S(T a, T b) {                                        \
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);          \
    uint64_t r = 1, x = (uint64_t)a;                                             \
    while (b) { if (b & 1) r *= x; x *= x; b >>= 1; }                            \
    return (T)r;                                                                 \
  }
TJ_INT_DIVMOD(int64_t, i64)
TJ_INT_DIVMOD(int32_t, i32)

#define TJ_FLOAT_DIVMOD(T, S, FMOD, FLOOR, COPYSIGN)                             \
  static inline T tj_fdiv_##S(T a, T b) {                                        \
    if (b == 0) return a / b;                                                    \
    T mod = FMOD(a, b);                                                          \
    T div = (a - mod) / b;                                                       \
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;                            \
    if (div == 0) return COPYSIGN((T)0, a / b);                                  \
    T fl = FLOOR(div);                                                           \
    return (div - fl > (T)0.5) ? fl + 1 : fl;                                    \
  }                                                                              \
  static inline T tj_fmod_##S(T a, T b) {                                        \
    T mod = FMOD(a, b);                                                          \
    return (mod != 0 && ((b < 0) != (mod < 0))) ? mod + b : mod;                 \
  }
TJ_FLOAT_DIVMOD(float, f32, fmodf, floorf, copysignf)
TJ_FLOAT_DIVMOD(double, f64, fmod, floor, copysign)

/* Quick exact division by a loop-invariant divisor d (see CodeGen.loop_nest):
   r = 1 / d once, then per element the product a * r refined twice with fused
   multiply-adds (Markstein's iteration): no divider, and the correctly rounded
   a / d unless one of these operations raised invalid, divide-by-zero, overflow
   or underflow (the proof is in docs/architecture.md).  tj_fp_begin clears those
   four SSE status flags; tj_fp_end says whether one was raised since, in which
   case the loop is run again with true divisions.  The kernel saves the caller's
   flags on entry (tj_fp_save) and sets again on exit those it cleared
   (tj_fp_restore).  Writing MXCSR is cheap only when it sets no flag (setting
   one made a row of 32 floats 3.5 times slower), so the helpers write only to
   clear flags, only when one is set, and the exit restores at most once per call.
   Without x86 flags or hardware FMA, a plain division. */
#if defined(__x86_64__) && defined(__FMA__)
#define TJ_FP_CHECKED 0x1du /* IE, ZE, OE, UE; not DE (denormal operand) or PE (inexact) */
static inline unsigned tj_fp_save(void) { return __builtin_ia32_stmxcsr(); }
static inline void tj_fp_restore(unsigned c) {
  unsigned g = __builtin_ia32_stmxcsr();
  if (c & ~g & 0x3fu) __builtin_ia32_ldmxcsr(g | (c & 0x3fu));
}
static inline void tj_fp_begin(void) {
  unsigned g = __builtin_ia32_stmxcsr();
  if (g & TJ_FP_CHECKED) __builtin_ia32_ldmxcsr(g & ~TJ_FP_CHECKED);
}
static inline int tj_fp_end(void) { return (__builtin_ia32_stmxcsr() & TJ_FP_CHECKED) != 0; }
#define TJ_QDIV(T, S, FMA, COPYSIGN)                                             \
  static inline T tj_qdiv_##S(T a, T d, T r) {                                   \
    T q = a * r;                                                                 \
    q = FMA(FMA(-q, d, a), r, q);                                                \
    q = FMA(FMA(-q, d, a), r, q);                                                \
    return COPYSIGN(q, a * r); /* the sign of a zero quotient */                 \
  }
TJ_QDIV(float, f32, fmaf, copysignf)
TJ_QDIV(double, f64, fma, copysign)
#else
static inline unsigned tj_fp_save(void) { return 0; }
static inline void tj_fp_restore(unsigned c) { (void)c; }
static inline void tj_fp_begin(void) {}
static inline int tj_fp_end(void) { return 0; }
static inline float tj_qdiv_f32(float a, float d, float r) { (void)r; return a / d; }
static inline double tj_qdiv_f64(double a, double d, double r) { (void)r; return a / d; }
#endif

/* A select between two values that may be computed whichever is taken (CodeGen.ex): bitwise, with no
   branch.  Written `c ? a : b`, gcc may move a load that only one side uses into a branch of its own
   (jump threading), and the vectoriser then needs a masked load, which it cannot do for a strided one
   (a box's column): the whole loop stayed scalar. */
#define TJ_PICK(T, U, S)                                                        \
  static inline T tj_pick_##S(bool c, T a, T b) {                               \
    U x, y, r;                                                                  \
    __builtin_memcpy(&x, &a, sizeof x);                                         \
    __builtin_memcpy(&y, &b, sizeof y);                                         \
    const U m = -(U)c;                                                          \
    r = (x & m) | (y & ~m);                                                     \
    T v;                                                                        \
    __builtin_memcpy(&v, &r, sizeof v);                                         \
    return v;                                                                   \
  }
TJ_PICK(float, uint32_t, f32)
TJ_PICK(double, uint64_t, f64)

"""
    + API_STRUCT
    + KERNEL_SIDE
)


def _dtype_index(dt: DType) -> int:
    return dtypes.ALL.index(dt)


#: The suffix of a dtype's C helpers (``tj_max_f32``, ``tj_fdiv_i64``): ``{s}`` in a primitive's C template.
_HELPER_SUFFIX = {"float32": "f32", "float64": "f64", "int32": "i32", "int64": "i64", "bool": "b8"}


def _c_fields(dt: DType) -> dict[str, str]:
    """The dtype's fields of a primitive's C template (``te.primitives.Primitive.c``)."""
    return {"f": "f" if dt == dtypes.float32 else "", "s": _HELPER_SUFFIX[dt.name], "one": c_literal(1, dt)}


def c_literal(value, dt: DType) -> str:
    if dt.is_bool:
        return "1" if value else "0"
    if dt.is_int:
        v = int(value)
        if dt.bits == 32:
            v = ((v + 2**31) % 2**32) - 2**31
            return f"((int32_t){v})" if v != -(2**31) else "((int32_t)(-2147483647 - 1))"
        v = ((v + 2**63) % 2**64) - 2**63
        return f"INT64_C({v})" if v != -(2**63) else "(INT64_MIN)"
    v = float(value)
    if dt.bits == 32 and math.isfinite(v):
        v = (
            struct.unpack("f", struct.pack("f", v))[0]
            if abs(v) <= 3.4028234663852886e38
            else math.copysign(math.inf, v)
        )
    if math.isnan(v):
        return "NAN" if dt.bits == 32 else "((double)NAN)"
    if math.isinf(v):
        lit = "INFINITY" if dt.bits == 32 else "((double)INFINITY)"
        return lit if v > 0 else f"(-{lit})"
    return f"{v.hex()}{'f' if dt.bits == 32 else ''}"


def _ident(name: str) -> str:
    """A C identifier from a name: ASCII letters, digits and underscores (callers append a unique number)."""
    s = re.sub(r"[^0-9A-Za-z_]", "_", name)
    return s if s and not s[0].isdigit() else f"_{s}"


@dataclass
class _Scope:
    """Names visible in a block: index variables, computed reductions, and
    the symbolic ranges of the variables (for bounds checks)."""

    names: dict[IterVar, str]
    env: dict[IterVar, Interval]
    reduces: dict[tuple, str] = field(default_factory=dict)
    parent: _Scope | None = None

    def child(self, names=None, env=None) -> _Scope:
        return _Scope(
            {**self.names, **(names or {})},
            {**self.env, **(env or {})} if env is not None else dict(self.env),
            {},
            self,
        )

    def reduce(self, key: tuple) -> str | None:
        s = self
        while s is not None:
            if key in s.reduces:
                return s.reduces[key]
            s = s.parent
        return None


@dataclass
class Check:
    """A condition evaluated at call time (over the sizes) that raises."""

    cond: str
    message: str


class CodeGen:
    def __init__(self, program: LoopProgram, schedules: dict[str, Schedule], name: str, suffix: str = ""):
        self.p = program
        self.schedules = schedules
        self.name = name
        # several programs can share one translation unit: their C names differ by the suffix
        self.suffix = suffix
        self.call_fn, self.fallback = f"tj_call{suffix}", f"TJ_fallback{suffix}"
        self.free = FreeVars()
        self.loads = _LoadKeys()
        self.far = FarValues()  # arguments of exp that need tj_exp_far
        self.counter = 0
        self.checks: list[Check] = []
        self.kernel_tensor: Tensor | None = None  # the tensor of the loop nest being emitted
        self.sched: Schedule | None = None  # the schedule of the kernel being emitted
        self.row_in_output: RowBuffer | None = None  # its row buffer held in the output row, if any
        self.quick_div: dict[tuple, tuple[str, str]] = {}  # division key -> C names of its divisor, reciprocal
        self.held: dict[Tensor, str] = {}  # the 0-d tensors the function being emitted reads, as locals
        self.fp_saved = False  # the loop nest being emitted clears FP flags (quick divisions)
        self.pending_sides: list = []  # the side outputs of the loop nest being emitted not stored yet
        self.size_names = {v: f"sz_{_ident(v.name)}_{i}" for i, v in enumerate(program.size_vars)}
        # S holds the size variables, then the outer strides of the inputs read row-strided
        self.stride_slot: dict[tuple[Tensor, int], int] = {}
        self.rows = row_strided_inputs(program)
        for t in program.inputs:
            if t in self.rows:
                for d in range(t.ndim - 1):
                    self.stride_slot[(t, d)] = len(program.size_vars) + len(self.stride_slot)
        tensors = program.inputs + program.outputs + program.temporaries
        self.buf = {t: i for i, t in enumerate(tensors)}
        self.cname = {t: f"{_ident(t.name)}_{i}{suffix}" for i, t in enumerate(tensors + program.constants)}
        for k in program.kernels:  # a scatter's base computed in the scatter's buffer
            if k.into is not None:
                self.buf[k.tensor] = self.buf[program.storage(k.tensor)]
                self.cname[k.tensor] = f"{_ident(k.tensor.name)}_{len(self.cname)}{suffix}"

    # -- names ------------------------------------------------------------
    def fresh(self, base: str) -> str:
        self.counter += 1
        return f"{_ident(base)}_{self.counter}"

    def size_c(self, e: Expr, checked: str = "") -> str:
        """C for an integer size expression over size variables; ``checked`` names a flag (an ``int``) in
        which its operations record an overflow (see ``tj_ck_add``), for the sizes that allocations take."""
        if isinstance(e, Const):
            return c_literal(e.value, dtypes.int64)
        if isinstance(e, SizeVar):
            return self.size_names[e]
        if isinstance(e, Binary):
            a, b = self.size_c(e.a, checked), self.size_c(e.b, checked)
            if e.op in ("add", "sub", "mul") and checked:
                return f"tj_ck_{e.op}({a}, {b}, &{checked})"
            if e.op in ("add", "sub", "mul"):
                return f"({a} {'+-*'[('add', 'sub', 'mul').index(e.op)]} {b})"
            if e.op in ("floordiv", "mod"):
                return f"({b} == 0 ? 0 : tj_{'fdiv' if e.op == 'floordiv' else 'fmod'}_i64({a}, {b}))"
            if e.op in ("maximum", "minimum"):
                return f"({a} {'>' if e.op == 'maximum' else '<'} {b} ? {a} : {b})"
        raise TEError(f"cannot express size {e!r} in C")

    def affine_c(self, a: Affine) -> str:
        def term(v) -> str:
            return f"tj_fdiv_i64({self.affine_c(v.num)}, {v.k})" if isinstance(v, Quotient) else self.size_names[v]

        parts = [f"{c} * {term(v)}" for v, c in a.terms] + [str(a.const)]
        return "(" + " + ".join(parts) + ")"

    def count_c(self, shape, checked: str) -> str:
        """C for the element count of a buffer of ``shape`` (an empty one's is 0), overflow checked."""
        n = "1"
        for e in shape:
            n = f"tj_ck_count({n}, {self.size_c(e, checked)}, &{checked})"
        return n

    def dim(self, t: Tensor, d: int) -> str:
        return f"{self.cname[t]}_d{d}"

    def size_locals(self) -> list[str]:
        return [f"const int64_t {n} = S[{i}];" for i, n in enumerate(self.size_names.values())]

    def tensor_locals(self, used: list[Tensor], written: set[Tensor]) -> list[str]:
        out = []
        self.held = {}
        for t in used:
            cn, ct = self.cname[t], t.dtype.c_mem
            const = "" if t in written or isinstance(t, RowBuffer) else "const "
            if isinstance(t, RowBuffer) and t is self.row_in_output:  # set to the output row as it is filled
                out.append(f"{ct} *{cn} = NULL;")
            elif isinstance(t, RowBuffer):  # per call, hence per thread
                bytes_ = f"tj_ck_bytes({self.count_c(t.shape, f'{cn}_ovf')}, sizeof({ct}), &{cn}_ovf)"
                out.append(f"int {cn}_ovf = 0;")
                out.append(f"const size_t {cn}_bytes = {bytes_};")
                out.append(f"{ct} *restrict {cn} = {cn}_ovf ? NULL : ({ct} *)malloc({cn}_bytes);")
                out.append(f"if (!{cn}) return {ERR_NOMEM};")
            elif t.is_constant:
                out.append(f"const {ct} *restrict {cn} = {cn}_data;")
            else:
                out.append(f"{const}{ct} *restrict {cn} = ({const}{ct} *)b[{self.buf[t]}];")
            for d, e in enumerate(t.shape):
                out.append(f"const int64_t {self.dim(t, d)} = {self.size_c(e)};")
            for d in range(t.ndim - 1, -1, -1):  # contiguous, or an input's rows at their strides
                val = f"{cn}_s{d + 1} * {self.dim(t, d + 1)}" if d + 1 < t.ndim else "1"
                if (t, d) in self.stride_slot:
                    val = f"S[{self.stride_slot[(t, d)]}]"
                out.append(f"const int64_t {cn}_s{d} = {val};")
        for t in used:
            out.append(f"(void){self.cname[t]};")
        # a 0-d tensor the function only reads, loaded once before its loops: loaded inside, under a
        # select, gcc makes it a masked load of one address, which stops the vectoriser
        for t in used:
            if t.ndim == 0 and t not in written and not isinstance(t, RowBuffer):
                self.held[t] = f"{self.cname[t]}_held"
                out.append(f"const {t.dtype.c_mem} {self.held[t]} = {self.cname[t]}[0];")
        return out

    # -- expressions ------------------------------------------------------------
    def ex(self, e: Expr, sc: _Scope, temps: dict[tuple, str]) -> str:
        t = temps.get(e.key)
        if t is not None:
            return t
        if isinstance(e, Const):
            return c_literal(e.value, e.dtype)
        if isinstance(e, SizeVar):
            return self.size_names[e]
        if isinstance(e, IterVar):
            return sc.names[e]
        if isinstance(e, Reduce):
            name = sc.reduce(e.key)
            if name is None:  # pragma: no cover - placement guarantees it
                raise AssertionError(f"reduction {e!r} used before it was computed")
            return name
        if isinstance(e, Load):
            return self.load(e, sc, temps)
        if isinstance(e, Cast):
            x = self.ex(e.x, sc, temps)
            return f"({x} != 0)" if e.dtype.is_bool else f"(({e.dtype.c}){x})"
        if isinstance(e, Select):
            c = self.ex(e.cond, sc, temps)
            a = self.conv(e.a, e.dtype, sc.child(env=refine(e.cond, sc.env, True)), temps)
            b = self.conv(e.b, e.dtype, sc.child(env=refine(e.cond, sc.env, False)), temps)
            # a side reading memory that the condition does not (a gradient's pick of a box column or
            # zero), when both sides may be computed: bitwise, so gcc cannot move the load into a branch
            # (see tj_pick); a ternary otherwise (a clamp's), one masked move against three bitwise ops
            picks = e.dtype.is_float and not (self.loads(e.a) | self.loads(e.b)) <= self.loads(e.cond)
            if picks and _evaluable(e.a, temps) and _evaluable(e.b, temps):
                return f"tj_pick_{'f32' if e.dtype == dtypes.float32 else 'f64'}({c}, {a}, {b})"
            return f"({c} ? {a} : {b})"
        if isinstance(e, Unary):
            return self.unary(e, sc, temps)
        if isinstance(e, Binary):
            return self.binary(e, sc, temps)
        raise TypeError(type(e).__name__)  # pragma: no cover

    def conv(self, e: Expr, dt: DType, sc: _Scope, temps) -> str:
        """``e`` converted to ``dt``."""
        if isinstance(e, Const):
            return c_literal(e.value, dt)
        x = self.ex(e, sc, temps)
        if e.dtype == dt:
            return x
        return f"({x} != 0)" if dt.is_bool else f"(({dt.c}){x})"

    def unary(self, e: Unary, sc, temps) -> str:
        dt, op = e.dtype, e.op
        if op in ("isnan", "isinf"):
            if not e.x.dtype.is_float:
                return "0"
            x = self.ex(e.x, sc, temps)
            return f"({x} != {x})" if op == "isnan" else f"(isinf({x}) != 0)"
        x = self.conv(e.x, dt, sc, temps)
        if op == "invert":
            return f"(!{x})" if dt.is_bool else f"(~{x})"
        template = self.c_template(e)
        exp = ""
        if "{exp}" in template:
            f32 = dt == dtypes.float32
            exp = f"tj_exp_far_{'f32' if f32 else 'f64'}" if self.far(e.x) else f"exp{'f' if f32 else ''}"
        return template.format(x=x, exp=exp, **_c_fields(dt))

    def binary(self, e: Binary, sc, temps) -> str:
        op = e.op
        cmp_dt = dtypes.promote(e.a.dtype, e.a.weak, e.b.dtype, e.b.weak)[0]
        dt = cmp_dt if op in COMPARISONS else e.dtype
        a, b = self.conv(e.a, dt, sc, temps), self.conv(e.b, dt, sc, temps)
        if op == "truediv" and e.key in self.quick_div:  # a loop-invariant divisor (see loop_nest)
            d, r = self.quick_div[e.key]
            return f"tj_qdiv_{'f32' if dt == dtypes.float32 else 'f64'}({a}, {d}, {r})"
        infix = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=",
                 "and": "&", "or": "|", "xor": "^"}  # fmt: skip
        if op in infix:
            return f"({a} {infix[op]} {b})"
        zerodiv = f"(err |= {ERR_ZERODIV}, ({dt.c})0)"
        return self.c_template(e).format(x=a, y=b, zerodiv=zerodiv, **_c_fields(dt))

    @staticmethod
    def c_template(e: Unary | Binary) -> str:
        """The C template of ``e``'s primitive (``te.primitives``) for ``e``'s dtype."""
        prim = PRIMITIVES.get(e.op)
        template = prim.c_template(e.dtype) if prim is not None else None
        if template is None:  # pragma: no cover - te.expr builds only the operations and dtypes of the table
            raise TEError(f"no C spelling of {e.op!r} for {e.dtype}")
        return template

    def load(self, e: Load, sc: _Scope, temps) -> str:
        t = e.tensor
        if t not in self.cname:  # pragma: no cover - fusion inlines every other compute
            raise AssertionError(f"load of unmaterialised tensor {t.name}")
        if t in self.held:
            return self.held[t]
        guards, terms = [], []
        pairs = set() if t in self.rows else split_pairs(e)
        for d, idx in enumerate(e.indices):
            ix = self.ex(idx, sc, temps)
            if d in pairs:  # (i // k) * s_d + (i % k) * s_{d+1} of contiguous rows of k is i * s_{d+1}
                terms.append(f"({self.ex(idx.a, sc, temps)}) * {self.cname[t]}_s{d + 1}")
            elif d - 1 not in pairs:
                terms.append(f"({ix}) * {self.cname[t]}_s{d}")
            if not self.bounds_check(t, d, idx, lambda d=d: f"index {d} of the load {e!r}", sc):
                guards.append(f"(uint64_t)({ix}) < (uint64_t){self.dim(t, d)}")
        access = f"{self.cname[t]}[{' + '.join(terms) or '0'}]"
        if guards:
            return f"(({' && '.join(guards)}) ? {access} : (err |= {ERR_INDEX}, ({t.dtype.c})0))"
        return access

    def in_bounds(self, e: Load, sc: _Scope) -> bool:
        """Whether every index of ``e`` is proven in range for all values of the loops of ``sc``."""
        return all(_index_range(idx, e.tensor.shape[d], sc.env)[2] for d, idx in enumerate(e.indices))

    def bounds_check(self, t: Tensor, d: int, idx: Expr, what: Callable[[], str], sc: _Scope) -> bool:
        """True when ``idx``, index ``d`` into ``t`` (described by ``what()``, formatted only when needed), is
        proven in range or checked at call time; False asks for a per-element guard."""
        b, ext, proven = _index_range(idx, t.shape[d], sc.env)
        if proven:
            return True
        if b is None or ext is None:
            return False
        # the check only matters when the load runs: every loop around it (as declared, and as narrowed by
        # the conditions it sits under) non-empty
        declared = [r for v in sc.env if isinstance(v, IterVar) and (r := axis_range(v, {})) is not None]
        ranges = var_ranges(sc.env) + declared
        nonempty = list(dict.fromkeys(f"{self.affine_c(hi)} >= {self.affine_c(lo)}" for lo, hi in ranges))
        bad = f"{self.affine_c(b[0])} < 0 || {self.affine_c(b[1])} > {self.affine_c(ext)} - 1"
        cond = " && ".join([*nonempty, f"({bad})"])
        self.checks.append(Check(cond, f"{what()} can fall outside [0, {t.shape[d]!r})"))
        return True

    # -- statements ------------------------------------------------------------
    def cse(self, exprs: list[Expr], sc: _Scope, out: list[str], ind: str, known=None) -> dict[tuple, str]:
        """Bind sub-expressions used more than once (outside select branches) to
        locals, and the loads inside select branches that are in bounds wherever the
        statement runs (a conditional load stops the vectoriser; a bound one is a
        plain vector load); returns them with ``known`` (locals already bound)."""
        counts: dict[tuple, int] = {}
        order: list[Expr] = []
        known = known or {}
        must: dict = {}  # key -> {key: node} of the nodes evaluated whenever the node is

        def evaluated(e: Expr) -> dict:
            if isinstance(e, (Const, SizeVar, IterVar, Reduce)) or e.key in known:
                return {}
            if e.key not in must:
                if isinstance(e, Select):
                    a, b = evaluated(e.a), evaluated(e.b)
                    found = {**evaluated(e.cond), **{k: n for k, n in a.items() if k in b}}
                else:
                    found = {k: n for c in e.children() for k, n in evaluated(c).items()}
                must[e.key] = {**found, e.key: e}
            return must[e.key]

        def visit(e: Expr):
            if isinstance(e, (Const, SizeVar, IterVar, Reduce)) or e.key in known:
                return
            k = e.key
            counts[k] = counts.get(k, 0) + 1
            if counts[k] > 1:
                return
            if isinstance(e, Select):
                visit(e.cond)
                # what both branches evaluate runs whichever is taken: bound once, not written out in each
                # (a Python loop of torch.where(m, x, f(x)) would otherwise print x 2**steps times)
                a = evaluated(e.a)
                for k, n in evaluated(e.b).items():
                    if k in a:
                        visit(n)
                        visit(n)
                for branch in (e.a, e.b):
                    speculate(branch)
            else:
                for c in e.children():
                    visit(c)
            order.append(e)

        speculated: set = set()

        def speculate(e: Expr):
            if isinstance(e, (Const, SizeVar, IterVar, Reduce)) or e.key in known or e.key in speculated:
                return
            speculated.add(e.key)
            if isinstance(e, Load) and self.in_bounds(e, sc):
                if e.key not in counts:
                    order.append(e)
                counts[e.key] = 2
                return
            for c in e.children():
                speculate(c)

        for e in exprs:
            visit(e)
        temps: dict[tuple, str] = dict(known)
        for e in order:
            if counts[e.key] > 1:
                name = self.fresh("t")
                out.append(f"{ind}const {e.dtype.c} {name} = {self.ex(e, sc, temps)};")
                temps[e.key] = name
        return temps

    def place_reduces(self, exprs: list[Expr], sc: _Scope, bound: set[IterVar], out: list[str], ind: str):
        """Emit every reduction in ``exprs`` whose free variables are bound, inner ones first."""
        seen: set[int] = set()

        def post(e: Expr):
            if id(e) in seen:
                return
            seen.add(id(e))
            for c in e.children():
                post(c)
            if isinstance(e, Reduce) and sc.reduce(e.key) is None and self.free(e) <= bound:
                self.emit_reduce(e, sc, bound, out, ind)
            row = e.tensor if isinstance(e, Load) else None
            if isinstance(row, RowBuffer) and sc.reduce(("row", id(row))) is None and set(row.prefix) <= bound:
                post(row.body)
                self.emit_row(row, sc, bound, out, ind)

        for e in exprs:
            post(e)

    def emit_row(self, row: RowBuffer, sc: _Scope, bound: set[IterVar], out: list[str], ind: str):
        """Fill a row buffer for the current values of its prefix loops."""
        heads, names, env = [], {}, {}
        for d, ax in enumerate(row.axes):
            v = self.fresh(ax.name)
            heads.append((v, self.dim(row, d)))
            names[ax] = v
            if (r := axis_range(ax, sc.env)) is not None:
                env[ax] = r
        inner = sc.child(names=names, env=env)
        # reductions over the row that read only its element at the reduce index ride
        # along in the filling loop instead of taking another pass over the buffer, unless
        # that loop calls vector math: every call clobbers the vector registers, so the
        # accumulators would go to the stack and back around each call, which costs more
        # than a pass over the buffer (in L1) with split accumulators (softmax's row sum)
        riders = [r for r in _reduces(*self.body_now) if sc.reduce(r.key) is None and self._rides(r, row, bound)]
        if self.sched.calls_plain and _calls_vector_math(row.body):
            riders = []
        rider_bodies = [substitute(r.body, {r.axes[0]: row.axes[0]}) for r in riders]
        # what the filling loop evaluates the same at every element (layer norm's 1 / sqrt(var + eps)),
        # once before the row's loops
        runs = " && ".join(f"({e}) > 0" for _, e in heads)
        known = self.hoist([row.body, *rider_bodies], inner, row.axes[-1], runs, out, ind, frozenset(row.axes))
        if row is self.row_in_output:
            out.append(f"{ind}{self.cname[row]} = &{self.store(self.kernel_tensor, sc, last=0)};")
        for level, (v, ext) in enumerate(heads[:-1]):
            out.append(f"{ind + '  ' * level}for (int64_t {v} = 0; {v} < {ext}; ++{v}) {{")
        li = ind + "  " * (len(heads) - 1)
        v, ext = heads[-1]

        # per rider: its accumulator, and the one the filling loop updates: a float32 sum accumulates in
        # float32 lanes per block of ``sum_block`` elements, then into its float64 total, as a reduction's own
        # loop does (a float64 accumulator, converted to and added in one chain per element, took a third
        # of a layer norm's backward)
        accs = []
        for r in riders:
            acc = self.fresh(f"acc_{r.op}")
            acc_dt, decl = self.acc_declare(r, acc, li)
            out += decl
            blocked = r.op == "sum" and r.body.dtype == dtypes.float32
            accs.append((r, acc, acc_dt, *((self.fresh(f"{acc}_block"), dtypes.float32) if blocked else (acc, acc_dt))))
        block = [(total, a) for _, total, _, a, _ in accs if a != total]  # the blocked sums' two accumulators
        clauses = "".join(f" {self.acc_clause(r, a)}" for r, _, _, a, _ in accs)
        lo, hi, li_fill = "0", ext, li
        if block:
            blk, blk_n, sb = self.fresh("blk"), self.fresh("blk_n"), self.sched.sum_block
            out.append(f"{li}for (int64_t {blk} = 0; {blk} < {ext}; {blk} += {sb}) {{")
            li_fill = li + "  "
            out.append(f"{li_fill}const int64_t {blk_n} = {ext} - {blk} < {sb} ? {ext} - {blk} : {sb};")
            out += [f"{li_fill}float {a} = 0.0f;" for _, a in block]
            lo, hi = blk, f"{blk} + {blk_n}"

        def loop() -> list[str]:
            lines = [
                f"{li_fill}#pragma omp simd reduction(|:err){clauses}",
                f"{li_fill}for (int64_t {v} = {lo}; {v} < {hi}; ++{v}) {{",
            ]
            temps = self.cse([row.body], inner, lines, li_fill + "  ", known=known)
            value = self.fresh("v")
            lines.append(f"{li_fill}  const {row.dtype.c} {value} = {self.conv(row.body, row.dtype, inner, temps)};")
            lines.append(f"{li_fill}  {self.store(row, inner)} = {value};")
            element = {**known, Load(row, (row.axes[0],)).key: value}
            for (r, _, _, acc, acc_dt), body in zip(accs, rider_bodies):
                lines += self.acc_update(r, acc, acc_dt, self.ex(body, inner, element), li_fill + "  ")
            return lines + [f"{li_fill}}}"]

        out += loop()
        if block:
            out += [f"{li_fill}{total} += (double){a};" for total, a in block]
            out.append(f"{li}}}")
        for level in reversed(range(len(heads) - 1)):
            out.append(f"{ind + '  ' * level}}}")
        for r, acc, acc_dt, _, _ in accs:
            res = self.fresh(r.op)
            out += self.acc_finish(r, acc, acc_dt, res, ind)
            sc.reduces[r.key] = res
        sc.reduces[("row", id(row))] = self.cname[row]

    def _rides(self, r: Reduce, row: RowBuffer, bound: set[IterVar]) -> bool:
        """Whether reduction ``r`` can be accumulated while ``row`` (1-d) is filled."""
        if row.ndim != 1 or r.op not in ("sum", "prod", "max", "min") or len(r.axes) != 1:
            return False
        ax = r.axes[0]
        if not (isinstance(ax.lo, Const) and ax.lo.value == 0 and ax.extent.key == row.shape[0].key):
            return False
        if not self.free(r) <= bound:
            return False
        loads = [n for n in walk(r.body) if isinstance(n, Load)]
        reads_row = [n for n in loads if n.tensor is row]
        return (
            bool(reads_row)
            and all(len(n.indices) == 1 and n.indices[0] is ax for n in reads_row)
            and not any(isinstance(n, Reduce) for n in walk(r.body))
            and not any(isinstance(n.tensor, RowBuffer) and n.tensor is not row for n in loads)
        )

    def acc_declare(self, r: Reduce, acc: str, ind: str) -> tuple[DType, list[str]]:
        """The accumulator of reduction ``r``: its type and declarations."""
        body_dt, op = r.body.dtype, r.op
        if op in ("sum", "prod", "max", "min"):
            acc_dt, init = _acc_start(r)
            nan = [f"{ind}int {acc}_nan = 0;"] if op in ("max", "min") else []
            return acc_dt, [f"{ind}{acc_dt.c} {acc} = {init};", *nan]
        return body_dt, [  # argmax / argmin
            f"{ind}{body_dt.c} {acc} = {c_literal(0, body_dt)};",
            f"{ind}int64_t {acc}_at = 0, {acc}_pos = 0;",
            f"{ind}int {acc}_first = 1;",
        ]

    def acc_update(self, r: Reduce, acc: str, acc_dt: DType, val: str, ind: str, nan_flag: str = "") -> list[str]:
        """Lines that fold ``val`` into the accumulator ``acc`` (a float max or min's NaN flag is
        ``nan_flag``, by default ``acc`` + "_nan")."""
        op, body_dt = r.op, r.body.dtype
        if op in ("sum", "prod"):
            return [f"{ind}{acc} {'+' if op == 'sum' else '*'}= ({acc_dt.c}){val};"]
        if op in ("max", "min"):
            rel = ">" if op == "max" else "<"
            nan = [f"{ind}  {nan_flag or acc + '_nan'} |= v != v;"] if body_dt.is_float else []
            return [f"{ind}{{ const {acc_dt.c} v = {val}; {acc} = v {rel} {acc} ? v : {acc};", *nan, f"{ind}}}"]
        rel = ">" if op == "argmax" else "<"
        nan_better = " || v != v" if body_dt.is_float else ""
        keep = f"{acc} == {acc}" if body_dt.is_float else "1"
        return [
            f"{ind}{{ const {acc_dt.c} v = {val};"
            f" if ({acc}_first || ({keep} && (v {rel} {acc}{nan_better}))) {{ {acc} = v; {acc}_at = {acc}_pos; }}"
            f" {acc}_first = 0; {acc}_pos++; }}"
        ]

    def acc_clause(self, r: Reduce, acc: str) -> str:
        """The ``omp simd`` reduction clauses of a vectorisable accumulator."""
        clause = {"sum": "+", "prod": "*", "max": "max", "min": "min"}[r.op]
        extra = f" reduction(|:{acc}_nan)" if r.op in ("max", "min") else ""
        return f"reduction({clause}:{acc}){extra}"

    def acc_finish(self, r: Reduce, acc: str, acc_dt: DType, res: str, ind: str) -> list[str]:
        if r.op in ("sum", "prod"):
            return [f"{ind}const {r.dtype.c} {res} = ({r.dtype.c}){acc};"]
        if r.op in ("max", "min"):
            nan = f"{acc}_nan ? {c_literal(math.nan, acc_dt)} : " if r.body.dtype.is_float else ""
            return [f"{ind}const {r.dtype.c} {res} = {nan}{acc};"]
        return [f"{ind}if ({acc}_first) err |= {ERR_EMPTY};", f"{ind}const int64_t {res} = {acc}_at;"]

    def emit_reduce(self, r: Reduce, sc: _Scope, bound: set[IterVar], out: list[str], ind: str):
        acc = self.fresh(f"acc_{r.op}")
        res = self.fresh(r.op)
        op = r.op
        acc_dt, decl = self.acc_declare(r, acc, ind)
        out += decl
        names, env = {}, {}
        inner_sc = sc.child()
        loop_heads = []
        for ax in r.axes:
            v = self.fresh(ax.name)
            lo = self.ex(ax.lo, inner_sc, {})
            ext = self.ex(ax.extent, inner_sc, {})
            if (b := bounds(ax.extent, inner_sc.env)) is None or b[0].sign() != 1:
                ext = f"tj_max_i64({ext}, INT64_C(0))"  # a range given backwards runs nothing (blocks assume so)
            loop_heads.append((v, lo, ext))
            names[ax] = v
            if (rng := axis_range(ax, inner_sc.env)) is not None:
                env[ax] = rng
            inner_sc = inner_sc.child(names={ax: v}, env={ax: env[ax]} if ax in env else {})
        body_ind = ind + "  " * len(r.axes)
        inner_bound = bound | set(r.axes)
        last = len(loop_heads) - 1
        # the reductions the body nests that vary only with the outer loops (a softmax's row sum in a sum over
        # rows and columns) are computed once per iteration of those, not at every element: the lines that
        # open each outer loop, then those of its reductions; before the innermost loop, what the body
        # evaluates the same at every element of it (a row's 1 / sqrt(var + eps))
        outer_lines = []
        for level, (v, lo, ext) in enumerate(loop_heads[:last]):
            head = [f"{ind + '  ' * level}for (int64_t {v} = {lo}; {v} < {lo} + {ext}; ++{v}) {{"]
            self.place_reduces([r.body], inner_sc, bound | set(r.axes[: level + 1]), head, ind + "  " * (level + 1))
            outer_lines += head
        known = self.hoist([r.body], inner_sc, r.axes[-1], f"({loop_heads[-1][2]}) > 0", outer_lines, ind + "  " * last)

        nested = False

        def body() -> list[str]:
            nonlocal nested
            lines: list[str] = []
            self.place_reduces([r.body], inner_sc, inner_bound, lines, body_ind)
            self.side_stores(inner_sc, inner_bound, lines, body_ind, within=r)
            nested = nested or bool(lines)  # reductions computed inside this one's loop
            temps = self.cse([r.body], inner_sc, lines, body_ind, known=known)
            val = self.ex(r.body, inner_sc, temps)
            return lines + self.acc_update(r, acc, acc_dt, val, body_ind)

        lines = body()
        simd_ok = op in ("sum", "prod", "max", "min") and not nested
        # a vectorised reduction over a long range: ``split`` independent vector accumulators, taking
        # the range's vectors in turn (groups of split * tail consecutive elements), so that
        # consecutive vector iterations do not wait on one another's max or add (4 cycles each)
        # and the range is still read as one stream (four streams over chunks of a row halved
        # the speed of a row sum read from memory: the prefetcher kept restarting).  Max and min
        # do not depend on the order; a float sum or product is still computed in one fixed
        # order per binary.  Not when the body calls vector math: each call takes far longer than
        # an add, and clobbers the vector registers, so the accumulators would go to the stack
        # and back around every call (label smoothing's row sum of exponentials ran 5% slower).
        inner_ext, sched = r.axes[-1].extent, self.sched
        split = (
            simd_ok
            and sched.split > 1
            and not (isinstance(inner_ext, Const) and inner_ext.value < sched.split_min)
            and not (sched.calls_plain and _calls_vector_math(r.body))
        )
        # a vectorised float32 sum accumulates each block of ``sum_block`` elements in float32 lanes
        # (at most sum_block / (split * tail) = 16 terms a lane by default), then the block's total
        # into the float64 accumulator: the error stays within a few units in the last place of
        # each block's sum of magnitudes whatever the length, and no element is converted
        # (label smoothing's row sums, 256x1000: 165 -> 133 us a call)
        blocked = op == "sum" and r.body.dtype == dtypes.float32 and simd_ok
        rows_short = None
        if blocked and self.by_columns(r):
            rows_short = self.fresh("rows_short")
            out.append(f"{ind}const int {rows_short} = ({loop_heads[-1][2]}) <= {sched.column_block};")
            out.append(f"{ind}if ({rows_short}) {{")
            out += self.column_sum(r, acc, loop_heads, inner_sc, ind + "  ")
            out.append(f"{ind}}} else {{")
        total = acc
        if blocked:
            acc, acc_dt = self.fresh(f"{acc}_block"), r.body.dtype
        out += outer_lines
        li = ind + "  " * last
        v, lo, ext = loop_heads[last]
        if blocked:
            blk, blk_n, end = self.fresh("blk"), self.fresh("blk_n"), f"{lo} + {ext}"
            sb = sched.sum_block
            out.append(f"{li}for (int64_t {blk} = {lo}; {blk} < {end}; {blk} += {sb}) {{")
            out.append(f"{li}const int64_t {blk_n} = {end} - {blk} < {sb} ? {end} - {blk} : {sb};")
            out.append(f"{li}float {acc} = 0.0f;")
            lo, ext = blk, blk_n

        def loop(lines: list[str]) -> list[str]:
            code = []
            if simd_ok:
                code.append(f"{li}#pragma omp simd {self.acc_clause(r, acc)} reduction(|:err)")
            code.append(f"{li}for (int64_t {v} = {lo}; {v} < {lo} + {ext}; ++{v}) {{")
            return code + lines + [f"{li}}}"]

        def simd_then_scalar(start: str) -> list[str]:
            # [start, lo + ext) as whole blocks of ``tail`` elements in the vector loop, then the
            # last few in a plain loop: gcc's epilogue of an `omp simd` reduction keeps the
            # accumulator lanes in a stack array, written element by element and read back as
            # a vector (a store-forwarding stall, about 20 cycles), which made rows of 8 floats
            # 4 times slower once vectors held 16 (everything went to the epilogue)
            # (the branch skips the lanes' set-up and combining, which gcc emits even for no
            # iteration: 16 dependent adds for a float sum, on the row's critical path)
            mid = self.fresh("mid")
            code = [f"{li}const int64_t {mid} = {start} + (({lo} + {ext} - ({start})) & ~(int64_t){sched.tail - 1});"]
            code.append(f"{li}if ({mid} > {start}) {{")
            code.append(f"{li}#pragma omp simd {self.acc_clause(r, acc)} reduction(|:err)")
            code.append(f"{li}for (int64_t {v} = {start}; {v} < {mid}; ++{v}) {{")
            code += body() + [f"{li}}}", f"{li}}}"]
            code.append(f"{li}for (int64_t {v} = {mid}; {v} < {lo} + {ext}; ++{v}) {{")
            return code + body() + [f"{li}}}"]

        if split:
            groups = self.fresh("groups")
            group = sched.split * sched.tail
            out.append(f"{li}const int64_t {groups} = ({ext}) >= {sched.split_min} ? ({ext}) / {group} : 0;")
            out += self.lanes_loop(r, acc, acc_dt, lo, groups, inner_sc, li, known)
            out += simd_then_scalar(f"{lo} + {group} * {groups}")
        else:
            out += simd_then_scalar(lo) if simd_ok else loop(lines)
        if blocked:
            out += [f"{li}{total} += (double){acc};", f"{li}}}"]
            acc, acc_dt = total, dtypes.float64
        for level in reversed(range(last)):
            out.append(f"{ind + '  ' * level}}}")
        if rows_short is not None:
            out.append(f"{ind}}}")
        out += self.acc_finish(r, acc, acc_dt, res, ind)
        sc.reduces[r.key] = res

    def lanes_loop(self, r: Reduce, acc: str, acc_dt: DType, lo: str, groups: str, sc: _Scope, ind: str,
                   known: dict) -> list[str]:  # fmt: skip
        """The vectorised reduction ``r`` over the ``groups`` * split * tail elements from ``lo``, folded into
        ``acc``: ``split`` arrays of ``tail`` lanes, array u taking the u-th vector of each group of split * tail
        elements (gcc keeps them in vector registers), folded into ``acc`` at the end; ``known``: the locals
        hoisted before the loop."""
        ax = r.axes[-1]
        tracks_nan = r.op in ("max", "min") and r.body.dtype.is_float
        g, lane = self.fresh("g"), self.fresh("l")
        n, tail = self.sched.split, self.sched.tail
        arrays = [self.fresh(f"{acc}_lanes") for _ in range(n)]
        _, init = _acc_start(r)
        code = [f"{ind}if ({groups} > 0) {{"]
        code.append(f"{ind}{acc_dt.c} {', '.join(f'{a}[{tail}]' for a in arrays)};")
        if tracks_nan:
            code.append(f"{ind}int {', '.join(f'{a}_nan[{tail}]' for a in arrays)};")
        code.append(f"{ind}for (int {lane} = 0; {lane} < {tail}; ++{lane}) {{")
        for a in arrays:
            code.append(f"{ind}  {a}[{lane}] = {init};" + (f" {a}_nan[{lane}] = 0;" if tracks_nan else ""))
        code.append(f"{ind}}}")
        code.append(f"{ind}for (int64_t {g} = 0; {g} < {groups}; ++{g}) {{")
        code.append(f"{ind}#pragma omp simd reduction(|:err)")
        code.append(f"{ind}for (int64_t {lane} = 0; {lane} < {tail}; ++{lane}) {{")
        body_ind = ind + "  "
        for u, a in enumerate(arrays):
            at = sc.child(names={ax: f"({lo} + {g} * {n * tail} + {u * tail} + {lane})"})
            temps = self.cse([r.body], at, code, body_ind, known=known)
            val = self.ex(r.body, at, temps)
            code += self.acc_update(r, f"{a}[{lane}]", acc_dt, val, body_ind, nan_flag=f"{a}_nan[{lane}]")
        code += [f"{ind}}}", f"{ind}}}"]
        # the arrays folded lane by lane into the first (vector operations), then its lanes into acc
        fold = {"sum": "{} + {}", "prod": "{} * {}", "max": "{1} > {0} ? {1} : {0}", "min": "{1} < {0} ? {1} : {0}"}[
            r.op
        ]
        code.append(f"{ind}#pragma omp simd")
        code.append(f"{ind}for (int {lane} = 0; {lane} < {tail}; ++{lane}) {{")
        level = arrays
        while len(level) > 1:  # pairwise: ((a0 . a1) . (a2 . a3))
            for x, y in zip(level[::2], level[1::2]):
                code.append(f"{body_ind}{x}[{lane}] = {fold.format(f'{x}[{lane}]', f'{y}[{lane}]')};")
                if tracks_nan:
                    code.append(f"{body_ind}{x}_nan[{lane}] |= {y}_nan[{lane}];")
            level = level[::2]
        code.append(f"{ind}}}")
        code.append(f"{ind}#pragma omp simd {self.acc_clause(r, acc)}")
        code.append(f"{ind}for (int {lane} = 0; {lane} < {tail}; ++{lane}) {{")
        code.append(f"{body_ind}{acc} = {fold.format(acc, f'({acc_dt.c}){arrays[0]}[{lane}]')};")
        if tracks_nan:
            code.append(f"{body_ind}{acc}_nan |= {arrays[0]}_nan[{lane}];")
        code += [f"{ind}}}", f"{ind}}}"]
        return code

    def by_columns(self, r: Reduce) -> bool:
        """Whether the float32 sum ``r`` also gets the ``column_sum`` version, for rows of at most
        ``column_block`` elements (a weight gradient over (batch, i, j)): one accumulator per column, so that the
        vector lanes are combined once per ``sum_block // tail`` rows rather than at the end of every row.  It needs
        outer reduce axes, and rows whose range does not depend on them; a body that calls vector math (a
        focal loss's mean) costs far more per element than the combining, and gcc's time twice over."""
        inner = r.axes[-1]
        if len(r.axes) < 2 or (self.free(inner.lo) | self.free(inner.extent)) & set(r.axes):
            return False
        # column_sum opens the loops itself, with no place for the reductions nested in the body
        return not (self.sched.calls_plain and _calls_vector_math(r.body)) and not _reduces(r.body)

    def column_sum(self, r: Reduce, total: str, loop_heads: list, inner_sc: _Scope, ind: str) -> list[str]:
        """A float32 sum over rows of at most ``column_block`` elements into the float64 ``total``: each column
        accumulates in float32 over ``sum_block // tail`` rows (as many terms as a lane of a block), then the
        columns are added to ``total``."""
        cols, rows, c = self.fresh("cols"), self.fresh("rows"), self.fresh("c")
        v, lo, ext = loop_heads[-1]
        flush = (
            f"{{ double s = 0.0; for (int64_t {c} = 0; {c} < {ext}; ++{c}) {{ s += {cols}[{c}]; {cols}[{c}] = 0.0f; }}"
            f" {total} += s; {rows} = 0; }}"
        )
        out = [f"{ind}float {cols}[{self.sched.column_block}] = {{0}};", f"{ind}int64_t {rows} = 0;"]
        for level, (ov, olo, oext) in enumerate(loop_heads[:-1]):
            out.append(f"{ind + '  ' * level}for (int64_t {ov} = {olo}; {ov} < {olo} + {oext}; ++{ov}) {{")
        li = ind + "  " * (len(loop_heads) - 1)
        out.append(f"{li}#pragma omp simd reduction(|:err)")
        out.append(f"{li}for (int64_t {v} = {lo}; {v} < {lo} + {ext}; ++{v}) {{")
        temps = self.cse([r.body], inner_sc, out, li + "  ")
        out.append(f"{li}  {cols}[{v} - ({lo})] += (float){self.ex(r.body, inner_sc, temps)};")
        out.append(f"{li}}}")
        out.append(f"{li}if (++{rows} == {self.sched.sum_block // self.sched.tail}) {flush}")
        for level in reversed(range(len(loop_heads) - 1)):
            out.append(f"{ind + '  ' * level}}}")
        out.append(f"{ind}if ({rows} > 0) {flush}")
        return out

    # -- kernels ------------------------------------------------------------
    def kernel(self, k: LoopNest) -> list[str]:
        """The kernel's functions: its loop nest (a scatter's copy of its base,
        unless the base's buffer is reused) and a scatter's update loop."""
        check_schedule(k, self.schedules[k.name])
        self.sched = self.schedules[k.name]
        return (self.loop_nest(k) if k.copy else []) + (self.update_loop(k) if k.update is not None else [])

    def loop_nest(self, k: LoopNest) -> list[str]:
        # guards and clamps that the loops' ranges decide (a slice's or a pad's bounds) fold away
        ranges = {ax: r for ax in k.tensor.axes if (r := axis_range(ax, {})) is not None}

        bodies = [k.body, *(u.body for u in k.side), *(m.body for m in k.merged)]
        sched = self.schedules[k.name]
        bodies = [_unroll_short_reductions(_cut_reductions(e, ranges, sched)) for e in bodies]
        compared = _compared(bodies)  # of the expressions the clamps' rewrite sees
        body, *rest = (simplify(_drop_clamp_nan_arms(e, compared), ranges, floats=False) for e in bodies)
        k = dataclasses.replace(
            k,
            body=body,
            side=[u._replace(body=b) for u, b in zip(k.side, rest)],
            merged=[m._replace(body=b) for m, b in zip(k.merged, rest[len(k.side) :])],
        )
        t = k.tensor
        # loop_merge merges no such kernels, nor kernels given schedules: the default schedule is plain
        if k.merged and (
            sched.modulus or sched.fold or t.is_scan or (k.by_rows and t.ndim == 2 and sched.expand is None)
        ):
            raise TEError(f"kernel {t.name!r}: merged kernels need a plain schedule, got {sched.describe()}")
        names = loop_names(k)
        axis_of = dict(zip(names, t.axes))
        # a reverse scan runs its axis from the last position: the loop counts u up, the axis is ext - 1 - u
        backwards = t.axes[t.scan_axis] if t.is_scan and t.reverse else None
        self.body_now = [k.body]
        sides = [u.tensor for u in k.side]
        stored = [m.tensor for m in k.merged if m.store]
        local = {m.tensor for m in k.merged if not m.store}  # read as locals only: no buffer
        loads = [n.tensor for e in [k.body, *(m.body for m in k.merged)] for n in _all_loads(e)]
        used = [t, *sides, *stored] + [u for u in loads if u is not t and u not in local]
        used = list(dict.fromkeys(used))
        rows = [u for u in used if isinstance(u, RowBuffer)]
        for row in rows:
            self.cname[row] = self.fresh(row.name)
        self.kernel_tensor, self.row_in_output = t, self._row_in_output(k, rows, sched)
        fn = f"kern_{self.cname[t]}"
        decl = PARALLEL_BODY if sched.parallel and t.axes else "static int"
        out = [f"{decl} {fn}(void **b, const int64_t *S, {PARAMS}, int64_t lo0, int64_t hi0) {{"]
        out.append("  int err = 0;")
        out += ["  " + s for s in self.size_locals()]
        out += ["  " + s for s in self.tensor_locals(used, {t, *sides, *stored})]
        out.append("  (void)lo0; (void)hi0;")
        sc = _Scope({}, {})
        bound: set[IterVar] = set()
        self.pending_sides = list(k.side)  # side outputs: each stored where its reduction is computed
        units = _unit_loops(k, sched)
        for ln in units:
            ax = axis_of[ln]
            sc = sc.child(names={ax: c_literal(ax.lo.value, dtypes.int64)}, env={ax: axis_range(ax, {})})
            bound = bound | {ax}
        self.place_reduces([k.body], sc, bound, out, "  ")
        ind = "  "
        opened = 0
        outer_of: dict[IterVar, str] = {}  # split axis -> its outer loop variable
        carry = None
        in_columns = False  # the innermost loop ran as column blocks (column_block)
        order = [ln for ln in (sched.order[:-1] if sched.expand else sched.order) if ln not in units]
        expand = axis_of[sched.expand] if sched.expand else None
        for level, ln in enumerate(order):
            base, part = (ln[:-2], ln[-1]) if ln.endswith((".o", ".i")) else (ln, None)
            ax = axis_of[base]
            d = names.index(base)
            ext = self.dim(t, d)
            v = self.fresh(ln.replace(".", "_"))
            lo, hi = ("lo0", "hi0") if level == 0 else ("0", None)
            innermost = level == len(order) - 1
            if part is None:
                hi = hi or ext
            elif part == "o":
                f = sched.splits[base]
                hi = hi or f"({ext} + {f - 1}) / {f}"
                outer_of[ax] = v
            else:
                f = sched.splits[base]
                outer = outer_of[ax]
                out.append(f"{ind}const int64_t {v}_n = {ext} - {outer} * {f} < {f} ? {ext} - {outer} * {f} : {f};")
                hi = f"{v}_n"
            rng = axis_range(ax, {})
            env = {ax: rng} if rng is not None else {}
            if innermost and part is None and t.is_scan and ax is t.axes[t.scan_axis]:
                # the recurrence runs in the innermost loop: carry the previous element in a
                # register instead of reloading what the last iteration stored
                carry = self.fresh("carry")
                start, first_reads = _scan_start(t, k.body)
                out.append(f"{ind}{t.dtype.c} {carry} = {c_literal(start, t.dtype)};")

            def open_loop(lines: list[str], simd: bool, ln=ln, v=v, lo=lo, hi=hi, part=part, base=base, ax=ax, ind=ind):
                if simd:
                    lines.append(f"{ind}#pragma omp simd reduction(|:err)")
                elif ln in sched.unroll:  # a vectorised loop is unrolled by the vectoriser
                    lines.append(f"{ind}#pragma GCC unroll {sched.unroll[ln]}")
                lines.append(f"{ind}for (int64_t {v} = {lo}; {v} < {hi}; ++{v}) {{")
                full = v
                if part == "i":
                    full = self.fresh(base)
                    lines.append(f"{ind}  const int64_t {full} = {outer_of[ax]} * {sched.splits[base]} + {v};")
                if ax is not backwards or part == "o":
                    return full
                pos = self.fresh(base)
                lines.append(f"{ind}  const int64_t {pos} = {self.dim(t, names.index(base))} - 1 - {full};")
                return pos

            columns = (
                column_reduces([k.body, *(m.body for m in k.merged)], bound, ax, self.free)
                if innermost and part is None and not t.is_scan
                else []
            )
            if isinstance(ax.extent, Const) and ax.extent.value < sched.column_min:
                columns = []  # a block of a box's 2 corners: the reduction's own loop is vectorised instead
            if columns and sched.vectorize:  # reductions down columns: accumulate a block of columns per pass
                out += self.column_block(k, columns, sc, ax, env, lo, hi, ind)
                in_columns = True
                break
            simd = innermost and sched.vectorize and not self._reduce_inside(k.body, bound | {ax}, ax, part)
            if simd:  # the innermost loop: versioned on unit inner strides

                def innermost_loop(
                    body, sc, piece, decided, ax=ax, env=env, ind=ind, open_loop=open_loop, lo=lo, hi=hi
                ):
                    lines: list[str] = []
                    if piece is not None:  # a part of the range, cut by the conditions on ax the body knows
                        lo, hi, rng = piece
                        env = {ax: rng}
                    if sched.fold and lo == "0":  # (a loop split between threads runs plainly)
                        return self.fold_loop(t, body, sc, ax, env, sched.fold, hi, ind)
                    if sched.modulus and lo == "0":  # by residues, then the last positions one by one
                        lines += self.residue_loop(t, body, sc, ax, sched.modulus, hi, ind)
                        lo = f"({hi}) / {sched.modulus} * {sched.modulus}"
                    hoisted = self.hoist(
                        [b for _, b in self.copies(body, expand, sc)], sc, ax, f"{hi} > {lo}", lines, ind
                    )
                    var = open_loop(lines, True, lo=lo, hi=hi)
                    inner = sc.child(names={ax: var}, env=env)
                    known = self.merged_values(k, expand, inner, lines, ind + "  ", hoisted, decided)
                    stores = self.copies(body, expand, inner)
                    temps = self.cse([body for _, body in stores], inner, lines, ind + "  ", known=known)
                    for at, body in stores:
                        lines.append(f"{ind}  {self.store(t, at)} = {self.conv(body, t.dtype, inner, temps)};")
                    lines.append(f"{ind}}}")
                    return lines

                def versions(ax=ax, sc=sc, emit=innermost_loop, lo=lo, hi=hi, env=env, part=part) -> list[str]:
                    # unswitched on outer selects, and cut where selects on ax change their truth
                    cuttable = part is None and ax is not backwards and not (sched.modulus or sched.fold) and ax in env
                    return self.unswitched(k.body, sc, ax, emit, (lo, hi, env[ax]) if cuttable else None)

                divs = self._invariant_divisions(k.body, bound, ax)
                if not divs:
                    out += versions()
                    break
                # divisions by values fixed for the whole loop (softmax's row sum, layer norm's
                # standard deviation): quick quotients, exact unless an FP flag says otherwise,
                # in which case the loop runs again with true divisions (see the prelude)
                # (below ``qdiv_min`` elements the set-up costs more than the divides)
                self.fp_saved = True
                quick = self.fresh("quick")
                out.append(f"{ind}const int {quick} = {hi} - {lo} >= {sched.qdiv_min};")
                out.append(f"{ind}if ({quick}) tj_fp_begin();")
                for e in divs:
                    d, r = self.fresh("divisor"), self.fresh("recip")
                    out.append(f"{ind}const {e.dtype.c} {d} = {self.conv(e.b, e.dtype, sc, {})};")
                    out.append(f"{ind}const {e.dtype.c} {r} = {c_literal(1, e.dtype)} / {d};")
                    self.quick_div[e.key] = (d, r)
                out.append(f"{ind}if ({quick}) {{")
                out += ["  " + ln for ln in versions()]
                out.append(f"{ind}}}")
                self.quick_div = {}
                out.append(f"{ind}if (!{quick} || tj_fp_end()) {{")
                row = self.row_in_output
                if row is not None and sc.reduce(("row", id(row))) is not None:
                    # the quick loop overwrote the buffer held in the output row: fill it again
                    refill: list[str] = []
                    self.emit_row(row, sc.child(), bound, refill, ind + "    ")
                    out += [f"{ind}  if ({quick}) {{", *refill, f"{ind}  }}"]
                out += ["  " + ln for ln in versions()]
                out.append(f"{ind}}}")
                break
            pair = self._column_pair(k, sched, order, axis_of, level, bound, ax) if part is None else None
            if pair is not None:  # down the columns of two trailing loops, the inner one short
                inner_ax, columns, kk = pair
                inner_env = {a: r for a in (ax, inner_ax) if (r := axis_range(a, {})) is not None}
                flat = (f"{lo} * {kk}", f"{hi or ext} * {kk}")  # level 0 runs its thread's share of ax
                out += self.column_block(k, columns, sc, inner_ax, inner_env, *flat, ind, (ax, kk))
                break
            var = open_loop(out, False)
            opened += 1
            ind += "  "
            if part == "o":
                continue
            sc = sc.child(names={ax: var}, env=env)
            bound = bound | {ax}
            self.place_reduces([k.body], sc, bound, out, ind)
            self.side_stores(sc, bound, out, ind)
        else:
            if carry is None:
                known = self.merged_values(k, expand, sc, out, ind)
                stores = self.copies(k.body, expand, sc)
                temps = self.cse([body for _, body in stores], sc, out, ind, known=known)
                for at, body in stores:
                    out.append(f"{ind}{self.store(t, at)} = {self.conv(body, t.dtype, sc, temps)};")
            else:  # the previous element (read only past the first position) is the carried value
                prev = {n.key: carry for n in walk(k.body) if isinstance(n, Load) and n.tensor is t}
                prev.update(dict.fromkeys(first_reads, carry))
                temps = self.cse([k.body], sc, out, ind, known=prev)
                out.append(f"{ind}{carry} = {self.conv(k.body, t.dtype, sc, temps)};")
                out.append(f"{ind}{self.store(t, sc)} = {carry};")
        if not in_columns and any(_reduces(m.body) for m in k.merged):  # only column blocks compute those
            raise TEError(f"internal error: kernel {t.name!r} hosts column sums it cannot run; please report it")
        if self.pending_sides:  # check_schedule keeps their loops outside the innermost one
            names = [u.tensor.name for u in self.pending_sides]
            raise TEError(f"kernel {t.name!r}: side output(s) {names} not written")
        for _ in range(opened):
            ind = ind[:-2]
            out.append(f"{ind}}}")
        out += [f"  free({self.cname[row]});" for row in rows if row is not self.row_in_output]
        self.row_in_output = None
        if self.fp_saved:  # the caller's FP flags, which the quick divisions may have cleared
            out.insert(2, "  const unsigned fp_caller = tj_fp_save();")
            out.append("  tj_fp_restore(fp_caller);")
            self.fp_saved = False
        out.append("  return err;")
        out.append("}")
        out = _prune_err_clauses(out)
        out += self.dispatcher(k, fn, units)
        return out

    def merged_values(self, k: LoopNest, expand: IterVar | None, sc: _Scope, out: list[str], ind: str,
                      known=None, decided=()) -> dict:  # fmt: skip
        """The values of the kernels merged into ``k`` at the current point (once per copy of an expanded
        loop), in order, each stored if it must be; returns ``known`` with the locals that hold them under
        the keys of the loads that read them, and the sub-expressions bound on the way (later members and
        the body share them).  ``decided``: the ``(condition, truth)`` pairs known in this loop version."""
        known = dict(known or {})
        host = {id(a) for a in k.tensor.axes}
        for m in k.merged:
            own = [a for a in m.axes if id(a) not in host]  # a column axis written out here
            written = own[0] if own else expand if any(a is expand for a in m.axes) else None
            body = _decided(m.body, decided, sc.env) if decided else m.body
            copies = self.copies(body, written, sc)
            known = self.cse([body for _, body in copies], sc, out, ind, known=known)
            reads = self.copies(Load(m.tensor, m.axes), written, sc)
            for (at, body), (_, load) in zip(copies, reads):
                v = self.fresh(f"{m.tensor.name}_at")
                out.append(f"{ind}const {m.tensor.dtype.c} {v} = {self.conv(body, m.tensor.dtype, sc, known)};")
                if m.store:
                    out.append(f"{ind}{self.store(m.tensor, at, index=m.axes)} = {v};")
                for weak in (False, True):  # a column written as a Python int in the reader is a weak constant
                    index = [Const(i.value, i.dtype, weak) if isinstance(i, Const) else i for i in load.indices]
                    known[Load(m.tensor, tuple(index)).key] = v
        return known

    def side_stores(self, sc: _Scope, bound: set[IterVar], out: list[str], ind: str, within: Reduce | None = None):
        """Store the side outputs whose loops are all open (their reductions were just placed), in the loop
        body of ``within`` those indexed by its axes."""
        left = []
        for u in self.pending_sides:
            inside = within is not None and any(i is a for i in u.index for a in within.axes)
            # (a row statistic constant along one of its leading loops is stored once that loop is open too)
            needs = self.free(u.body) | {i for i in u.index if isinstance(i, IterVar)}
            if not needs <= bound or (within is not None and not inside):
                left.append(u)
                continue
            self.place_reduces([u.body], sc, bound, out, ind)
            value = self.conv(u.body, u.tensor.dtype, sc, {})
            out.append(f"{ind}{self.store(u.tensor, sc, index=u.index)} = {value};")
        self.pending_sides = left

    def _column_pair(self, k: LoopNest, sched, order: list[str], axis_of: dict[str, IterVar], level: int,
                     bound: set[IterVar], ax: IterVar):  # fmt: skip
        """``(inner axis, column reductions, K)`` when the loop ``ax`` at ``level`` and the innermost loop
        below it, of static extent ``K`` <= ``sched.pair_max``, should run as one flattened column block: their
        reductions run down columns of the inner loop, so a block of ``K`` columns would leave most vector
        lanes idle and stride down the rows once per value of ``ax`` (the gradient of a ``(N, M, 2)``
        intermediate summed over ``N``).  None otherwise."""
        t = k.tensor
        if level != len(order) - 2 or not sched.vectorize or t.is_scan or sched.expand:
            return None
        if order[-1].endswith((".o", ".i")):
            return None
        inner = axis_of[order[-1]]
        if not isinstance(inner.extent, Const) or not 1 < inner.extent.value <= sched.pair_max:
            return None
        columns = column_reduces([k.body], bound | {ax}, inner, self.free)
        keys = {r.key for r in columns}
        if not columns or any(ax in self.free(r) and r.key not in keys for r in _reduces(k.body)):
            return None
        if any(ax in self.free(a.lo) | self.free(a.extent) for r in columns for a in r.axes):
            return None
        if isinstance(ax.extent, Const) and ax.extent.value * inner.extent.value < sched.column_min:
            return None
        for r in columns:  # flat over (ax, inner) only where the lanes read one stretch of each row streamed
            streamed = (n for n in walk(r.body) if isinstance(n, Load) and self.free(n) & set(r.axes))
            if any(ax in self.free(n) and not _flat_reads(n, ax, inner) for n in streamed):
                return None
        return inner, columns, inner.extent.value

    def column_block(self, k: LoopNest, columns: list[Reduce], sc: _Scope, ax: IterVar, env, lo: str, hi: str,
                     ind: str, outer: tuple[IterVar, int] | None = None) -> list[str]:  # fmt: skip
        """The innermost loop ``ax`` in blocks of ``column_block``: each column reduction accumulates the
        block in an array over its reduce loops (vectorised across the block, in the same order and
        precision as one column at a time), then the block's outputs are written.  With ``outer`` =
        ``(a, K)``, the block runs over the loops ``a`` and ``ax`` flattened (``ax`` of static extent
        ``K``): ``lo``/``hi`` bound the flat index, whose quotient and remainder by ``K`` are ``a``, ``ax``."""
        t = k.tensor
        jb, jj, jn, jv = self.fresh("jb"), self.fresh("jj"), self.fresh("jn"), self.fresh(ax.name)
        cb = self.sched.column_block
        out = [f"{ind}for (int64_t {jb} = {lo}; {jb} < {hi}; {jb} += {cb}) {{"]
        i2 = ind + "  "
        out.append(f"{i2}const int64_t {jn} = {hi} - {jb} < {cb} ? {hi} - {jb} : {cb};")
        if outer is None:
            block = sc.child(names={ax: jv}, env=env)
            head = [f"const int64_t {jv} = {jb} + {jj};"]
            varying: frozenset[IterVar] = frozenset()
        else:
            a, kk = outer
            jf, av = self.fresh("jf"), self.fresh(a.name)
            block = sc.child(names={a: av, ax: jv}, env=env)
            head = [f"const int64_t {jf} = {jb} + {jj};", f"const int64_t {av} = {jf} / {kk};",
                    f"const int64_t {jv} = {jf} % {kk};"]  # fmt: skip
            varying = frozenset({a})

        def simd_loop(lines_of, li: str) -> list[str]:  # over the block
            body = lines_of(li + "  ")
            return [f"{li}#pragma omp simd reduction(|:err)", f"{li}for (int64_t {jj} = 0; {jj} < {jn}; ++{jj}) {{",
                    *(f"{li}  {h}" for h in head), *body, f"{li}}}"]  # fmt: skip

        results = {}
        for rs in _same_ranges(columns):  # reductions over the same rows accumulate in one pass over them
            first = rs[0]
            bodies = [substitute(r.body, dict(zip(r.axes, first.axes))) for r in rs]
            accs = []
            for r in rs:
                acc, nan = self.fresh(f"acc_{r.op}"), self.fresh("nan")
                acc_dt, init = _acc_start(r)
                out.append(f"{i2}{acc_dt.c} {acc}[{cb}];")
                out.append(f"{i2}for (int64_t {jj} = 0; {jj} < {jn}; ++{jj}) {acc}[{jj}] = {init};")
                tracks_nan = r.op in ("max", "min") and r.body.dtype.is_float
                if tracks_nan:
                    out.append(f"{i2}int {nan}[{cb}] = {{0}};")
                accs.append((r, acc, acc_dt, nan, tracks_nan))

            def accumulate(first=first, bodies=bodies, accs=accs) -> list[str]:
                lines, inner, li = [], block, i2
                for a in first.axes:
                    v = self.fresh(a.name)
                    a_lo, a_ext = self.ex(a.lo, inner, {}), self.ex(a.extent, inner, {})
                    rng = axis_range(a, inner.env)
                    inner = inner.child(names={a: v}, env={a: rng} if rng is not None else {})
                    lines.append(f"{li}for (int64_t {v} = {a_lo}; {v} < {a_lo} + {a_ext}; ++{v}) {{")
                    li += "  "

                # what does not vary across the block (layer norm's rsqrt(var[k] + eps)) once per row
                known = self.hoist(bodies, inner, ax, f"{jn} > 0", lines, li, varying)

                def update(bi: str) -> list[str]:
                    code: list[str] = []
                    temps = self.cse(bodies, inner, code, bi, known=known)  # loads the sums share, once
                    for (r, acc, acc_dt, nan, tracks_nan), body in zip(accs, bodies):
                        val = self.ex(body, inner, temps)
                        slot = f"{acc}[{jj}]"
                        if r.op in ("sum", "prod"):
                            code.append(f"{bi}{slot} {'+' if r.op == 'sum' else '*'}= ({acc_dt.c}){val};")
                            continue
                        v = self.fresh("v")
                        code.append(f"{bi}const {acc_dt.c} {v} = {val};")
                        code.append(f"{bi}{slot} = {v} {'>' if r.op == 'max' else '<'} {slot} ? {v} : {slot};")
                        code += [f"{bi}{nan}[{jj}] |= {v} != {v};"] if tracks_nan else []
                    return code

                lines += simd_loop(update, li)
                for _ in first.axes:
                    li = li[:-2]
                    lines.append(f"{li}}}")
                return lines

            out += accumulate()
            for r, acc, acc_dt, nan, tracks_nan in accs:
                value = f"{acc}[{jj}]"
                if tracks_nan:
                    value = f"({nan}[{jj}] ? {c_literal(math.nan, acc_dt)} : {value})"
                results[r.key] = (r, value)

        def store(bi: str) -> list[str]:
            lines: list[str] = []
            final = block.child()
            for key, (r, value) in results.items():
                res = self.fresh(r.op)
                lines.append(f"{bi}const {r.dtype.c} {res} = ({r.dtype.c}){value};")
                final.reduces[key] = res
            stored = [m for m in k.merged if m.store]  # column sums merged into this one (tailjit.loop_merge)
            temps = self.cse([k.body, *(m.body for m in stored)], final, lines, bi)
            for m in stored:
                value = self.conv(m.body, m.tensor.dtype, final, temps)
                lines.append(f"{bi}{self.store(m.tensor, final, index=m.axes)} = {value};")
            return lines + [f"{bi}{self.store(t, final)} = {self.conv(k.body, t.dtype, final, temps)};"]

        out += simd_loop(store, i2)
        out.append(f"{ind}}}")
        return out

    def hoist(self, bodies: list[Expr], sc: _Scope, ax: IterVar, runs: str, out: list[str], ind: str,
              varying: frozenset[IterVar] = frozenset(), known: dict | None = None) -> dict:  # fmt: skip
        """Bind the sub-expressions the innermost loop ``ax`` evaluates unconditionally but that depend only
        on outer loops (``c * 9 // C`` for a channel ``c``) to locals before the loop: computed once, and
        an integer division's zero test or a guarded load no longer keeps the loop from vectorising.  They
        are evaluated only when the loop runs (``runs``), so no error is raised that the loop would not
        raise; an expression under a select branch stays in the loop.  ``known``: what an outer loop bound
        already (returned with the rest)."""
        outer = set(sc.names) - {ax} - varying  # varying: other axes the loop runs over (a flattened block)
        found: dict[tuple, Expr] = {}
        known = known or {}

        ready: dict[tuple, bool] = {}

        def computed(e: Expr) -> bool:  # every reduction in e already has its value in a local
            if e.key not in ready:
                ready[e.key] = (
                    sc.reduce(e.key) is not None if isinstance(e, Reduce) else all(map(computed, e.children()))
                )
            return ready[e.key]

        def visit(e: Expr):
            if isinstance(e, (Const, SizeVar, IterVar, Reduce)) or e.key in found or e.key in known:
                return
            if self.free(e) <= outer and computed(e):
                found[e.key] = e
                return
            for c in [e.cond] if isinstance(e, Select) else e.children():
                visit(c)

        for b in bodies:
            visit(b)
        names = {}
        for key, e in found.items():
            name = self.fresh("inv")
            out.append(f"{ind}const {e.dtype.c} {name} = ({runs}) ? {self.ex(e, sc, {})} : {c_literal(0, e.dtype)};")
            names[key] = name
        return {**known, **names}

    def unswitched(self, body: Expr, sc: _Scope, ax: IterVar, emit, piece=None) -> list[str]:
        """``emit(body, scope, piece, decided)`` for the innermost loop ``ax``, once per truth of the select
        conditions that do not depend on ``ax`` (a ``cat`` or a gate picked by an outer index): tested once
        before the loop, so the vector lanes do not evaluate every branch.  Given the loop's ``piece`` ``(lo,
        hi, range of ax)``, the loop is also cut into pieces on which each select over ``ax`` (a ``cat`` along
        it, a padding) has one truth; ``piece`` is None for a loop that must run whole.  ``decided`` holds the
        ``(condition, truth)`` pairs of the version emitted."""
        self.versions_left = self.sched.unswitch_total
        return self._unswitched(body, sc, ax, emit, self.sched.unswitch_versions, piece, ())[0]

    def _unswitched(self, body: Expr, sc: _Scope, ax: IterVar, emit, budget: int, piece, decided: tuple):
        """The lines and how many loop versions they hold, at most ``budget``; ``decided``: the ``(condition,
        truth)`` pairs known in this version (the kernels merged into the loop are decided by them too)."""
        split = budget >= 2 and self.versions_left >= 2
        cond, point = self._invariant_cond(body, ax, sc) if split else None, None
        if cond is not None:  # each version knows the condition's truth (bounds checks use it)
            sides = []
            for truth in (True, False):
                known = sc.child(env=refine(cond, sc.env, truth))
                sides.append((known, piece, decide(body, cond, truth, known.env, floats=False)))
        elif piece is None or not split or (cut := self._range_cut(body, ax, sc, piece)) is None:
            self.versions_left -= 1
            return emit(body, sc, piece, decided), 1
        else:
            cond, point, below, at, sides = cut
        # a gate followed by more gates of its index (a chain): the true side does not take from the others'
        gate = _gate_index(cond)
        chain = gate is not None and any(_gate_index(c) is gate for c in _select_conditions(sides[1][2]))
        versions, used = [], 0
        for truth, (known, part, version) in zip((True, False), sides):
            # the true side first, leaving the false side at least one version
            budget_left = budget - 1 if truth else budget if chain else budget - used
            lines, n = self._unswitched(version, known, ax, emit, budget_left, part, (*decided, (cond, truth)))
            versions.append(lines)
            used += n
        yes, no = versions
        ind = re.match(r" *", (yes or no or [""])[0]).group(0)
        if point is not None:  # two pieces, the lower first, cut at the point clamped into the range
            lo, hi = piece[:2]
            p = self.ex(point, sc, {})
            head = f"{ind}const int64_t {at} = {p} < {lo} ? {lo} : ({p} > {hi} ? {hi} : {p});"
            return [head, *(yes + no if below else no + yes)], used
        return [
            f"{ind}if ({self.ex(cond, sc, {})}) {{",
            *("  " + ln for ln in yes),
            f"{ind}}} else {{",
            *("  " + ln for ln in no),
            f"{ind}}}",
        ], used

    def _range_cut(self, body: Expr, ax: IterVar, sc: _Scope, piece: tuple):
        """How to cut the loop ``piece`` ``(lo, hi, range of ax)`` in two: ``(comparison, p, below, name,
        sides)`` for the first select condition of ``body`` (outside reductions) over ``ax`` and the loops
        opened in ``sc`` with a comparison that holds exactly for ``ax < p`` (``below``) or for ``ax >= p``
        (a ``cat``'s ``j < n``, a padding's ``j - 1 >= 0``), and whose decided bodies save at least
        ``Schedule.cut_min_saving`` on one side; ``name`` is the C variable for the cut, ``sides`` the scope, piece
        and body where the comparison is true, then where it is false.  None when there is no such cut."""
        for cond in _select_conditions(body):
            free = self.free(cond)
            if ax not in free or not free <= {*sc.names, ax} or not _index_condition(cond):
                continue
            for leaf in _comparisons(cond):
                if (found := _cut_point(leaf, ax, self.free)) is None:
                    continue
                envs = [refine(leaf, {**sc.env, ax: piece[2]}, truth) for truth in (True, False)]
                versions = [decide(body, leaf, truth, env, floats=False) for truth, env in zip((True, False), envs)]
                if _cut_saving(body, versions, ax, self.free, self.sched.gather_cost) < self.sched.cut_min_saving:
                    continue
                point, below = simplify(found[0], sc.env, floats=False), found[1]
                at = self.fresh(f"{ax.name}_cut")
                parts = [(piece[0], at) if truth == below else (at, piece[1]) for truth in (True, False)]
                sides = [(sc.child(env=env), (*ends, env[ax]), v) for env, ends, v in zip(envs, parts, versions)]
                return leaf, point, below, at, sides
        return None

    def _invariant_cond(self, body: Expr, ax: IterVar, sc: _Scope) -> Expr | None:
        """The first select condition of ``body`` (outside reductions) that is index arithmetic over
        the loops opened in ``sc`` and sizes only: cheap, free of errors, and the same for every ``ax``."""
        outer = set(sc.names) - {ax}
        return next((c for c in _select_conditions(body) if self.free(c) <= outer and _index_condition(c)), None)

    def residue_loop(self, t: Tensor, body: Expr, sc: _Scope, ax: IterVar, k: int, hi: str, ind: str) -> list[str]:
        """The vector loop of ``Schedule.modulus``: over ``q`` in ``[0, hi / k)``, the positions ``q * k + r`` of
        ``ax`` for each ``r`` below ``k``, in each of which the body's ``(ax + c) // k`` is ``q`` plus a constant,
        ``(ax + c) % k`` a constant (the selects it decides fold away) and ``ax`` itself ``q * k + r``."""
        q = IterVar(f"{ax.name}_q", ax.lo, binary("floordiv", ax.extent, Const(k, dtypes.int64)), "spatial")
        qv, n = self.fresh(q.name), self.fresh(f"{q.name}_n")
        rng = axis_range(q, {})
        inner = sc.child(names={q: qv}, env={q: rng} if rng is not None else {})
        stores = []
        for r in range(k):

            def at(e: Expr, go, r=r) -> Expr | None:  # (q * k + r + c) // k is q + (r + c) // k, floored
                if (division := divided_index(e, ax)) is not None and division[1] == k:
                    c = division[0]
                    if e.op == "mod":
                        return Const((r + c) % k, dtypes.int64)
                    return q if (r + c) // k == 0 else binary("add", q, Const((r + c) // k, dtypes.int64))
                return None

            pos = binary("add", binary("mul", q, Const(k, dtypes.int64)), Const(r, dtypes.int64))
            copy = simplify(substitute(rewrite(body, at), {ax: pos}), inner.env, floats=False)
            stores.append((inner.child(names={ax: f"({qv} * {k} + {r})"}), copy))
        lines = [f"{ind}const int64_t {n} = ({hi}) / {k};"]
        hoisted = self.hoist([b for _, b in stores], sc, q, f"{n} > 0", lines, ind)
        lines.append(f"{ind}#pragma omp simd reduction(|:err)")
        lines.append(f"{ind}for (int64_t {qv} = 0; {qv} < {n}; ++{qv}) {{")
        temps = self.cse([b for _, b in stores], inner, lines, ind + "  ", known=hoisted)
        for at_r, b in stores:
            lines.append(f"{ind}  {self.store(t, at_r)} = {self.conv(b, t.dtype, at_r, temps)};")
        lines.append(f"{ind}}}")
        return lines

    def fold_loop(self, t: Tensor, body: Expr, sc: _Scope, ax: IterVar, env: dict, k: int, hi: str,
                  ind: str) -> list[str]:  # fmt: skip
        """The loops of ``Schedule.fold``: over ``q`` in ``[0, ceil(hi / k))`` and, vectorised, ``r`` below
        ``min(k, hi - q * k)``, with the body's ``ax // k`` read as ``q``, ``ax % k`` as ``r`` and ``ax`` itself
        as ``q * k + r`` (keeping its range ``env``); what depends on ``q`` and outer loops only is computed
        once per ``q``."""
        kc = Const(k, dtypes.int64)
        q = IterVar(f"{ax.name}_q", Const(0, dtypes.int64),
                    binary("floordiv", binary("add", ax.extent, Const(k - 1, dtypes.int64)), kc), "spatial")  # fmt: skip
        r = IterVar(f"{ax.name}_r", Const(0, dtypes.int64), kc, "spatial")

        def at(e: Expr, go) -> Expr | None:  # ax // k and ax % k exactly; any other use of ax keeps it
            if divided_index(e, ax) == (0, k):
                return q if e.op == "floordiv" else r
            return None

        folded = rewrite(body, at)
        qv, rv, rn = self.fresh(q.name), self.fresh(r.name), self.fresh(f"{r.name}_n")
        lines: list[str] = []
        hoisted = self.hoist([folded], sc, ax, f"{hi} > 0", lines, ind)  # what no q or r changes, once
        lines.append(f"{ind}for (int64_t {qv} = 0; {qv} < (({hi}) + {k - 1}) / {k}; ++{qv}) {{")
        i2 = ind + "  "
        lines.append(f"{i2}const int64_t {rn} = ({hi}) - {qv} * {k} < {k} ? ({hi}) - {qv} * {k} : {k};")
        outer = sc.child(names={q: qv}, env={q: rng} if (rng := axis_range(q, {})) is not None else {})
        hoisted = self.hoist([folded], outer, r, f"{rn} > 0", lines, i2, known=hoisted)
        lines.append(f"{i2}#pragma omp simd reduction(|:err)")
        lines.append(f"{i2}for (int64_t {rv} = 0; {rv} < {rn}; ++{rv}) {{")
        inner = outer.child(names={r: rv, ax: f"({qv} * {k} + {rv})"}, env={r: axis_range(r, {}), **env})
        temps = self.cse([folded], inner, lines, i2 + "  ", known=hoisted)
        lines.append(f"{i2}  {self.store(t, inner)} = {self.conv(folded, t.dtype, inner, temps)};")
        return [*lines, f"{i2}}}", f"{ind}}}"]

    def copies(self, body: Expr, expand: IterVar | None, sc: _Scope) -> list[tuple[_Scope, Expr]]:
        """The innermost statement's store scope and body: once, or once per iteration of an expanded loop
        with the index a constant and the selects it decides folded (the bodies then share temporaries)."""
        if expand is None:
            return [(sc, body)]
        out = []
        for c in range(expand.extent.value):
            i = Const(c, dtypes.int64)
            out.append(
                (
                    sc.child(names={expand: c_literal(c, dtypes.int64)}),
                    simplify(substitute(body, {expand: i}), floats=False),
                )
            )
        return out

    def _invariant_divisions(self, body: Expr, bound: set[IterVar], ax: IterVar) -> list[Binary]:
        """Float divisions in ``body`` (evaluated in the innermost loop, over ``ax``) whose
        numerator varies with ``ax`` (gcc hoists an invariant quotient) and whose divisor is fixed
        for the whole loop and safe to evaluate before it, even when the loop runs no
        iteration: built from sizes, constants and reductions over the enclosing loops only
        (no loads, no selects, no integer division that could raise).  Divisions inside a
        select's branches are left alone: the divisor would be evaluated where the program
        does not evaluate it."""
        found: dict[tuple, Binary] = {}

        def fixed(e: Expr) -> bool:
            if isinstance(e, Reduce):
                return self.free(e) <= bound
            if isinstance(e, (Load, Select, IterVar)) or (isinstance(e, Binary) and e.op in ("floordiv", "mod")):
                return False
            return all(fixed(c) for c in e.children())

        def visit(e: Expr):
            if isinstance(e, Reduce):  # computed before the loop
                return
            if isinstance(e, Select):
                visit(e.cond)
                return
            if isinstance(e, Binary) and e.op == "truediv" and e.dtype.is_float and fixed(e.b) and ax in self.free(e.a):
                found.setdefault(e.key, e)
            for c in e.children():
                visit(c)

        visit(body)
        return list(found.values())

    def _row_in_output(self, k: LoopNest, rows: list[RowBuffer], sched: Schedule) -> RowBuffer | None:
        """A row buffer that can live in the output row it feeds instead of its own memory.

        Softmax's ``exp(x - max)`` row is the example: the output element ``j`` is
        computed from the buffer's element ``j`` only, after every other read of the
        buffer (the row sum), so the buffer can be the output row itself, as in torch's
        kernel.  That saves the separate buffer's cache footprint, and the output row is
        then written by the loop that fills it, whose ``expf`` calls hide the cache misses
        of those first writes, rather than by the short final loop, which stalled on
        them.  Needed: the default loop order (the buffer filled before the innermost
        loop writes the row), a 1-d buffer over the output's last axis with its dtype,
        every read of it inside the innermost loop at that loop's index (reads in
        reductions computed before that loop are free), and no other buffer reading it."""
        t = k.tensor
        if t.is_scan or t.is_scatter or k.into is not None or not k.copy or t.ndim < 2:
            return None
        if sched.splits or sched.order != loop_names(k):
            return None
        last = t.axes[-1]
        for row in rows:
            if not (
                row.ndim == 1
                and row.dtype == t.dtype
                and len(row.prefix) == t.ndim - 1
                and all(a is b for a, b in zip(row.prefix, t.axes))
                and row.shape[0].key == t.shape[-1].key
            ):
                continue
            if any(n.tensor is row for other in rows if other is not row for n in _all_loads(other.body)):
                continue

            if self._late_reads_ok(k.body, row, last, True):
                return row
        return None

    def _late_reads_ok(self, e: Expr, row: RowBuffer, last: IterVar, late: bool) -> bool:
        """Whether every read of ``row`` in ``e`` made inside the innermost loop over ``last``
        (``late``) is at that loop's index."""
        if isinstance(e, Reduce):  # computed before the innermost loop unless it depends on its index
            late = last in self.free(e)
        elif isinstance(e, Load) and e.tensor is row and late:
            if not (len(e.indices) == 1 and e.indices[0] is last):
                return False
        return all(self._late_reads_ok(c, row, last, late) for c in e.children())

    def update_loop(self, k: LoopNest) -> list[str]:
        """A scatter's update loop, ``upd_*``: the domain loops in row-major
        order on one thread, so that duplicate targets combine in exactly that
        order (no simd either: two lanes could hit the same element), but along
        a row that the update writes whole (``_row_update``)."""
        t, u = k.tensor, k.update
        exprs = list(u.exprs())
        self.body_now = exprs
        used = list(dict.fromkeys([t] + [n.tensor for e in exprs for n in _all_loads(e) if n.tensor is not t]))
        rows = [x for x in used if isinstance(x, RowBuffer)]
        for row in rows:
            self.cname[row] = self.fresh(row.name)
        out = [f"{KERNEL_LINKAGE} int upd_{self.cname[t]}(void **b, const int64_t *S, {PARAMS}) {{", "  int err = 0;"]
        out += ["  " + s for s in self.size_locals()]
        out += ["  " + s for s in self.tensor_locals(used, {t})]
        sc, bound, ind = _Scope({}, {}), set(), "  "
        self.place_reduces(exprs, sc, bound, out, ind)
        by_rows = self._row_update(k)
        for ax in u.domain[:-1] if by_rows else u.domain:
            v = self.fresh(ax.name)
            out.append(f"{ind}for (int64_t {v} = 0; {v} < {self.size_c(ax.extent)}; ++{v}) {{")
            ind += "  "
            rng = axis_range(ax, {})
            sc = sc.child(names={ax: v}, env={ax: rng} if rng is not None else {})
            bound = bound | {ax}
            self.place_reduces(exprs, sc, bound, out, ind)
        if by_rows:
            return out + self.row_update(k, sc, ind, rows)
        opened = len(u.domain)
        temps: dict[tuple, str] = {}
        if u.cond is not None:  # where it is false, neither the targets nor the value are evaluated
            temps = self.cse([u.cond], sc, out, ind)
            out.append(f"{ind}if ({self.ex(u.cond, sc, temps)}) {{")
            ind += "  "
            opened += 1
            sc = sc.child(env=refine(u.cond, sc.env, True))
        temps = self.cse([*u.targets, u.value], sc, out, ind, known=temps)
        idx, guards = self.scatter_targets(t, u.targets, sc, temps, out, ind)
        slot, val = self.fresh("slot"), self.fresh("v")
        body = [
            f"{t.dtype.c_mem} *{slot} = &{self.cname[t]}[{idx}];",
            f"const {t.dtype.c} {val} = {self.conv(u.value, t.dtype, sc, temps)};",
            f"*{slot} = {_combine(u.combine, t.dtype, f'*{slot}', val)};",
        ]
        if guards:  # a target out of range writes nothing and raises IndexError
            out.append(f"{ind}if ({' && '.join(guards)}) {{")
            out += [f"{ind}  {ln}" for ln in body]
            out.append(f"{ind}}} else err |= {ERR_INDEX};")
        else:
            out += [f"{ind}{ln}" for ln in body]
        for _ in range(opened):
            ind = ind[:-2]
            out.append(f"{ind}}}")
        out += [f"  free({self.cname[row]});" for row in rows]
        out += ["  return err;", "}"]
        return out

    def scatter_targets(self, t: Tensor, targets, sc: _Scope, temps, out: list[str], ind: str) -> tuple[str, list]:
        """Bind the leading ``targets`` of a scatter into ``t`` to locals; returns their flat index into
        ``t`` and the guards of those not proven in range."""
        idx, guards = "0", []
        for d, tg in enumerate(targets):
            v = self.fresh(f"at{d}")
            out.append(f"{ind}const int64_t {v} = {self.ex(tg, sc, temps)};")
            if not self.bounds_check(
                t, d, tg, lambda d=d, tg=tg: f"index {d} of the scatter target of {t.name!r} ({tg!r})", sc
            ):
                guards.append(f"(uint64_t){v} < (uint64_t){self.dim(t, d)}")
            idx = v if d == 0 else f"({idx}) * {self.dim(t, d)} + {v}"
        return idx, guards

    def _row_update(self, k: LoopNest) -> bool:
        """Whether a scatter's update writes whole rows: its last target index is its innermost loop, which
        no other index, condition or reduction depends on, and the update reads nothing of the target and
        no row buffer (``index_add`` of rows, a ``scatter_reduce`` over an index expanded along the rows).  Its lanes
        then hit distinct slots of one row, and each slot still combines its values in order."""
        t, u = k.tensor, k.update
        if not u.domain or not u.targets or u.cond is not None or len(u.targets) != t.ndim:
            return False
        last = u.domain[-1]
        if u.targets[-1] is not last or any(last in self.free(tg) for tg in u.targets[:-1]):
            return False
        exprs = list(u.exprs())
        if any(isinstance(n, Reduce) and last in self.free(n) for e in exprs for n in walk(e)):
            return False
        if any(n.tensor is t or isinstance(n.tensor, RowBuffer) for e in exprs for n in _all_loads(e)):
            return False  # (a row buffer is filled where its loops open: the row loop has no such place)
        rng = axis_range(last, {})
        return rng is not None and _index_range(last, t.shape[-1], {last: rng})[2]

    def row_update(self, k: LoopNest, sc: _Scope, ind: str, rows: list) -> list[str]:
        """The rest of ``upd_*`` for an update by rows (``_row_update``): the row's targets and guard
        once, then a vectorised loop along the row."""
        t, u = k.tensor, k.update
        out: list[str] = []
        temps = self.cse(list(u.targets[:-1]), sc, out, ind)
        idx, guards = self.scatter_targets(t, u.targets[:-1], sc, temps, out, ind)
        if guards:  # a target out of range writes nothing and raises IndexError
            out.append(f"{ind}if ({' && '.join(guards)}) {{")
        inner = ind + ("  " if guards else "")
        base, last = self.fresh("row"), u.domain[-1]
        out.append(f"{inner}{t.dtype.c_mem} *{base} = &{self.cname[t]}[({idx}) * {self.dim(t, t.ndim - 1)}];")
        v = self.fresh(last.name)
        out.append(f"{inner}#pragma omp simd reduction(|:err)")
        out.append(f"{inner}for (int64_t {v} = 0; {v} < {self.size_c(last.extent)}; ++{v}) {{")
        rng = axis_range(last, {})
        sc = sc.child(names={last: v}, env={last: rng} if rng is not None else {})
        temps = self.cse([u.value], sc, out, inner + "  ", known=temps)
        val = self.fresh("v")
        out.append(f"{inner}  const {t.dtype.c} {val} = {self.conv(u.value, t.dtype, sc, temps)};")
        out.append(f"{inner}  {base}[{v}] = {_combine(u.combine, t.dtype, f'{base}[{v}]', val)};")
        out.append(f"{inner}}}")
        if guards:
            out.append(f"{ind}}} else err |= {ERR_INDEX};")
        for _ in u.domain[:-1]:
            ind = ind[:-2]
            out.append(f"{ind}}}")
        out += [f"  free({self.cname[row]});" for row in rows]
        out += ["  return err;", "}"]
        return _prune_err_clauses(out)

    def store(self, t: Tensor, sc: _Scope, last: int | None = None, index=None) -> str:
        """The element of ``t`` at the loop variables of ``sc`` (at index ``last`` of the last axis if given),
        or at ``index`` (loop variables and constants)."""
        idx = "0"
        for d, ax in enumerate(t.axes if index is None else index):
            if isinstance(ax, Const):
                name = str(ax.value)
            else:
                name = str(last) if last is not None and d == t.ndim - 1 else sc.names[ax]
            idx = name if d == 0 else f"({idx}) * {self.dim(t, d)} + {name}"
        return f"{self.cname[t]}[{idx}]"

    def _reduce_inside(self, body: Expr, bound: set[IterVar], ax: IterVar, part) -> bool:
        """Whether a reduction runs inside the innermost spatial loop (then the
        reduction loop is vectorised instead)."""
        return part != "o" and any(
            isinstance(n, Reduce) and ax in self.free(n) and self.free(n) <= bound for n in walk(body)
        )

    def dispatcher(self, k: LoopNest, fn: str, units: list[str]) -> list[str]:
        """``run_kern_*``: ``fn`` over the range of the first loop that runs (``units``: the loops of one
        iteration left out of the nest), shared across threads above the work threshold."""
        t = k.tensor
        sched = self.schedules[k.name]
        out = [f"{KERNEL_LINKAGE} int run_{fn}(void **b, const int64_t *S, {PARAMS}) {{"]
        out += ["  " + s for s in self.size_locals()]
        if not t.axes:
            out += [f"  return {fn}(b, S, P, 0, 1);", "}"]
            return out
        loops = [ln for ln in sched.order if ln not in units and ln != sched.expand]
        if not loops:  # every loop runs once
            out += [f"  return {fn}(b, S, P, 0, 1);", "}"]
            return out
        first = loops[0]
        base = first[:-2] if first.endswith((".o", ".i")) else first
        d = loop_names(k).index(base)
        ext = self.size_c(t.shape[d])
        if first.endswith(".o"):
            f = sched.splits[base]
            ext = f"(({ext}) + {f - 1}) / {f}"
        numel = " * ".join(f"(double){self.size_c(s)}" for s in t.shape)
        per = max(1, sum(cost(e) for e in [k.body, *(m.body for m in k.merged)]) % 1000)
        red = [" * ".join(f"(double){self.size_c(a.extent)}" for a in n.axes) for n in _reduces(k.body)
               if all(is_size_expr(a.extent) for a in n.axes)]  # fmt: skip
        work = f"{numel} * ({per}{''.join(' + ' + r for r in red)})"
        out.append(f"  const int64_t ext0 = {ext};")
        if not sched.parallel:
            out += [f"  return {fn}(b, S, P, 0, ext0);", "}"]
            return out
        out.append(f"  if (ext0 < 2 || {work} < {float(sched.parallel_work)} || omp_get_max_threads() < 2)")
        out.append(f"    return {fn}(b, S, P, 0, ext0);")
        out += [f"  return tj_parallel({fn}, b, S, P, ext0);", "}"]
        return out

    # -- the entry point ------------------------------------------------------------
    def entry(self) -> list[str]:
        """The program's entry point: its size logic (``tj_sizes``: bind, check, and size the outputs and
        temporaries), its kernel calls (``tj_body``) and their description (``tj_graph``), which the
        runtime's ``tj_run`` runs (argument reading, allocation, the GIL, errors: ``capi.py``)."""
        p, sfx, kname = self.p, self.suffix, self.name
        temps = p.temporaries
        fb = self.fallback
        out = [f"static PyObject *{fb};"] + ([f"static void *tj_scratch{sfx}[{len(temps)}];"] if temps else [])
        out.append(f"static PyObject *tj_set_fallback{sfx}(PyObject *self, PyObject *fn) {{")
        out += [f"  Py_XSETREF({fb}, Py_NewRef(fn));", "  Py_RETURN_NONE;", "}"]
        out.append(
            f"static int tj_sizes{sfx}(const int64_t *shp, const int64_t *st, int64_t *S, int64_t *dims, "
            "size_t *temp, double *work) {"
        )
        out += ["  (void)shp; (void)st; (void)S; (void)dims; (void)temp;", "  int ovf = 0; /* see tj_ck_add */"]
        shp_base, off = {}, 0
        for t in p.inputs:
            shp_base[t] = off
            off += t.ndim
        # kernels index an input read row-strided at its outer strides
        out += [f"  S[{slot}] = st[{shp_base[t] + d}];" for (t, d), slot in self.stride_slot.items()]
        # bind sizes from the first dimension that is exactly the variable
        binder: dict[SizeVar, tuple[Tensor, int]] = {}
        for t in p.inputs:
            for d, e in enumerate(t.shape):
                if isinstance(e, SizeVar) and e not in binder:
                    binder[e] = (t, d)
                    pos = next(i for i, v in enumerate(p.size_vars) if v is e)
                    out.append(f"  S[{pos}] = shp[{shp_base[t] + d}];")
        out += ["  " + s for s in self.size_locals()]
        for t in p.inputs:
            for d, e in enumerate(t.shape):
                if isinstance(e, SizeVar) and binder[e] == (t, d):
                    continue
                origin = ""
                if isinstance(e, SizeVar):
                    bt, bd = binder[e]
                    origin = f" (size {e.name} from input '{bt.name}' dimension {bd})"
                # the names go in as arguments: a format string is ASCII, and a name's '%' no conversion
                head = f"tailjit kernel '{kname}': input '{t.name}' dimension {d} must be {e!r}"
                want = self.size_c(e, "ovf")  # an overflowing size is reported as one below
                out.append(
                    f"  if (shp[{shp_base[t] + d}] != {want} && !ovf) {{ "
                    f'PyErr_Format(PyExc_ValueError, "%s = %lld%s, got %lld (inconsistent sizes)", "{_c_str(head)}", '
                    f'(long long){want}, "{_c_str(origin)}", (long long)shp[{shp_base[t] + d}]); return -1; }}'
                )
        dims = [self.size_c(e, "ovf") for t in p.outputs for e in t.shape]
        out += [f"  dims[{i}] = {d};" for i, d in enumerate(dims)]
        # an output's element count is checked where it is allocated (tj_new), a temporary's here
        out += [f"  temp[{j}] = (size_t){self.count_c(t.shape, 'ovf')};" for j, t in enumerate(temps)]
        # and the loops' other bounds (a reduction's, a scatter's domain): wrapped, they run another range
        exprs = [e for k in p.kernels for e in (k.body, *(k.update.exprs() if k.update else ()))]
        bounds = [e for r in _reduces(*exprs, *(m.body for k in p.kernels for m in k.merged)) for a in r.axes
                  for e in (a.lo, a.extent)] + [v.extent for k in p.kernels if k.update for v in k.update.domain]  # fmt: skip
        arith = {e.key: e for e in bounds if isinstance(e, Binary) and is_size_expr(e)}
        out += [f"  (void){self.size_c(e, 'ovf')};" for e in arith.values()]
        msg = f"tailjit kernel '{kname}': a size, output or temporary overflows 64 bits for these input sizes"
        out.append(f'  if (ovf) {{ PyErr_SetString(PyExc_MemoryError, "{_c_str(msg)}"); return -1; }}')
        for c in {(c.cond, c.message): c for c in self.checks}.values():  # loops emitted twice check once
            msg = f"tailjit kernel '{kname}': {c.message} for these input sizes"
            out.append(f'  if ({c.cond}) {{ PyErr_SetString(PyExc_IndexError, "{_c_str(msg)}"); return -1; }}')
        # elements written: the outputs, and every scatter's updates (a histogram's output is small)
        shapes = [t.shape for t in p.outputs] + [[v.extent for v in k.update.domain] for k in p.kernels if k.update]
        numel = " + ".join(" * ".join(["(double)1"] + [f"(double){self.size_c(e)}" for e in sh]) for sh in shapes)
        out += [f"  *work = {numel or '0'};", "  return 0;", "}"]
        out.append(f"static int tj_body{sfx}(void **b, const int64_t *S) {{")
        out += ["  int err = 0;", *(f"  err |= {call};" for call in self.calls), "  return err;", "}"]

        def described(kind: str, tensors: list[Tensor], label: str) -> str:
            if not tensors:
                return "NULL"
            rows = [
                f'{{"{_c_str(t.name)}", "{_c_str(label)} \'{_c_str(t.name)}\'", {_dtype_index(t.dtype)}, {t.ndim}, '
                f"{'TJ_ROWS' if t in self.rows else 'TJ_DENSE'}}}"
                for t in tensors
            ]
            out.append(f"static const tj_tensor_desc tj_{kind}{sfx}[] = {{{', '.join(rows)}}};")
            return f"tj_{kind}{sfx}"

        inputs, outputs = described("inputs", p.inputs, "input"), described("outputs", p.outputs, "out")
        items = "NULL"
        if temps:
            items = f"tj_temp_item{sfx}"
            out.append(f"static const size_t {items}[] = {{{', '.join(f'sizeof({t.dtype.c_mem})' for t in temps)}}};")
        signature = _c_str(", ".join(t.name for t in p.inputs))
        counts = [len(p.inputs), len(p.outputs), len(temps), len(p.size_vars) + len(self.stride_slot), off, len(dims)]
        out.append(
            f'static const tj_graph tj_program{sfx} = {{"{_c_str(kname)}", "{signature}", '
            f"{', '.join(map(str, counts))}, {inputs}, {outputs}, {items}, tj_sizes{sfx}, tj_body{sfx}, "
            f"&{fb}, {f'tj_scratch{sfx}' if temps else 'NULL'}}};"
        )
        for fn, autograd in ((self.call_fn, 1), (f"tj_plain{sfx}", 0)):
            out.append(
                f"static PyObject *{fn}(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {{"
            )
            out.append(f"  return tj_run(&tj_program{sfx}, args, nargsf, kwnames, {autograd});")
            out.append("}")
        return out

    def body(self) -> str:
        """This program's constants, kernels and entry point, each part after its mark; kernels equal up
        to their integer constants (a traced loop's iterations) share one function."""
        consts = [f"{SHARED_MARK}\n{self.constant(t)}" for t in self.p.constants]
        sharing = share_kernels(
            ["\n".join(self.kernel(k)) for k in self.p.kernels], [self.kernel_functions(k) for k in self.p.kernels]
        )
        calls = [call for calls in sharing.calls for call in calls]
        self.calls = [f"{fn}(b, S, {params})" for fn, params in calls]
        kernels = [f"{KERNEL_MARK}\n{text}" for text in sharing.texts]
        # the prototypes come before the pragma: a function declared under it is compiled at -O0 even
        # when its definition came first
        functions = dict.fromkeys(fn for fn, _ in calls)
        protos = [f"{KERNEL_LINKAGE} int {fn}(void **b, const int64_t *S, {PARAMS});" for fn in functions]
        entry = "\n".join([*protos, ENTRY_OPTIMIZE, *self.entry(), "#pragma GCC pop_options"])
        return "\n\n".join(consts + kernels + [f"{ENTRY_MARK}\n{entry}"])

    def kernel_functions(self, k: LoopNest) -> list[str]:
        """The functions the entry point runs for a kernel, in order: its loop nest and a scatter's update."""
        return ([f"run_kern_{self.cname[k.tensor]}"] if k.copy else []) + (
            [f"upd_{self.cname[k.tensor]}"] if k.update is not None else []
        )

    def constant(self, t: Tensor) -> str:
        values = ", ".join(c_literal(v, t.dtype) for v in t.data.reshape(-1).tolist()) or "0"
        return f"static const {t.dtype.c_mem} {self.cname[t]}_data[{max(1, t.data.size)}] = {{{values}}};"

    def methods(self) -> list[str]:
        return [
            f'  {{"call{self.suffix}", (PyCFunction)(void (*)(void)){self.call_fn}, METH_FASTCALL | METH_KEYWORDS, '
            '"run the kernels"},',
            f'  {{"call_plain{self.suffix}", (PyCFunction)(void (*)(void))tj_plain{self.suffix}, '
            'METH_FASTCALL | METH_KEYWORDS, "run the kernels, never differentiably"},',
            f'  {{"set_fallback{self.suffix}", tj_set_fallback{self.suffix}, METH_O, "the Python path for other '
            'arguments"},',
        ]


def _module_def(methods: list[str], module: str) -> str:
    return (
        f"{ENTRY_MARK}\n"
        f"{KERNEL_LINKAGE} const tj_api *TJ_api;\n"
        f"{ENTRY_OPTIMIZE}{MODULE_INIT}#pragma GCC pop_options\n"
        "static PyMethodDef tj_methods[] = {\n"
        + "\n".join(methods)
        + '\n  {"init", tj_init, METH_O, "hand over the runtime helper table"},\n'
        "  {NULL, NULL, 0, NULL}};\n"
        f'static struct PyModuleDef tj_module = {{PyModuleDef_HEAD_INIT, "{module}", NULL, -1, tj_methods}};\n'
        f"PyMODINIT_FUNC PyInit_{module}(void) {{ return PyModule_Create(&tj_module); }}\n"
    )


def _c_str(s: str) -> str:
    """``s`` (any Python str: a message with the user's tensor names) as the body of a C string literal: its
    unprintable characters written as Python's repr writes them (a newline as ``\\n``, a NUL as ``\\x00``,
    which would end the C string), then its UTF-8 bytes, with everything but printable ASCII and the
    characters C's string syntax and trigraphs take as escapes written as octal escapes."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)
    return "".join(chr(b) if 32 <= b < 127 and chr(b) not in '\\"?' else f"\\{b:03o}" for b in shown.encode())


class _LoadKeys(NodeMemo):
    """The keys of the loads in expressions, memoised per node."""

    def compute(self, e: Expr) -> frozenset:
        return frozenset([e.key] if isinstance(e, Load) else []).union(*map(self, e.children()))


#: Operations ``_evaluable`` admits: cheap, and without an effect (no call, no division by an integer zero).
_CHEAP_UNARY = frozenset({"neg", "abs", "invert", "isnan"})
_CHEAP_BINARY = frozenset(
    {"add", "sub", "mul", "truediv", "lt", "le", "gt", "ge", "eq", "ne", "and", "or", "xor", "maximum", "minimum"}
)


def _evaluable(e: Expr, temps: dict) -> bool:
    """Whether ``e`` may be computed whether or not a select takes it: values already bound (loads among
    them, which ``cse`` binds only where they are in bounds) and cheap arithmetic on them; a load not bound
    (it may be out of bounds on the other side), a call or an integer division (its zero test) is not."""
    if e.key in temps or isinstance(e, (Const, SizeVar, IterVar, Reduce)):
        return True
    if isinstance(e, Cast):
        return _evaluable(e.x, temps)
    if isinstance(e, Unary):
        return e.op in _CHEAP_UNARY and _evaluable(e.x, temps)
    if isinstance(e, Binary):
        ok = e.op in _CHEAP_BINARY and (e.op != "truediv" or e.dtype.is_float)
        return ok and _evaluable(e.a, temps) and _evaluable(e.b, temps)
    if isinstance(e, Select):
        return all(_evaluable(x, temps) for x in (e.cond, e.a, e.b))
    return False


def _calls_vector_math(e: Expr) -> bool:
    """Whether computing ``e`` calls a vector math function (libmvec)."""
    return any(isinstance(n, (Unary, Binary)) and n.op in VECTOR_CALLS for n in walk(e))


def _combine(op: str, dt: DType, old: str, v: str) -> str:
    """C for a scatter's ``combine(old, v)`` in dtype ``dt``."""
    if op == "assign":
        return v
    if op in ("add", "mul"):
        sym = ("|" if op == "add" else "&") if dt.is_bool else ("+" if op == "add" else "*")
        return f"{old} {sym} {v}"
    rel = ">" if op == "max" else "<"
    nan = f" || {v} != {v}" if dt.is_float else ""  # a NaN value wins; a NaN already there stays
    return f"({v} {rel} {old}{nan}) ? {v} : {old}"


def _prune_err_clauses(lines: list[str]) -> list[str]:
    """Drop ``reduction(|:err)`` from the ``omp simd`` loops whose body never sets ``err``
    (no guarded index, no integer division).  gcc vectorises the epilogue of a loop
    (the last elements, with half-width vectors) only without that clause: with 512-bit
    vectors a row of 8 floats otherwise ran as 8 scalar ``expf`` calls."""
    out = list(lines)
    for i, ln in enumerate(out):
        if "#pragma omp simd" not in ln or " reduction(|:err)" not in ln or i + 1 >= len(out):
            continue
        indent = ln[: len(ln) - len(ln.lstrip())]
        end = next((j for j in range(i + 2, len(out)) if out[j] == f"{indent}}}"), len(out))
        if not any("err |=" in body for body in out[i + 1 : end + 1]):
            out[i] = ln.replace(" reduction(|:err)", "")
    return out


def _acc_start(r: Reduce) -> tuple[DType, str]:
    """The accumulator type and initial value (C) of a sum, product, max or min: sums and products in
    float64 or int64, extremes in the body's type from the identity (-inf / +inf, or the integer limits)."""
    body_dt, op = r.body.dtype, r.op
    if op in ("sum", "prod"):
        acc_dt = dtypes.float64 if body_dt.is_float else dtypes.int64
        return acc_dt, c_literal(0 if op == "sum" else 1, acc_dt)
    init = (-math.inf if op == "max" else math.inf) if body_dt.is_float else _int_extreme(body_dt, op == "min")
    return body_dt, c_literal(init, body_dt)


def _int_extreme(dt: DType, high: bool) -> int:
    if dt.is_bool:
        return 1 if high else 0
    return 2 ** (dt.bits - 1) - 1 if high else -(2 ** (dt.bits - 1))


_ORDERED_REST = {"lt": "ge", "gt": "le"}


def _compared(bodies) -> set:
    """The keys of the expressions that a comparison in ``bodies`` reads."""
    return {x.key for e in bodies for n in walk(e) if isinstance(n, Binary) and n.op in COMPARISONS for x in (n.a, n.b)}


def _drop_clamp_nan_arms(e: Expr, compared: set) -> Expr:
    """A float clamp to a number ``c`` without its NaN arm.  ``_at_least`` writes it ``x < c ? c : (x >= c ?
    x : NaN)``, the NaN constant keeping gradients out of NaN inputs; past ``x < c`` only a NaN ``x`` fails
    ``x >= c``, so ``x`` itself is the same value (NaN, with its own payload, as torch gives): one compare and
    one masked move instead of two and two (GIoU's forward 1.4x faster).  Gradients are derived by now.  A
    clamp that a comparison reads keeps its arm: gcc 12 threads the comparison through the shorter select into
    a select of masks that it cannot vectorise (the gradient of ``delta2bbox``'s nested clamps)."""

    def drop(n: Expr, go) -> Expr | None:
        if not isinstance(n, Select) or n.key in compared:
            return None
        rest, cond = n.b, n.cond
        if not (isinstance(rest, Select) and isinstance(cond, Binary) and cond.op in _ORDERED_REST):
            return None
        bound, inner = cond.b, rest.cond
        if not (isinstance(bound, Const) and bound.dtype.is_float and not math.isnan(bound.value)):
            return None
        same = isinstance(inner, Binary) and inner.op == _ORDERED_REST[cond.op]
        same = same and inner.a.key == cond.a.key and inner.b.key == bound.key and rest.a.key == cond.a.key
        if not (same and isinstance(rest.b, Const) and rest.b.dtype.is_float and math.isnan(rest.b.value)):
            return None
        return Select(go(cond), go(n.a), go(rest.a), n.dtype, n.weak)

    return rewrite(e, drop)


def _unroll_short_reductions(e: Expr) -> Expr:
    """Reductions over a few static points (a 3x3 window) written out as expressions, in the order and
    precision of a block of the accumulator loop (float sums in their own type, products in float64,
    max/min NaN-propagating): the spatial loop around them then vectorises instead of a two- or
    three-iteration reduction loop."""

    def unroll(n: Expr, go) -> Expr | None:
        if not isinstance(n, Reduce) or n.op not in ("sum", "prod", "max", "min"):
            return None
        if not written_out(n):
            return None
        exts = [a.extent.value for a in n.axes]
        body = go(n.body)
        if any(isinstance(x, Reduce) for x in walk(body)):
            return None
        points = itertools.product(*(range(a.lo.value, a.lo.value + x) for a, x in zip(n.axes, exts)))
        terms = [substitute(body, {a: Const(v, dtypes.int64) for a, v in zip(n.axes, p)}) for p in points]
        if n.op in ("max", "min"):
            acc = terms[0]
            for term in terms[1:]:  # the loop's update: the new value wins when it is larger, or NaN
                acc = binary("maximum" if n.op == "max" else "minimum", term, acc)
            return acc
        # a short float sum is one block of the blocked policy (float32 lanes); products keep float64
        acc_dt = (n.dtype if n.op == "sum" else dtypes.float64) if n.dtype.is_float else dtypes.int64
        acc = Const(0 if n.op == "sum" else 1, acc_dt)
        for term in terms:
            acc = binary("add" if n.op == "sum" else "mul", acc, Cast(term, acc_dt) if term.dtype != acc_dt else term)
        return Cast(acc, n.dtype) if n.dtype != acc_dt else acc

    return rewrite(e, unroll)


def _cut_saving(body: Expr, versions, ax: IterVar, free, gather_cost: int) -> int:
    """What the cheaper of the decided ``versions`` of ``body`` saves per element: ``analysis.cost``
    without index arithmetic, and ``gather_cost`` for each load whose index over ``ax`` it made affine."""

    def price(e: Expr) -> int:
        if not gather_cost:
            return cost(e, index_arithmetic=False)
        gathers = sum(
            isinstance(n, Load) and any(ax in free(i) and _linear(i) is None for i in n.indices) for n in walk(e)
        )
        return cost(e, index_arithmetic=False) + gather_cost * gathers

    return price(body) - min(map(price, versions))


def _cut_reductions(e: Expr, env, sched: Schedule) -> Expr:
    """Sums, products, maxima and minima whose body selects on a reduce index as one reduction per piece of
    its range, combined, each piece with the select decided (``sched``'s cut thresholds, as for the loop cuts):
    a cross-entropy over ``cat([pos, neg], 1)`` reduces ``r == 0 ? pos : neg[clamp(r - 1)]`` in its row
    max and its sum of exponentials, and its pieces then read ``pos`` once and ``neg`` contiguously."""

    def cut(n: Expr, go) -> Expr | None:
        if not isinstance(n, Reduce) or n.op not in ("sum", "prod", "max", "min") or written_out(n):
            return None  # a short one is written out, its selects decided point by point
        body = go(n.body)
        inner = {**env, **{ax: r for ax in n.axes if (r := axis_range(ax, env)) is not None}}
        for ax in n.axes:
            if ax in inner and (pieces := _reduce_pieces(n, body, ax, inner, sched)) is not None:
                first, second = (go(p) for p in pieces)
                if n.op in ("max", "min"):  # the later piece's value wins when larger, or NaN, as in the loop
                    return binary("maximum" if n.op == "max" else "minimum", second, first)
                return binary("add" if n.op == "sum" else "mul", first, second)
        return n if body is n.body else Reduce(n.op, body, n.axes)

    return rewrite(e, cut)


def _reduce_pieces(n: Reduce, body: Expr, ax: IterVar, env, sched: Schedule) -> tuple[Reduce, Reduce] | None:
    """``n`` (with ``body``) as its reductions over ``ax`` below and from a cut point, for the first
    select condition of ``body`` that is a comparison of ``ax`` with a bound free of ``n``'s axes (or
    ``ax == lo``, the first position), where a decided body saves ``sched.cut_min_saving``; else None."""
    free = FreeVars()
    lo = ax.lo
    hi = binary("add", lo, ax.extent)
    for cond in _select_conditions(body):
        if ax not in free(cond) or free(cond) & set(n.axes) - {ax} or not _index_condition(cond):
            continue
        for leaf in _comparisons(cond):
            found = _cut_point(leaf, ax, free)
            if found is None and isinstance(leaf, Binary) and leaf.op == "eq":  # ax == lo: ax < lo + 1
                other = leaf.b if leaf.a is ax else leaf.a if leaf.b is ax else None
                gap = simplify(binary("sub", other, lo), env, floats=False) if other is not None else None
                if isinstance(gap, Const) and gap.value == 0:
                    found = (binary("add", lo, Const(1, dtypes.int64)), True)
            if found is None:
                continue
            point, below = found
            as_range = binary("lt" if below else "ge", ax, point)  # leaf, in a form refine reads
            envs = {truth: refine(as_range, env, truth) for truth in (True, False)}
            versions = {truth: decide(body, leaf, truth, envs[truth], floats=False) for truth in (True, False)}
            if _cut_saving(body, versions.values(), ax, free, sched.gather_cost) < sched.cut_min_saving:
                continue
            # [lo, min(p, hi)) and [max(p, lo), hi): each bound clamped where the ranges do not decide it, a
            # piece that runs backwards runs nothing; extents as end - start (see axis_range)
            end = simplify(binary("minimum", point, hi), env, floats=False)
            start = simplify(binary("maximum", point, lo), env, floats=False)
            pieces = []
            for first, last, truth in ((lo, end, below), (start, hi, not below)):
                v = IterVar(ax.name, first, binary("sub", last, first), ax.kind)
                axes = tuple(v if a is ax else a for a in n.axes)
                pieces.append(Reduce(n.op, substitute(versions[truth], {ax: v}), axes))
            return pieces[0], pieces[1]
    return None


def _index_range(idx: Expr, extent: Expr, env) -> tuple:
    """``(bounds of idx, extent as an Affine, whether idx is proven in [0, extent))``; either of the
    first two is None when the analysis cannot express it (then nothing is proven)."""
    b, ext = bounds(idx, env), affine(extent)
    proven = b is not None and ext is not None and b[0].sign() == 1 and (ext - Affine.of(1) - b[1]).sign() == 1
    return b, ext, proven


def _index_condition(e: Expr) -> bool:
    """Comparisons and logic over index variables, sizes and constants (no loads, no division)."""
    ok = (Const, SizeVar, IterVar)
    return not isinstance(e, Const) and all(
        isinstance(n, ok)
        or (isinstance(n, Binary) and n.op in ("add", "sub", "mul", "lt", "le", "gt", "ge", "eq", "ne", "and", "or"))
        or (isinstance(n, Unary) and n.op == "invert")
        for n in walk(e)
    )


def _gate_index(cond: Expr) -> IterVar | None:
    """``k`` of a gate ``k == c`` (one value of an index, exclusive with the other values' gates), or None."""
    if isinstance(cond, Binary) and cond.op == "eq":
        for k, c in ((cond.a, cond.b), (cond.b, cond.a)):
            if isinstance(k, IterVar) and isinstance(c, Const):
                return k
    return None


def _decided(e: Expr, pairs: tuple, env) -> Expr:
    """``e`` where each ``(condition, truth)`` of ``pairs`` is known (see ``decide``)."""
    for cond, truth in pairs:
        e = decide(e, cond, truth, env, floats=False)
    return e


def _select_conditions(body: Expr):
    """The conditions of the selects of ``body`` outside its reductions, each once, outermost first."""
    stack, seen = [body], set()
    while stack:
        e = stack.pop()
        if isinstance(e, Reduce) or e.key in seen:
            continue
        seen.add(e.key)
        if isinstance(e, Select):
            yield e.cond
        stack.extend(reversed(e.children()))


def _comparisons(cond: Expr) -> list[Expr]:
    """The comparisons that ``cond`` combines with ``&``, ``|`` and ``~``."""
    if isinstance(cond, Binary) and cond.op in ("and", "or"):
        return _comparisons(cond.a) + _comparisons(cond.b)
    if isinstance(cond, Unary) and cond.op == "invert":
        return _comparisons(cond.x)
    return [cond]


_MIRRORED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


def _cut_point(cond: Expr, ax: IterVar, free) -> tuple[Expr, bool] | None:
    """``(p, True)`` when ``cond`` holds exactly for ``ax < p``, ``(p, False)`` when for ``ax >= p``: a
    comparison of ``ax`` plus or minus terms free of it with a bound free of it (``free(e)``: its variables)."""
    if not (isinstance(cond, Binary) and cond.op in _MIRRORED):
        return None
    a, b, op = cond.a, cond.b, cond.op
    if ax not in free(a):
        a, b, op = b, a, _MIRRORED[op]
    while a is not ax:  # move the other terms across: ax + e < b  <=>  ax < b - e
        if not (isinstance(a, Binary) and a.op in ("add", "sub")):
            return None
        if ax not in free(a.b):
            a, b = a.a, binary("sub" if a.op == "add" else "add", b, a.b)
        elif a.op == "add" and ax not in free(a.a):
            a, b = a.b, binary("sub", b, a.a)
        else:
            return None
    if ax in free(b):
        return None
    if op in ("le", "gt"):  # ax <= b  <=>  ax < b + 1
        b = binary("add", b, Const(1, dtypes.int64))
    return b, op in ("lt", "le")


def _scan_start(t: Tensor, body: Expr) -> tuple:
    """The value a scan's carried element starts from, and the keys of the selects that its carry then
    stands for.  ``te.scan`` reads the previous element as ``select(not first, prev, initial)``: with a
    constant ``initial``, a carry starting at it equals that select at every position, so the loop-carried
    dependency is the update alone (a cumsum's add), not a blend of the carry with the constant."""
    ax = t.axes[t.scan_axis]
    later = binary("lt", binary("add", ax, 1), t.shape[t.scan_axis]) if t.reverse else binary("gt", ax, 0)
    selects = [n for n in walk(body) if isinstance(n, Select) and isinstance(n.a, Load) and n.a.tensor is t]
    ok = [isinstance(n.b, Const) and n.b.dtype == t.dtype and n.cond.key == later.key for n in selects]
    if not selects or not all(ok) or len({n.b.key for n in selects}) != 1:
        return 0, ()
    return selects[0].b.value, tuple(n.key for n in selects)


def _unit_loops(k: LoopNest, sched: Schedule) -> list[str]:
    """The loops of one iteration (a static extent of 1) left out of ``k``'s loop nest, their index bound
    to its one value: the loop shared by threads and the vector loop are then loops that run (a stacked
    ``(N, 1, 4)`` box output vectorised over its one class instead of its boxes ran 35x slower).  Only for
    kernels whose reductions and row buffers (placed by the loops around them) are none."""
    t = k.tensor
    if t.is_scan or t.is_scatter or k.side or _reduces(k.body, *(m.body for m in k.merged)):
        return []
    if any(isinstance(n, Load) and isinstance(n.tensor, RowBuffer) for n in walk(k.body)):
        return []
    axis_of = dict(zip(loop_names(k), t.axes))
    return [
        ln for ln in sched.order
        if ln in axis_of and ln != sched.expand and ln not in sched.sequential
        and isinstance(axis_of[ln].lo, Const) and isinstance(axis_of[ln].extent, Const) and axis_of[ln].extent.value == 1
    ]  # fmt: skip


def _same_ranges(reductions: list[Reduce]) -> list[list[Reduce]]:
    """``reductions`` in groups over equal ranges (the same bounds for each reduce axis), in order."""
    groups: dict[tuple, list[Reduce]] = {}
    for r in reductions:
        groups.setdefault(tuple((a.lo.key, a.extent.key) for a in r.axes), []).append(r)
    return list(groups.values())


def _flat_reads(n: Load, ax: IterVar, inner: IterVar) -> bool:
    """Whether the lanes of a block over ``(ax, inner)`` flattened read one stretch of ``n``'s row: ``ax``
    last (each element ``K`` times), or ``ax, inner`` last over rows of ``K``; not ``x[i, r, j]`` of a
    ``(B, F, K)`` tensor, whose rows of ``K`` lie ``F * K`` apart."""
    last = n.indices[-2:]
    if last[-1] is ax:
        return True
    return len(last) == 2 and last[0] is ax and last[1] is inner and _same_size(n.tensor.shape[-1], inner.extent)


def generate(program: LoopProgram, schedules: dict[str, Schedule], name: str, module: str) -> str:
    """The C source of the whole program (module functions ``call``, ``call_plain`` and ``set_fallback``)."""
    gen = CodeGen(program, schedules, name)
    return "\n\n".join([PRELUDE + PRELUDE_END, gen.body(), _module_def(gen.methods(), module)])


#: Stands for a program's suffix in :func:`program_body`, replaced once the unit's order is known.
SUFFIX = "_TJSFX"


def program_body(program: LoopProgram, schedules: dict[str, Schedule], name: str) -> tuple[str, list[str]]:
    """A program's kernels and entry point, and its method-table lines, with :data:`SUFFIX` in its C
    names: equal programs give equal text, which is how ``build_many`` shares one entry between them."""
    gen = CodeGen(program, schedules, name, SUFFIX)
    return gen.body(), gen.methods()


def generate_many(bodies: list[tuple[str, list[str]]], module: str) -> str:
    """Programs (from :func:`program_body`) in one translation unit, so that they cost one C compile;
    program ``i`` gets the module functions ``call_i``, ``call_plain_i`` and ``set_fallback_i``."""
    parts = [PRELUDE + PRELUDE_END] + [b.replace(SUFFIX, f"_{i}") for i, (b, _) in enumerate(bodies)]
    methods = [m.replace(SUFFIX, f"_{i}") for i, (_, ms) in enumerate(bodies) for m in ms]
    return "\n\n".join(parts + [_module_def(methods, module)])
