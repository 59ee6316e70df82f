"""Reverse-mode automatic differentiation of tensor expressions.

``gradient(outputs, inputs, head)`` walks the program from the outputs back
to the inputs.  For every compute ``Y`` (over index variables ``i``) whose
adjoint ``dY`` is known, reverse mode over the scalar body gives, for each
load ``X[f(v)]`` in it, a contribution ``c(v)``: ``dY[i]`` times the partial
derivative of the body with respect to that load, where ``v`` are ``Y``'s
index variables plus the reduce axes around the load.  Then

    dX[j] = sum over every v in the domain with f(v) = j of c(v)

which is turned into a compute over ``X``'s shape by solving ``f(v) = j`` for
``v`` (NeoFlow's approach): the index map is parsed into integer affine forms,
a variable is eliminated per equation (spatial variables of ``Y`` first, so
that what is left to sum over is a small window), and what stays unsolved is
summed over.  The result is a *gather*: ``dX[j]`` reads ``dY`` at the solved
positions, guarded by "the solution lies in ``Y``'s domain" (strided windows
enumerate only the offsets that divide evenly), so no atomics and no
zero-filled buffers are needed.  Data-dependent or non-affine maps fall back
to ``te.scatter``.

All contributions to one tensor are summed inside one compute; reductions
that an adjoint needs per element of ``Y`` (a row's lifted adjoint, the tie
count of a max) become computes over ``Y``'s domain, which fusion then keeps
in registers when they are read once per row.  Scatters that add are
differentiated through their update; a scan's adjoint is a scan the other
way.  See ``docs/autodiff.md``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import NamedTuple

from tailjit.te import dtypes
from tailjit.te.analysis import (
    Affine,
    FreeVars,
    NodeMemo,
    Quotient,
    axis_range,
    bounds,
    ranges_over,
    rebuild,
    refine,
    rewrite,
    substitute,
)
from tailjit.te.dsl import compute, placeholder, scan, scatter
from tailjit.te.expr import (
    Absent,
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
    as_expr,
    binary,
    cast,
    is_size_expr,
    select,
    unary,
    walk,
)
from tailjit.te.graph import has_reduction, reachable
from tailjit.te.primitives import PRIMITIVES, UNARY

__all__ = ["gradient", "backward_program", "replace_tensors", "simplify", "decide"]


def gradient(outputs, inputs, head=None) -> list[Tensor]:
    """Gradients of ``outputs`` with respect to ``inputs``, as computes.

    ``outputs`` is a compute or a list of computes; ``inputs`` a tensor or a
    list (placeholders or computes of the program) of floating dtype.
    ``head`` gives the gradient flowing into each output: a tensor (or a list,
    one per output, entries may be None) with the output's shape, or None for
    ones everywhere, which makes the result the gradient of the sum of all
    outputs.  Integer and bool outputs and intermediates carry no gradient.

    Returns one compute per input, with the input's shape and dtype.  An input
    that the outputs do not depend on gets zeros.
    """
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    ins = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    if not outs:
        raise TEError("te.gradient needs at least one output")
    for t in outs:
        if not isinstance(t, Tensor) or t.is_placeholder:
            raise TEError(f"te.gradient: outputs must be computes, got {t!r}")
    for t in ins:
        if not isinstance(t, Tensor):
            raise TEError(f"te.gradient: inputs must be te tensors, got {t!r}")
        if not t.dtype.is_float:
            raise TEError(f"te.gradient: input {t.name!r} has dtype {t.dtype}; only floating inputs have gradients")
    if len({id(t) for t in ins}) != len(ins):
        raise TEError("te.gradient: an input is listed twice")
    heads = _heads(outs, head)
    return _Grad(outs, ins, heads).run()


def _heads(outs: list[Tensor], head) -> list[Tensor | None]:
    if head is None:
        return [None] * len(outs)
    heads = [head] if isinstance(head, Tensor) else list(head)
    if len(heads) != len(outs):
        raise TEError(f"te.gradient: {len(outs)} output(s) but {len(heads)} head tensor(s)")
    for o, h in zip(outs, heads):
        if h is None:
            continue
        if not isinstance(h, Tensor):
            raise TEError(f"te.gradient: head for {o.name!r} must be a te tensor or None, got {h!r}")
        if h.ndim != o.ndim or any(a.key != b.key for a, b in zip(h.shape, o.shape)):
            raise TEError(
                f"te.gradient: head {h.name!r} has shape {list(h.shape)} but output {o.name!r} has "
                f"shape {list(o.shape)}; create the head with the output's shape"
            )
        if not h.dtype.is_float:
            raise TEError(f"te.gradient: head {h.name!r} must be floating, got {h.dtype}")
    return heads


# -- small expression builders that fold the trivial cases ---------------------------------------


def _is_const(e: Expr | None, value) -> bool:
    return isinstance(e, Const) and not e.dtype.is_bool and e.value == value and not math.isnan(e.value)


def _add(a: Expr | None, b: Expr | None) -> Expr | None:
    """``a + b`` where None is an exact zero."""
    if a is None:
        return b
    if b is None:
        return a
    return binary("add", a, b)


def _mul(a: Expr, b: Expr) -> Expr:
    for x, y in ((a, b), (b, a)):
        if _is_const(x, 1):
            return y if y.dtype.is_float or not x.dtype.is_float else cast(y, x.dtype)
        if _is_const(x, -1) and y.dtype.is_float:
            return _neg(y)
    return binary("mul", a, b)


def _scale(a: Expr, f, op: str = "mul") -> Expr:
    """The adjoint ``a`` times (or divided by) ``f``.  Where ``a`` is a select with a zero
    branch, the factor moves inside: a branch not taken keeps an exact zero gradient even
    where the factor is inf or NaN (torch's ``where`` gives NaN there), and the select stays
    at the top, where the gather can see its condition."""
    if isinstance(a, Select) and a.dtype.is_float and (_is_zero(a.a) or _is_zero(a.b)):
        inner_a = a.a if _is_zero(a.a) else _scale(a.a, f, op)
        inner_b = a.b if _is_zero(a.b) else _scale(a.b, f, op)
        return select(a.cond, inner_a, inner_b)
    return _mul(a, as_expr(f)) if op == "mul" else binary("truediv", a, f)


def _cast_adj(a: Expr, dt) -> Expr:
    if isinstance(a, Select) and a.dtype != dt and (_is_zero(a.a) or _is_zero(a.b)):
        return select(a.cond, _cast_adj(a.a, dt), _cast_adj(a.b, dt))
    return cast(a, dt)


def _neg(a: Expr) -> Expr:
    if isinstance(a, Unary) and a.op == "neg":
        return a.x
    if isinstance(a, Select) and a.dtype.is_float and (_is_zero(a.a) or _is_zero(a.b)):
        return select(a.cond, a.a if _is_zero(a.a) else _neg(a.a), a.b if _is_zero(a.b) else _neg(a.b))
    if isinstance(a, Const):
        return Const(-a.value, a.dtype, a.weak)
    return unary("neg", a)


def _sel(c: Expr, a: Expr | None, b: Expr | None) -> Expr | None:
    """``select(c, a, b)`` with None for zero (``Absent``: nothing where a sum of contributions adds it)."""
    if a is None and b is None:
        return None
    dt = (a if a is not None else b).dtype
    zero = Absent(dt)
    return select(c, a if a is not None else zero, b if b is not None else zero)


def _i(v: int) -> Const:
    return Const(v, dtypes.int64)


def _iadd(a: Expr | None, b: Expr | None) -> Expr | None:
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, Const) and isinstance(b, Const):
        return _i(a.value + b.value)
    if isinstance(b, Const) and b.value < 0:
        return binary("sub", a, _i(-b.value))
    if isinstance(b, Unary) and b.op == "neg":
        return binary("sub", a, b.x)
    return binary("add", a, b)


def _iscale(a: Expr | None, k: int) -> Expr | None:
    if a is None or k == 0:
        return None
    if isinstance(a, Const):
        return _i(a.value * k)
    if k == 1:
        return a
    if k == -1:
        return _neg(a)
    return binary("mul", _i(k), a)


def _conj(conds: list[Expr]) -> Expr | None:
    out = None
    for c in conds:
        out = c if out is None else binary("and", out, c)
    return out


# -- the adjoint rules of the scalar operations ---------------------------------------------------


class _Incoming:
    """``grad`` in an adjoint formula of ``te.primitives``: the adjoint of the node, which ``*`` and ``/``
    scale (``_scale``: the factor moves inside a zero-branch select) and ``-`` negates."""

    __slots__ = ("e",)

    def __init__(self, e: Expr):
        self.e = e

    def __mul__(self, f) -> _Incoming:
        return _Incoming(_scale(self.e, f))

    __rmul__ = __mul__

    def __truediv__(self, f) -> _Incoming:
        return _Incoming(_scale(self.e, f, "truediv"))

    def __neg__(self) -> _Incoming:
        return _Incoming(_neg(self.e))


def _plain(g) -> Expr | None:
    """A formula's value as an expression (None: no gradient)."""
    return g.e if isinstance(g, _Incoming) else g


def _sgn(x: Expr) -> Expr | None:
    """torch's ``sgn``: 1, -1, and 0 for 0 and NaN."""
    return _sel(x > 0, Const(1.0, x.dtype), _sel(x < 0, Const(-1.0, x.dtype), None))


def _where(cond: Expr, a, b) -> Expr | None:
    """``a`` where ``cond`` holds, else ``b``; None is no gradient."""
    return _sel(cond, _plain(a), _plain(b))


def _atan2_backward(grad: _Incoming, x: Expr, y: Expr) -> tuple[Expr, Expr]:
    """torch: recip = 1 / (self^2 + other^2), 0 where that sum is 0; grad * other * recip, grad * -self * recip."""
    denom = x * x + y * y
    recip = select(denom == 0, Const(0.0, denom.dtype), binary("truediv", 1.0, denom))
    return _mul(_scale(grad.e, y), recip), _mul(_scale(grad.e, _neg(x)), recip)


def _zeros_like(grad: _Incoming) -> Expr:
    """torch's ``zeros_like(grad)``: a zero that the ops before multiply (``0 * inf`` is NaN), not no gradient."""
    return Const(0.0, grad.e.dtype)


def _pow_backward(grad: _Incoming, x: Expr, y: Expr, val: Expr) -> tuple[Expr | None, Expr | None]:
    """torch's pow_backward_self and pow_backward_exponent."""
    return _pow_adjoints(x, y, grad.e, val)


#: What an adjoint formula may name besides its operands (see ``te.primitives``): each unary primitive
#: as a function, and helpers named as in PyTorch's derivatives.yaml.
FORMULA_HELPERS = {
    **{name: functools.partial(unary, name) for name in UNARY},
    "sgn": _sgn,
    "where": _where,
    "atan2_backward": _atan2_backward,
    "zeros_like": _zeros_like,
    "pow_backward": _pow_backward,
}


def _adjoints(n: Unary | Binary, a: Expr, val: Expr) -> list[tuple[Expr, Expr | None]]:
    """Each operand of ``n`` with its adjoint, given the adjoint ``a`` of ``n`` (``val`` is ``n``'s value),
    by the formula of ``n``'s primitive."""
    prim = PRIMITIVES.get(n.op)
    if prim is None:  # pragma: no cover - every operation with a floating result is a primitive
        raise TEError(f"te.gradient: no adjoint rule for {n.op!r}")
    operands = n.children()
    if prim.adjoint is None:
        return [(x, None) for x in operands]
    known = {"grad": _Incoming(a), "self": operands[0], "result": val}
    if prim.arity == 2:
        known["other"] = operands[1]
    got = prim.adjoint(*(known[k] if k in known else FORMULA_HELPERS[k] for k in prim.formula_args))
    return [(x, _plain(g)) for x, g in zip(operands, (got,) if prim.arity == 1 else got)]


def _pow_adjoints(x: Expr, y: Expr, a: Expr, val: Expr) -> tuple[Expr | None, Expr | None]:
    if isinstance(y, Const):  # torch's pow(Tensor, Scalar): zero for exponent 0
        c = y.value
        if c == 0:
            return None, None
        if c == 1:
            return a, None
        p = x if c == 2 else binary("pow", x, c - 1)
        return _scale(a, _mul(Const(c, y.dtype, True), p)), None
    dx = _sel(y == 0, None, _scale(a, y * binary("pow", x, y - 1)))
    if isinstance(x, Const) and x.value != 0:
        dy = _scale(a, val * unary("log", x))
    else:
        dy = _scale(a, _sel((x == 0) & (y >= 0), None, val * unary("log", x)))
    return dx, dy


# -- the program-level reverse pass ---------------------------------------------------------------


class _Space(NamedTuple):
    """The iteration space an expression is evaluated over: a compute's body (its axes) or a
    scatter's update (its domain)."""

    name: str
    shape: tuple[Expr, ...]
    axes: tuple[IterVar, ...]


@dataclass
class _Contribution:
    """``dX[f(v)] += value(v)`` for every ``v`` of ``domain`` (the space's axes and reduce axes)."""

    load: Load
    value: Expr
    domain: tuple[IterVar, ...]
    consumer: _Space


@dataclass
class _SeededBody:
    """A body to propagate the adjoint ``seed`` through, over ``domain``: a compute's or update's own
    expression, or a reduction's body once every body around it is done."""

    body: Expr
    seed: Expr
    domain: tuple[IterVar, ...]


class _Grad:
    def __init__(self, outs: list[Tensor], ins: list[Tensor], heads: list[Tensor | None]):
        self.outs, self.ins, self.heads = outs, ins, heads
        self.order = reachable(outs)
        wanted = {id(t) for t in ins}
        self.depends: set[int] = set()  # tensors some input flows into
        for t in self.order:
            if t.stop_gradient:
                continue
            if id(t) in wanted or any(
                isinstance(n, Load) and id(n.tensor) in self.depends for e in t.exprs() for n in walk(e)
            ):
                self.depends.add(id(t))
        self.contribs: dict[int, list[_Contribution]] = {}
        self.aux: dict[tuple, Tensor] = {}
        self.free = FreeVars()

    def run(self) -> list[Tensor]:
        adjoint: dict[int, Tensor] = {}
        head_of = {id(o): (h, True) for o, h in zip(self.outs, self.heads)}
        for t in reversed(self.order):
            if id(t) not in self.depends or not t.dtype.is_float:
                continue
            seeded = id(t) in head_of
            contribs = self.contribs.pop(id(t), [])
            if not seeded and not contribs:
                continue
            d = self._adjoint_tensor(t, head_of.get(id(t), (None, False)), contribs)
            adjoint[id(t)] = d
            if t.is_placeholder:
                continue
            space = _Space(t.name, t.shape, t.axes)
            if t.is_scan:
                d = self._scan_adjoint(t, d)
                adjoint[id(t)] = d
                self._backprop(space, t.body, Load(d, t.axes), Load(t, t.axes))
                self.contribs.pop(id(t), None)  # its own previous element: in the recurrence of d
                continue
            if not t.is_scatter:
                self._backprop(space, t.body, Load(d, t.axes), Load(t, t.axes))
                continue
            u = t.update
            if u.combine not in ("add", "assign"):
                raise TEError(
                    f"te.gradient: the scatter {t.name!r} combines with {u.combine!r}; only 'add' and 'assign' "
                    "are differentiable"
                )
            # out = copy of base, then out[targets(v)] += value(v): base gets dout, value(v) gets dout[targets(v)].
            # With assign, base gets dout only where no update writes, and every value(v) its target's dout,
            # duplicates included, as eager's scatter, index_put and index_copy backwards give it.
            seed = Load(d, t.axes)
            if u.combine == "assign":
                seed = _sel(Load(_written(t), t.axes), None, seed)
            self._backprop(space, t.body, seed, None)
            seed = Load(d, u.targets)
            seed = _sel(u.cond, seed, None) if u.cond is not None else seed
            self._backprop(_Space(t.name, tuple(v.extent for v in u.domain), u.domain), u.value, seed, None)
        return [adjoint[id(t)] if id(t) in adjoint else _zeros(t) for t in self.ins]

    def _scan_adjoint(self, t: Tensor, ext: Tensor) -> Tensor:
        """The adjoint of a scan: a scan the other way.

        With ``out[i] = f(out[i - 1], i)`` (forward; the mirror for reverse scans) and ``ext``
        the gradient reaching ``out`` from its consumers, ``d[i] = ext[i] + g(i + 1) * d[i + 1]``
        where ``g(p)`` is the partial derivative of ``f`` at ``p`` with respect to its
        previous element, found by reverse mode over the body with a unit seed."""
        saved, self.contribs = self.contribs, {}
        try:
            self._backprop(_Space(t.name, t.shape, t.axes), t.body, Const(1.0, t.dtype), Load(t, t.axes))
            own = self.contribs.get(id(t), [])
        finally:
            self.contribs = saved
        axis, ax = t.scan_axis, t.axes[t.scan_axis]
        g = None
        for c in own:
            step = binary("add", ax, 1) if t.reverse else binary("sub", ax, 1)
            prev = tuple(step if a is ax else a for a in t.axes)
            if c.domain != tuple(t.axes) or any(i.key != p.key for i, p in zip(c.load.indices, prev)):
                raise TEError(f"te.gradient: the scan {t.name!r} reads itself other than at its previous element")
            g = _add(g, c.value)
        if g is None:
            return ext
        n = t.shape[axis]

        def body(dnext, *j):
            nxt = binary("sub", j[axis], 1) if t.reverse else binary("add", j[axis], 1)
            has = binary("ge", nxt, 0) if t.reverse else binary("lt", nxt, n)
            g_next = substitute(g, {a: (nxt if k == axis else j[k]) for k, a in enumerate(t.axes)})
            return simplify(_add(Load(ext, j), _sel(has, _scale(g_next, dnext), None)), _axes_env(j))

        return scan(t.shape, axis, body, initial=0.0, dtype=t.dtype, reverse=not t.reverse, name=f"grad_{t.name}")

    # -- adjoint tensors ----------------------------------------------------------------------
    def _adjoint_tensor(self, t: Tensor, head: tuple, contribs: list[_Contribution]) -> Tensor:
        h, seeded = head
        scatters: list[_Contribution] = []

        def body(*j):
            total = None
            if seeded:
                total = cast(h[j], t.dtype) if h is not None else Const(1.0, t.dtype)
            for c in contribs:
                g = self._gather(c, t, j)
                if g is None:
                    scatters.append(c)
                else:
                    total = _add(total, cast(g, t.dtype))
            return total if total is not None else Const(0.0, t.dtype)

        d = compute(t.shape, lambda *j: simplify(body(*j), _axes_env(j)), name=f"grad_{t.name}")
        for c in scatters:
            d = self._scatter(d, c, t)
        return d

    # -- reverse mode over one compute's body ----------------------------------------------------
    def _backprop(self, y: _Space, body: Expr, seed: Expr, root: Expr | None) -> None:
        """Record a contribution for every float load in ``body`` (over ``y``) that an input
        flows into, for the adjoint ``seed`` of ``body``; ``root`` is the stored value of
        ``body`` (the compute's own element), if any."""
        order: list[IterVar] = list(y.axes)
        depth: dict[tuple, int] = {}

        def scan(e: Expr, d: int, seen: set):
            if (id(e), d) in seen:
                return
            seen.add((id(e), d))
            if isinstance(e, Reduce):
                depth[e.key] = max(depth.get(e.key, 0), d)
                order.extend(a for a in e.axes if all(a is not o for o in order))
                scan(e.body, d + 1, seen)
                return
            for c in e.children():
                scan(c, d, seen)

        scan(body, 0, set())
        rank = {v: k for k, v in enumerate(order)}
        body_key = body.key
        value = lambda n: root if root is not None and n.key == body_key else n  # noqa: E731 - a node's primal value

        pending: dict[tuple, list] = {}  # reduction key -> [node, lifted adjoint]
        bodies = [_SeededBody(body, seed, tuple(y.axes))]
        while bodies:
            sb = bodies.pop()
            self._backprop_body(y, sb, value, pending, rank)
            if not bodies and pending:
                # a reduction is processed once every body around it is done: in order of depth
                nearest = min(pending, key=lambda k: depth[k])
                r, adj = pending.pop(nearest)
                dom = self._reduce_domain(r, rank)
                val = value(r)
                # the stored element (a keepdim max's y[i, j, 0]) is the same along the axes the reduction
                # does not depend on: read it at their first position, within the reduction's domain
                outside = {v: v.lo for v in y.axes if all(v is not d for d in dom)}
                if val is not r and outside:
                    val = substitute(val, outside)
                bodies.append(_SeededBody(r.body, self._reduce_seed(y, r, adj, val, dom), dom))

    def _backprop_body(self, y: _Space, sb: _SeededBody, value, pending: dict, rank: dict) -> None:
        post: list[Expr] = []
        seen: set[tuple] = set()
        stack: list[tuple[Expr, bool]] = [(sb.body, False)]
        while stack:  # post order by key, not entering reductions
            n, done = stack.pop()
            if done:
                post.append(n)
                continue
            if n.key in seen:
                continue
            seen.add(n.key)
            stack.append((n, True))
            if not isinstance(n, (Reduce, Load)):
                stack.extend((c, False) for c in n.children())
        adj: dict[tuple, Expr] = {sb.body.key: sb.seed}
        for n in reversed(post):
            a = adj.pop(n.key, None)
            if a is None or not n.dtype.is_float:
                continue
            if isinstance(n, Load):
                if id(n.tensor) in self.depends:
                    self.contribs.setdefault(id(n.tensor), []).append(_Contribution(n, a, sb.domain, y))
                continue
            if isinstance(n, Reduce):
                if not any(id(m.tensor) in self.depends for m in walk(n.body) if isinstance(m, Load)):
                    continue
                lifted = self._lift(a, sb.domain, self._closure(self.free(n)))
                got = pending.get(n.key)
                pending[n.key] = [n, _add(got[1], lifted) if got else lifted]
                continue
            for child, d in self._rules(n, a, value(n)):
                if d is not None and child.dtype.is_float:
                    adj[child.key] = _add(adj.get(child.key), _cast_adj(d, child.dtype))

    def _rules(self, n: Expr, a: Expr, val: Expr) -> list[tuple[Expr, Expr | None]]:
        if isinstance(n, Unary):
            return _adjoints(n, a, val)
        if isinstance(n, Binary):
            if not n.dtype.is_float:
                return []
            return _adjoints(n, a, val)
        if isinstance(n, Select):
            return [(n.a, _sel(n.cond, a, None)), (n.b, _sel(n.cond, None, a))]
        if isinstance(n, Cast):
            return [(n.x, a)]
        return []

    def _closure(self, vs) -> set[IterVar]:
        """``vs`` and every variable their ranges depend on."""
        out, stack = set(vs), list(vs)
        while stack:
            v = stack.pop()
            for u in self.free(v.lo) | self.free(v.extent):
                if u not in out:
                    out.add(u)
                    stack.append(u)
        return out

    def _reduce_domain(self, r: Reduce, rank: dict) -> tuple[IterVar, ...]:
        keep = self._closure(self.free(r))
        return tuple(sorted(keep, key=lambda v: rank[v])) + tuple(r.axes)

    def _lift(self, a: Expr, domain: tuple[IterVar, ...], keep: set[IterVar]) -> Expr:
        """Sum ``a`` over the variables of ``domain`` not in ``keep``: a reduction's adjoint
        depends only on the variables the reduction itself depends on."""
        extra = [v for v in domain if v not in keep]
        return _sum_over(a, extra, self.free) if extra else a

    def _reduce_seed(self, y: _Space, r: Reduce, a: Expr, val: Expr, dom: tuple[IterVar, ...]) -> Expr:
        """The adjoint of a reduction's body from the reduction's adjoint ``a``."""
        if r.op == "sum":
            return a
        fresh = {ax: IterVar(ax.name, ax.lo, ax.extent, "reduce") for ax in r.axes}
        other = substitute(r.body, fresh)
        if r.op in ("max", "min"):
            # torch's amax/amin backward: the gradient is split evenly between tied extremes
            body, axes = r.body, tuple(fresh.values())
            if not (isinstance(body, Load) and body.tensor.is_placeholder):
                stored = self._stored(y, r, dom)
                if stored is not None:  # compare stored values, which a recomputation might round differently
                    body, other, val, axes = stored
            count = Reduce("sum", binary("eq", other, val), axes)
            return _scale(_scale(a, count, "truediv"), cast(binary("eq", body, val), r.dtype))
        if r.op == "prod":
            # prod / x where x != 0, else the product of the others (exact with zeros, as torch)
            same = _conj([binary("eq", f, ax) for ax, f in fresh.items()])
            others = Reduce("prod", select(same, Const(1.0, r.dtype), other), tuple(fresh.values()))
            return select(r.body != 0, _scale(a, binary("truediv", val, r.body)), _scale(a, others))
        raise TEError(f"te.gradient: {r.op} is not differentiable")  # pragma: no cover - integer results

    def _stored(self, y: _Space, r: Reduce, dom: tuple[IterVar, ...]):
        """``r``'s body as a materialised compute over its domain ``dom`` (the variables it depends
        on, then its axes): the body at the current element, at fresh copies of the axes, and the
        extreme recomputed from the stored values.  None when the domain is not a box."""
        if not all(is_size_expr(v.lo) and is_size_expr(v.extent) for v in dom):
            return None
        vals = compute(
            [v.extent for v in dom],
            lambda *ix: substitute(r.body, {v: i if _is_const(v.lo, 0) else i + v.lo for v, i in zip(dom, ix)}),
            name=f"{y.name}_{r.op}_values",
        )
        vals.materialize = True

        def at(m: dict) -> Load:
            return Load(
                vals, tuple(_iadd(m.get(v, v), _iscale(v.lo, -1) if not _is_const(v.lo, 0) else None) for v in dom)
            )

        fresh = {ax: IterVar(ax.name, ax.lo, ax.extent, "reduce") for ax in r.axes}
        fresh2 = {ax: IterVar(ax.name, ax.lo, ax.extent, "reduce") for ax in r.axes}
        return at({}), at(fresh), Reduce(r.op, at(fresh2), tuple(fresh2.values())), tuple(fresh.values())

    # -- load adjoints: gather by solving the index equations, else scatter ------------------------
    def _gather(self, c: _Contribution, x: Tensor, j: tuple[IterVar, ...]) -> Expr | None:
        value = self._hoist(c.value, c.consumer)
        # where the solution holds, the differentiated load reads x[j] and its index
        # expressions equal j (a padding guard 0 <= h * s + r - p < n becomes 0 <= j < n)
        repl = {c.load.key: Load(x, j)}
        for idx, jd in zip(c.load.indices, j):
            if not isinstance(idx, IterVar) and self.free(idx):
                repl[idx.key] = jd
        dom = set(c.domain)

        def swap(n: Expr, go, in_cond: bool = False):
            if isinstance(n, Reduce) and dom & set(n.axes):
                return n  # rebinds a variable: there the same key is another value
            if n.key == c.load.key:
                return repl[n.key]
            if in_cond and n.key in repl:
                return repl[n.key]
            if isinstance(n, Binary) and n.op in ("lt", "le", "gt", "ge", "eq", "ne"):
                # inside conditions only: elsewhere (x[2 * i + 1] -> x[j + 1]) it would hide the bounds
                return rebuild(n, lambda m: rewrite(m, lambda k, g: swap(k, g, True)))
            return None

        value = rewrite(value, swap)
        # addends guarded by an equality on the domain (a stacked column c == 0) are solved
        # on their own; the others stay one sum
        groups, plain = [], []
        ranges = _axes_env(c.domain)
        for part in _addends(value):
            v, conds = _peel(part)
            conds = conds + _pinned(conds, c.domain, ranges)
            if any(_is_equality(cd) and self.free(cd) & dom for cd in conds):
                groups.append((v, conds))
            else:
                plain.append(part)
        if plain:
            total = plain[0]
            for p in plain[1:]:
                total = binary("add", total, p)
            groups.append(_peel(total))
        out = None
        for v, conds in groups:
            g = self._gather_part(v, conds, c, j)
            if g is None:
                return None
            out = _add(out, g)
        return out

    def _gather_part(self, value: Expr, conds: list[Expr], c: _Contribution, j: tuple[IterVar, ...]) -> Expr | None:
        # the index under the conditions around the load: a slice's clamp (``min(max(i, 0), 31) + 32`` in
        # the half of a rotation that ``i < 32`` selects) is the identity there, and the map affine
        env = _axes_env(c.domain)
        for cd in conds:
            env = refine(cd, env, True)
        indices = tuple(simplify(i, env) for i in c.load.indices)
        sol = _solve(indices, j, c.domain, conds, self.free)
        if sol is None:
            return None
        mapping, guards, free, used = sol
        rest = [cd for k, cd in enumerate(conds) if k not in used]
        value = _sel(_conj(rest), value, None) if rest else value
        value = substitute(value, mapping)
        env = _axes_env(j)
        for f in free:
            if (rng := axis_range(f, env)) is not None:
                env[f] = rng
        guards = [g for g in (simplify(g, env) for g in guards) if not _is_true(g)]
        if any(_is_false(g) for g in guards):
            return Const(0.0, value.dtype)
        if free:
            # every guard goes inside the sum, even one that does not depend on the summed
            # axes: the code generator evaluates a reduction before the selects around it, so
            # a guard outside would not protect the sum's loads (bias[h + j] over rows)
            value = _sel(_conj(guards), value, None) if guards else value
            return _sum_over(value, [], self.free, axes=free)
        return _sel(_conj(guards), value, None) if guards else value

    def _hoist(self, e: Expr, y: _Space) -> Expr:
        """Reductions that depend only on ``y``'s index variables become computes over those
        dimensions of ``y``, evaluated once per element rather than once per use; with them the float
        arithmetic around a reduction over the same variables (a max's adjoint over its tie count)."""
        axes = set(y.axes)
        found = [n for n in walk(e) if isinstance(n, Reduce) and self.free(n) <= axes]
        if not found:
            return e
        found = self._with_arithmetic(e, found)
        repl: dict[tuple, Expr] = {}
        for r in found:
            if any(r.key != o.key and any(m.key == r.key for m in walk(o)) for o in found):
                continue  # inside another hoisted expression
            dims = [d for d, ax in enumerate(y.axes) if ax in self.free(r)]
            key = (id(y), r.key)
            t = self.aux.get(key)
            if t is None:

                def body(*i, r=r, dims=dims):
                    return substitute(r, {y.axes[d]: v for d, v in zip(dims, i)})

                t = compute([y.shape[d] for d in dims], body, name=f"{y.name}_adj")
                self.aux[key] = t
            repl[r.key] = Load(t, tuple(y.axes[d] for d in dims))
        return _replace_keys(e, repl)

    def _with_arithmetic(self, e: Expr, reductions: list[Reduce]) -> list[Expr]:
        """``reductions``, each replaced by the largest float arithmetic around it in ``e`` (no select, no
        integer operation) that depends on the reduction's own variables only."""
        keys = {r.key for r in reductions}
        out: dict[tuple, Expr] = {}

        def visit(n: Expr):
            if n.key in out:
                return
            if n.key in keys or (
                not isinstance(n, Reduce)
                and (inside := [m for m in walk(n) if m.key in keys])
                and self._arithmetic(n, inside)
            ):
                out[n.key] = n
                return
            for c in n.children():
                visit(c)

        visit(e)
        return list(out.values())

    def _arithmetic(self, n: Expr, reductions: list[Expr]) -> bool:
        free = frozenset().union(*(self.free(r) for r in reductions))
        if not n.dtype.is_float or not self.free(n) <= free:
            return False
        stack = [n]
        while stack:
            m = stack.pop()
            if isinstance(m, (Reduce, Const, SizeVar, IterVar)):
                continue
            if isinstance(m, Select) or not (m.dtype.is_float or isinstance(m, Load)):
                return False
            stack.extend(m.children())
        return True

    def _scatter(self, base: Tensor, c: _Contribution, x: Tensor) -> Tensor:
        for v in c.domain:
            if not (is_size_expr(v.lo) and is_size_expr(v.extent)):
                raise TEError(
                    f"te.gradient: cannot differentiate the load {c.load!r} in {c.consumer.name!r}: its index is "
                    f"not affine and the range of {v.name!r} depends on other indices"
                )
        # where the load sat under a select, the update is skipped, so that its target index
        # (which may be out of range there: a padding index) is never evaluated
        value, conds = _peel(self._hoist(c.value, c.consumer))
        cond = _conj(conds)
        dom = c.domain

        def fupdate(*idx):
            m = {v: (i if _is_const(v.lo, 0) else v.lo + i) for v, i in zip(dom, idx)}
            targets = tuple(substitute(i, m) for i in c.load.indices)
            val = cast(substitute(value, m), x.dtype)
            return (targets, val) if cond is None else (targets, val, substitute(cond, m))

        return scatter(base, tuple(v.extent for v in dom), fupdate, combine="add", name=base.name)


def _zeros(t: Tensor) -> Tensor:
    return compute(t.shape, lambda *j: Const(0.0, t.dtype), name=f"grad_{t.name}")


def _axes_env(j) -> dict:
    env: dict = {}
    for ax in j:
        if (r := axis_range(ax, env)) is not None:
            env[ax] = r
    return env


def _sum_over(a: Expr, vs: list[IterVar], free: FreeVars, axes: list[IterVar] | None = None) -> Expr:
    """The sum of ``a`` over variables ``vs`` (renamed to fresh reduce axes), or over the
    reduce axes ``axes`` already in ``a``; nested where a range depends on an outer one."""
    if axes is None:
        m: dict[IterVar, Expr] = {}
        axes = []
        for v in vs:
            f = IterVar(v.name, substitute(v.lo, m), substitute(v.extent, m), "reduce")
            m[v] = f
            axes.append(f)
        a = substitute(a, m)
    groups: list[list[IterVar]] = []
    for f in axes:
        if groups and not ((free(f.lo) | free(f.extent)) & set(groups[-1])):
            groups[-1].append(f)
        else:
            groups.append([f])
    for g in reversed(groups):
        a = _reduce_sum(a, g, free)
    return a


def _reduce_sum(a: Expr, axes: list[IterVar], free: FreeVars) -> Expr:
    if not (free(a) & set(axes)):
        # a body that does not vary: multiply by the number of terms
        n = None
        for f in axes:
            ext = f.extent if isinstance(f.extent, (SizeVar, Const)) else binary("maximum", f.extent, _i(0))
            n = ext if n is None else binary("mul", n, ext)
        return _mul(a, cast(n, a.dtype))
    # a select around the terms stays inside even when its condition does not depend on the
    # axes: the code generator evaluates a reduction before the selects around it, so a
    # guard moved out would no longer protect the loads it guards
    return Reduce("sum", a, tuple(axes))


def _is_zero(e: Expr) -> bool:
    return isinstance(e, Const) and e.dtype.is_float and e.value == 0


def _is_true(e: Expr) -> bool:
    return isinstance(e, Const) and e.dtype.is_bool and e.value is True


def _is_false(e: Expr) -> bool:
    return isinstance(e, Const) and e.dtype.is_bool and e.value is False


def _peel(e: Expr) -> tuple[Expr, list[Expr]]:
    """``select(c1, select(c2, v, 0), 0)`` as ``v`` and its conjuncts ``[c1, c2]``."""
    conds: list[Expr] = []
    while isinstance(e, Select):
        if _is_zero(e.b):
            conds += _conjuncts(e.cond)
            e = e.a
        elif _is_zero(e.a):
            conds.append(unary("invert", e.cond))
            e = e.b
        else:
            break
    return e, conds


def _pinned(conds: list[Expr], domain: tuple[IterVar, ...], ranges: dict) -> list[Expr]:
    """Equalities implied by conditions that leave a domain variable one value (a scan's
    first position: ``not i > 0`` with ``i >= 0`` is ``i == 0``), for the solver."""
    env = ranges
    for cd in conds:
        env = refine(cd, env, True)
    out = []
    for v in domain:
        if v in env and v in ranges and env[v] != ranges[v]:
            lo, hi = env[v]
            if lo == hi:
                const = lo.const if lo.is_const else None
                out.append(binary("eq", v, _i(const) if const is not None else _affine_expr(lo)))
    return out


def _affine_expr(a: Affine) -> Expr:
    out = _i(a.const) if a.const else None
    for v, c in a.terms:
        out = _iadd(out, _iscale(binary("floordiv", _affine_expr(v.num), _i(v.k)) if isinstance(v, Quotient) else v, c))
    return out if out is not None else _i(0)


def _addends(e: Expr) -> list[Expr]:
    if isinstance(e, Binary) and e.op == "add" and e.dtype.is_float:
        return _addends(e.a) + _addends(e.b)
    return [e]


def _is_equality(c: Expr) -> bool:
    return isinstance(c, Binary) and c.op == "eq" and c.a.dtype.is_int and c.b.dtype.is_int


def _conjuncts(c: Expr) -> list[Expr]:
    if isinstance(c, Binary) and c.op == "and" and c.dtype.is_bool:
        return _conjuncts(c.a) + _conjuncts(c.b)
    return [c]


def _replace_keys(e: Expr, repl: dict[tuple, Expr]) -> Expr:
    return rewrite(e, lambda n, go: repl.get(n.key))


# -- the index equations ----------------------------------------------------------------------------


@dataclass
class _Lin:
    """``sum(coef[v] * v) + const + other`` over index and size variables; ``other`` is
    size arithmetic that is not affine (``(h - 3) // 2``), or None."""

    coef: dict = field(default_factory=dict)
    const: int = 0
    other: Expr | None = None

    def scaled(self, k: int) -> _Lin:
        return _Lin({v: c * k for v, c in self.coef.items() if c * k}, self.const * k, _iscale(self.other, k))

    def plus(self, o: _Lin) -> _Lin:
        coef = dict(self.coef)
        for v, c in o.coef.items():
            coef[v] = coef.get(v, 0) + c
        return _Lin({v: c for v, c in coef.items() if c}, self.const + o.const, _iadd(self.other, o.other))

    def without(self, v) -> _Lin:
        return _Lin({u: c for u, c in self.coef.items() if u is not v}, self.const, self.other)

    def unknowns(self, unknowns: set) -> dict:
        return {v: c for v, c in self.coef.items() if v in unknowns}

    def expr(self, m: dict) -> Expr:
        """As an expression, variables replaced per ``m``: positive terms first, then the rest."""
        terms = [(m.get(v, v), c) for v, c in self.coef.items()]
        out = None
        for e, c in sorted(terms, key=lambda t: t[1] < 0):
            if out is None:
                out = _iscale(e, c)
            elif c > 0:
                out = binary("add", out, _iscale(e, c))
            else:
                out = binary("sub", out, _iscale(e, -c))
        out = _iadd(out, self.other)
        if self.const or out is None:
            out = _iadd(out, _i(self.const))
        return out

    def is_zero_cond(self) -> Expr:
        """``self == 0`` written as ``positive terms == negative terms``."""
        pos = _Lin({v: c for v, c in self.coef.items() if c > 0}, max(self.const, 0), self.other)
        neg = _Lin({v: -c for v, c in self.coef.items() if c < 0}, max(-self.const, 0))
        return binary("eq", pos.expr({}), neg.expr({}))


def _linear(e: Expr) -> _Lin | None:
    """``e`` as an integer affine form over index and size variables, or None."""
    if isinstance(e, (IterVar, SizeVar)):
        return _Lin({e: 1})
    if isinstance(e, Const) and e.dtype.is_int:
        return _Lin({}, e.value)
    if isinstance(e, Cast) and e.dtype.is_int and e.x.dtype.is_int and e.dtype.bits >= e.x.dtype.bits:
        return _linear(e.x)
    if isinstance(e, Unary) and e.op == "neg" and e.dtype.is_int:
        x = _linear(e.x)
        return x.scaled(-1) if x is not None else None
    if isinstance(e, Binary) and e.op in ("add", "sub", "mul") and e.dtype.is_int:
        a, b = _linear(e.a), _linear(e.b)
        if a is not None and b is not None:
            if e.op == "add":
                return a.plus(b)
            if e.op == "sub":
                return a.plus(b.scaled(-1))
            for p, q in ((a, b), (b, a)):
                if not p.coef and p.other is None:
                    return q.scaled(p.const)
    if is_size_expr(e):
        return _Lin({}, 0, e)
    return None


def _solve(indices, j, domain, conds, free: FreeVars):
    """Solve ``indices(v) == j`` (and equality conjuncts among ``conds``) for the domain variables.

    Returns ``(mapping, guards, free_axes, used_conds)``: ``mapping`` sends every domain
    variable to an expression over ``j`` and the fresh reduce axes ``free_axes`` still to
    sum over; ``guards`` say that the solution lies in the domain (and divides evenly);
    ``used_conds`` are the indices of ``conds`` the solution satisfies by construction.  An index read
    from a tensor (``x[i, t[i]]``, cross-entropy's target log-probability) becomes a guard when the other
    indices fix every variable it reads: the gradient is then a gather, ``select(t[i] == c, dY[i], 0)``,
    not a scatter.  Returns None when the maps are not affine or cannot be solved without fractions."""
    unknowns = set(domain)
    eqs: list[_Lin] = []
    aux: list[IterVar] = []
    data: list[tuple[Expr, IterVar]] = []  # indices read from tensors, over the domain's variables
    for idx, jd in zip(indices, j):
        if isinstance(idx, Binary) and idx.op == "floordiv" and isinstance(idx.b, Const) and idx.b.value > 0:
            # num // c == j  <=>  num == c * j + r with 0 <= r < c
            num = _linear(idx.a)
            if num is None:
                return None
            r = IterVar("r", _i(0), _i(idx.b.value), "reduce")
            aux.append(r)
            eqs.append(num.plus(_Lin({r: -1, jd: -idx.b.value})))
            continue
        lin = _linear(idx)
        if lin is None and idx.dtype.is_int and free(idx) <= unknowns:
            data.append((idx, jd))  # a guard once the other equations fix the variables it reads
            continue
        if lin is None or (lin.other is not None and free(lin.other) & unknowns):
            return None
        eqs.append(lin.plus(_Lin({jd: -1})))
    used = []
    for k, cd in enumerate(conds):
        if isinstance(cd, Binary) and cd.op == "eq" and cd.a.dtype.is_int and cd.b.dtype.is_int:
            lhs, rhs = _linear(cd.a), _linear(cd.b)
            if lhs is None or rhs is None or free(cd) - unknowns - set(j):
                continue
            eq = lhs.plus(rhs.scaled(-1))
            if eq.unknowns(unknowns) and (eq.other is None or not free(eq.other) & unknowns):
                eqs.append(eq)
                used.append(k)
    order = list(domain) + aux
    for prefer_spatial in (True, False):
        got = _eliminate(list(eqs), order, prefer_spatial, free, set(aux))
        if got is None:
            continue
        if not data:
            return (*got, used)
        mapping, guards, free_axes = got
        # a variable only the data index reads, of extent 1 (``gather(x, 1, t[:, None])``), is its start
        single = {f: f.lo for f in free_axes if _is_const(f.extent, 1)}
        if len(single) < len(free_axes):
            continue  # the guard would sit in a sum over the free variables: the scatter is cheaper
        mapping = {v: substitute(e, single) for v, e in mapping.items()}
        guards = [substitute(g, single) for g in guards]
        guards += [binary("eq", substitute(idx, mapping), jd) for idx, jd in data]
        return mapping, guards, [], used
    return None


def _eliminate(eqs: list[_Lin], order: list[IterVar], prefer_spatial: bool, free: FreeVars, aux: set):
    unknowns = set(order)
    rank = {v: k for k, v in enumerate(order)}

    def pref(v, a):
        kind = 2 if v in aux else (0 if (v.kind == "spatial") == prefer_spatial else 1)
        return (kind, abs(a) != 1, rank[v])

    solved: list[tuple[IterVar, _Lin, int]] = []  # a * v + rest == 0
    conds: list[Expr] = []
    while True:
        digit = _digit(eqs, unknowns)
        if digit is not None:
            e, v, value, low = digit
            eqs = [low if o is e else o.without(v).plus(_Lin({}, 0, _iscale(value, o.coef[v]))) if v in o.coef
                   else o for o in eqs]  # fmt: skip
            solved.append((v, _Lin({}, 0, value), -1))
            continue
        best = None
        for e in eqs:
            for v, a in e.unknowns(unknowns).items():
                if all(o is e or o.coef.get(v, 0) % a == 0 for o in eqs):
                    p = pref(v, a)
                    if best is None or p < best[0]:
                        best = (p, e, v, a)
        if best is None:
            if any(e.unknowns(unknowns) for e in eqs):
                return None
            break
        _, e, v, a = best
        rest = e.without(v)
        eqs = [o for o in eqs if o is not e]
        for k, o in enumerate(eqs):
            b = o.coef.get(v, 0)
            if b:
                eqs[k] = o.without(v).plus(rest.scaled(-(b // a)))
        solved.append((v, rest, a))
    for e in eqs:  # equations left without unknowns: conditions on j
        if e.coef or e.const or e.other is not None:
            conds.append(e.is_zero_cond())
    solved_vars = {v for v, _, _ in solved}
    fresh = {v: IterVar(v.name, v.lo, v.extent, "reduce") for v in order if v not in solved_vars}
    mapping: dict[IterVar, Expr] = dict(fresh)
    strided = _strided_windows(solved, fresh, unknowns, free)
    for v, rest, a in reversed(solved):
        if v in strided:
            mapping[v], u, _, u_val = strided[v]
            mapping[u] = u_val
            conds.append(binary("lt", u_val, _iadd(u.lo, u.extent)))  # masks a constant trip count's excess
            continue
        num = (rest.scaled(-1) if a > 0 else rest).expr(mapping)  # a * v == -rest
        if abs(a) == 1:
            mapping[v] = num
        else:
            mapping[v] = binary("floordiv", num, _i(abs(a)))
            conds.append(binary("eq", binary("mod", num, _i(abs(a))), _i(0)))
    # the free variables' ranges, in terms of the solution
    free_axes: list[IterVar] = []
    fresh_order = list(fresh.values())
    for k, (v, f) in enumerate(fresh.items()):
        if not any(f is s[2] for s in strided.values()):
            f.lo, f.extent = substitute(v.lo, mapping), substitute(v.extent, mapping)
        if (free(f.lo) | free(f.extent)) & set(fresh_order[k:]):
            return None  # a range depending on itself or an inner variable
        free_axes.append(f)
    for v, _, _ in solved:  # the solution must lie in the domain
        val, lo, ext = mapping[v], substitute(v.lo, mapping), substitute(v.extent, mapping)
        conds.append(binary("ge", val, lo))
        conds.append(binary("lt", val, _iadd(lo, ext) if not _is_const(lo, 0) else ext))
    return mapping, conds, free_axes


def _digit(eqs: list[_Lin], unknowns: set) -> tuple[_Lin, IterVar, Expr, _Lin] | None:
    """A variable that one equation fixes as a digit: in ``a * v + D + R == 0``, with ``D`` over variables
    of constant ranges spanning fewer than ``|a|`` values and ``R`` free of unknowns, ``v`` is the one
    integer with ``a * v`` in ``-R - D``'s range.  A flattening load ``x[64 * h + w]`` (a reshape, ``w <
    64``) then differentiates to ``h = j // 64``, ``w = j % 64`` instead of a masked sum over ``h``.

    Returns ``(equation, v, v's value, what the equation leaves of D)``, or None.  With ``s`` the sign of
    ``a`` and ``m = min(s * D)``: ``v = N // |a|`` and ``s * D - m == N % |a|``, where ``N = -s * R - m``."""
    for e in eqs:
        terms = e.unknowns(unknowns)
        if len(terms) < 2:
            continue
        for v, a in terms.items():
            others = {u: c for u, c in terms.items() if u is not v}
            if abs(a) < 2 or not all(isinstance(u.lo, Const) and isinstance(u.extent, Const) for u in others):
                continue
            if any(u.extent.value < 1 for u in others):
                continue
            sign = 1 if a > 0 else -1
            ends = [(sign * c * u.lo.value, sign * c * (u.lo.value + u.extent.value - 1)) for u, c in others.items()]
            if sum(abs(hi - lo) for lo, hi in ends) >= abs(a):
                continue
            lowest = sum(min(ends_) for ends_ in ends)
            rest = e.without(v)
            for u in others:
                rest = rest.without(u)
            num = rest.scaled(-sign).plus(_Lin({}, -lowest)).expr({})
            low = _Lin({u: sign * c for u, c in others.items()}, -lowest, _neg(binary("mod", num, _i(abs(a)))))
            return e, v, binary("floordiv", num, _i(abs(a))), low
    return None


def _strided_windows(solved, fresh: dict, unknowns: set, free: FreeVars) -> dict:
    """Strided maps whose window offset can be enumerated directly.

    For ``s * v + u == N`` (pooling, a strided convolution: ``v`` the output position,
    ``u`` the window offset over ``[lo, lo + ext)``, ``N`` free of unknowns), only the
    offsets ``u = lo + rho + s * t`` with ``rho = (N - lo) mod s`` divide evenly: summing over
    ``t < ceil((ext - rho) / s)`` visits exactly those, with ``v = (N - lo) // s - t`` and no
    division or divisibility test per term.  Returns ``{v: (v's value, u, t, u's value)}``,
    replacing ``u``'s fresh axis by ``t`` in ``fresh``."""
    out = {}
    for v, rest, a in solved:
        if abs(a) == 1:
            continue
        num = rest.scaled(-1) if a > 0 else rest  # |a| * v == num
        us = [u for u, c in num.unknowns(unknowns).items() if abs(c) == 1 and u in fresh]
        if len(us) != 1 or len(num.unknowns(unknowns)) != 1:
            continue
        u = us[0]
        if (free(u.lo) | free(u.extent)) & unknowns or any(u in r.coef for w, r, _ in solved if w is not v):
            continue
        step, c, lo, ext = abs(a), num.coef[u], u.lo, u.extent
        r = num.without(u).expr({})  # num == c * u + r
        # c = -1: u == r (mod step); c = +1: u == -r (mod step)
        base = r if c == -1 else _neg(r)
        shifted = binary("sub", base, lo) if not _is_const(lo, 0) else base
        rho = binary("mod", shifted, _i(step))
        if isinstance(ext, Const):  # a constant trip count ceil(ext / step), the excess masked by the
            # condition ``u < lo + ext`` the caller adds: short static loops unroll, and the output loop
            # around them vectorises
            t_ext = _i(-(-int(ext.value) // step))
        else:
            t_ext = binary("floordiv", _iadd(binary("sub", ext, rho), _i(step - 1)), _i(step))
        t = IterVar(u.name, _i(0), t_ext, "reduce")
        u_val = _iadd(_iadd(lo if not _is_const(lo, 0) else None, rho), _iscale(t, step))
        q = binary("floordiv", shifted, _i(step))
        v_val = binary("sub", q, t) if c == -1 else binary("sub", t, q)
        fresh[u] = t
        out[v] = (v_val, u, t, u_val)
    return out


# -- simplification -----------------------------------------------------------------------------------


def simplify(e: Expr, env: dict | None = None, floats: bool = True) -> Expr:
    """Fold what the gradient construction leaves behind: selects whose condition is
    decided by the index ranges in ``env`` (refined through enclosing selects),
    comparisons and logic on constants, integer ``min``/``max`` the ranges decide, ``x + Absent``
    (a contribution found absent), and with ``floats`` also float ``x * 1`` and ``x + 0`` (exact for
    a gradient's sums, but ``-0.0 + 0`` is ``+0.0``: a forward kernel keeps them)."""
    return _Simplifier(floats).go(e, env if env is not None else {})


def decide(e: Expr, cond: Expr, truth: bool, env: dict | None = None, floats: bool = True) -> Expr:
    """``e`` where ``cond`` is known to be ``truth``: the condition's occurrences become constants and
    ``simplify`` folds what that decides (``env`` should be refined by the condition already)."""
    fixed = rewrite(e, lambda n, go: Const(truth, dtypes.bool_) if n.key == cond.key else None)
    return simplify(fixed, env, floats)


_COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")


class _Decisive(NodeMemo):
    """The index variables whose ranges can change what ``simplify`` makes of an expression: those of
    its comparisons, integer ``min``/``max`` and reduction bounds, not those its loads are indexed by."""

    def __init__(self):
        super().__init__()
        self.free = FreeVars()

    def compute(self, e: Expr) -> frozenset[IterVar]:
        out = frozenset().union(*(self(c) for c in e.children()))
        if isinstance(e, Binary) and (e.op in _COMPARISONS or (e.op in ("maximum", "minimum") and e.dtype.is_int)):
            out |= self.free(e)
        if isinstance(e, Reduce):
            out = out.union(*(self.free(x) for ax in e.axes for x in (ax.lo, ax.extent)))
        return out


class _Simplifier:
    def __init__(self, floats: bool = True):
        self.floats = floats
        self.memo: dict[tuple, Expr] = {}
        self.keep: list = []
        self.decisive = _Decisive()

    def go(self, e: Expr, env: dict) -> Expr:
        k = (id(e), id(env))
        got = self.memo.get(k)
        if got is None:
            # the same node under ranges that agree where it matters simplifies the same: nested selects
            # refine the ranges along exponentially many paths, mostly of variables it only indexes by
            same = (id(e), ranges_over(env, self.decisive(e)))
            got = self.memo.get(same)
            if got is None:
                got = self.memo[same] = self._go(e, env)
            self.memo[k] = got
            self.keep.append((e, env))
        return got

    def _go(self, e: Expr, env: dict) -> Expr:
        if isinstance(e, (Const, SizeVar, IterVar)):
            return e
        if isinstance(e, Select):
            c = self.go(e.cond, env)
            if _is_true(c):
                return self.go(e.a, env)
            if _is_false(c):
                return self.go(e.b, env)
            a = self.go(e.a, refine(c, env, True))
            b = self.go(e.b, refine(c, env, False))
            if a.key == b.key:
                return a
            return e if (c is e.cond and a is e.a and b is e.b) else Select(c, a, b, e.dtype, e.weak)
        if isinstance(e, Reduce):
            inner = dict(env)
            for ax in e.axes:
                if (r := axis_range(ax, inner)) is not None:
                    inner[ax] = r
            body = self.go(e.body, inner)
            if e.op == "sum" and _is_zero(body):
                return Const(0.0, e.dtype)
            return e if body is e.body else Reduce(e.op, body, e.axes)
        n = rebuild(e, lambda c: self.go(c, env))
        return _fold(n, env, self.floats)


#: Integer operations on two constants, as the generated C computes them (floor division and modulo).
_INT_OPS = {
    "add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
    "floordiv": lambda x, y: x // y, "mod": lambda x, y: x % y,
    "maximum": max, "minimum": min,
}  # fmt: skip


def _fold(n: Expr, env: dict, floats: bool = True) -> Expr:
    if isinstance(n, Load) and n.tensor.is_constant and all(isinstance(i, Const) for i in n.indices):
        index = tuple(i.value for i in n.indices)
        if all(0 <= i < d for i, d in zip(index, n.tensor.data.shape)):  # a table entry at a fixed place
            return Const(n.tensor.data[index].item(), n.dtype)
    if isinstance(n, Binary) and n.op in _INT_OPS and n.dtype.is_int:
        a, b = n.a, n.b
        if isinstance(a, Const) and isinstance(b, Const) and not (n.op in ("floordiv", "mod") and b.value == 0):
            v = _INT_OPS[n.op](a.value, b.value)  # exact; kept when C would wrap (or divide by zero)
            lo, hi = -(1 << (n.dtype.bits - 1)), 1 << (n.dtype.bits - 1)
            if all(lo <= x < hi for x in (a.value, b.value, v)):
                return Const(v, n.dtype, n.weak)
    if isinstance(n, Binary) and n.op in ("floordiv", "mod") and (split := _unflattened(n, env)) is not None:
        return split
    if isinstance(n, Binary):
        a, b = n.a, n.b
        if n.op in ("maximum", "minimum") and n.dtype.is_int and (ba := bounds(a, env)) and (bb := bounds(b, env)):
            a_le_b, b_le_a = (bb[0] - ba[1]).sign() == 1, (ba[0] - bb[1]).sign() == 1
            keep = (
                (a if a_le_b else b if b_le_a else None)
                if n.op == "minimum"
                else (b if a_le_b else a if b_le_a else None)
            )
            if keep is not None and keep.dtype == n.dtype:  # a clamp the index ranges make a no-op
                return keep
        if n.op in ("lt", "le", "gt", "ge", "eq", "ne"):
            d = _decide(n, env)
            return Const(d, dtypes.bool_) if d is not None else n
        if n.op == "and" and n.dtype.is_bool:
            if _is_false(a) or _is_false(b):
                return Const(False, dtypes.bool_)
            if _is_true(a):
                return b
            if _is_true(b):
                return a
        if n.op == "or" and n.dtype.is_bool:
            if _is_true(a) or _is_true(b):
                return Const(True, dtypes.bool_)
            if _is_false(a):
                return b
            if _is_false(b):
                return a
        if n.op == "add":  # a contribution found absent always (exact); with ``floats`` any float zero
            for x, y in ((a, b), (b, a)):
                if y.dtype == n.dtype and (isinstance(x, Absent) or (floats and n.dtype.is_float and _is_zero(x))):
                    return y
        if floats and n.op == "mul" and n.dtype.is_float:
            for x, y in ((a, b), (b, a)):
                if _is_const(x, 1) and y.dtype == n.dtype:
                    return y
    if isinstance(n, Unary) and n.op == "invert" and n.dtype.is_bool and isinstance(n.x, Const):
        return Const(not n.x.value, dtypes.bool_)
    return n


def _unflattened(n: Binary, env: dict) -> Expr | None:
    """``(x * c + b) // (c * m)`` as ``x // m`` and ``(x * c + b) % (c * m)`` as ``(x % m) * c + b`` when the
    ranges put ``b`` in ``[0, c)`` (floor division: any ``x``).  A reshape indexes its source by the flat
    position's quotient and remainder; ``(4N, 17)`` read from ``(N, 68)`` becomes ``[i // 4, (i % 4) * 17 + j]``,
    whose loads are contiguous along ``j`` (they were a division and a modulo per element)."""
    d = n.b
    if not (n.dtype.is_int and isinstance(d, Const) and d.value > 0 and n.a.dtype == n.dtype):
        return None
    x, c, b = _scaled_plus(n.a)
    if x is None or d.value % c or (b is not None and b.dtype != n.dtype):
        return None
    if b is not None:
        rb = bounds(b, env)
        if rb is None or rb[0].sign() != 1 or (Affine.of(c - 1) - rb[1]).sign() != 1:
            return None
    m = d.value // c
    if n.op == "floordiv":
        return x if m == 1 else Binary("floordiv", x, Const(m, d.dtype), n.dtype, n.weak)
    if m == 1:  # x * c + b is b modulo c
        return b if b is not None else Const(0, n.dtype, n.weak)
    low = Binary("mul", Binary("mod", x, Const(m, d.dtype), n.dtype, n.weak), Const(c, d.dtype), n.dtype, n.weak)
    return low if b is None else Binary("add", low, b, n.dtype, n.weak)


def _scaled_plus(e: Expr) -> tuple[Expr | None, int, Expr | None]:
    """``e`` as ``x * c + b`` (``b`` possibly absent) with a constant ``c > 1``, or ``(None, 0, None)``."""
    b = None
    if isinstance(e, Binary) and e.op == "add":
        for scaled, rest in ((e.a, e.b), (e.b, e.a)):
            if isinstance(scaled, Binary) and scaled.op == "mul":
                e, b = scaled, rest
                break
    if isinstance(e, Binary) and e.op == "mul" and e.dtype.is_int:
        for x, k in ((e.a, e.b), (e.b, e.a)):
            if isinstance(k, Const) and k.value > 1 and x.dtype == e.dtype:
                return x, k.value, b
    return None, 0, None


def _decide(n: Binary, env: dict) -> bool | None:
    """The value of an integer comparison when the index ranges decide it."""
    a, b, op = n.a, n.b, n.op
    if isinstance(a, Const) and isinstance(b, Const):
        x, y = a.value, b.value
        return {"lt": x < y, "le": x <= y, "gt": x > y, "ge": x >= y, "eq": x == y, "ne": x != y}[op]
    if not (a.dtype.is_int and b.dtype.is_int):
        return None
    d = bounds(binary("sub", a, b), env)
    if d is None:
        return None
    lo, hi = d
    neg = (Affine.of(-1) - hi).sign() == 1  # a - b < 0 always
    nonneg = lo.sign() == 1  # a - b >= 0 always
    pos = (lo - Affine.of(1)).sign() == 1
    nonpos = (Affine.of(0) - hi).sign() == 1
    if op == "lt":
        return True if neg else (False if nonneg else None)
    if op == "ge":
        return True if nonneg else (False if neg else None)
    if op == "le":
        return True if nonpos else (False if pos else None)
    if op == "gt":
        return True if pos else (False if nonpos else None)
    if op in ("eq", "ne"):
        if nonneg and nonpos:
            return op == "eq"
        if neg or pos:
            return op == "ne"
    return None


# -- the programs built kernels differentiate ---------------------------------------------------------


def replace_tensors(roots: list[Tensor], mapping: dict[int, Tensor]) -> list[Tensor]:
    """``roots`` with every load of a tensor ``t`` (by ``id``) in ``mapping`` reading
    ``mapping[id(t)]`` instead (same shape), rebuilding the computes in between
    (scatters and scans included)."""
    import copy

    new: dict[int, Tensor] = {}
    for t in reachable(roots):
        if id(t) in mapping:
            new[id(t)] = mapping[id(t)]
            continue
        exprs = t.exprs()
        if not any(isinstance(n, Load) and id(n.tensor) in new for e in exprs for n in walk(e)):
            continue
        nt = copy.copy(t)  # keeps what makes it a scatter or a scan
        new[id(t)] = nt  # a scan's loads of its own previous element follow it
        rewritten = [rewrite(e, lambda n, go: _swap(n, go, new)) for e in exprs]
        if t.body is not None:
            nt.body = rewritten[0]
        if t.update is not None:
            nt.update = t.update.with_exprs(rewritten[1:] if t.body is not None else rewritten)
    return [new.get(id(t), t) for t in roots]


def _swap(n: Expr, go, new: dict) -> Expr | None:
    if isinstance(n, Load) and id(n.tensor) in new:
        return Load(new[id(n.tensor)], tuple(go(i) for i in n.indices))
    return None


def backward_program(inputs: list[Tensor], outputs: list[Tensor], mask, saved=(), partition=None):
    """The gradient program of a built kernel, and the forward intermediates it reads.

    Its inputs are the forward inputs, the forward's float outputs and the
    intermediates in ``saved`` (values the forward kernel also writes, so that
    adjoints read them rather than recompute them), then one gradient per float
    output; its outputs are the gradients of the inputs selected by ``mask``, in
    order.  Given ``partition`` (``tailjit.fusion.partition``, handed in: the
    IR sits below the passes), the forward's float reductions that the
    gradient reads (a softmax's row maximum and sum, a norm's mean and
    variance) join ``saved`` where that costs the forward no loop nest: fusion computes
    them into a buffer of their own anyway, or the kernel computing them writes
    them as side outputs (``fusion.LoopNest.side``); one computed inside another
    reduction's loop stays unsaved.  Returns ``(inputs, gradients, saved)``."""
    save_buffered = partition is not None
    taken = {t.name for t in inputs + outputs}

    def unique(name: str) -> str:
        base, k = name, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        return name

    diff = [o for o in outputs if o.dtype.is_float]
    heads = [placeholder(o.shape, o.dtype, name=unique(f"grad_{o.name}")) for o in diff]
    wanted = [t for t, m in zip(inputs, mask) if m]
    grads = gradient(diff, wanted, heads) if diff else [_zeros(t) for t in wanted]
    saved, given = list(saved), len(saved)
    if save_buffered:
        forward, known = {id(t) for t in reachable(outputs)}, {id(t) for t in diff + saved}
        read = [t for t in reachable(grads) if id(t) in forward and id(t) not in known and _is_reduction(t)]
        names = [t.name for t in (*inputs, *outputs, *saved, *read)]
        read = [t for t in read if names.count(t.name) == 1]  # an output's name must be unique
        if read:  # partition the forward only when there is something to decide
            buffered = {id(k.tensor) for k in partition(inputs, outputs).kernels}
            while True:  # keep those that cost the forward no loop nest as outputs (dropping one may move others)
                program = partition(inputs, [*outputs, *saved, *read])
                free = buffered | {id(u.tensor) for k in program.kernels for u in k.side}
                cheap = [t for t in read if id(t) in free]
                if len(cheap) == len(read):
                    break
                read = cheap
            saved += read
    stand_ins = [placeholder(t.shape, t.dtype, name=unique(f"{t.name}_saved")) for t in diff + saved]
    kept = {id(t): p for t, p in zip(diff + saved, stand_ins)}
    grads = replace_tensors(grads, {**kept, **_normalised_exponentials(outputs, kept)})
    if save_buffered:  # a reduction no longer read (a softmax's maximum, once its exponentials are) is not saved
        used = {id(t) for t in reachable(grads)}
        keep = [k < len(diff) + given or id(p) in used for k, p in enumerate(stand_ins)]
        saved = [t for t, k in zip(saved, keep[len(diff) :]) if k]
        stand_ins = [p for p, k in zip(stand_ins, keep) if k]
    for g, t in zip(grads, wanted):
        g.name = unique(f"grad_{t.name}")
    return list(inputs) + stand_ins + heads, grads, saved


def _normalised_exponentials(outputs: list[Tensor], kept: dict[int, Tensor]) -> dict[int, Tensor]:
    """The exponentials of softmaxes read back from their saved outputs: for an output ``y = e / s``
    with ``e = exp(u)`` and ``s`` a sum of ``e``, both saved (``kept``: tensor id -> stand-in) and ``e``
    read by nothing else in the forward, ``e = y * s`` in the gradient, where the adjoint of ``exp``
    reads it (the backward saves a pass over ``u``'s inputs and an ``exp`` per element, most of a
    softmax backward's time).  The product differs from ``e`` by a rounding; where ``s`` is
    0, inf or NaN (a row of underflowed, infinite or NaN exponentials) the whole row's gradient is
    NaN either way, through the row sum of the output's adjoint."""
    forward = reachable(outputs)
    found: dict[int, Tensor] = {}
    for y in outputs:
        b = y.body if id(y) in kept and y.update is None else None
        if not (isinstance(b, Binary) and b.op == "truediv" and isinstance(b.a, Load) and isinstance(b.b, Load)):
            continue
        e, s = b.a.tensor, b.b.tensor
        if id(s) not in kept or id(e) in kept or id(e) in found or e.update is not None or e.body is None:
            continue
        if len(b.a.indices) != y.ndim or any(i is not a for i, a in zip(b.a.indices, y.axes)):
            continue
        if not (isinstance(e.body, Unary) and e.body.op == "exp" and e.dtype == y.dtype):
            continue
        if not (isinstance(s.body, Reduce) and s.body.op == "sum" and isinstance(s.body.body, Load)
                and s.body.body.tensor is e):  # fmt: skip
            continue
        readers = {id(t) for t in forward for x in t.exprs() for n in walk(x) if isinstance(n, Load) and n.tensor is e}
        if readers != {id(y), id(s)}:
            continue
        ys, ss, at = kept[id(y)], kept[id(s)], b.b.indices

        def body(*v, ys=ys, ss=ss, at=at, axes=y.axes):
            return ys[v] * Load(ss, tuple(substitute(i, dict(zip(axes, v))) for i in at))

        found[id(e)] = compute(e.shape, body, name=f"{e.name}_from_{y.name}")
    return found


def _written(t: Tensor) -> Tensor:
    """Where the updates of the scatter ``t`` write: a bool scatter over the same domain."""
    u = t.update
    none = compute(t.shape, lambda *i: Const(False, dtypes.bool_), name=f"{t.name}_unwritten")

    def mark(*v):
        at = dict(zip(u.domain, v))
        moved = [substitute(e, at) for e in (*u.targets, *((u.cond,) if u.cond is not None else ()))]
        return (moved[: len(u.targets)], True, *moved[len(u.targets) :])

    return scatter(none, tuple(v.extent for v in u.domain), mark, "add", name=f"{t.name}_written")


def _is_reduction(t: Tensor) -> bool:
    """A plain float compute whose body reduces: recomputing it costs a loop over the reduced axes."""
    return t.update is None and t.dtype.is_float and has_reduction(t)
