# Found by `tailjit fuzz`; `python` this file to check it again.
# compile value: output 0: Scalars are not close!
# compile mutation: input 0 after the call: Scalars are not close!
"""A tailjit fuzz program: `python <this file>` checks it again (eager against both tailjit entries)."""

import torch
import torch.nn.functional as F

from tailjit.fuzz.values import gen, sprinkle


def make_inputs():
    a0 = sprinkle(torch.randn((), generator=gen(22130001), dtype=torch.float64), 22130001)
    return [a0]


def fn(p0):
    t0 = p0
    t0.add_(p0)
    t1 = -t0
    t2 = t1.prod()
    t3 = t1.any()
    t4 = p0 / t0
    t5 = torch.sqrt(t4)
    return (t2, t5)


TOLERANCE = dict(reduce_len=1, magnitude=1.5235465614420562, mutates=True)


if __name__ == "__main__":
    from tailjit.fuzz.check import main

    main(fn, make_inputs, TOLERANCE)
