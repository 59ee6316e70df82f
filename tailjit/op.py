"""``@tailjit.op``: a Python function that builds tensor expressions, as a torch operator.

::

    @tailjit.op
    def scaled_tanh(x, alpha):              # x: a te placeholder, alpha: a Python float
        return te.compute(x.shape, lambda *i: te.tanh(x[i] * alpha), name="scaled_tanh")

    y = scaled_tanh(torch_x, 0.5)           # built once per signature, differentiable

Tensor arguments arrive as placeholders of the caller's rank and dtype with
symbolic sizes (``<arg>_<dim>``), so one build serves every shape.  Sizes
that are equal in a call share one variable (named after the first of
them), as Dynamo's duck sizing does: the build is per pattern of equal
sizes, and a gradient or a merged loop nest knows that ``cell``'s rows and
``gates``' rows are the same loop.  Every
other argument (int, float, bool, str, None, tuples and lists of those) is
static: part of the cache key and passed to the function as its Python value.

Eagerly, a call runs the built kernel, which joins autograd when an input
requires grad (see :class:`tailjit.runtime.kernel.Kernel`).  Inside
``torch.compile`` the call is one opaque custom op (``tailjit::<name>_<fingerprint>``)
with a fake implementation that computes the output shapes from the tensor
expressions, and a registered backward that is itself a custom op running
the compiled gradient kernel.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import itertools
import re
from pathlib import Path
from typing import NamedTuple

import torch

from tailjit import te
from tailjit.api import build
from tailjit.runtime.kernel import differentiable_call, gradient_spec, tracing
from tailjit.te import dtypes
from tailjit.te.expr import Binary, Const, Expr, SizeVar, TEError, Tensor

_registered: set[str] = set()  # the custom ops' names in this process
_STATIC_TYPES = (int, float, bool, str, type(None))

#: Each tailjit op's overloads (forward and backward) -> the Python function behind it.  Graphs that
#: tailjit compiles call that function directly: the same arguments and result, without the
#: dispatcher's round trip (about 12 us of a 23 us call for an LSTM cell's 32x128 gates).
DIRECT: dict = {}

#: How many argument signatures (shapes included) an op remembers for its per-call lookup.
FAST_KEYS = 256


class Program(NamedTuple):
    """The tensor-expression program of one signature of an op."""

    inputs: list[Tensor]  # placeholders, one per tensor argument, in order
    outputs: list[Tensor]  # the computes the function returned
    # reductions the kernel writes after the outputs for the backward to read (Kernel.n_saved)
    saved: tuple[Tensor, ...] = ()


class _Entry:
    def __init__(self, program: Program, name: str):
        self.program = program
        self.name = name
        self._kernel = None

    @property
    def kernel(self):
        if self._kernel is None:
            prog = self.program
            self._kernel = build(prog.outputs + list(prog.saved), prog.inputs, name=self.name)
            self._kernel.mark_saved(len(prog.saved))
        return self._kernel


class Op:
    """A reusable, differentiable torch operator defined by tensor expressions (see the module doc)."""

    def __init__(self, fn, name: str | None = None):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.op_name = name or getattr(fn, "__name__", "op")
        params = list(inspect.signature(fn).parameters.values())
        for p in params:
            if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                raise TypeError(f"@tailjit.op {self.op_name!r}: only positional parameters are supported, got {p}")
        self._names = tuple(p.name for p in params)
        self._defaults = tuple((p.default is not p.empty, None if p.default is p.empty else p.default) for p in params)
        self._entries: dict[tuple, _Entry] = {}
        self._fast: dict[tuple, _Entry] = {}  # the same entries under __call__'s cheap key
        self._static_keys: dict[str, tuple] = {}
        ident = re.sub(r"\W", "_", self.op_name) or "op"
        base = name = f"{ident}_{_fingerprint(fn)}"
        for k in itertools.count(1):
            if name not in _registered:
                break
            name = f"{base}_{k}"  # the same function made an op twice
        _registered.add(name)
        self._qualname = f"tailjit::{name}"
        self._fwd, self._bwd = _register(self)

    # -- calling ------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        args = self._bind(args, kwargs)
        if torch.compiler.is_compiling() or tracing():  # one custom op in the trace: its tensors hold no data
            is_tensor = tuple(isinstance(a, torch.Tensor) for a in args)
            tensors = [a for a, t in zip(args, is_tensor) if t]
            static = tuple(0 if t else a for a, t in zip(args, is_tensor))
            key = self._key(is_tensor, static)
            outs = self._fwd(tensors, key)[: len(self._entry_for_key(tensors, key).program.outputs)]
            return outs[0] if len(outs) == 1 else tuple(outs)
        # Eagerly this runs once per operator call of a training step, so the signature's entry
        # is found from a cheap key (dtype and shape of each tensor, type and value of the rest),
        # and a call that needs autograd goes straight to it rather than through the C entry's
        # fallback to Python.
        try:
            key = tuple((a.dtype, a.shape) if isinstance(a, torch.Tensor) else (type(a), a) for a in args)
            entry = self._fast.get(key)
        except TypeError:  # an unhashable static argument (a list): the general path
            key, entry = None, None
        if entry is None:
            entry = self._entry(args, tuple(isinstance(a, torch.Tensor) for a in args))
            if key is not None:
                if len(self._fast) >= FAST_KEYS:  # many shapes (sequence lengths): their entries stay in _entries
                    self._fast.clear()
                self._fast[key] = entry
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        kernel = entry.kernel
        if (
            torch.is_grad_enabled()
            and any(t.requires_grad for t in tensors)
            and all(type(t) is torch.Tensor or type(t) is torch.nn.Parameter for t in tensors)
        ):
            res = differentiable_call(kernel, tensors)
        else:  # no grad needed, or other tensor types: the entry decides (views copied here, not by its fallback)
            res = kernel(*kernel.readable(tensors))
        if kernel.n_saved:  # the saved reductions stay with autograd
            n = len(entry.program.outputs)
            res = res[0] if n == 1 else res[:n]
        return res

    def program(self, *args, **kwargs) -> Program:
        """The TE program for the signature of these example arguments (torch tensors, or
        anything with ``ndim`` and ``dtype``, stand for tensors): placeholders and outputs."""
        args = self._bind(args, kwargs)
        return self._entry(args, tuple(_is_tensor_like(a) for a in args)).program

    def kernel(self, *args, **kwargs):
        """The built kernel for the signature of these arguments (built on first use)."""
        args = self._bind(args, kwargs)
        return self._entry(args, tuple(_is_tensor_like(a) for a in args)).kernel

    def _bind(self, args: tuple, kwargs: dict) -> tuple:
        if not kwargs and len(args) == len(self._names):
            return args
        if len(args) > len(self._names):
            raise TypeError(f"{self.op_name}() takes {len(self._names)} argument(s), got {len(args)}")
        out = list(args)
        for name, (has_default, default) in zip(self._names[len(args) :], self._defaults[len(args) :]):
            if name in kwargs:
                out.append(kwargs[name])
            elif has_default:
                out.append(default)
            else:
                raise TypeError(f"{self.op_name}() missing argument {name!r}")
        for name in kwargs:
            if name not in self._names or self._names.index(name) < len(args):
                raise TypeError(f"{self.op_name}() got an unexpected or repeated argument {name!r}")
        return tuple(out)

    def _key(self, is_tensor: tuple, static: tuple) -> str:
        """A string naming the static arguments (Dynamo calls this at trace time)."""
        static = tuple(None if t else _static(n, a, self.op_name) for n, a, t in zip(self._names, static, is_tensor))
        key = repr((is_tensor, static))
        self._static_keys[key] = (is_tensor, static)
        return key

    # What torch.compiler.assume_constant_result does (Dynamo runs the function at trace time
    # and uses its result as a constant), without importing torch._dynamo with tailjit (~0.8 s).
    _key._dynamo_marked_constant = True

    # -- programs and kernels --------------------------------------------------------------------
    def _entry(self, args: tuple, is_tensor: tuple, duck: bool = True) -> _Entry:
        """The entry of this signature; with ``duck``, of its pattern of equal sizes too, where the tensors
        have sizes (not example arguments with only ``ndim``)."""
        sig = []
        shapes = [getattr(a, "shape", None) for a, t in zip(args, is_tensor) if t] if duck else []
        classes = iter(_size_classes(shapes) if shapes and all(map(_concrete, shapes)) else ())
        for name, a, t in zip(self._names, args, is_tensor):
            if t:
                sig.append(("tensor", a.ndim, dtypes.dtype(a.dtype).name, next(classes, None)))
            else:
                sig.append(("static", _static(name, a, self.op_name)))
        sig = tuple(sig)
        entry = self._entries.get(sig)
        if entry is None:
            entry = _Entry(self._make_program(sig), self.op_name)
            self._entries[sig] = entry
        return entry

    def _make_program(self, sig: tuple) -> Program:
        values, inputs, sizes = [], [], {}
        for name, s in zip(self._names, sig):
            if s[0] == "tensor":
                own = [te.var(f"{name}_{d}") for d in range(s[1])]
                shape = tuple(sizes.setdefault(c, v) for c, v in zip(s[3], own)) if s[3] else tuple(own)
                p = te.placeholder(shape, s[2], name=name)
                inputs.append(p)
                values.append(p)
            else:
                values.append(s[1])
        res = self.fn(*values)
        outs = list(res) if isinstance(res, (tuple, list)) else [res]
        if not outs or not all(isinstance(o, Tensor) and not o.is_placeholder for o in outs):
            raise TEError(f"@tailjit.op {self.op_name!r} must return a te compute or a tuple of computes, got {res!r}")
        return Program(inputs, outs, _saved_reductions(inputs, outs, self.op_name))

    def _entry_for_key(self, tensors: list, key: str) -> _Entry:
        is_tensor, static = self._static_keys[key]
        it = iter(tensors)
        args = tuple(next(it) if t else s for t, s in zip(is_tensor, static))
        # inside torch.compile sizes are symbolic: the custom op's program has a variable per size
        return self._entry(args, is_tensor, duck=False)

    def __repr__(self) -> str:
        return f"<tailjit.op {self.op_name} ({self._qualname})>"


def _size_classes(shapes: list) -> list[tuple]:
    """Per tensor, per dimension: the (tensor, dimension) of the first size equal to it."""
    first: dict[int, tuple[int, int]] = {}
    return [tuple(first.setdefault(n, (k, d)) for d, n in enumerate(shape)) for k, shape in enumerate(shapes)]


def _concrete(shape) -> bool:
    return shape is not None and all(type(n) is int for n in shape)


def op(fn=None, *, name: str | None = None):
    """Decorator: turn a function from te placeholders (and static Python values) to te
    computes into a differentiable torch operator; see :mod:`tailjit.op`."""
    if fn is None:
        return lambda f: Op(f, name)
    return Op(fn, name)


def _saved_reductions(inputs: list[Tensor], outputs: list[Tensor], name: str) -> tuple[Tensor, ...]:
    """The reductions the gradient (for every float input) would recompute that the kernel computes
    into buffers anyway: written as extra outputs, they save the backward those loops (a capsule
    routing's softmax sums and squash norms)."""
    mask = [t.dtype.is_float for t in inputs]
    if not any(mask) or not any(o.dtype.is_float for o in outputs):
        return ()
    try:
        _, saved = gradient_spec(outputs, inputs, name, mask, save_buffered=True)
    except TEError:  # not differentiable (a max scatter): its backward raises when it is asked for
        return ()
    return tuple(saved)


@functools.cache
def _tailjit_digest() -> bytes:
    """A digest of tailjit's own sources."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.rglob("*.py")):
        h.update(path.read_bytes())
    return h.digest()


def _fingerprint(fn) -> str:
    """What an op's traced behaviour depends on, for its custom op's name: Inductor's caches key a
    compiled graph by its ops' names and arguments, not by the Python behind them, so a graph traced
    before the op's function (its file) or tailjit changed must not be found again."""
    h = hashlib.sha256(_tailjit_digest())
    h.update(f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}".encode())
    try:
        h.update(Path(inspect.getsourcefile(fn)).read_bytes())
    except (TypeError, OSError):  # no source file (a REPL): its code object
        code = getattr(fn, "__code__", None)
        h.update(repr((code.co_code, code.co_consts, code.co_names)).encode() if code else b"")
    return h.hexdigest()[:12]


def _is_tensor_like(a) -> bool:
    return isinstance(a, torch.Tensor) or (hasattr(a, "ndim") and hasattr(a, "dtype") and not isinstance(a, Tensor))


def _static(name: str, a, op_name: str):
    """A static argument as a hashable Python value (lists become tuples)."""
    if isinstance(a, _STATIC_TYPES):
        return a
    if isinstance(a, (tuple, list)):
        return tuple(_static(name, v, op_name) for v in a)
    raise TypeError(
        f"@tailjit.op {op_name!r}: argument {name!r} is a {type(a).__name__}; pass torch tensors, or ints, "
        "floats, bools, strings, None and tuples of them (which are static: part of the cache key)"
    )


def _size(e: Expr, env: dict):
    """Evaluate a size expression over (possibly symbolic) integers."""
    if isinstance(e, Const):
        return e.value
    if isinstance(e, SizeVar):
        return env[e]
    if isinstance(e, Binary):
        a, b = _size(e.a, env), _size(e.b, env)
        ops = {
            "add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
            "floordiv": lambda: a // b if not (isinstance(b, int) and b == 0) else 0,
            "mod": lambda: a % b if not (isinstance(b, int) and b == 0) else 0,
            "maximum": lambda: torch.sym_max(a, b), "minimum": lambda: torch.sym_min(a, b),
        }  # fmt: skip
        if e.op in ops:
            return ops[e.op]()
    raise TEError(f"cannot evaluate size {e!r}")  # pragma: no cover - as_size admits only these


def _register(o: Op):
    """The forward and backward custom ops of ``o``."""
    from torch.library import custom_op

    @custom_op(o._qualname, mutates_args=())
    def forward(tensors: list[torch.Tensor], key: str) -> list[torch.Tensor]:
        res = o._entry_for_key(tensors, key).kernel._call(*tensors)
        return list(res) if isinstance(res, tuple) else [res]

    @forward.register_fake
    def _(tensors, key):
        prog = o._entry_for_key(tensors, key).program
        env = {}
        for p, t in zip(prog.inputs, tensors):
            for d, s in enumerate(p.shape):
                if isinstance(s, SizeVar):
                    env.setdefault(s, t.shape[d])
        return [
            tensors[0].new_empty([_size(s, env) for s in out.shape], dtype=out.dtype.torch)
            for out in (*prog.outputs, *prog.saved)
        ]

    @custom_op(o._qualname + "_backward", mutates_args=())
    def backward(
        tensors: list[torch.Tensor], outputs: list[torch.Tensor], grads: list[torch.Tensor], key: str, mask: int
    ) -> list[torch.Tensor]:
        bits = tuple(bool(mask >> k & 1) for k in range(len(tensors)))
        backward = o._entry_for_key(tensors, key).kernel.backward(bits)
        res = backward((*tensors, *outputs, *grads), len(tensors) + len(outputs))
        # a custom op's outputs may not alias its inputs: an output gradient handed on as it is is copied
        return [g.clone(memory_format=torch.contiguous_format) if p is not None else g
                for g, p in zip(res, backward.through)]  # fmt: skip

    @backward.register_fake
    def _(tensors, outputs, grads, key, mask):
        # contiguous, as the gradient kernel returns them (empty_like would keep an input's strides)
        return [t.new_empty(t.shape) for k, t in enumerate(tensors) if mask >> k & 1]

    def setup_context(ctx, inputs, output):
        tensors, key = inputs
        prog = o._entry_for_key(tensors, key).program
        # the float outputs, then the saved reductions: the gradient kernel's inputs after the op's own
        floats = [out for out, t in zip(output, (*prog.outputs, *prog.saved)) if t.dtype.is_float]
        ctx.key = key
        ctx.n = len(tensors)
        ctx.float_outputs = [t.dtype.is_float for t in prog.outputs]
        ctx.n_heads = sum(ctx.float_outputs)
        ctx.mask = sum(1 << k for k, t in enumerate(tensors) if t.requires_grad and t.dtype.is_floating_point)
        ctx.save_for_backward(*tensors, *floats)

    def backward_rule(ctx, grads):
        saved = ctx.saved_tensors
        tensors, outs = list(saved[: ctx.n]), list(saved[ctx.n :])
        if not ctx.mask:
            return [None] * ctx.n, None
        heads = [g for g, f in zip(grads, ctx.float_outputs) if f]  # none for the saved reductions
        heads = [torch.zeros_like(o) if g is None else g for g, o in zip(heads, outs[: ctx.n_heads])]
        res = list(backward(tensors, outs, heads, ctx.key, ctx.mask))
        return [res.pop(0) if ctx.mask >> k & 1 else None for k in range(ctx.n)], None

    forward.register_autograd(backward_rule, setup_context=setup_context)
    for op_def in (forward, backward):
        DIRECT[op_def._opoverload] = op_def._init_fn
    return forward, backward
