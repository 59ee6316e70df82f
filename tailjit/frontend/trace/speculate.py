"""Speculative traces: Python control flow on values read from data, traced for the branches one call took.

A function that branches on a tensor's value (``if count > 0``, ``int(t)``, ``t.tolist()``) or on a size
that depends on data (``if idx.numel() > k`` after ``nonzero``) cannot be traced with fake tensors alone:
they hold no values, so a branch on one is a guard on a symbol torch cannot decide.  :func:`record` runs
the function once eagerly, on copies of the inputs, and keeps each value it reads
(``aten._local_scalar_dense``, which ``.item()``, ``bool()``, ``int()`` and ``float()`` call;
``tolist()`` reads element by element through it) and the sizes of each output whose shape depends on
data.  The fake trace then runs under :class:`Replay`, which gives each integer or bool symbol its recorded
value as a hint (torch's ``real_tensor_prop_unbacked_vals``): a branch on it is decided by the hint and
becomes a runtime assertion of the outcome (``u0 > 128``, not ``u0 == 57``), and a value that must become a
constant (a size two tensors must share) an assertion of equality.  A float read is traced as the constant
it was, asserted equal by the graph.  :func:`insert_asserts` puts the assertions into the graph right after
the values they test, before anything that relies on them runs.  A call whose assertion fails took another
path: ``tailjit.jit`` drops it and runs it another way (:class:`Missed`).

Speculation is refused (:class:`Unspeculable`) where a rerun could not undo a wrong path, or where no
assertion could see the difference: writes into the inputs, random ops, data leaving through ``numpy()``
or ``data_ptr()``, and more than ``MAX_GUARDS`` reads (an unrolled loop of them makes a large graph).
"""

from __future__ import annotations

import logging
import traceback

import sympy
import torch
import torch.utils._pytree as pytree
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
_READ = _aten._local_scalar_dense.default

#: Values one speculative trace may read (``keypoint_argmax_decode`` reads 68 at its small size).
MAX_GUARDS = 128

#: Paths kept per signature and sizes before the function takes the torch.compile path: a function whose
#: branches differ at most calls (an NMS loop's iteration count) gains nothing here.
MAX_PATHS = 4

#: How torch's ``_assert_scalar`` starts the message of a failed runtime assertion.
_FAILED = "Runtime assertion failed"


class Unspeculable(RuntimeError):
    """The function cannot be traced speculatively; the message says why."""


class Missed(Exception):
    """A speculative entry's assertion failed: the call took another path than the trace."""

    def __init__(self, call):
        super().__init__("a branch on a value read from data went another way than in the speculative trace")
        self.call = call


def failed_assertion(err: Exception) -> bool:
    """Whether ``err`` is a speculative trace's runtime assertion failing."""
    return isinstance(err, RuntimeError) and str(err).startswith(_FAILED)


def record(flat_function, tensors) -> Recording:
    """What ``flat_function(mode)(*tensors)`` reads from data, from one eager run on copies of ``tensors``
    with the random number generator's state restored after it: per read or data-dependent shape, the op
    and its values (a number, or an output's sizes), in ``seen``; the stack of the first read."""
    copies = [copy_of(t) for t in tensors]
    versions = [c._version for c in copies]
    recording = Recording()
    try:
        with torch.random.fork_rng(devices=[]):
            flat_function(lambda: recording)(*copies)
        if any(c._version != v for c, v in zip(copies, versions)):
            raise Unspeculable("it writes into its inputs, which a rerun after a failed assertion would repeat")
    except Unspeculable as why:
        why.first_read = recording.first_read  # where the fallback's warning points
        raise
    if not recording.seen:
        raise Unspeculable("it reads no values from data")
    return recording


def copy_of(t: torch.Tensor) -> torch.Tensor:
    """A tensor of ``t``'s sizes, strides, values and ``requires_grad``, in memory of its own."""
    copy = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).copy_(t.detach())
    return copy.requires_grad_(t.requires_grad)


def _values(out) -> list:
    """The numbers a read or a data-dependent shape gives: the value, or each output's sizes."""
    found = []
    for leaf in pytree.tree_leaves(out):
        found += list(leaf.shape) if isinstance(leaf, torch.Tensor) else [leaf]
    return found


class Recording(TorchDispatchMode):
    """Below the function and above the tracer: keeps what the function reads from data, and refuses
    what speculation cannot undo."""

    def __init__(self):
        super().__init__()
        self.seen: list = []  # (op, values) per read or data-dependent shape, in order
        self.reads = 0
        self.first_read: list = []  # the stack (``traceback.FrameSummary``) of the first read

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in func.tags:
            raise Unspeculable(f"it calls {func}, a random op")
        out = func(*args, **(kwargs or {}))
        if func is _READ or torch.Tag.dynamic_output_shape in func.tags:
            if not self.seen:
                self.first_read = traceback.extract_stack()
            self.reads += func is _READ
            if self.reads > MAX_GUARDS:
                raise Unspeculable(f"it reads more than {MAX_GUARDS} values from data")
            out = self.observe(func, args, out)
        return out

    def observe(self, func, args, out):
        self.seen.append((func, _values(out)))
        return out


class Replay(Recording):
    """The trace's mode: each symbol a read or a data-dependent shape makes gets its recorded value as
    the hint that decides branches on it."""

    def __init__(self, seen: list):
        super().__init__()
        self.recorded = seen

    def __enter__(self):
        _SHAPES_LOG.addFilter(_quiet_hints)
        return super().__enter__()

    def __exit__(self, *exc):
        _SHAPES_LOG.removeFilter(_quiet_hints)
        return super().__exit__(*exc)

    def observe(self, func, args, out):
        if len(self.seen) >= len(self.recorded) or self.recorded[len(self.seen)][0] is not func:
            raise Unspeculable("its trace reads other values than its eager run (it is not deterministic)")
        recorded = self.recorded[len(self.seen)]
        self.seen.append(recorded)
        if isinstance(out, torch.SymFloat):
            # a float is traced as the constant it was (kernels fold it), asserted equal to it by the graph:
            # torch reasons about floats as reals (x != x is False to it), and kernels take no float from the
            # host
            value = recorded[1][0]
            t = args[0]
            _aten._assert_async.msg(t != t if value != value else t == value, f"{_FAILED}: a float read from data")
            return value
        for sym, value in zip(_values(out), recorded[1]):
            if isinstance(sym, (torch.SymInt, torch.SymBool)):
                _hint(sym, value)
        return out


_SHAPES_LOG = logging.getLogger("torch.fx.experimental.symbolic_shapes")


def _quiet_hints(record: logging.LogRecord) -> bool:
    """Drops torch's warning for each branch a hint decides: here that is the point, and each speculative
    trace printed one line per branch to standard error."""
    return not str(record.msg).startswith("propagate_real_tensors")


def _hint(sym, value) -> None:
    """Give the unbacked symbol ``sym`` stands for the value it had in the eager run."""
    (u, *more) = free_unbacked_symbols(sym) or (None,)
    expr = sym.node.expr
    # the symbol itself, or a read of a bool tensor (``Eq(u0, 1)``, u0 in {0, 1})
    if u is not None and not more and (expr == u or (isinstance(sym, torch.SymBool) and expr == sympy.Eq(u, 1))):
        sym.node.shape_env.set_real_tensor_prop_unbacked_vals(u, int(value))


def insert_asserts(gm: torch.fx.GraphModule) -> int:
    """The outcomes a speculative trace assumed, as runtime assertions in ``gm``; their number."""
    from torch._guards import detect_fake_mode
    from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts

    # the trace's shape environment, even where every symbol got a constant (no node holds one then)
    fake_mode = detect_fake_mode([n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"])
    if fake_mode is None or fake_mode.shape_env is None:
        raise Unspeculable("its trace has no shape environment to hold its assumptions")
    env = fake_mode.shape_env
    for n in reversed(gm.graph.nodes):  # a retraced graph's own, folded to constants
        if n.target is _aten._assert_scalar.default and not isinstance(n.args[0], torch.fx.Node):
            gm.graph.erase_node(n)
    bound = set()  # the symbols some node defines (its value, or a binding the value specialised away)
    for n in gm.graph.nodes:
        bound |= free_unbacked_symbols(n.meta.get("val")) | set(n.meta.get("unbacked_bindings") or ())
    if set(env.real_tensor_prop_unbacked_vals) - bound:  # the pass skips what no node defines: no silent skip
        raise Unspeculable("a value its branches read is not in its graph, where an assertion could test it")
    # a symbol an assertion pins (``Eq(u0, 3)``) needs no other assertion its value implies: of its range
    # (``u0 >= 3``, ``u0 <= 3``, from ``var_to_range``) or of a branch it also decided (``Ne(u0, 1)``)
    asserts = env.deferred_runtime_asserts
    pins: dict = {}
    for e in (ra.expr for ras in asserts.values() for ra in ras):
        if isinstance(e, sympy.Eq) and isinstance(e.lhs, sympy.Symbol) and e.rhs.is_number:
            pins.setdefault(e.lhs, e)
    values = {u: e.rhs for u, e in pins.items()}

    def implied(e) -> bool:
        return e not in pins.values() and e.free_symbols <= values.keys() and e.xreplace(values) == sympy.true

    ranges = {u: env.var_to_range[u] for u in values if u in env.var_to_range}
    env.deferred_runtime_asserts = {k: [ra for ra in ras if not implied(ra.expr)] for k, ras in asserts.items()}
    env.var_to_range.update(dict.fromkeys(ranges, env._default_unspecified_value_range()))
    try:
        insert_deferred_runtime_asserts(gm, env, "tailjit speculation")
    finally:  # the shape environment as the trace left it
        env.deferred_runtime_asserts = asserts
        env.var_to_range.update(ranges)
    asserts = [n for n in gm.graph.nodes if n.target in (_aten._assert_scalar.default, _aten._assert_async.msg)]
    # the numbers an assertion tests are computed at run time, sizes read from their tensors: to the
    # compiler, a number the trace specialised (``Eq(u0, 31153)``, the 1 of ``sym_ite(u0, 1, 0)``) would be
    # its constant, and the assertion would test the constant
    seen: set = set()
    stack = [a for n in asserts for a in n.all_input_nodes]
    while stack:
        n = stack.pop()
        if n in seen or isinstance(n.meta.get("val"), torch.Tensor):
            continue
        seen.add(n)
        n.meta["val"] = None
        if n.target in _SIZES:
            n.target = _SIZES[n.target]
        else:
            stack += n.all_input_nodes
    gm.recompile()
    return len(asserts)


def _size(t: torch.Tensor, dim: int) -> int:
    return t.shape[dim]


def _numel(t: torch.Tensor) -> int:
    return t.numel()


_SIZES = {_aten.sym_size.int: _size, _aten.sym_numel.default: _numel}


class TracedMethods(TorchFunctionMode):
    """For every trace: the tensor methods a trace cannot follow as they are.  ``tolist()`` becomes
    reads (data-dependent for a fake trace, recorded or replayed for a speculative one); the methods
    that hand out data without an op are refused, where a fake tensor would hand out made-up values;
    augmented bitwise assignments (``m &= k``) become their in-place ops, as functionalisation rejects
    ``aten.__iand__``'s schema."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.tolist:
            return _tolist(args[0])
        if func in _ESCAPES:
            raise Unspeculable(f"it reads tensor data through {func.__name__}(), which no trace or guard can follow")
        return _IN_PLACE.get(func, func)(*args, **(kwargs or {}))


_ESCAPES = {torch.Tensor.numpy, torch.Tensor.__array__, torch.Tensor.data_ptr, torch.Tensor.untyped_storage,
            torch.Tensor.storage, torch.Tensor.__dlpack__}  # fmt: skip
_IN_PLACE = {
    torch.Tensor.__iand__: torch.Tensor.bitwise_and_,
    torch.Tensor.__ior__: torch.Tensor.bitwise_or_,
    torch.Tensor.__ixor__: torch.Tensor.bitwise_xor_,
}


def _tolist(t: torch.Tensor):
    if t.dim() == 0:
        return t.item()
    return [_tolist(row) for row in t.unbind(0)]
