# Found by `tailjit fuzz`; `python` this file to check it again.
# compile missing-error: eager raised RuntimeError('INDICES element is out of DATA bounds, id=1 axis_dim=1'), the entry returned
# jit missing-error: eager raised RuntimeError('INDICES element is out of DATA bounds, id=1 axis_dim=1'), the entry returned
"""A tailjit fuzz program: `python <this file>` checks it again (eager against both tailjit entries)."""

import torch
import torch.nn.functional as F

from tailjit.fuzz.values import gen, sprinkle


def make_inputs():
    a0 = torch.randn((), generator=gen(24308001), dtype=torch.float32)
    a1 = torch.randn((0, 3, 2), generator=gen(24308002), dtype=torch.float64)
    a2 = sprinkle(torch.randn((), generator=gen(24308003), dtype=torch.float64), 24308003)
    a3 = torch.randint(-2, 3, (4,), generator=gen(24308004), dtype=torch.int64)
    return [a0, a1[..., ::2], a2, a3]


def fn(p0, p1, p2, p3):
    t0 = p1.index_select(2, p3)
    return (t0,)


TOLERANCE = dict(reduce_len=1, magnitude=1.0, mutates=False)


if __name__ == "__main__":
    from tailjit.fuzz.check import main

    main(fn, make_inputs, TOLERANCE)
