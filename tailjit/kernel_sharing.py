"""Kernels equal up to their integer constants share one C function.

A Python loop unrolled by tracing gives one kernel per iteration, each the
same loop nest but for the iteration's index (``rewards[t]`` reads row
``INT64_C(115)``) and its buffers (``b[18]``).  Compiling them all cost gcc
0.75 s for GAE over 128 steps and 11 s over 1000.  Here the C of each
kernel is cut into fixed text and *holes* (buffer slots, 64-bit integer
literals, and the local names the code generator numbers): kernels whose
text matches up to the holes form a group, and the group's first kernel is
emitted once, with every literal that differs inside the group read from a
parameter array ``P``.  Each kernel's call passes its own values.

The shared function is the first member's C with some constants turned into
loads of parameters, so each member computes exactly what its own C did.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

#: The holes: a buffer slot ``b[N]``, a 64-bit literal ``INT64_C(N)`` (always an expression: the
#: code generator writes array sizes and pragmas with plain numbers), and a name.
_HOLE = re.compile(r"\bb\[(\d+)\]|INT64_C\((-?\d+)\)|\b([A-Za-z_]\w*)\b")

_SLOT, _INT = object(), object()  # the kinds of numeric hole, as pieces of a cut kernel

#: The names the code generator numbers (``t180_18``, ``t180_18_d0``, ``i0_87``, ``run_kern_t180_18``): a
#: kernel's locals and its own functions, so equal kernels may differ in them.  A constant's array
#: (``c0_5_data``) is the one file-scope name a kernel reads: it must match exactly.
_NUMBERED = re.compile(r"_\d+(_|$)")


#: Fewer kernels equal up to constants than this are emitted one by one: their constants fold (a box
#: coder's column index feeds a modulo and constant-array reads; delta2bbox's x/y column kernels ran
#: 1.4x slower shared), while the gcc time to win is in loops of many iterations.
MIN_SHARED = 8


@dataclass
class Sharing:
    texts: list[str]  # the C to emit: one per group of equal kernels
    # per kernel, the functions the entry point calls (in order) and the C of the ``P`` they are passed
    calls: list[list[tuple[str, str]]]


def share_kernels(texts: list[str], functions: list[list[str]]) -> Sharing:
    """``texts[k]`` is kernel k's C and ``functions[k]`` the names of its functions that the entry point
    calls, each ``int fn(void **b, const int64_t *S, const int64_t *restrict P)``."""
    cuts = [_cut(t) for t in texts]
    count = Counter(key for key, _, _ in cuts)
    groups: dict[tuple, list[int]] = {}
    for k, (key, _, values) in enumerate(cuts):
        # a small group shares only what is equal, constants included
        groups.setdefault(key if count[key] >= MIN_SHARED else (key, tuple(values)), []).append(k)
    out, calls = [], [[] for _ in texts]
    for members in groups.values():
        first = members[0]
        _, pieces, values = cuts[first]
        # one parameter per distinct column of values: holes that always agree (a column index read in
        # twenty places) read the same P[j], so gcc still sees one address and loads it once
        columns = [tuple(cuts[m][2][h] for m in members) for h in range(len(values))]
        param: dict[int, int] = {}
        distinct: dict[tuple, int] = {}
        for h, col in enumerate(columns):
            if len(set(col)) > 1:
                param[h] = distinct.setdefault(col, len(distinct))
        out.append(_fill(pieces, values, param))
        for k, m in enumerate(members):
            args = ", ".join(str(col[k]) for col in distinct)
            params = f"(const int64_t[]){{{args}}}" if distinct else "NULL"
            calls[m] = [(fn, params) for fn in functions[first]]
    return Sharing(out, calls)


def _cut(text: str) -> tuple[tuple, list, list[int]]:
    """The kernel's key (its text with holes blanked and local names numbered by first use), its
    pieces (text, and a ``_SLOT`` or ``_INT`` marker per numeric hole) and those holes' values."""
    pieces: list = []
    key: list[str] = []
    values: list[int] = []
    names: dict[str, int] = {}
    at = 0
    for m in _HOLE.finditer(text):
        pieces.append(text[at : m.start()])
        key.append(text[at : m.start()])
        at = m.end()
        slot, literal, name = m.groups()
        if name is not None:
            pieces.append(name)
            numbered = _NUMBERED.search(name) and not name.endswith("_data")
            key.append(f"@{names.setdefault(name, len(names))}" if numbered else name)
        else:
            pieces.append(_SLOT if slot is not None else _INT)
            values.append(int(slot if slot is not None else literal))
            key.append("#b" if slot is not None else "#i")
    pieces.append(text[at:])
    key.append(text[at:])
    return tuple(key), pieces, values


def _fill(pieces: list, values: list[int], param: dict[int, int]) -> str:
    """The C of ``pieces`` with its own values, except the holes in ``param``, read from ``P``."""
    out, h = [], 0
    for p in pieces:
        if isinstance(p, str):
            out.append(p)
            continue
        value = f"P[{param[h]}]" if h in param else f"INT64_C({values[h]})" if p is _INT else str(values[h])
        out.append(f"b[{value}]" if p is _SLOT else value)
        h += 1
    return "".join(out)
