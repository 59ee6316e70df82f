"""The layer norm backward of ``tailjit bench --suite autodiff`` (1024 x 1024 float32, the forward's mean
and variance saved), called directly: the whole backward (x, gamma and beta), x's gradient alone and
gamma's and beta's alone, interleaved (medians of 11 repetitions, ms, 1 thread).  To compare two commits,
run it alternately with each checkout as the argument (``PYTHONPATH`` does not override an editable
install; the argument is put first on ``sys.path``):

    python docs/scripts/layer_norm_backward_time.py [checkout]
"""

import os
import sys
import tempfile

if len(sys.argv) > 1:
    sys.path.insert(0, os.path.abspath(sys.argv[1]))
os.environ.setdefault("TAILJIT_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402

import tailjit  # noqa: E402
from tailjit.bench.autodiff import _layer_norm  # noqa: E402
from tailjit.bench.timing import interleaved  # noqa: E402
from tailjit.runtime.kernel import gradient_spec  # noqa: E402

torch.set_num_threads(1)
ins, y = _layer_norm()
_, saved = gradient_spec([y], ins, y.name, (True,) * 3, save_buffered=True)
forward = tailjit.build([y, *saved], ins)
forward.mark_saved(len(saved))
args = [torch.randn(1024, 1024), torch.randn(1024), torch.randn(1024)]
outs, head = forward(*args), torch.randn(1024, 1024)
masks = {"x, gamma, beta": (True,) * 3, "x": (True, False, False), "gamma, beta": (False, True, True)}
kernels = {name: forward.gradient_kernel(mask) for name, mask in masks.items()}
variants = {name: (lambda g=g: g(*args, *outs, head)) for name, g in kernels.items()}
t = interleaved(variants, repeats=11, batch_s=0.05)
nests = len(kernels["x, gamma, beta"].kernels)
print(tailjit.__file__, f"{nests} loop nests", {n: round(v.median * 1e3, 3) for n, v in t.items()})
