"""Checks in a long-lived subprocess, so that a segfault or a hang is a finding ("crash", "hang") and the
fuzzer goes on with a fresh worker (one process for many programs: starting torch costs seconds).

Protocol: one JSON line per program each way, ``{"source": ...}`` in, ``{"failures": [[kind, entry, message],
...], "grad": bool}`` out, on a private copy of the worker's stdout (whatever the checks print goes to stderr).
The same parent and loop serve other requests (``tailjit.tuner.measure``'s measurements): ``Worker.ask`` and
``serve(answer)``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys

from tailjit.fuzz.check import Failure, check_fn, load


class Worker:
    """The parent's side: :meth:`ask` sends a request to ``python -m <module>`` (this one's :func:`serve` by
    default; ``tailjit.tuner.measure`` runs its own) and waits at most ``timeout`` seconds for the answer."""

    def __init__(self, timeout: float = 120.0, log=None, module: str = "tailjit.fuzz.worker", env=None):
        self.timeout, self.log, self.module, self.env = timeout, log, module, env
        self.proc = None
        self.restarts = 0

    def _start(self):
        self.proc = subprocess.Popen([sys.executable, "-m", self.module], stdin=subprocess.PIPE, env=self.env,
                                     stdout=subprocess.PIPE, stderr=self.log or subprocess.DEVNULL)  # fmt: skip

    def check(self, source: str) -> tuple[list[Failure], bool]:
        """The program's failures and whether gradients were compared."""
        answer = self.ask({"source": source})
        if isinstance(answer, Failure):
            return [answer], False
        return [Failure(*f) for f in answer["failures"]], answer["grad"]

    def ask(self, request: dict) -> dict | Failure:
        """The worker's answer to ``request``, or the ``hang`` or ``crash`` that it ended in."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it died: answered below
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        line = self.proc.stdout.readline() if ready else b""
        if line:
            return json.loads(line)
        if not ready:
            self.close()
            return Failure("hang", "worker", f"no answer in {self.timeout:.0f} s; the worker was killed")
        code = self.proc.wait()
        self.proc = None
        self.restarts += 1
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        return Failure("crash", "worker", f"the worker died: {how}")

    def close(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            self.restarts += 1


def serve(answer=None):
    """The worker's side: ``answer(request)`` (a fuzz check by default) for each request, until stdin closes."""
    answer = answer or _check
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the checks' prints (and C-level ones) go to stderr
    sys.stdout = sys.stderr
    for line in sys.stdin:
        out.write(json.dumps(answer(json.loads(line))) + "\n")
        out.flush()


def _check(request: dict) -> dict:
    ns = load(request["source"])
    stats: dict = {}
    failures = check_fn(ns["fn"], ns["make_inputs"], ns["TOLERANCE"], stats=stats)
    found = [[f.kind, f.entry, f.message[:20000]] for f in failures]
    return {"failures": found, "grad": stats.get("grad", False)}


if __name__ == "__main__":
    serve()
