"""The torch objects and C entry points a generated extension needs.

The fast output allocation goes through torch's stable C shim
(``aoti_torch_empty_strided``) and the pointer torch exports for wrapping a
tensor as a Python object; where either is missing (other torch versions),
the extension falls back to calling ``torch.empty``.
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch


def _addr(lib, name: str) -> int:
    try:
        return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0
    except AttributeError:
        return 0


@functools.lru_cache(maxsize=1)
def runtime_objects() -> tuple:
    guards = torch._C._dynamo.guards
    data_ptr = guards._torchinductor_pyobject_tensor_data_ptr
    wrap = getattr(guards, "_torchinductor_thp_variable_wrap", 0)
    fns, codes, cpu = [0, 0, 0, 0, 0], [0] * 5, 0
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        names = ("aoti_torch_empty_strided", "aoti_torch_get_data_ptr", "aoti_torch_delete_tensor_object")
        addrs = [_addr(lib, n) for n in names]
        code_fns = [f"aoti_torch_dtype_{n}" for n in ("bool", "int32", "int64", "float32", "float64")]
        if all(addrs) and wrap and all(hasattr(lib, f) for f in code_fns):
            for i, f in enumerate(code_fns):
                getattr(lib, f).restype = ctypes.c_int32
                codes[i] = getattr(lib, f)()
            lib.aoti_torch_device_type_cpu.restype = ctypes.c_int32
            cpu = lib.aoti_torch_device_type_cpu()
            fns = [*addrs, wrap, 0]
    except OSError:
        pass
    dts = (torch.bool, torch.int32, torch.int64, torch.float32, torch.float64)
    return (torch.Tensor, torch.nn.Parameter, dts, torch.strided, torch.empty, data_ptr, *fns, *codes, cpu)
