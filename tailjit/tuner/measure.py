"""Measuring a candidate schedule in a worker process, and recording the result in the tuning database.

A candidate is a program (Python source that defines ``outputs`` and ``inputs``, as ``tailjit.build`` takes
them), the name of one of its kernels, a schedule for it, and values of the program's size variables.  The
worker (``tailjit.fuzz.worker``'s long-lived process, running this module's :func:`answer`) builds the program
with its default schedules and with the candidate, calls both on the same random inputs of those sizes, checks
that they agree, and times both with the suite's interleaved timing (``tailjit.bench.timing``); the worker
builds with the database's lookup off, so that its default is the default.  The parent records the default and
the candidate, or, where the candidate failed (an error, results that differ from the default's, a crash, no
answer within the time limit: the worker is then killed), the candidate as a failed record.  A crashing or
hanging candidate never takes the caller's process down.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from tailjit import api
from tailjit.bench.timing import interleaved
from tailjit.fuzz.worker import Failure, Worker, serve
from tailjit.schedule import Schedule, default_schedule
from tailjit.te.expr import Const, SizeVar
from tailjit.tunedb import db

#: (rtol, atol): a candidate may sum in another order than the default
TOLERANCE = (1e-4, 1e-5)


@dataclasses.dataclass(frozen=True)
class Candidate:
    source: str  # Python source defining ``outputs`` and ``inputs``
    kernel: str  # the name of the kernel the schedule is for
    schedule: Schedule
    sizes: dict[str, int]  # the size variables' values, by name
    repeats: int = 15  # interleaved repetitions
    batch_s: float = 0.02  # seconds per timed batch


def measuring_worker(timeout: float = 300.0, log=None) -> Worker:
    """A worker process for :func:`measure` (one process for many candidates: starting torch costs seconds)."""
    return Worker(timeout, log, module=__name__, env={**os.environ, db.LOOKUP_ENV: "0"})


def measure(candidate: Candidate, worker: Worker) -> list[db.Record]:
    """Measure ``candidate`` in ``worker`` and record it: the default's and the candidate's records, or the
    candidate's failed one."""
    kernel = _kernel(candidate)
    answer = worker.ask({
        "source": candidate.source, "kernel": candidate.kernel, "schedule": dataclasses.asdict(candidate.schedule),
        "sizes": candidate.sizes, "repeats": candidate.repeats, "batch_s": candidate.batch_s,
    })  # fmt: skip
    if isinstance(answer, Failure):
        # the worker had this process's thread count: it inherits its environment
        answer = {"failure": f"{answer.kind}: {answer.message}", "threads": torch.get_num_threads()}
    if answer.get("failure") is not None:
        failed = db.record(kernel, candidate.schedule, [], answer["threads"], candidate.sizes, answer["failure"])
        return [failed]
    return [
        db.record(kernel, default_schedule(kernel), answer["default"], answer["threads"], candidate.sizes),
        db.record(kernel, candidate.schedule, answer["candidate"], answer["threads"], candidate.sizes),
    ]


def _program(source: str) -> tuple:
    ns: dict = {}
    exec(compile(source, "<candidate>", "exec"), ns)
    return ns["outputs"], ns["inputs"]


def _kernel(candidate: Candidate):
    program = api.prepare(*_program(candidate.source), None, None)[0]
    for k in program.kernels:
        if k.name == candidate.kernel:
            return k
    raise ValueError(
        f"candidate for kernel {candidate.kernel!r}, which the program does not have; its kernels: "
        f"{[k.name for k in program.kernels]}"
    )


def answer(request: dict) -> dict:
    """The worker's side: build, compare and time a candidate against the default."""
    threads = torch.get_num_threads()
    try:
        outputs, inputs = _program(request["source"])
        schedule = Schedule(**request["schedule"])
        default = api.build(outputs, inputs)
        tuned = api.build(outputs, inputs, schedules={request["kernel"]: schedule})
        args = [random_input(t, request["sizes"]) for t in (inputs if isinstance(inputs, list | tuple) else [inputs])]
        expected, got = default(*args), tuned(*args)
        for e, g in zip(*(x if isinstance(x, tuple) else (x,) for x in (expected, got))):
            check_agrees(g, e)
        times = interleaved({"default": lambda: default(*args), "candidate": lambda: tuned(*args)},
                            repeats=request["repeats"], batch_s=request["batch_s"])  # fmt: skip
    except Exception as e:  # the candidate's failure, recorded: it never stops the tuner
        return {"failure": f"{type(e).__name__}: {e}"[:4000], "threads": threads}
    return {"default": list(times["default"].samples), "candidate": list(times["candidate"].samples),
            "threads": threads}  # fmt: skip


def check_agrees(got: torch.Tensor, expected: torch.Tensor) -> None:
    """AssertionError unless a candidate's output ``got`` equals the default's ``expected`` up to summing in
    another order: within ``TOLERANCE``, its absolute part at least ``rtol`` times the largest finite magnitude
    of the output (a sum that cancels to near zero keeps the rounding error of its large terms)."""
    finite = expected[torch.isfinite(expected)] if expected.is_floating_point() else expected.new_empty(0)
    scale = finite.abs().max().item() if finite.numel() else 0.0
    atol = max(TOLERANCE[1], TOLERANCE[0] * scale)
    torch.testing.assert_close(got, expected, rtol=TOLERANCE[0], atol=atol, equal_nan=True)


def random_input(t, sizes: dict[str, int]) -> torch.Tensor:
    """Random values for the placeholder ``t`` at ``sizes``."""
    shape = []
    for d in t.shape:
        if isinstance(d, Const):
            shape.append(d.value)
        elif isinstance(d, SizeVar) and d.name in sizes:
            shape.append(sizes[d.name])
        else:
            raise ValueError(f"input {t.name!r}: no value for its size {d!r}; give it in Candidate.sizes")
    dtype = getattr(torch, t.dtype.name)
    if t.dtype.is_float:
        return torch.randn(shape, dtype=dtype)
    if t.dtype.is_bool:
        return torch.rand(shape) < 0.5
    return torch.randint(0, 2, shape, dtype=dtype)


if __name__ == "__main__":
    serve(answer)
