"""The generated check of a jitted module's tree (``captures.quick_call``), alone, with a given checkout's code:
the quick call of a 3-layer MLP and of four Conv2d-BatchNorm2d-ReLU blocks (eval), its JitFunction replaced by
a stub, in us, ``timeit`` minimum of 3 x 20000 calls, 1 thread.  Run it with two checkouts to compare them:

    python docs/scripts/module_check_time.py <checkout>
"""

import os
import sys
import timeit

sys.path.insert(0, os.path.abspath(sys.argv[1]))

import torch  # noqa: E402

from tailjit.frontend.trace import captures  # noqa: E402

torch.set_num_threads(1)
nn = torch.nn
models = {
    "MLP (6 modules)": nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4)),
    "conv blocks (17 modules)": nn.Sequential(
        *[nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU()) for _ in range(4)]
    ).eval(),
}


class Stub:
    fast = [lambda *args: 1]  # a fast path that always answers


times = {}
for name, model in models.items():
    found = captures.sources(model)
    key, tensors = captures.gather(found)
    quick = captures.quick_call(found, key, tensors, Stub, object(), RuntimeError)
    assert quick((1,), {}) == 1  # the check passes
    times[name] = round(min(timeit.repeat(lambda q=quick: q((1,), {}), number=20000, repeat=3)) / 20000 * 1e6, 2)
print(captures.__file__, times, "us a check")
