"""gcc's time for the one-kernel C units of a few benchmark tasks, compiled whole against split in two
translation units (entry points | kernel) by ``runtime.compiler._compile``, medians of 5 alternated runs, ms.
``split_units`` of the checkout decides "split"; "whole" forbids splitting.

    python docs/scripts/split_unit_time.py
"""

import os
import statistics
import tempfile
from pathlib import Path

os.environ["TAILJIT_CACHE_DIR"] = tempfile.mkdtemp()

import torch  # noqa: E402

import tailjit  # noqa: E402
from tailjit.bench.registry import all_operators  # noqa: E402
from tailjit.codegen import KERNEL_MARK  # noqa: E402
from tailjit.frontend.graph import collect_reports  # noqa: E402
from tailjit.runtime import compiler  # noqa: E402
from tailjit.runtime.compiler import PLACEHOLDER  # noqa: E402

torch.set_num_threads(1)
split = compiler.split_units
units = []
for name, size in [("bbox2delta", "large"), ("giou", "small"), ("label_smoothing_ce", "large"),
                   ("sigmoid_focal_loss", "large"), ("delta2bbox", "small")]:  # fmt: skip
    op = all_operators()[name]
    with collect_reports() as reports:
        tailjit.jit(op.fn)(*op.inputs(size, 0))
    sources = [k.source for r in reports for k, _ in r.kernels]
    units += [(f"{name} {size} fw", s) for s in sources if s.count(KERNEL_MARK) == 1]
tc = compiler.toolchain()
for label, source in units:
    times: dict = {"whole": [], "split": []}
    for rep in range(5):
        for way in times:
            compiler.split_units = split if way == "split" else (lambda body: None)
            folder = Path(tempfile.mkdtemp())
            times[way].append(compiler._compile(source.replace(PLACEHOLDER, "tj_probe"), folder, f"u{rep}{way}", tc))
    print(label, {way: round(statistics.median(v) * 1000, 1) for way, v in times.items()})
