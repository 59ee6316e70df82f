# Found by `tailjit fuzz`; `python` this file to check it again.
# compile missing-error: eager raised RuntimeError("result type Float can't be cast to the desired output type Bool"), the entry returned
# jit missing-error: eager raised RuntimeError("result type Float can't be cast to the desired output type Bool"), the entry returned
"""A tailjit fuzz program: `python <this file>` checks it again (eager against both tailjit entries)."""

import torch
import torch.nn.functional as F

from tailjit.fuzz.values import gen, sprinkle


def make_inputs():
    a0 = torch.randint(-5, 6, (5, 5), generator=gen(4503001), dtype=torch.int32)
    a1 = torch.rand((1, 5, 3), generator=gen(4503002)) < 0.5
    a2 = torch.randn((3, 5), generator=gen(4503003), dtype=torch.float64)
    return [a0, a1.transpose(-1, -2), a2[..., 1:], a2[..., :-1]]


def fn(p0, p1, p2, p3):
    t0 = torch.div(p0, -1, rounding_mode='floor')
    t1 = p3.sum()
    t2 = p0.contiguous()
    t3 = torch.isnan(t2)
    t4 = t3.clone()
    t4[0] *= 0.5
    return (t4,)


TOLERANCE = dict(reduce_len=12, magnitude=2.0492279385502385, mutates=False)


if __name__ == "__main__":
    from tailjit.fuzz.check import main

    main(fn, make_inputs, TOLERANCE)
