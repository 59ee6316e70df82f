"""A training graph as one autograd node.

A graph compiled for training with tailjit's own gradients (``expr_grad.py``)
runs each region's kernel as an ``autograd.Function`` and each extern call
through the dispatcher's autograd: one autograd node per step.  For a graph of
many small steps (an RNN unrolled over its time steps: a cell kernel and a few
matrix products per step) those nodes cost more than the work they do: about
20 us forward and 25 us backward of Python per kernel node against a few us
of kernel, in a ``torch.profiler`` run of SCRNN's training step.

Here the whole graph becomes one ``autograd.Function``.  Its forward is the
host function's steps run without autograd, keeping what the backward reads;
its backward is generated straight-line code that walks the steps in reverse:

* a region calls the gradient kernel built with its forward kernel (the one
  ``Kernel.backward`` would call), with zeros for outputs that got no gradient;
* an extern call runs its vector-Jacobian product: PyTorch's own derivative
  formula, traced once per op and argument layout with ``make_fx`` over
  ``torch.autograd.grad``, its forward value read from the saved output rather
  than recomputed;
* gradients of values read more than once are summed.

The graph takes this route when it is worth one: at least two steps carry a
gradient, one of them a region (extern calls alone keep eager's nodes, whose
second derivatives ``create_graph=True`` can take; a region's gradient kernel
has none, in both routes). It keeps the per-step route when its shapes are
symbolic or read from data (the traced products would need their sizes), when
an output is a view or not a tensor (``autograd.Function`` outputs would
change eager's view semantics), or when an extern's product cannot be traced.
A call whose kernel refuses its sizes or whose data is bad runs the per-step
host function, which handles both as it always has.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import re

import torch
import torch.fx
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils import _pytree as pytree

from tailjit.frontend.host.code import DIFFERENTIABLE, HostCode, stand_in
from tailjit.frontend.plan.steps import ExternStep, KernelStep, Ref, SymRef
from tailjit.op import DIRECT
from tailjit.runtime.kernel import _no_double_backward


def one_node(p, output, per_step):
    """The host function of the planned differentiable graph ``p`` as one autograd node, or None when it keeps
    the per-step route ``per_step`` (see the module docstring)."""
    plan = _plan(p, output)
    if plan is None:
        return None
    forward, backward, source = plan
    p.report.note += ", as one autograd node"
    p.report.host += "\n# as one autograd node:\n" + source
    fn = type(
        "TailjitGraphFunction",
        (torch.autograd.Function,),
        {"forward": staticmethod(forward), "backward": staticmethod(backward)},
    )
    args = ", ".join(f"v{i}" for i in range(len(p.placeholders)))
    # a random op's numbers are drawn again by the per-step route: from the same generator state
    draws = any(isinstance(s, ExternStep) and torch.Tag.nondeterministic_seeded in getattr(s.target, "tags", ())
                for s in p.steps)  # fmt: skip
    src = [
        f"def tailjit_graph({args}):",
        "    if refused:",  # a kernel refused these sizes once: the per-step route serves every later call
        f"        return per_step({args})",
        *(["    state = torch.get_rng_state()"] if draws else []),
        "    try:",
        f"        o = apply({args})",
        "    except (IndexError, ZeroDivisionError):",  # bad data (PyTorch's error raised again), or refused sizes
        *(["        torch.set_rng_state(state)"] if draws else []),
        f"        out = per_step({args})",
        "        refused.append(True)",
        "        return out",
        f"    return {_Outputs(output).value(output)}",
    ]
    apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, fn)
    namespace = {"apply": apply, "per_step": per_step, "refused": [], "torch": torch}
    exec(compile("\n".join(src) + "\n", f"<tailjit graph call {id(p):x}>", "exec"), namespace)  # noqa: S102
    return namespace["tailjit_graph"]


def _refs(output) -> list:
    return [x for x in pytree.tree_leaves(output, is_leaf=lambda x: isinstance(x, Ref)) if isinstance(x, Ref)]


class _Outputs(HostCode):
    """Python for the graph's output structure, its tensors read from the node's outputs ``o``."""

    def __init__(self, output):
        super().__init__({}, {}, {}, {})
        self.positions = {r.slot: k for k, r in enumerate(_refs(output))}

    def value(self, t) -> str:
        return f"o[{self.positions[t.slot]}]" if isinstance(t, Ref) else super().value(t)


def _plan(p, output):
    """``(forward, backward, source)`` of the one node, or None."""
    node_of = {slot: n for n, slot in p.slots.items() if isinstance(n, torch.fx.Node)}
    flowing = {slot for slot, n in node_of.items() if n in p.grad_nodes}
    placeholders = [p.slots[n] for n in p.placeholders]
    metas = [n.meta.get("val") for n in p.placeholders]
    if p.data_syms or p.slice_syms or not all(isinstance(v, torch.Tensor) for v in metas):
        return None
    if any(not isinstance(s, int) for v in metas for s in (*v.shape, *v.stride())):
        return None
    carrying = [s for s in p.steps if _carries(s, flowing)]
    # extern calls alone keep eager's autograd nodes, whose second derivatives a create_graph backward can take
    if len(carrying) < 2 or not any(isinstance(s, KernelStep) for s in carrying):
        return None
    leaves = pytree.tree_leaves(output, is_leaf=lambda x: isinstance(x, Ref))
    refs = [x for x in leaves if isinstance(x, Ref)]
    if any(not isinstance(x, (Ref, type(None))) for x in leaves) or not refs:
        return None
    out_slots = [r.slot for r in refs]
    if len(set(out_slots)) != len(out_slots) or set(out_slots) & set(placeholders):
        return None
    for slot in out_slots:
        v = node_of[slot].meta.get("val") if slot in node_of else None
        if not isinstance(v, torch.Tensor) or v._is_view():
            return None
    vjps, fw = {}, _ForwardCode(p)
    for s in carrying:
        if isinstance(s, ExternStep) and s.target is not operator.getitem:
            vjp = _vjp(s, node_of, flowing)
            if vjp is None:
                return None
            vjps[id(s)] = vjp
            if _reads_outputs(vjp):
                fw.training.add(id(s))
            value = node_of[s.slot].meta.get("val")
            if isinstance(value, (tuple, list)):  # the backward reads every element (sort's indices)
                fw.elements[s.slot] = [fw.fresh() for _ in value]
    body = fw.steps(p.steps)
    read = _Reads(fw)
    differentiable = [slot in flowing for slot in out_slots]
    read.assigned |= {s for s, d in zip(out_slots, differentiable) if d}
    blocks = _backward_blocks(p.steps, flowing, vjps, fw, read)
    # all through save_for_backward: autograd checks in-place writes before the backward, keeps them for a
    # retain_graph=True backward and frees them after the last one
    saved = ", ".join(f"v{s}" for s in sorted(read.slots))
    args = ", ".join(f"v{i}" for i in range(len(placeholders)))
    outs = ", ".join(f"v{s}" for s in out_slots)
    cut = [f"v{s}" for s, d in zip(out_slots, differentiable) if not d]
    src = [f"def forward(ctx, {args}):"] + fw.size_lines() + body
    src += [f"    ctx.save_for_backward({saved})"]
    src += ["    ctx.set_materialize_grads(False)"]
    if cut:
        src += [f"    ctx.mark_non_differentiable({', '.join(cut)})"]
    src += [f"    return ({outs},)", ""]
    src += ["def backward(ctx, *heads):"]
    src += [f"    {saved}, = ctx.saved_tensors"] if saved else []
    heads = {s: k for k, (s, d) in enumerate(zip(out_slots, differentiable)) if d}
    src += [f"    g{s} = heads[{heads[s]}]" if s in heads else f"    g{s} = None" for s in sorted(read.assigned)]
    src += [f"    o{s} = False" for s in sorted(read.assigned)] + ["    heads = None"]
    returned = {f"g{s}" for s in placeholders}
    src += _released(blocks, returned)
    grads = ", ".join(f"g{s}" if s in read.assigned else "None" for s in placeholders)
    src += [f"    return _grads(({grads},))"]
    source = "\n".join(src) + "\n"
    namespace = dict(read.globals)
    namespace["_grads"] = _checked
    exec(compile(source, f"<tailjit graph function {id(p):x}>", "exec"), namespace)  # noqa: S102
    return namespace["forward"], namespace["backward"], source


def _carries(step, flowing: set) -> bool:
    """Whether a gradient flows out of ``step`` into something it read."""
    if isinstance(step, KernelStep):
        return any(step.grad_mask) and any(s in flowing for s in step.outputs)
    return isinstance(step, ExternStep) and step.slot in flowing


def _checked(grads):
    """The inputs' gradients; under ``create_graph=True`` gradients whose own backward raises a clear error
    (the regions' gradient kernels are not differentiable: a second derivative would be silently wrong)."""
    if torch.is_grad_enabled():
        return tuple(_no_double_backward("tailjit_graph", list(grads)))
    return grads


class _Code(HostCode):
    """Host code with locals of its own, numbered after the planned graph's slots."""

    def __init__(self, next_slot: int, input_syms: dict, slice_syms: dict, direct: dict):
        super().__init__(input_syms, {}, slice_syms, direct)
        self.next_slot = next_slot

    def fresh(self) -> int:
        self.next_slot += 1
        return self.next_slot - 1


class _ForwardCode(_Code):
    """The host function's steps without autograd: each kernel's saved intermediates kept in slots of
    their own (the per-step route keeps them in its autograd node)."""

    def __init__(self, p):
        super().__init__(p.nslots, p.input_syms, p.slice_syms, DIRECT)
        self.saved_of: dict = {}  # id(kernel step) -> the slots of its saved intermediates
        self.elements: dict = {}  # the slot of an extern's tuple -> the slots its elements are unpacked to
        self.training: set = set()  # id(extern step) of those that run in grad mode (``_training_mode``)

    def steps(self, steps, indent: str = "    ") -> list[str]:
        out = []
        for s in steps:
            if id(s) in self.training:
                out.append(f"{indent}with {self.name_of(_training_mode, 'op')}():")
                out += super().steps([s], indent + "    ")
            else:
                out += super().steps([s], indent)
            if isinstance(s, ExternStep) and s.slot in self.elements:
                out.append(f"{indent}{', '.join(f'v{e}' for e in self.elements[s.slot])}, = v{s.slot}")
        return out

    def kernel(self, s: KernelStep, indent: str) -> list[str]:
        extra = [self.fresh() for _ in range(s.n_saved)]
        self.saved_of[id(s)] = extra
        names = ", ".join(f"v{o}" for o in s.outputs + extra)
        return [f"{indent}{names} = {self.name_of(s.kernel, 'kernel')}({', '.join(self.inputs(s))})"] + self.steps(
            s.after, indent
        )

    def inputs(self, s: KernelStep) -> list[str]:
        return [self.source(src) for src in s.sources]

    def source(self, src) -> str:
        """A kernel input: a slot, or a size's stand-in."""
        if isinstance(src, Ref):
            return self.kernel_input(src, f"v{src.slot}")
        return f"{self.name_of(stand_in, 'op')}({self.size(src[1])})"


@contextlib.contextmanager
def _training_mode():
    """Grad mode on, below autograd (nothing is recorded): an ``autograd.Function``'s forward runs with grad mode
    off, and some ops then leave undefined the outputs only their backward reads (``mkldnn_rnn_layer``'s
    workspace, which the LSTM's backward takes), so an extern whose backward reads its outputs runs in here."""
    with torch.enable_grad(), torch._C._AutoDispatchBelowAutograd():
        yield


def _reads_outputs(vjp) -> bool:
    """Whether an extern's traced backward (``_vjp``) reads the op's outputs."""
    gm, tensors, _, heads = vjp
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return any(n.users for n in placeholders[len(tensors) : len(tensors) + len(heads)])


class _Reads(_Code):
    """The backward's code: the forward slots it reads (saved by the forward), the gradients it assigns, and
    locals of its own (slots after the forward's)."""

    def __init__(self, fw: _ForwardCode):
        super().__init__(fw.next_slot, {}, {}, {})
        self.globals, self.names, self.n = fw.globals, fw.names, fw.n  # one namespace for both functions
        self.slots: set = set()
        self.assigned: set = set()
        self.globals.update({"_acc": _acc, "_zeros": _zeros_like_or})

    def slot(self, slot: int) -> str:
        self.slots.add(slot)
        return f"v{slot}"


def _acc(total, owned: bool, g):
    if total is None:
        return g, False
    if owned:
        return total.add_(g), True
    return total + g, True


def _zeros_like_or(g, like):
    return torch.zeros_like(like) if g is None else g


def _backward_blocks(steps, flowing: set, vjps: dict, fw: _ForwardCode, read: _Reads) -> list[list[str]]:
    """Each gradient-carrying step's backward, last step first."""
    blocks: list[list[str]] = []
    for s in reversed(steps):
        if not _carries(s, flowing):
            continue
        if isinstance(s, KernelStep):
            blocks.append(_kernel_backward(s, fw, read))
        elif s.target is operator.getitem:  # an element's gradient, for the op that made the tuple
            if s.slot in read.assigned:
                blocks.append([f"    if g{s.slot} is not None:", _accumulate(fw.elements[s.args[0].slot][s.args[1]],
                               f"g{s.slot}", read)])  # fmt: skip
        else:
            blocks.append(_extern_backward(s, fw.elements.get(s.slot, [s.slot]), vjps[id(s)], read))
    return [b for b in blocks if b]


_NAME = re.compile(r"\b[vgr]\d*\b")


def _released(blocks: list[list[str]], returned: set) -> list[str]:
    """The blocks, each followed by a line that lets go of the locals no later block reads (and not the
    gradients the backward returns): a gradient is freed as soon as it is used up, as the engine frees each
    node's, so that its memory serves the next step's allocations (held to the end, every gradient of
    ShiftNet's backward took fresh memory).  Saved tensors stay with the node, for a retain_graph backward."""
    last = {}
    for k, block in enumerate(blocks):
        for line in block:
            for name in _NAME.findall(line):
                last[name] = k
    out = []
    for k, block in enumerate(blocks):
        out += block
        done = sorted(n for n, at in last.items() if at == k and n not in returned)
        if done:
            out.append(f"    {' = '.join(done)} = None")
    return out


def _kernel_backward(s: KernelStep, fw: _ForwardCode, read: _Reads) -> list[str]:
    k = s.kernel
    mask = tuple(m and f for m, f in zip(s.grad_mask, k._float_inputs))
    backward = read.name_of(k.backward(mask), "kernel_backward")
    ins = [read.kernel_input(src, read.slot(src.slot)) if isinstance(src, Ref) else fw.source(src) for src in s.sources]
    outs = s.outputs + fw.saved_of[id(s)]
    kept = [o for o, f in zip(outs, k._float_outputs) if f]
    heads = [o for o, f in zip(s.outputs, k._float_outputs) if f]
    got, lines = _guarded(heads, read)
    if not lines:
        return []
    saved = ins + [read.slot(o) for o in kept]
    zeros = [f"_zeros({g}, {read.slot(o)})" for g, o in zip(got, heads)]
    targets = [src.slot for src, m in zip(s.sources, mask) if m]
    lines += [f"        r = {backward}(({', '.join(saved + zeros)},), {len(saved)})"]
    for i, slot in enumerate(targets):
        lines.append(_accumulate(slot, f"r[{i}]", read))
    return lines


def _guarded(outputs: list, read: _Reads) -> tuple[list[str], list[str]]:
    """The gradients of a step's ``outputs`` ("None" for one no later step gives) and the ``if`` that runs the
    step's backward when one of them came (no line when none can)."""
    got = [f"g{o}" if o in read.assigned else "None" for o in outputs]
    given = [g + " is not None" for g in got if g != "None"]
    return got, [f"    if {' or '.join(given)}:"] if given else []


def _accumulate(slot: int, value: str, read: _Reads) -> str:
    """The line that adds ``value`` to the gradient of ``slot``: every gradient starts as None, and ``o<slot>``
    says whether it is a sum this backward made (added to in place) rather than a value it was handed (a view of
    an output's gradient, which nothing may write)."""
    read.assigned.add(slot)
    return f"        g{slot}, o{slot} = _acc(g{slot}, o{slot}, {value})"


def _extern_backward(s: ExternStep, out_slots: list, vjp, read: _Reads) -> list[str]:
    """The product's traced graph written out inline, its ops called as the host function calls them."""
    gm, tensor_leaves, targets, zero_heads = vjp
    got, lines = _guarded(out_slots, read)
    if not lines:
        return []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = [Ref(x.slot) if isinstance(x, Ref) else x for x in tensor_leaves] + [Ref(o) for o in out_slots]
    read.slots.update(v.slot for v, ph in zip(values, placeholders) if isinstance(v, Ref) and ph.users)
    zeros = read.name_of(torch.zeros, "op")
    for g, (shape, dtype) in zip(got, zero_heads):  # a gradient no later step gave: zeros, as autograd's
        h = read.fresh()
        lines.append(f"        v{h} = {g} if {g} is not None else {zeros}({shape}, dtype={read.value(dtype)})")
        values.append(Ref(h))
    env = dict(zip(placeholders, values))
    for n in gm.graph.nodes:
        if n.op == "call_function":
            args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), env.__getitem__)
            env[n] = Ref(read.fresh())
            lines.append(f"        v{env[n].slot} = {read.call(n.target, args, kwargs)}")
        elif n.op == "output":
            results = torch.fx.node.map_arg(n.args[0], env.__getitem__)
    for slot, value in zip(targets, results):
        lines.append(_accumulate(slot, read.value(value), read))
    return lines


def _vjp(s: ExternStep, node_of: dict, flowing: set):
    """``(graph, tensor arguments, slots they hand gradients to, (shape, dtype) of each output)`` for the extern
    step ``s``: the graph takes its tensor arguments, its output(s) and one gradient per output and returns
    the gradients of the arguments that carry one (their slots, in order).  None when PyTorch cannot give it
    here."""
    target = DIFFERENTIABLE.get(s.target, s.target)
    leaves, spec = pytree.tree_flatten((s.args, s.kwargs), is_leaf=lambda x: isinstance(x, (Ref, SymRef)))
    examples, tensors, grad_slots, positions = [], [], [], []
    for pos, x in enumerate(leaves):
        if isinstance(x, SymRef):
            if not x.expr.is_Integer:
                return None
            continue
        v = (node_of[x.slot].meta.get("val") if x.slot in node_of else None) if isinstance(x, Ref) else x
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return None
        if not isinstance(v, torch.Tensor):
            continue  # a number (a step read it, or a constant): part of the trace
        if v.device.type != "cpu":  # the traced formulas name the examples' device
            return None
        grad = isinstance(x, Ref) and x.slot in flowing
        tensors.append(x)
        positions.append(pos)
        examples.append((tuple(v.shape), tuple(v.stride()), v.dtype, grad))
        if grad:
            grad_slots.append(x.slot)
    out = node_of[s.slot].meta.get("val")
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if not all(isinstance(o, torch.Tensor) for o in outs):
        return None
    if not all(type(d) is int for e in (*examples, *((o.shape, o.stride()) for o in outs)) for d in (*e[0], *e[1])):
        return None  # a size read from data (``nonzero``'s rows): no static example of it
    const_leaves = tuple(
        int(x.expr) if isinstance(x, SymRef) else ("tensor" if isinstance(x, (Ref, torch.Tensor)) else x)
        for x in leaves
    )
    out_examples = tuple((tuple(o.shape), tuple(o.stride()), o.dtype) for o in outs)
    try:
        fn = _traced_vjp(target, spec, const_leaves, tuple(positions), tuple(examples), out_examples,
                         isinstance(out, (tuple, list)))  # fmt: skip
    except Exception:  # noqa: BLE001 - no derivative here (an op without one, an integer output): per-step route
        return None
    return fn, tensors, grad_slots, [(list(o.shape), o.dtype) for o in outs]


@functools.lru_cache(maxsize=1024)
def _traced_vjp(target, spec, const_leaves, positions, examples, out_examples, is_tuple):
    n_in, n_out = len(examples), len(out_examples)
    needs = [i for i, e in enumerate(examples) if e[3]]

    def joint(*a):
        ins, heads = a[:n_in], a[n_in + n_out :]
        flat = list(const_leaves)
        for pos, t in zip(positions, ins):
            flat[pos] = t
        args, kwargs = pytree.tree_unflatten(flat, spec)
        y = target(*args, **kwargs)
        ys = list(y) if is_tuple else [y]
        pairs = [(o, h) for o, h in zip(ys, heads) if o.requires_grad]
        got = torch.autograd.grad([o for o, _ in pairs], [ins[i] for i in needs], [h for _, h in pairs],
                                  allow_unused=True)  # fmt: skip
        return tuple(g if g is not None else torch.zeros_like(ins[i]) for g, i in zip(got, needs))

    # outside the compile that asks (Dynamo's backend): make_fx would trace in its fake mode, its guards added
    with torch._guards.tracing(None), unset_fake_temporarily():
        ins = [torch.empty_strided(sh, st, dtype=dt).requires_grad_(rg) for sh, st, dt, rg in examples]
        outs = [torch.empty_strided(sh, st, dtype=dt) for sh, st, dt in out_examples]
        heads = [torch.empty_strided(sh, st, dtype=dt) for sh, st, dt in out_examples]
        gm = make_fx(joint, tracing_mode="fake")(*ins, *outs, *heads)
    _read_saved_outputs(gm, target, n_in, n_out, is_tuple)
    return gm


def _read_saved_outputs(gm: torch.fx.GraphModule, target, n_in: int, n_out: int, is_tuple: bool) -> None:
    """Replace the traced recomputation of the op's own value (a derivative formula reads it: ``sigmoid``'s,
    ``native_dropout``'s mask) by the output placeholders, and drop what nothing reads.  Raises when a random
    op would still run in the backward (an op traced as its decomposition: its value recomputed would differ,
    and the generator would advance where eager's does not)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    outs = placeholders[n_in : n_in + n_out]
    first = next(n for n in gm.graph.nodes if n.op != "placeholder")
    if first.op == "call_function" and first.target is target:  # the forward runs first in the joint trace
        if is_tuple:
            for u in list(first.users):
                if u.target is operator.getitem and isinstance(u.args[1], int):
                    u.replace_all_uses_with(outs[u.args[1]])
                    gm.graph.erase_node(u)
        else:
            first.replace_all_uses_with(outs[0])
        if not first.users:
            gm.graph.erase_node(first)
    gm.graph.eliminate_dead_code()
    for n in gm.graph.nodes:
        if n.op == "call_function" and torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()):
            raise ValueError(f"{n.target} would run again in the backward")
    gm.recompile()
