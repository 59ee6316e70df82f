"""Searching a program's schedules: :func:`tune` measures candidates of each kernel and records them all.

For each kernel of the program (``api.prepare``'s, with their default schedules), a search draws schedules
from ``tailjit.schedule_space``: each field of ``space(kernel)`` is one categorical parameter (its values as
JSON text), ``compose`` makes the schedule and ``valid`` checks it (an invalid composition is a failed trial,
never measured).  ``tuner.measure``'s worker measures each new candidate against the default in the same
interleaved rounds and records both in the database; the search minimises the candidate's median over the
default's from the same rounds, which a loaded machine's drift changes less than either time.  The default
schedule itself is the first trial, so the default is always measured and recorded, and a build takes a
recorded schedule only where it beat the default (``docs/tuning.md``): tuning never makes a build slower than
its default.

Why Optuna: its samplers (TPE, seeded) are maintained, handle categorical and integer spaces and failed
trials, and need no search of our own; a cost model ranking candidates before measuring (issue 44) is not
written yet.  Optuna is the ``tune`` extra: this module imports it only when a search runs.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
from collections.abc import Callable

from tailjit import api
from tailjit.fusion import LoopNest
from tailjit.schedule import Schedule, default_schedule
from tailjit.schedule_space import compose, space, valid
from tailjit.te.expr import SizeVar, Tensor
from tailjit.tunedb import db
from tailjit.tuner.measure import Candidate, measure, measuring_worker


class TuneError(RuntimeError):
    """A search cannot run (Optuna is not installed)."""


@dataclasses.dataclass(frozen=True)
class Tuned:
    """One kernel's search: what a build now uses for it, and what was measured."""

    kernel: str
    schedule: Schedule  # what a build takes for the kernel now (the database's choice; the default if none)
    # the default's median over that schedule's, from the same rounds of this search (1.0 for the default);
    # None where the schedule was recorded by an earlier search and not measured in this one
    speedup: float | None
    measured: int  # distinct schedules measured, the default's included
    failed: int  # candidates that failed in the worker (an error, other results, a crash, a hang)
    invalid: int  # compositions ``valid`` rejected, never measured
    skipped: str = ""  # why the kernel was not searched; empty where it was


def tune(
    outputs,
    inputs,
    sizes: dict[str, int],
    trials: int = 20,
    *,
    seed: int = 0,
    timeout: float = 300.0,
    repeats: int = 15,
    batch_s: float = 0.02,
    report: Callable[[str], None] | None = None,
) -> dict[str, Tuned]:
    """Search the schedules of every kernel of the program ``outputs`` over ``inputs`` (what ``tailjit.build``
    takes) at the size variables' values ``sizes``: the default and up to ``trials - 1`` other schedules per
    kernel, each measured in a worker process (at most ``timeout`` seconds each) and recorded in the tuning
    database, which later builds read.  By kernel name, what was found; ``report`` gets one line per trial."""
    blob = pickle.dumps((outputs, inputs)).hex()
    source = f"import pickle\noutputs, inputs = pickle.loads(bytes.fromhex({blob!r}))\n"
    return tune_source(source, sizes, trials, seed=seed, timeout=timeout, repeats=repeats, batch_s=batch_s,
                       report=report)  # fmt: skip


def tune_source(
    source: str,
    sizes: dict[str, int],
    trials: int = 20,
    *,
    seed: int = 0,
    timeout: float = 300.0,
    repeats: int = 15,
    batch_s: float = 0.02,
    report: Callable[[str], None] | None = None,
) -> dict[str, Tuned]:
    """:func:`tune` for a program given as Python ``source`` that defines ``outputs`` and ``inputs`` (as
    ``tuner.measure.Candidate`` takes it)."""
    optuna = _optuna()
    if trials < 1:
        raise ValueError(f"trials must be at least 1 (the default schedule is the first), got {trials}")
    ns: dict = {}
    exec(compile(source, "<program>", "exec"), ns)
    missing = [name for name in ("outputs", "inputs") if name not in ns]
    if missing:
        raise ValueError(f"the program defines no {' and no '.join(missing)}: it sets them as tailjit.build takes them")
    _check_sizes(ns["inputs"], sizes)
    program = api.prepare(ns["outputs"], ns["inputs"], None, None)[0]
    worker = measuring_worker(timeout)
    try:
        return {
            k.name: _search(optuna, k, source, sizes, trials, seed, worker, repeats, batch_s, report or _quiet)
            for k in program.kernels
        }
    finally:
        worker.close()


def _search(optuna, kernel: LoopNest, source, sizes, trials, seed, worker, repeats, batch_s, report) -> Tuned:
    if kernel.merged:
        # a build given a schedule for a kernel keeps it out of loop merging, so the worker would measure
        # another loop nest than the one the record is for
        why = f"its loop nest hosts merged kernels ({', '.join(m.tensor.name for m in kernel.merged)})"
        report(f"{kernel.name}: not searched: {why}")
        return Tuned(kernel.name, db.best(kernel) or default_schedule(kernel), None, 0, 0, 0, why)
    choices = {name: [_text(v) for v in values] for name, values in space(kernel).items() if len(values) > 1}
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=seed))
    study.enqueue_trial({name: texts[0] for name, texts in choices.items()})  # space() lists the default first
    ratios: dict[str, float | None] = {}  # schedule text -> candidate/default medians; None where it failed
    invalid = 0
    for _ in range(trials * 20):  # TPE repeats itself in a small space: a bound on draws, not on measurements
        if len(ratios) >= trials:
            break
        trial = study.ask()
        choice = {name: json.loads(trial.suggest_categorical(name, texts)) for name, texts in choices.items()}
        schedule = compose(kernel, choice)
        if not valid(kernel, schedule):
            invalid += 1
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        key = _text(dataclasses.asdict(schedule))
        if key not in ratios:
            records = measure(Candidate(source, kernel.name, schedule, sizes, repeats, batch_s), worker)
            # the default against itself is 1 by definition: measured only to be recorded
            ratios[key] = 1.0 if schedule == default_schedule(kernel) and len(records) == 2 else _ratio(records)
            said = "failed" if ratios[key] is None else f"{1 / ratios[key]:.2f}x the default"
            report(f"{kernel.name} #{len(ratios)}: {said}: {schedule.describe()}")
        if ratios[key] is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial, ratios[key])
    done = [r for r in ratios.values() if r is not None]
    chosen = db.best(kernel) or default_schedule(kernel)
    ratio = ratios.get(_text(dataclasses.asdict(chosen)))
    return Tuned(
        kernel.name,
        chosen,
        speedup=1 / ratio if ratio else None,
        measured=len(done),
        failed=len(ratios) - len(done),
        invalid=invalid,
    )


def _check_sizes(inputs, sizes: dict[str, int]) -> None:
    """ValueError where ``sizes`` lacks a size variable of the inputs' shapes (every measurement would fail)."""
    wanted = {d.name for t in ([inputs] if isinstance(inputs, Tensor) else inputs) for d in t.shape
              if isinstance(d, SizeVar)}  # fmt: skip
    if wanted - set(sizes):
        raise ValueError(f"no value for the size variables {sorted(wanted - set(sizes))}; give them in sizes")


def _ratio(records: list[db.Record]) -> float | None:
    """The candidate's median over the default's, from one measurement's records; None where it failed."""
    if len(records) != 2:
        return None
    default, candidate = records
    return candidate.median / default.median


def _text(value) -> str:
    return json.dumps(value, sort_keys=True)


def _quiet(line: str) -> None:
    pass


def _optuna():
    try:
        import optuna
    except ImportError:
        raise TuneError("tuning needs Optuna: pip install 'tailjit[tune]' (or pip install optuna)") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # one line per trial is report's job
    return optuna
