"""The isolated runner: tasks go to persistent worker processes; crashes and hangs become records.

A task is one (operator or model, size, mode, backend).  Tasks run one at a
time (timings must not compete for the cores) in a worker process started with
``python -m tailjit.bench.worker``; the worker serves many tasks, and is killed
and replaced when a task crashes it or runs past the timeout.  Every result is
appended to a JSON-lines file as soon as it is known, so an interrupted run
resumes where it stopped.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from tailjit.bench.backends import BACKENDS, availability

STARTUP_TIMEOUT_S = 180.0
LOG_TAIL_CHARS = 600


@dataclass(frozen=True)
class Task:
    """One measurement: ``suite`` is "ops" or "models"; ``mode`` is "fw" or "fwbw"."""

    suite: str
    name: str
    size: str
    mode: str
    backend: str
    domain: str = ""
    tags: tuple[str, ...] = ()

    def key(self, threads: int) -> str:
        return record_key(
            {
                "suite": self.suite,
                "name": self.name,
                "size": self.size,
                "mode": self.mode,
                "backend": self.backend,
                "threads": threads,
            }
        )


def record_key(record: dict) -> str:
    """The identity of a result: a rerun with the same key replaces (or, resuming, skips) it."""
    return "/".join(str(record[k]) for k in ("suite", "name", "size", "mode", "backend", "threads"))


def load_records(path: Path) -> list[dict]:
    """The records of a results file, the last one per key winning; a torn last line is ignored."""
    records: dict[str, dict] = {}
    if not path.exists():
        return []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        records[record_key(record)] = record
    return list(records.values())


class WorkerCrashed(Exception):
    """The worker process died during a task."""


class WorkerTimeout(Exception):
    """The task ran past its timeout."""


class WorkerProcess:
    """A ``tailjit.bench.worker`` subprocess and its line protocol."""

    def __init__(self, *, threads: int, imports: Iterable[str], log: Path, env: dict[str, str]):
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(log, "ab")  # lives as long as the process
        cmd = [sys.executable, "-m", "tailjit.bench.worker", "--threads", str(threads)]
        for name in imports:
            cmd += ["--import", name]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
            env=env,
            start_new_session=True,
        )
        self._buffer = b""
        try:
            ready = self._read_line(STARTUP_TIMEOUT_S, "worker startup")
        except (WorkerCrashed, WorkerTimeout) as exc:
            tail = self._log_tail(0)
            self.close(graceful=False)
            raise WorkerCrashed(f"{exc}; stderr tail: {tail}") from None
        if not ready.get("ready"):
            self.close(graceful=False)
            raise WorkerCrashed(f"unexpected worker greeting {ready!r}")

    def _log_tail(self, since: int) -> str:
        self._log_file.flush()
        with open(self.log, "rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace").strip()
        return text[-LOG_TAIL_CHARS:]

    def _read_line(self, timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerTimeout(f"{what} exceeded {timeout:g} s")
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                code = self.proc.wait()
                reason = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
                raise WorkerCrashed(f"worker died ({reason}) during {what}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def run(self, task: dict, timeout: float) -> dict:
        """Send one task and wait for its result; raises WorkerCrashed / WorkerTimeout."""
        since = self.log.stat().st_size
        try:
            self.proc.stdin.write((json.dumps(task) + "\n").encode())
            self.proc.stdin.flush()
            return self._read_line(timeout, "the task")
        except BrokenPipeError as exc:
            raise WorkerCrashed("worker died before taking the task") from exc
        except WorkerCrashed as exc:
            tail = self._log_tail(since)
            raise WorkerCrashed(f"{exc}; stderr tail: {tail}" if tail else str(exc)) from None

    def close(self, graceful: bool = True) -> None:
        """Stop the worker and everything it started (its own process group)."""
        try:
            self.proc.stdin.close()
            if graceful:
                self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.proc.stdout.close()
        self._log_file.close()


def worker_env(threads: int, cache_dir: str) -> dict[str, str]:
    """The worker's environment: ``threads`` for every thread pool, and scratch Inductor and tailjit caches
    that the worker empties before each task (compile times are cold for both; each worker's untimed
    warm-up pays tailjit's precompiled header)."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    if threads == 1:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    env["TAILJIT_CACHE_DIR"] = os.path.join(cache_dir, "tailjit")
    env["TAILJIT_BENCH_SCRATCH"] = "1"  # the worker empties these caches before each task
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class RunConfig:
    """How to run the tasks (see ``docs/bench.md`` for what each knob means)."""

    results: Path = Path("bench-results/results.jsonl")
    threads: int = 1
    timeout: float = 300.0
    seed: int = 0
    fresh: bool = False
    repeats: int = 15
    batch_s: float = 0.02
    timing_budget_s: float = 4.0
    compile_repeats: int = 1
    imports: tuple[str, ...] = ()


def run(
    tasks: list[Task],
    config: RunConfig,
    *,
    on_start: Callable[[Task], None] | None = None,
    on_done: Callable[[Task, dict], None] | None = None,
) -> list[dict]:
    """Run ``tasks`` (skipping those already in the results file unless ``fresh``); return their records.

    Records with status ``unavailable`` are not treated as done, so a backend
    installed later is measured on the next run.
    """
    path = config.results
    path.parent.mkdir(parents=True, exist_ok=True)
    if config.fresh and path.exists():
        path.unlink()
    done = {record_key(r): r for r in load_records(path) if r.get("status") != "unavailable"}
    records: list[dict] = []
    unavailable: dict[str, str | None] = {}  # backend -> reason, None when it is available
    worker: WorkerProcess | None = None
    cache_dir = tempfile.mkdtemp(prefix="tailjit-bench-inductor-")
    env = worker_env(config.threads, cache_dir)
    log = path.with_name(path.name + ".worker.log")
    try:
        with open(path, "a") as out:
            for task in tasks:
                key = task.key(config.threads)
                if key in done:
                    records.append(done[key])
                    if on_done:
                        on_done(task, done[key])
                    continue
                if on_start:
                    on_start(task)
                started = time.perf_counter()
                if task.backend not in unavailable and task.backend in BACKENDS:
                    unavailable[task.backend] = availability(task.backend)
                if unavailable.get(task.backend):
                    result = {"status": "unavailable", "message": unavailable[task.backend]}
                else:
                    result, worker = _run_one(worker, task, config, log=log, env=env)
                    if result["status"] == "unavailable":
                        unavailable[task.backend] = result["message"]
                record = _record(task, config, result, time.perf_counter() - started)
                out.write(json.dumps(record) + "\n")
                out.flush()
                records.append(record)
                if on_done:
                    on_done(task, record)
    finally:
        if worker is not None:
            worker.close()
        shutil.rmtree(cache_dir, ignore_errors=True)
    return records


def _run_one(
    worker: WorkerProcess | None, task: Task, config: RunConfig, *, log: Path, env: dict[str, str]
) -> tuple[dict, WorkerProcess | None]:
    """One task on ``worker`` (started if ``None``); a crashed or timed-out worker is closed and dropped."""
    payload = {
        "suite": task.suite,
        "name": task.name,
        "size": task.size,
        "mode": task.mode,
        "backend": task.backend,
        "seed": config.seed,
        "repeats": config.repeats,
        "batch_s": config.batch_s,
        "timing_budget_s": config.timing_budget_s,
        "compile_repeats": config.compile_repeats,
    }
    try:
        if worker is None:
            worker = WorkerProcess(threads=config.threads, imports=config.imports, log=log, env=env)
        return worker.run(payload, config.timeout), worker
    except WorkerTimeout as exc:
        worker.close(graceful=False)
        return {"status": "timeout", "message": str(exc)}, None
    except WorkerCrashed as exc:
        if worker is not None:
            worker.close(graceful=False)
        return {"status": "crash", "message": str(exc)}, None


def _record(task: Task, config: RunConfig, result: dict, wall_s: float) -> dict:
    record = {
        "suite": task.suite,
        "name": task.name,
        "domain": task.domain,
        "tags": list(task.tags),
        "size": task.size,
        "mode": task.mode,
        "backend": task.backend,
        "threads": config.threads,
        "seed": config.seed,
        "status": result.pop("status"),
        "message": result.pop("message", ""),
        "compile_s": result.pop("compile_s", None),
        "eager_s": result.pop("eager_s", None),
        "backend_s": result.pop("backend_s", None),
        "speedup": result.pop("speedup", None),
        "eager_spread": result.pop("eager_spread", None),
        "backend_spread": result.pop("backend_spread", None),
        "repeats": result.pop("repeats", None),
        "info": result.pop("info", {}),
        "wall_s": round(wall_s, 3),
        "torch": torch.__version__,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    worker_threads = result.pop("threads", None)
    if worker_threads is not None and worker_threads != config.threads:
        record["info"]["worker_threads"] = worker_threads
    return record
