"""A kernel's structural fingerprint and size bucket: the part of a tuning record's key that says which kernel a
schedule was measured on.

The fingerprint hashes (sha256) a canonical text of a :class:`~tailjit.fusion.LoopNest`: its loop nest
(axes, extents as expressions over size variables), its body's expression DAG (loads, operations, dtypes,
constants, reductions), a scatter's update loop, a scan's axis, its side outputs, the kernels merged into its
nest and the row buffers it reads.  Tensors, index variables and size variables are numbered in the order the
walk first meets them, never named: renaming a program's tensors or axes keeps its fingerprints, and equal
kernels built in two processes get equal ones.  A constant tensor's values are hashed in.

The size bucket is ``log2`` of the kernel's number of loop points (rounded down) where its extents are static;
a kernel over symbolic sizes is bucket ``dynamic``, since a build knows no size values (it compiles one kernel
for every size), so its records hold for all of them.
"""

from __future__ import annotations

import hashlib

from tailjit.fusion import LoopNest, RowBuffer
from tailjit.te.expr import (
    Absent,
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
    Tensor,
    Unary,
)

DYNAMIC = "dynamic"


def fingerprint(kernel: LoopNest) -> str:
    """The kernel's structural hash (hex sha256)."""
    return hashlib.sha256(canonical_text(kernel).encode()).hexdigest()


def size_bucket(kernel: LoopNest) -> str:
    """``2^k`` where the kernel's loop nest has between ``2^k`` and ``2^(k+1) - 1`` points (``2^0`` for an empty
    one), or ``dynamic`` where an extent is symbolic."""
    points = 1
    for extent in kernel.tensor.shape:
        if not isinstance(extent, Const):
            return DYNAMIC
        points *= extent.value
    return f"2^{max(points, 1).bit_length() - 1}"


def canonical_text(kernel: LoopNest) -> str:
    """The kernel as text with every tensor and variable named by its position (what ``fingerprint`` hashes)."""
    w = _Writer()
    t = kernel.tensor
    own = [t, *(s.tensor for s in kernel.side), *(m.tensor for m in kernel.merged)]
    for role, x in zip(["kernel"] + ["side"] * len(kernel.side) + ["merged"] * len(kernel.merged), own):
        w.tensor(x, role)
    w.line("axes", *map(w.node, t.axes))
    w.line("scan", t.scan_axis, t.reverse)
    w.line("copy", kernel.copy, "into", w.tensor(kernel.into) if kernel.into is not None else "-")
    w.line("body", w.node(kernel.body))
    if kernel.update is not None:
        u = kernel.update
        cond = w.node(u.cond) if u.cond is not None else "-"
        domain, targets = [w.node(v) for v in u.domain], [w.node(e) for e in u.targets]
        w.line("update", u.combine, domain, targets, w.node(u.value), cond)
    for s in kernel.side:
        w.line("side", w.tensor(s.tensor), [w.node(e) for e in s.index], w.node(s.body))
    for m in kernel.merged:
        w.line("merged", w.tensor(m.tensor), m.store, [w.node(a) for a in m.axes], w.node(m.body))
    return "\n".join(w.lines)


class _Writer:
    """Lines of canonical text: one per expression node (children first, each node once, named ``n<k>``) and per
    tensor (named ``T<k>``), in the order of first use."""

    def __init__(self):
        self.lines: list[str] = []
        self.nodes: dict[Key, str] = {}
        self.tensors: dict[int, str] = {}

    def line(self, *parts) -> None:
        self.lines.append(" ".join(map(str, parts)))

    def tensor(self, t: Tensor, role: str | None = None) -> str:
        name = self.tensors.get(id(t))
        if name is not None:
            return name
        name = self.tensors[id(t)] = f"T{len(self.tensors)}"
        if role is None:
            role = "row" if isinstance(t, RowBuffer) else "constant" if t.is_constant else (
                "input" if t.is_placeholder else "buffer")  # fmt: skip
        shape = [self.node(d) for d in t.shape]
        extra: list = []
        if role == "row":
            extra = ["prefix", [self.node(v) for v in t.prefix], "axes", [self.node(v) for v in t.axes]]
            extra += ["body", self.node(t.body)]
        elif role == "constant":
            extra = [hashlib.sha256(t.data.tobytes()).hexdigest()]
        elif role == "input":
            extra = ["far", t.far]
        self.line(name, "=", role, t.dtype.name, shape, *extra)
        return name

    def node(self, root: Expr) -> str:
        """The name of ``root``'s line, written (with its descendants') on first use; iterative, as bodies may
        nest deeper than Python's recursion limit."""
        stack = [root]
        while stack:
            e = stack[-1]
            if e.key in self.nodes:
                stack.pop()
                continue
            missing = [c for c in _operands(e) if c.key not in self.nodes]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            text = self._text(e)
            self.nodes[e.key] = f"n{len(self.nodes)}"
            self.line(self.nodes[e.key], "=", text)
        return self.nodes[root.key]

    def _text(self, e: Expr) -> str:
        n = self.nodes
        if isinstance(e, Absent):
            return f"absent {e.dtype.name}"
        if isinstance(e, Const):
            return f"const {e.dtype.name} {e.value!r} {e.weak}"
        if isinstance(e, SizeVar):
            return "size"
        if isinstance(e, IterVar):
            return f"iv {e.kind} {n[e.lo.key]} {n[e.extent.key]}"
        if isinstance(e, Load):
            return f"load {self.tensor(e.tensor)} {[n[i.key] for i in e.indices]}"
        if isinstance(e, Unary):
            return f"un {e.op} {e.dtype.name} {e.weak} {n[e.x.key]}"
        if isinstance(e, Binary):
            return f"bin {e.op} {e.dtype.name} {e.weak} {n[e.a.key]} {n[e.b.key]}"
        if isinstance(e, Select):
            return f"sel {e.dtype.name} {e.weak} {n[e.cond.key]} {n[e.a.key]} {n[e.b.key]}"
        if isinstance(e, Cast):
            return f"cast {e.dtype.name} {n[e.x.key]}"
        if isinstance(e, Reduce):
            return f"red {e.op} {e.dtype.name} {[n[a.key] for a in e.axes]} {n[e.body.key]}"
        raise TypeError(f"no canonical text for expression node {type(e).__name__}")


def _operands(e: Expr) -> tuple[Expr, ...]:
    """The nodes ``e``'s line names: its children, a variable's range, a reduction's axes."""
    if isinstance(e, IterVar):
        return (e.lo, e.extent)
    if isinstance(e, Reduce):
        return (*e.axes, e.body)
    return e.children()
