"""gcc's time for each translation unit of a benchmark task's forward, with a given checkout's code: the
units as ``runtime.compiler.split_units`` deals them (the second with the prelude of units of kernels alone
where the checkout has one), the first unit without its kernels (the entry points alone) and each
precompiled prelude alone, each ``gcc -c`` with the toolchain's flags; CPU time of gcc and
its children (user + system, less sensitive to the VM's scheduling than wall time) and wall time,
medians of 15 alternated runs, ms.  Run it with two checkouts to compare their units:

    python docs/scripts/unit_gcc_time.py <checkout> pairwise_iou large
"""

import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

checkout, name, size = sys.argv[1:4]
sys.path.insert(0, os.path.abspath(checkout))
os.environ["TAILJIT_CACHE_DIR"] = tempfile.mkdtemp()

import torch  # noqa: E402

import tailjit  # noqa: E402
from tailjit.bench.ops import all_operators  # noqa: E402
from tailjit.codegen import ENTRY_MARK, KERNEL_MARK, PRELUDE_END, SHARED_MARK  # noqa: E402
from tailjit.frontend.plan.report import collect_reports  # noqa: E402
from tailjit.runtime import compiler  # noqa: E402

try:
    from tailjit.codegen import PYTHON_END
except ImportError:  # a checkout before the kernels' own prelude
    PYTHON_END = None

torch.set_num_threads(1)
op = all_operators()[name]
with collect_reports() as reports:
    tailjit.jit(op.fn)(*op.inputs(size, 0))
tc = compiler.toolchain()
flags = [f for f in tc.flags if f != "-shared"]
folder = Path(tempfile.mkdtemp())
units = {}
for n, source in enumerate(k.source for r in reports for k, _ in r.kernels):
    prelude, _, body = source.partition(PRELUDE_END)
    headers = [compiler._precompiled_prelude(prelude, tc)] * 2
    if PYTHON_END and PYTHON_END in prelude:
        headers[1] = compiler._precompiled_prelude(prelude.partition(PYTHON_END)[2], tc)
    parts = compiler.split_units(body) or (body,)
    marks = "(" + "|".join(re.escape(m) for m in (SHARED_MARK, KERNEL_MARK, ENTRY_MARK)) + ")"
    pieces = re.split(marks, parts[0])
    entry = pieces[0] + "".join(m + t for m, t in zip(pieces[1::2], pieces[2::2]) if m != KERNEL_MARK)
    named = {f"library {n} unit {i}": (headers[i], p) for i, p in enumerate(parts)}
    named |= {f"library {n} entry points alone": (headers[0], entry), f"library {n} prelude alone": (headers[0], "")}
    if headers[1] != headers[0]:
        named[f"library {n} kernels' prelude alone"] = (headers[1], "")
    for label, (header, text) in named.items():
        path = folder / f"{len(units)}.c"
        path.write_text(f'#include "{header}"\n{text}'.replace(compiler.PLACEHOLDER, "tj_probe"))
        units[label] = path


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


cpu: dict = {label: [] for label in units}
wall: dict = {label: [] for label in units}
for _ in range(15):
    for label, path in units.items():
        c, t = children_cpu(), time.perf_counter()
        subprocess.run([tc.cc, *flags, "-c", str(path), "-o", str(folder / "unit.o")], check=True)
        wall[label].append(time.perf_counter() - t)
        cpu[label].append(children_cpu() - c)
print(tailjit.__file__, name, size, "fw")
for label in units:
    c, w = (statistics.median(v[label]) * 1e3 for v in (cpu, wall))
    print(f"  {label:32} cpu {c:6.1f}  wall {w:6.1f}")
