"""Row reductions of a 4096x4096 float32 matrix (64 MB, read from memory) by eager PyTorch,
Inductor and ``tailjit.jit``, interleaved in one process (1 thread), medians in ms:

    python docs/scripts/row_reductions.py
"""

import torch

import tailjit
from tailjit.bench.timing import interleaved

torch.set_num_threads(1)
x = torch.randn(4096, 4096)
reductions = {"amax": lambda x: x.amax(1), "sum": lambda x: x.sum(1), "logsumexp": lambda x: x.logsumexp(1)}
calls = {}
for name, fn in reductions.items():
    for label, f in (("eager", fn), ("inductor", torch.compile(fn)), ("jit", tailjit.jit(fn))):
        calls[f"{name} {label}"] = lambda f=f: f(x)
r = interleaved(calls, repeats=21)
for k, v in r.items():
    print(f"{k:20s} {v.median * 1e3:7.2f}")
