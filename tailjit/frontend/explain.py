"""``tailjit.explain``: what tailjit makes of a function.

For every graph compiled: the graph as captured, its ATen form, the compiled
regions with their kernels (what was fused into each, the loop nests), the
extern calls with their reasons, the generated host function and C source,
and the compile times (``plan.report.describe``, which ``TAILJIT_DEBUG=1``
prints for each graph as it is compiled).
"""

from __future__ import annotations

import torch

from tailjit.frontend.background import Background
from tailjit.frontend.jit import JitClosure, JitFunction, jit
from tailjit.frontend.plan.report import collect_reports, describe


def explain(fn, *args, entry: str = "compile", source: bool = True, **kwargs) -> str:
    """Compile ``fn`` with tailjit, run it once on ``args`` and describe every graph compiled.

    ``entry`` is ``"compile"`` (``torch.compile(fn, backend="tailjit")``) or
    ``"jit"`` (:func:`tailjit.jit`); ``source=False`` leaves out the C code.
    When an output requires grad, the backward is run once too (on ones), so
    that its graph is compiled and described."""
    if isinstance(fn, Background):  # the version this call runs and why, and what its compile made
        runs = fn.state
        _run(fn, args, kwargs)
        reports = list(fn.reports) if fn.compiles else []
        head = f"tailjit (jit, background): runs {runs}; {len(reports)} graph(s) compiled"
        return "\n\n".join([head] + [describe(r, source) for r in reports])
    if isinstance(fn, (JitFunction, JitClosure)):  # its graphs so far, and what eager's measurement chose
        _run(fn, args, kwargs)
        choices = [f"eager as a candidate: {c}" for c in fn.choices] or ["eager as a candidate: nothing decided yet"]
        head = "\n".join([f"tailjit (jit): {len(fn.reports)} graph(s) compiled", *choices])
        return "\n\n".join([head] + [describe(r, source) for r in fn.reports])
    if entry == "compile":
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="tailjit")
    elif entry == "jit":
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
