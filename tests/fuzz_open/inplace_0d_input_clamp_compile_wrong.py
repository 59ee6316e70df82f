# Found by `tailjit fuzz`; `python` this file to check it again.
# compile value: output 1: Tensor-likes are not close!
# compile value: output 2: Tensor-likes are not close!
# compile mutation: input 1 after the call: Scalars are not close!
"""A tailjit fuzz program: `python <this file>` checks it again (eager against both tailjit entries)."""

import torch
import torch.nn.functional as F

from tailjit.fuzz.values import gen, sprinkle


def make_inputs():
    a0 = torch.randint(-5, 6, (3, 5), generator=gen(1), dtype=torch.int64)
    a1 = torch.randn((), generator=gen(2), dtype=torch.float64)
    a2 = torch.randn((1, 2), generator=gen(3), dtype=torch.float32)
    return [a0.transpose(-1, -2), a1, a2.expand((4, 2))]


def fn(p0, p1, p2):
    t0 = torch.logical_not(p0)
    t1 = p1
    t1.mul_(-1)
    t2 = torch.clamp(t1, min=t0)
    t3 = torch.where(t2 > t2, t2, t2 * 2)
    t4 = t3 != True
    t5 = p2.var(1)
    t6 = t3 @ t3.t()
    t7 = torch.atan(t3)
    return (t4, t6, t7)


TOLERANCE = dict(reduce_len=3, magnitude=4.0, mutates=True)


if __name__ == "__main__":
    from tailjit.fuzz.check import main

    main(fn, make_inputs, TOLERANCE)
