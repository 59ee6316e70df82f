# Found by `tailjit fuzz`; `python` this file to check it again.
# compile grad-value: gradient of float input 0: Tensor-likes are not close!
# jit grad-value: gradient of float input 0: Tensor-likes are not close!
"""A tailjit fuzz program: `python <this file>` checks it again (eager against both tailjit entries)."""

import torch
import torch.nn.functional as F

from tailjit.fuzz.values import gen, sprinkle


def make_inputs():
    a0 = sprinkle(torch.randn((3, 2), generator=gen(1001), dtype=torch.float32), 1001)
    return [a0]


def fn(p0):
    t0 = torch.atan2(p0, p0)
    t1 = torch.exp(t0)
    return (t1,)


TOLERANCE = dict(reduce_len=1, magnitude=3.1415927410125732, mutates=False)


if __name__ == "__main__":
    from tailjit.fuzz.check import main

    main(fn, make_inputs, TOLERANCE)
