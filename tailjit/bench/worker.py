"""The benchmark worker: a long-lived process that runs tasks sent by the runner, one at a time.

Started as ``python -m tailjit.bench.worker``; it reads one JSON task per line
on stdin and answers one JSON result per line on a private copy of its
original stdout (fd 1 itself is redirected to stderr, so prints from operators
or compilers cannot corrupt the protocol).  A crash or hang only loses this
process: the runner records it and starts a new one.

Per task it builds the inputs, runs eager once for the reference, prepares
and first-calls the backend (the compile time), compares the outputs (and
gradients in ``fwbw`` mode) with eager, and times both with
:func:`tailjit.bench.timing.interleaved`.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import gc
import importlib
import json
import math
import os
import shutil
import statistics
import sys
import time
import traceback

import torch

from tailjit.bench.backends import BACKENDS, Backend, Eager, Unavailable, Unsupported, Workload
from tailjit.bench.models import MODELS
from tailjit.bench.ops import all_operators
from tailjit.bench.timing import interleaved

MESSAGE_CHARS = 600

#: (rtol, atol) per dtype for forward outputs; gradients get ten times both.
TOLERANCES = {
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (2e-2, 1e-2),
    torch.float32: (1e-4, 1e-5),
    torch.complex64: (1e-4, 1e-5),
    torch.float64: (1e-7, 1e-9),
    torch.complex128: (1e-7, 1e-9),
}
GRAD_FACTOR = 10.0

#: Further cold compiles of a task (``compile_repeats``) stop once the task's compiles would pass this many
#: seconds in all: a Python loop that Inductor unrolls compiles for minutes.
COMPILE_REPEAT_BUDGET_S = 30.0


def _kind(t: torch.Tensor) -> str:
    if t.dtype == torch.bool:
        return "bool"
    if t.is_complex():
        return "complex"
    return "float" if t.is_floating_point() else "int"


def compare(expected, actual, *, scale: float = 1.0, path: str = "out") -> str | None:
    """``None`` when ``actual`` matches ``expected``, else a description of the first mismatch.

    Nested tuples / lists / dicts are compared element by element (tuples and
    lists interchangeably).  Integer and bool tensors must be equal (integer
    width may differ, e.g. jax's int32); floating tensors must have NaNs and
    infinities at the same positions and be close elsewhere, with
    ``|a - e| <= atol * max(1, max|e|) + rtol * |e|`` (see :data:`TOLERANCES`,
    multiplied by ``scale``).
    """
    if isinstance(expected, torch.Tensor) and isinstance(actual, (int, float, bool)):
        actual = torch.tensor(actual)
    if isinstance(actual, torch.Tensor) and isinstance(expected, (int, float, bool)):
        expected = torch.tensor(expected)
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return f"{path}: expected a tensor, got {type(actual).__name__}"
        return _compare_tensors(expected.detach().cpu(), actual.detach().cpu(), scale, path)
    if isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            return f"{path}: expected a sequence of {len(expected)}, got {_describe(actual)}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            msg = compare(e, a, scale=scale, path=f"{path}[{i}]")
            if msg:
                return msg
        return None
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            return f"{path}: expected keys {sorted(map(str, expected))}, got {_describe(actual)}"
        for key in expected:
            msg = compare(expected[key], actual[key], scale=scale, path=f"{path}[{key!r}]")
            if msg:
                return msg
        return None
    if expected != actual:
        return f"{path}: expected {expected!r}, got {actual!r}"
    return None


def _describe(obj) -> str:
    if isinstance(obj, (tuple, list)):
        return f"a sequence of {len(obj)}"
    return type(obj).__name__


def _compare_tensors(e: torch.Tensor, a: torch.Tensor, scale: float, path: str) -> str | None:
    if tuple(e.shape) != tuple(a.shape):
        return f"{path}: shape {tuple(a.shape)} != expected {tuple(e.shape)}"
    if _kind(e) != _kind(a):
        return f"{path}: dtype {a.dtype} != expected {e.dtype}"
    if _kind(e) in ("int", "bool"):
        bad = e != a.to(e.dtype)
        if bad.any():
            return f"{path}: {int(bad.sum())} of {e.numel()} elements differ (exact match required)"
        return None
    rtol, atol = TOLERANCES.get(e.dtype, TOLERANCES[torch.float32])
    rtol, atol = rtol * scale, atol * scale
    e, a = (
        e.to(torch.complex128 if e.is_complex() else torch.float64),
        a.to(e.dtype).to(torch.complex128 if e.is_complex() else torch.float64),
    )
    if not torch.equal(e.isnan(), a.isnan()):
        return f"{path}: NaN positions differ ({int(e.isnan().sum())} expected, {int(a.isnan().sum())} got)"
    inf = e.isinf()
    if not torch.equal(inf, a.isinf()) or not torch.equal(e[inf], a[inf]):
        return f"{path}: infinities differ"
    finite = e.isfinite()
    e, a = e[finite], a[finite]
    if e.numel() == 0:
        return None
    limit = atol * max(1.0, float(e.abs().max())) + rtol * e.abs()
    err = (a - e).abs()
    bad = err > limit
    if bad.any():
        worst = int(torch.argmax(err - limit))
        show = (lambda v: f"{complex(v):.6g}") if e.is_complex() else (lambda v: f"{float(v):.6g}")
        return (
            f"{path}: {int(bad.sum())} of {e.numel()} elements differ; worst got {show(a[worst])} "
            f"expected {show(e[worst])} (rtol={rtol:g}, atol={atol:g})"
        )
    return None


def _check(mode: str, expected, actual) -> str | None:
    """Compare a result with eager's: outputs, and in fwbw mode gradients with looser tolerances."""
    if mode == "fwbw":
        return compare(expected[0], actual[0], path="out") or compare(
            expected[1], actual[1], scale=GRAD_FACTOR, path="grad"
        )
    return compare(expected, actual)


def _clone(obj, requires_grad: bool = False):
    if isinstance(obj, torch.Tensor):
        out = obj.detach().clone()
        return out.requires_grad_(True) if requires_grad else out
    if isinstance(obj, (tuple, list)):
        return type(obj)(_clone(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    return obj


def _first_call(backend: Backend, work: Workload, args: tuple, seeded):
    """Prepare ``backend`` for ``work`` on ``args`` and call it once (the compile): the prepared backend,
    its bound call and the outputs."""
    prepared = backend.prepare(dataclasses.replace(work, args=args))
    call = prepared.bind(args)
    return prepared, call, prepared.to_torch(seeded(call))


def _unsupported_error(exc: BaseException) -> bool:
    """Compiler rejections (Dynamo / Inductor / JAX tracing) rather than bugs in the workload."""
    module = type(exc).__module__
    name = type(exc).__name__
    if module.startswith(("torch._dynamo", "torch._inductor")) and name in (
        "Unsupported",
        "BackendCompilerFailed",
        "UserError",
        "InternalTorchDynamoError",
    ):
        return True
    return module.startswith("jax") and (
        name.startswith(("Concretization", "Tracer", "NonConcrete")) or "Tracer" in name
    )


def _message(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


def timing_repeats(task: dict, call_s: float, variants: int) -> int:
    """Repetitions that fit the task's timing budget (at least 3, at most ``task["repeats"]``).

    One repetition costs about ``variants * max(call_s, batch_s)``; slow
    operators (Python loops over thousands of boxes) get fewer repetitions
    instead of dominating the run.
    """
    per_repeat = variants * max(call_s, task["batch_s"])
    return max(3, min(task["repeats"], int(task["timing_budget_s"] / per_repeat)))


def _warmup_fn(x: torch.Tensor) -> torch.Tensor:
    return (x * 2.0 + 1.0).sum(0)


def _warmup_jax(x):
    return (x * 2.0 + 1.0).sum(0)


class Worker:
    """Runs tasks in this process; remembers which backends it has already warmed up."""

    def __init__(self):
        self.operators = all_operators()
        self.warmed: set[str] = set()

    def warm(self, backend: Backend) -> None:
        """First use of a backend pays one-time initialisation that is not any task's compile time."""
        if backend.name in self.warmed:
            return
        self.warmed.add(backend.name)
        # both modes: the training path's first use (AOTAutograd, its partitioner's imports) is one-time too
        leaf = torch.ones(8, 4, requires_grad=True)
        for work in (
            Workload(_warmup_fn, (torch.ones(8, 4),), jax_fn=_warmup_jax),
            Workload(_warmup_fn, (leaf,), "fwbw", (0,), jax_fn=_warmup_jax),
        ):
            try:
                backend.prepare(work).bind(work.args)()
            except Exception:  # the task itself reports any real failure
                pass
            if backend.dynamo:
                torch._dynamo.reset()

    def cold_caches(self) -> None:
        """Make the coming compile cold: forget what earlier tasks (or an earlier compile of this one)
        compiled: the same function at another size would otherwise reuse tailjit's size-independent
        kernels, and a second compile of a task Inductor's compiled C++.  Only for the runner's scratch
        caches (``TAILJIT_BENCH_SCRATCH``) and in-memory compile caches; tailjit's precompiled prelude, a
        once-per-toolchain cost paid in the warm-up, stays, as do Inductor's CPU probes (kept in memory)."""
        if os.environ.get("TAILJIT_BENCH_SCRATCH") != "1":
            return
        # tailjit: every kernel folder; Inductor: everything (graph caches and the C++ it built) but its
        # locks and tailjit's cache, which the runner puts inside it
        tailjit_dir = os.path.abspath(os.environ.get("TAILJIT_CACHE_DIR", os.devnull))
        for var, keep in (("TAILJIT_CACHE_DIR", {"pch"}), ("TORCHINDUCTOR_CACHE_DIR", {"locks"})):
            root = os.environ.get(var)
            if root and os.path.isdir(root):
                for entry in os.listdir(root):
                    path = os.path.join(root, entry)
                    if entry not in keep and os.path.abspath(path) != tailjit_dir:
                        shutil.rmtree(path, ignore_errors=True)
        compiler = sys.modules.get("tailjit.runtime.compiler")
        if compiler is not None:
            compiler._loaded.clear()
        graph_autograd = sys.modules.get("tailjit.frontend.host.graph_autograd")
        if graph_autograd is not None:  # per-op gradient traces, as Inductor's in-memory caches below
            graph_autograd._traced_vjp.cache_clear()
        inductor_utils = sys.modules.get("torch._inductor.utils")
        if inductor_utils is not None and hasattr(inductor_utils, "clear_inductor_caches"):
            inductor_utils.clear_inductor_caches()
        # fake tensors' dispatch cache (every trace goes through it, tailjit.jit's, Dynamo's and AOTAutograd's):
        # a repeated trace of the same function's ops would reuse its outputs and time a warm trace as a cold one
        fake_tensor = sys.modules.get("torch._subclasses.fake_tensor")
        if fake_tensor is not None and hasattr(fake_tensor.FakeTensorMode, "cache_clear"):
            fake_tensor.FakeTensorMode.cache_clear()
        # TorchScript and jax keep what they compiled per Python function, in memory
        script_cache = getattr(torch.jit._state, "_jit_caching_layer", None)
        if script_cache is not None:
            script_cache.clear()
        jax = sys.modules.get("jax")
        if jax is not None and hasattr(jax, "clear_caches"):
            jax.clear_caches()

    def workload(self, task: dict) -> tuple[Workload, tuple, tuple]:
        """The task's workload, its timed inputs, and a second input set drawn from the next seed."""
        seed, size, mode = task["seed"], task["size"], task["mode"]
        if task["suite"] == "models":
            spec = MODELS[task["name"]]
            if mode == "fwbw" and not spec.train:
                raise Unsupported(f"model {spec.name} is measured forward only")
            module = spec.build(torch.Generator().manual_seed(seed))
            args, alt = (tuple(spec.make_inputs(size, torch.Generator().manual_seed(s))) for s in (seed + 1, seed + 2))
            return Workload(module, args, mode, is_model=True), args, alt
        op = self.operators[task["name"]]
        if mode == "fwbw" and not op.differentiable:
            raise Unsupported(f"operator {op.name} is not differentiable")
        args, alt = op.inputs(size, seed), op.inputs(size, seed + 1)
        return Workload(op.fn, args, mode, op.grad_argnums if mode == "fwbw" else (), op.jax_fn), args, alt

    def run(self, task: dict) -> dict:
        backend = BACKENDS[task["backend"]]
        try:
            backend.check()
        except Unavailable as exc:
            return {"status": "unavailable", "message": _message(exc)}
        seed = task["seed"]
        try:
            work, args, alt = self.workload(task)
        except Unsupported as exc:
            return {"status": "unsupported", "message": _message(exc)}

        def copy(inputs: tuple) -> tuple:
            """A private copy (in-place operators must not leak), leaves marked for gradients."""
            return tuple(_clone(a, i in work.grad_argnums) for i, a in enumerate(inputs))

        def seeded(call):
            torch.manual_seed(seed)
            return call()

        eager = Eager().prepare(work)
        eager_call = eager.bind(copy(args))
        try:
            reference_start = time.perf_counter()
            expected = seeded(eager_call)
            reference_s = time.perf_counter() - reference_start
            expected_alt = seeded(eager.bind(copy(alt)))
        except Exception as exc:
            return {"status": "error", "message": "eager reference failed: " + _message(exc)}

        self.warm(backend)
        counters = None
        if backend.dynamo:
            from torch._dynamo.utils import counters

            counters.clear()
        self.before_compile(backend)
        record: dict = {}
        start = time.perf_counter()
        stage = "compile"
        try:
            prepared, backend_call, actual = _first_call(backend, work, copy(args), seeded)
            record["compile_s"] = time.perf_counter() - start
            record["info"] = dict(prepared.info)
            mismatch = _check(task["mode"], expected, actual)
            if not mismatch:
                # A second input set catches backends that specialise on values (e.g. a trace).
                stage = "second input set"
                second_start = time.perf_counter()
                second = prepared.to_torch(seeded(prepared.bind(copy(alt))))
                record["info"]["second_call_s"] = time.perf_counter() - second_start  # includes any recompile
                mismatch = _check(task["mode"], expected_alt, second)
                mismatch = mismatch and f"second input set (seed {seed + 1}): {mismatch}"
        except Unsupported as exc:
            return {"status": "unsupported", "message": _message(exc)}
        except Unavailable as exc:
            return {"status": "unavailable", "message": _message(exc)}
        except Exception as exc:
            status = "unsupported" if _unsupported_error(exc) else "error"
            prefix = "" if stage == "compile" else f"on the {stage}: "
            return {"status": status, "message": prefix + _message(exc), **record}
        if counters is not None:
            breaks = dict(counters["graph_break"])
            record["info"]["graph_breaks"] = sum(breaks.values())
            if breaks:
                record["info"]["graph_break_reasons"] = [r.split("\n")[0][:200] for r in list(breaks)[:5]]
        if mismatch:
            record.update(status="wrong-result", message=mismatch[:MESSAGE_CHARS])
            return record

        variants = {"eager": eager_call}
        if backend.name != "eager":
            variants[backend.name] = backend_call
        repeats = timing_repeats(task, reference_s, len(variants))
        timings = interleaved(variants, repeats=repeats, batch_s=task["batch_s"], warmup=1)
        eager_t, backend_t = timings["eager"], timings[backend.name]
        record.update(
            repeats=repeats,
            eager_s=eager_t.median,
            backend_s=backend_t.median,
            speedup=eager_t.median / backend_t.median if backend_t.median > 0 else math.inf,
            eager_spread=eager_t.spread,
            backend_spread=backend_t.spread,
        )
        self.compile_again(task, backend, work, lambda: copy(args), seeded, record)
        if record["info"].get("graph_breaks"):
            record.update(status="graph-break", message="; ".join(record["info"]["graph_break_reasons"]))
        else:
            record["status"] = "ok"
        return record

    def before_compile(self, backend: Backend) -> None:
        """Cold caches for the coming compile (Dynamo's included)."""
        if backend.dynamo:
            torch._dynamo.reset()
        self.cold_caches()
        # A full collection owed to earlier work (the eager runs, earlier tasks) would otherwise land in
        # whichever compile comes next: on this heap (torch's modules, ~330k objects) one costs ~0.15 s.
        gc.collect()

    def compile_again(self, task: dict, backend: Backend, work: Workload, inputs, seeded, record: dict) -> None:
        """Further cold compiles of the task, after its timing (``compile_repeats`` in all, within
        ``COMPILE_REPEAT_BUDGET_S``), each on fresh ``inputs()``: ``compile_s`` becomes the median of them
        all, ``info["compile_samples"]`` lists each (the first is the one measured before).  One compile
        moves by a third from run to run on a shared machine, for every backend."""
        samples = [record["compile_s"]]
        while len(samples) < task.get("compile_repeats", 1) and sum(samples) + samples[0] <= COMPILE_REPEAT_BUDGET_S:
            self.before_compile(backend)
            args = inputs()
            start = time.perf_counter()
            try:
                _first_call(backend, work, args, seeded)
            except Exception as exc:  # the first compile passed: keep it, say why the others stopped
                record["info"]["compile_repeat_error"] = _message(exc)
                break
            samples.append(time.perf_counter() - start)
        if len(samples) > 1:
            record["info"]["compile_samples"] = samples
            record["compile_s"] = statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tailjit.bench.worker")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--import", dest="imports", action="append", default=[])
    args = parser.parse_args(argv)

    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    faulthandler.enable()
    torch.set_num_threads(args.threads)
    for name in args.imports:
        importlib.import_module(name)
    worker = Worker()
    protocol.write(json.dumps({"ready": True, "pid": os.getpid(), "threads": torch.get_num_threads()}) + "\n")
    while line := sys.stdin.readline():
        task = json.loads(line)
        try:
            result = worker.run(task)
        except Exception as exc:  # one task's failure must not end the worker
            traceback.print_exc()
            result = {"status": "error", "message": _message(exc)}
        result["threads"] = torch.get_num_threads()
        protocol.write(json.dumps(result, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
