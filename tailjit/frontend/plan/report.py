"""What tailjit did with each compiled graph: :class:`GraphReport`, the newest ones in :data:`REPORTS`,
:func:`collect_reports` for a block's, and their text (``tailjit.explain``, ``TAILJIT_DEBUG=1``)."""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field


@dataclass
class Fallback:
    node: str
    target: str
    reason: str

    def __str__(self):
        return f"{self.node} ({self.target}): {self.reason}"


@dataclass
class GraphReport:
    """What tailjit did with one captured graph (see ``tailjit.explain``)."""

    captured: str  # the graph as it was handed over (Dynamo's, AOTAutograd's, or a trace)
    # "dynamo" (routed to AOTAutograd), "inference", "training" (a forward graph differentiated by tailjit: its
    # kernels include the gradient kernels), "forward" or "backward" (AOTAutograd's), or "jit" (a tailjit.jit trace)
    kind: str = "inference"
    note: str = ""  # how the graph was routed
    aten: str = ""
    kernels: list = field(default_factory=list)  # (kernel, [node names])
    fallbacks: list = field(default_factory=list)  # extern calls for want of a lowering
    # view ops kept as ATen calls: outputs alias as in eager, or only extern calls read them
    views: list = field(default_factory=list)
    eager_reason: str | None = None
    host: str = ""  # the generated host function
    compile_seconds: float = 0.0

    def summary(self) -> str:
        if self.eager_reason:
            return f"{self.kind} graph: runs eagerly ({self.eager_reason})"
        if self.kind == "dynamo":
            return f"captured graph: {self.note}"
        return (
            f"{self.kind} graph: {len(self.kernels)} compiled region(s), {len(self.fallbacks)} extern call(s), "
            f"compiled in {self.compile_seconds:.2f} s"
        )


#: Reports of the graphs compiled in this process (newest last, the newest 64 kept).
REPORTS: list[GraphReport] = []
_collectors: list[list] = []


def new_report(captured: str, kind: str) -> GraphReport:
    report = GraphReport(captured=captured, kind=kind)
    REPORTS.append(report)
    del REPORTS[:-64]
    for c in _collectors:
        c.append(report)
    return report


@contextlib.contextmanager
def collect_reports(into: list | None = None):
    """``with collect_reports() as reports:``: every graph compiled inside the block, in order
    (however many; ``REPORTS`` keeps the newest 64 only), appended to ``into`` when given."""
    reports: list[GraphReport] = [] if into is None else into
    _collectors.append(reports)
    try:
        yield reports
    finally:  # by identity: two collectors of the same reports are equal lists
        del _collectors[next(i for i, c in enumerate(_collectors) if c is reports)]


def describe(report, source: bool = True) -> str:
    """One graph's report as text."""
    lines = [f"=== {report.summary()} ===", "--- captured ---", report.captured.strip()]
    if report.note:
        lines.append(f"--- route: {report.note}")
    if report.aten and report.aten != report.captured:
        lines += ["--- ATen ---", report.aten.strip()]
    if report.eager_reason:
        lines.append(f"--- runs eagerly: {report.eager_reason}")
        return "\n".join(lines)
    if report.kind == "dynamo":
        return "\n".join(lines)
    lines.append(f"--- {len(report.kernels)} compiled region(s) ---")
    for k, nodes in report.kernels:
        lines.append(f"region {k.name}: nodes {', '.join(nodes)}")
        lines.append(k.describe())
    lines.append(f"--- {len(report.fallbacks)} extern call(s) ---")
    lines += [f"  {f}" for f in report.fallbacks] or ["  none"]
    if report.views:
        lines.append(
            "--- views kept as views (outputs share memory as in eager; extern calls read them in place): "
            + ", ".join(report.views)
        )
    if report.host:
        lines += ["--- host function ---", report.host.rstrip()]
    if source:
        shown: set = set()
        for k, _ in report.kernels:
            if k.source not in shown:  # regions built together share one translation unit
                shown.add(k.source)
                names = ", ".join(j.name for j, _ in report.kernels if j.source is k.source)
                lines.append(f"--- C source of {names} ---\n{k.source}")
    return "\n".join(lines)


def debug_print(report) -> None:
    """With ``TAILJIT_DEBUG=1``, print each compiled graph (generated C included) to stderr."""
    if os.environ.get("TAILJIT_DEBUG", "") not in ("", "0"):
        print(describe(report), file=sys.stderr, flush=True)
