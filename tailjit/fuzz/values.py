"""What a reproducer's ``make_inputs`` calls: seeded generators and special values."""

from __future__ import annotations

import torch

#: The values that break kernels that only saw random normals: NaN, both infinities, negative zero, and a
#: magnitude whose square overflows float32.
SPECIALS = (float("nan"), float("inf"), float("-inf"), -0.0, 1e20, -1e20)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def sprinkle(t: torch.Tensor, seed: int) -> torch.Tensor:
    """``t`` (a fresh float tensor) with about a quarter of its elements replaced by special values, in place."""
    g = gen(seed)
    flat = t.view(-1)
    hit = torch.rand(flat.shape, generator=g) < 0.25
    pick = torch.randint(0, len(SPECIALS), flat.shape, generator=g)
    flat[hit] = torch.tensor(SPECIALS, dtype=t.dtype)[pick[hit]]
    return t


def maxabs(t: torch.Tensor) -> float:
    """The largest finite magnitude in ``t`` (0 for an integer or empty tensor)."""
    if not t.dtype.is_floating_point or t.numel() == 0:
        return 0.0
    finite = t.detach()[torch.isfinite(t.detach())]
    return float(finite.abs().max()) if finite.numel() else 0.0
