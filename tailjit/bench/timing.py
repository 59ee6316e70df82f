"""The measurement harness: interleaved repetitions, medians and ratios.

Every comparison in tailjit (the operator suite, the models, the compiler's
own benchmarks) goes through :func:`interleaved`, so that all variants see the
same machine noise: one repetition times a batch of calls of each variant in
turn, and the reported number is the median over repetitions.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """Per-call seconds of one variant over the repetitions."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """Inter-quartile range relative to the median (a noise indicator)."""
        if len(self.samples) < 4:
            return 0.0
        q = statistics.quantiles(self.samples, n=4)
        return (q[2] - q[0]) / self.median if self.median else 0.0


def calls_per_batch(fn: Callable[[], object], target_s: float) -> int:
    """How many calls of ``fn`` take about ``target_s`` seconds (at least one)."""
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= target_s / 4 or n >= 1 << 20:
            return max(1, int(n * target_s / max(elapsed, 1e-9)))
        n *= 4


def interleaved(
    variants: dict[str, Callable[[], object]],
    *,
    repeats: int = 15,
    batch_s: float = 0.02,
    warmup: int = 2,
) -> dict[str, Timing]:
    """Time each variant ``repeats`` times, round-robin, and return per-call seconds.

    Each variant runs in batches sized to take about ``batch_s`` seconds, so
    that microsecond calls are not dominated by the timer.  Variants run in
    turn inside every repetition; the order rotates to cancel drift.
    """
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    batches = {name: calls_per_batch(fn, batch_s) for name, fn in variants.items()}
    samples: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for rep in range(repeats):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            fn, n = variants[name], batches[name]
            start = time.perf_counter()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter() - start) / n)
    return {name: Timing(tuple(s)) for name, s in samples.items()}
