"""Analyses and rewrites over expressions: free index variables,
substitution (which is also how producers are inlined), a cost estimate, and
symbolic index bounds for out-of-bounds checking.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from tailjit.te.expr import (
    Binary,
    Cast,
    Const,
    Expr,
    IterVar,
    Key,
    Load,
    Reduce,
    Select,
    SizeVar,
    TEError,
    Tensor,
    Unary,
    int_binary,
    walk,
)
from tailjit.te.primitives import PRIMITIVES


class NodeMemo:
    """A function of expressions, memoised per node: subclasses define ``compute(e)``, which may call
    ``self`` on sub-expressions."""

    def __init__(self):
        # keyed by id, holding the node: a node built and dropped (a rewritten body) cannot lend its id to
        # a later node while its entry exists
        self._memo: dict[int, tuple[Expr, object]] = {}

    def __call__(self, e: Expr):
        got = self._memo.get(id(e))
        if got is not None:
            return got[1]
        out = self.compute(e)
        self._memo[id(e)] = (e, out)
        return out

    def compute(self, e: Expr):  # pragma: no cover - every subclass overrides
        raise NotImplementedError


class FreeVars(NodeMemo):
    """Free index variables of expressions, memoised per node."""

    def compute(self, e: Expr) -> frozenset[IterVar]:
        if isinstance(e, IterVar):
            return frozenset({e})
        if isinstance(e, Load):
            return frozenset(e.tensor.prefix).union(*(self(i) for i in e.indices))
        if isinstance(e, Reduce):
            inner = self(e.body)
            for ax in e.axes:
                inner = inner | self(ax.lo) | self(ax.extent)
            return inner - frozenset(e.axes)
        out = frozenset()
        for c in e.children():
            out = out | self(c)
        return out


#: Magnitude from which a float value lies outside the range where glibc's vector ``expf`` runs without its
#: slow path (about 87; ``exp``'s is 708, and no constant between the two is common).
FAR = 80.0


class FarValues(NodeMemo):
    """Whether an expression may take a value of magnitude at least ``FAR`` that one of the program's own
    constants put there (a ``masked_fill`` with -inf, a -1e9 padding), through the computes it loads;
    placeholders count as moderate unless marked ``far`` (the frontend marks a kernel input that an earlier
    kernel or extern call computed from such a constant).  Reductions are judged by their bodies (a row max
    starts from -inf but ends on an element), conditions and comparisons by nothing: they select, not
    produce, values."""

    def __init__(self):
        super().__init__()
        self._tensors: dict[int, tuple[Tensor, bool]] = {}

    def compute(self, e: Expr) -> bool:
        if e.dtype.is_bool:
            return False
        if isinstance(e, Const):
            return abs(e.value) >= FAR  # not NaN: a clamp's NaN branch passes on an input's NaN
        if isinstance(e, Load):
            return self.tensor(e.tensor)
        if isinstance(e, Select):
            return self(e.a) or self(e.b)
        return any(map(self, e.children()))

    def tensor(self, t: Tensor) -> bool:
        got = self._tensors.get(id(t))
        if got is not None:
            return got[1]
        self._tensors[id(t)] = (t, False)  # a scan loads itself
        if t.is_constant:
            far = not t.dtype.is_bool and bool((abs(t.data) >= FAR).any())
        elif t.is_placeholder:
            far = t.far
        else:
            far = any(map(self, t.exprs()))
        self._tensors[id(t)] = (t, bool(far))
        return bool(far)


def substitute(
    e: Expr,
    var_map: dict[IterVar, Expr],
    inline: Callable[[Tensor], Expr | None] | None = None,
    untouched: Callable[[Expr], bool] | None = None,
) -> Expr:
    """Replace index variables per ``var_map``; with ``inline``, also replace
    each load of a tensor ``T`` for which ``inline(T)`` gives an expression over
    ``T.axes`` (usually ``T.body``) by that expression at the loaded index,
    recursively.  ``untouched(n)`` may say that a sub-expression loads no tensor
    ``inline`` replaces: where no index variable is being replaced either, it is
    kept as it is without a walk."""
    # memoised by structure, not identity: a body loading ``x[i]`` twice (``where(m, x, 2 * x)``) may hold
    # two equal loads, and inlining each on its own would double ``x``'s body at every such step
    memo: dict[Key, Expr] = {}
    free = FreeVars()

    def go(n: Expr, vmap: dict[IterVar, Expr], memo: dict[Key, Expr]) -> Expr:
        got = memo.get(n.key)
        if got is not None:
            return got
        out = n if (not vmap and untouched is not None and untouched(n)) else step(n, vmap, memo)
        memo[n.key] = out
        return out

    def step(n, vmap, memo):
        if isinstance(n, IterVar):
            return vmap.get(n, n)
        if isinstance(n, Load):
            idx = tuple(go(i, vmap, memo) for i in n.indices)
            t = n.tensor
            body = inline(t) if inline is not None and not t.is_placeholder else None
            if body is not None:
                return go(body, dict(zip(t.axes, idx)), {})
            if all(a is b for a, b in zip(idx, n.indices)):
                return n
            return Load(t, idx)
        if isinstance(n, Binary):  # integer identities fold (view index arithmetic)
            a, b = go(n.a, vmap, memo), go(n.b, vmap, memo)
            return n if (a is n.a and b is n.b) else int_binary(n.op, a, b, n.dtype, n.weak)
        if isinstance(n, Reduce):
            # rename an axis that a replacement mentions, so that it is not captured
            captured = set().union(*(free(v) for v in vmap.values())) if vmap else set()
            axes, inner = [], dict(vmap)
            for ax in n.axes:
                lo, ext = go(ax.lo, vmap, memo), go(ax.extent, vmap, memo)
                same = lo is ax.lo and ext is ax.extent and ax not in captured
                new = ax if same else IterVar(ax.name, lo, ext, "reduce")
                if new is not ax or ax in inner:  # the reduction's own axis shadows an outer replacement
                    inner[ax] = new
                axes.append(new)
            body = go(n.body, inner, {})
            if body is n.body and all(a is b for a, b in zip(axes, n.axes)):
                return n
            return Reduce(n.op, body, tuple(axes))
        if isinstance(n, Select):
            cond = go(n.cond, vmap, memo)
            if isinstance(cond, Const):  # made constant by the replacement: only the taken branch is walked
                taken = go(n.a if cond.value else n.b, vmap, memo)
                return taken if (taken.dtype, taken.weak) == (n.dtype, n.weak) else Cast(taken, n.dtype)
            a, b = go(n.a, vmap, memo), go(n.b, vmap, memo)
            return n if (cond is n.cond and a is n.a and b is n.b) else Select(cond, a, b, n.dtype, n.weak)
        if not isinstance(n, (Const, SizeVar, Unary, Cast)):
            raise TypeError(f"unknown node {type(n).__name__}")  # pragma: no cover
        return rebuild(n, lambda c: go(c, vmap, memo))

    return go(e, var_map, memo)


def rewrite(e: Expr, fn) -> Expr:
    """Rebuild ``e`` bottom-up, replacing each node for which ``fn(node, go)`` returns an
    expression (``go`` rewrites a child)."""
    memo: dict[Key, Expr] = {}  # by structure, as in substitute

    def go(n: Expr) -> Expr:
        got = memo.get(n.key)
        if got is not None:
            return got
        r = fn(n, go)
        if r is None:
            r = rebuild(n, go)
        memo[n.key] = r
        return r

    return go(e)


def rebuild(n: Expr, go) -> Expr:
    if isinstance(n, Load):
        idx = tuple(go(i) for i in n.indices)
        return n if all(a is b for a, b in zip(idx, n.indices)) else Load(n.tensor, idx)
    if isinstance(n, Unary):
        x = go(n.x)
        return n if x is n.x else Unary(n.op, x, n.dtype)
    if isinstance(n, Binary):
        a, b = go(n.a), go(n.b)
        return n if a is n.a and b is n.b else Binary(n.op, a, b, n.dtype, n.weak)
    if isinstance(n, Select):
        c, a, b = go(n.cond), go(n.a), go(n.b)
        return n if c is n.cond and a is n.a and b is n.b else Select(c, a, b, n.dtype, n.weak)
    if isinstance(n, Cast):
        x = go(n.x)
        return n if x is n.x else Cast(x, n.dtype)
    if isinstance(n, Reduce):
        b = go(n.body)
        return n if b is n.body else Reduce(n.op, b, n.axes)
    return n


def cost(e: Expr, reduction: int = 1000, index_arithmetic: bool = True) -> int:
    """Rough per-element cost of evaluating ``e`` (equal sub-trees counted once, as the code generator
    evaluates them once); a reduction counts
    ``reduction`` and, unless that is its whole cost (``reduction`` < 1000), its body.  Without
    ``index_arithmetic``, indices computed from loop variables and sizes alone are free: they
    compose when a view is inlined, and the compiler strength-reduces them."""
    seen: set[tuple] = set()

    def go(n: Expr) -> int:
        if isinstance(n, (Const, SizeVar, IterVar)) or n.key in seen:
            return 0
        seen.add(n.key)
        if isinstance(n, Load) and not index_arithmetic:
            return 1 + sum(go(i) for i in n.indices if any(isinstance(m, Load) for m in walk(i)))
        own = 1  # a comparison, a logical operation, a load, a select, a cast
        if isinstance(n, (Unary, Binary)) and n.op in PRIMITIVES:
            own = PRIMITIVES[n.op].cost
        elif isinstance(n, Reduce):
            if reduction < 1000:
                return reduction
            own = reduction
        return own + sum(go(c) for c in n.children())

    return go(e)


# Symbolic bounds --------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Affine:
    """``const + sum(coef * term)`` over size variables (which are >= 0) and quotients
    ``num // k`` of such forms (output sizes of strided windows, ``(h - 3) // 2 + 1``)."""

    terms: tuple[tuple[SizeVar | Quotient, int], ...]
    const: int

    @staticmethod
    def of(const: int = 0, var: SizeVar | None = None) -> Affine:
        return Affine(((var, 1),) if var is not None else (), const)

    @property
    def key(self) -> tuple:
        return frozenset((v.key, c) for v, c in self.terms), self.const

    def __eq__(self, o) -> bool:  # by the terms' keys: SizeVar's == builds an expression
        return isinstance(o, Affine) and self.key == o.key

    def __hash__(self) -> int:
        return hash(self.key)

    def _combine(self, other: Affine, sign: int) -> Affine:
        coef: dict = {v.key: [v, c] for v, c in self.terms}
        for v, c in other.terms:
            coef.setdefault(v.key, [v, 0])[1] += sign * c
        terms = tuple((v, c) for v, c in coef.values() if c != 0)
        return Affine(terms, self.const + sign * other.const)

    def __add__(self, o: Affine) -> Affine:
        return self._combine(o, 1)

    def __sub__(self, o: Affine) -> Affine:
        return self._combine(o, -1)

    def scale(self, k: int) -> Affine:
        return Affine(tuple((v, c * k) for v, c in self.terms if c * k != 0), self.const * k)

    @property
    def is_const(self) -> bool:
        return not self.terms

    def sign(self) -> int | None:
        """+1 if provably >= 0, -1 if provably < 0 (for all sizes >= 0), else None.

        A quotient ``q = num // k`` is eliminated through ``num - (k - 1) <= k q <= num``,
        after scaling by the divisors so that each ``c q`` is a multiple of ``k q``."""
        if any(isinstance(v, Quotient) for v, _ in self.terms):
            lower, upper = self._without_quotients(False), self._without_quotients(True)
            return 1 if lower.sign() == 1 else (-1 if upper.sign() == -1 else None)
        coefs = [c for _, c in self.terms]
        if self.const >= 0 and all(c >= 0 for c in coefs):
            return 1
        if self.const < 0 and all(c <= 0 for c in coefs):
            return -1
        return None

    def _without_quotients(self, upper: bool) -> Affine:
        """A bound on ``m * self`` (some ``m > 0``) with the outermost quotients replaced."""
        m = math.lcm(*(v.k for v, _ in self.terms if isinstance(v, Quotient)))
        out = Affine((), self.const * m)
        for v, c in self.terms:
            if not isinstance(v, Quotient):
                out += Affine(((v, c * m),), 0)
                continue
            f = c * m // v.k  # c m q = f (k q), with num - (k - 1) <= k q <= num
            out += (v.num if (f > 0) == upper else v.num - Affine.of(v.k - 1)).scale(f)
        return out


@dataclass(frozen=True, eq=False)
class Quotient:
    """``num // k`` with ``k > 0``: a term of an :class:`Affine`."""

    num: Affine
    k: int

    @property
    def key(self) -> tuple:
        return ("quotient", self.num.key, self.k)

    @property
    def name(self) -> str:
        return f"(({_fmt(self.num)}) // {self.k})"


def affine(e: Expr) -> Affine | None:
    """``e`` as an affine form over size variables and their quotients, or None."""
    if isinstance(e, Const) and e.dtype.is_int:
        return Affine.of(e.value)
    if isinstance(e, SizeVar):
        return Affine.of(0, e)
    if isinstance(e, Binary) and e.op in ("add", "sub", "mul", "floordiv"):
        a, b = affine(e.a), affine(e.b)
        if a is None or b is None:
            return None
        if e.op == "add":
            return a + b
        if e.op == "sub":
            return a - b
        if e.op == "floordiv":
            return quotient(a, b.const) if b.is_const and b.const > 0 else None
        if a.is_const:
            return b.scale(a.const)
        if b.is_const:
            return a.scale(b.const)
    return None


def quotient(a: Affine, k: int) -> Affine:
    """``a // k`` for ``k > 0``."""
    if a.is_const:
        return Affine.of(a.const // k)
    if k == 1:
        return a
    return Affine(((Quotient(a, k), 1),), 0)


Interval = tuple[Affine, Affine]  # inclusive [lo, hi]


def bounds(e: Expr, env: dict[IterVar, Interval]) -> Interval | None:
    """Inclusive symbolic bounds of integer expression ``e`` given variable ranges, or None.

    Besides variables, ``env`` may hold bounds that enclosing conditions put on
    whole expressions (see :func:`refine`), keyed by :func:`expr_key`."""
    if isinstance(e, IterVar):
        return env.get(e)
    known = env.get(expr_key(e)) if env else None
    if known is not None:
        own = _bounds(e, env)
        lo, hi = known
        if own is not None:
            lo = own[0] if lo is None else _tighter_lo(own[0], lo)
            hi = own[1] if hi is None else _tighter_hi(own[1], hi)
        return (lo, hi) if lo is not None and hi is not None else None
    return _bounds(e, env)


def expr_key(e: Expr) -> tuple:
    """The ``env`` key under which a condition records bounds of a whole expression."""
    return ("expr", e.key)


def _bounds(e: Expr, env: dict[IterVar, Interval]) -> Interval | None:
    if isinstance(e, Cast):
        return bounds(e.x, env) if e.x.dtype.is_int and e.dtype.is_int and e.dtype.bits >= e.x.dtype.bits else None
    if not isinstance(e, Binary):
        a = affine(e)
        return (a, a) if a is not None else None
    if e.op in ("maximum", "minimum"):
        lo, hi = _partial(e, env)
        return (lo, hi) if lo is not None and hi is not None else None
    a = bounds(e.a, env)
    b = bounds(e.b, env)
    if a is None or b is None:
        return None
    if e.op == "add":
        return a[0] + b[0], a[1] + b[1]
    if e.op == "sub":
        return a[0] - b[1], a[1] - b[0]
    if e.op == "mul":
        for x, y in ((a, b), (b, a)):
            if y[0] == y[1] and y[0].is_const:
                k = y[0].const
                return (x[0].scale(k), x[1].scale(k)) if k >= 0 else (x[1].scale(k), x[0].scale(k))
        return None
    if e.op in ("floordiv", "mod") and b[0] == b[1] and b[0].is_const and b[0].const > 0:
        k = b[0].const
        if e.op == "mod":
            return Affine.of(0), Affine.of(k - 1)
        return quotient(a[0], k), quotient(a[1], k)  # floor division by k > 0 is monotone
    return None


def _partial(e: Expr, env: dict[IterVar, Interval]) -> tuple[Affine | None, Affine | None]:
    """Bounds of ``e`` where only one side may be known: ``max(i - 1, 0)`` has a lower bound whatever
    ``i``'s upper one, so the clamp ``min(max(i - 1, 0), h - 1)`` is bounded on both sides."""
    if not (isinstance(e, Binary) and e.op in ("maximum", "minimum")):
        full = bounds(e, env)
        return full if full is not None else (None, None)
    (alo, ahi), (blo, bhi) = _partial(e.a, env), _partial(e.b, env)
    if e.op == "maximum":  # >= either lower bound; <= the larger upper bound
        lo = _either(alo, blo, _larger)
        hi = _larger(ahi, bhi) if ahi is not None and bhi is not None else None
    else:  # <= either upper bound; >= the smaller lower bound
        hi = _either(ahi, bhi, _smaller)
        lo = _smaller(alo, blo) if alo is not None and blo is not None else None
    return lo, hi


def _either(x: Affine | None, y: Affine | None, better) -> Affine | None:
    """Either bound holds: the provably tighter one, else whichever is known."""
    if x is None or y is None:
        return x if y is None else y
    return better(x, y) or x


def axis_range(ax: IterVar, env: dict[IterVar, Interval]) -> Interval | None:
    """Inclusive range of index variable ``ax``, ``[lo, lo + extent - 1]``, or None.  An extent written
    ``hi - lo`` (``te.reduce_axis((lo, hi))``, a cut reduction's pieces) ends below ``hi``: bounding ``lo``
    and the extent apart would count ``lo``'s slack twice."""
    lo = bounds(ax.lo, env)
    if isinstance(ax.extent, Binary) and ax.extent.op == "sub" and ax.extent.b is ax.lo:
        hi = bounds(ax.extent.a, env)
        return None if lo is None or hi is None else (lo[0], hi[1] - Affine.of(1))
    ext = bounds(ax.extent, env)
    if lo is None or ext is None:
        return None
    return lo[0], lo[1] + ext[1] - Affine.of(1)


def refine(cond: Expr, env: dict[IterVar, Interval], truth: bool) -> dict[IterVar, Interval]:
    """Narrow variable ranges knowing that ``cond`` is ``truth`` (comparisons of a
    variable with an affine bound, and conjunctions of those)."""
    if isinstance(cond, Unary) and cond.op == "invert" and cond.dtype.is_bool:
        return refine(cond.x, env, not truth)
    if not isinstance(cond, Binary):
        return env
    if cond.op == "and" and truth:
        return refine(cond.b, refine(cond.a, env, True), True)
    if cond.op == "or" and not truth:
        return refine(cond.b, refine(cond.a, env, False), False)
    op = cond.op
    if not truth:
        op = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "ne": "eq", "eq": "ne"}.get(op)
    if op is None:
        return env
    lhs, rhs = cond.a, cond.b
    if not _has_var(lhs) and _has_var(rhs):
        lhs, rhs = rhs, lhs
        op = _FLIPPED.get(op)
    rb = bounds(rhs, env)
    if rb is not None and op not in (None, "ne") and not isinstance(lhs, IterVar) and lhs.dtype.is_int:
        # the whole left side is bounded too: a guard 0 <= h - k < n on an index h - k
        # (which interval arithmetic on h and k alone cannot see) proves the load in range
        env = _record(env, lhs, op, rb)
    # move the other terms across: v + e < r  <=>  v < r - e, so v <= hi(r) - lo(e) - 1
    while rb is not None and isinstance(lhs, Binary) and lhs.op in ("add", "sub"):
        if lhs.op == "sub" and _has_var(lhs.b) and not _has_var(lhs.a):
            # a - v < r  <=>  v > a - r: a flipped index (``m - 1 - j`` composed with a shift's ``j + 1 < m``)
            ba = bounds(lhs.a, env)
            if ba is None:
                return env
            lhs, rb, op = lhs.b, (ba[0] - rb[1], ba[1] - rb[0]), _FLIPPED.get(op)
            continue
        if lhs.op == "add" and isinstance(lhs.b, IterVar):
            lhs, rest, sign = lhs.b, lhs.a, 1
        else:
            lhs, rest, sign = lhs.a, lhs.b, 1 if lhs.op == "add" else -1
        be = bounds(rest, env)
        if be is None:
            return env
        rb = (rb[0] - be[1], rb[1] - be[0]) if sign == 1 else (rb[0] + be[0], rb[1] + be[1])
    if not isinstance(lhs, IterVar) or lhs not in env or op is None or rb is None:
        return env
    lo, hi = was = env[lhs]
    one = Affine.of(1)
    if op == "lt":
        hi = _tighter_hi(hi, rb[1] - one)
    elif op == "le":
        hi = _tighter_hi(hi, rb[1])
    elif op == "gt":
        lo = _tighter_lo(lo, rb[0] + one)
    elif op == "ge":
        lo = _tighter_lo(lo, rb[0])
    elif op == "eq":
        lo, hi = _tighter_lo(lo, rb[0]), _tighter_hi(hi, rb[1])
    elif op == "ne" and rb[0] == rb[1] and rb[0] in (lo, hi):  # one end excluded (i != 0 past a cat's 1st column)
        lo, hi = (lo + one, hi) if rb[0] == lo else (lo, hi - one)
    out = dict(env)
    out[lhs] = (lo, hi)
    # a bound replaced by one it cannot be compared with (``i >= m - 1`` after ``i >= 1``) still holds: kept as
    # a range of its own, so that a test for an empty loop sees both (``m = 1`` runs neither)
    if lo is not was[0] and (lo - was[0]).sign() is None:
        out[("bound", lhs, was[0])] = (was[0], hi)
    if hi is not was[1] and (was[1] - hi).sign() is None:
        out[("bound", lhs, was[1])] = (lo, was[1])
    return out


#: A comparison with its sides swapped (``a < b`` is ``b > a``).
_FLIPPED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}


def _record(env: dict, e: Expr, op: str, rb: Interval) -> dict:
    k = expr_key(e)
    lo, hi = env.get(k, (None, None))
    one = Affine.of(1)
    if op in ("lt", "le", "eq"):
        new = rb[1] - one if op == "lt" else rb[1]
        hi = new if hi is None else _tighter_hi(hi, new)
    if op in ("gt", "ge", "eq"):
        new = rb[0] + one if op == "gt" else rb[0]
        lo = new if lo is None else _tighter_lo(lo, new)
    out = dict(env)
    out[k] = (lo, hi)
    return out


def var_ranges(env: dict) -> list[Interval]:
    """The complete ranges in ``env``: of index variables, and of whole expressions
    bounded on both sides (an empty one means the code is unreachable)."""
    return [r for r in env.values() if r[0] is not None and r[1] is not None]


def _larger(x: Affine, y: Affine) -> Affine | None:
    """The provably larger of two bounds, or None."""
    return x if (x - y).sign() == 1 else (y if (y - x).sign() == 1 else None)


def _smaller(x: Affine, y: Affine) -> Affine | None:
    return y if (x - y).sign() == 1 else (x if (y - x).sign() == 1 else None)


def _has_var(e: Expr) -> bool:
    return isinstance(e, IterVar) or any(_has_var(c) for c in e.children())


def _tighter_hi(old: Affine, new: Affine) -> Affine:
    # keep the new bound when provably no looser, or when the old one is not affine-comparable
    return new if (old - new).sign() == 1 or (old - new).sign() is None else old


def _tighter_lo(old: Affine, new: Affine) -> Affine:
    return new if (new - old).sign() == 1 or (new - old).sign() is None else old


def ranges_over(env: dict, variables) -> frozenset:
    """The part of ``env`` an expression over ``variables`` can depend on: their ranges, and the bounds
    on whole expressions; hashable, to memoise a path-sensitive pass per node and relevant ranges."""
    return frozenset((k, r) for k, r in env.items() if not isinstance(k, IterVar) or k in variables)


CHECK_BOUNDS_VISITS = 5000


def check_bounds(t: Tensor) -> None:
    """Reject a compute whose load (or scatter target) provably leaves its
    tensor for every size (``x[i + 1]`` with ``i`` over the whole of ``x``);
    the code generator checks or guards what cannot be decided here."""
    what = "scatter" if t.is_scatter else "scan" if t.is_scan else "compute"

    empty: dict[int, tuple[dict, bool]] = {}  # per ranges: whether provably nothing runs under them

    def check(idx: Expr, extent: Expr, env: dict[IterVar, Interval], desc, tensor: Tensor, d: int):
        if id(env) not in empty:
            empty[id(env)] = (env, any((hi - lo).sign() == -1 for lo, hi in var_ranges(env)))
        if empty[id(env)][1]:
            return
        b, ext = bounds(idx, env), affine(extent)
        if b is None or ext is None:
            return
        if b[0].sign() == -1 or (ext - Affine.of(1) - b[1]).sign() == -1:
            raise TEError(
                f"{what} {t.name!r}: {desc()} is out of bounds: it ranges over "
                f"[{_fmt(b[0])}, {_fmt(b[1])}] but {tensor.name!r} dimension {d} has extent "
                f"{extent!r}; guard it with te.select or shrink the {'domain' if t.is_scatter else 'compute'}"
            )

    free = FreeVars()
    seen: set = set()

    def visit(e: Expr, env: dict[IterVar, Interval]):
        # a shared node under ranges that agree on its variables is checked once; nested selects over
        # many index variables may still refine the ranges along exponentially many paths, so the
        # check gives up after CHECK_BOUNDS_VISITS (it only rejects early what the code generator's
        # own checks and guards would catch at run time)
        here = (id(e), ranges_over(env, free(e)))
        if here in seen or len(seen) > CHECK_BOUNDS_VISITS:
            return
        seen.add(here)
        if isinstance(e, Select):
            visit(e.cond, env)
            visit(e.a, refine(e.cond, env, True))
            visit(e.b, refine(e.cond, env, False))
            return
        if isinstance(e, Reduce):
            inner = dict(env)
            for ax in e.axes:
                if (r := axis_range(ax, inner)) is not None:
                    inner[ax] = r
            visit(e.body, inner)
            return
        if isinstance(e, Load):
            for d, idx in enumerate(e.indices):
                check(idx, e.tensor.shape[d], env, lambda d=d: f"index {d} of {e!r}", e.tensor, d)
        for c in e.children():
            visit(c, env)

    visit(t.body, ranges(t.axes))
    u = t.update
    if u is not None:
        env = ranges(u.domain)
        if u.cond is not None:
            visit(u.cond, env)
            env = refine(u.cond, env, True)
        for d, tg in enumerate(u.targets):
            visit(tg, env)
            check(tg, t.shape[d], env, lambda d=d, tg=tg: f"target index {d} ({tg!r})", t, d)
        visit(u.value, env)


def ranges(axes) -> dict[IterVar, Interval]:
    """The ranges of loop variables that depend on sizes only."""
    return {ax: r for ax in axes if (r := axis_range(ax, {})) is not None}


def _fmt(a: Affine) -> str:
    parts = [f"{'' if c == 1 else c}{'*' if c != 1 else ''}{v.name}" for v, c in a.terms]
    if a.const or not parts:
        parts.append(str(a.const))
    return " + ".join(parts).replace("+ -", "- ")
