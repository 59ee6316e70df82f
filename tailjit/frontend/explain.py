"""``tailjit.explain`` and ``TAILJIT_DEBUG=1``: what tailjit makes of a function.

For every graph compiled: the graph as captured, its ATen form, the compiled
regions with their kernels (what was fused into each, the loop nests), the
extern calls with their reasons, the generated host function and C source,
and the compile times.
"""

from __future__ import annotations

import os
import sys

import torch

from tailjit.frontend.background import Background


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


def explain(fn, *args, entry: str = "compile", source: bool = True, **kwargs) -> str:
    """Compile ``fn`` with tailjit, run it once on ``args`` and describe every graph compiled.

    ``entry`` is ``"compile"`` (``torch.compile(fn, backend="tailjit")``) or
    ``"jit"`` (:func:`tailjit.jit`); ``source=False`` leaves out the C code.
    When an output requires grad, the backward is run once too (on ones), so
    that its graph is compiled and described."""
    from tailjit.frontend.graph import collect_reports

    if isinstance(fn, Background):  # the version this call runs and why, and what its compile made
        runs = fn.state
        _run(fn, args, kwargs)
        reports = list(fn.reports) if fn.compiles else []
        head = f"tailjit (jit, background): runs {runs}; {len(reports)} graph(s) compiled"
        return "\n\n".join([head] + [describe(r, source) for r in reports])
    if entry == "compile":
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="tailjit")
    elif entry == "jit":
        from tailjit.frontend.jit import jit

        compiled = jit(fn)
    else:
        raise ValueError(f"entry must be 'compile' or 'jit', got {entry!r}")
    with collect_reports() as reports:
        _run(compiled, args, kwargs)
    head = f"tailjit ({entry}): {len(reports)} graph(s) compiled"
    return "\n\n".join([head] + [describe(r, source) for r in reports])


def _run(compiled, args, kwargs) -> None:
    """One call, and its backward (on ones) where an output requires grad."""
    out = compiled(*args, **kwargs)
    outs = [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
    if outs:
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])


def explain_graph(fn, *args, **kwargs) -> str:
    """``explain(fn, *args)`` through ``torch.compile`` (kept for existing callers)."""
    return explain(fn, *args, entry="compile", **kwargs)


def debug_print(report) -> None:
    """With ``TAILJIT_DEBUG=1``, print each compiled graph (generated C included) to stderr."""
    if os.environ.get("TAILJIT_DEBUG", "") not in ("", "0"):
        print(describe(report), file=sys.stderr, flush=True)
