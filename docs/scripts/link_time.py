"""The link of one benchmark task's kernel library, three ways, alternated (medians of 21, ms): through the
compiler driver (``gcc ... -lmvec -lm``, as before d83980b), the direct ``ld`` command tailjit uses
(``compiler.toolchain().link``), and that command without the C library (``-l:libc.so.6`` dropped: not
kept, its references would lose their symbol versions).  The task's C is compiled once, as tailjit
splits it, to the objects linked.

    python docs/scripts/link_time.py pairwise_iou small fw
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

cache = Path(tempfile.mkdtemp())
os.environ["TAILJIT_CACHE_DIR"] = str(cache)

import torch  # noqa: E402

import tailjit  # noqa: E402
from tailjit.bench.ops import all_operators  # noqa: E402
from tailjit.runtime import compiler  # noqa: E402

name, size, mode = sys.argv[1:4]
torch.set_num_threads(1)
op = all_operators()[name]
args = op.training_inputs(size, 0) if mode == "fwbw" else op.inputs(size, 0)
tailjit.jit(op.fn)(*args)
tc = compiler.toolchain()
if tc.link is None:
    sys.exit("no direct link with this compiler")
source = max((p for p in cache.glob("??/*.c")), key=lambda p: p.stat().st_size).read_text()
head, _, body = source.partition("\n")
units = compiler.split_units(body) or [body]
work = Path(tempfile.mkdtemp())
objs = []
for i, unit in enumerate(units):
    src, obj = work / f"u{i}.c", work / f"u{i}.o"
    src.write_text(head + "\n" + unit)
    subprocess.run([tc.cc, *(f for f in tc.flags if f != "-shared"), "-c", str(src), "-o", str(obj)], check=True)
    objs.append(obj)
out = work / "x.so"
variants = {
    "driver": [tc.cc, *tc.flags, *map(str, objs), "-o", str(out), *tc.libs],
    "direct": compiler._with_files(tc.link, objs, out),
    "direct, no libc": [a for a in compiler._with_files(tc.link, objs, out) if a != compiler.LIBC_OBJECT],
}
times = {k: [] for k in variants}
for _ in range(21):
    for k, cmd in variants.items():
        start = time.perf_counter()
        subprocess.run(cmd, check=True)
        times[k].append(time.perf_counter() - start)
print(name, size, mode, f"{len(objs)} object(s):", {k: round(statistics.median(v) * 1000, 1) for k, v in times.items()})
