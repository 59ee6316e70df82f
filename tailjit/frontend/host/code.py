"""The host function's Python: straight-line code that runs a planned graph's steps, calling each region's
kernel and each extern op with its arguments in locals, and the helpers that code calls."""

from __future__ import annotations

import functools
import operator
import sys

import sympy
import torch

from tailjit.frontend.lower.reinplace import padded
from tailjit.frontend.lower.symbolic import Unsupported
from tailjit.frontend.plan.steps import Broadcast, ConstStep, ExternStep, KernelStep, Ref, SymRef

_aten = torch.ops.aten


class HostCode:
    def __init__(self, input_syms: dict, data_syms: dict, slice_syms: dict, direct: dict):
        self.globals: dict = {"torch": torch}
        self.direct = direct  # ops called as their Python function (autograd goes through the dispatcher)
        self.names: dict = {}  # id(object) -> its global name
        self.input_syms = input_syms
        self.data_syms = data_syms  # symbol -> the slot of the step that read it from data
        self.slice_syms = slice_syms  # symbol -> (size, start, end, step): a slice's length
        self.used_syms: set = set()
        self.n = 0

    def name_of(self, obj, base: str) -> str:
        name = self.names.get(id(obj))
        if name is None:
            self.n += 1
            name = self.names[id(obj)] = f"{base}{self.n}"
            self.globals[name] = obj
        return name

    def size(self, expr) -> str:
        self.used_syms |= expr.free_symbols - set(self.data_syms) - set(self.slice_syms)
        return "(" + _py_size(expr, self.sym_name) + ")"

    def sym_name(self, sym) -> str:
        """A size's local: one read from an input's shape up front, or the value a step read from data; or a
        slice's length, computed from those."""
        if sym in self.slice_syms:  # Python's slice of a range clamps its bounds as torch's slice does
            size, start, end, step = (self.size(e) for e in self.slice_syms[sym])
            return f"len(range({size})[{start}:{end}:{step}])"
        slot = self.data_syms.get(sym)
        return f"v{slot}" if slot is not None else f"size_{sym}"

    def size_lines(self) -> list[str]:
        lines = []
        for sym in sorted(self.used_syms, key=str):
            pos, d = self.input_syms[sym]
            lines.append(f"    {self.sym_name(sym)} = v{pos}" + ("" if d is None else f".shape[{d}]"))
        return lines

    def value(self, t) -> str:
        if isinstance(t, Ref):
            return f"v{t.slot}"
        if isinstance(t, SymRef):
            return self.size(t.expr)
        if isinstance(t, tuple):
            inner = ", ".join(self.value(x) for x in t)
            return f"({inner},)" if len(t) == 1 else f"({inner})"
        if isinstance(t, list):
            return "[" + ", ".join(self.value(x) for x in t) + "]"
        if isinstance(t, dict):
            return "{" + ", ".join(f"{k!r}: {self.value(v)}" for k, v in t.items()) + "}"
        if t is None or isinstance(t, (bool, int, str)):
            return repr(t)
        if isinstance(t, float):
            return repr(t) if t == t and abs(t) != float("inf") else f"float({str(t)!r})"
        return self.name_of(t, "c")

    def steps(self, steps, indent: str = "    ") -> list[str]:
        out = []
        for s in steps:
            if isinstance(s, ConstStep):
                out.append(f"{indent}v{s.slot} = {self.name_of(s.value, 'const')}")
            elif isinstance(s, ExternStep):
                out.append(f"{indent}v{s.slot} = {self.call(s.target, s.args, s.kwargs)}")
            else:
                out += self.kernel(s, indent)
        return out

    def call(self, target, args, kwargs) -> str:
        if target is operator.getitem:
            return f"{self.value(args[0])}[{self.value(args[1])}]"
        if not kwargs and target in _METHODS:  # the Tensor method's argument parsing is about 1 us cheaper
            return f"{self.value(args[0])}.{_METHODS[target]}({', '.join(self.value(a) for a in args[1:])})"
        if not kwargs and target in (_aten.select.int, _aten.slice.Tensor) and type(args[1]) is int:
            index = self.subscript(target, args[2:])
            if index is not None:
                dim = args[1]
                where = ":, " * dim + index if dim >= 0 else "..., " + index + ", :" * (-dim - 1)
                return f"{self.value(args[0])}[{where}]"
        # a tailjit op: its function, not the dispatcher; an ATen overload: the builtin its __call__ calls, or a
        # factory's torch function of the same signature (their schema-driven argument parsing costs 1-5 us)
        target = _PYTHON.get(target) or self.direct.get(target, target)
        fn = self.name_of(_FACTORIES.get(target) or getattr(target, "_op", target), "op")
        parts = [self.value(a) for a in args] + [f"{k}={self.value(v)}" for k, v in kwargs.items()]
        return f"{fn}({', '.join(parts)})"

    def subscript(self, target, rest) -> str | None:
        """The index of ``x[...]`` that selects or slices as ``target`` with the arguments after ``dim``, or
        None: a select index computed at run time could be a bool (``item()`` of a mask), which indexing reads
        as a mask."""
        if target is _aten.select.int:
            return str(rest[0]) if type(rest[0]) is int else None
        start, end, step = padded(rest, (None, None, 1))
        end = None if end == sys.maxsize else end  # the traced ``x[1:]``
        bounds = [self.value(b) if b is not None else "" for b in (start, end)]
        return ":".join(bounds) + ("" if step == 1 else f":{self.value(step)}")

    def kernel_input(self, src: Ref, value: str) -> str:
        """What a kernel is passed for ``src``, whose value is ``value``: a broadcast input is cut to the
        first element of each broadcast dimension (:func:`_broadcast_base`)."""
        if isinstance(src, Broadcast):
            return f"{self.name_of(_broadcast_base, 'op')}({value}, {src.dims!r})"
        return value

    def kernel(self, s: KernelStep, indent: str) -> list[str]:
        k = self.name_of(s.kernel, "kernel")
        ins = []
        for src in s.sources:
            if isinstance(src, Ref):
                ins.append(self.kernel_input(src, f"v{src.slot}"))
            else:
                ins.append(f"{self.name_of(stand_in, 'op')}({self.size(src[1])})")
        names = [f"v{o}" for o in s.outputs] + ["_"] * s.n_saved
        target = ", ".join(names)  # one output: the kernel returns it alone, not in a tuple
        lines = [f"{indent}try:", f"{indent}    {target} = {k}({', '.join(ins)})"]
        # the kernel's conservative call-time bounds check refused these sizes: run the region's nodes eagerly;
        # bad data (an index out of range, an integer division by zero): they run eagerly to raise PyTorch's error
        lines += [f"{indent}except (IndexError, ZeroDivisionError) as e:"]
        lines += [f"{indent}    if 'for these input sizes' not in str(e):"]
        lines += self.steps(s.eager, indent + "        ") + [f"{indent}        raise"]
        lines += self.steps(s.eager, indent + "    ")
        if s.after:
            lines += [f"{indent}else:"] + self.steps(s.after, indent + "    ")
        return lines


def _broadcast_base(x: torch.Tensor, dims: tuple) -> torch.Tensor:
    """``x`` cut to the first element of each of its broadcast dimensions ``dims``, which the kernel reads for
    all (``Planner.broadcast_dims``).  A dimension whose elements differ after all (a stride that is not 0: a
    trace that does not guard strides) sends the region to its eager path, as the kernel's size checks do."""
    for d in dims:
        if x.stride(d) != 0 or x.shape[d] == 0:
            raise IndexError("tailjit: a broadcast input is not broadcast for these input sizes")
        x = x.narrow(d, 0, 1)
    return x


@functools.lru_cache(maxsize=4096)
def stand_in(n: int) -> torch.Tensor:
    """The ``(n, 0)`` stand-in of a size no input of a kernel carries (it holds no data, so one per ``n``
    serves every call: ``torch.empty`` cost 1.5 us a size).  A negative size (``ids[-1].item()`` of -1, where
    the kernel's size is that plus one) sends the region to its eager path, as the kernel's size checks do."""
    if n < 0:
        raise IndexError(f"tailjit: a kernel size is {n} for these input sizes")
    return torch.empty((n, 0), dtype=torch.bool)


def _copy(dest: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """``aten.copy`` (a functionalised ``dest[...] = src``) as autograd can differentiate it: it has no
    derivative of its own, and a differentiable graph's region runs its nodes as extern calls when the kernel
    refuses the sizes (``x[b, :n]`` with ``n`` read from data and negative)."""
    return dest.clone().copy_(src, non_blocking)


#: Extern calls of a differentiable graph that go through autograd differently from their ATen overload.
DIFFERENTIABLE = {_aten.copy.default: _copy}


def _assert_scalar(cond, msg: str) -> None:
    if not cond:
        raise RuntimeError(msg)


def _assert_async(cond: torch.Tensor, msg: str) -> None:
    if not cond.item():
        raise RuntimeError(msg)


#: ATen overloads the host runs as Python of the same meaning: a speculative trace's runtime assertions
#: (``speculate.py``), several a branch, each 1 us through the dispatcher (``_assert_async``, a float read's:
#: 0.99 us against 0.16, ``docs/scripts/host_call_costs.py``).
_PYTHON = {_aten._assert_scalar.default: _assert_scalar, _aten._assert_async.msg: _assert_async}


#: ATen overloads called as the Tensor method of the same signature, when called without keyword arguments
#: (measured: ``copy_`` 0.98 -> 0.41 us, ``view`` 2.7 -> 1.8, ``mul`` 2.1 -> 1.2, ``addmm`` 3.0 -> 2.4); ``select``
#: and ``slice`` are indexing (``x[:, 3]``, ``x[2:n]``: 1.8-2.3 -> 1.0-1.3 us).
_METHODS = {
    _aten.copy_.default: "copy_", _aten.view.default: "view", _aten.expand.default: "expand",
    _aten.permute.default: "permute", _aten.unsqueeze.default: "unsqueeze", _aten.transpose.int: "transpose",
    _aten.t.default: "t", _aten.flip.default: "flip", _aten.mm.default: "mm", _aten.bmm.default: "bmm",
    _aten.addmm.default: "addmm",
}  # fmt: skip


#: Factory overloads and the torch functions with their signature (``aten.full.default`` with its traced keyword
#: arguments took 6.8 us a call, ``torch.full`` 2.0).
_FACTORIES = {
    _aten.full.default: torch.full, _aten.zeros.default: torch.zeros, _aten.ones.default: torch.ones,
    _aten.scalar_tensor.default: torch.scalar_tensor,
}  # fmt: skip


def _py_size(expr, sym_name) -> str:
    """Python source for an integer size expression (sympy, from the shape environment); ``sym_name`` names
    each symbol's local."""
    if isinstance(expr, sympy.Integer):
        return str(int(expr))
    if isinstance(expr, sympy.Symbol):
        return sym_name(expr)
    name = type(expr).__name__
    a = [_py_size(x, sym_name) for x in expr.args]
    if isinstance(expr, sympy.Add):
        return "(" + " + ".join(a) + ")"
    if isinstance(expr, sympy.Mul):
        return "(" + " * ".join(a) + ")"
    if isinstance(expr, sympy.Pow) and isinstance(expr.args[1], sympy.Integer) and int(expr.args[1]) >= 1:
        return "(" + " * ".join([a[0]] * int(expr.args[1])) + ")"
    if name == "FloorDiv":
        return f"({a[0]} // {a[1]})"
    if name in ("Mod", "PythonMod"):
        return f"({a[0]} % {a[1]})"
    if name in ("Max", "Min"):
        return f"{name.lower()}({', '.join(a)})"
    raise Unsupported(f"size expression {expr} ({name}) is not supported")
