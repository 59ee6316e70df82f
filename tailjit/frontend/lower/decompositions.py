"""The core-ATen decompositions every trace of the frontend uses."""

from __future__ import annotations

import functools

from torch._decomp import _core_aten_decompositions_post_autograd

from tailjit.frontend.lower.lowering import UNDECOMPOSED


@functools.lru_cache(maxsize=1)
def decompositions() -> dict:
    """Core ATen's decompositions of the ops that autograd lets through, minus those that hide ops tailjit lowers
    directly.  Not ``core_aten_decompositions()``, which adds every namespace's CompositeImplicitAutograd ops for
    export's pre-dispatch traces, found by walking all registered operators (0.1 s of CPU at every start): in a
    trace below autograd (``make_fx``, AOTAutograd) autograd decomposes those ops, and ``make_fx`` any that
    reach it, as their table entries would (the suite's traces are the same with either table)."""
    return {op: fn for op, fn in _core_aten_decompositions_post_autograd().items() if op not in UNDECOMPOSED}
