"""Kernels over one domain share one loop nest.

Fusion leaves a kernel per materialised tensor.  Where several of them run
over the same domain (the box arithmetic of an IoU loss's backward: ten
kernels over the same boxes, each read by the next ones at the same box),
each is a pass over memory and a function for gcc to compile.  Here such
kernels merge: the last one *hosts* the others (``LoopNest.merged``), whose
values are computed before its own body, in order, and read by the later
ones as locals.  A merged tensor that nothing outside the group reads (and
that is no output) gets no buffer.

Groups are of kernels over the same domain, computed at each of its points,
or of *rows*: kernels of shapes ``(n,)`` and ``(n, c)`` (``c`` static and
short) over the same ``n``, each member's row written out whole at each
point of the leading loop, or of *column sums*: reductions of shape ``(m,)``
down the columns of ``(rows, m)`` data (a layer norm's gamma and beta
gradients), which the code generator accumulates a block of columns at a
time, in one pass over the rows for those over the same rows; a column sum
joins a group none of whose tensors it reads.  Otherwise a kernel joins the
last group of its key when it

* is plain element-wise work: no reduction (but those written out as
  expressions), row buffer, scan, scatter or side output (their loops or
  placement are the host's own);
* reads the group's tensors only at its own point, or in a group of rows,
  in its own row at constant columns (once its own are written out): any
  other element may not be computed yet;
* reads no group that depends on this one (directly or through others):
  the merged loop nest would have to run both before and after it.

The groups then run in an order where each follows those it reads from
(the kernels' own order where that allows).
"""

from __future__ import annotations

import heapq

from tailjit.fusion import (
    EXPAND_MAX,
    LoopNest,
    LoopProgram,
    Merged,
    RowBuffer,
    _all_loads,
    _reduces,
    column_reduces,
    written_out,
)
from tailjit.te import dtypes
from tailjit.te.analysis import FreeVars, substitute
from tailjit.te.autodiff import simplify
from tailjit.te.expr import Const, Load, Reduce, TEError, walk

#: The most kernels one loop nest hosts: a traced Python loop's hundreds of steps become hosts of this
#: many, alike, which ``kernel_sharing`` compiles once (GAE over 200 steps: 7 C functions), instead of one
#: loop body of hundreds of statements for gcc.
MERGE_MAX = 12


def merge_loops(program: LoopProgram, keep: frozenset[str] = frozenset()) -> LoopProgram:
    """``program`` with kernels over one domain merged as the module says; kernels named in ``keep``
    (those given a schedule of their own) stay as they are."""
    outs = {id(t) for t in program.outputs}
    made_by = {id(t): k for k in program.kernels for t in [k.tensor, *(u.tensor for u in k.side)]}  # sides too
    reads = {id(k): {n.tensor for e in _expressions(k) for n in _all_loads(e)} for k in program.kernels}
    group_of: dict[int, int] = {}  # kernel id -> its group's number
    groups: list[list[LoopNest]] = []
    preds: list[set[int]] = []  # per group: the groups it reads from
    before: list[set[int]] = []  # per group: every group it depends on, through any path
    latest: dict[tuple, int] = {}  # domain -> its last group
    by_rows: list[bool] = []  # per group: its members are written out a row at a time (below)
    free = FreeVars()
    for k in program.kernels:
        mine = {group_of[id(made_by[id(t)])] for t in reads[id(k)] if id(t) in made_by and made_by[id(t)] is not k}
        domain = None if k.name in keep else _domain(k) if _plain(k) else _column_domain(k, free)
        g = latest.get(domain) if domain is not None else None
        rows = False
        if g is not None:
            columns = domain[0] == "columns"
            rows = not columns and (by_rows[g] or not _at_point(k, groups[g]))
            # joining g is legal when no group k reads depends on g: g would run both before and after it
            if len(groups[g]) >= MERGE_MAX or any(g in before[p] for p in mine - {g}):
                g = None
            elif columns and g in mine:  # a column sum of a member needs the member's whole column
                g = None
            elif rows and not (domain[0] == "rows" and _row_reads(k, groups[g])):
                g = None
        if g is None:
            g = len(groups)
            groups.append([])
            preds.append(set())
            before.append(set())
            by_rows.append(False)
            if domain is not None:
                latest[domain] = g
        else:
            by_rows[g] = rows
        groups[g].append(k)
        group_of[id(k)] = g
        for p in mine - {g}:
            preds[g].add(p)
            before[g] |= before[p] | {p}
    if len(groups) == len(program.kernels):
        return program
    readers: dict = {}  # tensor -> the kernels (ids) that read it
    for k in program.kernels:
        for t in reads[id(k)]:
            readers.setdefault(t, set()).add(id(k))
    rows_of = {id(grp[0]): r for grp, r in zip(groups, by_rows)}
    kernels = [
        _host(grp, outs, readers, rows_of[id(grp[0])]) if len(grp) > 1 else grp[0]
        for grp in _in_order(groups, preds, program.kernels)
    ]
    return LoopProgram(program.inputs, program.outputs, kernels, program.size_vars, program.constants)


def _in_order(groups: list[list[LoopNest]], preds: list[set[int]], kernels: list[LoopNest]) -> list[list[LoopNest]]:
    """The groups with each after those it reads from, otherwise in the order of their last members."""
    position = {id(k): n for n, k in enumerate(kernels)}
    waiting = [len(p) for p in preds]
    readers: list[list[int]] = [[] for _ in groups]
    for g, ps in enumerate(preds):
        for p in ps:
            readers[p].append(g)
    ready = [(position[id(grp[-1])], g) for g, grp in enumerate(groups) if not waiting[g]]
    heapq.heapify(ready)
    out = []
    while ready:
        _, g = heapq.heappop(ready)
        out.append(groups[g])
        for r in readers[g]:
            waiting[r] -= 1
            if not waiting[r]:
                heapq.heappush(ready, (position[id(groups[r][-1])], r))
    if len(out) != len(groups):  # the joining rule keeps groups acyclic: this would drop kernels
        raise TEError("internal error: merged loop nests depend on each other in a cycle; please report it")
    return out


def _expressions(k: LoopNest) -> list:
    """What ``k`` reads: its body even when the copy is skipped (a scatter updating its base's buffer in
    place runs after the base), a scatter's update, its side outputs."""
    update = list(k.update.exprs()) if k.update is not None else []
    return [k.body, *update, *(u.body for u in k.side)]


def _plain(k: LoopNest) -> bool:
    t = k.tensor
    if t.is_scatter or t.is_scan or k.update is not None or not k.copy or k.into is not None or k.side:
        return False
    return not any(
        (isinstance(n, Reduce) and not _written_out(n)) or (isinstance(n, Load) and isinstance(n.tensor, RowBuffer))
        for n in walk(k.body)
    )


def _written_out(r: Reduce) -> bool:
    """A reduction the code generator writes out as an expression (a sum over a box's 4 coordinates)."""
    return r.op in ("sum", "prod", "max", "min") and written_out(r)


def _domain(k: LoopNest) -> tuple:
    """The key of the groups ``k`` may join: a row-shaped kernel (``(n,)`` or ``(n, c)`` for a static ``c``
    of at most ``EXPAND_MAX``) joins those over the same ``n``, any other those over its exact domain."""
    t = k.tensor
    if t.ndim == 1 or (t.ndim == 2 and _short(t.axes[1])):
        return ("rows", _extents(t.axes[:1]))
    return ("same", _extents(t.axes))


def _column_domain(k: LoopNest, free: FreeVars) -> tuple | None:
    """The group key of a kernel that is a column sum (see the module doc), None for any other: one
    axis, and every reduction in its body runs down the columns of that axis (as the code generator
    decides for the column blocks it computes merged column sums in)."""
    t = k.tensor
    if t.ndim != 1 or t.is_scatter or t.is_scan or k.update is not None or not k.copy or k.into is not None:
        return None
    if k.side or any(isinstance(n, Load) and isinstance(n.tensor, RowBuffer) for n in walk(k.body)):
        return None
    ax = t.axes[0]
    sums = column_reduces([k.body], set(), ax, free)
    if not sums or len(sums) != len(_reduces(k.body)):
        return None
    return ("columns", _extents(t.axes))


def _short(ax) -> bool:
    return (
        isinstance(ax.lo, Const)
        and ax.lo.value == 0
        and isinstance(ax.extent, Const)
        and 1 <= ax.extent.value <= EXPAND_MAX
    )


def _at_point(k: LoopNest, group: list[LoopNest]) -> bool:
    """Whether ``k`` has the group's domain and reads the group's tensors only at its own point."""
    members = {m.tensor for m in group}
    axes = k.tensor.axes
    if any(_extents(m.tensor.axes) != _extents(axes) for m in group):
        return False
    return all(
        all(i is a for i, a in zip(n.indices, axes))
        for n in walk(k.body)
        if isinstance(n, Load) and n.tensor in members
    )


def _extents(axes) -> tuple:
    """The ranges of ``axes``, comparable across tensors."""
    return tuple((ax.lo.key, ax.extent.key) for ax in axes)


def _row_reads(k: LoopNest, group: list[LoopNest]) -> bool:
    """Whether ``k``, written out a row at a time, reads the group's tensors only in its own row, at
    constant columns (within them): each member's row is then computed before ``k``'s."""
    members = {m.tensor for m in group}
    i = k.tensor.axes[0]
    for body in _row_copies(k.tensor, k.body):
        for n in walk(body):
            if isinstance(n, Load) and n.tensor in members:
                if n.indices[0] is not i:
                    return False
                if n.tensor.ndim == 2 and not (
                    isinstance(c := n.indices[1], Const) and 0 <= c.value < n.tensor.shape[1].value
                ):
                    return False
    return True


def _row_copies(t, body) -> list:
    """``body`` once per column of ``t``, the column index a constant (as the code generator writes it)."""
    if t.ndim == 1:
        return [body]
    j = t.axes[1]
    return [simplify(substitute(body, {j: Const(c, dtypes.int64)}), floats=False) for c in range(j.extent.value)]


def _host(group: list[LoopNest], outs: set[int], readers: dict, rows: bool) -> LoopNest:
    """The group's last kernel, hosting the others: over its axes, or written out a row at a time over its
    leading axis only (``rows``: each member keeps its own column axis).  A member keeps its buffer when
    it is an output, marked ``materialize``, or read by a kernel outside the group (``readers``)."""
    host = group[-1]
    inside = {id(k) for k in group}
    merged = []
    for k in group[:-1]:  # over the host's axes, a member's loads of earlier members stay at the point
        t = k.tensor
        axes = (host.tensor.axes[0], *t.axes[1:]) if rows else host.tensor.axes
        body = substitute(k.body, dict(zip(t.axes, axes)))
        store = id(t) in outs or t.materialize or bool(readers.get(t, set()) - inside)
        merged.append(Merged(t, body, store, tuple(k.fused), axes))
    return LoopNest(host.tensor, host.body, host.fused, merged=merged)
