"""``tailjit.jit``: trace once per input signature, call the compiled graph behind a cheap check.

A JAX-style entry with the lowest per-call cost tailjit offers.  On the first
call with a new *signature* (each tensor's dtype, rank and ``requires_grad``;
the values of static arguments; whether grad mode is on) the function is
traced to an ATen graph (``make_fx``) and compiled by
:func:`tailjit.frontend.host.function.compile_graph`.

Sizes follow Dynamo's "automatic dynamic" policy: the first trace of a
signature has static sizes (a static trace is several times cheaper than a
symbolic one, and most functions only ever see one size), guarded by exact
shape equality.  A call whose sizes break that guard traces again with
symbolic sizes; the sizes that trace relied on (0/1 specialisation, equal
sizes, sizes that Python code branched on) come back from the shape
environment as guards, compiled into one Python expression over the
arguments' shapes, so every later size that satisfies them reuses the trace
and its kernels.  A later call runs the first compiled entry whose guards
hold.

Training: when an input requires grad under grad mode, the outputs require
grad and the backward is compiled by tailjit too: each region's gradient is
derived from its tensor expressions (``expr_grad.py``), or, where that could
differ from eager, the function goes through AOTAutograd (``aot_function``,
static or dynamic shapes as above).

Python control flow on tensor values (``if count > 0``, ``int(t)``,
``t.tolist()``) or on sizes that depend on data is traced speculatively
(``speculate.py``): for the branches this call took, each a runtime assertion
in the graph; a call whose assertion fails is dropped and takes another traced
path, or a new one while paths hit at least as often as they miss (at most
``speculate.MAX_PATHS``).  Anything else the trace cannot follow, a function
whose paths keep changing, or one that speculation refuses (writes into its
inputs, random ops, more than ``speculate.MAX_GUARDS`` reads) falls back, once
and with a warning naming the line, to ``torch.compile(fn,
backend="tailjit")``, which breaks the graph there: for its training calls or
for its others, whichever failed to trace.
"""

from __future__ import annotations

import functools
import inspect
import operator
import re
import sys
import threading
import traceback
import types
import warnings

import numpy as np
import torch
import torch.utils._pytree as pytree
from torch._dynamo.convert_frame import compile_lock
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._python_dispatch import TorchDispatchMode

from tailjit.frontend.adaptive import Trial
from tailjit.frontend.backend import partition_joint
from tailjit.frontend.background import COMPILE_MODES, NOT_SERVED, Background
from tailjit.frontend.host.function import compile_graph
from tailjit.frontend.lower.decompositions import decompositions
from tailjit.frontend.lower.values import node_storage
from tailjit.frontend.plan.report import new_report
from tailjit.frontend.trace import captures, speculate
from tailjit.frontend.trace.inplace_casts import InplaceCasts
from tailjit.frontend.train.expr_grad import GradProbe, compile_training
from tailjit.runtime.collector import full_collections_deferred
from tailjit.runtime.kernel import dispatch_modes, functorch_active

__all__ = ["jit", "JitFunction", "JitClosure", "JitModule"]

_MISS = object()  # no outputs: a generated fast path that does not serve the call, or none computed yet


def jit(fn=None, *, static_argnums=(), static_argnames=(), compile="now", adapt=True):
    """Compile ``fn`` with tailjit, tracing once per input signature.

    Tensor arguments (also inside lists, tuples and dicts) are traced with
    static sizes first and with symbolic sizes once a second size arrives;
    every other argument, and those named by ``static_argnums`` /
    ``static_argnames``, is static: its value is part of the signature and
    baked into the trace (so a new value traces again; an object of the user's
    classes or a namespace by what it holds, ``captures.frozen``), except a Python
    float that takes a second value: it is then passed as a 0-d tensor whose
    value the trace reads, where the code allows (``docs/jit.md``).  An ``nn.Module``
    gives a :class:`JitModule`, whose parameters and buffers are inputs; a
    function that reads tensors, modules or numbers from its closure, its
    globals or the module it is a method of (or names not bound yet), a
    method of a plain object and a callable object (its ``__call__``) give a
    :class:`JitClosure`, whose captured tensors and floats are inputs too and
    whose object's settings (``self.gamma``) are watched.
    ``compile="background"`` gives a :class:`~tailjit.frontend.background.Background`: a call of a signature
    not compiled yet runs ``fn`` eagerly while its compile runs in a thread, then the compiled function.
    ``adapt`` (on by default) measures each new compiled entry against eager ``fn`` over its first calls and keeps
    the faster (``adaptive.py``; ``JitFunction.choices`` says which); ``adapt=False`` never measures.
    Usable as ``@tailjit.jit`` or ``@tailjit.jit(static_argnums=(1,))``."""
    if compile not in COMPILE_MODES:
        raise ValueError(f"tailjit.jit: compile must be one of {COMPILE_MODES}, got {compile!r}")
    if fn is None:
        options = dict(static_argnums=static_argnums, static_argnames=static_argnames, compile=compile, adapt=adapt)
        return functools.partial(jit, **options)
    if compile == "background":
        return Background(fn, jit(fn, static_argnums=static_argnums, static_argnames=static_argnames, adapt=adapt))
    if isinstance(fn, torch.nn.Module):
        return JitModule(fn, static_argnums, static_argnames, adapt)
    if not inspect.isroutine(fn) and isinstance(inspect.getattr_static(type(fn), "__call__", None), types.FunctionType):
        fn = fn.__call__  # a callable object (a loss class): its method, whose object's settings are watched
    found = captures.sources(fn)
    if found:
        return JitClosure(fn, found, static_argnums, static_argnames, adapt)
    return JitFunction(fn, static_argnums, static_argnames, adapt=adapt)


class JitClosure:
    """What :func:`jit` returns for a function that reads values from outside its arguments
    (``captures.py``): its closure cells, the globals its code loads, the module it is a method of, where
    they held a tensor, a module, a container of tensors, a number or nothing yet when ``jit`` was applied
    (found again before a new key traces, so a name bound since is seen).  Every call
    reads them again and passes their tensors (a module's parameters and buffers) and floats (a module's
    float settings) to the trace as leading inputs, so a rebinding, an optimizer's in-place step or a
    buffer's update is seen and a training call gives them their gradients.  One :class:`JitFunction` per
    *capture key* (which values are tensors or floats, each module's ``training`` flags, parameter and buffer
    names and other settings, the other numbers' values), in ``traces``;
    ``jitted`` is the current one, and its other attributes (``entries``, ``reports``, ``fallback``) are
    this object's."""

    def __init__(self, fn, found: list, static_argnums=(), static_argnames=(), adapt=True):
        if not isinstance(fn, torch.nn.Module):  # (a module's ``__dict__`` holds its parameters)
            functools.update_wrapper(self, fn)
        self.fn, self.sources = fn, found
        self.static_argnums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
        self.static_argnames = static_argnames
        self.adapt = adapt
        self.traces: dict = {}  # capture key -> JitFunction
        self._quicks: dict = {}  # capture key -> its generated call (``captures.quick_call``)
        self._made: dict = {}  # capture key -> how many times its call was generated
        self._quick = _miss  # the last key's
        self.rebinds = None  # torch.compile(fn) once a trace found that ``fn`` assigns to a captured value
        self._lock = threading.RLock()  # held while a key's JitFunction and generated call are made

    def _found_again(self) -> bool:
        """Find the sources again before a new key traces (a name bound since, perhaps to a helper with
        globals of its own); True where they changed, and then the traces of the old ones are dropped."""
        found = captures.sources(self.fn)
        if captures.same_sources(found, self.sources):
            return False
        self.sources = found
        self.traces.clear()
        self._quicks.clear()
        self._made.clear()
        self._quick = _miss
        return True

    def __call__(self, *args, **kwargs):
        if dispatch_modes() or functorch_active() or _is_compiling():  # as JitFunction: join that trace
            return self.fn(*args, **kwargs)
        if self.rebinds is not None:
            return self.rebinds(*args, **kwargs)
        out = self._quick(args, kwargs)
        if out is not captures.MISS:
            return out
        jitted, tensors = self._current()
        out = jitted(*tensors, *args, **kwargs)
        if (jitted.fallback_reason or "").startswith(captures.Rebound.__name__):
            # it assigns to a captured value: each call would key a new trace that falls back again, so every
            # call takes one torch.compile of the function itself, which carries the assignments out
            self.rebinds = _compiled(self.fn)
        return out

    def served(self, args, kwargs):
        """:meth:`JitFunction.served` of the captured values' current key."""
        if self.rebinds is not None:
            return self.rebinds(*args, **kwargs)
        jitted, tensors = self._current()
        return jitted.served((*tensors, *args), kwargs)

    def _current(self) -> tuple:
        """The :class:`JitFunction` of the captured values' key, and their tensors."""
        key, tensors = captures.gather(self.sources, floats=not isinstance(self.fn, torch.nn.Module))
        jitted = self.traces.get(key)
        if jitted is not None and key in self._quicks and not captures.holds_modules(key):
            self._quick = self._quicks[key]
            return jitted, tensors
        with self._lock:  # (a trace running in another thread may hold a module's float settings swapped)
            return self._current_locked()

    def _current_locked(self) -> tuple:
        key, tensors = captures.gather(self.sources, floats=not isinstance(self.fn, torch.nn.Module))
        jitted = self.traces.get(key)
        if jitted is None:
            if self._found_again():
                return self._current_locked()
            jitted = self.traces[key] = self._jitted(key, len(tensors))
            if len(self.traces) == _MANY_TRACES:
                changing = captures.changing(self.sources, list(self.traces))
                warnings.warn(
                    f"tailjit.jit: {_name(self.fn)} has traced {_MANY_TRACES} times, for new values of what it "
                    f"reads from outside its arguments ({', '.join(changing) or 'its captured values'}); each new "
                    "value traces again: pass a value that changes as an argument (a float is then read by one "
                    "trace)",
                    stacklevel=_caller_level(),
                )
        # a module's generated check holds its parameters as they are now: made again where they changed (a
        # new parameter assigned), but not for ever (a function that assigns one at every call)
        if key not in self._quicks or (self._quicks[key] is not _miss and captures.holds_modules(key)):
            quick = captures.quick_call(self.sources, key, tensors, jitted, _MISS, speculate.Missed)
            self._made[key] = made = self._made.get(key, 0) + 1
            self._quicks[key] = quick if quick is not None and made <= _MAX_QUICKS else _miss
        self._quick = self._quicks[key]
        return jitted, tensors

    def _jitted(self, key: tuple, n: int) -> JitFunction:
        fn = self.fn

        def fallback_fn(*args, **kwargs):  # ``fn`` itself, whose captured values Dynamo reads and guards
            return fn(*args[n:], **kwargs)

        # the captured tensors come first: static positions move by their number
        statics = tuple(i + n for i in self.static_argnums)
        lifted = captures.lifted(fn, self.sources, key)
        return JitFunction(lifted, statics, self.static_argnames, fallback_fn, self.adapt)

    @property
    def jitted(self) -> JitFunction:
        """The :class:`JitFunction` of the captured values' current key."""
        return self._current()[0]

    def __getattr__(self, name):
        if name.startswith("__") or "sources" not in self.__dict__:  # (``copy`` asks before ``__init__`` ran)
            raise AttributeError(name)
        return getattr(self.jitted, name)


#: How many times a key's generated call is made before its calls take the walk instead.
_MAX_QUICKS = 8

#: A function traced this many times (a ``JitClosure`` for as many keys) is told so, once: values that change
#: at every call and are baked into each trace make every call trace.
_MANY_TRACES = 8


def _miss(args, kwargs):
    return captures.MISS


class JitModule(JitClosure):
    """What :func:`jit` returns for an ``nn.Module``: a :class:`JitClosure` whose one captured value is the
    module.  Every call passes its parameters and buffers to the trace as inputs
    (``torch.func.functional_call``), so a trace reads their current values (an optimizer's in-place step, a
    new tensor assigned to a parameter) and a training call gives the parameters their gradients.  One
    :class:`JitFunction` per value of its submodules' ``training`` flags, set of parameter and buffer names
    and settings (plain number, string or flag attributes such as ``self.eps``: ``eval()`` or a new
    ``self.temperature`` traces again), called with those tensors first: a call whose arguments are plain tensors
    takes its generated fast path.  A tensor the forward reads from elsewhere (an attribute that is not a
    buffer) still makes the call fall back.  Other attributes are the module's (``parameters()``,
    ``eval()``), else those of the :class:`JitFunction` of the module's current state (``jitted``:
    ``entries``, ``reports``, ``fallback``)."""

    def __init__(self, module: torch.nn.Module, static_argnums=(), static_argnames=(), adapt=True):
        super().__init__(module, captures.sources(module), static_argnums, static_argnames, adapt)
        self.module = module

    def __getattr__(self, name):
        module = self.__dict__.get("module")
        if module is not None and hasattr(module, name):
            return getattr(module, name)
        return super().__getattr__(name)


class JitFunction:
    """The callable :func:`jit` returns; ``entries`` holds the compiled traces."""

    def __init__(self, fn, static_argnums=(), static_argnames=(), fallback_fn=None, adapt=True):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.adapt = adapt  # measure new entries against eager (``adaptive.py``)
        self.choices: list = []  # what each measured entry runs, with both medians (``adaptive.Choice``)
        self.fallback_fn = fallback_fn or fn  # what a fallback compiles, called with this function's arguments
        nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
        names = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
        try:
            params = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            params = []
        # a static argument named by position is static when passed by keyword too, and vice versa
        self.static_nums = frozenset(nums) | {params.index(n) for n in names if n in params}
        self.static_names = frozenset(names) | {params[i] for i in nums if 0 <= i < len(params)}
        # a static value keys the same whether it came by position or by keyword
        self.static_slot = {n: params.index(n) if n in params else n for n in self.static_names}
        self.entries: dict = {}  # signature -> [Entry]
        self.fast: list = []  # generated check-and-call functions for positional calls (``_fast_function``)
        self.fallback = None  # torch.compile'd fn after a trace failure
        self.fallen: set = set()  # the calls it serves: True for training calls, False for the others
        self.fallback_reason: str | None = None
        self.reports: list = []
        self.misses = 0  # calls whose speculative guards failed
        self.speculated_at = ""  # the line whose read from data stopped the first trace
        self.first_read: list = []  # the stack of the first read from data of the last speculative recording
        # Python floats among the arguments: baked into a trace until one takes a second value, then passed as
        # 0-d float64 tensors whose value the trace reads (``.item()``), so further values reuse its kernels
        self.dynamic_floats: dict = {}  # argument structure -> positions of its flat leaves passed as tensors
        self.static_floats: set = set()  # (structure, position) whose trace with a tensor failed: baked
        self._floats_seen: dict = {}  # a key with its floats masked -> the floats of its last trace
        # held while a call traces and compiles (and changes the attributes above): a thread that meets a trace
        # being made waits for it; calls that an entry serves take no lock
        self._lock = threading.RLock()

    def __call__(self, *args, **kwargs):
        # ``tracing()``'s two questions, and Dynamo's, without a Python frame per call
        if dispatch_modes() or functorch_active() or _is_compiling():
            # inside another trace or a torch.func transform, whose tensors hold no data: the function's ops
            # join that trace (a tailjit.jit function called by another one is inlined into it)
            return self.fn(*args, **kwargs)
        try:
            out = self._served(args, kwargs)
            if out is not _MISS:
                return out
            with self._lock:  # one thread traces; the others wait for its entry, then take it
                out = self._traced(args, kwargs)
                if out is not _MISS:
                    return out
                key, leaves, tensors = self._signature(args, kwargs)
                if self._new_float_values(key):
                    return self(*args, **kwargs)
                return self._compile(key, args, kwargs, leaves, tensors)
        except speculate.Missed as missed:
            with self._lock:
                return self._missed(missed.call, args, kwargs)

    def _served(self, args, kwargs):
        """The call's outputs by a generated fast path, an entry or the fallback; :data:`_MISS` where none
        serves it (raises ``speculate.Missed`` where a speculative entry's assertion failed)."""
        if not kwargs:
            for fast in self.fast:
                out = fast(*args)
                if out is not _MISS:
                    return out
        return self._traced(args, kwargs)

    def served(self, args, kwargs):
        """The call's outputs where what was compiled serves it, else :data:`NOT_SERVED` (a call would trace)."""
        try:
            out = self._served(args, kwargs)
        except speculate.Missed:  # another path: a call traces it
            return NOT_SERVED
        return NOT_SERVED if out is _MISS else out

    def _traced(self, args, kwargs):
        """The call's outputs by the fallback or an entry traced before, :data:`_MISS` where neither serves it."""
        if self.fallen and (len(self.fallen) == 2 or _training_call(args, kwargs) in self.fallen):
            return self.fallback(*args, **kwargs)
        key, _, tensors = self._signature(args, kwargs)
        for e in self.entries.get(key, ()):
            if e.guard.check(*tensors):
                return e.finish(e.call(*tensors))
        return _MISS

    def _missed(self, failed, args, kwargs):
        """A speculative entry (its call ``failed``) read other values than its trace: the other paths
        traced for these sizes, then a new one while the paths hit more often than they miss and number
        fewer than ``MAX_PATHS``; else the torch.compile path."""
        self.misses += 1
        key, leaves, tensors = self._signature(args, kwargs)
        paths = [e for e in self.entries.get(key, ()) if e.speculative and e.guard.check(*tensors)]
        for e in paths:
            if e.call is not failed:
                try:
                    return e.finish(e.call(*tensors))
                except speculate.Missed as missed:
                    self.misses += 1
                    failed = missed.call
        hits = sum(e.call.hits[0] for es in self.entries.values() for e in es if e.speculative)
        if len(paths) >= speculate.MAX_PATHS or hits < self.misses:
            why = f"more than {speculate.MAX_PATHS} paths" if len(paths) >= speculate.MAX_PATHS else "a new path"
            return self._fall_back(
                SpeculationMissed(f"its values read from data took {why}, {hits} hits against {self.misses} misses"),
                args,
                kwargs,
                _training(tensors),
            )
        try:
            return self._compile(key, args, kwargs, leaves, tensors, speculative=True)
        except speculate.Missed as missed:  # the new path failed its guard on its own first call
            return self._missed(missed.call, args, kwargs)

    # -- signatures -----------------------------------------------------------
    def _signature(self, args, kwargs):
        statics = tuple((i, args[i]) for i in sorted(self.static_nums) if i < len(args))
        dyn_args = [a for i, a in enumerate(args) if i not in self.static_nums]
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self.static_names}
        statics += tuple((self.static_slot[k], kwargs[k]) for k in sorted(kwargs) if k in self.static_names)
        statics = tuple(sorted(((i, _hashable(v)) for i, v in statics), key=lambda kv: str(kv[0])))
        leaves, spec = pytree.tree_flatten((dyn_args, dyn_kwargs))
        floats = self.dynamic_floats.get(spec, ())
        if floats:
            floats = frozenset(p for p in floats if type(leaves[p]) is float)
            leaves = [_float_tensor(x) if p in floats else x for p, x in enumerate(leaves)]
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        consts = tuple(None if isinstance(x, torch.Tensor) else _hashable(x) for x in leaves)
        key = (spec, consts, statics, _tensor_key(tensors), torch.is_grad_enabled(), global_state(), floats)
        if _is_simple(args, kwargs, self.static_nums):
            key = _simple_key(args)
        return key, (dyn_args, dyn_kwargs, spec, leaves, floats), tensors

    def _new_float_values(self, key) -> bool:
        """Whether a float argument took a second value where the rest of the call is a signature traced
        before: its position is then passed as a tensor from now on (True: the call is to be signed again)."""
        if type(key[0]) is not pytree.TreeSpec:  # all plain tensors
            return False
        spec, consts = key[0], key[1]
        at = [p for p, c in enumerate(consts) if c is not None and c[0] is float]
        if not at:
            return False
        masked = (key[0], tuple(None if p in at else c for p, c in enumerate(consts)), *key[2:])
        seen = self._floats_seen.setdefault(masked, {p: consts[p] for p in at})
        changed = {p for p in at if seen[p] != consts[p] and (spec, p) not in self.static_floats}
        if not changed:
            return False
        self.dynamic_floats[spec] = frozenset(self.dynamic_floats.get(spec, ())) | changed
        return True

    # -- compiling ------------------------------------------------------------
    @full_collections_deferred()
    def _compile(self, key, args, kwargs, leaves, tensors, speculative=False):
        """Trace and compile a new entry for this call and return the call's outputs; ``speculative``:
        straight to a speculative trace (a known signature whose reads took a new path)."""
        dyn_args, dyn_kwargs, spec, flat, floats = leaves
        _refuse_arrays(key, flat)
        positions = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
        out_spec = []

        def flat_function(reads):
            """``fn`` on the tensors alone, its outputs flat; ``reads`` makes the mode that sees its reads
            from data."""

            def flat_fn(*ts):
                vals = list(flat)
                for p, t in zip(positions, ts):
                    vals[p] = t
                with speculate.TracedMethods(), reads():
                    for p in floats:  # the function sees a number (a symbol the trace reads), not a tensor
                        vals[p] = vals[p].item()
                    a, kw = pytree.tree_unflatten(vals, spec)
                    it = iter(a)
                    full = [args[i] if i in self.static_nums else next(it) for i in range(len(args))]
                    kw.update({k: v for k, v in kwargs.items() if k in self.static_names})
                    out = self.fn(*full, **kw)
                out_leaves, s = pytree.tree_flatten(out)
                out_spec[:] = [s]
                return tuple(out_leaves)

            return flat_fn

        # a signature traced before whose guards failed sees a new size: trace it with symbols
        dynamic = key in self.entries and not speculative
        try:
            if speculative and floats:
                raise _FloatBranch
            with compile_lock:  # make_fx, AOTAutograd and Dynamo trace through process-wide state (fx's flags)
                if speculative:
                    entry, out = self._speculate(flat_function, tensors, out_spec)
                else:
                    entry, out = self._trace_all(flat_function, tensors, out_spec, dynamic, not floats)
        except Exception as e:  # noqa: BLE001 - untraceable code takes the torch.compile path
            if floats:  # a float the code needs as a Python number (``math.exp(alpha)``, a branch): baked again
                self.static_floats.update((spec, p) for p in floats)
                self.dynamic_floats[spec] = frozenset(self.dynamic_floats[spec] - floats)
                return self(*args, **kwargs)
            return self._fall_back(e, args, kwargs, _training(tensors))
        changed = self._arguments_changed(key, args, kwargs)
        if changed and out is not _FAILED_ASSERTION:  # (the trace ran the assignment once, as this call does)
            why = ArgumentChanged(
                f"it changes what its argument {changed} holds (an attribute assigned, a list appended to): the "
                "traced calls would not; pass the values it computes out as outputs"
            )
            return self._fall_back(why, args, kwargs, _training(tensors), entry.finish(out))
        self.entries.setdefault(key, []).append(entry)
        if sum(map(len, self.entries.values())) == 2 * _MANY_TRACES:
            warnings.warn(
                f"tailjit.jit: {_name(self.fn)} has traced {2 * _MANY_TRACES} times, for new values of its "
                "non-tensor arguments (or sizes that break its symbolic traces' guards); each new value traces "
                "again: pass a value that changes at every call as a tensor or a float",
                stacklevel=_caller_level(),
            )
        if _is_flat(args, kwargs, self.static_nums):
            # a new list, not one changed in place under the threads that walk it (a float baked into a trace
            # per value adds one per value)
            self.fast = [_fast_function(args, self.static_nums, floats, tensors, entry), *self.fast][:_MAX_FAST]
        if self.adapt and entry.adaptable and _is_simple(args, kwargs, self.static_nums):
            self._start_trial(entry, args)
        if out is _FAILED_ASSERTION:
            raise speculate.Missed(entry.call)
        if entry.speculative:  # the path this call took: a hit, so a second call down another path traces it
            entry.call.hits[0] += 1
        return entry.finish(out)

    def _start_trial(self, entry: Entry, args) -> None:
        """Measure the new ``entry`` (its fast path the newest) against eager ``fn`` (``adaptive.py``): both run a
        trial until it decides, then the chosen call; the eager fast path calls ``fn`` directly."""
        compiled, fn = entry.call, self.fn

        def eager(*tensors):  # the compiled call's flat outputs
            return tuple(pytree.tree_leaves(fn(*tensors)))

        fast = {compiled: self.fast[0], eager: _fast_function(args, (), (), args, Entry(entry.guard, fn, _same))}

        def decided(choice, chosen):
            with self._lock:  # (a new list: threads walk the old one)
                entry.call = chosen
                self.choices.append(choice)
                self.fast = [fast[chosen] if f is trying else f for f in self.fast]

        what = f"{_name(self.fn)}({', '.join(f'{str(t.dtype)[6:]}{list(t.shape)}' for t in args)})"
        entry.call = Trial(compiled, eager, what, decided)
        trying = _fast_function(args, (), (), args, entry)
        self.fast = [trying, *self.fast[1:]]

    def _trace_all(self, flat_function, tensors, out_spec, dynamic: bool, speculative: bool = True):
        """An entry for these tensors: a static trace, a symbolic one where that read values from data,
        and (with ``speculative``) a speculative one where Python branched on them.  Not for floats passed
        as tensors: a speculative trace would assert their values, and every new one would miss."""
        flat_fn = flat_function(_DataReadLimit)
        try:
            try:
                return self._trace(flat_fn, tensors, out_spec, dynamic)
            except _DATA_DEPENDENT:
                if dynamic:
                    raise
                # a static trace cannot hold a value read from data (``.item()`` as a clamp bound); a
                # symbolic one gives it an unbacked symbol
                return self._trace(flat_fn, tensors, out_spec, True)
        except Exception as err:  # noqa: BLE001 - data read where fake tensors have none, or a user error
            if not speculative:
                raise
            try:
                traced = self._speculate(flat_function, tensors, out_spec)
            except Exception as why:  # noqa: BLE001 - the first failure is the one to report
                err.not_speculated = why
                self.first_read = getattr(why, "first_read", [])
                raise err from None
            self.speculated_at = self._where(err)
            return traced

    def _speculate(self, flat_function, tensors, out_spec):
        """A static trace of the path this call takes through values read from data, each branch on them
        a runtime assertion (``speculate.py``)."""
        recording = speculate.record(flat_function, tensors)
        self.first_read = recording.first_read
        flat_fn = flat_function(functools.partial(speculate.Replay, recording.seen))
        return self._trace(flat_fn, tensors, out_spec, False, speculative=True)

    def _trace(self, flat_fn, tensors, out_spec, dynamic: bool, speculative: bool = False):
        """A compiled entry for these tensors, and its outputs on them; ``dynamic`` traces with
        symbolic sizes; ``speculative``: under ``speculate.Replay``, its assumed branches asserted."""
        training = _training(tensors)
        probe = GradProbe()
        # functionalised while traced (in-place ops become values, input mutations trailing copy_ calls), but
        # for training: the probe must see the ops autograd sees, which compile_training functionalises after
        traced = probe.around(flat_fn) if training else torch.func.functionalize(flat_fn, remove="mutations")
        mode = "symbolic" if dynamic else "fake"
        # inputs that share memory (``f(x, x)``) are traced as separate ones: a trace would read both
        # through one placeholder and serve later calls with two tensors that way
        separate = _separate(tensors)
        with InplaceCasts():  # eager's in-place dtype check, which functionalisation drops
            gm = make_fx(traced, tracing_mode=mode, decomposition_table=decompositions())(*separate)
        if dynamic:  # before compiling: a guard the entry could not check makes the trace useless
            _check_guards_expressible(n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder")
        guards = speculate.insert_asserts(gm) if speculative else None
        writes = bool(_input_writes(gm))
        placeholders = list(gm.graph.find_nodes(op="placeholder"))
        for n in _input_writes(gm):
            if torch._debug_has_internal_overlap(tensors[placeholders.index(n.args[0])]) == 1:
                raise OverlappingWrite(f"it writes into an input whose elements share memory ({n.args[0].name})")
        # AOTAutograd keeps eager's meaning of an output that sees a write into an input, and of a write into
        # inputs that share memory
        if not training and (_output_sees_mutation(gm) or (writes and separate is not tensors)):
            return self._trace_autograd(flat_fn, tensors, out_spec, dynamic, guards=guards)

        def make_report():
            report = new_report(gm.code, "jit")
            report.note = f"tailjit.jit trace ({_sizes(dynamic, guards)}) of {_name(self.fn)}"
            self.reports.append(report)
            return report

        if training:
            host, why = compile_training(gm, probe, [t.requires_grad for t in tensors], make_report)
            if why is not None:
                return self._trace_autograd(flat_fn, tensors, out_spec, dynamic, why, guards)
        else:
            host = compile_graph(gm, make_report())
        fakes = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
        guard = _guard_function(fakes, keep_strides=bool(host.externs))
        if writes:  # traced with inputs of their own memory
            guard = guard.sharing(tuple(range(len(tensors))))
        entry = Entry(guard, host.fn, _finisher(out_spec[0]), guards)
        # eager is a candidate where running it instead changes nothing the caller sees but the time: not for
        # training (its backward is another graph) nor random draws (a seeded run would depend on timings)
        entry.adaptable = not training and guards is None and not _draws_random(gm)
        try:
            return entry, host.fn(*tensors)
        except RuntimeError as err:  # a branch decided by a value the compiled graph computes otherwise
            if speculative and speculate.failed_assertion(err):
                return entry, _FAILED_ASSERTION
            raise

    def _trace_autograd(self, flat_fn, tensors, out_spec, dynamic: bool, why: str | None = None, guards=None):
        """Training through AOTAutograd; ``why`` says why tailjit's own gradients were not used."""
        from functorch.compile import aot_function

        if guards is not None:  # AOTAutograd's graphs drop the runtime assertions
            raise speculate.Unspeculable(f"it would train through AOTAutograd ({why or 'it mutates an input'})")

        captured = {}
        sizes, name = _sizes(dynamic, guards), _name(self.fn)
        route = f"; AOTAutograd because {why}" if why else ""

        def compiler(kind):
            def compile_one(g, inputs):
                if kind != "backward":
                    captured["fakes"] = list(inputs)
                    _check_guards_expressible(inputs)  # before compiling: no report of a trace not kept
                report = new_report(g.code, kind)
                report.note = f"tailjit.jit {kind} trace ({sizes}) of {name}{route}"
                self.reports.append(report)
                return compile_graph(g, report).boxed()

            return compile_one

        compiled = aot_function(
            flat_fn,
            fw_compiler=compiler("forward"),
            bw_compiler=compiler("backward"),
            inference_compiler=compiler("inference"),
            partition_fn=partition_joint,
            decompositions=decompositions(),
            keep_inference_input_mutations=True,
            dynamic=dynamic,
        )
        out = compiled(*tensors)  # compiles now; the guards come from the shape environment it used
        # for calls whose inputs share memory as these do: AOTAutograd compiles for that
        guard = _guard_function(captured["fakes"][: len(tensors)], keep_strides=True).sharing(_memory_pattern(*tensors))
        return Entry(guard, compiled, _finisher(out_spec[0]), guards), out

    def _where(self, err: Exception) -> str:
        """The line of the user's code where ``err`` arose, or, where it arose after the function ran (an
        ``UnguardedValue``), the line of the recording's first read from data."""
        where = _user_line(traceback.extract_tb(err.__traceback__), self.fn)
        return _user_line(self.first_read, self.fn) if where == _UNKNOWN else where

    def _arguments_changed(self, key, args, kwargs) -> str:
        """The type names of the non-tensor arguments whose key part the call that made ``key`` changed (a
        plain object's attribute it assigned), '' where none."""
        if type(key[0]) is not pytree.TreeSpec:  # all plain tensors
            return ""
        now, (_, _, _, leaves, _), _ = self._signature(args, kwargs)
        names = [type(x).__name__ for x, a, b in zip(leaves, key[1], now[1]) if a != b]
        names += ["static" for a, b in zip(key[2], now[2]) if a != b]
        return ", ".join(dict.fromkeys(names))

    def _fall_back(self, err: Exception, args, kwargs, training: bool, out=_MISS):
        """The trace failed: a user error (eager fails too) propagates; anything else switches this
        function's ``training`` calls (or its others) to ``torch.compile(backend="tailjit")``, once, with a
        warning; the other kind keeps its traces (a backward that cannot be traced leaves inference
        compiled).  ``out``: this call's outputs, where the trace computed them as eager does."""
        if out is _MISS and not isinstance(err, (*_DATA_DEPENDENT, TooManyDataReads, SpeculationMissed)):
            out = self.fallback_fn(*args, **kwargs)  # a user error raises here, exactly as in eager
        where = self.speculated_at if isinstance(err, SpeculationMissed) else self._where(err)
        self.fallback_reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        if "convert all Tensors to FakeTensors" in str(err):  # make_fx met a real tensor it was not given
            self.fallback_reason = (
                "it reads a tensor that is not one of its arguments (a module attribute that is not a "
                "parameter or buffer, a global that a module's forward or another module's function reads); "
                "tailjit.jit traces its arguments and the tensors, modules and numbers its own code reads from "
                "its closure, its globals and its module: pass the tensor as an argument or make it a buffer"
            )
        why = getattr(err, "not_speculated", None)
        if why is not None and str(why) != str(err):
            self.fallback_reason += f"; not traced speculatively either: {str(why).splitlines()[0]}"
        warnings.warn(
            f"tailjit.jit could not trace {_name(self.fn)} at {where} "
            f"({self.fallback_reason}); using torch.compile(backend='tailjit') for its "
            f"{'training' if training else 'inference'} calls from now on",
            stacklevel=_caller_level(),
        )
        if self.fallback is None:
            self.fallback = _compiled(self.fallback_fn)
        self.fallen.add(training)
        self.fast = [fast for fast in self.fast if fast.training is not training]
        return self.fallback(*args, **kwargs) if out is _MISS else out


def _sizes(dynamic: bool, guards: int | None = None) -> str:
    sizes = "symbolic sizes" if dynamic else "static sizes"
    return sizes if guards is None else f"{sizes}, speculating on {guards} assertions on values read from data"


def _compiled(fn):
    """``torch.compile(fn, backend="tailjit")``, the path a function that cannot be traced takes.  (Importing this
    module runs the package's ``__init__``, which registers the backend.)"""
    return torch.compile(fn, backend="tailjit")


def _name(fn) -> str:
    return type(fn).__qualname__ if isinstance(fn, torch.nn.Module) else getattr(fn, "__qualname__", repr(fn))


def _data_dependent_errors() -> tuple:
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    return (GuardOnDataDependentSymNode, DataDependentOutputException, DynamicOutputShapeException)


_DATA_DEPENDENT = _data_dependent_errors()

#: A trace stops once the function has read more than this many values from data (``.item()``, ``int(t)``:
#: ``n = lengths[b].item()`` in a loop over a batch).  Each is an unbacked symbol, and so is each size
#: computed from it; torch's reasoning about them grows with every step (``reverse_padded_sequence`` traced
#: 16 sequences in 1.3 s, 128 in 30 s, 2048 in 230 s).  The function then takes the torch.compile path,
#: whose graph break runs such a loop eagerly.
MAX_DATA_READS = 32


class TooManyDataReads(RuntimeError):
    """The traced function read more than ``MAX_DATA_READS`` values from data."""


class OverlappingWrite(RuntimeError):
    """The traced function writes into an input whose elements share memory (an expanded tensor): the
    functionalised trace writes each element apart, where eager's writes land on the shared memory."""


class SpeculationMissed(RuntimeError):
    """A speculatively traced function's values read from data took other paths too often."""


class _DataReadLimit(TorchDispatchMode):
    """Counts the values a trace reads from data (``aten._local_scalar_dense``)."""

    def __init__(self):
        super().__init__()
        self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads += 1
            if self.reads > MAX_DATA_READS:
                raise TooManyDataReads(
                    f"it reads more than {MAX_DATA_READS} values from data (.item()), each a symbolic size "
                    "that makes the trace slower"
                )
        return func(*args, **(kwargs or {}))


def _separate(tensors: list) -> list:
    """``tensors``, each that shares memory with an earlier one replaced by a copy of its own (the list
    itself where none does)."""
    pattern = _memory_pattern(*tensors)
    if pattern == tuple(range(len(tensors))):
        return tensors
    return [t if first == i else speculate.copy_of(t) for i, (t, first) in enumerate(zip(tensors, pattern))]


def _input_writes(gm) -> list:
    """The ``copy_`` nodes by which the (functionalised) trace writes into its inputs."""
    copy_ = torch.ops.aten.copy_.default
    return [n for n in gm.graph.nodes if n.target is copy_ and n.args[0].op == "placeholder"]


def _memory_pattern(*tensors) -> tuple:
    """Per tensor, the first of ``tensors`` that shares its memory (its own index where none does)."""
    first: dict = {}
    return tuple(first.setdefault(t.untyped_storage().data_ptr(), i) for i, t in enumerate(tensors))


def _output_sees_mutation(gm) -> bool:
    """Whether an output shares memory with an input the function mutates (``x.add_(1); return x[0]``):
    the functionalised trace returns the new value's view, not the input's, so AOTAutograd takes it."""
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    outputs = []
    torch.fx.node.map_arg(out.args, outputs.append)

    written = set()
    for n in _input_writes(gm):
        written |= {node_storage(n.args[0]), node_storage(n.args[1])}
    return any(node_storage(o) in written for o in outputs if node_storage(o) is not None)


class Entry:
    """One compiled trace: its size guard, its host function and the output structure.  A speculative
    trace's ``call`` raises :class:`speculate.Missed` when one of its runtime assertions fails."""

    __slots__ = ("guard", "call", "finish", "speculative", "adaptable")

    def __init__(self, guard, call, finish, guards: int | None = None):
        self.guard = guard
        self.speculative = guards is not None
        self.call = _guarded(call) if self.speculative else call
        self.finish = finish
        self.adaptable = False  # eager may take its place (``JitFunction._start_trial``)


def _guarded(call):
    """A speculative trace's ``call``: :class:`speculate.Missed` where one of its runtime assertions
    fails, its outputs where all hold (counted in ``hits``)."""
    hits = [0]

    def guarded(*tensors):
        try:
            out = call(*tensors)
        except RuntimeError as err:
            if speculate.failed_assertion(err):
                raise speculate.Missed(guarded) from None
            raise
        hits[0] += 1
        return out

    guarded.hits = hits
    return guarded


_FAILED_ASSERTION = object()  # a speculative trace's first call failed one of its runtime assertions

_is_compiling = torch.compiler.is_compiling


def _fast_function(args, static_nums, floats, tensors, entry: Entry):
    """One generated function for positional calls like ``args`` (plain tensors and numbers, strings or None):
    the signature test (a tensor's type, dtype, rank, requires_grad and grad mode where it matters; a baked
    value's type and value; a float passed as a tensor, its type), the size guards, the call and the output
    structure, with no per-call allocation beyond the call itself (and a float's 0-d tensor)."""
    n = len(args)
    params = ", ".join(f"a{i}" for i in range(n))
    ns = dict(entry.guard.namespace)
    ns.update(Tensor=torch.Tensor, Parameter=torch.nn.Parameter, MISS=_MISS, call=entry.call, finish=entry.finish,
              grad=torch.is_grad_enabled, number=_float_tensor, state=global_state, dtype=torch.get_default_dtype,
              autocast=_any_autocast, DTYPE=torch.get_default_dtype(), STATE=global_state())  # fmt: skip
    sig, passed, leaf = [], [], 0
    for i, a in enumerate(args):
        if type(a) not in _PLAIN:
            if i not in static_nums and leaf in floats:
                sig.append(f"type(a{i}) is not float")
                passed.append(f"number(a{i})")
            else:
                sig.append(captures.value_test(f"a{i}", a, ns))
            leaf += i not in static_nums
            continue
        ns[f"D{i}"] = a.dtype
        plain = f"type(a{i}) is not Tensor and type(a{i}) is not Parameter"  # (a module's, ``JitModule``)
        sig.append(f"{plain} or a{i}.dtype is not D{i} or a{i}.ndim != {a.ndim}")
        sig.append(f"a{i}.requires_grad is not {a.requires_grad}")
        passed.append(f"a{i}")
        leaf += 1
    # the guard's expressions name the trace's tensors t0, t1, ...
    lines = ["def fast(*args):", f"    if len(args) != {n}: return MISS", f"    {params}{',' if n == 1 else ''} = args"]
    if n:
        lines.append(f"    if {' or '.join(sig)}: return MISS")
    lines += [f"    t{k} = {p}" for k, p in enumerate(passed)]
    # the inference trace serves requires-grad inputs only under no_grad, the AOT trace only with grad on
    if any(t.requires_grad for t in tensors):
        lines.append(f"    if grad() is not {torch.is_grad_enabled()}: return MISS")
    # (the common case, no autocast, in two calls)
    lines.append("    if state() != STATE: return MISS" if _any_autocast() else
                 "    if autocast() or dtype() is not DTYPE: return MISS")  # fmt: skip
    lines += entry.guard.lines
    lines.append(f"    if not ({entry.guard.condition}): return MISS")
    call = f"call({', '.join(f't{k}' for k in range(len(passed)))})"
    lines.append(f"    return {call}" if entry.finish is _same else f"    return finish({call})")
    exec("\n".join(lines), ns)  # noqa: S102
    ns["fast"].training = _training(tensors)
    return ns["fast"]


#: Generated fast paths kept per function, the newest first.
_MAX_FAST = 8


def _float_tensor(x: float) -> torch.Tensor:
    """A float argument passed as a 0-d float64 tensor (``JitFunction.dynamic_floats``), through numpy: 0.8 us
    against 1.3 for ``torch.full`` and 3.2 for ``torch.tensor``."""
    return torch.from_numpy(np.array(x))


def _same(out):
    """The finish of a call whose outputs are the function's own (eager's)."""
    return out


def _draws_random(gm) -> bool:
    return any(torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()) for n in gm.graph.nodes)


def _finisher(spec):
    """Output leaves (a tuple) back to the function's output structure."""
    if spec.is_leaf():
        return operator.itemgetter(0)
    if spec.type is tuple and all(c.is_leaf() for c in spec.children()):
        return tuple
    return lambda out: pytree.tree_unflatten(list(out), spec)


def _training(tensors) -> bool:
    """Whether a call with these tensors trains: grad mode is on and one of them requires grad."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _training_call(args, kwargs) -> bool:
    """``_training`` of a call's tensors, without building its signature."""
    if not kwargs and all(type(a) in _PLAIN for a in args):
        return _training(args)
    return _training([x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)])


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _is_simple(args, kwargs, static_nums) -> bool:
    return not kwargs and not static_nums and all(type(a) in _PLAIN for a in args)


#: Arguments a generated fast path tests by value.
_SCALARS = (bool, int, float, str, type(None))


def _is_flat(args, kwargs, static_nums) -> bool:
    """A positional call of plain tensors and numbers (strings, None; only those where static): a generated fast
    path can test it."""
    return not kwargs and all(type(a) in _SCALARS or (type(a) in _PLAIN and i not in static_nums)
                              for i, a in enumerate(args))  # fmt: skip


def _simple_key(args):
    """The signature of a call whose arguments are all plain tensors."""
    key = [torch.is_grad_enabled(), global_state()]
    for a in args:
        key += (a.dtype, a.ndim, a.requires_grad)
    return tuple(key)


def global_state() -> tuple:
    """What a trace bakes in from torch's global settings besides grad mode: the default dtype (``torch.ones``'s)
    and autocast's state (the dtype it casts each op to), as Dynamo's global-state guard keys them."""
    if not _any_autocast():
        return (torch.get_default_dtype(),)
    return (torch.get_default_dtype(), torch.is_autocast_cache_enabled(),
            *((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in _AUTOCAST_DEVICES))  # fmt: skip


_any_autocast = torch._C._is_any_autocast_enabled
_AUTOCAST_DEVICES = ("cpu", "cuda")


def _tensor_key(tensors) -> tuple:
    return tuple((t.dtype, t.ndim, t.requires_grad, type(t)) for t in tensors)


def _hashable(x):
    """A non-tensor argument's part of the key: its type and value, or a plain object's contents (an object
    of the user's classes or a namespace: the trace bakes in what the function reads of it, by attribute, in a
    function it is passed to or in its methods, so what it holds keys the trace, not its identity)."""
    if captures.plain_object(x):
        return captures.frozen(x)  # (an array inside is refused before a trace: ``_refuse_arrays``)
    try:
        hash(x)
    except TypeError:
        raise TypeError(
            f"tailjit.jit: a non-tensor argument must be hashable to be static, got {type(x).__name__}"
        ) from None
    return captures.value_key(x)


def _refuse_arrays(key, flat: list) -> None:
    """Raise where a plain object argument holds a numpy array (its key part says so): a trace would bake in
    its contents, which may change in place (a bare array is refused as unhashable)."""
    if type(key[0]) is not pytree.TreeSpec:  # all plain tensors
        return
    holders = [type(x).__name__ for x, part in zip(flat, key[1]) if captures.holds_array(part)]
    holders += [f"static {i}" for i, part in key[2] if captures.holds_array(part)]
    if holders:
        raise TypeError(
            f"tailjit.jit: the argument {holders[0]} holds a numpy array, whose contents a trace would bake in "
            "(they may change in place): pass it as a tensor, torch.from_numpy(array) shares its memory"
        )


_TERM = re.compile(r"L\['t(\d+)'\]\.(size|stride)\(\)\[(\d+)\]")
_OFFSET = re.compile(r"L\['t(\d+)'\]\.storage_offset\(\)")


class _FloatBranch(Exception):
    """A float passed as a tensor meets a path traced speculatively: it is baked into the traces again."""


class _Guard:
    """The size assumptions of a trace: local bindings, a condition over them, and a callable."""

    def __init__(self, n: int, lines: list[str], condition: str, namespace: dict):
        self.lines, self.condition, self.namespace = lines, condition, namespace
        params = ", ".join(f"t{i}" for i in range(n))
        ns = dict(namespace)
        exec("\n".join([f"def guard({params}):", *lines, f"    return {condition}"]), ns)  # noqa: S102
        self.check = ns["guard"]

    def sharing(self, pattern: tuple) -> _Guard:
        """This guard, and the inputs share memory as ``pattern`` (``_memory_pattern``) says; over all the
        inputs (AOTAutograd's guard reads each memory once)."""
        if len(pattern) < 2:
            return self
        term = f"memory_pattern({', '.join(f't{i}' for i in range(len(pattern)))}) == {pattern!r}"
        namespace = dict(self.namespace, memory_pattern=_memory_pattern)
        return _Guard(len(pattern), self.lines, f"({self.condition}) and {term}", namespace)


def _guard_function(fakes, keep_strides: bool) -> _Guard:
    """The sizes the trace relied on, as a check over the traced tensors."""
    from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

    fakes = list(fakes)
    env = next((s.node.shape_env for f in fakes if isinstance(f, torch.Tensor) for s in f.shape
                if isinstance(s, torch.SymInt)), None)  # fmt: skip
    if env is None:  # a static trace: these exact sizes (and strides, as for symbolic traces)
        terms = [f"t{i}.shape == {tuple(f.shape)!r}" for i, f in enumerate(fakes)]
        if keep_strides:
            terms += [f"t{i}.stride() == {f.stride()!r}" for i, f in enumerate(fakes)]
        return _Guard(len(fakes), [], " and ".join(terms) or "True", {})
    code = env.produce_guards_expression(fakes, ignore_static=False) or "True"
    terms = [t.strip() for t in code.split(" and ")]
    if not keep_strides:  # every node lowered: kernels index any strides, so only sizes matter
        terms = [t for t in terms if ".stride()" not in t and "storage_offset()" not in t]
    body = " and ".join(terms) or "True"
    used = sorted({(int(m.group(1)), m.group(2)) for m in _TERM.finditer(body)})
    body = _TERM.sub(lambda m: f"{'s' if m.group(2) == 'size' else 'st'}{m.group(1)}[{m.group(3)}]", body)
    body = _OFFSET.sub(lambda m: f"t{m.group(1)}.storage_offset()", body)
    lines = [f"    {'s' if k == 'size' else 'st'}{i} = t{i}.{'shape' if k == 'size' else 'stride()'}" for i, k in used]
    return _Guard(len(fakes), lines, body, dict(SYMPY_INTERP))


class ArgumentChanged(RuntimeError):
    """The traced function changed what a non-tensor argument holds (``cfg.calls += 1``): eager does that at
    every call, the traced calls would not."""


class UnguardedValue(RuntimeError):
    """A symbolic trace branched on the value of a 0-d input, which its size guards cannot check."""


def _check_guards_expressible(fakes) -> None:
    """Raise :class:`UnguardedValue` where the trace guarded on the value of a 0-d input: a symbolic trace
    reads a 0-d int64 or float64 input's ``item()`` as a symbol of its own, and ``produce_guards_expression``
    leaves out the guards on it (``if t.item() == 2``), so every later value took the traced branch: a
    silent wrong answer.  The speculative trace asserts such branches."""
    from torch._dynamo.source import CallMethodItemSource
    from torch._guards import detect_fake_mode

    mode = detect_fake_mode(list(fakes))
    env = mode.shape_env if mode is not None else None
    for g in env.guards if env is not None else ():
        for u in g.expr.free_symbols:
            sources = env.var_to_sources.get(u, ())
            if sources and all(isinstance(src, CallMethodItemSource) for src in sources):
                raise UnguardedValue(
                    f"its trace branched on the value of a 0-d input ({g.expr}), which size guards cannot check"
                )


def _caller_level() -> int:
    """``warnings.warn``'s stacklevel, from its caller here, of the first frame outside this file: the
    user's call, however deep the path to the warning."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1
    return level


_UNKNOWN = "an unknown line"


def _user_line(frames, fn) -> str:
    """``file:line (source)`` of the innermost frame of the user's code among ``frames`` (a traceback's, or
    a stack's, ``traceback.FrameSummary`` list)."""
    code = getattr(inspect.unwrap(fn), "__code__", None)  # a captures-lifted function's own code is tailjit's
    home = code.co_filename if code else None
    pick = None
    for f in frames:
        if f.filename == home or not any(p in f.filename for p in ("/torch/", "/tailjit/", "<frozen", "<string>")):
            pick = f
    if pick is None:
        return _UNKNOWN
    return f"{pick.filename}:{pick.lineno} ({(pick.line or '').strip()})"
