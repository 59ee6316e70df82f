"""``tailjit.jit``'s first call of a benchmark task with a given checkout's code, and the garbage collections
that ran during it: each repetition compiles cold (kernel caches emptied, a new function) after a full
collection, in a process whose heap is a benchmark worker's (three functions compiled by Inductor first:
about 390k objects), then times one more full collection, the one the compile's garbage owes.  Prints each
repetition (collections per generation, their seconds) and the median first call of the repetitions after
the first.  Run it alternately with two checkouts (``git worktree add``):

    python docs/scripts/compile_gc.py <checkout> gae small fw 4
"""

import gc
import os
import shutil
import statistics
import sys
import tempfile
import time

checkout, name, size, mode, reps = sys.argv[1:6]
sys.path.insert(0, os.path.abspath(checkout))
os.environ["TAILJIT_CACHE_DIR"] = cache = tempfile.mkdtemp()

import torch  # noqa: E402

import tailjit  # noqa: E402
from tailjit.bench.registry import all_operators  # noqa: E402
from tailjit.runtime import compiler  # noqa: E402

torch.set_num_threads(1)
counts, seconds, started = [0, 0, 0], [0.0, 0.0, 0.0], [0.0]


def note(phase, info):
    if phase == "start":
        started[0] = time.perf_counter()
    else:
        counts[info["generation"]] += 1
        seconds[info["generation"]] += time.perf_counter() - started[0]


gc.callbacks.append(note)
ops = all_operators()
for other in ("giou", "pairwise_iou", "bbox2delta"):
    torch.compile(ops[other].fn, backend="inductor")(*ops[other].inputs("small", 0))
    torch._dynamo.reset()
op, firsts = ops[name], []
for rep in range(int(reps)):
    for entry in os.listdir(cache):
        if entry != "pch":
            shutil.rmtree(os.path.join(cache, entry))
    compiler._loaded.clear()
    args = op.training_inputs(size, 0) if mode == "fwbw" else op.inputs(size, 0)
    f = tailjit.jit(op.fn)
    gc.collect()
    counts[:], seconds[:] = [0, 0, 0], [0.0, 0.0, 0.0]
    start = time.perf_counter()
    out = f(*args)
    if mode == "fwbw":
        outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o.requires_grad]
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    first = time.perf_counter() - start
    during = (list(counts), round(sum(seconds), 3))
    start = time.perf_counter()
    gc.collect()
    after = time.perf_counter() - start
    firsts += [first] if rep else []
    print(f"{name} {size} {mode}: first call {first:.3f} s, collections during it {during[0]} ({during[1]} s), "
          f"full collection after {after:.3f} s")  # fmt: skip
print(tailjit.__file__, f"median first call after the first: {statistics.median(firsts):.3f} s")
