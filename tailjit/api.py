"""``tailjit.build``: tensor expressions to a callable compiled kernel."""

from __future__ import annotations

import contextlib
import time
from types import SimpleNamespace

from tailjit.codegen import generate, generate_many, program_body
from tailjit.fusion import LoopProgram, partition
from tailjit.loop_merge import merge_loops
from tailjit.runtime.collector import full_collections_deferred
from tailjit.runtime.compiler import PLACEHOLDER, load
from tailjit.runtime.kernel import Kernel
from tailjit.schedule import Schedule, default_schedule
from tailjit.te.analysis import check_bounds
from tailjit.te.expr import TEError, Tensor
from tailjit.te.graph import reachable
from tailjit.tunedb.db import tuned


@full_collections_deferred()
def build(outputs, inputs, name: str | None = None, schedules: dict[str, Schedule] | None = None) -> Kernel:
    """Compile the computes ``outputs`` (a tensor or a list) over the placeholders ``inputs``.

    ``schedules`` overrides the default schedule of kernels by the name of the
    tensor they compute (see ``Kernel.kernels``)."""
    start = time.perf_counter()
    with _nesting_checked():
        program, chosen, name = prepare(outputs, inputs, name, schedules)
        source = generate(program, chosen, name, PLACEHOLDER)
    module, info = load(source)
    return Kernel(name, program, chosen, source, module, info, time.perf_counter() - start, build)


@full_collections_deferred()
def build_many(specs) -> list[Kernel]:
    """Compile several programs, each ``(outputs, inputs, name)``, in one translation unit: one C
    compile for all of them (the frontend builds every region of a graph this way).  The kernels are
    the same as ``build`` would give, in order."""
    start = time.perf_counter()
    with _nesting_checked():
        prepared = [prepare(outs, ins, name, None) for outs, ins, name in specs]
        if len(prepared) == 1:  # the same source as build's, so that the two share cache entries
            source = generate(*prepared[0], PLACEHOLDER)
            module, info = load(source)
            seconds = time.perf_counter() - start
            return [Kernel(prepared[0][2], *prepared[0][:2], source, module, info, seconds, build)]
        bodies = [program_body(*p) for p in prepared]
    unique = list(dict.fromkeys(b for b, _ in bodies))  # equal programs share one entry point
    slot = {b: i for i, b in enumerate(unique)}
    methods = {b: m for b, m in bodies}
    source = generate_many([(b, methods[b]) for b in unique], PLACEHOLDER)
    module, info = load(source)
    seconds = time.perf_counter() - start
    kernels = []
    for (program, chosen, name), (body, _) in zip(prepared, bodies):
        i = slot[body]
        entry = SimpleNamespace(
            call=getattr(module, f"call_{i}"),
            call_plain=getattr(module, f"call_plain_{i}"),
            set_fallback=getattr(module, f"set_fallback_{i}"),
        )
        kernels.append(Kernel(name, program, chosen, source, entry, info, seconds, build))
    return kernels


@contextlib.contextmanager
def _nesting_checked():
    """A compute body nested thousands of operations deep (fusion keeps its own inlining shallower)
    exhausts the recursive passes over expressions: a clear error instead of a RecursionError."""
    try:
        yield
    except RecursionError:
        raise TEError(
            "an expression is nested too deeply to compile (thousands of operations in one compute's body); "
            "build it from several computes"
        ) from None


def prepare(outputs, inputs, name, schedules) -> tuple[LoopProgram, dict[str, Schedule], str]:
    """The program ``build`` compiles (fusion's kernels), each kernel's schedule (the caller's, else the tuning
    database's, else the default) and the program's name."""
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    ins = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    if not outs:
        raise TEError("build needs at least one output")
    program = partition(ins, outs)
    for t in _computes(program):
        check_bounds(t)
    program = merge_loops(program, keep=frozenset(schedules or ()))
    chosen = {k.name: default_schedule(k) for k in program.kernels}
    chosen.update(tuned(k for k in program.kernels if k.name not in (schedules or {})))  # docs/tuning.md
    for key, s in (schedules or {}).items():
        if key not in chosen:
            raise TEError(f"schedule given for {key!r}, which is not a kernel; kernels: {sorted(chosen)}")
        chosen[key] = s
    return program, chosen, name or outs[0].name


def _computes(program) -> list[Tensor]:
    return [t for t in reachable(program.outputs) if not t.is_placeholder]
