"""Training-step speedup of a networks-suite variant over eager with a given checkout's code: eager and the
variant (default ``tailjit``, the operators called from Python; any of ``networks.VARIANTS``, e.g. ``jit``)
interleaved, medians of 9 repetitions, 1 thread.  To compare two commits, run it alternately with each
checkout (the checkout is put first on ``sys.path``):

    python docs/scripts/network_ab.py <checkout> lltm,sublstm,mi_lstm [variant]
"""

import copy
import os
import sys
import tempfile

checkout, names = sys.argv[1], sys.argv[2]
variant = sys.argv[3] if len(sys.argv) > 3 else "tailjit"
sys.path.insert(0, os.path.abspath(checkout))
os.environ.setdefault("TAILJIT_CACHE_DIR", tempfile.mkdtemp())

import torch  # noqa: E402

import tailjit  # noqa: E402
from tailjit.bench import networks as N  # noqa: E402
from tailjit.bench.timing import interleaved  # noqa: E402

torch.set_num_threads(1)
ratios = {}
for name in names.split(","):
    net = N.NETWORKS[name]
    ref, ours = N.build(net)
    data = N.make_data(net, 2)
    runners = {}
    for label, model in (("eager", copy.deepcopy(ref)), (variant, N._variant_model(variant, ref, ours))):
        opt = N.optimizer(model, net)
        N.train_step(model, net, opt, data[0])
        runners[label] = lambda m=model, o=opt, n=net, b=data[0]: N.train_step(m, n, o, b)
    t = interleaved(runners, repeats=9, batch_s=0.2, warmup=1)
    ratios[name] = round(t["eager"].median / t[variant].median, 3)
print(tailjit.__file__, ratios)
