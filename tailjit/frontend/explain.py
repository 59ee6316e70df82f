"""``explain_graph``: what the tailjit backend makes of a function."""

from __future__ import annotations

import torch


def explain_graph(fn, *args, **kwargs) -> str:
    """Compile ``fn`` with the tailjit backend, run it once on ``args`` and describe every captured graph:
    the Dynamo graph, its ATen graph, the compiled kernels (``Kernel.describe()`` and the generated C)
    and each node that runs eagerly, with the reason."""
    from tailjit.frontend.backend import tailjit_backend

    reports = []

    def backend(gm, example_inputs):
        from tailjit.frontend.backend import REPORTS

        out = tailjit_backend(gm, example_inputs)
        reports.append(REPORTS[-1])
        return out

    torch.compile(fn, backend=backend)(*args, **kwargs)
    lines = [f"tailjit: {len(reports)} graph(s) captured"]
    for gi, r in enumerate(reports):
        lines.append(f"\n=== graph {gi} ===\n--- captured (Dynamo) ---\n{r.captured.strip()}")
        if r.aten:
            lines.append(f"--- ATen ---\n{r.aten.strip()}")
        if r.eager_reason:
            lines.append(f"--- runs eagerly: {r.eager_reason}")
            continue
        lines.append(f"--- {len(r.kernels)} compiled region(s) ---")
        for k, nodes in r.kernels:
            lines.append(f"region {k.name}: nodes {', '.join(nodes)}")
            lines.append(k.describe())
        lines.append(f"--- {len(r.fallbacks)} fallback(s) ---")
        lines += [f"  {f}" for f in r.fallbacks] or ["  none"]
        for k, _ in r.kernels:
            lines.append(f"--- C source of {k.name} ---\n{k.source}")
    return "\n".join(lines)
