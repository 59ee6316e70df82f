"""Eager as a candidate (``docs/jit.md``): for a few tiny functions, what ``tailjit.jit`` chose after its measured
calls, and the steady per-call time of eager, ``tailjit.jit(fn, adapt=False)`` (always compiled) and
``tailjit.jit(fn)`` (the choice), medians of 15 interleaved repetitions in us, 1 thread:

    python docs/scripts/adaptive_choice.py
"""

import torch

import tailjit
from tailjit.bench.timing import interleaved
from tailjit.frontend.adaptive import ROUNDS

torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)


def mse4(x, y):  # an element-wise loss and its mean on 4 elements
    return ((x - y) ** 2).mean()


def heads(x):  # (batch, tokens, heads * dim) -> (batch, heads, tokens, dim)
    b, t, _ = x.shape
    return x.reshape(b, t, 4, 8).permute(0, 2, 1, 3)


def small_bmm(a, b):
    return torch.bmm(a, b).relu()


def gelu_tanh(x):  # enough elements for the compiled kernel to matter
    return 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x**3)))


cases = {
    "mse4": (mse4, (torch.randn(4, generator=g), torch.randn(4, generator=g))),
    "heads": (heads, (torch.randn(2, 16, 32, generator=g),)),
    "small_bmm": (small_bmm, (torch.randn(4, 8, 8, generator=g), torch.randn(4, 8, 8, generator=g))),
    "gelu_tanh 64k": (gelu_tanh, (torch.randn(65536, generator=g),)),
}
for name, (fn, args) in cases.items():
    fixed, adaptive = tailjit.jit(fn, adapt=False), tailjit.jit(fn)
    for _ in range(1 + 2 * ROUNDS):  # compile, then the measured calls
        fixed(*args), adaptive(*args)
    print(f"{name}: {'; '.join(map(str, adaptive.choices)) or 'not measured'}")
    variants = {
        "eager": lambda fn=fn, args=args: fn(*args),
        "compiled (adapt=False)": lambda fixed=fixed, args=args: fixed(*args),
        "tailjit.jit (adapted)": lambda adaptive=adaptive, args=args: adaptive(*args),
    }
    for label, r in interleaved(variants, repeats=15).items():
        print(f"    {label:24s} {r.median * 1e6:8.2f} us")
