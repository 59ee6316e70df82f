"""Backward kernels of softmax and layer norm (``tailjit bench --suite autodiff``'s TE programs, 1024 x 1024,
float32, 1 thread): reading the row statistics the forward saved as side outputs (A) against recomputing
them (B, the kernel built without saved outputs), and torch's fused backward, timed interleaved.

    python docs/scripts/saved_stats_ab.py
"""

import torch

import tailjit
from tailjit.bench.autodiff import CASES
from tailjit.bench.timing import interleaved
from tailjit.runtime.kernel import gradient_spec


def measure(case) -> None:
    ins, y = case.program()
    mask = (True,) * len(ins)
    _, saved = gradient_spec([y], ins, y.name, mask, save_buffered=True)
    with_saved = tailjit.build([y, *saved], ins)
    with_saved.mark_saved(len(saved))
    plain = tailjit.build(y, ins)
    gen = torch.Generator().manual_seed(0)
    args = [torch.randn(s, generator=gen) for s in case.shapes]
    outs = with_saved(*args)
    head = torch.randn(outs[0].shape, generator=gen)
    leaves = [a.clone().requires_grad_() for a in args]
    fused = case.fused(*leaves)
    a, b = with_saved.gradient_kernel(mask), plain.gradient_kernel(mask)
    for u, v in zip(a(*args, *outs, head), b(*args, outs[0], head)):
        torch.testing.assert_close(u, v, rtol=1e-4, atol=1e-5)
    t = interleaved(
        {
            "A saved": lambda: a(*args, *outs, head),
            "B recomputed": lambda: b(*args, outs[0], head),
            "torch fused": lambda: torch.autograd.grad(fused, leaves, head, retain_graph=True),
            "A forward": lambda: with_saved(*args),
            "B forward": lambda: plain(*args),
        },
        repeats=15,
        batch_s=0.05,
    )
    med = {k: v.median * 1e3 for k, v in t.items()}
    print(f"{case.name}: saved {[s.name for s in saved]}; " + ", ".join(f"{k} {v:.3f} ms" for k, v in med.items()))
    print(
        f"  backward B/A {med['B recomputed'] / med['A saved']:.2f}, "
        f"torch/A {med['torch fused'] / med['A saved']:.2f}, forward A/B {med['A forward'] / med['B forward']:.2f}"
    )


if __name__ == "__main__":
    torch.set_num_threads(1)
    for case in CASES[:2]:
        measure(case)
