"""The layer norm backward of ``tailjit bench --suite autodiff`` (1024 x 1024 float32, x, gamma and beta,
the forward's mean and variance saved), called directly: medians of 15 batches of 50 calls, in ms, 1
thread. To compare two commits, run it alternately from two checkouts (``PYTHONPATH=<other checkout>``).

    python docs/scripts/layer_norm_backward_time.py
"""

import statistics
import time

import torch

import tailjit
from tailjit.bench.autodiff import _layer_norm
from tailjit.runtime.kernel import gradient_spec

torch.set_num_threads(1)
ins, y = _layer_norm()
spec, saved = gradient_spec([y], ins, y.name, (True,) * 3, save_buffered=True)
forward = tailjit.build([y, *saved], ins)
forward.mark_saved(len(saved))
backward = tailjit.build(*spec)
args = [torch.randn(1024, 1024), torch.randn(1024), torch.randn(1024)]
outs, head = forward(*args), torch.randn(1024, 1024)
times = []
for _ in range(15):
    start = time.perf_counter()
    for _ in range(50):
        backward(*args, *outs, head)
    times.append((time.perf_counter() - start) / 50 * 1e3)
print(tailjit.__file__, round(statistics.median(times), 3))
