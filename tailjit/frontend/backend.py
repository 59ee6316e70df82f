"""The ``tailjit`` Dynamo backend (inference).

``tailjit_backend(gm, example_inputs)`` traces Dynamo's graph to ATen with
``make_fx`` inside Dynamo's own fake mode (so symbolic sizes stay symbolic and
any guard the decompositions add lands in Dynamo's shape environment), then
walks the ATen graph in order: every node with a lowering joins the open
*region* of tensor expressions; a node without one (or whose lowering refuses
its arguments) runs eagerly as its ATen op, closing the open region first when
it needs one of its values.  Each region is one ``tailjit.build``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import sympy
import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

import tailjit
from tailjit import te
from tailjit.frontend.lowering import NodeLowering, lower_node, te_dtype
from tailjit.frontend.symbolic import Unsupported, evaluator, sym_expr, to_te


@dataclass
class Fallback:
    node: str
    target: str
    reason: str

    def __str__(self):
        return f"{self.node} ({self.target}): {self.reason}"


@dataclass
class GraphReport:
    """What the backend did with one captured graph (see ``explain_graph``)."""

    captured: str
    aten: str = ""
    kernels: list = field(default_factory=list)  # (kernel, [node names])
    fallbacks: list = field(default_factory=list)
    eager_reason: str | None = None


#: Reports of every graph compiled by the backend in this process (newest last).
REPORTS: list[GraphReport] = []


def _decompositions():
    from torch._decomp import core_aten_decompositions

    return core_aten_decompositions()


def tailjit_backend(gm: torch.fx.GraphModule, example_inputs):
    report = GraphReport(captured=gm.code)
    REPORTS.append(report)
    del REPORTS[:-64]
    reason = _eager_reason(gm, example_inputs)
    if reason:
        report.eager_reason = reason
        return gm.forward
    fakes = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    fake_mode = next((f.fake_mode for f in fakes if isinstance(f, torch._subclasses.FakeTensor)), None)
    if fake_mode is None or len(fakes) != len(example_inputs):
        report.eager_reason = "no fake inputs from Dynamo"
        return gm.forward
    try:
        with fake_mode:
            aten_gm = make_fx(gm, decomposition_table=_decompositions())(*fakes)
    except Exception as e:  # noqa: BLE001 - any tracing failure leaves the graph to eager PyTorch
        report.eager_reason = f"tracing to ATen failed: {type(e).__name__}: {e}"
        return gm.forward
    report.aten = aten_gm.code
    if any(n.op == "call_function" and _mutates(n.target) for n in aten_gm.graph.nodes):
        report.eager_reason = "the graph mutates a tensor in place (functionalisation is a later slice)"
        return aten_gm.forward
    return Planner(aten_gm, report).plan()


def _eager_reason(gm, example_inputs) -> str | None:
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
        return "an input requires grad and grad mode is on (training is a later slice)"
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type != "cpu":
            return f"input on {x.device} (tailjit compiles for the CPU)"
    return None


def _mutates(target) -> bool:
    schema = getattr(target, "_schema", None)
    return bool(schema is not None and schema.is_mutable)


# The plan ------------------------------------------------------------------


class _Ref:
    __slots__ = ("slot",)

    def __init__(self, slot):
        self.slot = slot


class _SymRef:
    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn


class Region:
    def __init__(self, index: int):
        self.index = index
        self.inputs: list = []  # ("node", fx node) or ("sym", symbol)
        self.placeholders: list[te.Tensor] = []
        self.by_node: dict = {}  # fx node -> te placeholder
        self.values: dict = {}  # fx node -> te tensor or tuple
        self.nodes: list = []
        self.bound: set = set()
        self.used: set = set()

    def snapshot(self):
        return (list(self.inputs), list(self.placeholders), dict(self.by_node), set(self.bound), set(self.used))

    def restore(self, snap):
        self.inputs, self.placeholders, self.by_node, self.bound, self.used = snap


class Planner:
    def __init__(self, gm: torch.fx.GraphModule, report: GraphReport):
        self.gm = gm
        self.report = report
        self.steps: list = []
        self.slots: dict = {}  # fx node -> slot index of its runtime value
        self.nslots = 0
        self.syms: dict = {}  # sympy symbol -> te.SizeVar
        self.input_syms: dict = {}  # symbol -> (input position, dim or None)
        self.region: Region | None = None
        self.done: set = set()  # getitem nodes lowered with their tuple-valued producer
        self.nregions = 0
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for pos, n in enumerate(self.placeholders):
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor):
                for d, s in enumerate(v.shape):
                    e = sym_expr(s)
                    if isinstance(e, sympy.Symbol):
                        self.input_syms.setdefault(e, (pos, d))
            elif isinstance(v, torch.SymInt):
                e = sym_expr(v)
                if isinstance(e, sympy.Symbol):
                    self.input_syms.setdefault(e, (pos, None))

    # slots
    def slot(self, node) -> int:
        if node not in self.slots:
            self.slots[node] = self.nslots
            self.nslots += 1
        return self.slots[node]

    def is_pure_sym(self, node) -> bool:
        v = node.meta.get("val")
        if not isinstance(v, torch.SymInt) or node.op == "placeholder":
            return False
        try:
            return sym_expr(v).free_symbols <= set(self.input_syms)
        except Unsupported:
            return False

    def plan(self):
        for n in self.placeholders:
            self.slot(n)
        for node in self.gm.graph.nodes:
            if node.op == "placeholder" or node in self.done:
                continue
            if node.op == "output":
                self.close()
                self.output = self.template(node.args[0])
                break
            if node.op == "get_attr":
                self.steps.append(("const", getattr(self.gm, node.target), self.slot(node)))
                continue
            if self.is_pure_sym(node):
                continue
            if node.op == "call_function" and self.try_lower(node):
                continue
            self.eager(node)
        return CompiledGraph(self)

    def try_lower(self, node) -> bool:
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
        L = NodeLowering(node, lambda e: self.size_leaf(e))
        try:
            args = torch.fx.node.map_arg(node.args, lambda a: a)
            args = self.convert(args, L)
            kwargs = self.convert(dict(node.kwargs), L)
            vals = node.meta.get("val")
            for v in vals if isinstance(vals, (tuple, list)) else [vals]:
                if not isinstance(v, torch.Tensor):
                    raise Unsupported("output is not a tensor")
                te_dtype(v.dtype)
            out = lower_node(L, args, kwargs)
        except (Unsupported, te.TEError, TypeError) as e:
            r.restore(snap)
            self.fallback_reason = f"{type(e).__name__}: {e}" if not isinstance(e, Unsupported) else str(e)
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

    def size_leaf(self, sym):
        r = self.region
        if sym not in r.bound:
            if sym not in self.input_syms:
                raise Unsupported(f"size {sym} is not bound by any input of the region")
        r.used.add(sym)
        return self.sizevar(sym)

    def sizevar(self, sym):
        if sym not in self.syms:
            self.syms[sym] = te.var(str(sym))
        return self.syms[sym]

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
        if v.device.type != "cpu":
            raise Unsupported(f"tensor on {v.device}")
        dt = te_dtype(v.dtype)
        shape = []
        for s in v.shape:
            e = sym_expr(s)
            if isinstance(e, sympy.Symbol):
                r.bound.add(e)
        for s in v.shape:
            e = sym_expr(s)
            if isinstance(e, sympy.Integer):
                shape.append(int(e))
            else:
                shape.append(to_te(e, lambda sym: self.size_leaf(sym)))
        p = te.placeholder(shape, dtype=dt, name=a.name)
        r.inputs.append(("node", a))
        r.placeholders.append(p)
        r.by_node[a] = p
        return p

    def eager(self, node):
        reason = getattr(self, "fallback_reason", None) or "not lowered"
        self.fallback_reason = None
        if node.op == "call_function" and node.target is not operator.getitem:
            self.report.fallbacks.append(Fallback(node.name, str(node.target), reason))
        elif node.op != "call_function":
            self.report.fallbacks.append(Fallback(node.name, node.op, "not a function call"))
        if self.region is not None:
            needed = []
            torch.fx.node.map_arg((node.args, node.kwargs), needed.append)
            if any(n in self.region.values for n in needed):
                self.close()
        self.steps.append(("eager", node.target, self.template(node.args), self.template(node.kwargs), self.slot(node)))

    def template(self, a):
        if isinstance(a, (list, tuple)):
            return type(a)(self.template(x) for x in a)
        if isinstance(a, dict):
            return {k: self.template(v) for k, v in a.items()}
        if isinstance(a, torch.fx.Node):
            if a in self.slots:
                return _Ref(self.slots[a])
            if self.is_pure_sym(a):
                return _SymRef(evaluator(sym_expr(a.meta["val"])))
            raise AssertionError(f"{a.name} has no runtime value")  # pragma: no cover
        return a

    def close(self):
        r, self.region = self.region, None
        if r is None or not r.nodes:
            return
        members = set(r.nodes)
        outs = [n for n in r.nodes if isinstance(r.values[n], te.Tensor) and any(u not in members for u in n.users)]
        if not outs:
            return
        tensors, seen = [], {}
        for n in outs:
            t = r.values[n]
            if t.is_placeholder or id(t) in seen:  # an output must be a compute of its own
                t = te.compute(t.shape, lambda *i, t=t: t[i], name=f"{n.name}_out")
            seen[id(t)] = True
            tensors.append(t)
        inputs = list(r.placeholders)
        sources = [_Ref(self.slots[n]) for kind, n in r.inputs]
        for sym in sorted(r.used - r.bound, key=str):  # sizes no input dimension carries: a (size, 0) stand-in
            inputs.append(te.placeholder((self.sizevar(sym), 0), dtype="bool", name=f"size_{sym}"))
            sources.append(("size", evaluator(sym)))
        try:
            kernel = tailjit.build(tensors, inputs, name=f"tailjit_region{r.index}")
        except Exception as e:  # a build failure falls back to eager for the whole region
            for n in r.nodes:
                self.fallback_reason = f"region build failed: {type(e).__name__}: {e}"
                self.eager_only(n)
            return
        self.report.kernels.append((kernel, [n.name for n in r.nodes]))
        out_slots = [self.slot(n) for n in outs]
        # the same nodes as eager steps, run if the kernel's call-time bounds check refuses the sizes
        eager_steps, saved = [], self.steps
        self.steps = eager_steps
        for n in r.nodes:
            self.slot(n)
            self.steps.append(("eager", n.target, self.template(n.args), self.template(n.kwargs), self.slot(n)))
        self.steps = saved
        self.steps.append(("kernel", kernel, sources, out_slots, eager_steps, self.report))

    def eager_only(self, node):
        if node.target is not operator.getitem:
            self.report.fallbacks.append(Fallback(node.name, str(node.target), self.fallback_reason))
        self.steps.append(("eager", node.target, self.template(node.args), self.template(node.kwargs), self.slot(node)))


class CompiledGraph:
    """Runs the plan: eager steps and compiled regions in graph order."""

    def __init__(self, p: Planner):
        self.steps = p.steps
        self.nslots = p.nslots
        self.output = p.output
        self.input_syms = dict(p.input_syms)

    def __call__(self, *args):
        env = [None] * self.nslots
        env[: len(args)] = args
        syms = None
        if self.input_syms:
            syms = {}
            for sym, (pos, d) in self.input_syms.items():
                syms[sym] = int(args[pos]) if d is None else args[pos].shape[d]
        self.run_steps(self.steps, env, syms)
        return _fill(self.output, env, syms)

    def run_steps(self, steps, env, syms):
        for step in steps:
            kind = step[0]
            if kind == "kernel":
                ins = [
                    env[s.slot] if isinstance(s, _Ref) else torch.empty((s[1](syms), 0), dtype=torch.bool)
                    for s in step[2]
                ]
                try:
                    res = step[1](*ins)
                except (IndexError, ZeroDivisionError) as e:  # a conservative size check: run the region eagerly
                    if "for these input sizes" not in str(e):
                        # bad data (an index out of range, integer division by zero): eager raises PyTorch's error
                        self.run_steps(step[4], env, syms)
                        raise
                    _note_runtime_fallback(step, e)
                    self.run_steps(step[4], env, syms)
                    continue
                outs = step[3]
                if len(outs) == 1:
                    env[outs[0]] = res
                else:
                    for s, v in zip(outs, res):
                        env[s] = v
            elif kind == "eager":
                env[step[4]] = step[1](*_fill(step[2], env, syms), **_fill(step[3], env, syms))
            else:
                env[step[2]] = step[1]


def _note_runtime_fallback(step, err):
    report, name = step[5], step[1].name
    if not any(f.node == name for f in report.fallbacks):
        report.fallbacks.append(Fallback(name, "region", f"ran eagerly at call time: {err}"))


def _fill(t, env, syms):
    if isinstance(t, _Ref):
        return env[t.slot]
    if isinstance(t, _SymRef):
        return t.fn(syms)
    if isinstance(t, (list, tuple)):
        return type(t)(_fill(x, env, syms) for x in t)
    if isinstance(t, dict):
        return {k: _fill(v, env, syms) for k, v in t.items()}
    return t
