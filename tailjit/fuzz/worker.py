"""Checks in a long-lived subprocess, so that a segfault or a hang is a finding ("crash", "hang") and the
fuzzer goes on with a fresh worker (one process for many programs: starting torch costs seconds).

Protocol: one JSON line per program each way, ``{"source": ...}`` in, ``{"failures": [[kind, entry, message],
...], "grad": bool}`` out, on a private copy of the worker's stdout (whatever the checks print goes to stderr).
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
    """The parent's side: :meth:`check` sends a program and waits at most ``timeout`` seconds for the answer."""

    def __init__(self, timeout: float = 120.0, log=None):
        self.timeout, self.log = timeout, log
        self.proc = None
        self.restarts = 0

    def _start(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "tailjit.fuzz.worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log or subprocess.DEVNULL)  # fmt: skip

    def check(self, source: str) -> tuple[list[Failure], bool]:
        """The program's failures and whether gradients were compared."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        try:
            self.proc.stdin.write((json.dumps({"source": source}) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it died: answered below
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        line = self.proc.stdout.readline() if ready else b""
        if line:
            answer = json.loads(line)
            return [Failure(*f) for f in answer["failures"]], answer["grad"]
        if not ready:
            self.close()
            return [Failure("hang", "worker", f"no answer in {self.timeout:.0f} s; the worker was killed")], False
        code = self.proc.wait()
        self.proc = None
        self.restarts += 1
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        return [Failure("crash", "worker", f"the worker died: {how}")], False

    def close(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            self.restarts += 1


def serve():
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the checks' prints (and C-level ones) go to stderr
    sys.stdout = sys.stderr
    for line in sys.stdin:
        ns = load(json.loads(line)["source"])
        stats: dict = {}
        failures = check_fn(ns["fn"], ns["make_inputs"], ns["TOLERANCE"], stats=stats)
        found = [[f.kind, f.entry, f.message[:20000]] for f in failures]
        out.write(json.dumps({"failures": found, "grad": stats.get("grad", False)}) + "\n")
        out.flush()


if __name__ == "__main__":
    serve()
