"""Compile time of a Python loop of ``torch.where(m, x, 2 * x + 1)`` under ``tailjit.jit``.

Each step reads ``x`` in both branches, so the traced body is a DAG with 2**steps paths; a compiler
pass that works per path instead of per node takes exponential time.  Prints, per step count, the
seconds of the first call (trace, fusion, C generation, gcc, the run) and whether it matches eager.

    TAILJIT_CACHE_DIR=$(mktemp -d) python docs/scripts/where_chain_compile.py 8 12 16 24 40 200
"""

import sys
import time

import torch

import tailjit

torch.set_num_threads(1)


def where_steps(x, masks):
    for k in range(masks.shape[0]):
        x = torch.where(masks[k] > 0, x, x * 2 + 1)
    return x


for steps in map(int, sys.argv[1:]):
    x, masks = torch.randn(1000), torch.randn(steps, 1000)
    t0 = time.perf_counter()
    out = tailjit.jit(where_steps)(x, masks)
    seconds = time.perf_counter() - t0
    print(f"{steps:4d} steps: {seconds:6.2f} s, matches eager: {torch.allclose(out, where_steps(x, masks))}")
