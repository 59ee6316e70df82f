# Found by `tailjit fuzz`; `python` this file to check it again.
# compile missing-error: eager raised RuntimeError("result type Long can't be cast to the desired output type Bool"), the entry returned
# jit missing-error: eager raised RuntimeError("result type Long can't be cast to the desired output type Bool"), the entry returned
"""A tailjit fuzz program: `python <this file>` checks it again (eager against both tailjit entries)."""

import torch
import torch.nn.functional as F

from tailjit.fuzz.values import gen, sprinkle


def make_inputs():
    a0 = torch.rand((3, 3, 2), generator=gen(411001)) < 0.5
    return [a0.transpose(-1, -2)]


def fn(p0):
    t0 = p0 > 0.5
    t1 = p0.bool()
    t2 = p0.amax()
    t3 = t2.masked_fill(t2, -1.5)
    t4 = t1.clone()
    t4.mul_(2)
    return (t4,)


TOLERANCE = dict(reduce_len=18, magnitude=1.0, mutates=False)


if __name__ == "__main__":
    from tailjit.fuzz.check import main

    main(fn, make_inputs, TOLERANCE)
