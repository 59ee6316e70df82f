"""A/B measurements of a change to tailjit, both variants in one process.

Variant A is the code as it is; variant B is built with extra gcc flags, or
with attributes of tailjit's modules replaced while B's kernels are built
(a change switched off, or an alternative switched on).  For each task
(``op:size:mode`` of the benchmark registry, mode ``fw`` or ``fwbw``):

* ``percall``: each variant's ``tailjit.jit`` of the operator, timed
  interleaved (``tailjit.bench.timing.interleaved``), medians in us;
* ``gcc``: seconds of gcc in a cold compile of the task (kernel caches
  emptied before each), alternating A and B three times, medians.

Usage (1 thread)::

    python docs/scripts/ab.py percall "--param vect-epilogues-nomask=0" giou:large:fwbw ...
    python docs/scripts/ab.py gcc 'patch:tailjit.codegen:PARALLEL_BODY="static int"' giou:large:fwbw ...

A patch is ``module:attr.path=python-expression``; several are joined by ``;;``.
"""

import dataclasses
import importlib
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TAILJIT_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402

import tailjit  # noqa: E402
import tailjit.runtime.compiler as C  # noqa: E402
from tailjit.bench.registry import all_operators  # noqa: E402
from tailjit.bench.timing import interleaved  # noqa: E402

torch.set_num_threads(1)
mode, change, tasks = sys.argv[1], sys.argv[2], sys.argv[3:]
base = C.toolchain()
patches, variant = [], base
if change.startswith("patch:"):
    for p in change[6:].split(";;"):
        mod, rest = p.split(":", 1)
        path, expr = rest.split("=", 1)
        obj = importlib.import_module(mod)
        *owners, attr = path.split(".")
        for o in owners:
            obj = getattr(obj, o)
        patches.append((obj, attr, eval(expr)))
else:
    variant = dataclasses.replace(base, flags=base.flags + tuple(shlex.split(change)))
current = [base]
C.toolchain = lambda: current[0]


_inputs: dict = {}


def build(label: str, name: str, size: str, fwbw: bool):
    """The variant's compiled function and a call running it (forward, and backward with ones).  Both
    variants of a task run on the same input tensors: inputs of their own (a 64 MB matrix each) made
    label smoothing's forward 10% slower in one variant than in the other with the same code."""
    current[0] = variant if label == "B" else base
    saved = [(o, a, getattr(o, a)) for o, a, _ in patches] if label == "B" else []
    for o, a, v in patches if label == "B" else []:
        setattr(o, a, v)
    try:
        op = all_operators()[name]
        if (name, size, fwbw) not in _inputs:
            args = op.training_inputs(size, 0) if fwbw else op.inputs(size, 0)
            _inputs[(name, size, fwbw)] = args
        args = _inputs[(name, size, fwbw)]
        f = tailjit.jit(lambda *a: op.fn(*a))  # a new function: a new trace and build

        def call():
            out = f(*args)
            if fwbw:
                outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if o.requires_grad]
                torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])

        call()  # compiles
        return call
    finally:
        for o, a, v in saved:
            setattr(o, a, v)


if mode == "percall":
    for task in tasks:
        name, size, m = task.split(":")
        calls = {label: build(label, name, size, m == "fwbw") for label in "AB"}
        r = interleaved(calls, repeats=15)
        a, b = r["A"].median, r["B"].median
        print(f"{task:36s} A {a * 1e6:10.1f} us  B {b * 1e6:10.1f} us  B/A {b / a:.3f}", flush=True)
else:
    spent = [0.0]
    compile_unit = C._compile

    def timed(*a, **k):
        t = time.perf_counter()
        try:
            return compile_unit(*a, **k)
        finally:
            spent[0] += time.perf_counter() - t

    C._compile = timed
    for label in "AB":  # each variant's precompiled prelude, once
        current[0] = variant if label == "B" else base
        tailjit.jit(lambda x: x * 2 + 1)(torch.ones(3))
    seconds: dict = {}
    for _ in range(3):
        for task in tasks:
            name, size, m = task.split(":")
            for label in "AB":
                C._loaded.clear()
                for d in C.cache_dir().iterdir():
                    if d.name != "pch":
                        shutil.rmtree(d)
                spent[0] = 0.0
                build(label, name, size, m == "fwbw")
                seconds.setdefault((task, label), []).append(spent[0])
    total = {"A": 0.0, "B": 0.0}
    for task in tasks:
        a, b = (statistics.median(seconds[(task, label)]) for label in "AB")
        total["A"], total["B"] = total["A"] + a, total["B"] + b
        print(f"{task:36s} A {a:.3f} s  B {b:.3f} s  B/A {b / a:.2f}")
    print(f"{'all':36s} A {total['A']:.3f} s  B {total['B']:.3f} s  B/A {total['B'] / total['A']:.2f}")
