# Found by `tailjit fuzz`; `python` this file to check it again.
# compile raised: IndexError: tailjit kernel 'tailjit_region': an index computed from input data is out of bounds
# jit call2-raised: IndexError: tailjit kernel 'tailjit_region': an index computed from input data is out of bounds
"""A tailjit fuzz program: `python <this file>` checks it again (eager against both tailjit entries)."""

import torch
import torch.nn.functional as F

from tailjit.fuzz.values import gen, sprinkle


def make_inputs():
    a0 = torch.rand((1, 0), generator=gen(1305001)) < 0.5
    a1 = torch.randint(-5, 6, (), generator=gen(1305002), dtype=torch.int32)
    a2 = torch.randint(-5, 6, (1, 5), generator=gen(1305003), dtype=torch.int32)
    a3 = torch.randint(0, 8, (2,), generator=gen(1305004), dtype=torch.int64)
    a4 = torch.randint(0, 2, (0,), generator=gen(1305005), dtype=torch.int64)
    a5 = torch.randint(-5, 6, (3, 5), generator=gen(1305006), dtype=torch.int32)
    a6 = torch.randint(0, 1, (3,), generator=gen(1305007), dtype=torch.int64)
    return [a0.expand((0, 0)), a1, a2.expand((4, 5)), a3, a4, a5, a6]


def fn(p0, p1, p2, p3, p4, p5, p6):
    t0 = torch.round(p2)
    t1 = torch.cat([t0, t0], -2)
    t2 = t1 > p1
    t3 = F.embedding(p3, t2)
    t4 = t3 & p1
    t5 = F.embedding(p4, t4)
    t6 = torch.nan_to_num(t5)
    t7 = t6.index_add(0, p6, p5)
    return (t3, t7)


TOLERANCE = dict(reduce_len=4, magnitude=1.0, mutates=False)


if __name__ == "__main__":
    from tailjit.fuzz.check import main

    main(fn, make_inputs, TOLERANCE)
