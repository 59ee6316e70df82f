"""Run one program through eager, ``torch.compile(backend="tailjit")`` and ``tailjit.jit``, and compare.

Each entry's call gets fresh inputs from ``make_inputs`` and is compared with eager's, forward and then, when
the program does not write into its inputs and eager has float outputs that require grad, backward
(``torch.autograd.grad`` of the float outputs, with seeded random cotangents, to every float input):

* errors: where eager raises, the entry must raise an instance of eager's exception type; where eager does
  not, the entry must not (a Dynamo wrapper that subclasses eager's type, ``TorchRuntimeError`` for a
  ``RuntimeError``, counts as the same type);
* outputs and gradients: count, dtype, shape and values: integers and bools exactly, floats with NaN at the
  same positions, infinities equal, and otherwise within ``rtol = 256 eps * reduce_len`` (eps of the dtype;
  gradients 8 times that) and ``atol = rtol * magnitude`` (the program's largest inexact value, so
  cancellation after a reassociated sum is allowed what it legitimately costs); a missing gradient equals
  zeros;
* aliasing and strides: an output that shares memory with an input or an earlier output in eager (a view)
  must share it with the same one in the entry, with eager's sizes, strides and storage offset: tailjit
  promises that outputs alias exactly as in eager (``docs/jit.md``, "In-place operations and aliasing").
  An entry's output must not alias where eager's is fresh. A fresh output's strides are the compiler's
  choice (eager's own come from TensorIterator's layout heuristics) and are not compared;
* mutations: every input after the call equals eager's input after the call;
* a second call: the forward call is made twice, and the second (the cached path: guards, the jit's quick
  call) is compared too (kinds prefixed ``call2-``).

When ``torch.compile`` fails a check (or ``tailjit.jit`` does after falling back to it), the program runs
again through Dynamo's ``eager`` backend: a failure that shows there too is Dynamo's (an exception type it
changes: ``TorchRuntimeError`` for eager's ``TypeError``), not tailjit's, and is reported under the entry
``compile(dynamo)`` (``jit(dynamo)``).
"""

from __future__ import annotations

import itertools
import linecache
import sys
import warnings
from dataclasses import dataclass, field

import torch

import tailjit
from tailjit.fuzz.values import maxabs

ENTRIES = {
    "compile": lambda fn: torch.compile(fn, backend="tailjit"),
    "jit": tailjit.jit,
}
DYNAMO = {"dynamo": lambda fn: torch.compile(fn, backend="eager")}

_count = itertools.count()


@dataclass
class Failure:
    kind: str  # what differs: value, dtype, shape, alias, mutation, raised, missing-error, error-type, grad-...
    entry: str  # compile, jit, compile(dynamo), jit(dynamo), or worker for a crash or a hang
    message: str


@dataclass
class Run:
    error: BaseException | None = None
    outputs: list = field(default_factory=list)
    inputs: list = field(default_factory=list)  # after the call
    aliases: list = field(default_factory=list)  # per output: where its memory comes from, or None
    grads: list | None = None


def load(source: str) -> dict:
    """The namespace of a program's source (registered with linecache, so tracebacks show its lines)."""
    name = f"<tailjit-fuzz-{next(_count)}>"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    ns = {"__name__": "tailjit_fuzz_program"}
    exec(compile(source, name, "exec"), ns)
    return ns


def _storage(t):
    s = t.untyped_storage()
    return s.data_ptr() if s.nbytes() else None


def _aliases(outputs: list, inputs: list) -> list:
    found = []
    for j, o in enumerate(outputs):
        key, where = _storage(o), None
        for kind, pool in (("input", inputs), ("output", outputs[:j])):
            hits = [i for i, t in enumerate(pool) if isinstance(t, torch.Tensor) and _storage(t) == key]
            if key is not None and hits and where is None:
                where = (kind, hits[0], tuple(o.shape), o.stride(), o.storage_offset())
        found.append(where)
    return found


def run(f, make_inputs, grad: bool) -> Run:
    """Call ``f`` on fresh inputs (leaves that require grad for floats, when ``grad``)."""
    inputs = make_inputs()
    if grad:
        leaves = {}
        for x in inputs:
            if id(x) not in leaves:
                leaves[id(x)] = x.detach().requires_grad_(x.dtype.is_floating_point)
        inputs = [leaves[id(x)] for x in inputs]
    r = Run()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = f(*inputs)
            r.outputs = list(out)
            r.aliases = _aliases(r.outputs, inputs)
            if grad:
                r.grads = _grads(r.outputs, list(leaves.values()))
    except Exception as e:  # noqa: BLE001 (any exception is a result to compare)
        r.error = e
    r.inputs = [x.detach().clone() for x in inputs]
    return r


def _grads(outputs: list, leaves: list) -> list | None:
    """The gradients of the float outputs that require grad, with seeded cotangents; None when there are none."""
    diff = [o for o in outputs if o.requires_grad]
    wrt = [x for x in leaves if x.requires_grad]
    if not diff or not wrt:
        return None
    g = torch.Generator().manual_seed(0)
    cot = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in diff]
    got = torch.autograd.grad(diff, wrt, cot, allow_unused=True)
    return [[o.requires_grad for o in outputs]] + [torch.zeros_like(x) if d is None else d for x, d in zip(wrt, got)]


def close(want: torch.Tensor, got, tol: dict, scale: float = 1.0) -> tuple[str, str] | None:
    """(kind, message) where ``got`` differs from ``want`` beyond the program's tolerance, else None."""
    if not isinstance(got, torch.Tensor):
        return "type", f"got {type(got).__name__}, eager a tensor"
    if got.dtype != want.dtype:
        return "dtype", f"got {got.dtype}, eager {want.dtype}"
    if got.shape != want.shape:
        return "shape", f"got {tuple(got.shape)}, eager {tuple(want.shape)}"
    if not want.dtype.is_floating_point:
        if torch.equal(got, want):
            return None
        return "value", f"got {got.tolist()}, eager {want.tolist()}"
    rtol = 256 * torch.finfo(want.dtype).eps * tol["reduce_len"] * scale
    magnitude = tol["magnitude"] if scale == 1 else max(tol["magnitude"], maxabs(want))
    try:
        torch.testing.assert_close(got.detach(), want.detach(), rtol=rtol, atol=rtol * magnitude, equal_nan=True,
                                   check_stride=False)  # fmt: skip
    except AssertionError as e:
        # zero where eager has NaN, and close elsewhere: eager multiplied a zero gradient by an infinity or a
        # NaN that tailjit's adjoints skip (a kind of its own, so that it does not hide other differences)
        nan_zero = want.isnan() & (got == 0)
        rest = torch.where(nan_zero, 0, got.detach()), torch.where(nan_zero, 0, want.detach())
        kind = "nan-zero" if nan_zero.any() and close(*rest, tol, scale) is None else "value"
        return kind, f"{e}\ngot {got.tolist()}\neager {want.tolist()}"
    return None


def compare(want: Run, got: Run, tol: dict, prefix: str = "") -> list[tuple[str, str]]:
    """The differences of an entry's run from eager's, as (kind, message)."""
    if want.error is not None or got.error is not None:
        if got.error is None:
            return [(prefix + "missing-error", f"eager raised {want.error!r}, the entry returned")]
        if want.error is None:
            return [(prefix + "raised", f"{type(got.error).__name__}: {got.error}")]
        if not isinstance(got.error, type(want.error)):
            return [(prefix + "error-type", f"got {got.error!r}, eager {want.error!r}")]
        return []
    found = []
    if len(got.outputs) != len(want.outputs):
        return [(prefix + "outputs", f"{len(got.outputs)} outputs, eager {len(want.outputs)}")]
    for i, (w, g) in enumerate(zip(want.outputs, got.outputs)):
        bad = close(w, g, tol)
        if bad:
            found.append((prefix + bad[0], f"output {i}: {bad[1]}"))
        elif want.aliases[i] != got.aliases[i]:
            found.append((prefix + "alias", f"output {i}: got {got.aliases[i]}, eager {want.aliases[i]}"))
    for i, (w, g) in enumerate(zip(want.inputs, got.inputs)):
        bad = close(w, g, tol)
        if bad:
            found.append((prefix + "mutation", f"input {i} after the call: {bad[1]}"))
    if want.grads is not None or got.grads is not None:
        if want.grads is None or got.grads is None or want.grads[0] != got.grads[0]:
            flags = [g and g[0] for g in (got.grads, want.grads)]
            return found + [("requires-grad", f"outputs requiring grad: got {flags[0]}, eager {flags[1]}")]
        for i, (w, g) in enumerate(zip(want.grads[1:], got.grads[1:])):
            bad = close(w, g, tol, scale=8)
            if bad:
                found.append(("grad-" + bad[0], f"gradient of float input {i}: {bad[1]}"))
    return found


def check_fn(fn, make_inputs, tol: dict, entries=None, stats=None) -> list[Failure]:
    """Every difference of the entries (default: both of tailjit's) from eager on one program; ``stats["grad"]``
    says whether gradients were compared."""
    entries = ENTRIES if entries is None else entries
    torch._dynamo.reset()
    failures = []
    grad = not tol.get("mutates")
    want = run(fn, make_inputs, grad=False)
    want_grad = run(fn, make_inputs, grad=True) if grad and want.error is None else None
    if stats is not None:
        stats["grad"] = want_grad is not None and want_grad.grads is not None
    for name, make in entries.items():
        compiled = make(fn)
        found = compare(want, run(compiled, make_inputs, grad=False), tol)
        # a second call takes the cached path (guards, the jit's quick call) the first call did not
        found = found or compare(want, run(compiled, make_inputs, grad=False), tol, prefix="call2-")
        if want_grad is not None and want_grad.grads is not None:
            found += compare(want_grad, run(compiled, make_inputs, grad=True), tol, prefix="grad-")
        if found and (name == "compile" or getattr(compiled, "fallback", None) is not None):
            # (a difference of the second call counts as Dynamo's where Dynamo shows it at the first: the jit's
            # first call, whose trace failed, ran the function eagerly)
            dynamo = {f.kind.removeprefix("call2-") for f in check_fn(fn, make_inputs, tol, DYNAMO)}
            for k, m in found:
                failures.append(Failure(k, f"{name}(dynamo)" if k.removeprefix("call2-") in dynamo else name, m))
        else:
            failures += [Failure(k, name, m) for k, m in found]
    return failures


def is_dynamo(f: Failure) -> bool:
    """Whether a failure shows through Dynamo's own ``eager`` backend too."""
    return f.entry.endswith("(dynamo)")


def check(source: str, entries=None) -> list[Failure]:
    ns = load(source)
    return check_fn(ns["fn"], ns["make_inputs"], ns["TOLERANCE"], entries)


def main(fn, make_inputs, tol: dict) -> None:
    """A reproducer's ``__main__``: check the program, print the differences, exit 1 if any."""
    failures = check_fn(fn, make_inputs, tol)
    for f in failures:
        print(f"{f.entry}: {f.kind}: {f.message}")
    print(f"{len(failures)} difference(s) from eager")
    sys.exit(1 if failures else 0)
