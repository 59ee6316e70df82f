"""Per-kernel loop-nest schedules.

A :class:`Schedule` is data the code generator consumes and the tuner will
search over: the order of the spatial loops (after splits), split factors,
whether the outermost loop is shared across OpenMP threads and above which
amount of work, which loop is vectorised, and unroll factors.

A scan's axis carries its recurrence: the schedule lists it as
``sequential``, and a schedule that would share that loop across threads or
vectorise it is rejected.  A scatter's schedule governs the loop nest that
fills it from its base; its update loop always runs serially in row-major
order (duplicate targets must combine in that order).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tailjit.fusion import EXPAND_MAX, Kernel, RowBuffer, pinned_by, written_out
from tailjit.te.expr import Binary, Const, Expr, IterVar, Load, Reduce, Select, TEError, walk

#: Below this much estimated work (elements x per-element cost) a kernel runs
#: on the calling thread: entering an OpenMP region costs about 2 us here.
PARALLEL_WORK = 1 << 16


@dataclass
class Schedule:
    order: list[str]  # spatial loop names outermost first; a split axis "i" gives "i.o", "i.i"
    splits: dict[str, int] = field(default_factory=dict)
    parallel: bool = True  # run the outermost loop across threads when work >= parallel_work
    parallel_work: int = PARALLEL_WORK
    vectorize: bool = True  # `omp simd` on the innermost loop that can take it
    unroll: dict[str, int] = field(default_factory=dict)  # loop -> factor, for loops not vectorised
    sequential: list[str] = field(default_factory=list)  # axes whose loops must run in order (a scan's axis)
    # the innermost loop written out iteration by iteration with its index a constant (a static extent of at
    # most EXPAND_MAX), so that `select(j == c, ...)` resolves at compile time; the loop above it is vectorised
    expand: str | None = None
    # the innermost loop, when the body reads its index only through ``// k`` and ``% k`` (a strided pooling's
    # or convolution's gradient, a nearest upsampling): the vector loop runs over ``q = index // k`` and writes
    # the k positions ``q * k + r`` per iteration, each with ``r`` a constant, so that the loads it indexes by
    # ``q`` are contiguous instead of gathers; the last ``size % k`` positions run in a loop of their own
    modulus: int | None = None
    # the innermost loop, when the body reads its index ``j`` only as ``j // k``, ``j % k`` and ``j`` itself for a
    # longer ``k`` (a flattened view's ``(J, K)`` pairs): a loop over ``q = j // k`` around a vector loop over
    # ``r = j % k``, so that what ``q`` indexes is read once per ``q`` (not gathered lane by lane) and the
    # loads ``j`` indexes stay contiguous
    fold: int | None = None

    def loops(self, axis_names: list[str]) -> list[str]:
        """The loop names this schedule produces for a kernel with these axes, validated."""
        expanded = []
        for a in axis_names:
            expanded += [f"{a}.o", f"{a}.i"] if a in self.splits else [a]
        if sorted(self.order) != sorted(expanded):
            raise TEError(f"schedule order {self.order} is not a permutation of the loops {expanded}")
        for a, f in self.splits.items():
            if a not in axis_names:
                raise TEError(f"schedule splits unknown axis {a!r}")
            if not (isinstance(f, int) and f > 0):
                raise TEError(f"split factor of {a!r} must be a positive int, got {f!r}")
            if self.order.index(f"{a}.o") > self.order.index(f"{a}.i"):
                raise TEError(f"split axis {a!r}: the outer loop must come before the inner one")
        for name, f in self.unroll.items():
            if name not in self.order or not (isinstance(f, int) and f > 0):
                raise TEError(f"bad unroll {name!r}: {f!r}")
        if self.expand is not None and (not self.order or self.expand != self.order[-1] or self.expand not in axis_names
                                        or self.expand in self.sequential):  # fmt: skip
            raise TEError(f"schedule expands {self.expand!r}, which is not an unsplit, parallel innermost loop")
        if self.modulus is not None and (
            not isinstance(self.modulus, int) or self.modulus < 2 or not self.order or len(self.order) < 2
            or self.order[-1] not in axis_names or self.expand is not None or self.order[-1] in self.sequential
            or not self.vectorize
        ):  # fmt: skip
            raise TEError(
                f"schedule modulus {self.modulus!r} needs an int >= 2 and a vectorised, unsplit, parallel innermost "
                "loop below another"
            )
        if self.fold is not None and (
            not isinstance(self.fold, int) or self.fold < 2 or len(self.order) < 2 or self.order[-1] not in axis_names
            or self.expand is not None or self.modulus is not None or self.order[-1] in self.sequential
            or not self.vectorize
        ):  # fmt: skip
            raise TEError(
                f"schedule fold {self.fold!r} needs an int >= 2 and a vectorised, unsplit, parallel innermost loop "
                "below another, without expand or modulus"
            )
        for a in self.sequential:
            if a not in axis_names:
                raise TEError(f"schedule lists unknown axis {a!r} as sequential")
        if self.order and self.parallel and _axis(self.order[0]) in self.sequential:
            raise TEError(
                f"schedule would share loop {self.order[0]!r} across threads, but axis {_axis(self.order[0])!r} "
                "is sequential (it carries a scan's recurrence); set parallel=False or put another loop outermost"
            )
        if self.order and self.vectorize and _axis(self.order[-1]) in self.sequential:
            raise TEError(
                f"schedule would vectorise loop {self.order[-1]!r}, but axis {_axis(self.order[-1])!r} is "
                "sequential (it carries a scan's recurrence); set vectorize=False or put another loop innermost"
            )
        return list(self.order)

    def describe(self) -> str:
        parts = [" > ".join(self.order) or "(scalar)"]
        if self.sequential:
            parts.append("sequential " + ", ".join(self.sequential))
        if self.splits:
            parts.append("split " + ", ".join(f"{a}/{f}" for a, f in self.splits.items()))
        if self.parallel and self.order:
            parts.append(f"parallel {self.order[0]} if work >= {self.parallel_work}")
        if self.expand:
            parts.append(f"expand {self.expand}")
        if self.modulus:
            parts.append(f"{self.order[-1]} by residues mod {self.modulus}")
        if self.fold:
            parts.append(f"{self.order[-1]} folded by {self.fold}")
        if self.vectorize:
            parts.append("simd innermost")
        if self.unroll:
            parts.append("unroll " + ", ".join(f"{a}x{f}" for a, f in self.unroll.items()))
        return "; ".join(parts)


def default_schedule(kernel: Kernel) -> Schedule:
    """Declared axis order (the last axis is the contiguous one), no splits,
    the outermost loop parallel above the work threshold, the innermost loop
    vectorised.  Reductions hoisted by fusion depend on leading axes, so the
    declared order computes each of them once per value of those axes.

    A scan's axis loop is sequential: over the leading axis of ``(T, B)`` the
    ``t`` loop runs in order outside a vectorised ``b`` loop (no thread
    parallelism: the outermost loop carries the recurrence); over the last
    axis the rows run in parallel and each row's loop is scalar."""
    names = loop_names(kernel)
    t = kernel.tensor
    if t.is_scan:
        seq = names[t.scan_axis]
        return Schedule(order=names, parallel=names[0] != seq, vectorize=names[-1] != seq, sequential=[seq])
    expand = names[-1] if _expandable(kernel) or (t.ndim == 2 and kernel.by_rows) else None
    # residues and folds take the body alone: kernels merged into this one (``tailjit.loop_merge``) keep
    # plain loops
    k, exact = (None, False) if expand or kernel.merged else _divisor(kernel)
    modulus = k if k is not None and k <= EXPAND_MAX else None
    return Schedule(order=names, expand=expand, modulus=modulus, fold=k if k and not modulus and exact else None)


def _divisor(kernel: Kernel) -> tuple[int | None, bool]:
    """``(k, exact)`` when the body divides its innermost index ``j`` (``(j + c) // k``, ``(j + c) % k``, for
    constants ``c``) by one constant ``k`` >= 2 only, outside any reduction's own loop; ``exact`` when every
    ``c`` is 0.  ``(None, False)`` otherwise."""
    t = kernel.tensor
    none = (None, False)
    if t.ndim < 2 or t.is_scatter or t.is_scan:
        return none
    j = t.axes[-1]
    if not (isinstance(j.lo, Const) and j.lo.value == 0):
        return none
    ks: set[int] = set()
    exact = True
    stack, seen = [kernel.body], set()
    while stack:
        e = stack.pop()
        if e.key in seen:
            continue
        seen.add(e.key)
        if (division := divided_index(e, j)) is not None:
            c, k = division
            if k is None or k < 2:
                return none
            ks.add(k)
            exact = exact and c == 0
            continue
        if isinstance(e, Load) and isinstance(e.tensor, RowBuffer):
            return none
        if isinstance(e, Reduce) and not written_out(e):
            return none  # a reduction loop inside the innermost one is vectorised instead
        stack.extend(e.children())
    return (ks.pop(), exact) if len(ks) == 1 else none


def _expandable(kernel: Kernel) -> bool:
    """Whether the innermost loop is short, static and picks among branches by its index (a ``stack`` of
    columns): written out, each iteration keeps only its own branch, and the rows are vectorised instead."""
    t = kernel.tensor
    if t.ndim < 2 or t.is_scatter or t.is_scan:
        return False
    ext = t.shape[-1]
    if not (isinstance(ext, Const) and 2 <= ext.value <= EXPAND_MAX):
        return False
    nodes = [n for e in [kernel.body, *(m.body for m in kernel.merged)] for n in walk(e)]
    if any(isinstance(n, Reduce) or (isinstance(n, Load) and isinstance(n.tensor, RowBuffer)) for n in nodes):
        return False
    return any(isinstance(n, Select) and t.axes[-1] in pinned_by(n.cond) for n in nodes)


def divided_index(e: Expr, j: IterVar) -> tuple[int, int | None] | None:
    """``(c, k)`` when ``e`` is ``(j + c) // k`` or ``(j + c) % k`` for a constant ``c`` (``offset_of``); ``k`` is
    None when the divisor is not a constant int."""
    if not (isinstance(e, Binary) and e.op in ("floordiv", "mod")) or (c := offset_of(e.a, j)) is None:
        return None
    return c, e.b.value if isinstance(e.b, Const) and isinstance(e.b.value, int) else None


def offset_of(e: Expr, j: IterVar) -> int | None:
    """``c`` when ``e`` is ``j + c`` for a constant ``c`` (``j`` itself, ``j + c``, ``c + j``, ``j - c``)."""
    if e is j:
        return 0
    if isinstance(e, Binary) and e.op in ("add", "sub"):
        a, b = e.a, e.b
        if a is j and isinstance(b, Const) and isinstance(b.value, int):
            return b.value if e.op == "add" else -b.value
        if e.op == "add" and b is j and isinstance(a, Const) and isinstance(a.value, int):
            return a.value
    return None


def check_schedule(kernel: Kernel, schedule: Schedule) -> list[str]:
    """Validate ``schedule`` for ``kernel``; return its loops, outermost first."""
    names = loop_names(kernel)
    loops = schedule.loops(names)
    t = kernel.tensor
    if t.is_scan and names[t.scan_axis] not in schedule.sequential:
        seq = names[t.scan_axis]
        raise TEError(
            f"schedule for scan {t.name!r}: axis {seq!r} carries the recurrence and must be listed in "
            f"Schedule.sequential (e.g. sequential=[{seq!r}])"
        )
    lead = {n for n, ax in zip(names, t.axes) if any(i is ax for u in kernel.side for i in u.index)}
    if loops and _axis(loops[-1]) in lead:
        raise TEError(
            f"schedule for {t.name!r}: the kernel also writes {[u.tensor.name for u in kernel.side]}, computed "
            f"once per value of loops {sorted(lead)}, so the innermost loop {loops[-1]!r} must be another one"
        )
    return loops


def loop_names(kernel: Kernel) -> list[str]:
    names = [a.name for a in kernel.tensor.axes]
    if len(set(names)) != len(names):
        names = [f"{n}{d}" for d, n in enumerate(names)]
    return names


def _axis(loop: str) -> str:
    """The axis a loop iterates: ``i`` for ``i``, ``i.o`` and ``i.i``."""
    return loop[:-2] if loop.endswith((".o", ".i")) else loop
