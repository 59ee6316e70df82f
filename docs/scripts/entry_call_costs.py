"""One call of ``bbox2delta`` on 128 boxes through each entry: ``tailjit.jit``, ``torch.compile(backend="tailjit")``,
Inductor and eager, medians of 21 interleaved repetitions in us, 1 thread (the per-call table of
``docs/performance.md``):

    python docs/scripts/entry_call_costs.py
"""

import torch

import tailjit
from tailjit.bench.ops.box_coders import bbox2delta
from tailjit.bench.timing import interleaved

torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)


def boxes(n):
    b = torch.rand(n, 4, generator=g) * 100
    b[:, 2:] += b[:, :2] + 1
    return b


p, t = boxes(128), boxes(128)
jit, compiled, inductor = (
    tailjit.jit(bbox2delta),
    torch.compile(bbox2delta, backend="tailjit"),
    torch.compile(bbox2delta),
)
variants = {
    "tailjit.jit": lambda: jit(p, t),
    "torch.compile(backend='tailjit')": lambda: compiled(p, t),
    "inductor": lambda: inductor(p, t),
    "eager": lambda: bbox2delta(p, t),
}
for name, r in interleaved(variants, repeats=21).items():
    print(f"{name:34s} {r.median * 1e6:8.2f} us")
