"""``tailjit.build``: tensor expressions to a callable compiled kernel."""

from __future__ import annotations

import time

from tailjit.codegen import generate
from tailjit.fusion import partition, reachable
from tailjit.runtime.compiler import PLACEHOLDER, load
from tailjit.runtime.kernel import Kernel
from tailjit.schedule import Schedule, default_schedule
from tailjit.te.analysis import check_bounds
from tailjit.te.expr import TEError, Tensor


def build(outputs, inputs, name: str | None = None, schedules: dict[str, Schedule] | None = None) -> Kernel:
    """Compile the computes ``outputs`` (a tensor or a list) over the placeholders ``inputs``.

    ``schedules`` overrides the default schedule of kernels by the name of the
    tensor they compute (see ``Kernel.kernels``)."""
    start = time.perf_counter()
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    ins = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    if not outs:
        raise TEError("build needs at least one output")
    program = partition(ins, outs)
    for t in _computes(program):
        check_bounds(t)
    chosen = {k.name: default_schedule(k) for k in program.kernels}
    for key, s in (schedules or {}).items():
        if key not in chosen:
            raise TEError(f"schedule given for {key!r}, which is not a kernel; kernels: {sorted(chosen)}")
        chosen[key] = s
    name = name or outs[0].name
    source = generate(program, chosen, name, PLACEHOLDER)
    module, info = load(source)
    return Kernel(name, program, chosen, source, module, info, time.perf_counter() - start)


def _computes(program) -> list[Tensor]:
    return [t for t in reachable(program.outputs) if not t.is_placeholder]
