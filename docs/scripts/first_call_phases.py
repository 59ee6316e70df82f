"""Where ``tailjit.jit``'s first call of a benchmark task goes, with a given checkout's code: the whole first
call (cold kernel cache, warm process: a small function compiled first), the second call, and the seconds
spent in the functionalising step of a training trace (``expr_grad.functionalised``), in gradient derivation
(``te.autodiff.backward_program``) and in gcc (``runtime.compiler._compile``).  Run it alternately with two
checkouts (``git worktree add``) to compare them:

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
from tailjit.bench.registry import all_operators  # noqa: E402

spent = collections.Counter()


def timed(module: str, attr: str, label: str) -> None:
    mod = importlib.import_module(module)
    fn = getattr(mod, attr)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - start

    setattr(mod, attr, wrapper)


timed("tailjit.frontend.expr_grad", "functionalised", "functionalise")
timed("tailjit.te.autodiff", "backward_program", "gradient")
timed("tailjit.runtime.compiler", "_compile", "gcc")
torch.set_num_threads(1)
warm = tailjit.jit(lambda t: (t * 2).sum())
warm(torch.ones(8, 4))
warm(torch.ones(8, 4, requires_grad=True)).backward()
op = all_operators()[name]
args = op.inputs(size, 0)
if mode == "fwbw":
    args = [a.detach().clone().requires_grad_(i in op.grad_argnums) if isinstance(a, torch.Tensor)
            and a.is_floating_point() else a for i, a in enumerate(args)]  # fmt: skip
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
