"""The core-ATen decompositions every trace of the frontend uses."""

from __future__ import annotations

import functools

from torch._decomp import core_aten_decompositions

from tailjit.frontend.lower.lowering import UNDECOMPOSED


@functools.lru_cache(maxsize=1)
def decompositions() -> dict:
    """Core ATen decompositions, minus those that hide ops tailjit lowers directly."""
    return {op: fn for op, fn in core_aten_decompositions().items() if op not in UNDECOMPOSED}
