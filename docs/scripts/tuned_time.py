"""A program file's build with the tuning database's schedules against its default build, in one fresh process
(2 threads): which kernels took a recorded schedule (with no measurement: the build only reads the database),
and both builds' medians of interleaved repetitions in us, and their ratio.  Run it after
``tailjit tune --program FILE --sizes ...`` with the same ``TAILJIT_CACHE_DIR`` (``docs/tuning.md``).

    python docs/scripts/tuned_time.py docs/scripts/tune_programs/softmax.py n=4096
"""

import os
import runpy
import sys

import torch

import tailjit
from tailjit import api
from tailjit.bench.timing import interleaved
from tailjit.schedule import default_schedule
from tailjit.tunedb import db
from tailjit.tuner.cli import parse_sizes
from tailjit.tuner.measure import random_input

torch.set_num_threads(2)
path, sizes = sys.argv[1], parse_sizes(sys.argv[2])
ns = runpy.run_path(path)
tuned = tailjit.build(ns["outputs"], ns["inputs"])
os.environ[db.LOOKUP_ENV] = "0"
default = tailjit.build(ns["outputs"], ns["inputs"])
del os.environ[db.LOOKUP_ENV]
program, chosen, _ = api.prepare(ns["outputs"], ns["inputs"], None, None)  # what the build chose
for k in program.kernels:
    taken = chosen[k.name] != default_schedule(k)
    print(f"{k.name}: the {'recorded' if taken else 'default'} schedule: {chosen[k.name].describe()}")
args = [random_input(t, sizes) for t in ns["inputs"]]
times = interleaved({"default": lambda: default(*args), "tuned": lambda: tuned(*args)}, repeats=31, batch_s=0.05)
d, t = times["default"].median * 1e6, times["tuned"].median * 1e6
print(f"| {os.path.basename(path)} | {sys.argv[2]} | {d:.1f} | {t:.1f} | {d / t:.2f}x |")
