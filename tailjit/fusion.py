"""Partition a tensor-expression program into kernels.

Every output, and every compute marked ``materialize``, is materialised.
Deciding consumers first, each other compute
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

An output reduction read by one kernel only, where its value is computed
once per value of that kernel's leading loops (its own indices, a row's
statistics), is inlined like a temporary and written by that kernel as a
*side output* when computed (``LoopNest.side``): a softmax's row sum saved for
the backward costs a store per row instead of a loop nest of its own.

A load inside ``select(v == c, ...)`` counts as covering ``v``: that branch
runs for one value of ``v`` only, which is how stacked outputs are written.

Scatters and scans are always materialised: a scatter's element is final only
after every update ran, and a scan's only after its predecessors.  Their own
expressions take producers like any kernel: a kernel has one loop nest per
*nest* (a scatter's copy of its base, then its update loop over the domain),
and the policy sees the loops of the nest a load sits in.  A scatter whose
base is a temporary read by nothing else takes over that temporary's buffer
instead of copying it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from tailjit.te.analysis import FreeVars, NodeMemo, bounds, cost, ranges, refine, substitute
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
    Update,
    walk,
)
from tailjit.te.graph import has_reduction, reachable

CHEAP = 3
RECOMPUTE = 8
EXPENSIVE = 4  # a transcendental: worth a row buffer rather than computing it twice

#: The longest innermost loop written out iteration by iteration (``Schedule.expand``); a row buffer
#: of at most this many static elements is not made (it would keep its consumer's loop from that).
EXPAND_MAX = 8

#: Reductions over at most this many static points are written out as expressions (by the code generator:
#: a 3x3 window), so that the spatial loop around them vectorises instead.
SHORT_REDUCTION = 16

#: A compute is not inlined where the expression would grow deeper than this many nested operations (a
#: traced loop's recurrence, thousands of steps, would otherwise become one expression): it keeps every
#: recursive pass over expressions (analysis, simplification, C generation) far from Python's
#: recursion limit, and gcc away from statements thousands of operations deep.
MAX_DEPTH = 100


def row_strided(t: Tensor) -> bool:
    """Whether kernels read the input ``t`` through row strides given at run time, so that any tensor
    whose last dimension is contiguous (a gate of an ``unbind``, a ``narrow``ed or expanded row) is read
    in place.  Not for rows of a few static elements: a loop over them is written out and the loop
    above it vectorised, which needs the row stride at compile time (a box's 4 coordinates)."""
    if t.ndim < 2:
        return False
    last = t.shape[-1]
    return not (isinstance(last, Const) and last.value <= EXPAND_MAX)


def split_pairs(e: Load) -> set[int]:
    """The dimensions ``d`` at which ``e`` indexes ``i // k`` and then ``i % k`` with ``k`` the extent of
    dimension ``d + 1``: a reshape's flat index ``i`` split over two dimensions (``flatten(1)`` of an
    image read in the flat order), which rows of ``k`` contiguous elements address as ``i`` itself."""
    pairs, ix, shape = set(), e.indices, e.tensor.shape
    for d in range(len(ix) - 1):
        q, r = ix[d], ix[d + 1]
        if (
            isinstance(q, Binary) and q.op == "floordiv" and isinstance(r, Binary) and r.op == "mod"
            and q.a.key == r.a.key and _same_size(q.b, shape[d + 1]) and _same_size(r.b, shape[d + 1])
            and d - 1 not in pairs
        ):  # fmt: skip
            pairs.add(d)
    return pairs


def _same_size(a: Expr, b: Expr) -> bool:
    """Whether two size expressions are the same (constants by value: a Python int in an index is weak)."""
    return a.key == b.key or (isinstance(a, Const) and isinstance(b, Const) and a.value == b.value)


def row_strided_inputs(program: LoopProgram) -> set[Tensor]:
    """The inputs of ``program`` its kernels read through row strides (``row_strided``): not those a load
    splits a flat index over (``split_pairs``), which contiguous strides turn back into that index."""
    split = {n.tensor for k in program.kernels for e in k.exprs() for n in _all_loads(e) if split_pairs(n)}
    return {t for t in program.inputs if row_strided(t) and t not in split}


class RowBuffer(Tensor):
    """A producer computed once per iteration of the consumer's leading loops
    ``prefix`` into a small per-thread buffer (TVM's ``compute_at``): the
    buffer holds the remaining dimensions and stays in L1."""

    def __init__(self, source: Tensor, prefix: tuple[IterVar, ...]):
        p = len(prefix)
        body = substitute(source.body, dict(zip(source.axes[:p], prefix)))
        super().__init__(source.shape[p:], source.dtype, f"{source.name}_row", source.axes[p:], body)
        self.prefix = prefix

    def with_body(self, body: Expr) -> RowBuffer:
        new = object.__new__(RowBuffer)
        Tensor.__init__(new, self.shape, self.dtype, self.name, self.axes, body)
        new.prefix = self.prefix
        return new


def _all_loads(e: Expr, rows: set[int] | None = None):
    """Loads in ``e``, including those inside the bodies of row buffers it reads (each body once:
    row buffers read by several loads, nested in one another, would otherwise be walked once per
    path to them)."""
    rows = set() if rows is None else rows
    for n in walk(e):
        if isinstance(n, Load):
            yield n
            if isinstance(n.tensor, RowBuffer) and id(n.tensor) not in rows:
                rows.add(id(n.tensor))
                yield from _all_loads(n.tensor.body, rows)


class LoadedTensors(NodeMemo):
    """The tensors an expression loads, through the bodies of the row buffers it reads too, memoised
    per node."""

    def compute(self, e: Expr) -> frozenset[Tensor]:
        out = frozenset().union(*(self(c) for c in e.children()))
        if isinstance(e, Load):
            out |= {e.tensor}
            if isinstance(e.tensor, RowBuffer):
                out |= self(e.tensor.body)
        elif isinstance(e, Reduce):
            out = out.union(*(self(x) for ax in e.axes for x in (ax.lo, ax.extent)))
        return out


class Depth(NodeMemo):
    """The number of nested operations of an expression, memoised per node."""

    def compute(self, e: Expr) -> int:
        kids = (
            [*e.children(), *(x for ax in e.axes for x in (ax.lo, ax.extent))]
            if isinstance(e, Reduce)
            else e.children()
        )
        return 1 + max(map(self, kids), default=0)


def _inline(body: Expr, t: Tensor, replacement: Expr, loaded: LoadedTensors, rows_done: dict | None = None) -> Expr:
    """Replace loads of ``t`` by ``replacement`` (over ``t.axes``), in row buffers too; sub-expressions
    that do not load ``t`` (``loaded`` says) are kept without a walk.  ``rows_done`` maps each row buffer
    already rewritten to its new load, so that expressions sharing a row buffer keep sharing one."""
    if t not in loaded(body):
        return body
    rows_done = {} if rows_done is None else rows_done
    body = substitute(
        body, {}, inline=lambda x: replacement if x is t else None, untouched=lambda n: t not in loaded(n)
    )
    rows = [x for x in loaded(body) if isinstance(x, RowBuffer) and t in loaded(x.body)]
    for row in rows:
        if id(row) not in rows_done:
            rows_done[id(row)] = Load(row.with_body(_inline(row.body, t, replacement, loaded, rows_done)), row.axes)
        new = rows_done[id(row)]
        body = substitute(
            body,
            {},
            inline=lambda x, row=row, new=new: new if x is row else None,
            untouched=lambda n, row=row: row not in loaded(n),
        )
    return body


class Side(NamedTuple):
    """An output reduction a kernel writes where it computes it: ``tensor[index] = body``, the index
    made of loop variables (the kernel's leading loops, or in a scalar's kernel the axes of a
    reduction) and zeros for the size-1 dimensions of a keepdim reduction, the body over them."""

    tensor: Tensor
    index: tuple[Expr, ...]
    body: Expr


class Merged(NamedTuple):
    """A kernel merged into another one's loop nest (``tailjit.loop_merge``): ``tensor`` at ``axes``
    computed from ``body``, before the host's body (and before later merged kernels, which read it there
    as a local).  ``axes`` are the host's (the same domain), or the host's leading axis and a short column
    axis of its own, written out whole at each point of the leading loop.  ``store`` is False when
    nothing else reads it: it then has no buffer at all.  ``fused``: the computes inlined into it."""

    tensor: Tensor
    body: Expr
    store: bool
    fused: tuple[str, ...]
    axes: tuple[IterVar, ...]


@dataclass
class LoopNest:
    """One loop nest: ``tensor`` (an output or a temporary) computed from ``body``.

    A scatter's kernel also runs ``update`` (its update loop, producers
    inlined) after the body's loop nest; ``copy`` is False when the body's
    loop is skipped because the base already sits in the buffer.  ``into``
    names the scatter whose buffer this kernel fills (its base, reused)."""

    tensor: Tensor
    body: Expr
    fused: list[str] = field(default_factory=list)
    update: Update | None = None
    copy: bool = True
    into: Tensor | None = None
    side: list[Side] = field(default_factory=list)  # outputs it also writes: reductions it computes anyway
    merged: list[Merged] = field(default_factory=list)  # kernels of the same domain run in its loop nest

    @property
    def name(self) -> str:
        return self.tensor.name

    @property
    def by_rows(self) -> bool:
        """Whether kernels merged into this one are written out a row at a time (``Merged.axes``): its
        own last axis must then be written out too (``Schedule.expand``)."""
        own = tuple(map(id, self.tensor.axes))
        return any(tuple(map(id, m.axes)) != own for m in self.merged)

    def exprs(self) -> list[Expr]:
        """The expressions the kernel evaluates."""
        return ([self.body] if self.copy else []) + (list(self.update.exprs()) if self.update is not None else [])


@dataclass
class LoopProgram:
    """A program partitioned into loop nests: its interface and one :class:`LoopNest` per materialised tensor."""

    inputs: list[Tensor]
    outputs: list[Tensor]
    kernels: list[LoopNest]
    size_vars: list[SizeVar]
    constants: list[Tensor] = field(default_factory=list)  # te.constant tensors the kernels read

    @property
    def temporaries(self) -> list[Tensor]:
        """Tensors with a buffer of their own that is not an output."""
        outs = {id(t) for t in self.outputs}
        own = [k.tensor for k in self.kernels if k.into is None]
        merged = [m.tensor for k in self.kernels for m in k.merged if m.store]
        return [t for t in own + merged if id(t) not in outs]

    def storage(self, t: Tensor) -> Tensor:
        """The tensor whose buffer ``t`` is computed in (itself, or the scatter reusing it)."""
        into = {id(k.tensor): k.into for k in self.kernels if k.into is not None}
        while id(t) in into:
            t = into[id(t)]
        return t


def _size_vars(tensors: list[Tensor]) -> list[SizeVar]:
    seen: dict[int, SizeVar] = {}
    for t in tensors:
        exprs = list(t.shape) + list(t.exprs()) + ([v.extent for v in t.update.domain] if t.is_scatter else [])
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
        if not isinstance(t, Tensor) or not t.is_placeholder or t.is_constant:
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
        if t.is_placeholder and not t.is_constant and id(t) not in given:
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


def partition(inputs: list[Tensor], outputs: list[Tensor]) -> LoopProgram:
    tensors, sizes = check_program(inputs, outputs)
    computes = [t for t in tensors if not t.is_placeholder]
    roots: dict[int, list[Expr]] = {id(t): list(t.exprs()) for t in computes}  # materialised -> current exprs
    fused: dict[int, list[str]] = {id(t): [] for t in computes}
    outs = {id(t) for t in outputs}
    by_id = {id(t): t for t in computes}
    full_cost = _full_costs(computes, outs)
    loaded = LoadedTensors()
    # tensor -> the kernels whose current expressions load it: each decision visits only those
    readers: dict[int, set[int]] = {}
    for rid, exprs in roots.items():
        _note_readers(readers, rid, exprs)
    measure = Depth()
    depth = {rid: max(map(measure, exprs)) for rid, exprs in roots.items()}

    side: dict[int, list[Side]] = {}  # kernel -> its side outputs, with their current bodies

    def rewrite(rid: int, t: Tensor, replacement: Expr, nest: int | None = None) -> None:
        """Inline ``t`` as ``replacement`` in kernel ``rid``'s expressions (of one nest only, if given), its
        side outputs' too."""
        done: dict = {}

        def fn(e: Expr) -> Expr:
            return _inline(e, t, replacement, loaded, done)

        roots[rid] = [fn(e) if nest in (None, _nest(j)) else e for j, e in enumerate(roots[rid])]
        if nest in (None, 0) and rid in side:
            side[rid] = [u._replace(body=fn(u.body)) for u in side[rid]]
        depth[rid] = max(map(measure, roots[rid] + [u.body for u in side.get(rid, ())]))

    for t in reversed(computes):
        if t.is_scatter or t.is_scan or t.materialize or (id(t) in outs and not has_reduction(t)):
            continue
        mine = readers.pop(id(t), set()) - {id(t)}
        sites = _sites(t, {rid: roots[rid] for rid in mine if rid in roots}, by_id, loaded, side)
        if id(t) in outs:  # a reduction: written by its one reader, or by a kernel of its own
            index = _side_index(t, sites, by_id, roots[sites[0].root[0]] if sites else [])
            if index is not None and _shallow_enough(t, mine, roots, depth):
                rid = sites[0].root[0]
                del roots[id(t)]
                rewrite(rid, t, t.body)
                side.setdefault(rid, []).append(Side(t, index, substitute(t.body, dict(zip(t.axes, index)))))
                fused[rid] += fused.pop(id(t), [])
                _note_readers(readers, rid, [t.body])
            continue
        sweeps = _lazy_sweeps(t, sites)
        p = _row_prefix(t, sites, sweeps, by_id)
        inline = not p and (not sites or _should_inline(t, sites, sweeps, full_cost[id(t)]))
        inline = inline and _shallow_enough(t, mine, roots, depth)
        if not p and not inline:  # a row buffer still beats a round trip of the whole tensor through memory
            p = _row_prefix(t, sites, sweeps, by_id, min_cost=0)
        if p:
            rid, nest = sites[0].root
            row = RowBuffer(t, _nest_loops(by_id[rid], nest)[:p])
            body = Load(row, t.axes[p:])
            rewrite(rid, t, body, nest)
            fused[rid] += [f"{t.name} (row buffer)", *fused.pop(id(t), [])]
            del roots[id(t)]
            _note_readers(readers, rid, [t.body])
        elif inline:
            del roots[id(t)]
            for rid in mine:
                if rid in roots:
                    rewrite(rid, t, t.body)
                    fused[rid] += [t.name, *fused.pop(id(t), [])]
                    _note_readers(readers, rid, [t.body])
    _reconsider(computes, roots, fused, outs, by_id, loaded, side, rewrite, depth)
    kernels = []
    for t in computes:
        if id(t) in roots:
            body, *rest = roots[id(t)]
            names = list(dict.fromkeys(fused[id(t)]))  # a producer inlined along two paths is named once
            update = t.update.with_exprs(rest) if t.is_scatter else None
            kernels.append(LoopNest(t, body, names, update, side=side.get(id(t), [])))
    _reuse_bases(kernels, outs)
    constants = [t for t in tensors if t.is_constant]
    return LoopProgram(list(inputs), list(outputs), kernels, sizes, constants)


def _reconsider(
    computes,
    roots: dict[int, list[Expr]],
    fused: dict[int, list[str]],
    outs: set[int],
    by_id,
    loaded: LoadedTensors,
    side: dict[int, list[Side]],
    rewrite,
    depth: dict[int, int],
) -> None:
    """A second look at the injective temporaries, now that every producer's fate is known: one
    that looked expensive while its producers counted as inlined may be cheap over the buffers they
    became (a select of a materialised gradient, read by two reductions), and is inlined then."""
    position = {rid: k for k, rid in enumerate(roots)}  # the kernels' order, for a deterministic visit
    readers: dict[int, set[int]] = {}  # may-load sets, so that a traced loop's thousands of kernels stay linear
    for rid, exprs in roots.items():
        _note_readers(readers, rid, exprs)
    for t in reversed(computes):
        if id(t) not in roots or id(t) in outs or t.is_scatter or t.is_scan or t.materialize:
            continue
        (body,) = roots[id(t)]
        if any(isinstance(n, Reduce) or (isinstance(n, Load) and isinstance(n.tensor, RowBuffer)) for n in walk(body)):
            continue
        may = sorted((rid for rid in readers.get(id(t), ()) if rid != id(t) and rid in roots), key=position.get)
        mine = [rid for rid in may if any(t in loaded(e) for e in roots[rid])]
        sites = _sites(t, {rid: roots[rid] for rid in mine}, by_id, loaded, side)
        if not sites or not _should_inline(t, sites, _lazy_sweeps(t, sites), cost(body, index_arithmetic=False)):
            continue
        if not _shallow_enough(t, mine, roots, depth):
            continue
        del roots[id(t)]
        names = fused.pop(id(t))
        for rid in mine:
            rewrite(rid, t, body)
            fused[rid] += [t.name, *names]
            _note_readers(readers, rid, [body])


def _shallow_enough(t: Tensor, readers, roots: dict, depth: dict[int, int]) -> bool:
    """Whether inlining ``t`` keeps its readers' expressions within ``MAX_DEPTH`` (a substitution at the
    leaves deepens an expression by less than the depth of what it substitutes)."""
    return all(depth[rid] + depth[id(t)] <= MAX_DEPTH for rid in readers if rid in roots)


def _nest(j: int) -> int:
    """The loop nest of a kernel's ``j``-th expression: 0 the body's, 1 a scatter's update loop."""
    return min(j, 1)


def _nest_loops(t: Tensor, nest: int) -> tuple[IterVar, ...]:
    return t.axes if nest == 0 else t.update.domain


def _reuse_bases(kernels: list[LoopNest], outs: set[int]) -> None:
    """A scatter whose base is a temporary read by nothing else updates the
    temporary's buffer in place: the base's kernel writes into the scatter's
    buffer and the scatter skips its copy loop."""
    by_id = {id(k.tensor): k for k in kernels}
    readers: dict[int, int] = {}
    for k in kernels:
        for e in k.exprs():
            for n in _all_loads(e):
                if n.tensor is not k.tensor:  # a scan's own previous element
                    readers[id(n.tensor)] = readers.get(id(n.tensor), 0) + 1
    for k in kernels:
        b = k.body
        if k.update is None or not isinstance(b, Load) or id(b.tensor) not in by_id or id(b.tensor) in outs:
            continue
        if readers.get(id(b.tensor)) == 1 and all(i is a for i, a in zip(b.indices, k.tensor.axes)):
            k.copy = False
            by_id[id(b.tensor)].into = k.tensor


@dataclass
class _Site:
    root: tuple[int, int]  # (kernel tensor id, loop nest)
    load: Load
    loops: list[IterVar]  # the loops enclosing the load, outermost first
    pinned: frozenset[IterVar]  # variables fixed to one value by an enclosing select
    conds: tuple[tuple[Expr, bool], ...] = ()  # the enclosing selects' conditions, each with the branch taken


def _sites(t: Tensor, roots: dict[int, list[Expr]], by_id: dict[int, Tensor], loaded: LoadedTensors,
           side: dict[int, list[Side]]) -> list[_Site]:  # fmt: skip
    """Every load of ``t`` in the current kernel expressions (side outputs' included: they run in the
    body's nest, under the loops that index them), with its loop context (sub-expressions that do not
    load ``t`` are skipped)."""
    out: list[_Site] = []
    free = FreeVars()
    for rid, exprs in roots.items():
        nests = [(body, _nest(j), list(_nest_loops(by_id[rid], _nest(j)))) for j, body in enumerate(exprs)]
        nests += [(u.body, 0, [i for i in u.index if isinstance(i, IterVar)]) for u in side.get(rid, ())]
        for body, nest, loops in nests:
            root = (rid, nest)

            # (sub-expression, loop context) -> the pinned set and the conditions it was walked under.  A
            # site's reuse and share only shrink as more variables are pinned and more conditions hold: so a
            # walk under supersets finds nothing new, and paths with different ones are merged into one walk
            # under their intersections (each one shrinks them, so a shared node is walked a few times, not
            # once per path through nested selects).
            seen: dict = {}

            def visit(e: Expr, loops: list[IterVar], pinned: frozenset[IterVar], conds: tuple, root=root, seen=seen):
                if t not in loaded(e):  # no site below
                    return
                here = (id(e), tuple(map(id, loops)))
                before = seen.get(here)
                if before is not None:
                    was_pinned, was_conds = before
                    held = {(c.key, truth) for c, truth in was_conds}
                    if was_pinned <= pinned and held <= {(c.key, truth) for c, truth in conds}:
                        return
                    pinned &= was_pinned
                    conds = tuple(c for c in conds if (c[0].key, c[1]) in held)
                seen[here] = (pinned, conds)
                if isinstance(e, Load) and e.tensor is t:
                    out.append(_Site(root, e, loops, pinned, conds))
                if isinstance(e, Load) and isinstance(e.tensor, RowBuffer):
                    visit(e.tensor.body, list(e.tensor.prefix) + list(e.tensor.axes), pinned, conds)
                if isinstance(e, Reduce):
                    fv = free(e)
                    pos = {id(v): n for n, v in enumerate(loops)}
                    depth = max((pos[id(v)] + 1 for v in fv if id(v) in pos), default=0)
                    visit(e.body, loops[:depth] + list(e.axes), pinned, conds)
                    return
                if isinstance(e, Select):
                    visit(e.cond, loops, pinned, conds)
                    visit(e.a, loops, pinned | pinned_by(e.cond), (*conds, (e.cond, True)))
                    visit(e.b, loops, pinned, (*conds, (e.cond, False)))
                    return
                for c in e.children():
                    visit(c, loops, pinned, conds)

            visit(body, loops, frozenset(), ())
    return out


def pinned_by(cond: Expr) -> frozenset[IterVar]:
    """The index variables a condition fixes to one value (``v == c``, also inside ``&``)."""
    if isinstance(cond, Binary) and cond.op == "eq":
        for v, c in ((cond.a, cond.b), (cond.b, cond.a)):
            if isinstance(v, IterVar) and isinstance(c, Const):
                return frozenset({v})
    if isinstance(cond, Binary) and cond.op == "and":
        return pinned_by(cond.a) | pinned_by(cond.b)
    return frozenset()


# -- the shapes of reductions, which fusion, loop merging, the schedule and the code generator all ask about


def written_out(r: Reduce) -> bool:
    """Whether ``r`` runs over few enough static points to be written out as an expression."""
    exts = [a.extent.value if isinstance(a.extent, Const) and isinstance(a.lo, Const) else None for a in r.axes]
    return None not in exts and 0 < math.prod(exts) <= SHORT_REDUCTION


def _reduces(*exprs: Expr) -> list[Reduce]:
    return list({n.key: n for e in exprs for n in walk(e) if isinstance(n, Reduce)}.values())


def column_reduces(bodies: list[Expr], bound: set[IterVar], ax: IterVar, free: FreeVars) -> list[Reduce]:
    """The reductions of ``bodies`` that depend on the innermost loop ``ax`` when every one of them runs
    down columns: its loads that ``ax`` indexes index it (plus terms free of it) last, and their reduce
    axes before it (``sum(x[k, j] * s[k], k)``, ``sum(b[k, 2 + j], k)``, ``sum(u[k, j * 16 + d], k)``).
    Computed one ``ax`` at a time, such a reduction strides through memory; a block of neighbouring
    columns accumulated together reads each row's part contiguously."""
    found = [r for r in _reduces(*bodies) if ax in free(r)]
    if not found or any(not free(r) <= bound | {ax} for r in found):
        return []
    for r in found:
        if r.op not in ("sum", "prod", "max", "min") or any(ax in free(a.lo) | free(a.extent) for a in r.axes):
            return []
        inner = list(walk(r.body))
        if any(isinstance(n, Reduce) or (isinstance(n, Load) and isinstance(n.tensor, RowBuffer)) for n in inner):
            return []
        loads = [n for n in inner if isinstance(n, Load) and n.indices]
        if not any(_steps_by_one(n.indices[-1], ax, free) for n in loads):
            return []
        for n in loads:  # a load not indexed by ax (layer norm's var[k]) is the same across the block
            if ax in free(n) and not _steps_by_one(n.indices[-1], ax, free):
                return []
    return found


def _steps_by_one(e: Expr, ax: IterVar, free: FreeVars) -> bool:
    """Whether the index ``e`` is ``ax`` plus terms free of ``ax`` (a box's ``2 + j``, a flattened view's
    ``j * 16 + d`` along ``d``): neighbouring ``ax`` read neighbouring elements."""
    if e is ax:
        return True
    if not (isinstance(e, Binary) and e.op in ("add", "sub")):
        return False
    if ax not in free(e.b):
        return _steps_by_one(e.a, ax, free)
    return e.op == "add" and ax not in free(e.a) and _steps_by_one(e.b, ax, free)


def _row_prefix(
    t: Tensor, sites: list[_Site], sweeps: Callable[[], float], by_id: dict[int, Tensor], min_cost: int = EXPENSIVE
) -> int:
    """How many leading loops of its one consumer kernel an injective ``t`` whose
    computation costs at least ``min_cost``, read ``sweeps()`` times over (``_sweeps``), should be
    buffered under (0: do not buffer).  Every site must index ``t`` with those loop variables first, and
    the sites must differ after them (softmax's ``e[i, k]`` in the row sum and
    ``e[i, j]`` in the output)."""
    if len(sites) < 2 or len({s.root for s in sites}) != 1 or len({s.load.key for s in sites}) < 2:
        return 0
    if sweeps() <= 1:  # each element is read once (the columns of a stack): nothing to reuse
        return 0
    if has_reduction(t) or cost(t.body) - _loads_cost(t.body) < min_cost:
        return 0
    rid, nest = sites[0].root
    axes = _nest_loops(by_id[rid], nest)
    p = min(len(axes), t.ndim - 1)
    for s in sites:
        q = 0
        while q < p and s.load.indices[q] is axes[q] and q < len(s.loops) and s.loops[q] is axes[q]:
            q += 1
        p = q
    row = t.shape[p:]
    if p and all(isinstance(d, Const) for d in row) and math.prod(d.value for d in row) <= EXPAND_MAX:
        return 0  # a few static elements (a box's coordinates): a temporary vectorises over the rows instead
    return p


def _same(a, b) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _side_index(t: Tensor, sites: list[_Site], by_id: dict[int, Tensor], exprs: list[Expr]) -> tuple[Expr, ...] | None:
    """Where the one kernel reading the output reduction ``t`` (``exprs``) can write it (``Side.index``), if
    it can: every site reads it at one index, made of loops running over ``t``'s whole shape and zeros for
    size-1 dimensions, where the code generator computes the reduction once per element of ``t``: the
    kernel's leading loops with an inner one left, or in a scalar's kernel (a loss) the axes of a
    reduction (the row statistics of a mean over rows)."""
    if not sites or len({s.root for s in sites}) != 1 or sites[0].root[1] != 0:
        return None
    k = by_id[sites[0].root[0]]
    index = sites[0].load.indices
    if k.is_scan or k.is_scatter or len({tuple(i.key for i in s.load.indices) for s in sites}) != 1:
        return None
    loops = [i for i in index if isinstance(i, IterVar)]
    if not loops:
        return None
    if k.ndim:  # computed before the innermost loop, once per value of the leading ones
        if len(loops) >= k.ndim or any(i is not a for i, a in zip(loops, k.axes)):
            return None
    elif not (  # a scalar's kernel: computed once per iteration of a reduction over exactly these axes
        all(len(s.loops) >= len(loops) and all(i is a for i, a in zip(loops, s.loops)) for s in sites)
        and any(isinstance(n, Reduce) and _same(n.axes, loops) and not written_out(n) for e in exprs for n in walk(e))
    ):
        return None
    for i, d in zip(index, t.shape):
        if isinstance(i, IterVar):
            if i.extent.key != d.key or not (isinstance(i.lo, Const) and i.lo.value == 0):
                return None
        elif not (isinstance(i, Const) and i.value == 0 and isinstance(d, Const) and d.value == 1):
            return None
    return index if _inline_reduction(t, sites, _lazy_sweeps(t, sites)) else None


def _loads_cost(e: Expr) -> int:
    return len({n.key for n in walk(e) if isinstance(n, Load)})


def _inline_reduction(t: Tensor, sites: list[_Site], sweeps: Callable[[], float]) -> bool:
    """A compute holding reductions is inlined when every site indexes the axes the reductions depend
    on (a prefix of ``t``'s axes) with the leading loop variables of one kernel: the code generator then
    computes each reduction once per value of those loops, shared by all sites.  What lies outside the
    reductions is recomputed at each site, so beyond one site it must be cheap (log-softmax read by a
    gather and by a row mean keeps its row statistics in registers instead of a temporary)."""
    free = FreeVars()
    used = set().union(*(free(n) for n in walk(t.body) if isinstance(n, Reduce)))
    p = 0
    while p < t.ndim and any(ax in used for ax in t.axes[p:]):
        p += 1
    if len({s.root for s in sites}) != 1:
        return False
    for s in sites:
        idx = s.load.indices[:p]
        if not (
            all(isinstance(i, IterVar) for i in idx)
            and len({id(i) for i in idx}) == len(idx)
            and len(idx) <= len(s.loops)
            and all(a is b for a, b in zip(idx, s.loops))
        ):
            return False
    if len({tuple(i.key for i in s.load.indices[:p]) for s in sites}) != 1:
        return False
    if p and _down_columns(t, p, free) and any(s.loops[p - 1].kind == "reduce" for s in sites):
        return False  # a reduction reading it would stride down the columns one at a time: see _down_columns
    outside = cost(t.body, reduction=1)  # each reduction is computed once: a load at the sites
    return sweeps() <= 1 or outside <= CHEAP or outside * (sweeps() - 1) <= RECOMPUTE


def _down_columns(t: Tensor, p: int, free: FreeVars) -> bool:
    """Whether ``t``'s reductions, over its leading ``p`` axes, run down the columns of axis ``p - 1``
    (``x.sum(1)`` of a ``(B, F, K)`` tensor) and are not written out.  Inlined into a reduction over that
    axis (fm's ``(x.sum(1) ** 2).sum(1)``) each would be computed a column at a time, striding through
    memory; materialised, the code generator accumulates a block of columns together
    (``CodeGen.column_block``)."""
    sums = column_reduces([t.body], set(t.axes[: p - 1]), t.axes[p - 1], free)
    return bool(sums) and not all(written_out(r) for r in sums)


def _sweeps(t: Tensor, sites: list[_Site]) -> float:
    """How many times the distinct sites evaluate ``t`` over: a site inside at least as many loops as
    ``t`` has dimensions sweeps it once, or the share of it it reads: where it fixes static dimensions to
    constants (the columns of an ``(n, 4)`` box tensor read by a ``stack`` are four quarters, one sweep
    in all), or where the selects around it bound its index (the halves of a rotation,
    ``cat((-x[..., 32:], x[..., :32]))``, read one half each).  A site inside fewer loops (a gather of
    one element per row) recomputes little and does not count against inlining."""
    shares: dict[tuple, float] = {}
    free = FreeVars()
    for s in sites:
        if len(s.loops) < t.ndim:
            continue
        key = (s.root, s.load.key)
        shares[key] = max(shares.get(key, 0.0), _share(s, t, free))
    return sum(shares.values())


def _lazy_sweeps(t: Tensor, sites: list[_Site]) -> Callable[[], float]:
    """``_sweeps(t, sites)``, computed on the first call only: the decisions that ask for it often
    settle without it, and each site's share runs a bounds analysis."""
    return functools.cache(functools.partial(_sweeps, t, sites))


def _share(s: _Site, t: Tensor, free: FreeVars) -> float:
    """The share of ``t``'s elements site ``s`` reads: per static dimension, the values its index takes
    over its loops under its selects' conditions (all of them where not known).  Only the conditions on
    the index's own variables are applied: those on others cannot bound it, and refining by them costs
    (a Python loop's segment bounds, sums of a hundred sizes read from data)."""
    share = 1.0
    for i, ext in zip(s.load.indices, t.shape):
        if not isinstance(ext, Const) or ext.value <= 0:
            continue
        if isinstance(i, Const):
            share /= ext.value
            continue
        mine = free(i)
        env = ranges([v for v in s.loops if v in mine])
        for cond, truth in s.conds:
            if free(cond) & mine:
                env = refine(cond, env, truth)
        b = bounds(i, env)
        if b is not None and b[0].is_const and b[1].is_const:
            lo, hi = max(b[0].const, 0), min(b[1].const, ext.value - 1)
            share *= max(hi - lo + 1, 0) / ext.value
    return share


def _note_readers(readers: dict[int, set[int]], rid: int, exprs) -> None:
    for e in exprs:
        for n in _all_loads(e):
            readers.setdefault(id(n.tensor), set()).add(rid)


def _full_costs(computes: list[Tensor], outs: set[int]) -> dict[int, int]:
    """Per compute, the cost of its body with the injective producers it reads expanded as if inlined
    (capped): a node that looks cheap on its own (``add(a, b)``) may stand for a long chain of inlined
    producers (a Python loop's recurrence), which must not be recomputed at every site."""
    full: dict[int, int] = {}
    injective: set[int] = set()
    for t in computes:  # producers first
        c = cost(t.body, index_arithmetic=False) if t.body is not None else 0
        for u in {id(n.tensor): n.tensor for e in t.exprs() for n in walk(e) if isinstance(n, Load)}.values():
            if id(u) in injective and id(u) not in outs:
                c += max(full[id(u)] - 1, 0)  # the load of u becomes u's body: a view costs what it reads
        full[id(t)] = min(c, FULL_COST_CAP)
        # a producer holding reductions is computed once per row where it is inlined: not expanded
        if not (t.is_scatter or t.is_scan or t.materialize or has_reduction(t)):
            injective.add(id(t))
    return full


FULL_COST_CAP = 1 << 16


def _varying(loops: list[IterVar]) -> set[IterVar]:
    """The loops that run more than once: a size-1 dimension (a broadcast or a one-column slice) reuses nothing."""
    return {v for v in loops if not (isinstance(v.extent, Const) and v.extent.value == 1)}


def _should_inline(t: Tensor, sites: list[_Site], sweeps: Callable[[], float], full_cost: int) -> bool:
    free = FreeVars()
    distinct = {(s.root, s.load.key) for s in sites}
    if has_reduction(t):
        return _inline_reduction(t, sites, sweeps)
    reused = any(not (_varying(s.loops) - s.pinned) <= set().union(*(free(i) for i in s.load.indices)) for s in sites)
    c = full_cost
    if c <= CHEAP:
        return True
    if reused:
        return False
    return len(distinct) == 1 or sweeps() <= 1 or c * (sweeps() - 1) <= RECOMPUTE
