# Found by `tailjit fuzz`; `python` this file to check it again.
# compile missing-error: eager raised IndexError('index is out of bounds for dimension with size 0'), the entry returned
# jit missing-error: eager raised IndexError('index is out of bounds for dimension with size 0'), the entry returned
"""A tailjit fuzz program: `python <this file>` checks it again (eager against both tailjit entries)."""

import torch
import torch.nn.functional as F

from tailjit.fuzz.values import gen, sprinkle


def make_inputs():
    a0 = torch.rand((0, 0, 5), generator=gen(65535001)) < 0.5
    a1 = torch.randint(0, 1, (1, 2), generator=gen(65535002), dtype=torch.int64)
    return [a0, a1]


def fn(p0, p1):
    t0 = torch.softmax(p0, 1)
    t1 = t0[:, p1]
    return (t1,)


TOLERANCE = dict(reduce_len=1, magnitude=1.0, mutates=False)


if __name__ == "__main__":
    from tailjit.fuzz.check import main

    main(fn, make_inputs, TOLERANCE)
