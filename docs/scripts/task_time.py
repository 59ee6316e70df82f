"""One benchmark task under ``tailjit.jit`` with a given checkout's code: the forward and the training call
(backward of ones through the tensors of ``op.grad_argnums``) interleaved with eager PyTorch, medians of 11
repetitions in us, 1 thread.  To compare two commits, run it alternately with each checkout (``PYTHONPATH``
does not override an editable install; the checkout is put first on ``sys.path``):

    python docs/scripts/task_time.py <checkout> delta2bbox large
"""

import os
import sys
import tempfile

checkout, name, size = sys.argv[1:4]
sys.path.insert(0, os.path.abspath(checkout))
os.environ.setdefault("TAILJIT_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402

import tailjit  # noqa: E402
from tailjit.bench.ops import all_operators  # noqa: E402
from tailjit.bench.timing import interleaved  # noqa: E402

torch.set_num_threads(1)
op = all_operators()[name]
args = op.inputs(size, 0)
grad_args = op.training_inputs(size, 0) if op.differentiable else args
f = tailjit.jit(op.fn)


def training_call():
    out = f(*grad_args)
    outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o.requires_grad]
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])


variants = {"fw": lambda: f(*args), "eager fw": lambda: op.fn(*args)}
if op.grad_argnums:
    variants["fwbw"] = training_call
t = interleaved(variants, repeats=11, batch_s=0.1)
print(tailjit.__file__, name, size, {k: round(v.median * 1e6, 1) for k, v in t.items()})
