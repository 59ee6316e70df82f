"""A recurrent weight's gradient over 16 steps, as AOTAutograd's backward computes it (one product per step,
added up) and as one product of the stacked steps, 1 thread, medians of interleaved repetitions in us
(docs/performance.md, "Cut loops": the product-sum rewrite that was tried):

    python docs/scripts/product_sum_time.py
"""

import torch

from tailjit.bench.timing import interleaved

torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
grads = [torch.randn(32, 384, generator=gen) for _ in range(16)]  # LLTM: batch 32, 3 gates of 128
inputs = [torch.randn(32, 160, generator=gen) for _ in range(16)]  # [h, x]: 128 + 32


def per_step():
    acc = grads[0].t() @ inputs[0]
    for g, x in zip(grads[1:], inputs[1:]):
        acc = acc + g.t() @ x
    return acc


def stacked():
    return torch.cat(grads).t() @ torch.cat(inputs)


torch.testing.assert_close(per_step(), stacked(), rtol=1e-4, atol=1e-4)
t = interleaved({"per step": per_step, "stacked": stacked}, repeats=9, batch_s=0.2, warmup=1)
print({k: round(v.median * 1e6, 1) for k, v in t.items()})
