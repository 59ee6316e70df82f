"""Compile time of one backend against another's, per task, from a ``tailjit bench --results`` file: the
first call as recorded (``compile_s``: prepare + first call, so it includes one run of the task) and the
first call less that backend's own median call (``compile_s - backend_s``: the compile alone, estimated),
for the tasks both passed.  Prints each task's two ratios, then their medians and how many are at most a
fifth:

    python docs/scripts/compile_ratios.py fb/results.jsonl [tailjit-jit] [inductor]
"""

import json
import statistics
import sys

path = sys.argv[1]
ours = sys.argv[2] if len(sys.argv) > 2 else "tailjit-jit"
theirs = sys.argv[3] if len(sys.argv) > 3 else "inductor"
by_task: dict[tuple, dict] = {}
with open(path) as f:
    for line in f:
        r = json.loads(line)
        if r["status"] == "ok" and r["backend"] in (ours, theirs) and r.get("compile_s") is not None:
            by_task.setdefault((r["name"], r["size"], r["mode"]), {})[r["backend"]] = r


def net(r: dict) -> float:
    return max(r["compile_s"] - r["backend_s"], 0.0)


rows = []
for key, rs in sorted(by_task.items()):
    if ours in rs and theirs in rs:
        a, b = rs[ours], rs[theirs]
        rows.append((key, a["compile_s"] / b["compile_s"], net(a) / net(b) if net(b) > 0 else float("inf"), a, b))
print(f"{'task':44} {'first call':>18} {'ratio':>6} {'less a call':>18} {'ratio':>6}")
for (name, size, mode), first, alone, a, b in rows:
    task = f"{name} {size} {mode}"
    calls = f"{a['compile_s']:.3f} / {b['compile_s']:.3f}"
    nets = f"{net(a):.3f} / {net(b):.3f}"
    print(f"{task:44} {calls:>18} {first:6.3f} {nets:>18} {alone:6.3f}")
for label, i in (("first call", 1), ("less a call", 2)):
    ratios = [row[i] for row in rows]
    if ratios:
        fifth = sum(x <= 0.2 for x in ratios)
        print(f"{label}: median ratio {statistics.median(ratios):.3f}, at most a fifth on {fifth}/{len(ratios)}")
