"""Per-call time of a ``tailjit.jit`` function whose float argument takes a new value at every call (a
temperature or a loss weight on a schedule), with a given checkout's code: ``sigmoid(x) * alpha + (1 - alpha) *
x`` on 64x64 float32, 1 thread.  The first two calls trace; the script reports the median of the next 12 calls,
each with a new value, against eager's median and the same function called with one value throughout.  Run it
with two checkouts to compare them:

    python docs/scripts/float_argument_time.py <checkout>
"""

import os
import statistics
import sys
import tempfile
import time

checkout = sys.argv[1]
sys.path.insert(0, os.path.abspath(checkout))
os.environ.setdefault("TAILJIT_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402

import tailjit  # noqa: E402

torch.set_num_threads(1)


def blend(x, alpha):
    return torch.sigmoid(x) * alpha + (1 - alpha) * x


def per_call(fn, values, x):
    times = []
    for v in values:
        start = time.perf_counter()
        fn(x, v)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


x = torch.randn(64, 64)
values = [0.1 + 0.01 * i for i in range(14)]
changing, fixed = tailjit.jit(blend), tailjit.jit(blend)
for v in values[:2]:
    changing(x, v)
    fixed(x, 0.5)
    blend(x, v)
ms = {
    "new value each call": per_call(changing, values[2:], x),
    "one value": per_call(fixed, [0.5] * 12, x),
    "eager": per_call(blend, values[2:], x),
}
print(tailjit.__file__, {k: round(v, 4) for k, v in ms.items()}, "ms per call (medians of 12)")
