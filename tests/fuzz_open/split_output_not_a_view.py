# Found by `tailjit fuzz`; `python` this file to check it again.
# compile alias: output 0: got None, eager ('input', 0, (1, 2), (2, 1), 0)
# compile grad-alias: output 0: got None, eager ('input', 0, (1, 2), (2, 1), 0)
# jit alias: output 0: got None, eager ('input', 0, (1, 2), (2, 1), 0)
# jit grad-alias: output 0: got None, eager ('input', 0, (1, 2), (2, 1), 0)
"""A tailjit fuzz program: `python <this file>` checks it again (eager against both tailjit entries)."""

import torch
import torch.nn.functional as F

from tailjit.fuzz.values import gen, sprinkle


def make_inputs():
    a0 = sprinkle(torch.randn((2, 2), generator=gen(1), dtype=torch.float32), 1)
    return [a0, a0]


def fn(p0, p1):
    t0 = p0.split(1, 0)[0]
    return (t0,)


TOLERANCE = dict(reduce_len=1, magnitude=1.0, mutates=False)


if __name__ == "__main__":
    from tailjit.fuzz.check import main

    main(fn, make_inputs, TOLERANCE)
