"""The torch objects and C entry points a generated extension needs.

Reading a tensor's metadata through Python attributes costs about 1.5 us per
argument; torch's stable C shim (``aoti_torch_get_sizes`` and friends) reads
it in nanoseconds from an ``at::Tensor*``.  That pointer lies right after the
``PyObject`` header of a ``THPVariable``; since this is a layout detail, it
is verified once per process on a probe tensor and used only if every field
read back matches.  Outputs are allocated through ``aoti_torch_empty_strided``
and wrapped with the pointer torch exports for Inductor.  Whether an input
takes part in autograd is read from its ``TensorImpl`` (see
:func:`autograd_meta_offset`) and torch's grad mode through the shim, and whether it is plain memory
from its dispatch keys (:func:`dispatch_keys_offset`).  Where any piece is
missing (other torch versions), the extension falls back to Python attribute
access and ``torch.empty``.
"""

from __future__ import annotations

import ctypes
import functools
import operator
import os
import warnings

import torch

DTYPES = (torch.bool, torch.int32, torch.int64, torch.float32, torch.float64)
_SHIM = (
    "aoti_torch_empty_strided", "aoti_torch_get_data_ptr", "aoti_torch_delete_tensor_object",
    "aoti_torch_get_dim", "aoti_torch_get_sizes", "aoti_torch_get_strides", "aoti_torch_get_dtype",
    "aoti_torch_get_device_type", "aoti_torch_get_layout",
)  # fmt: skip


def _lib():
    try:
        return ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    except OSError:
        return None


def _code(lib, name: str) -> int:
    fn = getattr(lib, name)
    fn.restype = ctypes.c_int32
    return fn()


def _raw_access_ok(lib) -> bool:
    """Read a probe tensor's metadata through the THPVariable layout and compare."""
    base = torch.empty(3, 5)
    t = base.t()[1:]  # shape (4, 3), strides (1, 5), storage offset 1
    h = ctypes.c_void_p(id(t) + object.__basicsize__)
    i64, i32, p64 = ctypes.c_int64(), ctypes.c_int32(), ctypes.POINTER(ctypes.c_int64)()
    ptr = ctypes.c_void_p()
    try:
        if lib.aoti_torch_get_dim(h, ctypes.byref(i64)) or i64.value != 2:
            return False
        if lib.aoti_torch_get_sizes(h, ctypes.byref(p64)) or (p64[0], p64[1]) != (4, 3):
            return False
        if lib.aoti_torch_get_strides(h, ctypes.byref(p64)) or (p64[0], p64[1]) != (1, 5):
            return False
        if lib.aoti_torch_get_data_ptr(h, ctypes.byref(ptr)) or ptr.value != t.data_ptr():
            return False
        if lib.aoti_torch_get_dtype(h, ctypes.byref(i32)) or i32.value != _code(lib, "aoti_torch_dtype_float32"):
            return False
    except (AttributeError, ValueError):
        return False
    return True


def autograd_meta_offset() -> int:
    """Offset of ``TensorImpl::autograd_meta_`` from the ``TensorImpl`` pointer, or -1.

    The pointer is null for a tensor that never took part in autograd, so the
    entry point can tell in one load that such a tensor needs no gradient.  The
    offset is a layout detail (24 in torch 2.13, 32 where the reference counts
    were two words), so it is found by probing: the one pointer-sized field
    that is null in every plain tensor and set in every tensor that requires
    grad, leaf or not.  Anything ambiguous gives -1 (ask ``requires_grad``)."""
    base = object.__basicsize__
    plain = [torch.empty(3), torch.randn(2, 2), torch.zeros(()) + 1]
    with torch.no_grad():
        plain.append(torch.ones(4) * 2)
    leaf = torch.ones(3, requires_grad=True)
    grad = [leaf, leaf * 2, torch.nn.Parameter(torch.ones(2))]
    if any(t.requires_grad for t in plain) or not all(t.requires_grad for t in grad):
        return -1

    def field(t: torch.Tensor, off: int) -> int:
        impl = ctypes.c_void_p.from_address(id(t) + base).value
        return ctypes.c_void_p.from_address(impl + off).value or 0

    try:
        found = [off for off in range(8, 97, 8)
                 if all(field(t, off) == 0 for t in plain) and all(field(t, off) != 0 for t in grad)]  # fmt: skip
    except (ValueError, OSError):  # pragma: no cover - a layout we cannot read
        return -1
    return found[0] if len(found) == 1 else -1


def dispatch_keys_offset() -> tuple[int, int]:
    """Offset of ``TensorImpl::key_set_`` and the dispatch keys a plain dense CPU tensor may carry, or
    ``(-1, 0)``.

    A tensor whose key set holds any other key is not plain memory of its values: a negative view (its
    memory holds the negated values: ``torch.complex(a, b).conj().imag``), a nested or a zero tensor.  The
    entry point sends such a tensor to its checked path.  The offset is a layout detail, found by probing:
    the one word that holds every probe tensor's key set as torch reports it (``DispatchKeySet.raw_repr``),
    where a negative view, a nested and a zero tensor each hold a key no plain tensor has.  (Matching on the
    values alone, a word two plain tensors happened to share could pass too, now and then.)"""
    base = object.__basicsize__
    plain = [torch.empty(3), torch.randn(2, 2).t(), torch.zeros((), dtype=torch.int64),
             torch.ones(4, dtype=torch.bool)[1:], torch.ones(3, dtype=torch.float64, requires_grad=True),
             torch.ones(2, requires_grad=True) * 2, torch.nn.Parameter(torch.ones(2)),
             torch.ones(3, dtype=torch.int32)]  # fmt: skip
    with torch.inference_mode():
        plain.append(torch.ones(3))
    a, b = torch.ones(3), torch.zeros(3)
    with warnings.catch_warnings():  # nested tensors are a prototype
        warnings.simplefilter("ignore")
        odd = [a._neg_view(), torch.nested.nested_tensor([torch.ones(3)]), torch._efficientzerotensor(3)]

    def field(t: torch.Tensor, off: int) -> int:
        impl = ctypes.c_void_p.from_address(id(t) + base).value
        return ctypes.c_uint64.from_address(impl + off).value

    probes = [*plain, a, b, *odd]
    keys = [torch._C._dispatch_keys(t).raw_repr() for t in probes]
    allowed = functools.reduce(operator.or_, keys[: len(plain)])
    if not all(k & ~allowed for k in keys[-len(odd) :]):
        return -1, 0
    try:
        found = [off for off in range(8, 257, 8) if all(field(t, off) == k for t, k in zip(probes, keys))]
    except (ValueError, OSError):  # pragma: no cover - a layout we cannot read
        return -1, 0
    return (found[0], allowed) if len(found) == 1 else (-1, 0)


@functools.lru_cache(maxsize=1)
def runtime_objects() -> tuple:
    """Arguments of the extensions' ``init``: (objects, function addresses, codes).

    The probes run on plain tensors with grad enabled whatever the caller's state: the first build of a
    process may happen inside AOTAutograd's compile, under its fake mode (fake tensors have no data) and
    without grad, where the autograd offset probe found no tensor requiring grad and gave -1 for the whole
    process."""
    with (
        torch.utils._python_dispatch._disable_current_modes(),
        torch._C.DisableTorchFunction(),
        torch.inference_mode(False),
        torch.enable_grad(),
    ):
        return _runtime_objects()


def _runtime_objects() -> tuple:
    guards = torch._C._dynamo.guards
    data_ptr = guards._torchinductor_pyobject_tensor_data_ptr
    wrap = getattr(guards, "_torchinductor_thp_variable_wrap", 0)
    lib = _lib()
    addrs, codes = [0] * (len(_SHIM) + 3), [0] * 8 + [-1, -1, 0]
    if lib is not None and all(hasattr(lib, n) for n in _SHIM):
        raw = _raw_access_ok(lib)
        grad_mode = getattr(lib, "aoti_torch_grad_mode_is_enabled", None)
        addrs = [ctypes.cast(getattr(lib, n), ctypes.c_void_p).value or 0 for n in _SHIM]
        addrs += [wrap, int(raw), ctypes.cast(grad_mode, ctypes.c_void_p).value or 0 if grad_mode else 0]
        codes = [_code(lib, f"aoti_torch_dtype_{d}") for d in ("bool", "int32", "int64", "float32", "float64")]
        codes += [_code(lib, "aoti_torch_device_type_cpu"), _code(lib, "aoti_torch_layout_strided"), 1]
        codes += [autograd_meta_offset() if raw else -1, *(dispatch_keys_offset() if raw else (-1, 0))]
    objects = (torch.Tensor, torch.nn.Parameter, DTYPES, torch.strided, torch.empty, data_ptr)
    return objects, tuple(addrs), tuple(codes)
