"""Time each kernel and extern call of tailjit's generated host functions: every ``kernelN``/``opN`` global of a
host function is wrapped in a timer when the function is made, and so is the whole function.  Medians in us,
calls per run, 1 thread.  Either a benchmark task under ``tailjit.jit`` (forward), or one training step of a
network of the networks suite under ``torch.compile(backend="tailjit")``:

    python docs/scripts/host_step_times.py top_k_top_p_filter small
    python docs/scripts/host_step_times.py network lltm
"""

import collections
import statistics
import sys
import time

import torch

import tailjit
from tailjit.frontend import graph

torch.set_num_threads(1)
spent = collections.defaultdict(list)
made = graph.HostFunction.__init__


def timed(self, planner, output):
    made(self, planner, output)
    kind = planner.report.kind
    names = self.fn.__globals__
    for name, fn in list(names.items()):
        if callable(fn) and name.startswith(("kernel", "op")):
            label = f"{kind} {name} {getattr(fn, '__name__', fn)}"[:70]

            def call(*args, _fn=fn, _label=label, **kwargs):
                start = time.perf_counter()
                out = _fn(*args, **kwargs)
                spent[_label].append(time.perf_counter() - start)
                return out

            names[name] = call
    whole = self.fn

    def run(*args):
        start = time.perf_counter()
        out = whole(*args)
        spent[f"{kind} (whole host function)"].append(time.perf_counter() - start)
        return out

    self.fn = run


graph.HostFunction.__init__ = timed
if sys.argv[1] == "network":
    from tailjit.bench import networks as N

    net = N.NETWORKS[sys.argv[2]]
    ref, ours = N.build(net)
    batch = N.make_data(net, 1)[0]
    model = N._variant_model("tailjit+compile", ref, ours)
    opt = N.optimizer(model, net)

    def step():
        N.train_step(model, net, opt, batch)
else:
    from tailjit.bench.registry import all_operators

    op = all_operators()[sys.argv[1]]
    args = op.inputs(sys.argv[2], 0)
    f = tailjit.jit(op.fn)

    def step():
        f(*args)


for _ in range(3):
    step()
spent.clear()
runs = 20
for _ in range(runs):
    step()
for label, times in sorted(spent.items(), key=lambda kv: -sum(kv[1])):
    print(f"{label:72s} {len(times) // runs:4d} calls  median {statistics.median(times) * 1e6:9.1f} us")
