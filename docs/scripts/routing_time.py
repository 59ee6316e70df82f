"""The capsule network's routing by agreement written in plain PyTorch (``CapsuleNet.route`` after its
prediction ``einsum``, 3 rounds, then the class lengths summed), at the networks suite's sizes (batch 16, 288
input capsules of 8, 10 output capsules of 16): eager, ``tailjit.jit`` and Inductor interleaved, medians of 9
repetitions in us, 1 thread, forward (``fw``, no grad) or forward and backward (``bw``).  To compare two
commits, run it alternately with each checkout (the checkout is put first on ``sys.path``):

    python docs/scripts/routing_time.py <checkout> fw|bw
"""

import os
import sys
import tempfile

checkout, mode = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.abspath(checkout))
os.environ.setdefault("TAILJIT_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402

import tailjit  # noqa: E402
from tailjit.bench import networks as N  # noqa: E402
from tailjit.bench.timing import interleaved  # noqa: E402

torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
W = torch.randn(288, 10, 16, 8, generator=gen).mul_(0.05).requires_grad_(mode == "bw")
u = torch.randn(16, 288, 8, generator=gen)
route = N.CapsuleNet.route.__get__(N.CapsuleNet(image=28))  # 3 rounds, the reference's own code


def routing(W, u):
    v = route(torch.einsum("ijdk,bik->bijd", W, u))
    return torch.sqrt((v * v).sum(-1)).sum()


variants = {"eager": routing, "jit": tailjit.jit(routing), "inductor": torch.compile(routing)}
with torch.set_grad_enabled(mode == "bw"):
    want = routing(W, u)
    for f in variants.values():
        torch.testing.assert_close(f(W, u), want, rtol=1e-4, atol=1e-4)
    calls = {
        name: (lambda f=f: f(W, u).backward()) if mode == "bw" else (lambda f=f: f(W, u))
        for name, f in variants.items()
    }
    t = interleaved(calls, repeats=9, batch_s=0.2, warmup=1)
print(tailjit.__file__, mode, {k: round(v.median * 1e6, 1) for k, v in t.items()})
