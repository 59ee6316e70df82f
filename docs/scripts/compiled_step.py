"""Training-step time of a network of the networks suite, its tailjit version compiled with
``torch.compile(backend="tailjit")`` (the suite's ``tailjit+compile`` variant), with and without a
change: variant B is compiled with attributes of tailjit's modules replaced (as in ``ab.py``).  Both
run interleaved in one process (1 thread, 21 repetitions after 3 warm-up steps each), medians in ms:

    python docs/scripts/compiled_step.py lltm 'tailjit.frontend.graph:views_for_externs=lambda gm: set()'
"""

import copy
import importlib
import sys

import torch

from tailjit.bench import networks as N
from tailjit.bench.timing import interleaved

torch.set_num_threads(1)
name, change = sys.argv[1], sys.argv[2]
mod, rest = change.split(":", 1)
attr, expr = rest.split("=", 1)
owner = importlib.import_module(mod)
net = N.NETWORKS[name]
_, ours = N.build(net)
batch = N.make_data(net, 1)[0]
steps = {}
for label in "AB":
    model = torch.compile(copy.deepcopy(ours), backend="tailjit")
    opt = N.optimizer(model, net)
    saved = getattr(owner, attr)
    if label == "B":
        setattr(owner, attr, eval(expr))
    try:
        for _ in range(3):  # compiles the forward and the backward graphs
            N.train_step(model, net, opt, batch)
    finally:
        setattr(owner, attr, saved)
    steps[label] = lambda m=model, o=opt: N.train_step(m, net, o, batch)
r = interleaved(steps, repeats=21)
a, b = r["A"].median, r["B"].median
print(f"{name}: A {a * 1e3:.2f} ms  B {b * 1e3:.2f} ms  B/A {b / a:.3f}")
