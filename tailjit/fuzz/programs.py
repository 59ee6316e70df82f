"""Random long-tail PyTorch programs as data (input records and body lines) that render to a runnable script.

:func:`programs` is a hypothesis strategy. It draws a program line by line and runs every line eagerly as it
draws it, so shapes, dtypes and validity come from PyTorch itself, never from rules re-derived here: a line
that eager rejects is dropped, or, now and then, kept as the program's last line, and then every entry must
raise the same exception type. The op families are in ``ops.py``.

Exclusions, each a difference that is legitimate and that the fuzzer must not report:

* Non-accumulating scatters (``scatter``, ``index_copy``, ``index_put`` without ``accumulate``) only get
  indices without duplicates: which duplicate wins is unspecified in eager.
* Float to integer casts only of finite values inside int32's range (C leaves the rest undefined, and eager
  returns whatever the CPU's conversion gives).
* Discontinuous ops (comparisons, ``floor``/``round``/``sign``, casts to integer or bool, ``argmax``-style
  indices and the ties of ``max``/``amax``, ``remainder``-style quotients, kinks of ``relu``/``abs``/``clamp``
  for gradients, a Python ``if`` on a value) only read a float value computed inexactly (a transcendental or a
  reduction, whose last bits legitimately differ) where it is farther than ``builder.MARGIN`` (relative) from
  the discontinuity: otherwise a last-bit difference flips a discrete result.
* Floating-point reassociation: reductions may sum in any order, so ``check.py``'s tolerances scale with the
  longest reduction (``TOLERANCE["reduce_len"]``) and the largest magnitude an inexact value reached
  (``TOLERANCE["magnitude"]``).
* Ops whose eager result is implementation-defined for some operands are not generated on those
  (``ops.UNDEFINED``: float32 ``gelu`` of an infinity, NaN or not by the tensor's size).
* Integer overflow is generated (it wraps in both: tailjit compiles with ``-fwrapv``); argmax ties are
  generated (first index in both).
"""

from __future__ import annotations

from hypothesis import strategies as st

from tailjit.fuzz import ops
from tailjit.fuzz.builder import Builder, DrawnProgram

__all__ = ["programs", "DrawnProgram"]


@st.composite
def programs(draw, max_ops: int = 8):
    """A :class:`DrawnProgram`: 1-3 random inputs (sometimes aliased), then 1-``max_ops`` op records."""
    b = Builder(draw, draw(st.integers(0, 2**16)) * 1000)
    for _ in range(draw(st.integers(1, 3))):
        b.input_tensor()
    if b.chance(6):
        b.aliased_inputs()
    wanted = draw(st.integers(1, max_ops))
    for _ in range(3 * wanted):  # a line eager rejects is dropped: try again, up to three times per line
        draw(st.sampled_from(ops.FAMILIES))(b)
        if b.p.raises or len(b.temps) >= wanted:
            break
    if not b.temps and not b.p.raises:
        b.emit(["t0 = p0.clone()"], "t0", ["p0"])
    if b.temps and not b.p.raises:
        rest = b.temps[:-1]
        extra = draw(st.lists(st.sampled_from(rest), max_size=2, unique=True)) if rest else []
        b.p.outputs = sorted(extra) + [b.temps[-1]]
    return b.p
