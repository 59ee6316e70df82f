# Found by `tailjit fuzz`; `python` this file to check it again.
# compile raised: BackendCompilerFailed: backend='tailjit' raised:
# jit call2-raised: BackendCompilerFailed: backend='tailjit' raised:
"""A tailjit fuzz program: `python <this file>` checks it again (eager against both tailjit entries)."""

import torch
import torch.nn.functional as F

from tailjit.fuzz.values import gen, sprinkle


def make_inputs():
    a0 = sprinkle(torch.randn((2, 2), generator=gen(1), dtype=torch.float32), 1)
    a1 = sprinkle(torch.randn((1, 2), generator=gen(2), dtype=torch.float32), 2)
    return [a0, a1.expand((2, 2))]


def fn(p0, p1):
    t0 = p1
    t0[t0 > 0] = 0
    return (t0,)


TOLERANCE = dict(reduce_len=1, magnitude=1.0, mutates=True)


if __name__ == "__main__":
    from tailjit.fuzz.check import main

    main(fn, make_inputs, TOLERANCE)
