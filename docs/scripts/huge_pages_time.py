"""Page faults and time of ``sequence_mask`` at its large size (a 512 x 512 x 64 float32 multiply by a mask, 64 MiB
out): eager against ``tailjit.jit``, forward and training call, medians of 7 interleaved repetitions, 1 thread, with
the minor page faults of one call of each.  Run it with and without huge pages for tailjit's outputs, and with
PyTorch's own huge pages for every tensor:

    python docs/scripts/huge_pages_time.py
    TAILJIT_HUGE_PAGES=0 python docs/scripts/huge_pages_time.py
    THP_MEM_ALLOC_ENABLE=1 python docs/scripts/huge_pages_time.py
"""

import resource

import torch

import tailjit
from tailjit.bench.registry import all_operators
from tailjit.bench.timing import interleaved

torch.set_num_threads(1)
op = all_operators()["sequence_mask"]
x, lengths = op.inputs("large", 0)
leaf = x.clone().requires_grad_()
f = tailjit.jit(op.fn)


def training(fn):
    out = fn(leaf, lengths)[0]
    torch.autograd.backward([out], [torch.ones_like(out)])


def faults(call) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    call()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


training(f), training(op.fn)
print("faults of a training call: eager", faults(lambda: training(op.fn)), "tailjit.jit", faults(lambda: training(f)))
t = interleaved(
    {
        "eager fwbw": lambda: training(op.fn),
        "jit fwbw": lambda: training(f),
        "eager fw": lambda: op.fn(x, lengths),
        "jit fw": lambda: f(x, lengths),
    },
    repeats=7,
    batch_s=0.3,
)
print({k: round(v.median * 1e3, 2) for k, v in t.items()}, "ms")
