# Found by `tailjit fuzz`; `python` this file to check it again.
# compile grad-value: gradient of float input 2: Tensor-likes are not close!
# jit grad-value: gradient of float input 2: Tensor-likes are not close!
"""A tailjit fuzz program: `python <this file>` checks it again (eager against both tailjit entries)."""

import torch
import torch.nn.functional as F

from tailjit.fuzz.values import gen, sprinkle


def make_inputs():
    a0 = sprinkle(torch.randn((2, 2), generator=gen(255001), dtype=torch.float32), 255001)
    a1 = sprinkle(torch.randn((2, 2), generator=gen(255002), dtype=torch.float32), 255002)
    a2 = sprinkle(torch.randn((1, 1), generator=gen(255003), dtype=torch.float32), 255003)
    return [a0, a1, a2.expand((2, 1)), a0]


def fn(p0, p1, p2, p3):
    t0 = F.gelu(p2)
    t1 = torch.exp(t0)
    return (t1,)


TOLERANCE = dict(reduce_len=1, magnitude=1.0000000200408773e+20, mutates=False)


if __name__ == "__main__":
    from tailjit.fuzz.check import main

    main(fn, make_inputs, TOLERANCE)
