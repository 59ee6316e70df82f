"""Peer backends of the benchmark: each turns a workload into a callable to check and time.

A backend either returns a :class:`Prepared` (a function of the backend's
native arguments, converters from torch arguments and back to torch results
for the comparison with eager), or raises :class:`Unavailable` (not installed / not registered:
reported as such, never as an error) or :class:`Unsupported` (the backend
cannot compile this program).  Compilation is lazy for most backends, so the
worker measures ``prepare`` plus the first call as the compile time.
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


class Unavailable(Exception):
    """The backend is not installed or not registered in this environment."""


class Unsupported(Exception):
    """The backend cannot compile this program (a construct it does not handle)."""


@dataclass
class Workload:
    """What one task runs: ``fn(*args)`` (an operator function or an ``nn.Module``).

    ``args`` are the example inputs a backend may specialise on.  In ``fwbw``
    mode the leaves receiving gradients are the ``grad_argnums`` arguments
    (already ``requires_grad``) or the model's parameters, and a call returns
    ``(outputs, gradients)``.
    """

    fn: Callable
    args: tuple
    mode: str = "fw"
    grad_argnums: tuple[int, ...] = ()
    jax_fn: Callable | None = None
    is_model: bool = False

    def leaves(self, args: tuple) -> list[torch.Tensor]:
        if self.is_model:
            return [p for p in self.fn.parameters() if p.requires_grad]
        return [args[i] for i in self.grad_argnums]


def _identity(obj):
    return obj


@dataclass
class Prepared:
    """A compiled workload: ``run(*convert(args))`` runs it on torch ``args``; ``to_torch`` maps results back."""

    run: Callable[..., object]
    convert: Callable[[tuple], tuple] = _identity
    to_torch: Callable[[object], object] = _identity
    info: dict = field(default_factory=dict)

    def bind(self, args: tuple) -> Callable[[], object]:
        """A zero-argument call on ``args``, converted once (outside any timing)."""
        native = self.convert(args)
        return lambda: self.run(*native)


def tensor_leaves(obj) -> list:
    """The tensors of a nested tuple / list / dict output, in order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for item in obj for t in tensor_leaves(item)]
    if isinstance(obj, dict):
        return [t for key in sorted(obj, key=str) for t in tensor_leaves(obj[key])]
    return []


def scalar_loss(out) -> torch.Tensor:
    """The fwbw loss: the sum of ``.float().sum()`` over the floating outputs that carry gradients."""
    terms = [t.float().sum() for t in tensor_leaves(out) if t.is_floating_point() and t.requires_grad]
    if not terms:
        raise Unsupported("no floating-point output carries a gradient")
    return torch.stack(terms).sum()


def torch_run(fn: Callable, work: Workload) -> Callable[..., object]:
    """Run a torch-level callable: forward under no_grad, or forward+backward returning the gradients."""
    if work.mode == "fw":

        def forward(*args):
            with torch.no_grad():
                return fn(*args)

        return forward

    def forward_backward(*args):
        out = fn(*args)
        grads = torch.autograd.grad(scalar_loss(out), work.leaves(args), allow_unused=True)
        return out, grads

    return forward_backward


class Backend:
    """Base class: a named backend; ``dynamo`` backends get caches reset and graph breaks counted."""

    name = ""
    dynamo = False

    def check(self) -> None:
        """Raise :class:`Unavailable` when the backend cannot run in this environment."""

    def prepare(self, work: Workload) -> Prepared:
        raise NotImplementedError


class Eager(Backend):
    name = "eager"

    def prepare(self, work: Workload) -> Prepared:
        return Prepared(torch_run(work.fn, work))


class TorchScript(Backend):
    """``torch.jit.script``, falling back to ``torch.jit.trace`` on the example inputs."""

    name = "torchscript"

    def prepare(self, work: Workload) -> Prepared:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return Prepared(torch_run(torch.jit.script(work.fn), work), info={"method": "script"})
        except Exception as script_error:  # any scripting failure falls back to tracing
            script_msg = f"{type(script_error).__name__}: {script_error}"[:300]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                traced = torch.jit.trace(work.fn, work.args, check_trace=False)
        except Exception as trace_error:
            raise Unsupported(
                f"script failed ({script_msg}); trace failed ({type(trace_error).__name__}: {trace_error})"
            ) from trace_error
        return Prepared(torch_run(traced, work), info={"method": "trace", "script_error": script_msg})


class Inductor(Backend):
    name = "inductor"
    dynamo = True

    def prepare(self, work: Workload) -> Prepared:
        return Prepared(torch_run(torch.compile(work.fn, backend="inductor"), work))


class TailjitCompile(Backend):
    """``torch.compile(fn, backend="tailjit")``, once the compiler registers its Dynamo backend."""

    name = "tailjit"
    dynamo = True

    def check(self) -> None:
        try:
            importlib.import_module("tailjit")
        except ImportError as exc:
            raise Unavailable(f"tailjit is not importable: {exc}") from exc
        if "tailjit" not in torch._dynamo.list_backends(exclude_tags=()):
            raise Unavailable('torch.compile backend "tailjit" is not registered')

    def prepare(self, work: Workload) -> Prepared:
        return Prepared(torch_run(torch.compile(work.fn, backend="tailjit"), work))


class TailjitJit(Backend):
    """``tailjit.jit(fn)``, once the compiler provides it."""

    name = "tailjit-jit"

    def check(self) -> None:
        tailjit = importlib.import_module("tailjit")
        if not hasattr(tailjit, "jit"):
            raise Unavailable("tailjit.jit does not exist yet")

    def prepare(self, work: Workload) -> Prepared:
        tailjit = importlib.import_module("tailjit")
        return Prepared(torch_run(tailjit.jit(work.fn), work))


def _require(package: str) -> None:
    """Raise :class:`Unavailable` when ``package`` is not installed (found without importing it)."""
    if importlib.util.find_spec(package) is None:
        raise Unavailable(f"{package} is not installed")


def _jax():
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as exc:
        raise Unavailable(f"jax is not importable: {exc}") from exc
    return jax, jnp


def _is_static(arg) -> bool:
    """Python scalars, strings and tuples of them are compile-time constants for ``jax.jit``."""
    if isinstance(arg, tuple):
        return all(_is_static(a) for a in arg)
    return arg is None or isinstance(arg, (bool, int, float, str))


class Jax(Backend):
    """``jax.jit`` of the operator's ``jax_fn``; float64 is enabled only when an input needs it."""

    name = "jax"

    def check(self) -> None:
        _require("jax")

    def prepare(self, work: Workload) -> Prepared:
        jax, jnp = _jax()
        if work.jax_fn is None:
            raise Unsupported("no jax implementation (jax_fn) for this workload")
        tensors = tensor_leaves(work.args)
        needs_x64 = any(t.dtype in (torch.float64, torch.complex128) for t in tensors)
        jax.config.update("jax_enable_x64", needs_x64)

        def to_jax(obj):
            if isinstance(obj, torch.Tensor):
                array = obj.detach().cpu().numpy()
                if not needs_x64 and array.dtype.kind in "iu" and array.dtype.itemsize == 8:
                    array = array.astype("int32")
                return jnp.asarray(array)
            if isinstance(obj, (tuple, list)):
                return type(obj)(to_jax(o) for o in obj)
            if isinstance(obj, dict):
                return {k: to_jax(v) for k, v in obj.items()}
            return obj

        static = tuple(i for i, a in enumerate(work.args) if _is_static(a))
        jax_fn = work.jax_fn
        if work.mode == "fw":
            jitted = jax.jit(jax_fn, static_argnums=static)
        else:

            def loss(*xs):
                out = jax_fn(*xs)
                leaves = [
                    leaf.astype(jnp.float32).sum()
                    for leaf in jax.tree_util.tree_leaves(out)
                    if jnp.issubdtype(leaf.dtype, jnp.floating)
                ]
                if not leaves:
                    raise Unsupported("no floating-point output carries a gradient")
                return sum(leaves), out

            grad = jax.value_and_grad(loss, argnums=work.grad_argnums, has_aux=True)
            jitted = jax.jit(grad, static_argnums=static)

        def run(*args):
            return jax.block_until_ready(jitted(*args))

        def convert(args):
            return tuple(to_jax(a) for a in args)

        def to_torch(out):
            if work.mode == "fwbw":
                (_, value), grads = out
                return _jax_to_torch(value), _jax_to_torch(tuple(grads))
            return _jax_to_torch(out)

        return Prepared(run, convert, to_torch, info={"x64": needs_x64})


def _jax_to_torch(obj):
    import numpy as np

    if isinstance(obj, (tuple, list)):
        return type(obj)(_jax_to_torch(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _jax_to_torch(v) for k, v in obj.items()}
    if hasattr(obj, "dtype") and hasattr(obj, "shape"):
        return torch.from_numpy(np.array(obj))
    return obj


class Tvm(Backend):
    """Apache TVM Relax: ``torch.export`` then ``from_exported_program``, built for ``llvm`` (fw only)."""

    name = "tvm"

    def check(self) -> None:
        _require("tvm")

    def prepare(self, work: Workload) -> Prepared:
        try:
            import tvm
            from tvm import relax
            from tvm.relax.frontend.torch import from_exported_program
        except ImportError as exc:
            raise Unavailable(f"tvm with the Relax PyTorch frontend is not importable: {exc}") from exc

        if work.mode != "fw":
            raise Unsupported("tvm is measured for inference only")
        module = work.fn if isinstance(work.fn, torch.nn.Module) else _AsModule(work.fn)
        try:
            program = torch.export.export(module, work.args)
            mod = from_exported_program(program)
            executable = (tvm.compile if hasattr(tvm, "compile") else relax.build)(mod, target="llvm")
        except Exception as exc:  # any export / import / build failure
            raise Unsupported(f"{type(exc).__name__}: {exc}") from exc
        vm = relax.VirtualMachine(executable, tvm.cpu())
        make = getattr(tvm.runtime, "tensor", None) or tvm.nd.array

        def convert(args):
            return tuple(make(t.detach().cpu().numpy()) for t in tensor_leaves(args))

        def to_torch(out):
            if hasattr(out, "numpy"):
                return torch.from_numpy(out.numpy())
            return tuple(to_torch(o) for o in out)

        return Prepared(lambda *args: vm["main"](*args), convert, to_torch)


class _AsModule(torch.nn.Module):
    """Wraps a function so that ``torch.export`` accepts it."""

    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


BACKENDS: dict[str, Backend] = {
    b.name: b for b in (Eager(), TorchScript(), Inductor(), Jax(), Tvm(), TailjitCompile(), TailjitJit())
}


def register_backend(backend: Backend) -> Backend:
    """Add a backend (used by tests and by out-of-tree experiments)."""
    BACKENDS[backend.name] = backend
    return backend


def availability(name: str) -> str | None:
    """``None`` when backend ``name`` can run here, else the reason it cannot."""
    try:
        BACKENDS[name].check()
    except Unavailable as exc:
        return str(exc)
    return None
