# Found by `tailjit fuzz`; `python` this file to check it again.
# compile value: output 0: Tensor-likes are not close!
# compile grad-value: output 0: Tensor-likes are not close!
# compile grad-value: gradient of float input 0: Tensor-likes are not close!
# jit value: output 0: Tensor-likes are not close!
# jit grad-value: output 0: Tensor-likes are not close!
# jit grad-value: gradient of float input 0: Tensor-likes are not close!
"""A tailjit fuzz program: `python <this file>` checks it again (eager against both tailjit entries)."""

import torch
import torch.nn.functional as F

from tailjit.fuzz.values import gen, sprinkle


def make_inputs():
    a0 = sprinkle(torch.randn((3, 3), generator=gen(1), dtype=torch.float32), 1)
    return [a0]


def fn(p0):
    t0 = torch.where(p0 > 0, p0, -p0)
    t1 = t0.norm(dim=0, keepdim=True)
    return (t1,)


TOLERANCE = dict(reduce_len=3, magnitude=1.7726380825042725, mutates=False)


if __name__ == "__main__":
    from tailjit.fuzz.check import main

    main(fn, make_inputs, TOLERANCE)
