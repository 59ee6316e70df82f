"""Steady calls of ``tailjit.jit(lambda x: x * 2.0 + 1.0)`` on float32 vectors of 4 to 64 MiB: the median
time of 15 calls and the minor page faults a call, 1 thread.  Run it with and without huge pages for
tailjit's outputs (outputs of 32 MiB or more are advised since dc3fb23):

    python docs/scripts/output_faults.py
    TAILJIT_HUGE_PAGES=0 python docs/scripts/output_faults.py

With ``first``, the first call of a compiled graph in a fresh process instead (``pairwise_iou`` large fw,
an 8 MiB output; run it in a loop of fresh processes to see how often it stalls):

    python docs/scripts/output_faults.py first
"""

import importlib
import os
import resource
import statistics
import sys
import time

import torch

import tailjit

torch.set_num_threads(1)
setting = os.environ.get("TAILJIT_HUGE_PAGES", "1")
if sys.argv[1:] == ["first"]:
    from tailjit.bench.ops import all_operators

    jit = importlib.import_module("tailjit.frontend.jit")
    compile_graph, firsts = jit.compile_graph, []

    def timed_graph(*a, **k):
        host = compile_graph(*a, **k)
        fn = host.fn

        def call(*x):
            start = time.perf_counter()
            out = fn(*x)
            firsts.append(time.perf_counter() - start)
            return out

        host.fn = call
        return host

    jit.compile_graph = timed_graph
    op = all_operators()["pairwise_iou"]
    tailjit.jit(op.fn)(*op.inputs("large", 0))
    print(f"huge pages {setting}: first call of the compiled graph {firsts[0] * 1000:.1f} ms")
    sys.exit()
f = tailjit.jit(lambda x: x * 2.0 + 1.0)
row = []
for mib in (4, 8, 16, 24, 33, 64):
    x = torch.rand(mib << 18)
    f(x), f(x)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    times = []
    for _ in range(15):
        start = time.perf_counter()
        y = f(x)
        times.append(time.perf_counter() - start)
        del y
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 15
    row.append(f"{mib} MiB {statistics.median(times) * 1000:.2f} ms {faults:.0f} faults")
print(f"huge pages {setting}:", " | ".join(row))
