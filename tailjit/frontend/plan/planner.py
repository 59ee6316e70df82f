"""Plan one ATen FX graph: partition it into tensor-expression regions and
eager (extern) calls, and build every region.

The graph is walked in order: a node with a lowering joins the open *region*;
a node without one (or whose lowering refuses its arguments) is an extern call
to its ATen op, closing the open region first when it needs one of the
region's values or mutates memory.  Each region is one ``tailjit.build``.  The
plan is a list of steps (``plan.steps``), which ``host.function`` turns into
the graph's host function.
"""

from __future__ import annotations

import math
import operator
import sys
import warnings

import sympy
import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

from tailjit import te
from tailjit.api import build, build_many
from tailjit.frontend.lower.lowering import LOWERINGS, SCALAR_OPS, NodeLowering, lower_node, te_dtype
from tailjit.frontend.lower.reinplace import DESTINATION, padded
from tailjit.frontend.lower.stop_gradient import carries_gradient
from tailjit.frontend.lower.symbolic import Unsupported, sym_expr, to_te
from tailjit.frontend.lower.values import is_float, mutates, node_storage, tensor_storage, written_storages
from tailjit.frontend.lower.view import RESHAPES, merges_dims
from tailjit.frontend.plan.report import Fallback, GraphReport
from tailjit.frontend.plan.steps import Broadcast, ConstStep, ExternStep, KernelStep, Ref, SymRef
from tailjit.runtime.kernel import Backward, gradient_spec, passed_through
from tailjit.te.analysis import FAR
from tailjit.te.expr import IterVar, Reduce, SizeVar, walk
from tailjit.te.graph import reachable


class Region:
    def __init__(self, index: int):
        self.index = index
        self.inputs: list = []  # fx nodes read by the region
        self.placeholders: list[te.Tensor] = []
        self.by_node: dict = {}  # fx node -> te placeholder
        self.values: dict = {}  # fx node -> te tensor or tuple
        self.nodes: list = []
        self.bound: set = set()
        self.used: set = set()
        self.syms: dict = {}  # sympy symbol -> te.SizeVar (each region has its own, see canonicalise)

    def sizevar(self, sym):
        if sym not in self.syms:
            self.syms[sym] = te.var(str(sym))
        return self.syms[sym]

    def snapshot(self):
        return (list(self.inputs), list(self.placeholders), dict(self.by_node), set(self.bound), set(self.used))

    def restore(self, snap):
        self.inputs, self.placeholders, self.by_node, self.bound, self.used = snap


class Planner:
    def __init__(self, gm: torch.fx.GraphModule, report: GraphReport, requires_grad: list | None = None):
        self.gm = gm
        self.report = report
        self.differentiable = requires_grad is not None
        self.grad_nodes = carries_gradient(gm, requires_grad) if self.differentiable else set()
        self.steps: list = []
        self.slots: dict = {}  # fx node -> slot index of its runtime value
        self.nslots = 0
        self.input_syms: dict = {}  # symbol -> (input position, dim or None)
        self.region: Region | None = None
        self.done: set = set()  # getitem nodes lowered with their tuple-valued producer
        self.nregions = 0
        self.fallback_reason: str | None = None
        self.pure: dict = {}  # node -> is_pure_sym
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.aliases = output_aliases(gm) | {n for n in gm.graph.nodes if n.meta.get(DESTINATION)}
        self.extern_views = views_for_externs(gm)
        self.far = far_values(gm)
        self.flat_views: set = set()  # reshapes of region inputs that merge dimensions: run as ATen reshapes
        self.outside_views: set = set()  # views of a closed region's inputs that ran before its kernel
        for pos, n in enumerate(self.placeholders):
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor):
                for d, s in enumerate(v.shape):
                    e = _sym(s)
                    if isinstance(e, sympy.Symbol):
                        self.input_syms.setdefault(e, (pos, d))
            elif isinstance(v, torch.SymInt):
                e = _sym(v)
                if isinstance(e, sympy.Symbol):
                    self.input_syms.setdefault(e, (pos, None))
        self.input_sym_set = set(self.input_syms)
        # a size read from data (``segment_ids[-1].item() + 1`` rows): the node whose runtime value it is
        self.data_syms: dict = {}
        for n in gm.graph.nodes:
            v = n.meta.get("val")
            if n.op != "placeholder" and isinstance(v, torch.SymInt):
                e = _sym(v)
                if isinstance(e, sympy.Symbol) and e not in self.input_syms:
                    self.data_syms.setdefault(e, n)
        self.input_reads = input_reads(gm)
        # sizes known before any region runs: the inputs', those read from the inputs, and the lengths of
        # slices bounded by them (``x[b, :n]``), which the host computes as torch does
        self.known_syms = self.input_sym_set | {
            _sym(n.meta["val"])
            for n in self.input_reads
            if n.target is _aten._local_scalar_dense.default and isinstance(n.meta.get("val"), torch.SymInt)
        }
        self.slice_syms: dict = {}  # symbol -> (size, start, end, step) of the slice whose length it is
        self.same_size: dict = {}  # symbol -> the first symbol of the same slice length (one kernel size)
        first: dict = {}
        for n in gm.graph.nodes:
            if n.op == "call_function" and n.target is _aten.slice.Tensor:
                got = slice_length(n, self.known_syms)
                if got is not None:
                    sym, length = got
                    self.slice_syms[sym] = length
                    self.same_size[sym] = first.setdefault(length, sym)
                    self.known_syms.add(sym)

    def slot(self, node) -> int:
        if node not in self.slots:
            self.slots[node] = self.nslots
            self.nslots += 1
        return self.slots[node]

    def is_pure_sym(self, node) -> bool:
        """Whether ``node`` is a size computed from sizes known before any region runs (no runtime value of its
        own)."""
        got = self.pure.get(node)
        if got is None:
            v = node.meta.get("val")
            got = False
            if isinstance(v, torch.SymInt) and node.op != "placeholder":
                try:
                    got = sym_expr(v).free_symbols <= self.known_syms
                except Unsupported:
                    pass
            self.pure[node] = got
        return got

    def plan(self):
        for n in self.placeholders:
            self.slot(n)
        elements, lists = element_reads(self.input_reads), {}
        unused = views_only_for(elements, self.input_reads)
        for node in self.input_reads:  # numbers read from the inputs: known before any region runs
            self.done.add(node)
            if node in unused:
                continue
            if node in elements:  # an element of a small input: from one list of its elements per call
                p, k = elements[node]
                if p not in lists:
                    lists[p] = self.slot(("elements", p))
                    self.steps.append(ExternStep(_elements, (Ref(self.slots[p]),), {}, lists[p]))
                self.steps.append(ExternStep(operator.getitem, (Ref(lists[p]), k), {}, self.slot(node)))
                continue
            if node.target in VIEW_OPS:
                self.report.views.append(node.name)
            self.steps.append(self.extern_step(node))
        output = None
        for node in self.gm.graph.nodes:
            if node.op == "placeholder" or node in self.done:
                continue
            if node.op == "output":
                self.close()
                output = self.template(node.args[0])
                break
            if node.op == "get_attr":
                value = getattr(self.gm, node.target)
                if not self.inline_constant(node, value):
                    self.steps.append(ConstStep(value, self.slot(node)))
                continue
            if self.is_pure_sym(node):
                continue
            if node.op == "call_function" and self.try_lower(node):
                continue
            self.extern(node)
        self.build_regions()
        return output

    def try_lower(self, node) -> bool:
        if mutates(node.target):
            self.fallback_reason = "mutates a tensor in place"
            return False
        if node in self.aliases or node in self.extern_views:
            return False
        if node.target in RESHAPES and not (self.region and node.args[0] in self.region.values) and merges_dims(node):
            # a flattening view of a value the region would read as an input: the ATen reshape before the
            # kernel (a view when the strides allow), so that the kernel reads it flat rather than by a quotient
            # and remainder per element (a (B, 1, H, W) mask flattened for a per-sample sum)
            self.flat_views.add(node)
            return False
        if node.target is operator.getitem and self.region and node.args[0] in self.region.values:
            tup = self.region.values[node.args[0]]
            self.region.values[node] = tup[node.args[1]]
            self.region.nodes.append(node)
            return True
        if self.region is None:
            self.region = Region(self.nregions)
            self.nregions += 1
        r = self.region
        snap = r.snapshot()
        L = NodeLowering(node, self.size_leaf, value=lambda n: self.convert(n, L))
        try:
            args = self.convert(tuple(node.args), L)
            kwargs = self.convert(dict(node.kwargs), L)
            vals = node.meta.get("val")
            if node.target in SCALAR_OPS:
                vals = []
            parts = isinstance(vals, (tuple, list))
            for v in vals if parts else [vals]:
                if not isinstance(v, torch.Tensor) and not (parts and v is None):  # (a gradient not asked for)
                    raise Unsupported("output is not a tensor")
                if v is not None:
                    te_dtype(v.dtype)
            out = lower_node(L, args, kwargs)
        except (Unsupported, te.TEError, TypeError) as e:
            r.restore(snap)
            self.fallback_reason = str(e) if isinstance(e, Unsupported) else f"{type(e).__name__}: {e}"
            return False
        r.values[node] = out
        r.nodes.append(node)
        if isinstance(out, tuple):  # its getitems join the region now, whatever comes between
            for u in node.users:
                if u.target is operator.getitem and isinstance(u.args[1], int):
                    r.values[u] = out[u.args[1]]
                    r.nodes.append(u)
                    self.done.add(u)
        return True

    def inline_constant(self, node, value) -> bool:
        """A small constant tensor (``x.new_tensor(means)``) becomes a ``te.constant`` of the open
        region: compiled into the kernel, no argument at call time."""
        if not (isinstance(value, torch.Tensor) and value.numel() <= SMALL_CONSTANT and value.device.type == "cpu"):
            return False
        try:
            dt = te_dtype(value.dtype)
        except Unsupported:
            return False
        with unset_fake_temporarily():  # AOTAutograd compiles under its fake mode
            data = value.detach().numpy().copy()
        if self.region is None:
            self.region = Region(self.nregions)
            self.nregions += 1
        self.region.values[node] = te.constant(data, dt, name=node.name)
        self.region.nodes.append(node)
        return True

    def size_leaf(self, sym):
        r = self.region
        sym = self.same_size.get(sym, sym)
        if sym not in r.bound and sym not in self.known_syms and self.data_syms.get(sym) not in self.slots:
            # (a size read from data is bound once an earlier step has computed it: not by this region)
            raise Unsupported(f"size {sym} is not bound by any input of the region")
        r.used.add(sym)
        return r.sizevar(sym)

    def convert(self, a, L):
        if isinstance(a, (list, tuple)):
            return type(a)(self.convert(x, L) for x in a)
        if isinstance(a, dict):
            return {k: self.convert(v, L) for k, v in a.items()}
        if not isinstance(a, torch.fx.Node):
            if isinstance(a, (torch.SymFloat, torch.SymBool)):
                raise Unsupported("symbolic float/bool argument")
            return a
        r = self.region
        if a in r.values:
            v = r.values[a]
            if isinstance(v, tuple):
                raise Unsupported("tuple value used directly")
            return v
        v = a.meta.get("val")
        if isinstance(v, torch.SymInt):
            return L.size(v)
        if not isinstance(v, torch.Tensor):
            raise Unsupported(f"argument {a.name} is a {type(v).__name__}")
        if a in r.by_node:
            return r.by_node[a]
        if a in self.outside_views:  # an index expanded by an earlier region: the view's own index arithmetic
            view = self.view_again(a)
            if view is not None:
                return view
        if v.device.type != "cpu":
            raise Unsupported(f"tensor on {v.device}")
        dt = te_dtype(v.dtype)
        broadcast = self.broadcast_dims(a)
        for d, s in enumerate(v.shape):
            e = _sym(s)
            if isinstance(e, sympy.Symbol) and d not in broadcast:
                r.bound.add(e)
        shape = []
        for s in v.shape:
            e = _sym(s)
            shape.append(int(e) if isinstance(e, sympy.Integer) else to_te(e, self.size_leaf))
        p = te.placeholder([1 if d in broadcast else n for d, n in enumerate(shape)], dtype=dt, name=a.name)
        p.far = a in self.far
        r.inputs.append(a)
        r.placeholders.append(p)
        r.by_node[a] = p
        if broadcast:  # the kernel reads the one element of each broadcast dimension
            zero = te.cast(0, te.int64)
            r.by_node[a] = te.compute(
                shape, lambda *i: p[tuple(zero if d in broadcast else x for d, x in enumerate(i))], name=f"{a.name}_b"
            )
        return r.by_node[a]

    def broadcast_dims(self, node) -> tuple:
        """The broadcast dimensions (stride 0, more than one element) of a region input that no gradient flows
        into: the kernel takes a view of their first element (``_broadcast_base``), so that
        ``torch.ones(1).expand(2**31)`` is read as the one element it is, not copied to 8 GiB."""
        v = node.meta.get("val")
        if not isinstance(v, torch.Tensor) or v.layout != torch.strided or node in self.grad_nodes:
            return ()
        one = [type(n) is int and n <= 1 for n in v.shape]  # (a symbolic size is not)
        return tuple(d for d, st in enumerate(v.stride()) if type(st) is int and st == 0 and not one[d])

    def view_again(self, node):
        """The value of ``node``, a view that ran before an earlier region's kernel, lowered again in this
        region over what it views (``segment_ids.unsqueeze(1).expand_as(x)`` read by a later scatter: its
        index is then ``ids[i]``, not a load through runtime strides that may be 0), or None.  The view's
        own step still runs, for the region's eager path."""
        r = self.region
        snap = r.snapshot()
        L = NodeLowering(node, self.size_leaf, value=lambda n: self.convert(n, L))
        try:
            out = lower_node(L, self.convert(tuple(node.args), L), self.convert(dict(node.kwargs), L))
        except (Unsupported, te.TEError, TypeError):
            r.restore(snap)
            return None
        r.values[node] = out  # (not one of the region's nodes: never an output, never in its eager path)
        return out

    def extern(self, node):
        reason = self.fallback_reason or "not lowered"
        self.fallback_reason = None
        if node in self.aliases or node in self.extern_views or node in self.flat_views:
            self.report.views.append(node.name)
        elif node.op == "call_function" and node.target is not operator.getitem:
            self.report.fallbacks.append(Fallback(node.name, str(node.target), reason))
        elif node.op != "call_function":
            self.report.fallbacks.append(Fallback(node.name, node.op, "not a function call"))
        if self.region is not None:
            needed = []
            torch.fx.node.map_arg((node.args, node.kwargs), needed.append)
            # a mutation must not run before a region that is still open reads the old contents
            if mutates(node.target) or any(n in self.region.values for n in needed):
                self.close()
        self.steps.append(self.extern_step(node))

    def extern_step(self, node) -> ExternStep | ConstStep:
        if node.op == "get_attr":  # an inlined constant, when its region runs eagerly after all
            return ConstStep(getattr(self.gm, node.target), self.slot(node))
        # a flattening view: the traced strides allowed a view, other inputs' may not (reshape copies then)
        target = _aten.reshape.default if node in self.flat_views else node.target
        return ExternStep(target, self.template(node.args), self.template(node.kwargs), self.slot(node))

    def template(self, a):
        if isinstance(a, (list, tuple)):
            return type(a)(self.template(x) for x in a)
        if isinstance(a, dict):
            return {k: self.template(v) for k, v in a.items()}
        if isinstance(a, torch.fx.Node):
            if a in self.slots:
                return Ref(self.slots[a])
            if self.is_pure_sym(a):
                return SymRef(sym_expr(a.meta["val"]))
            raise AssertionError(f"{a.name} has no runtime value")  # pragma: no cover
        return a

    def close(self):
        r, self.region = self.region, None
        if r is None or not r.nodes:
            return
        members = set(r.nodes)

        def read_outside(n) -> bool:  # a size query (sym_size) does not count
            return any(u not in members and not self.is_pure_sym(u) for u in n.users)

        # views of the region's inputs that something outside reads run as the views they are, before the
        # kernel: it would only copy them (an index expanded for scatter_reduce, whose stride-0 index is torch's
        # fast path: 24 -> 330 us a call for segment_max once copied)
        views = self.views_of_inputs(r)
        kept = {n for n in views if read_outside(n)}
        for n in reversed(r.nodes):  # the views these are views of
            if n in kept:
                kept |= {a for a in n.all_input_nodes if a in views}
        kept_views = [n for n in r.nodes if n in kept]
        # a value is an output when something outside reads it
        outs = [n for n in r.nodes if isinstance(r.values[n], te.Tensor) and read_outside(n) and n not in views]
        # a number (``x.item()``) that something outside reads: the kernel writes it as a 0-d tensor
        numbers = [n for n in r.nodes if isinstance(r.values[n], te.Expr) and any(u not in members for u in n.users)]
        if all(n.target in _NO_WORK for n in r.nodes if n.op == "call_function" and n not in views):
            kept_views, outs, numbers = list(r.nodes), [], []  # nothing to compute (a .item()): all as in eager
        self.report.views += [n.name for n in kept_views if n.target in VIEW_OPS]
        self.steps += [self.extern_step(n) for n in kept_views]
        self.outside_views.update(n for n in kept_views if n.target in VIEW_OPS)
        if not outs and not numbers:
            return
        tensors, seen = [], set()
        for n in outs:
            t = r.values[n]
            if t.is_placeholder or id(t) in seen:  # an output must be a compute of its own
                t = te.compute(t.shape, lambda *i, t=t: t[i], name=f"{n.name}_out")
            seen.add(id(t))
            tensors.append(t)
        out_slots = [self.slot(n) for n in outs]
        after = []
        for n in numbers:
            tensors.append(te.compute((), lambda e=r.values[n]: e, name=f"{n.name}_value"))
            out_slots.append(self.nslots)
            after.append(ExternStep(torch.ops.aten._local_scalar_dense.default, (Ref(self.nslots),), {}, self.slot(n)))
            self.nslots += 1
        inputs = list(r.placeholders)
        sources: list = [Broadcast(self.slots[n], d) if (d := self.broadcast_dims(n)) else Ref(self.slots[n])
                         for n in r.inputs]  # fmt: skip
        grad_mask = [n in self.grad_nodes and p.dtype.is_float for n, p in zip(r.inputs, r.placeholders)]
        for sym in sorted(r.used - r.bound, key=str):  # sizes no input dimension carries: a (size, 0) stand-in
            inputs.append(te.placeholder((r.sizevar(sym), 0), dtype="bool", name=f"size_{sym}"))
            sources.append(("size", sym))
            grad_mask.append(False)
        # the same nodes as extern steps: run when the build fails, or when the kernel's call-time bounds
        # check refuses the sizes
        computed = [n for n in r.nodes if n not in kept]  # the views that run before it are not the kernel's
        eager = [self.extern_step(n) for n in computed]
        canonicalise(inputs, tensors)
        spec = (tensors, inputs, "tailjit_region")
        cut = tuple(k for k, n in enumerate(outs) if self.differentiable and n not in self.grad_nodes)
        self.steps.append(KernelStep(spec, computed, sources, tuple(grad_mask), out_slots, eager, after, cut=cut))

    def views_of_inputs(self, r: Region) -> set:
        """The region's view nodes whose value is a view of its inputs (through views only)."""
        found: set = set()
        for n in r.nodes:
            if n.op == "call_function" and n.target in VIEW_OPS:
                src = n.args[0]
                if isinstance(src, torch.fx.Node) and (src in found or src in r.by_node):
                    found.add(n)
        return found

    def build_regions(self):
        """Build every region of the graph, and the gradient of those a gradient flows through in a
        differentiable graph, in one C compile; a region whose build fails runs as extern calls."""
        regions = [s for s in self.steps if isinstance(s, KernelStep)]
        if not regions:
            return
        flowing = [r for r in regions if any(r.grad_mask)]
        # first: it adds the saved intermediates to r.spec; the gradients that are an output's gradient as
        # it is are no kernel's outputs
        gradients = [passed_through(*self.gradient_spec(r)) for r in flowing]
        specs = [r.spec for r in regions] + [spec for spec, _ in gradients if spec is not None]
        try:
            kernels = build_many(specs)
        except Exception:  # noqa: BLE001 - find the region that fails; the others still compile
            kernels = []
            for spec in specs:
                try:
                    kernels.append(build(*spec))
                except Exception as e:  # noqa: BLE001 - a build failure runs the region as extern calls
                    kernels.append(e)
        kernels, built_gradients = kernels[: len(regions)], iter(kernels[len(regions) :])
        position = {id(r): i for i, r in enumerate(regions)}
        built = []
        for r, (spec, through) in zip(flowing, gradients):
            g = next(built_gradients) if spec is not None else None
            k = kernels[position[id(r)]]
            if isinstance(k, Exception):  # the region runs as extern calls, which eager autograd records
                continue
            if isinstance(g, Exception):
                raise Unsupported(f"the gradient of the region of {r.nodes[0].name} does not build: {g}")
            k._grad_kernels[r.grad_mask] = Backward(g, through)  # what its first backward would build
            if g is not None:
                built.append((g, [n.name for n in r.nodes]))
        steps = []
        for s in self.steps:
            if not isinstance(s, KernelStep):
                steps.append(s)
                continue
            k = kernels[position[id(s)]]
            if isinstance(k, Exception):
                reason = f"region build failed: {type(k).__name__}: {k}"
                # a tailjit bug (C that does not compile, an internal error) or no C compiler: say so; a program
                # the compiler refuses (TEError, Unsupported) is what the fallback is for
                if not isinstance(k, (te.TEError, Unsupported)):
                    first = str(k).splitlines()[0] if str(k) else ""
                    what = f"{type(k).__name__}: {first}"
                    warnings.warn(f"tailjit: the region of {s.nodes[0].name} runs eagerly: {what}", stacklevel=2)
                for n in s.nodes:
                    if n.op == "call_function" and n.target is not operator.getitem:
                        self.report.fallbacks.append(Fallback(n.name, str(n.target), reason))
                steps += s.eager
                continue
            s.kernel = k
            k.mark_saved(s.n_saved)
            k.mark_cut(s.cut)
            self.report.kernels.append((k, [n.name for n in s.nodes]))
            steps.append(s)
        self.steps = steps
        self.report.kernels += built

    def gradient_spec(self, r: KernelStep) -> tuple:
        """The ``build`` spec of a region's gradient kernel (the program its first backward would build).
        The reductions it would recompute that the region's kernel computes into a buffer anyway become
        extra outputs of that kernel, which the backward reads: a softmax's gradient recomputed its row
        maximum and sum in three loops each.  (One that fusion computes in registers stays there: as an
        output it would cost the forward a pass of its own over the input.)"""
        outputs, inputs, name = r.spec
        try:
            spec, saved = gradient_spec(outputs, inputs, name, r.grad_mask, save_buffered=True)
        except te.TEError as e:
            raise Unsupported(f"no expression gradient for the region of {r.nodes[0].name}: {e}") from e
        r.spec, r.n_saved = (outputs + saved, inputs, name), len(saved)
        return spec, sum(t.dtype.is_float for t in outputs)


def canonicalise(inputs: list, outputs: list) -> None:
    """Name a region's tensors, index variables and sizes by position (``in0``, ``c0``, ``t3``,
    ``i1``, ``r0``, ``n2``): structurally equal regions (a Python loop's iterations, a re-trace for new
    sizes) then generate the same C and share one compiled entry.  ``explain`` lists the nodes."""
    for k, t in enumerate(inputs):
        t.name = f"in{k}"
    sizes: dict = {}
    reduce_axes: dict = {}
    tensors = reachable(outputs)
    for k, t in enumerate(t for t in tensors if t.is_constant):
        t.name = f"c{k}"
    computes = [t for t in tensors if not t.is_placeholder]
    for k, t in enumerate(computes):
        t.name = f"t{k}"
        for d, ax in enumerate(t.axes):
            ax.name = f"i{d}"
        for d, ax in enumerate(t.update.domain if t.update is not None else ()):
            ax.name = f"u{d}"
    for t in inputs + computes:
        for e in list(t.shape) + list(t.exprs()):
            for n in walk(e):
                if isinstance(n, SizeVar) and id(n) not in sizes:
                    sizes[id(n)] = n
                    n.name = f"n{len(sizes) - 1}"
                elif isinstance(n, Reduce):
                    for ax in n.axes:
                        if id(ax) not in reduce_axes:
                            reduce_axes[id(ax)] = ax
                            ax.name = f"r{len(reduce_axes) - 1}"
                elif isinstance(n, IterVar) and n.kind == "reduce" and id(n) not in reduce_axes:
                    reduce_axes[id(n)] = n
                    n.name = f"r{len(reduce_axes) - 1}"


#: Constant tensors of at most this many elements are compiled into the region's kernel.
SMALL_CONSTANT = 64


def output_aliases(gm: torch.fx.GraphModule) -> set:
    """View nodes through which a graph output shares memory with an input or another output.

    Kernels write fresh tensors, so these run as the ATen view ops they are,
    on the materialised base: the outputs then alias exactly as in eager
    PyTorch (AOTAutograd regenerates such outputs from their bases and relies
    on it)."""
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    outputs = []
    torch.fx.node.map_arg(out.args, outputs.append)

    shared: dict = {}
    for n in [p for p in gm.graph.nodes if p.op == "placeholder"] + list(dict.fromkeys(outputs)):
        st = node_storage(n)
        if st is not None:
            shared[st] = shared.get(st, 0) + 1
    forced: set = set()
    for o in outputs:
        st = node_storage(o)
        if o.op == "placeholder" or st is None or shared.get(st, 0) < 2:
            continue
        stack = [o]
        while stack:
            n = stack.pop()
            parents = [a for a in n.all_input_nodes if _lives_in(a, st)]
            if n.op == "call_function" and parents:  # a view of its parent (the storage's creator is not)
                forced.add(n)
                stack += [a for a in parents if a not in forced]
    return forced


def _lives_in(node, st) -> bool:
    """Whether ``node``'s value lives in storage ``st``: a tensor, or a list holding one (``split``'s views,
    which reach the output through ``getitem``)."""
    v = node.meta.get("val")
    return any(tensor_storage(t) == st for t in (v if isinstance(v, (list, tuple)) else [v]))


_aten = torch.ops.aten
#: ATen ops whose result is always a view of their input (never a copy).
VIEW_OPS = frozenset({
    _aten.view.default, _aten._unsafe_view.default, _aten.permute.default, _aten.transpose.int, _aten.t.default,
    _aten.expand.default, _aten.slice.Tensor, _aten.select.int, _aten.unsqueeze.default, _aten.squeeze.dim,
    _aten.squeeze.dims, _aten.squeeze.default, _aten.alias.default, _aten.detach.default, _aten.diagonal.default,
})  # fmt: skip


#: Ops a region of nothing else would only copy: views, and reading a number (``.item()``).
_NO_WORK = VIEW_OPS | {_aten._local_scalar_dense.default, operator.getitem}


def input_reads(gm: torch.fx.GraphModule) -> list:
    """The numbers read from views of the graph's inputs (``lengths[b].item()``), with those views, in graph
    order, where nothing writes into an input before them: they run first, so that the sizes they give are bound
    before any region and a loop over them does not cut the graph into a region per read (and, in training, an
    autograd node per region: ``reverse_padded_sequence``'s 16 reads made 33 backward nodes)."""
    found: list = []
    through: set = set()  # placeholders and views of them
    inputs = {node_storage(n) for n in gm.graph.nodes if n.op == "placeholder"}
    for n in gm.graph.nodes:
        size = n.meta.get("val")
        if n.op == "placeholder":
            through.add(n)
        elif n.op == "call_function" and mutates(n.target):
            values = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: a.meta.get("val"))
            written = written_storages(n.target, *values)
            if None in written or written & inputs:  # a write into an input: later reads see it
                break
        # an integer, or a number a speculative trace's assertions test (their chains' values are cleared); a
        # float read feeding a region is lowered as the element instead
        elif (
            n.target is _aten._local_scalar_dense.default
            and n.args[0] in through
            and (size is None or isinstance(size, torch.SymInt))
        ):
            chain, v = [n], n.args[0]
            while v.op != "placeholder" and v not in found:  # the views, back to the input
                chain.append(v)
                v = v.args[0]
            found += reversed(chain)
        elif n.op == "call_function" and n.target in VIEW_OPS and n.args[0] in through:
            if all(not isinstance(a, torch.fx.Node) for a in (*n.args[1:], *n.kwargs.values())):
                through.add(n)
    return found


#: Up to this many elements (or 16 per element read) an input read element by element is read whole.
ELEMENTS_READ_WHOLE = 64


def element_reads(reads: list) -> dict:
    """Of ``reads`` (``input_reads``), each ``.item()`` of one element of an input with static sizes through
    views with constant arguments: the input and the element's index in its flattened order.  The host reads
    such an input's elements once a call (``tolist()``: 0.35 us for 4 of them, against 3.9 us a read through
    a slice, a squeeze and an ``item()``: ``docs/scripts/host_call_costs.py``), where it is small or most of it
    is read."""
    found, per_input = {}, {}
    for n in reads:
        if n.target is not _aten._local_scalar_dense.default:
            continue
        chain, v = [], n.args[0]
        while v.op != "placeholder":
            chain.append(v)
            v = v.args[0]
        shape = tuple(v.meta["val"].shape)
        if not all(type(d) is int for d in shape):
            continue
        # the views applied to the positions of the input's elements give the position read
        positions = torch.arange(math.prod(shape)).view(shape)
        for c in reversed(chain):
            positions = c.target(positions, *c.args[1:], **c.kwargs)
        found[n] = (v, int(positions.reshape(-1)[0]))
        per_input[v] = per_input.get(v, 0) + 1
    return {
        n: (p, k) for n, (p, k) in found.items() if p.meta["val"].numel() <= max(ELEMENTS_READ_WHOLE, 16 * per_input[p])
    }


def views_only_for(elements: dict, reads: list) -> set:
    """The views among ``reads`` that nothing but the element reads of ``elements`` (and such views) uses."""
    unused = set(elements)
    for n in reversed(reads):
        if n.target in VIEW_OPS and all(u in unused for u in n.users):
            unused.add(n)
    return unused - set(elements)


def _elements(t: torch.Tensor) -> list:
    """``t``'s elements as Python numbers, in its flattened order."""
    return t.tolist() if t.dim() == 1 else t.reshape(-1).tolist()


def slice_length(node, known: set) -> tuple | None:
    """``(symbol, (size, start, end, step))`` for a slice whose length is a size of its own (bounds read from
    data give an unbacked one) that follows from sizes in ``known``, or None."""
    x, out = node.args[0].meta.get("val"), node.meta.get("val")
    dim, start, end, step = padded(node.args[1:], (0, 0, sys.maxsize, 1))
    if not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor) or type(dim) is not int:
        return None
    length = _sym(out.shape[dim])
    if not isinstance(length, sympy.Symbol) or length in known or type(step) is not int or step < 1:
        return None
    try:
        bounds = tuple(_sym(b.meta.get("val") if isinstance(b, torch.fx.Node) else b) for b in (start, end))
    except (Unsupported, TypeError, ValueError):
        return None
    size = _sym(x.shape[dim])
    if not all(e.free_symbols <= known for e in (size, *bounds)):
        return None
    return length, (size, *bounds, sympy.Integer(step))


def views_for_externs(gm: torch.fx.GraphModule) -> set:
    """View nodes whose every use is an op with no lowering (a matrix product, a custom op), another such
    view, or the graph's output: they run as the ATen views they are, where a region would copy them
    into a fresh tensor (a backward graph's transposes of weights and gradients for ``mm``)."""
    found: set = set()
    for n in reversed(gm.graph.nodes):
        if n.op != "call_function" or n.target not in VIEW_OPS or not n.users:
            continue
        if all(
            u.op == "output" or u in found or (u.op == "call_function" and u.target not in LOWERINGS) for u in n.users
        ):
            found.add(n)
    return found


def far_values(gm: torch.fx.GraphModule) -> set:
    """Nodes whose float values may lie far from zero because a constant of the graph put them there (a
    ``-inf`` fill, a ``-1e9`` padding, a constant tensor holding one), directly or through any op.  A kernel
    reading one of them as an input then guards its ``exp`` as it would for such a constant of its own
    (``te.analysis.FarValues``): ``top_k_top_p_filter``'s softmax over logits sorted by an extern call, after
    an earlier kernel set all but 50 per row to ``-inf``."""
    far: set = set()
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            v = getattr(gm, n.target)
            if isinstance(v, torch.Tensor) and not isinstance(v, FakeTensor) and v.is_floating_point():
                with unset_fake_temporarily():  # AOTAutograd compiles under its fake mode
                    if bool((v.detach().abs() >= FAR).any()):
                        far.add(n)
        elif n.op == "call_function" and is_float(n.meta.get("val")):
            args = torch.utils._pytree.tree_leaves((n.args, n.kwargs))
            if any(a in far if isinstance(a, torch.fx.Node) else _far_scalar(a) for a in args):
                far.add(n)
    return far


def _far_scalar(a) -> bool:
    # floats only: an int argument is a size, a dim or a slice's end (2**63 - 1), not a value
    return type(a) is float and abs(a) >= FAR


def _sym(s):
    return sym_expr(s) if isinstance(s, torch.SymInt) else sympy.Integer(int(s))
