"""Compile one ATen FX graph: plan it (``plan.planner``), build its regions, and generate and run its
host function.

Every entry point ends here: the Dynamo backend's inference graphs, the
forward and backward graphs AOTAutograd hands over for training, and
``tailjit.jit``'s traces.  The result is a Python function generated for the
graph (``host.source``): straight-line code that calls each region's C entry
point and each extern op with its arguments in locals, so the per-call cost is
one Python call per region or extern op and nothing else.  A graph that lowers
into one region is one C call.
"""

from __future__ import annotations

import time

import torch
import torch.fx

from tailjit.frontend.host.code import DIFFERENTIABLE, HostCode
from tailjit.frontend.host.graph_autograd import one_node
from tailjit.frontend.lower.reinplace import narrow_updates
from tailjit.frontend.plan.planner import Planner
from tailjit.frontend.plan.report import GraphReport, debug_print
from tailjit.frontend.plan.steps import ExternStep, KernelStep
from tailjit.op import DIRECT


def compile_graph(gm: torch.fx.GraphModule, report: GraphReport, requires_grad: list | None = None):
    """The host function of an ATen graph whose nodes carry fake values (``meta["val"]``).

    ``requires_grad`` (one flag per input) makes the graph differentiable (``expr_grad.py``): each
    region's outputs take part in autograd, with a backward kernel derived from its tensor expressions
    and built in the same C compile, and extern calls go through the dispatcher.  Raises
    :class:`Unsupported` when a region's gradient cannot be derived."""
    start = time.perf_counter()
    report.aten = report.aten or gm.code
    if requires_grad is None:  # (a write into a region's output would change what autograd saved of it)
        narrow_updates(gm)
    p = Planner(gm, report, requires_grad)
    fn = HostFunction(p, p.plan())
    report.compile_seconds = time.perf_counter() - start
    debug_print(report)
    return fn


class HostFunction:
    """The generated Python function that runs a planned graph.

    Called with the graph's inputs (positionally, or as one list when
    ``_boxed_call`` is honoured by AOTAutograd), it returns the graph's output
    structure."""

    def __init__(self, p: Planner, output):
        self.report = p.report
        self.kernels = [s.kernel for s in p.steps if isinstance(s, KernelStep)]
        self.externs = [s for s in p.steps if isinstance(s, ExternStep)]
        self.nargs = len(p.placeholders)
        data = {sym: p.slots[n] for sym, n in p.data_syms.items() if n in p.slots}
        gen = HostCode(p.input_syms, data, p.slice_syms, DIFFERENTIABLE if p.differentiable else DIRECT)
        args = [f"v{i}" for i in range(self.nargs)]
        body = gen.steps(p.steps)
        ret = gen.value(output)
        sizes = gen.size_lines()
        src = [f"def tailjit_graph({', '.join(args)}):"] + sizes + body + [f"    return {ret}"]
        self.source = "\n".join(src) + "\n"
        p.report.host = self.source
        namespace = dict(gen.globals)
        exec(compile(self.source, f"<tailjit graph {id(self):x}>", "exec"), namespace)  # noqa: S102
        self.fn = namespace["tailjit_graph"]
        if p.differentiable:
            self.fn = one_node(p, output, self.fn) or self.fn

    def __call__(self, *args):
        return self.fn(*args)

    def boxed(self):
        """A callable in AOTAutograd's boxed convention (one list argument, which it may clear)."""
        fn = self.fn

        def run(args):
            a = list(args)
            args.clear()
            return fn(*a)

        run._boxed_call = True
        return run
