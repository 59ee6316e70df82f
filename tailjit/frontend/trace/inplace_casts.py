"""Eager's in-place dtype check, which functionalisation drops.

``mask.mul_(3.0)`` of a bool tensor raises in eager ("result type Float can't be cast to the desired
output type Bool"), but the meta kernels that tracing runs do not check, and functionalisation turns
the update into ``_to_copy(mul(mask, 3.0), dtype=bool)``: the compiled entry would quietly return.
:class:`InplaceCasts`, active while a function is traced, repeats the check for every in-place method
(``x.op_(...)``, ``x op= y``): the out-of-place op's result dtype, found on size-1 meta stand-ins,
must cast to the target's.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes


class InplaceCasts(TorchFunctionMode):
    """Raise eager's RuntimeError for an in-place op whose result dtype cannot be cast to its target's."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if args and isinstance(args[0], torch.Tensor):
            result = _result_dtype(getattr(func, "__name__", ""), args, kwargs)
            if result is not None and not torch.can_cast(result, args[0].dtype):
                raise RuntimeError(
                    f"result type {_name(result)} can't be cast to the desired output type {_name(args[0].dtype)}"
                )
        return func(*args, **kwargs)


def _result_dtype(name: str, args, kwargs) -> torch.dtype | None:
    """The dtype the out-of-place form of the in-place method ``name`` gives, or None when it is not one."""
    if name.startswith("__i") and name.endswith("__"):  # x *= y: __imul__ -> __mul__
        name = "__" + name[3:]
    elif name.endswith("_") and not name.startswith("_"):  # x.mul_(y) -> x.mul(y)
        name = name[:-1]
    else:
        return None
    op = getattr(torch.Tensor, name, None)
    if not callable(op):
        return None
    # outside the tracer (the stand-ins must not enter the graph) and any functorch transform
    with _disable_current_modes(), torch._C._DisableFuncTorch(), torch._C.DisableTorchFunction():
        try:
            out = op(*[_stand_in(a) for a in args], **{k: _stand_in(v) for k, v in kwargs.items()})
        except Exception:  # noqa: BLE001 - ops the stand-ins cannot run keep their own checks
            return None
    return out.dtype if isinstance(out, torch.Tensor) else None


def _stand_in(a):
    return torch.empty((1,) * a.dim(), dtype=a.dtype, device="meta") if isinstance(a, torch.Tensor) else a


def _name(dtype: torch.dtype) -> str:
    """Eager's name of a dtype (ScalarType's): Float, Long, Bool, ComplexDouble."""
    return torch.empty((), dtype=dtype, device="meta").type().split(".")[-1].removesuffix("Tensor")
