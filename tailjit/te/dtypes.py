"""Scalar types of the IR and PyTorch's type-promotion rules.

Three categories are ordered bool < integer < floating.  A Python scalar is a
*weak* operand: it never widens a tensor of its own category (``int32 + 1`` is
int32, ``float32 + 0.5`` is float32), but a weak operand of a higher category
lifts the result to that category's default type (``int32 + 0.5`` is float32).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class DType:
    name: str
    c: str  # the C type
    category: int  # 0 bool, 1 integer, 2 floating
    bits: int

    @property
    def is_float(self) -> bool:
        return self.category == 2

    @property
    def is_int(self) -> bool:
        return self.category == 1

    @property
    def is_bool(self) -> bool:
        return self.category == 0

    @property
    def c_mem(self) -> str:
        """The C type of its elements in memory: bool as ``uint8_t``, because gcc 12 vectorises no loop that
        loads a ``_Bool`` together with a wider type (a float select on a mask ran scalar)."""
        return "uint8_t" if self.is_bool else self.c

    @property
    def torch(self) -> torch.dtype:
        return getattr(torch, self.name)

    @property
    def numpy(self) -> np.dtype:
        return np.dtype("bool" if self.is_bool else self.name)

    def __repr__(self) -> str:
        return self.name


bool_ = DType("bool", "bool", 0, 8)
int32 = DType("int32", "int32_t", 1, 32)
int64 = DType("int64", "int64_t", 1, 64)
float32 = DType("float32", "float", 2, 32)
float64 = DType("float64", "double", 2, 64)

ALL = (bool_, int32, int64, float32, float64)
_BY_NAME = {d.name: d for d in ALL}
_BY_NAME.update({"bool_": bool_, "float": float32, "double": float64, "int": int32, "long": int64})
#: The type a weak scalar of each category becomes when it lifts a result.
DEFAULT = {0: bool_, 1: int64, 2: float32}


def dtype(x: object) -> DType:
    """Normalise a dtype given as a name, a DType, a torch.dtype or a numpy dtype."""
    if isinstance(x, DType):
        return x
    if isinstance(x, torch.dtype):
        name = str(x).removeprefix("torch.")
    elif isinstance(x, str):
        name = x
    else:
        try:
            name = np.dtype(x).name
        except TypeError:
            name = str(x)
    try:
        return _BY_NAME[name]
    except KeyError:
        supported = ", ".join(d.name for d in ALL)
        raise TypeError(f"unsupported dtype {x!r}; tailjit supports {supported}") from None


def promote(a: DType, a_weak: bool, b: DType, b_weak: bool) -> tuple[DType, bool]:
    """Result type of a binary operation, and whether the result is weak."""
    if a_weak == b_weak:
        if a.category != b.category:
            hi = a if a.category > b.category else b
            return hi, a_weak
        return (a if a.bits >= b.bits else b), a_weak
    strong, weak = (b, a) if a_weak else (a, b)
    if weak.category > strong.category:
        return DEFAULT[weak.category], False
    return strong, False


def to_float(d: DType) -> DType:
    """The floating type an integer or bool operand computes in (PyTorch's default)."""
    return d if d.is_float else float32
