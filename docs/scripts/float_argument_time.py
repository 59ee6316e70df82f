"""Per-call time of a ``tailjit.jit`` function whose float argument takes a new value at every call (a
temperature or a loss weight on a schedule), with a given checkout's code: ``sigmoid(x) * alpha + (1 - alpha) *
x`` on 64x64 float32, 1 thread.  The first two calls trace; then the function called with one value throughout
and eager, 12 rounds of one call each in turn; the function called with a new value each call and eager, the same
way; and the float as a jitted module's attribute set anew before each call (an annealed temperature) and eager;
medians.  Run it with two checkouts to compare them:

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


def timed(fn, *args) -> float:
    start = time.perf_counter()
    fn(*args)
    return time.perf_counter() - start


class Tempered(torch.nn.Module):
    """The float as a module's setting (an annealed temperature)."""

    def __init__(self):
        super().__init__()
        self.alpha = 0.5

    def forward(self, x):
        return blend(x, self.alpha)


x = torch.randn(64, 64)
changing, fixed = tailjit.jit(blend), tailjit.jit(blend)
module = Tempered()
jitted_module = tailjit.jit(module)
for v in (0.1, 0.11):
    changing(x, v)
    fixed(x, 0.5)
    module.alpha = v
    jitted_module(x)
    blend(x, v)


def new_setting(v):
    module.alpha = v
    return jitted_module(x)


# phases of 12 rounds of one call of each in turn: the retraces of a variant where a new value traces again would
# slow the calls that follow them in their phase
ms: dict = {}
variants = {"one value": lambda v: fixed(x, 0.5), "new value each call": lambda v: changing(x, v),
            "module setting, new each call": new_setting}  # fmt: skip
for phase, call in variants.items():
    for i in range(12):
        v = 0.12 + 0.01 * i
        ms.setdefault(phase, []).append(timed(call, v))
        ms.setdefault(f"eager ({phase})", []).append(timed(blend, x, v))
print(tailjit.__file__, {k: round(statistics.median(t) * 1e3, 4) for k, t in ms.items()}, "ms per call (medians of 12)")
