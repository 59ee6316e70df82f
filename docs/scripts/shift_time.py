"""ShiftNet's shift (``tailjit.bench.networks.shift``: nine slice assignments through nested views into zeros) on
16x64x32x32, eager against ``tailjit.jit``, forward under no_grad and forward plus backward, with a given checkout's
code; medians of 9 interleaved repetitions, ms, 1 thread.  Run it alternately with each checkout to compare:

    python docs/scripts/shift_time.py <checkout>
"""

import os
import sys
import tempfile

checkout = sys.argv[1]
sys.path.insert(0, os.path.abspath(checkout))
os.environ.setdefault("TAILJIT_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402

import tailjit  # noqa: E402
from tailjit.bench.networks import shift  # noqa: E402
from tailjit.bench.timing import interleaved  # noqa: E402

torch.set_num_threads(1)
x = torch.randn(16, 64, 32, 32)
xg = x.clone().requires_grad_()
jitted = tailjit.jit(shift)


def forward(fn):
    with torch.no_grad():
        return fn(x)


def training(fn):
    y = fn(xg)
    y.backward(torch.ones_like(y))


torch.testing.assert_close(forward(jitted), forward(shift))
times = interleaved({"eager forward": lambda: forward(shift), "jit forward": lambda: forward(jitted),
                     "eager training": lambda: training(shift), "jit training": lambda: training(jitted)},
                    repeats=9)  # fmt: skip
print(tailjit.__file__)
for name, t in times.items():
    print(f"{name:15s} {t.median * 1e3:.2f} ms")
