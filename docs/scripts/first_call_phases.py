"""Where ``tailjit.jit``'s first call of a benchmark task goes, with a given checkout's code: the whole first
call (cold kernel cache, warm process: a small function compiled first), the second call, and the seconds
spent in the trace (``make_fx``), the functionalising step of a training trace (``expr_grad.functionalised``),
gradient derivation (``te.autodiff.backward_program``), partitioning and scheduling (``api._prepare``), code
generation, gcc with the link (``runtime.compiler._compile``) and the link (or a whole-unit compile) alone
(``runtime.compiler._run``).  Run it alternately with two checkouts (``git worktree add``) to compare them:

    python docs/scripts/first_call_phases.py <checkout> bbox2delta large fwbw
"""

import collections
import importlib
import os
import sys
import tempfile
import time

checkout, name, size, mode = sys.argv[1:5]
sys.path.insert(0, os.path.abspath(checkout))
os.environ["TAILJIT_CACHE_DIR"] = tempfile.mkdtemp()

import torch  # noqa: E402

import tailjit  # noqa: E402
from tailjit.bench.ops import all_operators  # noqa: E402

spent = collections.Counter()


def _timed_call(fn, label: str):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - start

    return wrapper


def timed(module: str, attr: str, label: str) -> None:
    mod = importlib.import_module(module)
    setattr(mod, attr, _timed_call(getattr(mod, attr), label))


jit_module = importlib.import_module("tailjit.frontend.jit")
_make_fx = jit_module.make_fx
jit_module.make_fx = lambda *a, **k: _timed_call(_make_fx(*a, **k), "trace")
timed("tailjit.frontend.train.expr_grad", "functionalised", "functionalise")
timed("tailjit.te.autodiff", "backward_program", "gradient")
timed("tailjit.api", "prepare", "partition")
for fn in ("generate", "generate_many", "program_body"):
    timed("tailjit.api", fn, "codegen")
timed("tailjit.runtime.compiler", "_compile", "gcc")
timed("tailjit.runtime.compiler", "_run", "link")
torch.set_num_threads(1)
warm = tailjit.jit(lambda t: (t * 2).sum())
warm(torch.ones(8, 4))
warm(torch.ones(8, 4, requires_grad=True)).backward()
op = all_operators()[name]
args = op.training_inputs(size, 0) if mode == "fwbw" else op.inputs(size, 0)
f = tailjit.jit(op.fn)


def call():
    out = f(*args)
    if mode == "fwbw":
        outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o.requires_grad]
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])


spent.clear()
start = time.perf_counter()
call()
first = time.perf_counter() - start
start = time.perf_counter()
call()
second = time.perf_counter() - start
print(tailjit.__file__, name, size, mode, f"first {first:.3f} s, second {second:.4f} s",
      {k: round(v, 3) for k, v in spent.items()})  # fmt: skip
