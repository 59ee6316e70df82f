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
trials, and need no search of our own.  With ``cost_model``, ``tuner.cost_model`` ranks each round's drawn
schedules and only the most promising are measured.  Optuna and LightGBM are the ``tune`` extra: this module
imports them only when a search runs.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import pickle
from collections.abc import Callable

from tailjit import api
from tailjit.fusion import LoopNest
from tailjit.schedule import Schedule, default_schedule
from tailjit.schedule_space import compose, space, valid
from tailjit.te.expr import SizeVar, Tensor
from tailjit.tunedb import db
from tailjit.tuner.cost_model import fit as fit_model
from tailjit.tuner.measure import Candidate, measure, measuring_worker

#: With the cost model: new schedules drawn per round, and how many of them (the model's fastest) are measured.
DRAWS = 12
MEASURED = 2


class TuneError(RuntimeError):
    """A search cannot run (Optuna, or LightGBM for the cost model, is not installed)."""


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
    unmeasured: int = 0  # schedules the cost model ranked below those measured in their round, never measured


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
    cost_model: bool = False,
) -> dict[str, Tuned]:
    """Search the schedules of every kernel of the program ``outputs`` over ``inputs`` (what ``tailjit.build``
    takes) at the size variables' values ``sizes``: the default and up to ``trials - 1`` other schedules per
    kernel, each measured in a worker process (at most ``timeout`` seconds each) and recorded in the tuning
    database, which later builds read.  With ``cost_model``, a model trained on the records ranks each round's
    drawn schedules and only its fastest are measured (``tuner.cost_model``).  By kernel name, what was found;
    ``report`` gets one line per measurement."""
    blob = pickle.dumps((outputs, inputs)).hex()
    source = f"import pickle\noutputs, inputs = pickle.loads(bytes.fromhex({blob!r}))\n"
    return tune_source(source, sizes, trials, seed=seed, timeout=timeout, repeats=repeats, batch_s=batch_s,
                       report=report, cost_model=cost_model)  # fmt: skip


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
    cost_model: bool = False,
) -> dict[str, Tuned]:
    """:func:`tune` for a program given as Python ``source`` that defines ``outputs`` and ``inputs`` (as
    ``tuner.measure.Candidate`` takes it)."""
    optuna = _extra("optuna", "tuning needs Optuna")
    if cost_model:
        _extra("lightgbm", "the cost model needs LightGBM")
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
        search = functools.partial(_search, optuna, source=source, sizes=sizes, trials=trials, seed=seed,
                                   worker=worker, repeats=repeats, batch_s=batch_s, report=report or _quiet,
                                   kernels=program.kernels, use_model=cost_model)  # fmt: skip
        return {k.name: search(k) for k in program.kernels}
    finally:
        worker.close()


def _search(optuna, kernel: LoopNest, *, source, sizes, trials, seed, worker, repeats, batch_s, report, kernels,
            use_model) -> Tuned:  # fmt: skip
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
    seen: set[str] = set()  # schedules considered: measured, or ranked below the measured ones by the model
    invalid = 0
    draws = iter(range(trials * 20))  # TPE repeats itself in a small space: a bound on draws, not on measurements
    while len(seen) < trials:
        # the first round is the default alone, never ranked out: it is always measured
        model = fit_model(kernels, db.records(), seed) if use_model and ratios else None
        batch: dict[str, tuple] = {}  # schedule text -> (trial, schedule): new schedules drawn this round
        for _ in draws:
            trial = study.ask()
            choice = {name: json.loads(trial.suggest_categorical(name, texts)) for name, texts in choices.items()}
            schedule = compose(kernel, choice)
            key = _text(dataclasses.asdict(schedule))
            if not valid(kernel, schedule):
                invalid += 1
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            elif key in ratios:  # measured already: told its result again
                _tell(optuna, study, trial, ratios[key])
            elif key in seen or key in batch:  # ranked out already, or drawn twice this round
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            else:
                batch[key] = (trial, schedule)
            if len(batch) >= min(DRAWS if model else 1, trials - len(seen)):
                break
        if not batch:
            break
        schedules = [schedule for _, schedule in batch.values()]
        chosen = model.rank(kernel, schedules, sizes)[:MEASURED] if model else schedules
        for key, (trial, schedule) in batch.items():
            seen.add(key)
            if schedule not in chosen:  # predicted slower than the ones measured: never measured
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                continue
            records = measure(Candidate(source, kernel.name, schedule, sizes, repeats, batch_s), worker)
            # the default against itself is 1 by definition: measured only to be recorded
            ratios[key] = 1.0 if schedule == default_schedule(kernel) and len(records) == 2 else _ratio(records)
            said = "failed" if ratios[key] is None else f"{1 / ratios[key]:.2f}x the default"
            report(f"{kernel.name} #{len(ratios)}: {said}: {schedule.describe()}")
            _tell(optuna, study, trial, ratios[key])
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
        unmeasured=len(seen) - len(ratios),
    )


def _check_sizes(inputs, sizes: dict[str, int]) -> None:
    """ValueError where ``sizes`` lacks a size variable of the inputs' shapes (every measurement would fail)."""
    wanted = {d.name for t in ([inputs] if isinstance(inputs, Tensor) else inputs) for d in t.shape
              if isinstance(d, SizeVar)}  # fmt: skip
    if wanted - set(sizes):
        raise ValueError(f"no value for the size variables {sorted(wanted - set(sizes))}; give them in sizes")


def _tell(optuna, study, trial, ratio: float | None) -> None:
    """Tell Optuna a measured trial's objective, or that it failed."""
    if ratio is None:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    else:
        study.tell(trial, ratio)


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


def _extra(name: str, needs: str):
    """The module ``name`` of the ``tune`` extra; TuneError saying ``needs`` it where it is not installed."""
    try:
        module = importlib.import_module(name)
    except ImportError:
        raise TuneError(f"{needs}: pip install 'tailjit[tune]' (or pip install {name})") from None
    if name == "optuna":
        module.logging.set_verbosity(module.logging.WARNING)  # one line per trial is report's job
    return module
