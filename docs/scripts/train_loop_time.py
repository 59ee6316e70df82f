"""A benchmark task's training call under ``tailjit.jit`` (forward, then backward of ones through the tensors
of ``op.grad_argnums``) repeated for ``seconds``, with a given checkout's code; prints ms per call, 1 thread.
Run it alternately with each checkout to compare two commits:

    python docs/scripts/train_loop_time.py <checkout> pairwise_iou large 5
"""

import os
import sys
import tempfile
import time

checkout, name, size, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
sys.path.insert(0, os.path.abspath(checkout))
os.environ.setdefault("TAILJIT_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402

import tailjit  # noqa: E402
from tailjit.bench.registry import all_operators  # noqa: E402

torch.set_num_threads(1)
op = all_operators()[name]
args = op.training_inputs(size, 0)
f = tailjit.jit(op.fn)


def call():
    out = f(*args)
    outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o.requires_grad]
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])


call()  # compile
start, n = time.perf_counter(), 0
while time.perf_counter() - start < seconds:
    call()
    n += 1
per_call = (time.perf_counter() - start) / n * 1e3
print(f"{tailjit.__file__} {name} {size}: {per_call:.2f} ms per training call ({n} calls)")
