"""Per-kernel loop-nest schedules.

A :class:`Schedule` is data the code generator consumes and the tuner will
search over: the order of the spatial loops (after splits), split factors,
whether the outermost loop is shared across OpenMP threads and above which
amount of work, which loop is vectorised, and unroll factors; and how the
loops are shaped inside: a vectorised reduction's accumulators and blocks,
column blocks, quick divisions, unswitching budgets and loop cuts.  Every
such choice is a field whose default is what the code generator has always
done, so a default schedule gives the same C; ``tailjit.schedule_space``
lists each field's valid alternatives for a kernel.

A scan's axis carries its recurrence: the schedule lists it as
``sequential``, and a schedule that would share that loop across threads or
vectorise it is rejected.  A scatter's schedule governs the loop nest that
fills it from its base; its update loop always runs serially in row-major
order (duplicate targets must combine in that order).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from tailjit.fusion import EXPAND_MAX, LoopNest, RowBuffer, pinned_by, written_out
from tailjit.te.expr import Binary, Const, Expr, IterVar, Load, Reduce, Select, TEError, walk

#: Below this much estimated work (elements x per-element cost) a kernel runs
#: on the calling thread: entering an OpenMP region costs about 2 us here.
PARALLEL_WORK = 1 << 16

# The defaults of the fields that shape loops inside the nest (what ``default_schedule`` keeps).

#: Independent accumulators of a vectorised reduction over at least SPLIT_MIN elements (``Schedule.split``).
SPLIT, SPLIT_MIN = 4, 512

#: A vectorised float32 sum adds blocks of SUM_BLOCK elements in float32, their totals in float64
#: (``Schedule.sum_block``).
SUM_BLOCK = 1024

#: Vectorised reduction loops run whole blocks of TAIL elements (the most lanes of a vector: 16 floats) and
#: leave the rest to a plain loop (``Schedule.tail``).
TAIL = 16

#: The shortest loop for which divisions by a loop-invariant value take the quick path (``Schedule.qdiv_min``).
QDIV_MIN = 64

#: How many versions of an innermost loop unswitching may emit below one condition: independent conditions
#: double them, but a chain of exclusive ones (a gate picked by ``k == 0``, ``k == 1``, ...) adds one per
#: condition, as the true branch of each decides the others (``Schedule.unswitch_versions``).
UNSWITCH_VERSIONS = 8

#: How many versions it may emit in all (``Schedule.unswitch_total``).  A gate's true branch (``k == c``) does
#: not take from the budget of the gates of the same index after it, so that each row of a chain gets versions
#: of its own: a Python loop over 16 rows assigning ``out[b, :n] = ...`` would leave 14 rows in one version,
#: which evaluates all 16 rows' selects and loads per element (``reverse_padded_sequence``'s training call:
#: ``python docs/scripts/task_time.py . reverse_padded_sequence small`` times it).
UNSWITCH_TOTAL = 64

#: A cut of an innermost loop where a select over its index changes truth (one loop per piece, each with the
#: select decided), or of a reduction over a select on its index, pays for its extra loop when one piece saves
#: at least this much per element (in units of ``analysis.cost``; ``Schedule.cut_min_saving``): a rotate-half
#: ``cat`` of 32 + 32 elements, which saves a load and a negation (4), ran slower cut; the K-NN grouping's cut
#: (5) faster.
CUT_MIN_SAVING = 5

#: What a load costs beyond ``analysis.cost`` in a cut when its index along the cut axis is not affine (a
#: clamp, an edge padding's select): a vector gather instead of a contiguous load, which the cut saves
#: (``Schedule.gather_cost``).  A Sobel filter over a replicate padding reads 18 such loads per element; cut,
#: its middle piece reads them contiguously.
GATHER_COST = 4

#: Columns accumulated together by a reduction that runs down columns (``Schedule.column_block``).
COLUMN_BLOCK = 64

#: A column block over an innermost loop at most this short takes in the loop around it too
#: (``Schedule.pair_max``).
PAIR_MAX = 16

#: Fewer static columns than this (a box's 2 corners) are not worth a block: each reduction's own loop is
#: vectorised instead (``Schedule.column_min``).
COLUMN_MIN = 4

#: The largest ``Schedule.sum_block``: a float32 block of a sum keeps eager's accuracy (a few units in the last
#: place of the block's sum of magnitudes) only while each vector lane adds few terms in float32.
SUM_BLOCK_MAX = 4096


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
    # -- how the loops are shaped inside (each applies to every reduction, cut or division of the kernel)
    # a vectorised reduction over at least ``split_min`` elements keeps ``split`` independent arrays of ``tail``
    # lanes, taking the range's vectors in turn, so consecutive vector iterations do not wait on one another's
    # add or max; 1: one accumulator.  Max and min do not depend on the order; a float sum or product does, and
    # is computed in one fixed order per schedule
    split: int = SPLIT
    split_min: int = SPLIT_MIN
    # vectorised reduction loops run whole blocks of ``tail`` elements (a power of two) and leave the rest to a
    # plain loop (gcc's epilogue of an ``omp simd`` reduction stalls on store forwarding)
    tail: int = TAIL
    # a vectorised float32 sum adds each block of ``sum_block`` elements in float32 lanes, the blocks' totals in
    # float64: semantics, not only speed (it keeps eager's accuracy whatever the length), so it is restricted
    # to a power of two from ``tail`` to SUM_BLOCK_MAX; a sum over short rows flushes its column accumulators
    # into the float64 total every ``sum_block // tail`` rows
    sum_block: int = SUM_BLOCK
    # a reduction or row fill whose body calls vector math (libmvec) keeps one accumulator: no split, no
    # reductions riding along the fill, no per-column version of a sum (each call clobbers the vector
    # registers, so more accumulators would go to the stack and back around every call)
    calls_plain: bool = True
    # reductions down columns accumulate ``column_block`` columns per pass, when at least ``column_min``
    # static columns; a block over an innermost loop of at most ``pair_max`` static elements takes in the loop
    # around it too
    column_block: int = COLUMN_BLOCK
    column_min: int = COLUMN_MIN
    pair_max: int = PAIR_MAX
    # divisions by a loop-invariant value take the quick path (a reciprocal, checked by FP flags) in loops of
    # at least ``qdiv_min`` elements
    qdiv_min: int = QDIV_MIN
    # unswitching of the innermost loop on conditions of outer indices: at most ``unswitch_versions`` versions
    # below one condition, ``unswitch_total`` in all; 1 turns it off
    unswitch_versions: int = UNSWITCH_VERSIONS
    unswitch_total: int = UNSWITCH_TOTAL
    # a loop or a reduction is cut where a select over its index changes truth when a piece saves at least
    # ``cut_min_saving`` per element, a gather made a contiguous load counting ``gather_cost``
    cut_min_saving: int = CUT_MIN_SAVING
    gather_cost: int = GATHER_COST

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
        self._check_tactics()
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

    def _check_tactics(self) -> None:
        """The fields that shape the loops inside: ints in their ranges (see each field)."""
        least = {"split": 1, "split_min": 0, "tail": 1, "sum_block": 1, "column_block": 1, "column_min": 0,
                 "pair_max": 0, "qdiv_min": 0, "unswitch_versions": 1, "unswitch_total": 1, "cut_min_saving": 0,
                 "gather_cost": 0}  # fmt: skip
        for name, low in least.items():
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= low):
                raise TEError(f"schedule {name} must be an int >= {low}, got {value!r}")
        if self.tail & (self.tail - 1):
            raise TEError(f"schedule tail must be a power of two (a mask rounds ranges to it), got {self.tail}")
        if self.sum_block & (self.sum_block - 1) or not self.tail <= self.sum_block <= SUM_BLOCK_MAX:
            raise TEError(
                f"schedule sum_block must be a power of two from tail ({self.tail}) to {SUM_BLOCK_MAX} (longer "
                f"float32 blocks lose eager's accuracy), got {self.sum_block}"
            )
        if not isinstance(self.calls_plain, bool):
            raise TEError(f"schedule calls_plain must be a bool, got {self.calls_plain!r}")

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
        changed = [f"{f.name}={getattr(self, f.name)}" for f in fields(self) if f.name in TACTICS
                   and getattr(self, f.name) != f.default]  # fmt: skip
        if changed:
            parts.append(", ".join(changed))
        return "; ".join(parts)


#: The fields that shape the loops inside the nest, with defaults the same for every kernel.
TACTICS = (
    "split", "split_min", "tail", "sum_block", "calls_plain", "column_block", "column_min", "pair_max",
    "qdiv_min", "unswitch_versions", "unswitch_total", "cut_min_saving", "gather_cost",
)  # fmt: skip


def default_schedule(kernel: LoopNest) -> Schedule:
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


def _divisor(kernel: LoopNest) -> tuple[int | None, bool]:
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


def _expandable(kernel: LoopNest) -> bool:
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


def check_schedule(kernel: LoopNest, schedule: Schedule) -> list[str]:
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


def loop_names(kernel: LoopNest) -> list[str]:
    names = [a.name for a in kernel.tensor.axes]
    if len(set(names)) != len(names):
        names = [f"{n}{d}" for d, n in enumerate(names)]
    return names


def _axis(loop: str) -> str:
    """The axis a loop iterates: ``i`` for ``i``, ``i.o`` and ``i.i``."""
    return loop[:-2] if loop.endswith((".o", ".i")) else loop
