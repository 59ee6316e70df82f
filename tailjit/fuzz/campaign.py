"""``tailjit fuzz``: draw programs for a time budget, check each in the worker, shrink and save every failure.

The run is a sequence of hypothesis rounds (``@given`` over :func:`programs`, a seed each, the example
database off): a round ends at its example count, at the time budget, or at a failure, which hypothesis
shrinks to a minimal program before it is saved as ``DIR/<n>-<entry>-<kind>.py``, a runnable reproducer;
later failures of a kind already saved are counted and saved unshrunk under ``DIR/more/``.
Failures that Dynamo's own ``eager`` backend shows too are Dynamo's: counted apart and saved under
``DIR/dynamo/`` unshrunk.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings

from tailjit.fuzz.check import is_dynamo
from tailjit.fuzz.programs import programs
from tailjit.fuzz.worker import Worker

_KINDS: dict = {}


def failure_type(entry: str, kind: str) -> type:
    """One exception class per (entry, kind), so hypothesis shrinks each kind of failure to itself."""
    key = f"{entry}-{kind}"
    if key not in _KINDS:
        _KINDS[key] = type(f"Fuzz_{key.replace('-', '_').replace('(', '_').replace(')', '')}", (AssertionError,), {})
    return _KINDS[key]


class Campaign:
    def __init__(self, out: Path, minutes: float, seed: int = 0, timeout: float = 120.0, round_size: int = 100):
        self.out, self.seed, self.round_size = Path(out), seed, round_size
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "dynamo").mkdir(exist_ok=True)
        (self.out / "more").mkdir(exist_ok=True)
        self.deadline = time.monotonic() + minutes * 60
        self.worker = Worker(timeout, log=open(self.out / "worker.log", "ab"))  # noqa: SIM115
        self.stats = Counter()  # programs, with-grad, raising, checks (shrinking included)
        self.failures = Counter()  # (entry, kind) -> failures saved
        self.dynamo = Counter()
        self.saved: list[Path] = []
        self._last = None  # (source, failures) of the last failing check: after shrinking, the minimal one

    def check(self, program, shrinking: bool) -> None:
        if time.monotonic() > self.deadline and not shrinking:
            return
        source = program.source()
        failures, grad = self.worker.check(source)
        self.stats["checks"] += 1
        if not shrinking:
            self.stats["programs"] += 1
            self.stats["with gradients"] += grad
            self.stats["raising in eager"] += program.raises
        ours = [f for f in failures if not is_dynamo(f)]
        if not shrinking:
            for f in filter(is_dynamo, failures):
                if not self.dynamo[f.kind]:
                    (self.out / "dynamo" / f"{f.kind}.py").write_text(_reproducer(source, [f]))
                self.dynamo[f.kind] += 1
        if ours and not shrinking and (ours[0].entry, ours[0].kind) in self.failures:
            # a kind already shrunk and saved: counted and saved as drawn, so one frequent difference does not
            # spend the run shrinking itself again and again
            self.failures[(ours[0].entry, ours[0].kind)] += 1
            more = self.out / "more" / f"{sum(self.failures.values()):04d}-{ours[0].entry}-{ours[0].kind}.py"
            more.write_text(_reproducer(source, ours))
            return
        if ours:
            self._last = (source, ours)
            raise failure_type(ours[0].entry, ours[0].kind)(ours[0].message[:2000])

    def round(self, n: int) -> None:
        found = []

        @seed(self.seed * 100_003 + n)
        @settings(max_examples=self.round_size, deadline=None, database=None, report_multiple_bugs=False,
                  phases=[Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(programs())
        def one(program):
            self.check(program, shrinking=bool(found))
            # (only reached when the check passed)

        try:
            one()
        except AssertionError:
            source, failures = self._last
            f = failures[0]
            path = self.out / f"{len(self.saved):03d}-{f.entry}-{f.kind}.py"
            path.write_text(_reproducer(source, failures))
            self.saved.append(path)
            self.failures[(f.entry, f.kind)] += 1
            print(f"failure: {f.entry} {f.kind}: saved {path}", flush=True)
        found.clear()

    def run(self) -> None:
        n = 0
        while time.monotonic() < self.deadline:
            self.round(n)
            n += 1
            print(self.line(), flush=True)
        self.worker.close()

    def line(self) -> str:
        s = self.stats
        counts = f"{s['programs']} programs ({s['with gradients']} with gradients, {s['raising in eager']} raising"
        counts += " in eager)"
        return f"{counts}, {sum(self.failures.values())} failures, worker restarts {self.worker.restarts}"

    def summary(self, minutes: float) -> str:
        rate = self.stats["programs"] / max(minutes, 1e-9)
        lines = [f"tailjit fuzz: {self.line()}; {rate:.1f} programs a minute; each program checked against "
                 "eager through torch.compile(backend='tailjit') and tailjit.jit"]  # fmt: skip
        lines += [f"  {entry} {kind}: {count}" for (entry, kind), count in sorted(self.failures.items())]
        lines += [f"  Dynamo's own (backend='eager' too), not counted: {kind} {c}" for kind, c in self.dynamo.items()]
        lines += [f"  reproducer: {p}" for p in self.saved]
        return "\n".join(lines)


def _reproducer(source: str, failures) -> str:
    note = "".join(f"# {f.entry} {f.kind}: {f.message.splitlines()[0][:300]}\n" for f in failures)
    return f"# Found by `tailjit fuzz`; `python` this file to check it again.\n{note}{source}"


def main(args) -> int:
    start = time.monotonic()
    c = Campaign(Path(args.out), args.minutes, args.seed, args.timeout)
    try:
        c.run()
    finally:
        c.worker.close()
        print(c.summary((time.monotonic() - start) / 60))
    return 1 if c.saved else 0
