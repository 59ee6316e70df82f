"""Eager, Inductor and ``tailjit.jit`` on benchmark tasks, interleaved in one process (1 thread): each
variant called twice (``interleaved``'s warm-up), then 11 interleaved repetitions; medians in ms.

    python docs/scripts/three_way.py sigmoid_focal_loss:large:fw label_smoothing_ce:large:fw
"""

import sys

import torch

import tailjit
from tailjit.bench.registry import all_operators
from tailjit.bench.timing import interleaved


def calls(name: str, size: str, mode: str) -> dict:
    op = all_operators()[name]
    args = op.training_inputs(size, 0) if mode == "fwbw" else op.inputs(size, 0)
    fns = {"eager": op.fn, "inductor": torch.compile(lambda *a: op.fn(*a)), "jit": tailjit.jit(lambda *a: op.fn(*a))}

    def call(f):
        out = f(*args)
        if mode == "fwbw":
            outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if o.requires_grad]
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])

    return {k: (lambda f=f: call(f)) for k, f in fns.items()}


if __name__ == "__main__":
    torch.set_num_threads(1)
    for task in sys.argv[1:]:
        variants = calls(*task.split(":"))
        r = interleaved(variants, repeats=11)
        print(task, {k: round(v.median * 1e3, 2) for k, v in r.items()}, flush=True)
