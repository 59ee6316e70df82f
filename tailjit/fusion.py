"""Partition a tensor-expression program into kernels.

Every output is materialised.  Deciding consumers first, each other compute
``T`` is either inlined (its body substituted at every load) or materialised
into a temporary buffer, by this policy:

* an injective ``T`` (no reduction) is inlined when each element would be
  computed once (one load site that covers all enclosing loops), when it is
  cheap (cost <= ``CHEAP``: a load and an operation or two), or when its
  duplicates cost less than a round trip through memory
  (``cost * (sites - 1) <= RECOMPUTE``) and no site reuses it across a loop;
* a reduction ``T`` is inlined when all its load sites land in one kernel as
  the same expression, indexed by the leading enclosing loop variables: the
  code generator then computes it once per value of those variables, just
  before the loops that consume it (softmax and layer norm become one kernel
  each, with the row statistics in registers);
* everything else is materialised.

A load inside ``select(v == c, ...)`` counts as covering ``v``: that branch
runs for one value of ``v`` only, which is how stacked outputs are written.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tailjit.te.analysis import FreeVars, cost, substitute
from tailjit.te.expr import (
    Binary,
    Const,
    Expr,
    IterVar,
    Load,
    Reduce,
    Select,
    SizeVar,
    TEError,
    Tensor,
    walk,
)

CHEAP = 3
RECOMPUTE = 8


@dataclass
class Kernel:
    """One loop nest: ``tensor`` (an output or a temporary) computed from ``body``."""

    tensor: Tensor
    body: Expr
    fused: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.tensor.name


@dataclass
class Program:
    inputs: list[Tensor]
    outputs: list[Tensor]
    kernels: list[Kernel]
    size_vars: list[SizeVar]

    @property
    def temporaries(self) -> list[Tensor]:
        outs = {id(t) for t in self.outputs}
        return [k.tensor for k in self.kernels if id(k.tensor) not in outs]


def reachable(outputs: list[Tensor]) -> list[Tensor]:
    """All tensors the outputs depend on, producers before consumers."""
    order: list[Tensor] = []
    state: dict[int, int] = {}

    def visit(t: Tensor):
        s = state.get(id(t))
        if s == 2:
            return
        if s == 1:  # pragma: no cover - compute() cannot build cycles
            raise TEError(f"cycle through {t.name!r}")
        state[id(t)] = 1
        if not t.is_placeholder:
            for n in walk(t.body):
                if isinstance(n, Load):
                    visit(n.tensor)
        state[id(t)] = 2
        order.append(t)

    for t in outputs:
        visit(t)
    return order


def _size_vars(tensors: list[Tensor]) -> list[SizeVar]:
    seen: dict[int, SizeVar] = {}
    for t in tensors:
        exprs = list(t.shape) + ([t.body] if t.body is not None else [])
        for e in exprs:
            for n in walk(e):
                if isinstance(n, IterVar):
                    for m in (*walk(n.lo), *walk(n.extent)):
                        if isinstance(m, SizeVar):
                            seen.setdefault(id(m), m)
                if isinstance(n, SizeVar):
                    seen.setdefault(id(n), n)
    return list(seen.values())


def check_program(inputs: list[Tensor], outputs: list[Tensor]) -> tuple[list[Tensor], list[SizeVar]]:
    """Validate the program's interface; return its tensors (topological) and size variables."""
    for t in inputs:
        if not isinstance(t, Tensor) or not t.is_placeholder:
            raise TEError(f"inputs must be te.placeholder tensors, got {t!r}")
    for t in outputs:
        if not isinstance(t, Tensor):
            raise TEError(f"outputs must be te tensors, got {t!r}")
        if t.is_placeholder:
            raise TEError(f"output {t.name!r} is a placeholder; outputs must be computes")
    if len({id(t) for t in outputs}) != len(outputs):
        raise TEError("an output is listed twice")
    if len({id(t) for t in inputs}) != len(inputs):
        raise TEError("an input is listed twice")
    names = [t.name for t in inputs + outputs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise TEError(f"tensor names must be unique among inputs and outputs: {sorted(dup)}")
    tensors = reachable(outputs)
    given = {id(t) for t in inputs}
    for t in tensors:
        if t.is_placeholder and id(t) not in given:
            raise TEError(f"placeholder {t.name!r} is used but not listed in inputs")
    bound = {id(d) for t in inputs for d in t.shape if isinstance(d, SizeVar)}
    sizes = _size_vars(tensors + inputs)
    for v in sizes:
        if id(v) not in bound:
            raise TEError(
                f"size variable {v.name!r} is not the size of any input dimension, so it cannot be bound "
                "at call time; make it a dimension of an input placeholder"
            )
    return tensors, sizes


def partition(inputs: list[Tensor], outputs: list[Tensor]) -> Program:
    tensors, sizes = check_program(inputs, outputs)
    computes = [t for t in tensors if not t.is_placeholder]
    roots: dict[int, Expr] = {id(t): t.body for t in computes}  # materialised -> current body
    fused: dict[int, list[str]] = {id(t): [] for t in computes}
    outs = {id(t) for t in outputs}
    by_id = {id(t): t for t in computes}

    for t in reversed(computes):
        if id(t) in outs:
            continue
        sites = _sites(t, {rid: body for rid, body in roots.items() if rid != id(t)}, by_id)
        if not sites or _should_inline(t, sites):
            del roots[id(t)]
            for rid, body in roots.items():
                if any(isinstance(n, Load) and n.tensor is t for n in walk(body)):
                    roots[rid] = substitute(body, {}, inline=lambda x, t=t: x is t)
                    fused[rid] += [t.name, *fused.pop(id(t), [])]
    kernels = [Kernel(t, roots[id(t)], fused[id(t)]) for t in computes if id(t) in roots]
    return Program(list(inputs), list(outputs), kernels, sizes)


@dataclass
class _Site:
    root: int
    load: Load
    loops: list[IterVar]  # the loops enclosing the load, outermost first
    pinned: frozenset[IterVar]  # variables fixed to one value by an enclosing select


def _sites(t: Tensor, roots: dict[int, Expr], by_id: dict[int, Tensor]) -> list[_Site]:
    """Every load of ``t`` in the current kernel bodies, with its loop context."""
    out: list[_Site] = []
    free = FreeVars()
    for rid, body in roots.items():
        spatial = list(by_id[rid].axes)

        def visit(e: Expr, loops: list[IterVar], pinned: frozenset[IterVar], rid: int = rid):
            if isinstance(e, Load) and e.tensor is t:
                out.append(_Site(rid, e, loops, pinned))
            if isinstance(e, Reduce):
                fv = free(e)
                pos = {id(v): n for n, v in enumerate(loops)}
                depth = max((pos[id(v)] + 1 for v in fv if id(v) in pos), default=0)
                visit(e.body, loops[:depth] + list(e.axes), pinned)
                return
            if isinstance(e, Select):
                visit(e.cond, loops, pinned)
                visit(e.a, loops, pinned | _pinned_by(e.cond))
                visit(e.b, loops, pinned)
                return
            for c in e.children():
                visit(c, loops, pinned)

        visit(body, spatial, frozenset())
    return out


def _pinned_by(cond: Expr) -> frozenset[IterVar]:
    if isinstance(cond, Binary) and cond.op == "eq":
        for v, c in ((cond.a, cond.b), (cond.b, cond.a)):
            if isinstance(v, IterVar) and isinstance(c, Const):
                return frozenset({v})
    if isinstance(cond, Binary) and cond.op == "and":
        return _pinned_by(cond.a) | _pinned_by(cond.b)
    return frozenset()


def _should_inline(t: Tensor, sites: list[_Site]) -> bool:
    free = FreeVars()
    distinct = {(s.root, s.load.key) for s in sites}
    if any(isinstance(n, Reduce) for n in walk(t.body)):
        if len(distinct) != 1:
            return False
        s = sites[0]
        idx = s.load.indices
        return (
            len(idx) > 0
            and all(isinstance(i, IterVar) for i in idx)
            and len({id(i) for i in idx}) == len(idx)
            and len(idx) <= len(s.loops)
            and all(a is b for a, b in zip(idx, s.loops))
        )
    reused = any(not (set(s.loops) - s.pinned) <= set().union(*(free(i) for i in s.load.indices)) for s in sites)
    c = cost(t.body)
    if c <= CHEAP:
        return True
    if reused:
        return False
    return len(distinct) == 1 or c * (len(distinct) - 1) <= RECOMPUTE
