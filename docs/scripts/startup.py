"""Start-up of a new process with a warm kernel cache (``docs/jit.md``, "Start-up"): ``import torch``, then
``import tailjit`` and the first call of a jitted tiny function, for inference and for training, split into
``import torch._dynamo`` (which any fake tensor imports in torch 2.13) and the rest.  Each figure is the median
over fresh processes, in wall seconds and in the process's CPU seconds (user and system: on a loaded machine
the wall time measures the load); the kernel cache (a temporary directory) is filled by one process first.

    python docs/scripts/startup.py <checkout> [processes]
"""

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

checkout = os.path.abspath(sys.argv[1])
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 9

CHILD = """
import time
def now():
    return time.perf_counter(), time.process_time()
t0 = now()
import torch
t1 = now()
torch.set_num_threads(1)
import torch._dynamo
t2 = now()
import tailjit
f = tailjit.jit(lambda x: (x * 2 + 1).sum())
x = torch.ones(10, requires_grad=TRAINING)
out = f(x)
if TRAINING:
    out.backward()
t3 = now()
print(*(b[k] - a[k] for k in (0, 1) for a, b in ((t0, t1), (t1, t2), (t2, t3))))
"""


def child(training: bool, cache: str) -> list[float]:
    env = dict(os.environ, PYTHONPATH=checkout, TAILJIT_CACHE_DIR=cache, OMP_NUM_THREADS="1")
    code = CHILD.replace("TRAINING", str(training)) + f"assert tailjit.__file__.startswith({checkout!r})\n"
    # in the checkout: ``python -c`` puts the working directory first on ``sys.path``
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=checkout, check=True
    )
    return [float(v) for v in done.stdout.split()]


def main() -> None:
    cache = tempfile.mkdtemp()
    rows = {}
    for training in (False, True):
        child(training, cache)  # fills the kernel cache
    times = {False: [], True: []}
    for _ in range(runs):  # interleaved, so load on the machine falls on both alike
        for training in (False, True):
            times[training].append(child(training, cache))
    for training in (False, True):
        medians = [statistics.median(col) for col in zip(*times[training])]
        for clock, (torch_s, dynamo_s, rest_s) in (("wall", medians[:3]), ("cpu", medians[3:])):
            rows[f"{'training' if training else 'inference'}, {clock} s"] = {
                "import torch": round(torch_s, 3),
                "import torch._dynamo": round(dynamo_s, 3),
                "import tailjit + first call, the rest": round(rest_s, 3),
                "beyond import torch": round(dynamo_s + rest_s, 3),
            }
    info = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "threads": 1}
    print(json.dumps({"processes": runs, **info, "medians": rows}, indent=1))


if __name__ == "__main__":
    main()
