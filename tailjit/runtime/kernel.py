"""The callable returned by :func:`tailjit.build`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np
import torch

from tailjit.fusion import LoopProgram, partition, row_strided_inputs
from tailjit.runtime.compiler import BuildInfo
from tailjit.schedule import Schedule
from tailjit.te.autodiff import backward_program
from tailjit.te.expr import Load


@dataclass(frozen=True)
class KernelInfo:
    """One generated loop nest, for ``explain``."""

    name: str  # the tensor it materialises
    role: str  # "output" or "temporary", and what kind of compute when not a plain one
    fused: tuple[str, ...]  # computes inlined into it
    schedule: Schedule
    body: str  # the fused expression; a scatter's copy of its base ("" when its buffer is reused)
    update: str = ""  # a scatter's update loop, producers inlined
    # kernels of the same domain computed in this loop nest first (tailjit.loop_merge): name, stored, body,
    # the computes inlined into it
    merged: tuple[tuple[str, bool, str, tuple[str, ...]], ...] = ()

    def describe(self) -> str:
        fused = f" <- fused {', '.join(self.fused)}" if self.fused else ""
        lines = [f"{self.name} ({self.role}){fused}"]
        if self.body:
            lines.append(f"    loops: {self.schedule.describe()}")
            for name, stored, body, inlined in self.merged:
                notes = ([] if stored else ["a local: no buffer"]) + (
                    [f"fused {', '.join(inlined)}"] if inlined else []
                )
                said = f" ({', '.join(notes)})" if notes else ""
                lines.append(f"    first: {name}{said} = {body}")
            lines.append(f"    body:  {self.body}")
        else:
            lines.append("    copy:  none, the base was computed in this buffer")
        if self.update:
            lines.append(f"    update (serial, row-major): {self.update}")
        return "\n".join(lines)


def _role(k, output: bool) -> str:
    t = k.tensor
    role = "output" if output else "temporary"
    if t.is_scatter:
        role += f", scatter ({k.update.combine})"
    if t.is_scan:
        role += f", scan along {t.axes[t.scan_axis].name}{' in reverse' if t.reverse else ''}"
    if k.into is not None:
        role += f", computed in the buffer of {k.into.name!r}"
    if k.side:
        role += f"; also writes {', '.join(repr(u.tensor.name) for u in k.side)}, computed in it"
    if k.merged:
        role += f"; hosts {', '.join(repr(m.tensor.name) for m in k.merged)}, computed first at each point"
    return role


class Kernel:
    """A compiled tensor-expression program.

    Call it with torch CPU tensors (any strides) or numpy arrays, in the order
    of ``inputs``; it returns the output (or a tuple of outputs), of the same
    kind as the inputs.  ``out=`` takes preallocated output buffers.

    When an input requires grad and grad mode is on, the outputs are part of
    the autograd graph: their backward runs a gradient kernel derived with
    :func:`tailjit.te.gradient`, built on the first backward for each set of
    inputs that need a gradient and reused for every size after that.
    """

    def __init__(self, name: str, program: LoopProgram, schedules: dict[str, Schedule], source: str,
                 module, build: BuildInfo, build_seconds: float, builder: Callable):  # fmt: skip
        self.name = name
        self._builder = builder  # tailjit.api.build, for the backward: the API sits above the runtime
        self.source = source
        self.build_info = build
        self.build_seconds = build_seconds
        self.input_names = [t.name for t in program.inputs]
        self.output_names = [t.name for t in program.outputs]
        self._inputs = program.inputs
        self._outputs = program.outputs
        self._call = module.call_plain  # never diverts to autograd: the Python side decided
        self._grad_kernels: dict[tuple[bool, ...], Backward] = {}
        self.n_saved = 0  # see mark_saved
        # per-call facts for the autograd path, computed once
        self._float_inputs = tuple(t.dtype.is_float for t in program.inputs)
        rows = row_strided_inputs(program)
        self._row_strided = tuple(t in rows for t in program.inputs)
        self._float_outputs = tuple(t.dtype.is_float for t in program.outputs)
        self._all_float_outputs = all(self._float_outputs)
        self._differentiable = self._float_outputs  # see mark_cut
        self._all_differentiable = self._all_float_outputs
        module.set_fallback(self._fallback)
        outs = {id(t) for t in program.outputs}
        self.kernels = [
            KernelInfo(
                k.name,
                _role(k, id(k.tensor) in outs),
                tuple(k.fused),
                schedules[k.name],
                repr(k.body) if k.copy else "",
                repr(k.update) if k.update is not None else "",
                tuple((m.tensor.name, m.store, repr(m.body), m.fused) for m in k.merged),
            )  # fmt: skip
            for k in program.kernels
        ]

    def __new__(cls, *args, **kwargs):
        # Each kernel gets a subclass whose __call__ is the extension's C entry
        # point itself: no Python frame on the per-call path.
        module = args[4] if len(args) > 4 else kwargs["module"]
        sub = type(cls.__name__, (cls,), {"__call__": module.call, "__module__": cls.__module__})
        return super().__new__(sub)

    def __call__(self, *args, out=None):  # replaced per instance by the C entry point (see __new__)
        return self._slow_call(args, out)

    def readable(self, inputs, first: int = 0) -> tuple:
        """``inputs`` (the kernel's inputs from number ``first`` on) in a layout the C entry point reads
        in place: contiguous, or for an input read row-strided (``tailjit.fusion.row_strided_inputs``) with its
        last dimension contiguous; others copied."""
        return tuple(
            t if rows and t.ndim and (t.shape[-1] <= 1 or t.stride(-1) == 1) else t.contiguous()
            for t, rows in zip(inputs, self._row_strided[first:])
        )

    def _fallback(self, *args, out=None):
        return self._slow_call(args, out)

    def _slow_call(self, args: tuple, out):
        if len(args) != len(self.input_names):  # as the C entry says it: outputs never come positionally
            raise TypeError(
                f"tailjit kernel '{self.name}' takes {len(self.input_names)} input(s) ({', '.join(self.input_names)}), "
                f"got {len(args)}; output buffers go in out="
            )
        tensors, numpy_in = [], False
        for name, a in zip(self.input_names, args):
            if isinstance(a, np.ndarray):
                numpy_in = True
                a = torch.from_numpy(np.ascontiguousarray(a) if a.dtype.byteorder not in "=|" else a)
            elif isinstance(a, torch.Tensor) and type(a) not in (torch.Tensor, torch.nn.Parameter):
                raise TypeError(
                    f"tailjit kernel '{self.name}': input '{name}' is a {type(a).__name__}; "
                    "pass a plain torch.Tensor or numpy array"
                )
            elif not isinstance(a, torch.Tensor):
                raise TypeError(
                    f"tailjit kernel '{self.name}': input '{name}' must be a torch.Tensor or numpy.ndarray, "
                    f"got {type(a).__name__}"
                )
            elif a.is_neg():  # its memory holds the negated values (``torch.complex(a, b).conj().imag``)
                a = a.resolve_neg()
            tensors.append(a)
        tensors = list(self.readable(tensors))  # the C entry point sent any other layout here
        if out is not None:
            return self._call_into(tensors, out)
        if torch.is_grad_enabled() and any(a.requires_grad for a in tensors):
            return differentiable_call(self, tensors)
        res = self._call(*tensors)
        if res is NotImplemented:  # pragma: no cover - plain tensors always take the C path
            raise TypeError(f"tailjit kernel '{self.name}': unsupported arguments")
        if numpy_in:
            return tuple(r.numpy() for r in res) if isinstance(res, tuple) else res.numpy()
        return res

    def _call_into(self, inputs: list, out):
        single = not isinstance(out, (tuple, list))
        outs = [out] if single else list(out)
        if len(outs) != len(self._outputs):
            raise ValueError(
                f"tailjit kernel '{self.name}': out= needs {len(self._outputs)} buffer(s), got {len(outs)}"
            )
        for t, o in zip(self._outputs, outs):
            if not isinstance(o, (torch.Tensor, np.ndarray)):
                raise TypeError(f"tailjit kernel '{self.name}': out '{t.name}' must be a tensor or array")
        bufs = [torch.from_numpy(o) if isinstance(o, np.ndarray) else o for o in outs]
        for t, b in zip(self._outputs, bufs):  # what has no storage to compare or copy_ would take
            if b.device.type != "cpu":
                raise ValueError(
                    f"tailjit kernel '{self.name}': out '{t.name}' must be a CPU tensor (tailjit compiles for the CPU)"
                )
            if b.layout != torch.strided or b.is_nested or b._is_zerotensor():
                kind = (
                    "a nested tensor"
                    if b.is_nested
                    else "a zero (torch._efficientzerotensor) tensor"
                    if b._is_zerotensor()
                    else f"layout {b.layout}"
                )
                raise ValueError(
                    f"tailjit kernel '{self.name}': out '{t.name}' must be a dense (strided) tensor, got {kind}"
                )
        if torch.is_grad_enabled() and any(t.requires_grad for t in (*inputs, *bufs)):  # eager's rule and words
            raise RuntimeError(
                f"tailjit kernel '{self.name}': functions with out=... arguments don't support automatic "
                "differentiation, but one of the arguments requires grad; call it without out= or under "
                "torch.no_grad()"
            )
        # memory ranges, not storages: numpy views of one array become tensors of storages of their own
        spans = [_span(t) for t in (*inputs, *bufs)]
        overlap = any(_overlap(spans[len(inputs) + j], s) for j in range(len(bufs)) for s in spans[: len(inputs) + j])
        # a negative view's memory holds the negated values: written by copy_, which negates
        if not overlap and all(b.is_contiguous() and not b.is_neg() for b in bufs):
            self._call(*inputs, *bufs)
        else:  # compute aside, then copy: out overlaps an input or is strided
            res = self._call(*inputs)
            res = res if isinstance(res, tuple) else (res,)
            for t, b, r in zip(self._outputs, bufs, res):
                if b.shape != r.shape or b.dtype != r.dtype:
                    raise ValueError(
                        f"tailjit kernel '{self.name}': out '{t.name}' must have shape {tuple(r.shape)} and "
                        f"dtype {r.dtype}, got {tuple(b.shape)} {b.dtype}"
                    )
                b.copy_(r)
        # written behind autograd's back: a backward that saved a buffer's old values must raise, as in eager
        torch.autograd.graph.increment_version(bufs)
        return outs[0] if single else tuple(outs)

    def describe(self) -> str:
        """Kernels, what was fused into each, and their loop nests."""
        head = (
            f"tailjit kernel '{self.name}': {len(self.kernels)} loop nest(s), "
            f"build {self.build_seconds * 1e3:.1f} ms ({self.build_info.cache})"
        )
        return "\n".join([head] + ["  " + k.describe().replace("\n", "\n  ") for k in self.kernels])

    def __repr__(self) -> str:
        return f"<tailjit.Kernel {self.name}({', '.join(self.input_names)}) -> {', '.join(self.output_names)}>"

    def mark_saved(self, n: int) -> None:
        """Say that the last ``n`` outputs are forward intermediates written for the backward to read
        (float reductions; they are not differentiable): the callers that added them to the program
        (a training graph's compiler, ``@tailjit.op``) call this once, after the build."""
        self.n_saved = n
        saved = set(self.output_names[len(self.output_names) - n :]) if n else set()
        self.kernels = [
            replace(k, role=k.role.replace("output", "output kept for the backward", 1)) if k.name in saved else k
            for k in self.kernels
        ]

    def mark_cut(self, positions) -> None:
        """Say that the outputs at ``positions`` carry no gradient, where autograd gives them none in
        eager (a ``detach()``ed value, a value computed from inputs that do not require grad): they come
        back without a ``grad_fn``.  A training graph's compiler knows this from its graph; the tensor
        expressions alone cannot tell (``x ** 0`` reads no input)."""
        cut = set(positions)
        self._differentiable = tuple(f and k not in cut for k, f in enumerate(self._float_outputs))
        self._all_differentiable = all(self._differentiable)

    def backward(self, mask: tuple[bool, ...]) -> Backward:
        """The compiled backward for the inputs selected by ``mask`` (built on first use, then cached)."""
        b = self._grad_kernels.get(mask)
        if b is None:
            public = len(self._outputs) - self.n_saved
            outputs = self._outputs[:public]
            spec, _ = gradient_spec(outputs, self._inputs, self.name, mask, self._outputs[public:])
            b = self._grad_kernels[mask] = build_backward(spec, sum(t.dtype.is_float for t in outputs), self._builder)
        return b

    def gradient_kernel(self, mask: tuple[bool, ...]) -> Kernel | None:
        """The kernel of :meth:`backward`: it takes the inputs, the float outputs and one gradient per
        float output, and returns the gradients of the selected inputs that are not an output's gradient
        as it is (None when every one is)."""
        return self.backward(mask).kernel


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes ``[lo, hi)`` of the storage that ``t`` views (a bound on what it reads or writes)."""
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def gradient_spec(outputs, inputs, name: str, mask, saved=(), save_buffered: bool = False) -> tuple:
    """The ``build`` spec ``(outputs, inputs, name)`` of the gradient kernel of the program ``outputs`` over
    ``inputs`` named ``name``, for the inputs selected by ``mask`` (see ``Kernel.gradient_kernel``), and the
    forward intermediates it reads (``saved``, and with ``save_buffered`` the reductions the forward buffers
    anyway: see :func:`tailjit.te.autodiff.backward_program`)."""
    ins, grads, saved = backward_program(inputs, outputs, mask, saved, partition if save_buffered else None)
    return (grads, ins, f"{name}_backward"), saved


class Backward(NamedTuple):
    """A kernel's compiled backward for one set of inputs.  ``through[i]``, for the ``i``-th selected input,
    is the position among the backward's arguments (the inputs, the saved values, then one gradient per
    float output) of the output gradient that is that input's gradient as it is (``y = x + c``), or None;
    ``kernel`` computes the others, in order (None when there are none).  Eager autograd hands such a
    gradient on too, where a kernel would copy it, and ``sum()``'s expanded gradient before that."""

    kernel: Kernel | None
    through: tuple[int | None, ...]

    def __call__(self, args: tuple, first_head: int) -> list:
        """The selected inputs' gradients, from the backward's arguments (``args[first_head:]``, the
        output gradients, in any layout)."""
        res = ()
        if self.kernel is not None:
            # sum()'s gradient is an expanded scalar (copied); a cat's is a narrowed row (read in place)
            heads = self.kernel.readable(args[first_head:], first_head)
            res = self.kernel._call(*args[:first_head], *heads)
        computed = iter(res if isinstance(res, tuple) else (res,))
        return [args[p] if p is not None else next(computed) for p in self.through]


def build_backward(spec: tuple, n_heads: int, build: Callable) -> Backward:
    """Build the gradient program ``spec`` (from :func:`gradient_spec`, for ``n_heads`` float outputs) with
    ``build`` (``tailjit.api.build``) as a :class:`Backward`."""
    rest, through = passed_through(spec, n_heads)
    return Backward(build(*rest) if rest is not None else None, through)


def passed_through(spec: tuple, n_heads: int) -> tuple[tuple | None, tuple[int | None, ...]]:
    """The gradient program ``spec`` without the gradients that are an output gradient as it is (a load of
    it at the gradient's own index), and for each gradient the position of that output gradient among
    the program's inputs (the last ``n_heads``), or None (see :class:`Backward`)."""
    grads, ins, name = spec
    heads = {id(t): k for k, t in enumerate(ins) if k >= len(ins) - n_heads}
    through = []
    for g in grads:
        source = g
        while (copied := _copy_of(source)) is not None:  # an output's adjoint is a copy of its gradient
            source = copied
        through.append(heads.get(id(source)))
    rest = [g for g, p in zip(grads, through) if p is None]
    return ((rest, ins, name) if rest else None), tuple(through)


def _copy_of(t) -> object | None:
    """The tensor that the compute ``t`` copies unchanged (its body a load of it at ``t``'s own index, of
    the same shape and dtype), or None."""
    b = t.body
    if not isinstance(b, Load) or t.is_scatter or t.is_scan:
        return None
    src = b.tensor
    same = (
        src.dtype == t.dtype
        and len(b.indices) == len(t.axes)
        and all(i is a for i, a in zip(b.indices, t.axes))
        and [d.key for d in src.shape] == [d.key for d in t.shape]
    )
    return src if same else None


#: How many dispatch modes are active, and whether a functorch transform is: ``tracing()``'s two questions.
dispatch_modes = torch._C._len_torch_dispatch_stack
functorch_active = torch._C._are_functorch_transforms_active


def tracing() -> bool:
    """Whether a call would be traced rather than run: under a dispatch mode (``make_fx``, fake tensors,
    ``tailjit.jit``'s trace) or a functorch transform (``functionalize``, ``vmap``, ``grad``), whose tensors
    hold no data a kernel could read."""
    return bool(dispatch_modes()) or functorch_active()


def differentiable_call(kernel: Kernel, tensors: list):
    """Run ``kernel`` on ``tensors`` with the outputs wired into autograd."""
    if functorch_active():
        res = _KernelFunction.apply(kernel, *tensors)  # which raises functorch's error (no setup_context)
    else:  # what Function.apply ends in, without its Python wrapper (a few us of an op call's ~20)
        res = _apply(kernel, *[_unwrap_if_dead(t) for t in tensors])
    return res[0] if len(kernel._outputs) == 1 else res


class _KernelFunction(torch.autograd.Function):
    # This path runs once per operator call in a training step, so it avoids per-call Python work
    # that can be done once per kernel (float masks) and contexts it does not need.
    @staticmethod
    def forward(ctx, kernel: Kernel, *inputs):
        # a view the C entry cannot read in place is copied here once, and the copy saved, rather than by the
        # entry's fallback to Python in the forward and again in the backward (a gate of an unbind is read
        # in place)
        inputs = kernel.readable(inputs)
        res = kernel._call(*inputs)
        outs = res if isinstance(res, tuple) else (res,)
        ctx.kernel = kernel
        if kernel._all_float_outputs:
            ctx.save_for_backward(*inputs, *outs)
        else:
            ctx.save_for_backward(*inputs, *(o for o, f in zip(outs, kernel._float_outputs) if f))
        if kernel._all_differentiable:
            if kernel.n_saved:  # forward intermediates kept for the backward
                ctx.mark_non_differentiable(*outs[-kernel.n_saved :])
        else:  # and integer outputs, and values a detach() cut off: no grad_fn, as in eager
            kept = len(outs) - kernel.n_saved
            diff = kernel._differentiable
            ctx.mark_non_differentiable(*(o for k, (o, d) in enumerate(zip(outs, diff)) if not d or k >= kept))
        return outs

    @staticmethod
    def backward(ctx, *grads):
        kernel: Kernel = ctx.kernel
        mask = tuple(m and f for m, f in zip(ctx.needs_input_grad[1:], kernel._float_inputs))
        if not any(mask):
            return (None,) * (len(mask) + 1)
        saved = ctx.saved_tensors
        if kernel.n_saved:  # the saved intermediates take no gradient
            grads = grads[: -kernel.n_saved]
        heads = grads if kernel._all_float_outputs else [g for g, f in zip(grads, kernel._float_outputs) if f]
        # the plain entry records nothing in autograd, so no torch.no_grad() is needed around it
        it = iter(kernel.backward(mask)((*saved, *heads), len(saved)))
        out = [next(it) if m else None for m in mask]
        if torch.is_grad_enabled() and any(t.requires_grad for t in (*saved, *heads)):
            out = _no_double_backward(kernel.name, out)
        return (None, *out)


_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, _KernelFunction)
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead


def _no_double_backward(name: str, grads: list) -> list:
    """Gradients whose own backward raises: create_graph=True gets a clear error rather
    than a silently wrong second derivative (the backward kernel is not differentiable)."""
    msg = f"tailjit kernel '{name}': double backward is not supported (its backward is a compiled kernel)"
    err = torch._C._functions.DelayedError(msg.encode(), len(grads))
    res = err(*[g.detach().requires_grad_() if g is not None else None for g in grads])
    return list(res) if isinstance(res, tuple) else [res]
