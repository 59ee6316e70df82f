"""Training graphs differentiated by tailjit's own gradient rules, without AOTAutograd.

``tailjit.jit`` and the Dynamo backend trace a training call like an inference
one (``make_fx``, the forward ops only) and compile it with
``compile_graph(gm, report, requires_grad)``: each region's kernel then runs
under autograd with the backward derived from its tensor expressions
(:func:`tailjit.te.gradient`, built in the same C compile as the forward), and
extern calls go through the dispatcher, whose autograd records them as in
eager.  That skips AOTAutograd's joint trace, partition and wrappers, most of
a training graph's compile time.

A forward-only trace cannot see what autograd would have done differently, so
this route is taken only when nothing can differ from eager:

* the function switched nothing off for autograd while it was traced
  (``.data``, ``requires_grad_``, ``detach_()``, a custom
  ``autograd.Function``, whose forward runs with grad mode off and whose
  backward is its own): the trace records these as plain ops or not at all,
  so :class:`GradProbe` watches the trace for them.  ``detach()`` and the
  ops of a ``torch.no_grad()`` block are the exceptions: the probe follows
  each with :data:`STOP_GRADIENT`, a copy that marks the cut in the trace
  and lowers to :func:`tailjit.te.stop_gradient`, unless something writes in
  place to the memory a detached value shares, or the block makes a view
  or writes in place;
* it does not write to its inputs;
* it calls no ``@tailjit.op`` operator: AOTAutograd's forward and backward
  graphs call such an operator's functions directly, where a differentiable
  graph would go through the dispatcher's autograd (23 us against 11 us for
  an LLTM cell);
* every float-valued op that autograd would see and tailjit lowers (itself
  or its decomposition) is in :data:`FAITHFUL`: the gradient of its tensor
  expressions equals eager autograd's formula, at ties and at NaN and inf too,
  as the gradient sweep of ``tests/frontend/test_ops.py`` checks op by op.
  An op left out (``hardswish``, whose gradient differs at -0.0) keeps the
  graph on the AOTAutograd route.  Ops tailjit does not lower run as extern
  calls, whose autograd is eager's.

Anything else (and a region whose gradient program cannot be derived) takes
AOTAutograd, as before.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from tailjit.frontend.host.function import compile_graph
from tailjit.frontend.lower.decompositions import decompositions
from tailjit.frontend.lower.lowering import FAITHFUL, LOWERINGS
from tailjit.frontend.lower.reduce import conv_refusal
from tailjit.frontend.lower.stop_gradient import STOP_GRADIENT
from tailjit.frontend.lower.symbolic import Unsupported
from tailjit.frontend.lower.values import is_float, mutates, node_storage, tensor_storage, written_storages
from tailjit.frontend.trace.speculate import insert_asserts
from tailjit.op import DIRECT

aten = torch.ops.aten

#: Functions that cut a value off from autograd.  Only a function mode tells them apart: ``.data`` runs no
#: op, and autograd itself runs ``aten.detach`` below when it saves a value for the backward.
_CUTS = {torch.Tensor.detach_: "detach_()", torch.Tensor.data.__get__: "Tensor.data",
         torch.Tensor.data.__set__: "Tensor.data", torch.Tensor.requires_grad_: "requires_grad_()"}  # fmt: skip
#: The cuts a trace can mark (``STOP_GRADIENT``).
_DETACHES = frozenset({torch.Tensor.detach, torch.detach})


class GradProbe:
    """Watches a trace for what a forward-only graph loses.

    Below autograd (a dispatch mode, entered inside the trace and so above its
    decompositions) it sees the ops eager autograd would differentiate, with
    the grad mode they ran under; above it (a function mode), the tensor
    methods that leave no op behind.  ``reason`` is the first thing that
    rules tailjit's own gradients out."""

    def __init__(self):
        self.reason: str | None = None
        self.ops: set = set()  # the float-valued ops autograd would see
        self.detached: set = set()  # the storages detach() shares with autograd's values, and its copies'
        self.made: dict = {}  # op (as in ops) -> the storages of the float values it made
        self.user_off = False  # grad mode is off because the traced code turned it off (torch.no_grad)
        self._modes = (_FunctionProbe(self), _DispatchProbe(self))

    def __enter__(self):
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc):
        for m in reversed(self._modes):
            m.__exit__(*exc)

    def note(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    def around(self, fn):
        """``fn`` run inside the probe: trace this, so that the probe sits above the tracer's
        decompositions and sees the ops autograd sees."""

        def probed(*args):
            with self:
                out = fn(*args)
            _note_custom_functions(self, out)
            return out

        return probed


class _FunctionProbe(TorchFunctionMode):
    def __init__(self, probe: GradProbe):
        super().__init__()
        self.probe = probe

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _CUTS:
            self.probe.note(f"{_CUTS[func]} cuts a value off from autograd")
        if func is torch._C._set_grad_enabled:  # torch.no_grad(), set_grad_enabled, enable_grad
            # (a custom autograd.Function turns it off below Python, unseen: its ops are refused)
            if args[0] or torch.is_grad_enabled():
                self.probe.user_off = not args[0]
        _note_custom_functions(self.probe, (args, kwargs))
        out = func(*args, **(kwargs or {}))
        if func in _DETACHES and _any_requires_grad(args):
            marked = STOP_GRADIENT(out)  # a copy: its writes must not reach the value autograd sees
            self.probe.detached |= {tensor_storage(out), tensor_storage(marked)}
            return marked
        return out


class _DispatchProbe(TorchDispatchMode):
    def __init__(self, probe: GradProbe):
        super().__init__()
        self.probe = probe

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        writes = written_storages(func, args, kwargs)
        if writes & self.probe.detached:
            self.probe.note(f"{func} writes in place to memory a detach()ed value shares")
        out = func(*args, **(kwargs or {}))
        # an op none of whose inputs requires grad is no part of eager's backward (a constant table)
        if is_float(out) and func is not aten.detach.default and _any_requires_grad((args, kwargs)):
            if not torch.is_grad_enabled():
                if self.probe.user_off and not writes and not _is_view(func):
                    # a value computed under torch.no_grad(): cut off as by a detach()
                    return torch.utils._pytree.tree_map(lambda o: STOP_GRADIENT(o) if is_float(o) else o, out)
                self.probe.note(f"{func} runs with grad mode off (a custom autograd.Function, or a view or an "
                                "in-place write under torch.no_grad)")  # fmt: skip
            op = _refine(func, args, kwargs or {})
            self.probe.ops.add(op)
            made = self.probe.made.setdefault(op, set())
            made.update(tensor_storage(o) for o in torch.utils._pytree.tree_leaves(out) if is_float(o))
        return out


def _note_custom_functions(probe: GradProbe, tree) -> None:
    """Note a value made by a custom ``autograd.Function`` among ``tree``'s tensors: its backward is its
    own, which a trace of its forward cannot see."""
    for a in torch.utils._pytree.tree_leaves(tree):
        if isinstance(a, torch.Tensor) and isinstance(a.grad_fn, torch.autograd.function.BackwardCFunction):
            probe.note(f"a custom autograd.Function ({type(a.grad_fn).__name__}) has a backward of its own")


def _is_view(func) -> bool:
    schema = getattr(func, "_schema", None)
    return schema is not None and any(r.alias_info is not None for r in schema.returns)


def _any_requires_grad(tree) -> bool:
    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in torch.utils._pytree.tree_leaves(tree))


def _refine(func, args, kwargs):
    """The op, or a description of the call when tailjit's gradient is torch's for other arguments only
    (and so not in FAITHFUL): ``x ** -2`` is lowered as ``1 / (x * x)``, which rounds as eager's kernel
    does but differentiates differently at 0 and inf."""
    if func is aten.pow.Tensor_Scalar and args[1] in (-0.5, -2):
        return f"{func} with exponent {args[1]}"
    if func is aten.linalg_vector_norm.default:
        # eager's gradient of other orders, x * |x|^(p-2) / norm^(p-1), overflows elsewhere than autodiff's
        order = args[1] if len(args) > 1 else kwargs.get("ord", 2)
        if order not in (1, 2):
            return f"{func} of order {order}"
    if func is aten.scatter_reduce.two and args[4] not in ("sum", "mean"):  # te.gradient differentiates sums only
        return f"{func} with reduce={args[4]!r}"
    return _functional(func)


def _functional(func):
    """The out-of-place form of an in-place op (``sub_`` -> ``sub``), whose derivative it shares."""
    schema = getattr(func, "_schema", None)
    if schema is None or not schema.is_mutable or not schema.name.startswith("aten::"):
        return func
    name = schema.name[len("aten::") :]
    if not name.endswith("_") or name.startswith("_"):
        return func
    base = getattr(aten, name[:-1], None)
    return getattr(base, func._overloadname, func) if base is not None else func


def refusal(probe: GradProbe, gm: torch.fx.GraphModule) -> str | None:
    """Why a training trace ``gm`` watched by ``probe`` must go through AOTAutograd, or None when tailjit's
    gradients equal eager's."""
    if probe.reason:
        return probe.reason
    ops = sorted(str(op) for op in probe.ops if op in DIRECT)
    if ops:  # measured: 23 us per LLTM cell through the dispatcher's autograd, 11 us called directly
        return f"it calls the tailjit operator {ops[0]}, whose functions AOTAutograd's graphs call directly"
    # an op whose values reach the outputs only through a detach() is never differentiated (the row
    # maximum a softmax subtracts, taken by max.dim)
    live = _live_storages(gm)
    ops = {op for op in probe.ops if probe.made.get(op, set()) & live}
    if aten.convolution.default in ops and not _lowered_convolutions(gm):
        ops.discard(aten.convolution.default)  # each an extern call, which eager's autograd differentiates
    unchecked = unchecked_ops(ops)
    if unchecked:
        return f"the expression gradient of {', '.join(unchecked)} is not checked against eager's"
    return None


def _lowered_convolutions(gm: torch.fx.GraphModule) -> bool:
    """Whether one of ``gm``'s convolutions is of a size tailjit lowers (ShiftNet's over 32 channels are not:
    their gradients are eager's, and need not send the graph to AOTAutograd)."""
    for n in gm.graph.find_nodes(op="call_function", target=aten.convolution.default):
        window = n.args[1].meta["val"].shape[1:] if isinstance(n.args[1], torch.fx.Node) else None
        if window is None or not all(isinstance(d, int) for d in window) or conv_refusal(list(window)) is None:
            return True
    return False


def _live_storages(gm: torch.fx.GraphModule) -> set:
    """The storages of the values the gradient of ``gm``'s outputs flows back through: from the outputs,
    through float values, up to each ``detach()`` (:data:`STOP_GRADIENT`), and into the in-place ops that
    write those storages (the graph is not functionalised: ``table[:, ::2] = v`` reaches the outputs
    through ``table``'s memory, not through an edge)."""
    writers: dict = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and mutates(n.target):
            writers.setdefault(node_storage(n), []).append(n)
    seen, live = set(), set()
    stack = list(gm.graph.find_nodes(op="output")[0].all_input_nodes)
    while stack:
        n = stack.pop()
        if n in seen or n.target is STOP_GRADIENT or not is_float(n.meta.get("val")):
            continue
        seen.add(n)
        stack += n.all_input_nodes
        st = node_storage(n)
        if st is not None and st not in live:
            live.add(st)
            stack += writers.get(st, [])
    return live


#: How a report's note says the graph was differentiated by tailjit.
ROUTE = "differentiated by its tensor expressions"


def compile_training(gm: torch.fx.GraphModule, probe: GradProbe, requires_grad: list, make_report):
    """``(host function, None)`` for a training graph traced under ``probe``, differentiated by tailjit
    and described by ``make_report()``; ``(None, reason)`` when it must take AOTAutograd instead.

    ``gm`` is traced without functionalisation, which decomposes some ops (binary_cross_entropy_with_logits)
    that autograd differentiates whole, so the probe saw the ops autograd sees; it is functionalised here."""
    why = refusal(probe, gm)
    if why is not None:
        return None, why
    functional = functionalised(gm)
    if functional is not gm and any(n.target is aten._assert_scalar.default for n in gm.graph.nodes):
        # the retrace folded a speculative trace's assertions on sizes to constants: assert again
        insert_asserts(functional)
    gm = functional
    placeholders = {n for n in gm.graph.nodes if n.op == "placeholder"}
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is aten.copy_.default and n.args[0] in placeholders:
            return None, f"{n.name} writes to the input {n.args[0].name}"
    report = make_report()
    report.note += f", {ROUTE}"
    try:
        return compile_graph(gm, report, requires_grad), None
    except Unsupported as e:  # a region without an expression gradient: nothing was built
        report.note += f"; abandoned for AOTAutograd: {e}"
        return None, str(e)


def functionalised(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` with in-place ops made values and writes to its inputs trailing ``copy_`` calls, retraced in
    the fake mode of its own inputs (so a symbolic trace keeps its shape environment and guards)."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx.experimental.proxy_tensor import make_fx

    if not any(n.op == "call_function" and mutates(n.target) for n in gm.graph.nodes):
        return gm
    if _values_for_updates(gm):
        return gm
    fakes = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    mode = next(f.fake_mode for f in fakes if isinstance(f, FakeTensor))  # not the ambient one (Dynamo's)
    with mode:
        return make_fx(torch.func.functionalize(gm, remove="mutations"))(*fakes)


def _values_for_updates(gm: torch.fx.GraphModule) -> bool:
    """Rewrite each in-place op of ``gm`` as its out-of-place form when nothing else shares the memory it
    writes (``deltas.sub_(means).div_(stds)`` on a fresh ``deltas``): later readers of the old tensor read
    the new value instead.  True when every in-place op was rewritten; False, with ``gm`` untouched, when one
    writes an input or memory that a view shares, or its out-of-place form gives another dtype or shape.
    Functionalising by a second trace costs about 60 ms for a 40-node graph."""
    g = gm.graph
    sharing: dict = {}  # storage -> the nodes whose values live in it
    for n in g.nodes:
        st = node_storage(n)
        if st is not None:
            sharing.setdefault(st, []).append(n)
    plans = []
    for n in g.nodes:
        if n.op != "call_function" or not mutates(n.target):
            continue
        functional = _functional(n.target)
        written = [a for a in n.target._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        if functional is n.target or len(written) != 1 or written[0].name != "self" or not n.args:
            return False
        root = n.args[0]
        while isinstance(root, torch.fx.Node) and root.op == "call_function" and mutates(root.target):
            root = root.args[0]  # an earlier update of the same tensor
        if not isinstance(root, torch.fx.Node) or root.op != "call_function" or node_storage(n) is None:
            return False  # an input (a trailing copy_ writes it back)
        if any(m is not root and not (m.op == "call_function" and mutates(m.target)) for m in sharing[node_storage(n)]):
            return False  # a view of the written memory would see the write
        vals = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: a.meta["val"])
        value = functional(*vals[0], **vals[1])
        old = root.meta["val"]
        if not isinstance(value, torch.Tensor) or value.dtype != old.dtype or value.shape != old.shape:
            return False
        plans.append((n, functional, value))
    order = {n: float(i) for i, n in enumerate(g.nodes)}
    for n, functional, value in plans:
        base = n.args[0]  # the tensor's value before this update (an earlier rewrite's node, by now)
        with g.inserting_before(n):
            new = g.call_function(functional, n.args, n.kwargs)
        new.meta = {**n.meta, "val": value}
        order[new] = order[n] - 0.5
        for u in [u for u in base.users if order[u] > order[n]]:  # readers after the update read the new value
            u.replace_input_with(base, new)
        n.replace_all_uses_with(new)
        g.erase_node(n)
    gm.recompile()
    return True


def unchecked_ops(ops) -> list[str]:
    """The ops (or refined calls) among ``ops`` that tailjit would differentiate but that are not in
    :data:`FAITHFUL`."""
    return sorted(str(op) for op in ops if op not in FAITHFUL and _differentiated_by_tailjit(op))


def _differentiated_by_tailjit(op) -> bool:
    """Whether tailjit lowers ``op`` (or what it decomposes into); an op it does not runs as an extern
    call through the dispatcher, whose autograd is eager's."""
    return not isinstance(op, torch._ops.OpOverload) or op in LOWERINGS or op in decompositions()


def _overloads(names: str) -> frozenset:
    return frozenset(getattr(getattr(aten, n.split(".")[0]), n.split(".")[1]) for n in names.split())


#: The faithful ops without a lowering of their own: the frontend decomposes them (``backend.decompositions()``)
#: and the gradient of what they decompose into is faithful.  Decomposed ops left out, because some entry does
#: not match: celu, hardswish, xlogy, std_mean, and the refined calls of ``_refine``.  (A scatter that multiplies
#: or takes extremes, ``scatter_reduce`` with ``prod``/``amax``/``amin``, has no expression gradient: its region
#: takes AOTAutograd.)  Creation ops (``zeros``, ``lift_fresh`` of a constant, ``fill``) have no input that
#: requires grad: never asked about.
DECOMPOSED_FAITHFUL = _overloads("""
    addcdiv.default addcmul.default binary_cross_entropy_with_logits.default deg2rad.default diagonal_copy.default
    dot.default empty_like.default frac.default hardshrink.default hardsigmoid.default lerp.Scalar
    log_sigmoid_forward.default logit.default logsumexp.default masked_fill.Scalar masked_fill.Tensor mish.default
    mv.default new_zeros.default nll_loss_forward.default ones_like.default roll.default rot90.default rsub.Scalar
    silu.default stack.default threshold.default tril.default triu.default unbind.int vdot.default
    zeros_like.default
""")

FAITHFUL.update(DECOMPOSED_FAITHFUL)  # (``lowering.FAITHFUL``: the lowerings declared faithful at registration)
