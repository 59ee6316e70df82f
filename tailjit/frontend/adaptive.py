"""Eager as a candidate: a compiled entry's first calls alternate with eager ``fn``, and the faster one stays.

A :class:`Trial` stands in for a new entry's compiled call: its calls alternate, whole, between the compiled
call and ``fn`` run eagerly (each call runs one of them once, so writes into the inputs happen once and
outputs are never compared), ``ROUNDS`` of each, timed by :data:`clock`.  Then it decides once: eager where
the compiled median exceeds ``MARGIN`` times eager's, else compiled, and hands the choice to its caller,
which puts the chosen call in the trial's place (the steady path then holds no trial).  See ``docs/jit.md``,
"Eager as a candidate"."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

__all__ = ["Choice", "Trial", "ROUNDS", "MARGIN"]

#: Calls measured of each candidate (the first compiled one may still fault its code in: medians); odd.
ROUNDS = 5

#: Eager is chosen where the compiled median exceeds this many times eager's (noise keeps compiled).
MARGIN = 1.1

#: The timer a trial reads (tests inject a fake one).
clock = time.perf_counter


@dataclass(frozen=True)
class Choice:
    """What a trial decided for one compiled entry, with the medians (seconds) it decided on."""

    runs: str  # "eager" or "compiled"
    compiled: float
    eager: float
    what: str  # the entry's signature, in words

    def __str__(self) -> str:
        sign = ">" if self.runs == "eager" else "<="
        return (
            f"{self.what}: runs {self.runs} (compiled median {self.compiled * 1e6:.1f} us {sign} {MARGIN} x eager "
            f"median {self.eager * 1e6:.1f} us, over {ROUNDS} interleaved calls each)"
        )


class Trial:
    """A compiled entry's call while it is measured against eager: ``compiled`` and ``eager`` take the same
    arguments and give the same output structure; ``decided(choice, chosen)`` is called once, with the
    :class:`Choice` and the chosen callable."""

    def __init__(self, compiled, eager, what: str, decided):
        self.compiled, self.eager, self.what, self.decided = compiled, eager, what, decided
        self.times: tuple = ([], [])  # compiled's, eager's
        self.calls = 0
        self.chosen = None  # once decided: a call that still reaches the trial (another thread's) runs it
        self._lock = threading.Lock()

    def __call__(self, *args):
        chosen = self.chosen
        if chosen is not None:
            return chosen(*args)
        with self._lock:
            turn = self.calls % 2
            self.calls += 1
        run = self.eager if turn else self.compiled
        start = clock()
        out = run(*args)
        elapsed = clock() - start
        choice = None
        with self._lock:
            times = self.times[turn]
            if self.chosen is None and len(times) < ROUNDS:
                times.append(elapsed)
                if len(self.times[0]) == len(self.times[1]) == ROUNDS:
                    choice = self._decide()
        if choice is not None:  # (outside the lock: ``decided`` takes its caller's, which may wait on this one)
            self.decided(choice, self.chosen)
        return out

    def _decide(self) -> Choice:
        compiled, eager = (sorted(t)[ROUNDS // 2] for t in self.times)  # the medians
        runs = "eager" if compiled > MARGIN * eager else "compiled"
        self.chosen = self.eager if runs == "eager" else self.compiled
        return Choice(runs, compiled, eager, self.what)
