"""Kernels over one domain share one loop nest.

Fusion leaves a kernel per materialised tensor.  Where several of them run
over the same domain (the box arithmetic of an IoU loss's backward: ten
``(N,)`` temporaries, each read by the next ones at the same box), each is a
pass over memory and a function for gcc to compile.  Here such kernels
merge: the last one *hosts* the others (``Kernel.merged``), whose values are
computed at each point of the host's loops before its own body, in order,
and read by the later ones as locals.  A merged tensor that nothing outside
the group reads (and that is no output) gets no buffer.

A kernel joins the last group of its domain when it

* is plain element-wise work: no reduction (but those written out as
  expressions), row buffer, scan, scatter or side output (their loops or
  placement are the host's own);
* reads the group's tensors only at its own point (``a[i, j]`` for its
  ``(i, j)``): any other element may not be computed yet;
* reads no group that depends on this one (directly or through others):
  the merged loop nest would have to run both before and after it.

The groups then run in an order where each follows those it reads from
(the kernels' own order where that allows).
"""

from __future__ import annotations

import heapq

from tailjit.fusion import Kernel, Merged, Program, RowBuffer, _all_loads
from tailjit.schedule import written_out
from tailjit.te.analysis import substitute
from tailjit.te.expr import Load, Reduce, walk

#: The most kernels one loop nest hosts: a traced Python loop's hundreds of steps become hosts of this
#: many, alike, which ``kernel_sharing`` compiles once (GAE over 200 steps: 7 C functions), instead of one
#: loop body of hundreds of statements for gcc.
MERGE_MAX = 12


def merge_loops(program: Program, keep: frozenset[str] = frozenset()) -> Program:
    """``program`` with kernels over one domain merged as the module says; kernels named in ``keep``
    (those given a schedule of their own) stay as they are."""
    outs = {id(t) for t in program.outputs}
    made_by = {id(k.tensor): k for k in program.kernels}
    group_of: dict[int, int] = {}  # kernel id -> its group's number
    groups: list[list[Kernel]] = []
    preds: list[set[int]] = []  # per group: the groups it reads from
    before: list[set[int]] = []  # per group: every group it depends on, through any path
    latest: dict[tuple, int] = {}  # domain -> its last group
    for k in program.kernels:
        mine = {group_of[id(made_by[id(n.tensor)])] for e in _expressions(k) for n in _all_loads(e)
                if id(n.tensor) in made_by and made_by[id(n.tensor)] is not k}  # fmt: skip
        domain = _domain(k) if _plain(k) and k.name not in keep else None
        g = latest.get(domain) if domain is not None else None
        # joining g is legal when no group k reads depends on g: g would have to run both before and after it
        if g is not None and (
            len(groups[g]) >= MERGE_MAX or not _reads_in_place(k, groups[g]) or any(g in before[p] for p in mine - {g})
        ):
            g = None
        if g is None:
            g = len(groups)
            groups.append([])
            preds.append(set())
            before.append(set())
            if domain is not None:
                latest[domain] = g
        groups[g].append(k)
        group_of[id(k)] = g
        for p in mine - {g}:
            preds[g].add(p)
            before[g] |= before[p] | {p}
    if len(groups) == len(program.kernels):
        return program
    kernels = [_host(grp, outs, program.kernels) if len(grp) > 1 else grp[0] for grp in _in_order(groups, preds)]
    return Program(program.inputs, program.outputs, kernels, program.size_vars, program.constants)


def _in_order(groups: list[list[Kernel]], preds: list[set[int]]) -> list[list[Kernel]]:
    """The groups with each after those it reads from, otherwise in the order of their last members."""
    position = {id(k): n for n, k in enumerate(k for grp in groups for k in grp)}
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
    return out


def _expressions(k: Kernel) -> list:
    """What ``k`` reads: its body even when the copy is skipped (a scatter updating its base's buffer in
    place runs after the base), a scatter's update, its side outputs."""
    update = list(k.update.exprs()) if k.update is not None else []
    return [k.body, *update, *(u.body for u in k.side)]


def _plain(k: Kernel) -> bool:
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


def _domain(k: Kernel) -> tuple:
    return tuple((ax.lo.key, ax.extent.key) for ax in k.tensor.axes)


def _reads_in_place(k: Kernel, group: list[Kernel]) -> bool:
    """Whether ``k`` reads the group's tensors only at its own point."""
    members = {m.tensor for m in group}
    axes = k.tensor.axes
    return all(
        all(i is a for i, a in zip(n.indices, axes))
        for n in walk(k.body)
        if isinstance(n, Load) and n.tensor in members
    )


def _host(group: list[Kernel], outs: set[int], kernels: list[Kernel]) -> Kernel:
    """The group's last kernel, hosting the others over its axes."""
    host = group[-1]
    inside = {id(k) for k in group}
    read_outside = {n.tensor for k in kernels if id(k) not in inside for e in _expressions(k) for n in _all_loads(e)}
    merged = []
    for k in group[:-1]:  # over the host's axes, a member's loads of earlier members stay at the point
        t = k.tensor
        body = substitute(k.body, dict(zip(t.axes, host.tensor.axes)))
        merged.append(Merged(t, body, id(t) in outs or t in read_outside or t.materialize, tuple(k.fused)))
    return Kernel(host.tensor, host.body, host.fused, merged=merged)
